#!/usr/bin/env python3
"""How close to the bare pipeline a run can come while it keeps its checks (issue 57's ratio targets).

    python bench/checks_bound.py [--mb 1000] [--repeats 3] [--workers N] [--tokenizers gpt2,llama3,qwen3]

Every run must do three things that ``../shared/bench/bare_pipeline.py`` leaves out, whatever
executes it: the spot check (each partition's sample, ``backends.spot_check_sample``, encoded
again by the tokenizer's reference library), Arrow's full UTF-8 validation of the text, and the
sha256 of the tokens bytes that format v1 records for each partition. This measures their CPU
alone, in this process, over the same held-out corpus cut into the default partitions, each
repeat interleaved with a whole bare-pipeline process. The bound on ours / bare is then
``bare wall / (bare wall + checks CPU / workers)``: what a run would reach with the checks and
nothing else, no cluster, client, docs files or records. It is generous: those are all left out.
A second bound adds what Dask itself costs per task, one task per partition, at its cheapest shape
(``client.map`` of a function that does nothing, ``dask_floor.py``, measured once here first): still
no cluster start, no imports, no scheduler beyond the per-task.

The same for one more partition (issue 57's <= 5 ms of wall time x cores): the spot check's CPU per
partition, from the same runs, and the three files a partition commits (tokens, docs, done record:
``store.write_atomic``, each created, written, fsync'ed and renamed) at a ~0.5 MB partition's sizes,
written ``FILES_REPEATS`` times into the corpus's own disk. Those two alone are that partition's floor.
"""
from __future__ import annotations

import glob
import hashlib
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq

import dask_floor
from harness import HELD_OUT_SEED, HERE, build_corpus, rotated
from pipeline_case import TARGET_MS_PER_PARTITION, TARGETS, TOKENIZERS, arguments, report, run_bare, spread
from tokenizers_case import tokenizer_folder

HASH_CHUNK = 64 * 2**20
FILES_REPEATS = 300
PARTITION_FILE_BYTES = (400_000, 6_000, 1_000)
"""A ~0.5 MB partition's tokens (gpt2: ~200,000 uint16), docs file and done record, in bytes."""


def files_seconds(folder: Path) -> float:
    """CPU seconds of one partition's three files, committed as a task commits them, mean of ``FILES_REPEATS``."""
    from tokenshards.storage.store import filesystem, join, write_atomic

    fs, root = filesystem(str(folder))
    blobs = [os.urandom(n) for n in PARTITION_FILE_BYTES]
    started = time.process_time()
    for i in range(FILES_REPEATS):
        for k, blob in enumerate(blobs):
            write_atomic(fs, join(root, f"part-{i:05d}.{k}"), blob)
    return (time.process_time() - started) / FILES_REPEATS


def check_seconds(pattern: str, spec: str, tokens: int) -> dict:
    """CPU seconds of each check over the corpus, for a run that writes ``tokens`` tokens."""
    from tokenshards.corpus.plan import DEFAULT_PARTITION_BYTES, plan_pieces, read_input_metadata
    from tokenshards.encoding import registry
    from tokenshards.encoding.backends import spot_check_sample

    loaded = registry.load(spec)
    reference = loaded.reference()
    files = [read_input_metadata(p, Path(p).name, text_column="text", id_column=None) for p in sorted(glob.glob(pattern))]
    spot = utf8 = 0.0
    pieces = plan_pieces(files, target_bytes=DEFAULT_PARTITION_BYTES)
    for piece in pieces:
        column = pq.ParquetFile(piece.input).read_row_groups(range(*piece.row_groups), columns=["text"]).column(0)
        column = column.combine_chunks()
        started = time.process_time()
        column.validate(full=True)
        utf8 += time.process_time() - started
        sizes = pc.binary_length(column).to_numpy(zero_copy_only=False).astype(np.int64)
        started = time.process_time()
        for i in spot_check_sample(sizes):
            reference.encode_one(column[int(i)].as_py())
        spot += time.process_time() - started
    # The tokens bytes themselves are not made here: hashing as many bytes costs the same.
    left, chunk = tokens * np.dtype(loaded.dtype).itemsize, os.urandom(HASH_CHUNK)
    started = time.process_time()
    while left > 0:
        hashlib.sha256(memoryview(chunk)[:min(left, HASH_CHUNK)]).digest()
        left -= HASH_CHUNK
    sha256 = time.process_time() - started
    return {"spot_check": spot, "utf8": utf8, "sha256": sha256, "all": spot + utf8 + sha256, "partitions": len(pieces)}


