"""gs:// in and out against a real GCS JSON API (gcp-storage-emulator, in a subprocess) behind a
fault-injecting proxy, through gcsfs as a user would: the round trip, a worker killed mid-upload,
throttling, two runs meeting in one OUT, and the one-line errors.

The emulator ignores ``ifGenerationMatch`` and credentials (gcsserver.py): the tests check that
the lease sends the preconditions and acts on GCS's 412, with the proxy giving the 412s and the
401/403s that GCS would.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest
import storeexport
from conftest import download
from faultproxy import GCS_429, GCS_503
from gcsserver import GCSServer  # its `gcs` fixture comes through conftest.pytest_plugins
from readback import expected_tokens, read_documents
from s3server import free_port
from storecases import FAST_RETRY
from test_s3 import FailingBytes, big_corpus, check_against_tiktoken, part_files, write_corpus

from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.storage import store
from tokenshards.storage.lease import Lease, LeaseHeld, LeaseLost, _Conflict, _GCSOps
from tokenshards.storage.location import Location
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize


def config(gcs: GCSServer, cluster, inputs, out, **options) -> TokenizeConfig:
    """The retry policy's waits are milliseconds here (its tries as a user's): faults cost no time."""
    return TokenizeConfig(inputs=tuple(inputs), out=out, scheduler=cluster.scheduler_address, progress="none",
                          storage_options={**gcs.storage_options, "retry": FAST_RETRY}, partition_bytes=6000, **options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, gcs):
    local = tmp_path_factory.mktemp("corpus")
    texts = write_corpus(local)
    bucket = gcs.make_bucket()
    fs = gcs.fs()
    for path in sorted(local.iterdir()):
        fs.pipe_file(f"{bucket}/fineweb/{path.name}", path.read_bytes())
    return {"local": local, "bucket": bucket, "texts": texts}


@pytest.fixture(autouse=True)
def clean_proxy(gcs):
    gcs.proxy.clear()
    yield
    gcs.proxy.clear()


# -- the storage edge on its own -------------------------------------------------------------

def test_options_reach_gcsfs_only_in_their_section(gcs):
    mixed = {"key": "AKIA", "secret": "s3-secret", "client_kwargs": {"endpoint_url": "http://minio:9000"},
             **gcs.storage_options}
    fs, root = store.filesystem("gs://b/x", mixed)
    assert store.is_gcs(fs) and root == "b/x" and fs._location == gcs.endpoint_url
    assert store.options_for("s3", mixed) == {k: v for k, v in mixed.items() if k != "gcs"}
    env = store.with_env_endpoint({}, {"STORAGE_EMULATOR_HOST": "localhost:4443"})
    assert env == {"gcs": {"endpoint_url": "http://localhost:4443", "token": "anon"}}
    assert store.with_env_endpoint({"token": "/creds.json"}, {"STORAGE_EMULATOR_HOST": "h:1"})["gcs"] == \
        {"endpoint_url": "http://h:1"}


def test_small_objects_take_one_request_and_large_ones_a_resumable_upload(gcs):
    bucket = gcs.make_bucket()
    fs, root = store.filesystem(f"gs://{bucket}/w", gcs.storage_options)
    small, large = b"x" * 1000, bytes(range(256)) * (17 * store.MIB // 256)
    seen = len(gcs.proxy.log)
    store.write_atomic(fs, f"{root}/small", small)
    store.write_atomic(fs, f"{root}/large", large)
    check = gcs.fs()
    assert check.cat_file(f"{bucket}/w/small") == small and check.cat_file(f"{bucket}/w/large") == large
    uploads = [(r.query.get("uploadType", [""])[0], r.header("content-range")) for r in gcs.proxy.log[seen:]
               if r.path.startswith("/upload/")]
    assert uploads[0] == ("media", "")
    # 17 MiB in chunks each "of a total not known yet"; then commit() names the total: only that creates it.
    assert [u[1] for u in uploads[1:]] == ["", f"bytes 0-{8 * store.MIB - 1}/*", f"bytes {8 * store.MIB}-{16 * store.MIB - 1}/*",
                                           f"bytes {16 * store.MIB}-{len(large) - 1}/*", f"bytes */{len(large)}"]


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_large_write_leaves_no_object(gcs, error):
    bucket = gcs.make_bucket()
    fs, root = store.filesystem(f"gs://{bucket}/w", gcs.storage_options)
    data = FailingBytes(b"y" * (20 * store.MIB))
    data.error = error
    with pytest.raises(error, match="mid-upload"):
        store.write_atomic(fs, f"{root}/part.npy", data)
    assert gcs.fs().find(bucket) == []
    assert not fs.transaction.files


# -- the job, GCS on either side ---------------------------------------------------------------

def test_gcs_round_trip_verify_and_gcs_input(gcs, cluster, corpus, gpt2, tmp_path, monkeypatch, capsys):
    out_bucket = gcs.make_bucket()
    url = f"gs://{out_bucket}/tokens/run1"
    first = run_tokenize(config(gcs, cluster, [str(corpus["local"] / "*.parquet")], url), announce=lambda m: None)
    assert first.partitions > 4
    keys = download(gcs.fs(), f"{out_bucket}/tokens/run1", tmp_path / "first")
    check_against_tiktoken(tmp_path / "first", corpus["texts"], gpt2)
    assert set(keys) == {"manifest.json", "tokenshards-job.json"} | {
        f"parts/part-{i:05d}.{ext}" for i in range(first.partitions) for ext in ("tokens.npy", "docs.parquet", "done.json")}

    # verify through the CLI, the endpoint from the environment as a user sets it
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint_url)
    assert main(["verify", url, "--deep", "50"]) == 0, capsys.readouterr().err

    # and gs:// as the input: the same parts
    run_tokenize(config(gcs, cluster, [f"gs://{corpus['bucket']}/fineweb/*.parquet"], str(tmp_path / "from-gcs")),
                 announce=lambda m: None)
    check_against_tiktoken(tmp_path / "from-gcs", corpus["texts"], gpt2)
    assert part_files(tmp_path / "first") == part_files(tmp_path / "from-gcs")
    manifest = json.loads((tmp_path / "from-gcs" / "manifest.json").read_text())
    assert [i["path"] for i in manifest["inputs"]] == [f"gs://{corpus['bucket']}/fineweb/a.parquet",
                                                       f"gs://{corpus['bucket']}/fineweb/b.parquet"]


def test_throttled_and_failing_requests_are_retried(gcs, cluster, corpus, gpt2, tmp_path):
    """GCS's 429s and 503s, resets and bodies cut short, on reads and writes, from the client and the
    workers: the run just takes longer."""
    out_bucket = gcs.make_bucket()
    proxy = gcs.proxy
    reads = lambda r: r.method == "GET" and "/o/" in r.path and "alt" in r.query  # noqa: E731
    uploads = lambda r: r.method == "POST" and r.path.startswith("/upload/")  # noqa: E731
    before = len(proxy.answered)
    proxy.fail(reads, times=3, **GCS_429)
    proxy.fault(reads, "cut", forward=True, times=2)  # a body reset half-way
    proxy.fail(uploads, times=3, **GCS_503)
    proxy.fault(uploads, "reset", forward=True, times=2)  # written, the answer lost: written again
    run_tokenize(config(gcs, cluster, [f"gs://{corpus['bucket']}/fineweb/*.parquet"], f"gs://{out_bucket}/t"),
                 announce=lambda m: None)
    assert proxy.faults(429, since=before) == proxy.faults(503, since=before) == 3
    assert proxy.faults("cut", since=before) == proxy.faults("reset", since=before) == 2
    download(gcs.fs(), f"{out_bucket}/t", tmp_path / "t")
    check_against_tiktoken(tmp_path / "t", corpus["texts"], gpt2)


# -- two runs meeting in one OUT: the lease ------------------------------------------------------

def test_the_lease_uses_generation_preconditions(gcs):
    bucket = gcs.make_bucket()
    fs, root = store.filesystem(f"gs://{bucket}/out", gcs.storage_options)
    url = f"gs://{bucket}/out"
    seen = len(gcs.proxy.log)
    with Lease(Location(url=url, fs=fs, root=root), command="tokenize") as first:
        created = first.token
        with pytest.raises(LeaseHeld, match=rf"^{url} is being written by a tokenize run on host"):
            Lease(Location(url=url, fs=fs, root=root), command="export").acquire()
        first.renew()
        assert first.token != created
    conditions = [(r.method, r.query["ifGenerationMatch"][0]) for r in gcs.proxy.log[seen:] if "ifGenerationMatch" in r.query]
    assert conditions[0] == ("POST", "0")  # created only if absent
    assert ("POST", created) in conditions  # renewed only over the version it wrote
    assert conditions[-1] == ("DELETE", first.token) if first.token else conditions[-1][0] == "DELETE"
    assert gcs.fs().find(bucket) == []  # released


def test_gcs_refusing_a_precondition_is_a_lost_race(gcs):
    """What GCS answers when another writer got there first (412), which the emulator never does."""
    bucket = gcs.make_bucket()
    fs, root = store.filesystem(f"gs://{bucket}/out", gcs.storage_options)
    precondition = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold."}}
    ops = _GCSOps(fs, f"{root}/lease")
    gcs.proxy.fail(lambda r: r.query.get("ifGenerationMatch") == ["0"], status=412, body=precondition)
    with pytest.raises(_Conflict):
        ops.create(b"mine")
    lease = Lease(Location(url=f"gs://{bucket}/out", fs=fs, root=root), command="tokenize")
    lease.acquire()
    # Another run's record replaced this run's (a new generation): GCS refuses the renewal with 412.
    # (A 412 while this run's own record is still there is its own renewal, written by a try whose
    # answer was lost: test_lease.py.)
    gcs.enforce_generations()
    before = len(gcs.proxy.answered)
    gcs.fs().pipe_file(f"{bucket}/out/.tokenshards-lease.json", b"another run's record")
    with pytest.raises(LeaseLost, match="lost its lease"):
        lease.check()  # a renewal that lost: this run must not commit
    assert gcs.proxy.faults(412, since=before) == 1
    lease.release()
    assert gcs.fs().cat_file(f"{bucket}/out/.tokenshards-lease.json") == b"another run's record"


def test_a_second_run_meets_the_first_in_one_line(gcs, cluster, corpus):
    bucket = gcs.make_bucket()
    url = f"gs://{bucket}/out"
    fs, root = store.filesystem(url, gcs.storage_options)
    with Lease(Location(url=url, fs=fs, root=root), command="tokenize"):
        with pytest.raises(LeaseHeld, match=rf"^{url} is being written by a tokenize run") as info:
            run_tokenize(config(gcs, cluster, [str(corpus["local"] / "*.parquet")], url))
        assert "\n" not in str(info.value)
    assert not gcs.fs().exists(f"{bucket}/out/manifest.json")


# -- one line for what users get wrong -----------------------------------------------------------

def test_missing_buckets(gcs, cluster, corpus):
    with pytest.raises(UserError, match=rf"^output gs://no-such-bucket-out/t: bucket 'no-such-bucket-out' does not exist "
                                        rf"at {gcs.endpoint_url}; create it first"):
        run_tokenize(config(gcs, cluster, [str(corpus["local"] / "*.parquet")], "gs://no-such-bucket-out/t"))
    with pytest.raises(UserError, match=r"^input gs://no-such-bucket-in/x/\*\.parquet: bucket 'no-such-bucket-in' does not exist"):
        run_tokenize(config(gcs, cluster, ["gs://no-such-bucket-in/x/*.parquet"], "gs://whatever/t"))
    assert not gcs.fs().exists("no-such-bucket-out")


def test_cli_missing_bucket_is_one_line(gcs, corpus, capsys, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint_url)
    code = main(["tokenize", "--input", str(corpus["local"] / "*.parquet"), "--out", "gs://no-such-bucket-cli/x"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("tokenshards: error: output gs://no-such-bucket-cli/x: bucket 'no-such-bucket-cli' does not exist")


def test_a_broken_credentials_file_is_one_line(gcs, cluster, corpus, tmp_path):
    creds = tmp_path / "sa.json"
    secret = "-----BEGIN PRIVATE KEY-----\nnot-a-key-tokenshards-test\n-----END PRIVATE KEY-----\n"
    creds.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k",
                                 "private_key": secret, "client_email": "sa@p.iam.gserviceaccount.com",
                                 "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token"}))
    options = {"gcs": {"endpoint_url": gcs.endpoint_url, "token": str(creds)}}
    with pytest.raises(UserError, match=r"^cannot open 'gs://.*': its credentials could not be loaded \(KeyError: .*\); check GOOGLE_APPLICATION_CREDENTIALS") as info:
        run_tokenize(TokenizeConfig(inputs=(str(corpus["local"] / "*.parquet"),), out=f"gs://{corpus['bucket']}/t",
                                    scheduler=cluster.scheduler_address, progress="none", storage_options=options))
    assert "\n" not in str(info.value) and "not-a-key" not in str(info.value)


@pytest.mark.parametrize("token, status, message, hint", [
    ("anon", 401, "Anonymous caller does not have storage.buckets.get access to the Google Cloud Storage bucket.",
     r"GCS refused an anonymous request for bucket '{bucket}' \(401\): no credentials \(anonymous"),
    ("ya29.refused-token-0123456789", 401, "Invalid Credentials",
     r"GCS refused the credentials sent for bucket '{bucket}' \(401\): an access token given as the token option; "
     r"check GOOGLE_APPLICATION_CREDENTIALS"),
    ("ya29.weak-token-0123456789", 403,
     "sa@p.iam.gserviceaccount.com does not have storage.objects.create access to the Google Cloud Storage object.",
     r"access denied: GCS accepted the credentials sent for bucket '{bucket}' \(403\), an access token given as the "
     r"token option, but they lack a permission this needs; check that the credentials in use"),
])
def test_refused_credentials_and_missing_permissions_are_one_line(gcs, cluster, corpus, monkeypatch, token, status,
                                                                    message, hint):
    """GCS's own answers (the emulator checks nothing): 401 for no or bad credentials, 403 for a missing
    right. Said at once (a refusal is never retried), naming the store, the bucket and what was sent."""
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")  # gcsfs would ask Google's tokeninfo first
    bucket = gcs.make_bucket()
    gcs.proxy.fail(lambda r: True, status=status, times=10**6, body={"error": {"code": status, "message": message}})
    seen = len(gcs.proxy.log)
    options = {"gcs": {"endpoint_url": gcs.endpoint_url, "token": token}}
    started = time.monotonic()
    with pytest.raises(UserError, match=rf"^(output|cannot write to output) gs://{bucket}/t: {hint.format(bucket=bucket)}") as info:
        run_tokenize(TokenizeConfig(inputs=(str(corpus["local"] / "*.parquet"),), out=f"gs://{bucket}/t",
                                    scheduler=cluster.scheduler_address, progress="none", storage_options=options))
    sent = [(r.method, r.path, sorted(r.query.items())) for r in gcs.proxy.log[seen:]]
    assert time.monotonic() - started < 5 and len(sent) == len({repr(r) for r in sent})  # no request tried twice
    assert "\n" not in str(info.value) and str(info.value).endswith(f"; endpoint {gcs.endpoint_url})")
    assert token == "anon" or token not in str(info.value)


# -- a worker killed mid-upload ------------------------------------------------------------------

def test_worker_killed_mid_upload_leaves_nothing_committed_and_a_rerun_completes(gcs, cl100k, tmp_path):
    """`dask scheduler`, `dask worker`, the CLI with STORAGE_EMULATOR_HOST from the environment; the
    proxy holds the big partition's second resumable chunk, the worker is SIGKILLed, then the same
    command reruns."""
    small, big = big_corpus(tmp_path / "in")
    bucket = gcs.make_bucket()
    fs = gcs.fs()
    for path in sorted((tmp_path / "in").iterdir()):
        fs.pipe_file(f"{bucket}/in/{path.name}", path.read_bytes())
    env, dask_cli = gcs.env(), str(Path(sys.executable).parent / "dask")
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def start_worker() -> subprocess.Popen:
        procs.append(subprocess.Popen([dask_cli, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                       "--memory-limit", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs[-1]

    cmd = [sys.executable, "-m", "tokenshards", "tokenize", "--scheduler", address, "--input", f"gs://{bucket}/in/*.parquet",
           "--out", f"gs://{bucket}/out", "--encoding", "cl100k_base", "--partition-mb", "0.001", "--progress", "none"]
    release = gcs.proxy.hold(lambda r: "upload_id" in r.query and r.header("content-range").startswith("bytes 8388608-"))
    try:
        worker = start_worker()
        log = tmp_path / "run.log"
        with log.open("w") as out:
            run = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(run)
        assert gcs.proxy.held.wait(120), log.read_text()
        worker.send_signal(signal.SIGKILL)  # mid-upload: the resumable session is open
        worker.wait()
        run.kill()
        run.wait()
        release.set()
        gcs.proxy.clear()

        assert not fs.exists(f"{bucket}/out/parts/part-00003.tokens.npy")  # the half-uploaded object is not there...
        assert not fs.exists(f"{bucket}/out/parts/part-00003.done.json")  # ...nor a record committing it
        assert not fs.exists(f"{bucket}/out/manifest.json")
        committed = fs.glob(f"{bucket}/out/parts/*.done.json")
        for done in committed:
            record = json.loads(fs.cat_file(done))
            import hashlib

            assert hashlib.sha256(fs.cat_file(f"{bucket}/out/{record['tokens_file']}")).hexdigest() == record["sha256"]

        start_worker()
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stderr
        if committed:
            assert f"{len(committed)} already committed" in rerun.stderr
    finally:
        release.set()
        for proc in reversed(procs):
            proc.kill()
            proc.wait()

    download(fs, f"{bucket}/out", tmp_path / "out")
    docs = read_documents(tmp_path / "out")
    expected_big = {t: expected_tokens(cl100k, t) for t in set(big)}
    for (path, row), (_, tokens) in docs.items():
        text = big[row] if path.endswith("z_big.parquet") else small[row]
        assert tokens == (expected_big[text] if path.endswith("z_big.parquet") else expected_tokens(cl100k, text))
    assert len(docs) == len(big) + len(small)


# -- export and train-bpe on GCS -------------------------------------------------------------------

@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    return storeexport.local_run(cluster, tmp_path_factory.mktemp("gcs-export"))


def test_exports_to_gcs_equal_local_ones(gcs, cluster, run, tmp_path):
    """Throttled too: parts' uploads (from the workers) and composes (the client's commit) get 429/503 first."""
    def throttle():
        gcs.proxy.fail(lambda r: r.method == "POST" and "/.tokenshards-parts/" in unquote(r.query.get("name", [""])[0]),
                       status=429, times=2, body={"error": {"code": 429, "message": "rate of change requests too high"}})
        gcs.proxy.fail(lambda r: r.path.endswith("/compose"), status=503, times=1,
                       body={"error": {"code": 503, "message": "Backend Error"}})

    seen = len(gcs.proxy.answered)
    storeexport.exports_equal_local(gcs, "gs", gcs.make_bucket(), cluster, run, tmp_path, throttle=throttle)
    composes = [r for r in gcs.proxy.log if r.path.endswith("/compose")]
    assert any("/.tokenshards-parts/" in unquote(r.path) for r in composes)  # more parts than one request takes
    statuses = [status for _, status in gcs.proxy.answered[seen:]]
    assert statuses.count(429) == 4 and statuses.count(503) == 2  # two exports: each retried, none failed


def test_a_killed_export_leaves_nothing_committed_and_a_rerun_completes(gcs, run, tmp_path):
    storeexport.killed_export_leaves_nothing_committed(gcs, "gs", gcs.make_bucket(), run, tmp_path,
                                                       commit_request=lambda r: r.path.endswith("/compose"))


def test_train_bpe_from_and_to_gcs(gcs, cluster, tmp_path):
    storeexport.train_bpe_equals_local(gcs, "gs", gcs.make_bucket(), cluster, tmp_path)


def test_export_and_train_bpe_to_a_missing_bucket_are_one_line(gcs, run, corpus, capsys, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint_url)
    for argv, line in (
            (["export", str(run), "--format", "llmc", "--to", "gs://no-such-bucket-x/d"],
             "export destination gs://no-such-bucket-x/d: bucket 'no-such-bucket-x' does not exist"),
            (["train-bpe", "--input", str(corpus["local"] / "*.parquet"), "--out", "gs://no-such-bucket-y/v.tiktoken"],
             "--out gs://no-such-bucket-y/v.tiktoken: bucket 'no-such-bucket-y' does not exist")):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"tokenshards: error: {line}"), err
