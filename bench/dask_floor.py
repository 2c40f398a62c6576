#!/usr/bin/env python3
"""Dask's own cost per task, the floor under our fixed cost per partition (issue 24).

The job's graph shape (``dd.from_map`` read, ``dd.from_map`` pieces, ``map_partitions`` write,
``to_delayed``, computed under ``job.DASK_SETTINGS`` without a second optimization, one
``ResultFrame`` row back, gathered straight from the workers as a local run's client does) is run
with functions that do nothing else, on a LocalCluster of process workers, and so is ``client.map``
of a function that does nothing: the CPU the workers and this process (client and scheduler)
spend per task is what any task of that shape costs, before reading or tokenizing a byte.

    python bench/dask_floor.py [--tasks 3000] [--repeats 3] [--workers 2]
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import pandas as pd


def read_nothing(i: int) -> pd.DataFrame:
    return pd.DataFrame({"row": [i]})


def piece_nothing(i: int) -> pd.DataFrame:
    return pd.DataFrame({"piece": pd.Series([i], dtype=object)})


def write_nothing(frame: pd.DataFrame, pieces: pd.DataFrame, *, settings: dict):
    from tokenshards.tokenize.task import TaskResult

    return TaskResult.as_frame([int(frame["row"].iat[0])])


def map_nothing(i: int, *, settings: dict) -> int:
    return i


def _frames(client, n: int) -> list:
    import dask
    import dask.dataframe as dd

    from tokenshards.tokenize.command import DASK_SETTINGS
    from tokenshards.tokenize.task import RESULT_META

    with dask.config.set(DASK_SETTINGS):
        rows = dd.from_map(read_nothing, list(range(n)), meta=pd.DataFrame({"row": pd.Series([], dtype="int64")}),
                           enforce_metadata=False)
        pieces = dd.from_map(piece_nothing, list(range(n)), meta=pd.DataFrame({"piece": pd.Series([], dtype=object)}),
                             enforce_metadata=False)
        written = rows.map_partitions(write_nothing, pieces, settings={"out": "nowhere"}, meta=RESULT_META,
                                      enforce_metadata=False)
        return client.compute(written.to_delayed(), optimize_graph=False)


def _map(client, n: int) -> list:
    return client.map(map_nothing, list(range(n)), settings={"out": "nowhere"}, pure=False)


SHAPES = {"dataframe": _frames, "client.map": _map}


def measure(*, tasks: int = 3000, repeats: int = 3, workers: int = 2) -> dict:
    """Per-task CPU medians (ms) of the workers and of this process, for each shape, interleaved."""
    import psutil
    from distributed import Client, LocalCluster, as_completed

    def cpu(processes) -> float:
        return sum(p.cpu_times().user + p.cpu_times().system for p in processes)

    runs: dict[str, list[dict]] = {shape: [] for shape in SHAPES}
    with LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster, direct_to_workers=True) as client:
        worker_processes = [psutil.Process(pid) for pid in client.run(os.getpid).values()]
        here = psutil.Process()
        for _ in range(repeats):
            for shape, submit in SHAPES.items():
                w0, c0, t0 = cpu(worker_processes), cpu([here]), time.perf_counter()
                for future in as_completed(submit(client, tasks)):
                    future.result()
                    future.release()
                runs[shape].append({"worker_ms": (cpu(worker_processes) - w0) / tasks * 1e3,
                                    "client_scheduler_ms": (cpu([here]) - c0) / tasks * 1e3,
                                    "seconds": time.perf_counter() - t0})
    return {"tasks": tasks, "workers": workers, "repeats": repeats,
            **{shape: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for shape, rs in runs.items()},
            "runs": runs}


def describe(floor: dict) -> str:
    frames, plain = floor["dataframe"], floor["client.map"]
    return (f"Dask's own floor per task ({floor['tasks']:,} tasks that do nothing, {floor['workers']} workers): our "
            f"DataFrame shape {frames['worker_ms']:.1f} ms of worker CPU and {frames['client_scheduler_ms']:.1f} ms "
            f"of client + scheduler; client.map {plain['worker_ms']:.1f} and {plain['client_scheduler_ms']:.1f} ms")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    a = ap.parse_args()
    print(describe(measure(tasks=a.tasks, repeats=a.repeats, workers=a.workers)))


if __name__ == "__main__":
    main()
