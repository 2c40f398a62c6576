"""Nothing lost: a killed worker or client never costs correctness; a rerun resumes."""
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from daskprocs import dask_processes
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.demo import help_topics
from tokenshards.errors import OutputConflict
from tokenshards.tokenize.command import run_tokenize

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
PARTITION_BYTES = 250_000


@pytest.fixture(scope="module")
def big_corpus(tmp_path_factory):
    """~25 MB of real text (pydoc's topics, repeated with a varying prefix): over a second of
    tokenizing on two workers even with the fastest backend, so there is time to kill things
    mid-run (the window after the first commits was ~0.6 s at a third of this size)."""
    root = tmp_path_factory.mktemp("big")
    topics = [text for _, text in help_topics()]
    for shard in range(3):
        texts = [f"copy {shard}.{i}\n{topics[i % len(topics)]}" for i in range(2 * len(topics) * 9)]
        pq.write_table(pa.table({"text": texts, "id": [f"{shard}-{i}" for i in range(len(texts))]}),
                       root / f"shard{shard}.parquet", row_group_size=40)
    return root


@pytest.fixture(scope="module")
def clean_run(big_corpus, tmp_path_factory, cluster):
    out = tmp_path_factory.mktemp("clean") / "out"
    run_tokenize(TokenizeConfig(inputs=(str(big_corpus),), out=str(out), partition_bytes=PARTITION_BYTES,
                                scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    return out


def _files(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _wait_for_done(out: Path, at_least: int, timeout: float = 60) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(list((out / "parts").glob("*.done.json"))) if (out / "parts").exists() else 0
        if n >= at_least:
            return n
        time.sleep(0.02)
    raise AssertionError(f"fewer than {at_least} partitions committed after {timeout} s")


def test_killed_worker_output_equals_clean_run(big_corpus, clean_run, tmp_path):
    out = tmp_path / "out"
    with dask_processes(tmp_path, workers=2) as procs:
        config = TokenizeConfig(inputs=(str(big_corpus),), out=str(out), partition_bytes=PARTITION_BYTES,
                                scheduler=procs.address, progress="none")
        result: dict = {}
        job = threading.Thread(target=lambda: result.update(summary=run_tokenize(config, announce=lambda m: None)))
        job.start()
        _wait_for_done(out, 3)
        procs.kill(procs.workers[0])  # the machine is gone, mid-task
        procs.start_worker()
        job.join(180)
        assert not job.is_alive() and "summary" in result
    assert _files(out) == _files(clean_run)


def test_killed_client_then_rerun_resumes(big_corpus, clean_run, tmp_path):
    out = tmp_path / "out"
    cmd = [TOKENSHARDS, "tokenize", "--input", str(big_corpus), "--out", str(out),
           "--partition-mb", str(PARTITION_BYTES / 1e6), "--progress", "none"]
    with dask_processes(tmp_path, workers=2) as procs:
        client = subprocess.Popen([*cmd, "--scheduler", procs.address], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  start_new_session=True)
        committed = _wait_for_done(out, 3)
        procs.kill(client)
        assert not (out / "manifest.json").exists()
        rerun = subprocess.run([*cmd, "--scheduler", procs.address], capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert "already committed, skipping them" in rerun.stderr
    skipped = int(rerun.stdout.split(" partitions (")[1].split(" already")[0])
    assert skipped >= committed
    assert _files(out) == _files(clean_run)


def test_rerun_of_a_finished_run_changes_nothing(big_corpus, clean_run, tmp_path, cluster):
    out = tmp_path / "copy"
    import shutil

    shutil.copytree(clean_run, out)
    before = _files(out)
    summary = run_tokenize(TokenizeConfig(inputs=(str(big_corpus),), out=str(out), partition_bytes=PARTITION_BYTES,
                                          scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    assert summary.skipped_partitions == summary.partitions
    assert _files(out) == before


def test_done_records_without_a_job_file_resume_when_they_are_this_runs(big_corpus, clean_run, tmp_path, cluster):
    """A run that fails before its first commit removes its job file; on a cluster it does not own, a
    task still running may commit after that (seen under load: test_hub's failing download). The
    rerun finds done records and no job file: they are this run's when each carries its job, and it
    resumes from them; another run's are refused as before."""
    import shutil

    out = tmp_path / "orphaned"
    shutil.copytree(clean_run, out)
    (out / "manifest.json").unlink()
    (out / "tokenshards-job.json").unlink()
    done = sorted(out.glob("parts/part-*.done.json"))
    for record in done[len(done) // 2:]:  # half committed, as a failed run leaves it
        for part in out.glob(f"parts/{record.name.removesuffix('.done.json')}.*"):
            part.unlink()
    config = TokenizeConfig(inputs=(str(big_corpus),), out=str(out), partition_bytes=PARTITION_BYTES,
                            scheduler=cluster.scheduler_address, progress="none")
    summary = run_tokenize(config, announce=lambda m: None)
    assert summary.skipped_partitions == len(done) // 2 < summary.partitions
    assert _files(out) == _files(clean_run)

    (out / "manifest.json").unlink()
    (out / "tokenshards-job.json").unlink()
    with pytest.raises(OutputConflict, match="already holds output that is not this run's"):
        run_tokenize(config.replace(encoding="cl100k_base"), announce=lambda m: None)


def test_resume_with_another_backend_records_both(big_corpus, clean_run, tmp_path, cluster):
    """The same bytes whichever tokenizer wrote a partition; the manifest says which ones did."""
    import json
    import shutil

    from tokenshards.verify.command import VerifyConfig, run_verify

    out = tmp_path / "mixed"
    shutil.copytree(clean_run, out)
    for done in sorted((out / "parts").glob("*.done.json"))[::2]:  # as if killed before these committed
        done.unlink()
    summary = run_tokenize(TokenizeConfig(inputs=(str(big_corpus),), out=str(out), partition_bytes=PARTITION_BYTES,
                                          scheduler=cluster.scheduler_address, progress="none", backend="tiktoken"),
                           announce=lambda m: None)
    assert 0 < summary.skipped_partitions < summary.partitions
    data = [{k: v for k, v in _files(o).items() if k.endswith((".npy", ".parquet"))} for o in (out, clean_run)]
    assert data[0] == data[1]
    written = json.loads((out / "manifest.json").read_text())
    by_backend = {e["backend"].split()[0] for e in written["partitions"]}
    assert by_backend == {"gigatoken", "tiktoken"}
    assert written["backend"].startswith("gigatoken ") and ", tiktoken " in written["backend"]
    assert [e["sha256"] for e in written["partitions"]] == \
           [e["sha256"] for e in json.loads((clean_run / "manifest.json").read_text())["partitions"]]
    report = run_verify(VerifyConfig(out=str(out), scheduler=cluster.scheduler_address), announce=lambda m: None)
    assert not report.problems


def test_ctrl_c_stops_cleanly_and_leaves_only_committed_or_temporary_files(big_corpus, tmp_path):
    import os
    import signal

    out = tmp_path / "out"
    proc = subprocess.Popen([TOKENSHARDS, "tokenize", "--input", str(big_corpus), "--out", str(out), "--workers", "2",
                             "--partition-mb", str(PARTITION_BYTES / 1e6), "--no-dashboard", "--progress", "none"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _wait_for_done(out, 2)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    assert "interrupted; committed partitions are kept" in stderr and "Traceback" not in stderr
    assert not (out / "manifest.json").exists()
    for path in (out / "parts").iterdir():
        stem = path.name.split(".")[0]
        assert path.name.endswith(".tmp") or (out / "parts" / f"{stem}.done.json").exists(), path.name


def _refuse_direct(monkeypatch, where: str) -> None:
    """A filesystem that refuses ``O_DIRECT`` (tmpfs before Linux 6.6, some FUSE ones), as the
    kernel answers for it: EINVAL from the open (after creating the file) or from the write. No
    such filesystem can be mounted here, so the two calls are wrapped."""
    import errno
    import fcntl
    import os

    from tokenshards.storage import store

    if where == "open":
        real_open = os.open

        def refusing_open(path, flags, mode=0o777, **kw):
            if flags & store.DIRECT_FLAG:
                os.close(real_open(path, flags & ~store.DIRECT_FLAG, mode, **kw))
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_open(path, flags, mode, **kw)

        monkeypatch.setattr(os, "open", refusing_open)
    else:
        real_pwrite = os.pwrite

        def refusing_pwrite(fd, data, offset):
            if fcntl.fcntl(fd, fcntl.F_GETFL) & store.DIRECT_FLAG:
                raise OSError(errno.EINVAL, "Invalid argument")
            return real_pwrite(fd, data, offset)

        monkeypatch.setattr(os, "pwrite", refusing_pwrite)


@pytest.mark.parametrize("case", ["small, buffered", "large, direct", "direct refused at open",
                                  "direct refused at write"])
def test_a_begun_write_is_invisible_until_finished_and_leaves_nothing_when_aborted(tmp_path, monkeypatch, case):
    """A task starts its tokens file for the disk before making its checksum and docs file
    (``store.begin_write``): until ``finish()`` no reader sees it, and ``abort()`` (the docs file
    failed) leaves no temporary behind. A large file goes past the page cache (``O_DIRECT``, padded
    to a block, then cut to its length), and where the filesystem refuses that, through it: the
    same bytes either way."""
    from tokenshards.storage import store
    from tokenshards.storage.store import begin_write, filesystem

    if case != "small, buffered" and not store.DIRECT_FLAG:
        pytest.skip("no O_DIRECT on this platform")
    if case.startswith("direct refused"):
        _refuse_direct(monkeypatch, case.rsplit(" ", 1)[-1])
    fs, root = filesystem(str(tmp_path / "out"), {})
    data = bytes(range(256)) * (1_000 if case == "small, buffered" else 40_000) + b"tail"
    pending = begin_write(fs, f"{root}/parts/a.bin", data)
    assert isinstance(pending, store._DirectWrite) == (case in ("large, direct", "direct refused at write"))
    assert [p.name for p in (tmp_path / "out/parts").iterdir()][0].endswith(".tmp")
    pending.finish()
    assert (tmp_path / "out/parts/a.bin").read_bytes() == data
    begin_write(fs, f"{root}/parts/b.bin", data).abort()
    assert [p.name for p in (tmp_path / "out/parts").iterdir()] == ["a.bin"]
