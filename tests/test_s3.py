"""S3 in and out against a real S3 server (moto's, in a subprocess), through s3fs as a user would.

Outputs are downloaded object by object and read with plain numpy/pyarrow (``readback``), and
every document is compared with tiktoken.
"""
from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import download
from readback import expected_tokens, read_documents
from s3server import REGION, S3Server, free_port, start_moto

from tokenshards.storage import store
from tokenshards.cli import main
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.errors import UserError
from tokenshards.tokenize.command import run_tokenize

WORDS = ("the cat sat on a mat; Straße naïve café 東京 🙂 <|endoftext|> 1234567 tab\there "
         "\n\nnew paragraph — dashes – and ‘quotes’ ").split(" ")


def make_texts(n: int, seed: int) -> list[str | None]:
    rng = random.Random(seed)
    texts: list[str | None] = []
    for i in range(n):
        if i % 17 == 5:
            texts.append(None)
        elif i % 23 == 7:
            texts.append("")
        else:
            texts.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 60))))
    return texts


def write_corpus(folder: Path) -> dict[str, list[str | None]]:
    """Two parquet files (one with an ``id`` column, one without), several row groups each."""
    folder.mkdir(parents=True, exist_ok=True)
    texts_a, texts_b = make_texts(120, 1), make_texts(90, 2)
    pq.write_table(pa.table({"id": [f"a-{i}" for i in range(len(texts_a))], "text": pa.array(texts_a, pa.string())}),
                   folder / "a.parquet", row_group_size=30)
    pq.write_table(pa.table({"text": pa.array(texts_b, pa.large_string())}), folder / "b.parquet", row_group_size=25)
    return {"a.parquet": texts_a, "b.parquet": texts_b}


def upload(s3: S3Server, local: Path, bucket: str, prefix: str) -> None:
    fs = s3.fs()
    for path in sorted(local.iterdir()):
        fs.put_file(str(path), f"{bucket}/{prefix}/{path.name}")


def check_against_tiktoken(out: Path, texts: dict[str, list[str | None]], enc, *, n_docs: int | None = None) -> None:
    docs = read_documents(out)
    seen = 0
    for (path, row), (doc_id, tokens) in docs.items():
        name = path.rsplit("/", 1)[-1]
        assert tokens == expected_tokens(enc, texts[name][row]), (path, row)
        assert doc_id == (f"a-{row}" if name == "a.parquet" else f"b.parquet:{row}")
        seen += 1
    assert seen == sum(1 for t in texts.values() for x in t if x)


def part_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((folder / "parts").iterdir()) if not p.name.endswith(".done.json")}


def s3_config(s3: S3Server, cluster, inputs, out, **options) -> TokenizeConfig:
    return TokenizeConfig(inputs=tuple(inputs), out=out, scheduler=cluster.scheduler_address, progress="none",
                          storage_options=s3.storage_options, partition_bytes=6000, **options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, s3):
    """The corpus on disk and in a bucket ``s3://SRC/fineweb/``."""
    local = tmp_path_factory.mktemp("corpus")
    texts = write_corpus(local)
    bucket = s3.make_bucket()
    upload(s3, local, bucket, "fineweb")
    return {"local": local, "bucket": bucket, "texts": texts}


# -- the storage edge on its own -------------------------------------------------------------

