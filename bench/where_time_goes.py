#!/usr/bin/env python3
"""Where the CPU goes: a worker's task alone, split by step; or a whole command, by process and thread.

    python bench/where_time_goes.py 'DIR/*.parquet' [--partition-mb 8.4] [--mb 200] [--backend gigatoken] [--encoding gpt2]
    python bench/where_time_goes.py 'DIR/*.parquet' --whole [--encoding ENC] [--workers 2] [--rate 100] [--top 12]

The first form runs ``tokenize.task.tokenize_partition`` itself over real partitions, in one
process, no Dask, under a CPU-time profiler (the partitions are large, so a profiler's per-call
overhead is small against them); each step is the CPU of the functions that do it, so a change in
the task shows up here without editing this script. Prints each step's share and the task's rate
in tokens per CPU second. ``--encoding`` takes any tokenizer ``--encoding`` does.

``--whole`` runs the whole ``tokenize`` command (a local cluster) and says where all of its CPU
goes: per process and thread, exactly, from /proc (``harness.run_metered``: the client and the
scheduler's event loop in it, the forkserver, the workers' event loops and task threads), and
within each, py-spy's samples of it (in the test extra, which `make` installs; attached to the command and its
children, ``--nonblocking``), the top functions by own and by cumulative samples. Threads waiting
(select, a lock, a queue, a pipe) are left out of the samples.
"""
from __future__ import annotations

import argparse
import cProfile
import glob
import os
import re
import pstats
import shutil
import tempfile
import time
from pathlib import Path

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
    ap.add_argument("--encoding", default="gpt2", help="any tokenizer --encoding takes (default gpt2)")
    ap.add_argument("--whole", action="store_true", help="the whole tokenize command, by process and thread")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--rate", type=int, default=100, help="--whole: py-spy's samples per second")
    ap.add_argument("--top", type=int, default=12, help="--whole: functions shown per process and thread")
    a = ap.parse_args()
    if a.whole:
        return whole(a)

    from tokenshards.encoding import registry
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
    loaded = registry.load(a.encoding)
    choice = loaded.choose(a.backend)
    backend = loaded.build(choice.name, verified=choice.verified)
    out = tempfile.mkdtemp(prefix="where-time-goes-")
    settings = TaskSettings(out=out, storage_options={}, encoder=None, dtype=loaded.dtype, boundaries=loaded.natural,
                            job="bench", backend=choice.name)
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


WAITING = ("select (selectors.py", "_recv (multiprocessing/connection.py", "wait (threading.py", "get (queue.py",
           "_worker (concurrent/futures/thread.py", "acquire", "poll (selectors.py", "sleep")
"""A sample whose innermost frame is one of these is a thread waiting: py-spy's own idle test
(the thread's state in /proc) counts some of them as running."""
PROCESS = re.compile(r'process (\d+):"(.*?)";(?=process |thread )')


def spy_roles(raw: Path) -> dict[str, dict]:
    """py-spy's raw samples (``--subprocesses --threads``) by process role and thread: {role: {"samples",
    "self": Counter, "cumulative": Counter}}. Roles: client (the command; its scheduler runs on its
    "IO loop" thread), forkserver, worker (a process forked from it); threads by name."""
    import collections

    roles: dict[str, dict] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        pos, chain = 0, []
        while (m := PROCESS.match(stack, pos)) is not None:
            chain.append(m[2])
            pos = m.end()
        frames = stack[pos:].split(";")
        thread = re.sub(r"^thread \(\d+\):? ?", "", frames[0]) if frames and frames[0].startswith("thread") else ""
        frames = frames[1:] if thread or (frames and frames[0].startswith("thread")) else frames
        if not frames or any(w in frames[-1] for w in WAITING):
            continue
        depth = len(chain) or 1
        role = "client" if depth == 1 else "forkserver" if depth == 2 and "forkserver" in chain[-1] else "worker"
        thread = re.sub(r"[-_]?\d+", "", thread) or "MainThread"
        entry = roles.setdefault(f"{role} / {thread}", {"samples": 0, "self": collections.Counter(),
                                                        "cumulative": collections.Counter()})
        n = int(count)
        entry["samples"] += n
        entry["self"][frames[-1]] += n
        for frame in set(frames):
            entry["cumulative"][frame] += n
    return roles


def whole(a) -> None:
    """The whole command under /proc's CPU accounting and py-spy, by process and thread."""
    import subprocess

    from harness import BIN, PeakTreeRSS

    spy = shutil.which("py-spy") or str(BIN / "py-spy")
    if not os.path.exists(spy):
        raise SystemExit("--whole needs py-spy: make install (the test extra has it), or pip install py-spy into this venv")
    files = sorted(glob.glob(a.pattern))
    folder = os.path.dirname(files[0]) if files else a.pattern
    out = tempfile.mkdtemp(prefix="where-time-goes-")
    raw = Path(out) / "py-spy.txt"
    cmd = [str(BIN / "tokenshards"), "tokenize", "--input", folder, "--out", str(Path(out) / "run"), "--workers",
           str(a.workers), "--encoding", a.encoding, "--partition-mb", f"{a.partition_mb:g}", "--progress", "none",
           "--dashboard-address", ":0"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    meter = PeakTreeRSS(proc.pid)
    sampler = subprocess.Popen([spy, "record", "--pid", str(proc.pid), "--subprocesses", "--threads", "--nonblocking",
                                "--format", "raw", "--rate", str(a.rate), "-o", str(raw)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stdout, stderr = proc.communicate()
    meter.stop()
    sampler.wait(60)
    if proc.returncode:
        raise SystemExit(f"tokenize failed:\n{stderr}")
    roles = spy_roles(raw) if raw.exists() else {}
    shutil.rmtree(out, ignore_errors=True)
    by_role, threads = meter.by_role(), meter.worker_threads()
    total = sum(meter.cpu.values())
    print(stdout.strip().splitlines()[1].strip())
    print(f"CPU seconds (/proc), {total:.2f} in all: " + ", ".join(f"{k} {v:.2f}" for k, v in sorted(by_role.items()))
          + f"; the workers' event loops {threads['event_loop']:.2f}, task threads {threads['task_thread']:.2f}, "
          f"other threads {threads['other_threads']:.2f}")
    samples = sum(r["samples"] for r in roles.values()) or 1
    for name, r in sorted(roles.items(), key=lambda kv: -kv[1]["samples"]):
        if r["samples"] < 0.01 * samples:
            continue
        print(f"\n{name}: {100 * r['samples'] / samples:.1f}% of the samples")
        print("  own:        " + "\n              ".join(f"{100 * n / r['samples']:5.1f}% {f}" for f, n in r["self"].most_common(a.top)))
        near = [(f, n) for f, n in r["cumulative"].most_common() if n < 0.95 * r["samples"]][:a.top]
        print("  cumulative: " + "\n              ".join(f"{100 * n / r['samples']:5.1f}% {f}" for f, n in near))


if __name__ == "__main__":
    main()