def measure(corpus: Path, *, workers: int, repeats: int, scratch: Path, cache: Path, tokenizers) -> dict:
    pattern = str(sorted(corpus.rglob("*.parquet"))[0].parent / "*.parquet")
    floor = dask_floor.measure(tasks=1000, repeats=3, workers=workers)
    task_ms = floor["client.map"]["worker_ms"] + floor["client.map"]["client_scheduler_ms"]
    print(f"  {dask_floor.describe(floor)}", file=sys.stderr, flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in tokenizers}
    for r in range(repeats):
        for name in rotated(list(tokenizers), r):
            encoding, package, eot_id, eot = TOKENIZERS[name]
            folder = tokenizer_folder(package, cache) if package else None
            load = os.getloadavg()[0]
            bare = run_bare(pattern, workers, scratch, folder=folder, eot_id=eot_id, eot=eot)
            checks = check_seconds(pattern, encoding or str(folder / "tokenizer.json"), bare["tokens"])
            bound = bare["seconds"] / (bare["seconds"] + checks["all"] / workers)
            with tempfile.TemporaryDirectory(dir=corpus.parent) as written:
                files = files_seconds(Path(written))
            with_dask = bare["seconds"] / (bare["seconds"] + (checks["all"] + checks["partitions"] * task_ms / 1e3) / workers)
            partition_ms = (checks["spot_check"] / checks["partitions"] + files) * 1e3
            runs[name].append({"bare": bare, "checks_cpu_seconds": checks, "bound": bound, "bound_with_dask": with_dask,
                               "files_cpu_ms": files * 1e3, "partition_floor_ms": partition_ms,
                               "cpu_bound": bare["cpu_seconds"] / (bare["cpu_seconds"] + checks["all"]),
                               "load_1m_before": load})
            print(f"  repeat {r + 1}/{repeats}: {name} bare {bare['seconds']:.1f} s ({bare['cpu_seconds']:.1f} s CPU), checks "
                  f"{checks['all']:.2f} s CPU (spot check {checks['spot_check']:.2f}, UTF-8 {checks['utf8']:.2f}, sha256 "
                  f"{checks['sha256']:.2f}): bound {bound:.3f}, with Dask's per task {with_dask:.3f}; a "
                  f"partition's spot check and files {partition_ms:.2f} ms CPU (load {load:.1f})", file=sys.stderr, flush=True)
    cases = {name: {"bound": spread([x["bound"] for x in each]), "cpu_bound": spread([x["cpu_bound"] for x in each]),
                    "bound_with_dask": spread([x["bound_with_dask"] for x in each]),
                    "target": TARGETS[name], "reachable": statistics.median(x["bound_with_dask"] for x in each) >= TARGETS[name],
                    "checks_cpu_seconds": {k: spread([x["checks_cpu_seconds"][k] for x in each])
                                           for k in ("spot_check", "utf8", "sha256", "all")},
                    "bare_seconds": spread([x["bare"]["seconds"] for x in each]),
                    "partition_floor_ms": spread([x["partition_floor_ms"] for x in each]),
                    "files_cpu_ms": spread([x["files_cpu_ms"] for x in each]),
                    "load_1m": spread([x["load_1m_before"] for x in each])}
             for name, each in runs.items()}
    return {"corpus": str(corpus), "workers": workers, "repeats": repeats, "dask_floor": floor, "dask_task_ms": task_ms,
            "cases": cases, "runs": runs}


def describe(m: dict) -> list[str]:
    lines = [f"ours / bare with the checks and nothing else ({m['workers']} workers, {m['repeats']} interleaved repeats, "
             f"median (min-max)); then adding Dask's {m['dask_task_ms']:.1f} ms of CPU per task (client.map, nothing done):"]
    for name, c in m["cases"].items():
        b, d, checks, load = c["bound"], c["bound_with_dask"], c["checks_cpu_seconds"], c["load_1m"]
        lines.append(f"  {name:7s} at most {b['median']:.3f} ({b['min']:.3f}-{b['max']:.3f}), with Dask {d['median']:.3f} "
                     f"({d['min']:.3f}-{d['max']:.3f}), against a target of "
                     f"{c['target']}: {'reachable' if c['reachable'] else 'OUT OF REACH'}; checks "
                     f"{checks['all']['median']:.2f} s CPU (spot check {checks['spot_check']['median']:.2f}, UTF-8 "
                     f"{checks['utf8']['median']:.2f}, sha256 {checks['sha256']['median']:.2f}); bare "
                     f"{c['bare_seconds']['median']:.1f} s; one more partition's spot check and three files "
                     f"{c['partition_floor_ms']['median']:.2f} ms CPU ({c['partition_floor_ms']['min']:.2f}-"
                     f"{c['partition_floor_ms']['max']:.2f}; the files {c['files_cpu_ms']['median']:.2f}) against {TARGET_MS_PER_PARTITION:g} ms; "
                     f"1-minute load {load['min']:.1f}-{load['max']:.1f}")
    return lines


def main() -> None:
    a = arguments(__doc__, HERE / "results-checks-bound.json").parse_args()
    corpus, source = build_corpus(a.corpus_dir / f"{a.mb:g}mb-all-seed{HELD_OUT_SEED}", a.mb)
    with tempfile.TemporaryDirectory(prefix="tokenshards-checks-bound-") as tmp:
        m = measure(corpus, workers=a.workers, repeats=a.repeats, scratch=Path(tmp), cache=a.scratch,
                    tokenizers=tuple(a.tokenizers))
    report(a, {**m, "corpus_source": source, "mb": a.mb}, describe(m))


if __name__ == "__main__":
    main()