def test_part_size_keeps_uploads_within_s3_limits():
    assert store.part_size(1) == store.part_size(50 * store.MIB) == 8 * store.MIB
    for nbytes in (80 * 2**30, 5 * 2**40):  # 80 GiB, and S3's largest object (5 TiB)
        size = store.part_size(nbytes)
        assert size % store.MIB == 0 and 5 * store.MIB <= size <= 5 * 2**30
        assert -(-nbytes // size) <= 10_000


def test_small_objects_take_one_put_and_large_ones_multipart(s3):
    bucket = s3.make_bucket()
    fs, root = store.filesystem(f"s3://{bucket}/w", s3.storage_options)
    small, large = b"x" * 1000, bytes(range(256)) * (17 * store.MIB // 256)
    store.write_atomic(fs, f"{root}/small", small)
    store.write_atomic(fs, f"{root}/large", large)
    check = s3.fs()
    assert check.cat_file(f"{bucket}/w/small") == small and check.cat_file(f"{bucket}/w/large") == large
    # S3's ETag of a multipart object ends in "-<parts>": 17 MiB in 8 MiB parts is 3.
    assert "-" not in check.info(f"{bucket}/w/small")["ETag"]
    assert check.info(f"{bucket}/w/large")["ETag"].strip('"').endswith("-3")
    assert not check.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads")
    assert not fs.transaction.files  # nothing left queued on the cached filesystem


class FailingBytes(bytes):
    """Data whose second part cannot be produced: the upload fails after part 1 went out."""

    error: type[BaseException] = RuntimeError

    def __getitem__(self, index):
        if isinstance(index, slice) and index.start:
            raise self.error("the writer died mid-upload")
        return super().__getitem__(index)


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_multipart_write_leaves_no_object(s3, error):
    bucket = s3.make_bucket()
    fs, root = store.filesystem(f"s3://{bucket}/w", s3.storage_options)
    data = FailingBytes(b"y" * (20 * store.MIB))
    data.error = error
    with pytest.raises(error, match="mid-upload"):
        store.write_atomic(fs, f"{root}/part.npy", data)
    check = s3.fs()
    assert not check.exists(f"{bucket}/w/part.npy")
    assert check.find(bucket) == []
    assert not check.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads")  # aborted, not left behind


def test_storage_options_hide_their_values():
    options = store.storage_options({"key": "AKIA", "secret": "hunter2", "client_kwargs": {"endpoint_url": "http://x"}})
    config = TokenizeConfig(inputs=("x",), out="y", storage_options=options)
    assert "hunter2" not in repr(options) and "hunter2" not in str(options) and "hunter2" not in repr(config)
    assert "secret" in repr(options)
    import pickle

    again = pickle.loads(pickle.dumps(options))
    assert again == options and isinstance(again, store.StorageOptions)


def test_a_storage_option_of_the_wrong_shape_is_one_line_in_every_config():
    """Every job's config goes through RunOptions, which checks and wraps the options once."""
    from tokenshards.bpe.train import TrainBpeConfig
    from tokenshards.export.command import ExportConfig
    from tokenshards.verify.command import VerifyConfig

    bad = {"secret": "hunter2", "client_kwargs": "endpoint_url=http://x"}
    makers = [lambda: TokenizeConfig(inputs=("x",), out="y", storage_options=bad),
              lambda: ExportConfig(out="y", to="z", format="llmc", storage_options=bad),
              lambda: VerifyConfig(out="y", storage_options=bad),
              lambda: TrainBpeConfig(inputs=("x",), out="v.tiktoken", vocab_size=300, storage_options=bad)]
    for make in makers:
        with pytest.raises(UserError, match=r"^--storage-option client_kwargs: expected a JSON object") as e:
            make()
        assert "hunter2" not in str(e.value)
    good = ExportConfig(out="y", to="z", format="llmc", storage_options={"secret": "hunter2"})
    assert isinstance(good.storage_options, store.StorageOptions)  # what export sends to its tasks


def test_cli_takes_json_for_a_mapping_option_and_says_when_it_is_not_json(capsys):
    from tokenshards.cli import _storage_options

    assert _storage_options([("client_kwargs", '{"region_name": "eu-west-1"}')]) == {"client_kwargs": {"region_name": "eu-west-1"}}
    code = main(["verify", "s3://b/x", "--storage-option", "client_kwargs={region_name: x}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("tokenshards: error: --storage-option client_kwargs: its value starts like JSON but is not valid JSON")


def test_endpoint_from_the_environment():
    env = {"AWS_ENDPOINT_URL": "http://minio:9000"}
    assert store.with_env_endpoint({}, env) == {"client_kwargs": {"endpoint_url": "http://minio:9000"}}
    assert store.with_env_endpoint({}, {**env, "AWS_ENDPOINT_URL_S3": "http://s3only"}) == \
        {"client_kwargs": {"endpoint_url": "http://s3only"}}
    given = {"client_kwargs": {"endpoint_url": "http://given", "region_name": "auto"}}
    assert store.with_env_endpoint(given, env) == given
    assert store.with_env_endpoint({"anon": True}, {}) == {"anon": True}


# -- the job, S3 on either side ---------------------------------------------------------------

def test_s3_to_s3_then_a_rerun_resumes(s3, cluster, corpus, gpt2, tmp_path):
    out_bucket = s3.make_bucket()
    config = s3_config(s3, cluster, [f"s3://{corpus['bucket']}/fineweb/*.parquet"], f"s3://{out_bucket}/tokens/run1")
    first = run_tokenize(config, announce=lambda m: None)
    assert first.partitions > 4
    keys = download(s3.fs(), f"{out_bucket}/tokens/run1", tmp_path / "first")
    check_against_tiktoken(tmp_path / "first", corpus["texts"], gpt2)
    manifest = json.loads((tmp_path / "first" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == [f"s3://{corpus['bucket']}/fineweb/a.parquet",
                                                       f"s3://{corpus['bucket']}/fineweb/b.parquet"]
    # Only the run's own objects: no write probe, no temporaries; no credentials in any of them.
    assert set(keys) == {"manifest.json", "tokenshards-job.json"} | {
        f"parts/part-{i:05d}.{ext}" for i in range(first.partitions) for ext in ("tokens.npy", "docs.parquet", "done.json")}
    everything = b"".join((tmp_path / "first" / k).read_bytes() for k in keys)
    assert s3.secret.encode() not in everything and s3.key.encode() not in everything

    # A run that died: two partitions never committed (one left its tokens behind), no manifest.
    fs = s3.fs()
    run = f"{out_bucket}/tokens/run1"
    fs.rm([f"{run}/manifest.json", f"{run}/parts/part-00001.done.json", f"{run}/parts/part-00003.done.json",
           f"{run}/parts/part-00003.tokens.npy", f"{run}/parts/part-00003.docs.parquet"])
    notes: list[str] = []
    again = run_tokenize(config, announce=notes.append)
    assert again.skipped_partitions == first.partitions - 2
    assert any(f"{first.partitions - 2} already committed" in n for n in notes)
    assert download(s3.fs(), run, tmp_path / "again") == keys
    for key in keys:
        if key != "manifest.json":
            assert (tmp_path / "first" / key).read_bytes() == (tmp_path / "again" / key).read_bytes(), key
    assert json.loads((tmp_path / "again" / "manifest.json").read_text())["partitions"] == manifest["partitions"]


def test_local_to_s3_and_s3_to_local_give_identical_parts(s3, cluster, corpus, gpt2, tmp_path):
    out_bucket = s3.make_bucket()
    run_tokenize(s3_config(s3, cluster, [str(corpus["local"] / "*.parquet")], f"s3://{out_bucket}/from-local"),
                 announce=lambda m: None)
    download(s3.fs(), f"{out_bucket}/from-local", tmp_path / "from-local")
    check_against_tiktoken(tmp_path / "from-local", corpus["texts"], gpt2)

    run_tokenize(s3_config(s3, cluster, [f"s3://{corpus['bucket']}/fineweb/"], str(tmp_path / "to-local")),
                 announce=lambda m: None)
    check_against_tiktoken(tmp_path / "to-local", corpus["texts"], gpt2)
    assert part_files(tmp_path / "from-local") == part_files(tmp_path / "to-local")


# -- pre-flight: one line naming the URL, before any tokenizing ---------------------------------

def test_missing_input_bucket(s3, cluster):
    with pytest.raises(UserError, match=r"^input s3://no-such-bucket-in/x/\*\.parquet: bucket 'no-such-bucket-in' does not exist at http://127\.0\.0\.1"):
        run_tokenize(s3_config(s3, cluster, ["s3://no-such-bucket-in/x/*.parquet"], "s3://whatever/out"))


def test_missing_output_bucket_is_an_error_and_is_not_created(s3, cluster, corpus):
    with pytest.raises(UserError, match=r"^output s3://no-such-bucket-out/tokens: bucket 'no-such-bucket-out' does not exist"):
        run_tokenize(s3_config(s3, cluster, [f"s3://{corpus['bucket']}/fineweb/*.parquet"], "s3://no-such-bucket-out/tokens"))
    assert not s3.fs().exists("no-such-bucket-out")


def test_denied_access(tmp_path, cluster, corpus):
    """A second server that enforces authentication: our keys are unknown there (403)."""
    proc, endpoint = start_moto(env_extra={"INITIAL_NO_AUTH_ACTION_COUNT": "0"})
    try:
        denied = S3Server(endpoint_url=endpoint)
        config = TokenizeConfig(inputs=(str(corpus["local"] / "*.parquet"),), out="s3://locked/tokens",
                                scheduler=cluster.scheduler_address, progress="none",
                                storage_options=denied.storage_options)
        refused = (r"S3 refused the credentials sent for bucket 'locked' \(403 InvalidAccessKeyId\): an access key from "
                   r"--storage-option key/secret; check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY")
        with pytest.raises(UserError, match=rf"^cannot write to output s3://locked/tokens: {refused}") as info:
            run_tokenize(config)
        assert "\n" not in str(info.value) and denied.secret not in str(info.value) and denied.key not in str(info.value)
        assert str(info.value).endswith(f"; endpoint {endpoint})")
        with pytest.raises(UserError, match=rf"^cannot list input s3://locked/in/\*\.parquet: {refused}"):
            run_tokenize(config.replace(inputs=("s3://locked/in/*.parquet",)))
    finally:
        proc.kill()
        proc.wait()


def test_unreachable_endpoint(cluster, s3):
    """Tried as the retry policy says (here its waits are short), then one line that says so."""
    options = {**s3.storage_options, "client_kwargs": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "region_name": REGION},
               "retry": {"attempts": 3, "first_delay": 0.01, "max_delay": 0.02}}
    config = TokenizeConfig(inputs=("s3://src/x/*.parquet",), out="s3://dst/out", scheduler=cluster.scheduler_address,
                            progress="none", storage_options=options)
    with pytest.raises(UserError, match=r"^input s3://src/x/\*\.parquet: cannot reach the storage endpoint \(tried 3 times: "
                                        r"refused, reset, cut short or no answer\); check AWS_ENDPOINT_URL") as info:
        run_tokenize(config)
    assert "\n" not in str(info.value)


def test_a_worker_without_credentials_is_a_one_line_error(s3, cluster, corpus, monkeypatch):
    """The client finds credentials in its environment, the session's workers (spawned earlier)
    have none: the workers' failure is named, not a traceback."""
    if any(cluster_env.get("AWS_ACCESS_KEY_ID") for cluster_env in _worker_envs(cluster).values()):
        pytest.skip("the session's workers were started with AWS credentials in their environment")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret)
    config = TokenizeConfig(inputs=(f"s3://{corpus['bucket']}/fineweb/a.parquet",), out=f"s3://{corpus['bucket']}/nocreds",
                            scheduler=cluster.scheduler_address, progress="none",
                            storage_options={"client_kwargs": {"endpoint_url": s3.endpoint_url, "region_name": REGION}})
    with pytest.raises(UserError, match=rf"^cannot read s3://{corpus['bucket']}/fineweb/a\.parquet: no AWS credentials "
                                        r"found on the machine that read it \(on a cluster, check that every worker "
                                        r"has credentials\); .* \(NoCredentialsError: "):
        run_tokenize(config)


def _worker_envs(cluster) -> dict:
    from distributed import Client

    with Client(cluster.scheduler_address) as client:
        return client.run(lambda: {k: v for k, v in __import__("os").environ.items() if k.startswith("AWS_")})


# -- the command line ------------------------------------------------------------------------

def test_cli_error_is_one_line_naming_the_url(s3, corpus, capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint_url)  # the CLI reads it into the storage options
    code = main(["tokenize", "--input", f"s3://{corpus['bucket']}/fineweb/*.parquet", "--out", "s3://no-such-bucket-cli/x",
                 "--storage-option", f"key={s3.key}", "--storage-option", f"secret={s3.secret}"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("tokenshards: error: output s3://no-such-bucket-cli/x: bucket 'no-such-bucket-cli' does not exist "
                          f"at {s3.endpoint_url}; create it first")
    assert len(err.strip().splitlines()) == 1 and s3.secret not in err


# -- a worker killed mid-upload -----------------------------------------------------------------

def big_corpus(folder: Path) -> tuple[list[str], list[str]]:
    """``a.parquet``: three small partitions; ``z_big.parquet``: one row group of ~18 MB of text,
    whose cl100k tokens (uint32) come to ~17 MiB: a multipart upload of three parts, open for
    long enough (a few hundred ms against moto) to be caught mid-way."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(3)
    distinct = [" ".join(rng.choice(WORDS) for _ in range(2500)) for _ in range(40)]
    big = [distinct[i % len(distinct)] for i in range(1500)]
    small = [t or "x" for t in make_texts(60, 4)]
    pq.write_table(pa.table({"text": small}), folder / "a.parquet", row_group_size=20)
    pq.write_table(pa.table({"text": big}), folder / "z_big.parquet", row_group_size=len(big))
    return small, big


def test_worker_killed_mid_upload_leaves_nothing_committed_and_a_rerun_completes(s3, cl100k, tmp_path):
    """The real thing: `dask scheduler`, `dask worker`, the CLI with credentials and AWS_ENDPOINT_URL
    from the environment; the worker is SIGKILLed while it uploads, then the same command reruns."""
    small, big = big_corpus(tmp_path / "in")
    bucket = s3.make_bucket()
    upload(s3, tmp_path / "in", bucket, "in")
    env, dask_cli = s3.env(), str(Path(sys.executable).parent / "dask")
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def start_worker() -> subprocess.Popen:
        # --no-nanny: the process we kill is the one that uploads.
        procs.append(subprocess.Popen([dask_cli, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                       "--memory-limit", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs[-1]

    cmd = [sys.executable, "-m", "tokenshards", "tokenize", "--scheduler", address, "--input", f"s3://{bucket}/in/*.parquet",
           "--out", f"s3://{bucket}/out", "--encoding", "cl100k_base", "--partition-mb", "0.001", "--progress", "none"]
    fs = s3.fs()
    try:
        worker = start_worker()
        log = tmp_path / "run.log"
        with log.open("w") as out:
            run = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(run)
        deadline = time.monotonic() + 120
        while not (uploads := fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads")):
            assert run.poll() is None, log.read_text()
            assert not fs.exists(f"{bucket}/out/manifest.json"), "the big partition was never seen mid-upload"
            assert time.monotonic() < deadline
            time.sleep(0.005)
        worker.send_signal(signal.SIGKILL)  # mid-upload: the multipart upload is open
        worker.wait()
        run.kill()  # the whole run dies with it
        run.wait()

        key = uploads[0]["Key"]
        assert key == "out/parts/part-00003.tokens.npy"
        assert not fs.exists(f"{bucket}/{key}")  # the half-uploaded object is not there...
        assert not fs.exists(f"{bucket}/out/parts/part-00003.done.json")  # ...nor a record committing it
        assert not fs.exists(f"{bucket}/out/manifest.json")
        assert any(u["Key"] == key for u in fs.call_s3("list_multipart_uploads", Bucket=bucket)["Uploads"])
        committed = fs.glob(f"{bucket}/out/parts/*.done.json")
        for done in committed:  # whatever is committed is whole
            record = json.loads(fs.cat_file(done))
            assert hashlib.sha256(fs.cat_file(f"{bucket}/out/{record['tokens_file']}")).hexdigest() == record["sha256"]
            assert fs.exists(f"{bucket}/out/{record['docs_file']}")

        start_worker()
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stderr
        # A scheduler started without a dashboard: no link to one (its HTTP server serves health and metrics only).
        said = [line for line in rerun.stderr.splitlines() if line.startswith("dashboard: ")]
        assert said == [f"dashboard: off  (scheduler {address}, 1 worker)"], rerun.stderr
        assert not fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads")  # the rerun aborted it
        if committed:  # typically the three small partitions, done before the big one started
            assert f"{len(committed)} already committed" in rerun.stderr
        assert s3.secret not in rerun.stdout + rerun.stderr + log.read_text()
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait()

    download(s3.fs(), f"{bucket}/out", tmp_path / "out")
    docs = read_documents(tmp_path / "out")
    expected_big = {t: expected_tokens(cl100k, t) for t in set(big)}
    for (path, row), (_, tokens) in docs.items():
        text = big[row] if path.endswith("z_big.parquet") else small[row]
        assert tokens == (expected_big[text] if path.endswith("z_big.parquet") else expected_tokens(cl100k, text))
    assert len(docs) == len(big) + len(small)
