#!/usr/bin/env python3
"""Several encodings at once against one run per encoding (issue 25, part 2).

    python bench/encodings.py [--mb 50] [--encodings gpt2 cl100k_base] [--repeats 3] [--workers N]
    python bench/encodings.py --corpus 'DIR/*.parquet' ...      # an existing corpus instead

Each repeat runs, interleaved, one whole ``tokenshards tokenize --encoding A --encoding B ...
--out ...`` command and then one command per encoding; we report the medians of the combined
command's wall time and of the separate commands' summed wall time, and their ratio (below 1:
the combined run saves the repeated reads, decodes and start-ups). The first repeat also checks
that every OUT of the combined run holds the same bytes as its separate run. The corpus is
../shared/bench/make_corpus.py's (``--mb`` of text) when it can be built, else the demo corpus.

``measure(...)`` is the function ``bench/run.py`` can call; writes bench/results-encodings.json.
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


def _timed(cmd: list[str]) -> tuple[float, str]:
    """(wall seconds, stdout) of one whole command."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stderr}")
    return seconds, proc.stdout


def _same_files(a: Path, b: Path) -> bool:
    names = sorted(str(p.relative_to(a)) for p in a.rglob("*") if p.is_file())
    if names != sorted(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file()):
        return False
    return all(filecmp.cmp(a / n, b / n, shallow=False) for n in names)


def measure(corpus: str, encodings: list[str], *, workers: int, repeats: int, scratch: Path) -> dict:
    """Medians of the combined command and of the separate commands' sum, interleaved."""
    together, separate = [], []
    tokens: dict[str, int] = {}
    identical = None
    for r in range(repeats):
        combined = [(e, scratch / f"together-{n}") for n, e in enumerate(encodings)]
        alone = [(e, scratch / f"alone-{n}") for n, e in enumerate(encodings)]
        for _, out in combined + alone:
            shutil.rmtree(out, ignore_errors=True)
        seconds, said = _timed(_command(corpus, combined, workers))
        together.append(seconds)
        found = re.findall(r"done(?: \((.+?)\))?: [\d,]+ documents, ([\d,]+) tokens", said)
        tokens = {e or encodings[0]: int(n.replace(",", "")) for e, n in found}
        separate.append(sum(_timed(_command(corpus, [pair], workers))[0] for pair in alone))
        if r == 0:
            identical = all(_same_files(c, a) for (_, c), (_, a) in zip(combined, alone))
    result = {"encodings": encodings, "workers": workers, "repeats": repeats, "corpus": corpus,
              "together_seconds": statistics.median(together), "separate_seconds": statistics.median(separate),
              "together_runs": together, "separate_runs": separate, "tokens": tokens,
              "outputs_identical_to_separate_runs": identical}
    result["ratio"] = result["together_seconds"] / result["separate_seconds"]
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
          f"{n} separate runs: {result['separate_seconds']:.2f} s; ratio {result['ratio']:.2f} "
          f"(medians of {a.repeats}, interleaved; outputs identical: {result['outputs_identical_to_separate_runs']})")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
