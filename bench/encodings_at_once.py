#!/usr/bin/env python3
"""Several encodings at once against one run per encoding (issue 25, part 2).

    python bench/encodings_at_once.py [--mb 50] [--encodings gpt2 cl100k_base] [--repeats 3] [--workers N]
    python bench/encodings_at_once.py --corpus 'DIR/*.parquet' ...      # an existing corpus instead

Each repeat runs, interleaved, one whole ``tokenshards tokenize --encoding A --encoding B ...
--out ...`` command and then one command per encoding; we report the medians of the combined
command's wall time and of the separate commands' summed wall time, and their ratio (below 1:
the combined run saves the repeated reads, decodes and start-ups), and the same for the CPU time
of each command's whole process tree (steadier on a machine others share). The first repeat also checks
that every OUT of the combined run holds the same bytes as its separate run. The corpus is
../shared/bench/make_corpus.py's (``--mb`` of text) when it can be built, else the demo corpus.

``measure(...)`` is what ``bench/run.py`` calls (its encodings case); writes bench/results-encodings.json.
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = HERE.parent.parent / "shared" / "bench"
TOKENSHARDS = [sys.executable, "-m", "tokenshards"]


def corpus_of(mb: float, dest: Path) -> str:
    """An input glob of about ``mb`` MB of text: make_corpus.py's, else the demo corpus."""
    folder = dest / f"{mb:g}mb"
    if not any(folder.rglob("*.parquet")):
        maker = SHARED / "make_corpus.py"
        built = maker.exists() and subprocess.run([sys.executable, str(maker), str(folder), "--mb", str(mb),
                                                   "--no-token-count"], capture_output=True).returncode == 0
        if not built:
            print("make_corpus.py unavailable: using the demo corpus (~2 MB)", file=sys.stderr)
            subprocess.run([*TOKENSHARDS, "demo-corpus", "--to", str(folder)], check=True, capture_output=True)
    first = next(iter(sorted(folder.rglob("*.parquet"))))
    return str(first.parent / "*.parquet")


def _command(corpus: str, pairs: list[tuple[str, Path]], workers: int) -> list[str]:
    cmd = [*TOKENSHARDS, "tokenize", "--input", corpus, "--workers", str(workers), "--progress", "none",
           "--dashboard-address", ":0"]
    for encoding, _ in pairs:
        cmd += ["--encoding", encoding]
    for _, out in pairs:
        cmd += ["--out", str(out)]
    return cmd


def _timed(cmd: list[str]) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds of the whole process tree, stdout) of one whole command. The
    tree's CPU time (client, forkserver, workers: sampled every 50 ms, so a process's last few ms
    may be missed) moves far less with other users' load on a shared machine than wall time does."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen: dict[int, float] = {}
    done = threading.Event()

    def sample() -> None:
        root = psutil.Process(proc.pid)
        while not done.wait(0.05):
            try:
                tree = [root, *root.children(recursive=True)]
            except psutil.Error:
                continue
            for p in tree:
                try:
                    times = p.cpu_times()
                    seen[p.pid] = max(seen.get(p.pid, 0.0), times.user + times.system)
                except psutil.Error:
                    pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    stdout, stderr = proc.communicate()
    seconds = time.perf_counter() - t0
    done.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{stderr}")
    return seconds, sum(seen.values()), stdout


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    if names != sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def measure(corpus: str, encodings: list[str], *, workers: int, repeats: int, scratch: Path) -> dict:
    """Medians of the combined command and of the separate commands' sum, interleaved: wall time and
    the process tree's CPU time."""
    together, separate, together_cpu, separate_cpu = [], [], [], []
    tokens: dict[str, int] = {}
    identical = None
    for r in range(repeats):
        combined = [(e, scratch / f"together-{n}") for n, e in enumerate(encodings)]
        alone = [(e, scratch / f"alone-{n}") for n, e in enumerate(encodings)]
        for _, out in combined + alone:
            shutil.rmtree(out, ignore_errors=True)
        seconds, cpu, said = _timed(_command(corpus, combined, workers))
        together.append(seconds)
        together_cpu.append(cpu)
        found = re.findall(r"done(?: \((.+?)\))?: [\d,]+ documents, ([\d,]+) tokens", said)
        tokens = {e or encodings[0]: int(n.replace(",", "")) for e, n in found}
        each = [_timed(_command(corpus, [pair], workers)) for pair in alone]
        separate.append(sum(seconds for seconds, _, _ in each))
        separate_cpu.append(sum(cpu for _, cpu, _ in each))
        if r == 0:
            identical = all(_same_files(c, a) for (_, c), (_, a) in zip(combined, alone))
    result = {"encodings": encodings, "workers": workers, "repeats": repeats, "corpus": corpus,
              "together_seconds": statistics.median(together), "separate_seconds": statistics.median(separate),
              "together_runs": together, "separate_runs": separate, "tokens": tokens,
              "together_cpu_seconds": statistics.median(together_cpu),
              "separate_cpu_seconds": statistics.median(separate_cpu),
              "together_cpu_runs": together_cpu, "separate_cpu_runs": separate_cpu,
              "outputs_identical_to_separate_runs": identical}
    result["ratio"] = result["together_seconds"] / result["separate_seconds"]
    result["cpu_ratio"] = result["together_cpu_seconds"] / result["separate_cpu_seconds"]
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--corpus", help="input glob (default: build --mb of text in bench/corpus)")
    ap.add_argument("--mb", type=float, default=50, help="text in the built corpus (default 50 MB)")
    ap.add_argument("--corpus-dir", type=Path, default=HERE / "corpus")
    ap.add_argument("--encodings", nargs="+", default=["gpt2", "cl100k_base"],
                    help="tiktoken names or train-bpe FILE.tiktoken (default gpt2 cl100k_base)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--out", type=Path, default=HERE / "results-encodings.json")
    a = ap.parse_args()
    corpus = a.corpus or corpus_of(a.mb, a.corpus_dir)
    with tempfile.TemporaryDirectory(prefix="tokenshards-bench-encodings-") as tmp:
        result = measure(corpus, a.encodings, workers=a.workers, repeats=a.repeats, scratch=Path(tmp))
    a.out.write_text(json.dumps(result, indent=1) + "\n")
    n = len(a.encodings)
    print(f"{n} encodings ({', '.join(a.encodings)}) at once: {result['together_seconds']:.2f} s; "
          f"{n} separate runs: {result['separate_seconds']:.2f} s; ratio {result['ratio']:.2f}; CPU of the process "
          f"trees {result['together_cpu_seconds']:.1f} s vs {result['separate_cpu_seconds']:.1f} s, ratio "
          f"{result['cpu_ratio']:.2f} (medians of {a.repeats}, interleaved; outputs identical: "
          f"{result['outputs_identical_to_separate_runs']})")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
