#!/usr/bin/env python3
"""Where a worker's task spends its CPU: the task function over real partitions, in one process,
no Dask, split by step.

    python bench/where_time_goes.py 'DIR/*.parquet' [--partition-mb 8.4] [--mb 200] [--backend gigatoken]

The task is ``tokenize.task.tokenize_partition`` itself, run under a CPU-time profiler (the
partitions are large, so a profiler's per-call overhead is small against them); each step is the
CPU of the functions that do it, so a change in the task shows up here without editing this
script. Prints each step's share and the task's rate in tokens per CPU second.
"""
from __future__ import annotations

import argparse
import cProfile
import glob
import pstats
import shutil
import tempfile
import time

def steps() -> dict[str, list[tuple]]:
    """step: the functions whose cumulative CPU it adds up, each as (function, caller or None).
    Named as objects, not by text: a function renamed or moved stops this script at import
    instead of reporting 0% for its step (the writes read 0.0% for a while after ``task._commit``
    became ``begin_write`` + ``finish``)."""
    import pyarrow.parquet as pq

    from tokenshards.encoding import backends
    from tokenshards.format import v1
    from tokenshards.storage import store
    from tokenshards.corpus import read
    from tokenshards.tokenize import core, task

    return {
        "parquet decode": [(pq.ParquetFile.read_row_groups, None), (pq.ParquetFile.__init__, None)],
        "UTF-8 validation": [(read._null_invalid_utf8, None)],
        "spot check (tiktoken)": [(backends.CheckedBackend._check, None)],
        "tokenizer": [(backends.GigatokenBackend.encode_arrow, None), (backends.GigatokenBackend.encode_many, None),
                      (backends.SplintrBackend.encode_many, None), (backends.TiktokenBackend.encode_many, None)],
        "eot placement": [(core._assemble, None)],
        "file bytes + sha256": [(v1.npy_bytes, task.write_outputs), (v1.partition_files, None)],
        # The tokens file is begun, then finished by the task; the docs file and the done record
        # are written whole (``write_atomic``, whose own ``finish`` is inside its figure).
        "write + fsync + commit": [(store.begin_write, None), (store.write_atomic, None),
                                   (store._LocalWrite.finish, task.write_outputs)],
    }


def cumulative_cpu(stats: dict, function, caller=None) -> float:
    """The CPU ``function`` took, callees included (all calls, or only those from ``caller``)."""
    key = _key(function)
    if key not in stats:
        return 0.0  # not called in this run (another backend's, say)
    if caller is None:
        return stats[key][3]
    return stats[key][4].get(_key(caller), (0, 0, 0.0, 0.0))[3]


def _key(function) -> tuple:
    code = function.__code__
    return code.co_filename, code.co_firstlineno, code.co_name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pattern")
    ap.add_argument("--partition-mb", type=float, default=8.4)
    ap.add_argument("--mb", type=float, default=200, help="stop after this much text")
    ap.add_argument("--backend", default="gigatoken")
    ap.add_argument("--encoding", default="gpt2")
    a = ap.parse_args()

    from tokenshards.encoding.backends import build_backend, choose
    from tokenshards.encoding.encoders import load_encoding, token_dtype
    from tokenshards.corpus.plan import plan_pieces, read_input_metadata
    from tokenshards.tokenize.task import TaskSettings, tokenize_partition

    files = [read_input_metadata(p, p.rsplit("/", 1)[-1], text_column="text", id_column=None)
             for p in sorted(glob.glob(a.pattern))]
    pieces, total = [], 0
    for piece in plan_pieces(files, target_bytes=int(a.partition_mb * 1e6)):
        if total >= a.mb * 1e6:
            break
        pieces.append(piece)
        total += piece.text_bytes
    loaded = load_encoding(a.encoding)
    choice = choose(a.backend, loaded.encoding, loaded.params)
    backend = build_backend(choice.name, loaded.encoding, loaded.params, verified=choice.verified)
    out = tempfile.mkdtemp(prefix="where-time-goes-")
    settings = TaskSettings(out=out, storage_options={}, encoder=None, dtype=token_dtype(loaded.spec.n_vocab),
                            eot_position="prefix", job="bench", backend=choice.name)
    tokenize_partition(pieces[0], settings=settings, backend=backend)  # warm: imports, first allocations
    profile = cProfile.Profile(time.process_time)
    started = time.process_time()
    profile.enable()
    tokens = sum(tokenize_partition(p, settings=settings, backend=backend).tokens for p in pieces)
    profile.disable()
    cpu = time.process_time() - started
    shutil.rmtree(out, ignore_errors=True)

    stats = pstats.Stats(profile).stats
    shares = {step: sum(cumulative_cpu(stats, function, caller) for function, caller in wanted)
              for step, wanted in steps().items()}
    print(f"{len(pieces)} partitions, {total / 1e6:.0f} MB of text, {tokens / 1e6:.1f} M tokens, "
          f"{tokens / cpu / 1e6:.1f} M tokens per CPU second ({choice.name})")
    for step, seconds in sorted(shares.items(), key=lambda kv: -kv[1]):
        print(f"  {step:24s} {100 * seconds / cpu:5.1f}%")
    print(f"  {'the rest':24s} {100 * (cpu - sum(shares.values())) / cpu:5.1f}%  (frames, ids, checks of the input)")


if __name__ == "__main__":
    main()
