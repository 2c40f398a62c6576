"""Shared test parts: one real LocalCluster (process workers) per session, real tiktoken."""
from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import LocalCluster

from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.encoding.encoders import load_encoding
from tokenshards.tokenize.job import run_tokenize


@pytest.fixture(scope="session")
def gpt2():
    return load_encoding("gpt2").encoding


@pytest.fixture(scope="session")
def cl100k():
    return load_encoding("cl100k_base").encoding


@pytest.fixture(scope="session")
def cluster():
    """Two process workers, one thread each, shared by the session (start-up costs ~2 s)."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as c:
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


def write_parquet(path: Path, columns: dict, *, row_group_size: int | None = None, schema: pa.Schema | None = None) -> Path:
    """A parquet file from plain Python columns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table(columns, schema=schema)
    pq.write_table(table, path, row_group_size=row_group_size)
    return path
