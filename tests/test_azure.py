"""az:// (and abfs://) in and out against a real Azure Blob Storage API (Microsoft's Azurite, in a
subprocess) behind a fault-injecting proxy, through adlfs as a user would: the round trip, a worker
killed mid-upload, throttling, two runs meeting in one OUT, and the one-line errors.

Azurite checks Shared Key signatures and enforces If-None-Match / If-Match, so the lease and the
refused credentials are tested against it directly; the proxy gives the 429/503s and holds an upload.
"""
from __future__ import annotations

import base64
import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from azurite import AzureServer  # its `azure` fixture comes through conftest.pytest_plugins
import storeexport
from conftest import download
from faultproxy import AZURE_500, AZURE_503
from readback import expected_tokens, read_documents
from s3server import free_port
from storecases import FAST_RETRY
from test_s3 import FailingBytes, big_corpus, check_against_tiktoken, part_files, write_corpus

from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.storage import store
from tokenshards.storage.lease import Lease, LeaseHeld, LeaseLost, _AzureOps, _Conflict
from tokenshards.storage.location import Location
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize


def config(azure: AzureServer, cluster, inputs, out, **options) -> TokenizeConfig:
    """The retry policy's waits are milliseconds here (its tries as a user's): faults cost no time."""
    return TokenizeConfig(inputs=tuple(inputs), out=out, scheduler=cluster.scheduler_address, progress="none",
                          storage_options={**azure.storage_options, "retry": FAST_RETRY}, partition_bytes=6000, **options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, azure):
    local = tmp_path_factory.mktemp("corpus")
    texts = write_corpus(local)
    container = azure.make_container()
    fs = azure.fs()
    for path in sorted(local.iterdir()):
        fs.pipe_file(f"{container}/fineweb/{path.name}", path.read_bytes())
    return {"local": local, "container": container, "texts": texts}


@pytest.fixture(autouse=True)
def clean_proxy(azure):
    azure.proxy.clear()
    yield
    azure.proxy.clear()


def is_put_block(r) -> bool:
    return r.method == "PUT" and r.query.get("comp") == ["block"]


# -- the storage edge on its own -------------------------------------------------------------

def test_options_reach_adlfs_only_in_their_section(azure):
    mixed = {"key": "AKIA", "secret": "s3-secret", "client_kwargs": {"endpoint_url": "http://minio:9000"},
             **azure.storage_options}
    for url in ("az://c/x", "abfs://c/x"):
        fs, root = store.filesystem(url, mixed)
        assert store.is_azure(fs) and root == "c/x"
        assert store._endpoint(fs) == f"{azure.proxy.url}/tokenshards"
    assert "azure" not in store.options_for("s3", mixed)


