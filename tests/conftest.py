"""Shared test parts: one real LocalCluster (process workers) per session, real tiktoken."""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import sys
from pathlib import Path

import dask
import hypothesis
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import LocalCluster

# litdata pulls PyPI's torchvision 0.28 (a CUDA build), whose operators fail to register against the
# CPU torch 2.13 here ('operator torchvision::nms does not exist'); transformers imports it whenever
# it finds it, so any model class fails to import. Nothing in this process needs it (the MDS reader
# venv stubs it itself): hidden for every test process (find_spec gives None for a None entry),
# before any test imports transformers, whose availability checks are cached per process.
sys.modules.setdefault("torchvision", None)

from s3server import s3  # noqa: F401  (the S3 fixture, for every test module)
from tokenshards.cluster.connect import dashboard_arguments
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.encoding.encoders import load_encoding
from tokenshards.tokenize.command import run_tokenize

# Generated tests (hypothesis) draw the same examples every `make test`: a CI run fails only on a
# change, never on a draw; every failing example found stays in its test as an @example. To explore
# (new draws, examples kept in .hypothesis/): HYPOTHESIS_PROFILE=explore, or `make fuzz` for runs.
hypothesis.settings.register_profile("suite", derandomize=True, database=None)
hypothesis.settings.register_profile("explore", derandomize=False)
hypothesis.settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "suite"))

pytest_plugins = ("tokenizerfiles", "gcsserver", "azurite")
"""Fixtures that live beside their helpers: the real tokenizer files, the GCS emulator, Azurite."""


@pytest.fixture(scope="session", autouse=True)
def no_leaked_semaphores():
    """Tests that SIGKILL a worker's whole process group (a machine lost) kill its multiprocessing
    resource tracker too, which would have unlinked the group's named semaphores: /dev/shm kept ~6
    of them per such test, run after run. At the session's end, those made during it that no live
    process maps (by inode: glibc maps a semaphore under a temporary name) are unlinked."""
    before = set(glob.glob("/dev/shm/sem.mp-*"))
    yield
    in_use = _mapped_shm_inodes()
    for path in set(glob.glob("/dev/shm/sem.mp-*")) - before:
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino not in in_use:
                os.unlink(path)


def _mapped_shm_inodes() -> set[int]:
    inodes = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        with contextlib.suppress(OSError), open(maps) as f:
            inodes.update(int(line.split()[4]) for line in f if "/dev/shm/" in line)
    return inodes


@pytest.fixture(scope="session")
def gpt2():
    return load_encoding("gpt2").encoding


@pytest.fixture(scope="session")
def cl100k():
    return load_encoding("cl100k_base").encoding


@pytest.fixture(scope="session")
def cluster():
    """Two process workers, one thread each, shared by the session (start-up costs ~2 s). No
    dashboard (bokeh's start-up, in every test process): the tests of one are in test_cluster.py.

    It idles between the tests that use it, for the whole session, in each test process: with
    Dask's defaults an idle one took ~5 s of CPU a minute here (workers' profilers sampling every
    10 ms, a 20 ms event-loop tick, a system monitor every 0.5 s, all for a dashboard), ~1.5 s
    without them. They are not what any test of it checks (test_cluster.py's clusters keep them)."""
    quiet = {"distributed.admin.tick.interval": "1s", "distributed.admin.system-monitor.interval": "5s",
             "distributed.worker.profile.enabled": False}
    with dask.config.set(quiet):  # read as the scheduler and the nannies start: this cluster's only
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, silence_logs=logging.CRITICAL,
                               **dashboard_arguments(None))
    with cluster as c:
        yield c


@pytest.fixture
def tokenize(cluster, tmp_path):
    """Run the job on the session cluster; returns (summary, out path)."""

    def run(inputs, out=None, **options):
        out = str(out or tmp_path / "out")
        config = TokenizeConfig(inputs=tuple(str(i) for i in inputs), out=out, scheduler=cluster.scheduler_address,
                                progress="none", **options)
        return run_tokenize(config, announce=lambda msg: None), Path(out)

    return run


def download(fs, prefix: str, dest: Path) -> list[str]:
    """Every object under ``prefix`` of an fsspec store copied below ``dest``; their keys relative to it."""
    keys = sorted(fs.find(prefix))
    for key in keys:
        target = dest / key[len(prefix) + 1:]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(fs.cat_file(key))
    return [k[len(prefix) + 1:] for k in keys]


def write_parquet(path: Path, columns: dict, *, row_group_size: int | None = None, schema: pa.Schema | None = None) -> Path:
    """A parquet file from plain Python columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns, schema=schema)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def not_utf8(texts: list[bytes | None]) -> pa.Array:
    """A string column holding invalid UTF-8, as some parquet writers produce (Arrow's view skips validation)."""
    return pa.array(texts, pa.binary()).view(pa.string())


def corrupt_data_pages(path: Path) -> Path:
    """Footer intact (metadata reads fine), page data destroyed: planned, then unreadable in every task."""
    raw = bytearray(path.read_bytes())
    footer = int.from_bytes(raw[-8:-4], "little") + 8
    raw[8:len(raw) - footer - 8] = b"\xff" * (len(raw) - footer - 16)
    path.write_bytes(bytes(raw))
    return path
