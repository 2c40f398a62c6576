#!/usr/bin/env python3
"""Before and after a change: our whole tokenize command with this checkout's ``lib/`` against
another's, interleaved, medians of CPU seconds by process (and wall time, for what it is worth on
a busy machine).

    git worktree add /tmp/before HEAD~1
    python bench/ab.py --before /tmp/before [--corpus DIR] [--mb 200] [--pairs 4] [--encoding gpt2] [-- EXTRA...]

Each pair runs both commands, the order alternating (a run here is slower right after another big
one). The ``before`` runs put ``DIR/lib`` first on PYTHONPATH, workers and forkserver included (the
venv's editable install of this checkout comes after it). CPU seconds are read from /proc for the
whole process tree (``harness.run_metered``): the client (with a LocalCluster's scheduler), the
forkserver, the workers, and the workers' event loops apart from their task threads. On a shared
2-core machine CPU time moves far less than wall time with what else runs; compare CPU here, and
re-measure wall time on a quiet machine. Prints a table of medians and spreads; ``--out FILE``
keeps every run as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from harness import HELD_OUT_SEED, HERE, build_corpus, run_ours

FIGURES = {
    "tree CPU s": lambda r: r["cpu_seconds"],
    "client CPU s": lambda r: r["cpu_by_role"].get("client", 0.0),
    "forkserver CPU s": lambda r: r["cpu_by_role"].get("forkserver", 0.0),
    "workers CPU s": lambda r: r["cpu_by_role"].get("workers", 0.0),
    "  event loops": lambda r: r["worker_threads_cpu"].get("event_loop", 0.0),
    "  task threads": lambda r: r["worker_threads_cpu"].get("task_thread", 0.0),
    "wall s": lambda r: r["seconds"],
    "phase s": lambda r: r["phase_seconds"],
}


def run(side: str, corpus: Path, before: Path, workers: int, scratch: Path, extra: tuple[str, ...]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(before / "lib")} if side == "before" else None
    r = run_ours(corpus, workers, "auto", scratch / side, extra=extra, env=env)
    r["load_1m_before"] = os.getloadavg()[0]
    return r


def summary(runs: dict[str, list[dict]]) -> list[str]:
    lines = [f"{'':18s} {'before':>16s} {'after':>16s} {'after/before':>12s}"]
    for name, get in FIGURES.items():
        b = [get(r) for r in runs["before"]]
        a = [get(r) for r in runs["after"]]
        mb, ma = statistics.median(b), statistics.median(a)
        spread = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"  # noqa: E731
        lines.append(f"{name:18s} {mb:7.2f} ({spread(b):>9s}) {ma:7.2f} ({spread(a):>9s}) "
                     f"{(ma / mb if mb else float('nan')):12.3f}")
    loads = sorted(r["load_1m_before"] for rs in runs.values() for r in rs)
    lines.append(f"1-minute load before the runs: {loads[0]:.1f}-{loads[-1]:.1f}; {len(runs['after'])} pairs, medians (min-max)")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True, help="a checkout (git worktree add DIR COMMIT) whose lib/ is 'before'")
    ap.add_argument("--corpus", type=Path, help="a folder of parquet files (default: the held-out corpus of --mb)")
    ap.add_argument("--mb", type=float, default=200)
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path)
    ap.add_argument("extra", nargs="*", help="more tokenize options, after --")
    a = ap.parse_args()
    if not (a.before / "lib" / "tokenshards").is_dir():
        raise SystemExit(f"--before {a.before}: no lib/tokenshards there")
    corpus = a.corpus or build_corpus(HERE / "corpus" / f"{a.mb:g}mb-all-seed{HELD_OUT_SEED}", a.mb)[0]
    runs: dict[str, list[dict]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="tokenshards-ab-") as tmp:
        for i in range(a.pairs):
            for side in (("before", "after") if i % 2 == 0 else ("after", "before")):
                runs[side].append(run(side, corpus, a.before, a.workers, Path(tmp), tuple(a.extra)))
                r = runs[side][-1]
                print(f"pair {i + 1}/{a.pairs} {side}: {r['cpu_seconds']:.2f} s CPU, {r['seconds']:.1f} s wall",
                      file=sys.stderr, flush=True)
    print("\n".join(summary(runs)))
    if a.out:
        a.out.write_text(json.dumps({"corpus": str(corpus), "before": str(a.before), "extra": a.extra, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