def test_small_objects_take_one_put_and_large_ones_a_block_list(azure):
    container = azure.make_container()
    fs, root = store.filesystem(f"az://{container}/w", azure.storage_options)
    small, large = b"x" * 1000, bytes(range(256)) * (17 * store.MIB // 256)
    seen = len(azure.proxy.log)
    store.write_atomic(fs, f"{root}/small", small)
    store.write_atomic(fs, f"{root}/large", large)
    check = azure.fs()
    assert check.cat_file(f"{container}/w/small") == small and check.cat_file(f"{container}/w/large") == large
    puts = [r.query.get("comp", ["blob"])[0] for r in azure.proxy.log[seen:] if r.method == "PUT"]
    assert puts == ["blob", "block", "block", "block", "blocklist"]  # committed by the last request only


@pytest.mark.parametrize("error", [RuntimeError, KeyboardInterrupt])
def test_a_failed_large_write_leaves_no_object(azure, error):
    container = azure.make_container()
    fs, root = store.filesystem(f"az://{container}/w", azure.storage_options)
    data = FailingBytes(b"y" * (20 * store.MIB))
    data.error = error
    with pytest.raises(error, match="mid-upload"):
        store.write_atomic(fs, f"{root}/part.npy", data)
    assert azure.fs().find(container) == []
    assert not azure.fs().exists(f"{container}/w/part.npy")


# -- the job, Azure on either side -------------------------------------------------------------

def test_azure_round_trip_verify_and_azure_input(azure, cluster, corpus, gpt2, tmp_path, monkeypatch, capsys):
    out_container = azure.make_container()
    url = f"az://{out_container}/tokens/run1"
    first = run_tokenize(config(azure, cluster, [str(corpus["local"] / "*.parquet")], url), announce=lambda m: None)
    assert first.partitions > 4
    keys = download(azure.fs(), f"{out_container}/tokens/run1", tmp_path / "first")
    check_against_tiktoken(tmp_path / "first", corpus["texts"], gpt2)
    assert set(keys) == {"manifest.json", "tokenshards-job.json"} | {
        f"parts/part-{i:05d}.{ext}" for i in range(first.partitions) for ext in ("tokens.npy", "docs.parquet", "done.json")}
    everything = b"".join((tmp_path / "first" / k).read_bytes() for k in keys)
    assert azure.key.encode() not in everything

    # verify through the CLI, the credentials from the environment as a user sets them (abfs:// too)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string())
    assert main(["verify", f"abfs://{out_container}/tokens/run1", "--deep", "50"]) == 0
    assert azure.key not in "".join(capsys.readouterr())

    run_tokenize(config(azure, cluster, [f"az://{corpus['container']}/fineweb/*.parquet"], str(tmp_path / "from-az")),
                 announce=lambda m: None)
    check_against_tiktoken(tmp_path / "from-az", corpus["texts"], gpt2)
    assert part_files(tmp_path / "first") == part_files(tmp_path / "from-az")
    manifest = json.loads((tmp_path / "from-az" / "manifest.json").read_text())
    # adlfs's canonical scheme: abfs:// (the same object as az://)
    assert [i["path"] for i in manifest["inputs"]] == [f"abfs://{corpus['container']}/fineweb/a.parquet",
                                                       f"abfs://{corpus['container']}/fineweb/b.parquet"]


def test_throttled_and_failing_requests_are_retried(azure, cluster, corpus, gpt2, tmp_path):
    """Azure throttles with 503 ServerBusy, times out with 500 OperationTimedOut; a gateway may send 429;
    connections reset and bodies are cut short: all retried, from client and workers."""
    out_container = azure.make_container()
    proxy = azure.proxy
    reads = lambda r: r.method == "GET" and "/fineweb/" in r.path  # noqa: E731
    parts = lambda r: r.method == "PUT" and "/t/parts/" in r.path  # noqa: E731
    before = len(proxy.answered)
    proxy.fail(reads, status=429, times=2, headers={"Retry-After": "1"})
    proxy.fault(reads, "short", forward=True, times=2)  # a body closed half-way
    proxy.fail(parts, times=2, **AZURE_503)
    proxy.fail(parts, times=1, **AZURE_500)
    proxy.fault(parts, "reset", forward=True, times=2)  # written, the answer lost: written again
    run_tokenize(config(azure, cluster, [f"az://{corpus['container']}/fineweb/*.parquet"], f"az://{out_container}/t"),
                 announce=lambda m: None)
    assert proxy.faults(429, since=before) == proxy.faults(503, since=before) == 2
    assert proxy.faults(500, since=before) == 1
    assert proxy.faults("short", since=before) == proxy.faults("reset", since=before) == 2
    download(azure.fs(), f"{out_container}/t", tmp_path / "t")
    check_against_tiktoken(tmp_path / "t", corpus["texts"], gpt2)


# -- two runs meeting in one OUT: the lease ------------------------------------------------------

def test_the_lease_holds_by_azures_own_conditions(azure):
    container = azure.make_container()
    url = f"az://{container}/out"
    fs, root = store.filesystem(url, azure.storage_options)
    seen = len(azure.proxy.log)
    with Lease(Location(url=url, fs=fs, root=root), command="tokenize") as first:
        with pytest.raises(LeaseHeld, match=rf"^{url} is being written by a tokenize run on host"):
            Lease(Location(url=url, fs=fs, root=root), command="export").acquire()
        ops = _AzureOps(fs, f"{root}/.tokenshards-lease.json")
        with pytest.raises(_Conflict):  # Azurite refuses a second create (If-None-Match: *)...
            ops._put(b"mine", overwrite=False)
        with pytest.raises(_Conflict):  # ...and a write over a version that is not the one read (If-Match)
            ops.replace(b"mine", '"0x8D0000000000000"', mine=False)
        first.check()  # still ours
    puts = [r for r in azure.proxy.log[seen:] if r.method == "PUT" and r.path.endswith(".tokenshards-lease.json")]
    assert puts[0].header("if-none-match") == "*"
    assert azure.fs().find(container) == []  # released


def test_a_renewal_that_lost_stops_the_run_before_its_commit(azure):
    container = azure.make_container()
    url = f"az://{container}/out"
    fs, root = store.filesystem(url, azure.storage_options)
    lease = Lease(Location(url=url, fs=fs, root=root), command="tokenize")
    lease.acquire()
    azure.fs().pipe_file(f"{container}/out/.tokenshards-lease.json", b"somebody else")  # a new ETag
    with pytest.raises(LeaseLost, match="lost its lease"):
        lease.check()
    lease.release()  # leaves the other record alone
    assert azure.fs().cat_file(f"{container}/out/.tokenshards-lease.json") == b"somebody else"


def test_a_second_run_meets_the_first_in_one_line(azure, cluster, corpus):
    container = azure.make_container()
    url = f"az://{container}/out"
    fs, root = store.filesystem(url, azure.storage_options)
    with Lease(Location(url=url, fs=fs, root=root), command="tokenize"):
        with pytest.raises(LeaseHeld, match=rf"^{url} is being written by a tokenize run") as info:
            run_tokenize(config(azure, cluster, [str(corpus["local"] / "*.parquet")], url))
        assert "\n" not in str(info.value)
    assert not azure.fs().exists(f"{container}/out/manifest.json")


# -- one line for what users get wrong -----------------------------------------------------------

def test_missing_containers(azure, cluster, corpus):
    with pytest.raises(UserError, match=r"^output az://no-such-container/t: container 'no-such-container' does not exist "
                                        rf"at {azure.proxy.url}/tokenshards; create it first"):
        run_tokenize(config(azure, cluster, [str(corpus["local"] / "*.parquet")], "az://no-such-container/t"))
    with pytest.raises(UserError, match=r"^input az://no-such-input/x/\*\.parquet: container 'no-such-input' does not exist"):
        run_tokenize(config(azure, cluster, ["az://no-such-input/x/*.parquet"], "az://whatever/t"))
    assert not azure.fs().exists("no-such-container")


def test_cli_missing_container_is_one_line(azure, corpus, capsys, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string())
    code = main(["tokenize", "--input", str(corpus["local"] / "*.parquet"), "--out", "az://no-such-cli/x"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert err.startswith("tokenshards: error: output az://no-such-cli/x: container 'no-such-cli' does not exist")
    assert azure.key not in err


def test_a_wrong_key_is_one_line(azure, cluster, corpus, capsys, monkeypatch):
    wrong = base64.b64encode(b"wrong-key-" * 6).decode()
    options = {"azure": {"connection_string": azure.connection_string(key=wrong)}}
    with pytest.raises(UserError, match=rf"^output az://{corpus['container']}/t: Azure refused the credentials sent for "
                                        rf"container '{corpus['container']}' \(403 AuthorizationFailure\): the account "
                                        r"key of account tokenshards in a connection string; check "
                                        r"AZURE_STORAGE_CONNECTION_STRING") as info:
        run_tokenize(TokenizeConfig(inputs=(str(corpus["local"] / "*.parquet"),), out=f"az://{corpus['container']}/t",
                                    scheduler=cluster.scheduler_address, progress="none", storage_options=options))
    assert "\n" not in str(info.value) and wrong not in str(info.value)
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string(key=wrong))
    code = main(["tokenize", "--input", f"az://{corpus['container']}/fineweb/*.parquet", "--out", str(corpus["local"] / "o")])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and wrong not in err
    assert err.startswith(f"tokenshards: error: input az://{corpus['container']}/fineweb/*.parquet: Azure refused the "
                          f"credentials sent for container '{corpus['container']}'")


def test_a_missing_permission_is_one_line(azure, cluster, corpus):
    """What Azure answers a credential without the right (Azurite signs every account key in full)."""
    container = azure.make_container()
    azure.proxy.fail(lambda r: r.method == "PUT", status=403, times=10**6,
                     headers={"x-ms-error-code": "AuthorizationPermissionMismatch", "Content-Type": "application/xml"},
                     body=b"<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthorizationPermissionMismatch</Code>"
                          b"<Message>This request is not authorized to perform this operation using this permission.</Message></Error>")
    with pytest.raises(UserError, match=rf"^cannot write to output az://{container}/t: access denied: Azure accepted the "
                                        rf"credentials sent for container '{container}' \(403 AuthorizationPermissionMismatch\), "
                                        r"the account key of account tokenshards in a connection string, but they lack a "
                                        r"permission this needs; check that the credentials") as info:
        run_tokenize(config(azure, cluster, [str(corpus["local"] / "*.parquet")], f"az://{container}/t"))
    assert "\n" not in str(info.value)


# -- a worker killed mid-upload ------------------------------------------------------------------

def test_worker_killed_mid_upload_leaves_nothing_committed_and_a_rerun_completes(azure, cl100k, tmp_path):
    """`dask scheduler`, `dask worker`, the CLI with AZURE_STORAGE_CONNECTION_STRING from the
    environment; the proxy holds the big partition's second block, the worker is SIGKILLed, then
    the same command reruns."""
    small, big = big_corpus(tmp_path / "in")
    container = azure.make_container()
    fs = azure.fs()
    for path in sorted((tmp_path / "in").iterdir()):
        fs.pipe_file(f"{container}/in/{path.name}", path.read_bytes())
    env, dask_cli = azure.env(), str(Path(sys.executable).parent / "dask")
    address = f"tcp://127.0.0.1:{free_port()}"
    procs = [subprocess.Popen([dask_cli, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                               "--no-dashboard"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]

    def start_worker() -> subprocess.Popen:
        procs.append(subprocess.Popen([dask_cli, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                       "--memory-limit", "0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        return procs[-1]

    cmd = [sys.executable, "-m", "tokenshards", "tokenize", "--scheduler", address, "--input", f"az://{container}/in/*.parquet",
           "--out", f"az://{container}/out", "--encoding", "cl100k_base", "--partition-mb", "0.001", "--progress", "none"]
    blocks: list = []

    def second_block(r) -> bool:
        if not is_put_block(r) or not r.path.endswith("part-00003.tokens.npy"):
            return False
        blocks.append(r)
        return len(blocks) == 2

    release = azure.proxy.hold(second_block)
    try:
        worker = start_worker()
        log = tmp_path / "run.log"
        with log.open("w") as out:
            run = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
        procs.append(run)
        assert azure.proxy.held.wait(120), log.read_text()
        worker.send_signal(signal.SIGKILL)  # mid-upload: one block staged, none committed
        worker.wait()
        run.kill()
        run.wait()
        release.set()
        azure.proxy.clear()

        assert not fs.exists(f"{container}/out/parts/part-00003.tokens.npy")  # staged blocks are no object...
        assert not fs.exists(f"{container}/out/parts/part-00003.done.json")  # ...nor a record committing it
        assert not fs.exists(f"{container}/out/manifest.json")
        committed = fs.glob(f"{container}/out/parts/*.done.json")
        for done in committed:
            record = json.loads(fs.cat_file(done))
            assert hashlib.sha256(fs.cat_file(f"{container}/out/{record['tokens_file']}")).hexdigest() == record["sha256"]

        start_worker()
        rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
        assert rerun.returncode == 0, rerun.stderr
        if committed:
            assert f"{len(committed)} already committed" in rerun.stderr
        assert azure.key not in rerun.stdout + rerun.stderr + log.read_text()
    finally:
        release.set()
        for proc in reversed(procs):
            proc.kill()
            proc.wait()

    download(fs, f"{container}/out", tmp_path / "out")
    docs = read_documents(tmp_path / "out")
    expected_big = {t: expected_tokens(cl100k, t) for t in set(big)}
    for (path, row), (_, tokens) in docs.items():
        text = big[row] if path.endswith("z_big.parquet") else small[row]
        assert tokens == (expected_big[text] if path.endswith("z_big.parquet") else expected_tokens(cl100k, text))
    assert len(docs) == len(big) + len(small)


# -- export and train-bpe on Azure -----------------------------------------------------------------

@pytest.fixture(scope="module")
def run(cluster, tmp_path_factory):
    return storeexport.local_run(cluster, tmp_path_factory.mktemp("azure-export"))


def test_exports_to_azure_equal_local_ones(azure, cluster, run, tmp_path):
    """Throttled too: staged blocks (from the workers) get 503 ServerBusy first, a block list (the client's commit) 429."""
    def throttle():
        azure.proxy.fail(is_put_block, status=503, times=2, headers={"x-ms-error-code": "ServerBusy"})
        azure.proxy.fail(lambda r: r.query.get("comp") == ["blocklist"], status=429, times=1, headers={"Retry-After": "1"})

    seen, answered = len(azure.proxy.log), len(azure.proxy.answered)
    storeexport.exports_equal_local(azure, "az", azure.make_container(), cluster, run, tmp_path, throttle=throttle)
    assert sum(is_put_block(r) for r in azure.proxy.log[seen:]) > 32  # chunks staged as blocks, then one list each
    statuses = [status for _, status in azure.proxy.answered[answered:]]
    assert statuses.count(503) == 4 and statuses.count(429) == 2  # two exports: each retried, none failed


def test_a_killed_export_leaves_nothing_committed_and_a_rerun_completes(azure, run, tmp_path):
    storeexport.killed_export_leaves_nothing_committed(
        azure, "az", azure.make_container(), run, tmp_path,
        commit_request=lambda r: r.method == "PUT" and r.query.get("comp") == ["blocklist"])


def test_train_bpe_from_and_to_azure(azure, cluster, tmp_path):
    storeexport.train_bpe_equals_local(azure, "az", azure.make_container(), cluster, tmp_path)


def test_export_and_train_bpe_to_a_missing_container_are_one_line(azure, run, corpus, capsys, monkeypatch):
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure.connection_string())
    for argv, line in (
            (["export", str(run), "--format", "llmc", "--to", "az://no-such-container-x/d"],
             "export destination az://no-such-container-x/d: container 'no-such-container-x' does not exist"),
            (["train-bpe", "--input", str(corpus["local"] / "*.parquet"), "--out", "abfs://no-such-container-y/v.tiktoken"],
             "--out abfs://no-such-container-y/v.tiktoken: container 'no-such-container-y' does not exist")):
        code = main(argv)
        err = capsys.readouterr().err
        assert code == 2 and len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"tokenshards: error: {line}"), err
        assert azure.key not in err
