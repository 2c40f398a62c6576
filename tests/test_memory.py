"""One huge document: a worker's peak memory grows by at most MAX_MB_PER_MB per MB of it (README)."""
from __future__ import annotations

import logging
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client, LocalCluster

from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize

MAX_MB_PER_MB = 10
"""The bound the README states; measured ~8 with splintr or tiktoken on text holding emoji
(Python then stores 4 bytes per character)."""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")


def _peak_kib(reset: bool = False) -> int:
    if reset:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # restart the peak (VmHWM) from the current RSS
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def _one_document(path, mb: int) -> None:
    unit = "web text, naïve café, Straße, 東京, emoji 🙂 and <|endoftext|> as text. " * 100
    n = mb * 10**6 // len(unit.encode())
    pq.write_table(pa.table({"text": [unit * n]}), path)


def test_worker_memory_per_mb_of_the_largest_document(tmp_path):
    _one_document(tmp_path / "small.parquet", 8)
    _one_document(tmp_path / "big.parquet", 40)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as client:
        peaks = []
        for name in ("small", "big"):
            client.run(_peak_kib, True)
            run_tokenize(TokenizeConfig(inputs=(str(tmp_path / f"{name}.parquet"),), out=str(tmp_path / name),
                                        scheduler=cluster.scheduler_address, progress="none"),
                         announce=lambda m: None)
            peaks.append(next(iter(client.run(_peak_kib).values())) / 1024)
    # The difference cancels what every run needs (the encoder, Dask): what one more MB of document costs.
    per_mb = (peaks[1] - peaks[0]) / (40 - 8)
    print(f"worker memory: {per_mb:.1f} MB per MB of document")
    assert per_mb <= MAX_MB_PER_MB, f"{per_mb:.1f} MB of worker memory per MB of document (peaks {peaks})"
