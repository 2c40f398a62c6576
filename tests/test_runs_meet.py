"""Nothing lost where runs meet: one live writer per OUT, and resume trusts files, not only records."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenshards.demo import help_topics
from tokenshards.errors import UserError
LEASE_FILE = ".tokenshards-lease.json"
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
PARTITION_BYTES = 200_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """~8 MB of real text in two files: a few seconds of tiktoken on one worker."""
    root = tmp_path_factory.mktemp("meet")
    topics = [text for _, text in help_topics()]
    for shard in range(2):
        texts = [f"copy {shard}.{i}\n{topics[i % len(topics)]}" for i in range(3 * len(topics))]
        pq.write_table(pa.table({"text": texts}), root / f"shard{shard}.parquet", row_group_size=20)
    return root


def _config(inputs, out, cluster, **options) -> TokenizeConfig:
    return TokenizeConfig(inputs=(str(inputs),), out=str(out), partition_bytes=PARTITION_BYTES,
                          scheduler=cluster.scheduler_address, progress="none", **options)


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        time.sleep(0.02)


def _start_tokenize(corpus, out, *, stdout) -> subprocess.Popen:
    """A live `tokenshards tokenize` in its own process: one worker, small partitions, slow backend."""
    return subprocess.Popen([TOKENSHARDS, "tokenize", "--input", str(corpus), "--out", str(out), "--workers", "1",
                             "--backend", "tiktoken", "--partition-mb", str(PARTITION_BYTES / 1e6),
                             "--progress", "none", "--no-dashboard"],
                            stdout=stdout, stderr=subprocess.PIPE, text=True)


def test_overwrite_and_second_writer_refuse_a_live_run(corpus, tmp_path, cluster):
    out = tmp_path / "out"
    live = _start_tokenize(corpus, out, stdout=subprocess.PIPE)
    try:
        _wait_for(lambda: any((out / "parts").glob("*.done.json")) if (out / "parts").exists() else False)
        for options in ({"overwrite": True}, {}, {"eot_position": "suffix", "overwrite": True}):
            with pytest.raises(UserError, match=rf"being written by a tokenize run on host \S+, pid {live.pid}, "
                                                r"started .* UTC.*wait for it to finish or use another --out"):
                run_tokenize(_config(corpus, out, cluster, **options), announce=lambda m: None)
        stdout, stderr = live.communicate(timeout=120)
    finally:
        live.kill()
        live.wait()
    assert live.returncode == 0, stderr
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["partitions"]:  # every listed file is there: nothing of the live run was removed
        assert (out / entry["tokens_file"]).stat().st_size == entry["tokens_bytes"]
        assert (out / entry["docs_file"]).stat().st_size == entry["docs_bytes"]
    assert not (out / LEASE_FILE).exists()  # released at the end
    # Once it finished, --overwrite replaces it as before.
    run_tokenize(_config(corpus, out, cluster, eot_position="suffix", overwrite=True), announce=lambda m: None)


def test_rerun_after_a_crash_takes_over_its_lease(corpus, tmp_path, cluster):
    out = tmp_path / "out"
    crashed = subprocess.Popen([TOKENSHARDS, "tokenize", "--input", str(corpus), "--out", str(out),
                                "--workers", "1", "--backend", "tiktoken", "--progress", "none",
                                "--partition-mb", str(PARTITION_BYTES / 1e6), "--no-dashboard"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for(lambda: any((out / "parts").glob("*.done.json")) if (out / "parts").exists() else False)
    os.killpg(crashed.pid, signal.SIGKILL)  # the client and its workers, no chance to release the lease
    crashed.wait()
    assert (out / LEASE_FILE).exists()
    notes = []
    run_tokenize(_config(corpus, out, cluster, backend="tiktoken"), announce=notes.append)
    assert any("took over the stale lease of a tokenize run on host" in n and f"pid {crashed.pid}" in n for n in notes)
    assert (out / "manifest.json").exists() and not (out / LEASE_FILE).exists()


def test_resume_redoes_partitions_whose_files_are_gone_or_resized(corpus, tmp_path, cluster):
    out = tmp_path / "out"
    run_tokenize(_config(corpus, out, cluster), announce=lambda m: None)
    clean = _files(out)
    (out / "parts" / "part-00001.tokens.npy").unlink()
    docs = out / "parts" / "part-00002.docs.parquet"
    docs.write_bytes(docs.read_bytes()[:-10])
    (out / "parts" / "part-00003.tokens.npy").write_bytes(b"")
    (out / "manifest.json").unlink()  # an interrupted run, or the same command run again: same answer
    notes = []
    summary = run_tokenize(_config(corpus, out, cluster), announce=notes.append)
    assert summary.skipped_partitions == summary.partitions - 3
    assert any("partition 1: parts/part-00001.tokens.npy is missing; redoing it" in n for n in notes)
    assert any("partition 2: parts/part-00002.docs.parquet has" in n for n in notes)
    assert _files(out) == clean
    # A finished run rerun as is checks its files too.
    (out / "parts" / "part-00000.docs.parquet").unlink()
    run_tokenize(_config(corpus, out, cluster), announce=lambda m: None)
    assert _files(out) == clean


def test_registering_the_encoder_again_leaves_running_tasks_alone(tmp_path):
    from distributed import Client

    from daskprocs import dask_processes
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.encoding.plugin import EncoderPlugin, plugin_name

    def encode_for(name: str, seconds: float) -> int:
        """Keeps using the worker's encoder plugin for a while, as a long partition does (a local
        function: cloudpickle ships it by value to the worker, which cannot import this module)."""
        from tokenshards.encoding.plugin import worker_backend

        calls, deadline = 0, time.monotonic() + seconds
        while time.monotonic() < deadline:
            worker_backend(name).encode_many(["hello world"])
            calls += 1
        return calls

    pytest.importorskip("splintr")  # a fast backend: its plugin's setup leaves the widest window
    loaded = load_encoding("gpt2")
    with dask_processes(tmp_path, workers=1) as procs, Client(procs.address) as first, \
            Client(procs.address) as second:
        first.register_plugin(EncoderPlugin(loaded, backend="splintr"))
        busy = first.submit(encode_for, plugin_name(loaded, backend="splintr"), 3.0, pure=False, retries=0)
        time.sleep(0.5)
        # a second run (or verify --deep) on the same scheduler
        second.register_plugin(EncoderPlugin(loaded, backend="splintr"))
        assert busy.result(timeout=60) > 0


def test_two_runs_share_one_dask_scheduler(corpus, tmp_path):
    import threading

    from daskprocs import dask_processes

    with dask_processes(tmp_path, workers=2) as procs:
        def config(out):
            return TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / out), partition_bytes=PARTITION_BYTES,
                                  scheduler=procs.address, progress="none", retries=0)

        errors = []

        def first():
            try:
                run_tokenize(config("a"), announce=lambda m: None)
            except BaseException as e:  # noqa: BLE001 -- reported by the assertion below
                errors.append(e)

        thread = threading.Thread(target=first)
        thread.start()
        _wait_for(lambda: any((tmp_path / "a" / "parts").glob("*.done.json")) if (tmp_path / "a" / "parts").exists()
                  else False)
        run_tokenize(config("b"), announce=lambda m: None)
        thread.join(120)
    assert errors == []
    assert _files(tmp_path / "a") == _files(tmp_path / "b")


def test_export_refuses_a_folder_a_live_run_writes(corpus, tmp_path, cluster):
    from tokenshards.export.command import ExportConfig, run_export

    out = tmp_path / "out"
    run_tokenize(_config(corpus, out, cluster), announce=lambda m: None)
    dest = tmp_path / "dest"
    live = _start_tokenize(corpus, dest, stdout=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any((dest / "parts").glob("*.done.json")) if (dest / "parts").exists() else False)
        with pytest.raises(UserError, match=rf"being written by a tokenize run on host \S+, pid {live.pid}"):
            run_export(ExportConfig(out=str(out), format="llmc", to=str(dest), overwrite=True, val_tokens=0,
                                    scheduler=cluster.scheduler_address), announce=lambda m: None)
        _, stderr = live.communicate(timeout=120)
    finally:
        live.kill()
        live.wait()
    assert live.returncode == 0, stderr


def test_hub_fetch_plugin_is_idempotent_and_tears_down():
    from tokenshards.storage.hub import HubCacheFileSystem, HubFetchPlugin, HubFile, HubListing
    from tokenshards.storage.hub.workerfs import Registered
    from tokenshards.storage.hubspec import HubDataset

    ds = HubDataset(repo="HuggingFaceFW/fineweb", size="10B")
    listing = HubListing(repo=ds.repo, revision="main", commit="c" * 40, folder="sample/10BT",
                         files=(HubFile(path="sample/10BT/000_00000.parquet", size=10, etag="e"),))
    plugin = HubFetchPlugin(ds, listing)
    assert plugin.idempotent  # a second run on the same scheduler keeps the running copy
    plugin.setup(worker=None)
    assert HubCacheFileSystem.datasets[plugin.key] == Registered(plugin.ds, plugin.files, fetch=True)
    plugin.teardown(worker=None)
    assert plugin.key not in HubCacheFileSystem.datasets
