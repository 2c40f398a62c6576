#!/usr/bin/env python3
"""Candidate fast BPEs against tiktoken: exactness on held-out awkward text, then speed.

    python bench/backends.py 'CORPUS/*.parquet' [--docs 3000] [--mb 30] [--repeats 3] [--threads 2]

Exactness: every candidate installed here must reproduce tiktoken's ``encode_ordinary`` on
``verification_texts()``, on special-token strings embedded in text (they must stay ordinary),
and on ``--docs`` documents of the corpus picked by a fixed stride. Each is built the way a
backend would be, from tiktoken's own ranks and pattern, with no special tokens, except
bpe-openai, which ships its own cl100k/o200k tables (so it is checked on cl100k).
Speed: one thread, interleaved, median of ``--repeats``, tokens/s over ``--mb`` of corpus text;
then one process with ``--threads`` Rust threads against ``--threads`` single-thread processes.
Candidates that are not installed are skipped (``pip install gigatoken bpe-openai tokendagger``
in a scratch venv: none of them is a dependency of tokenshards).
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from tokenshards.encoding.backends import SplintrBackend, verification_texts  # noqa: E402
from tokenshards.encoding.encoders import load_encoding  # noqa: E402
from tokenshards.encoding.ranks import dump_ranks  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|endofprompt|>"]
GIGATOKEN_PRETOKENIZER = {"gpt2": "gpt2", "r50k_base": "gpt2", "cl100k_base": "gpt4", "o200k_base": "o200k"}


def special_texts() -> list[str]:
    out = []
    for s in SPECIALS:
        out += [s, f"a{s}b", f" {s} ", f"{s}{s}", f"text\n{s}\nmore", s[:-1], f"<|{s}|>"]
    return out


def corpus_docs(pattern: str, n: int) -> list[str]:
    texts = [t for f in sorted(glob.glob(pattern)) for t in pq.read_table(f, columns=["text"]).column(0).to_pylist() if t]
    return texts[:: max(1, len(texts) // n)][:n]


def corpus_slice(pattern: str, mb: float) -> pa.ChunkedArray:
    """The first ``mb`` MB of text, as Arrow strings (some candidates take them without Python str)."""
    out, size = [], 0
    for f in sorted(glob.glob(pattern)):
        col = pq.read_table(f, columns=["text"]).column(0)
        for chunk in col.chunks:
            out.append(chunk)
            size += chunk.nbytes
            if size >= mb * 1e6:
                return pa.chunked_array(out)
    return pa.chunked_array(out)


def candidates(encoding_name: str) -> dict:
    """name -> builder() -> (encode_many(list[str]) -> flat uint32 array, version)."""
    import importlib.metadata as md

    loaded = load_encoding(encoding_name)
    params = loaded.params
    found = {}

    def splintr_():
        b = SplintrBackend(params)
        return lambda texts: b.encode_many(texts)[0]

    found["splintr"] = (splintr_, md.version("splintr-rs"))

    def tiktoken_():
        enc = loaded.encoding
        return lambda texts: np.fromiter((i for t in texts for i in enc.encode_ordinary(t)), dtype=np.uint32)

    found["tiktoken"] = (tiktoken_, md.version("tiktoken"))
    try:
        import gigatoken

        def gigatoken_(parallel=False):
            with tempfile.NamedTemporaryFile(suffix=".tiktoken", delete=False) as f:
                f.write(dump_ranks(params.mergeable_ranks))
            tok = gigatoken.Tokenizer.from_tiktoken(f.name, pretokenizer=GIGATOKEN_PRETOKENIZER[encoding_name],
                                                    special_tokens={})
            os.unlink(f.name)

            def encode(texts):
                layout = tok.encode_batch(texts, parallel=parallel).layout  # one flat buffer + offsets
                return np.asarray(layout.content.data)[layout.offsets[0]:layout.offsets[-1]]
            return encode

        found["gigatoken"] = (gigatoken_, md.version("gigatoken"))
    except ImportError:
        pass
    try:
        import tokendagger

        def tokendagger_():
            tok = tokendagger.Encoding(encoding_name, pat_str=params.pat_str, mergeable_ranks=params.mergeable_ranks,
                                       special_tokens={})
            core = tok._core_bpe
            return lambda texts: np.fromiter((i for t in texts for i in core.encode_ordinary(t)), dtype=np.uint32)

        found["tokendagger"] = (tokendagger_, md.version("tokendagger"))
    except ImportError:
        pass
    if encoding_name in ("cl100k_base", "o200k_base"):
        try:
            import bpe_openai

            def bpe_openai_():
                enc = bpe_openai.get_encoding(encoding_name)
                core = enc._backend
                return lambda texts: np.fromiter((i for t in texts for i in core.encode(t)), dtype=np.uint32)

            found["bpe-openai"] = (bpe_openai_, md.version("bpe-openai"))
        except ImportError:
            pass
    return found, loaded


def check_exact(encoding_name: str, docs: list[str]) -> dict:
    found, loaded = candidates(encoding_name)
    enc = loaded.encoding
    groups = {"verification_texts": verification_texts(), "special_token_strings": special_texts(), "corpus_docs": docs}
    result = {}
    for name, (build, version) in found.items():
        if name == "tiktoken":
            continue
        try:
            encode = build()
        except Exception as e:
            result[name] = {"version": version, "error": f"build: {type(e).__name__}: {e}"}
            continue
        report = {"version": version}
        for group, texts in groups.items():
            bad, errors = 0, []
            for t in texts:
                want = np.asarray(enc.encode_ordinary(t), dtype=np.uint32)
                try:
                    got = encode([t])
                except Exception as e:
                    bad += 1
                    errors.append(f"{type(e).__name__}: {str(e)[:80]} on {t[:30]!r}")
                    continue
                if not np.array_equal(got, want):
                    bad += 1
                    errors.append(f"differs on {t[:30]!r}")
            report[group] = {"texts": len(texts), "differ": bad, "examples": errors[:3]}
        result[name] = report
    return result


_DATA: dict = {}
"""Set before a pool forks: the children read the texts from here instead of a pickled copy."""


def _arrow_as_awkward(column: pa.Array):
    """An Arrow string array as an awkward array over the same bytes (gigatoken reads its flat
    buffers directly: no Python str per document)."""
    import awkward as ak

    bufs = column.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int32, count=len(column) + 1, offset=column.offset * 4).astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8)
    return ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets),
                                                ak.contents.NumpyArray(data, parameters={"__array__": "char"}),
                                                parameters={"__array__": "string"}))


def _time_one(args):
    """tokens, wall seconds, CPU seconds, RSS growth: one pass over texts this process never saw."""
    import resource

    encoding_name, name, part, parts, kwargs = args
    column = _DATA["column"]
    if parts > 1:
        column = column.slice(part * len(column) // parts, len(column) // parts)
    found, _ = candidates(encoding_name)
    encode = found[name.removesuffix("+arrow")][0](**kwargs)
    encode(["warm up"])
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0, c0 = time.perf_counter(), time.process_time()
    if name.endswith("+arrow"):
        n = len(encode(_arrow_as_awkward(column)))
    else:
        n = len(encode(column.to_pylist()))  # Arrow -> str included: the job pays it too
    return n, time.perf_counter() - t0, time.process_time() - c0, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024


def speed(encoding_name: str, column: pa.Array, names: list[str], repeats: int) -> dict:
    """One thread each, a fresh process per run (no cache warmed by an earlier pass), interleaved."""
    _DATA["column"] = column
    runs = {n: [] for n in names}
    ctx = mp.get_context("fork")
    for _ in range(repeats):
        for n in names:
            with ctx.Pool(1) as pool:
                tokens, wall, cpu, rss = pool.apply(_time_one, ((encoding_name, n, 0, 1, {}),))
            runs[n].append({"tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu, "cpu_per_wall": cpu / wall,
                            "rss_growth": rss})
    return {n: {k: statistics.median(r[k] for r in v) for k in v[0]} for n, v in runs.items()}


def threads_vs_procs(encoding_name: str, column: pa.Array, threads: int, repeats: int) -> dict:
    """gigatoken's rayon batch (GIL released) in one process vs ``threads`` single-thread processes."""
    _DATA["column"] = column
    out = {"one_process_threads": [], "processes": []}
    for _ in range(repeats):
        os.environ["RAYON_NUM_THREADS"] = str(threads)
        with mp.get_context("fork").Pool(1) as pool:  # rayon's pool is built in the child, after the fork
            tokens, wall, _, _ = pool.apply(_time_one, ((encoding_name, "gigatoken+arrow", 0, 1, {"parallel": True}),))
        out["one_process_threads"].append(tokens / wall)
        with mp.get_context("fork").Pool(threads) as pool:
            res = pool.map(_time_one, [(encoding_name, "gigatoken+arrow", i, threads, {"parallel": False})
                                       for i in range(threads)])
        out["processes"].append(sum(r[0] for r in res) / max(r[1] for r in res))
    return {k: statistics.median(v) for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pattern")
    ap.add_argument("--docs", type=int, default=3000)
    ap.add_argument("--mb", type=float, default=30)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-speed", action="store_true")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()
    docs = corpus_docs(a.pattern, a.docs)
    results = {"exactness": {e: check_exact(e, docs) for e in ("gpt2", "cl100k_base")}}
    for e, by in results["exactness"].items():
        for name, r in by.items():
            groups = ", ".join(f"{g} {v['differ']}/{v['texts']} differ" + (f" {v['examples']}" if v["examples"] else "")
                               for g, v in r.items() if isinstance(v, dict))
            print(f"{e} {name} {r['version']}: {r.get('error') or groups}", flush=True)
    if not a.skip_speed:
        column = corpus_slice(a.pattern, a.mb)
        column = column.filter(pa.compute.greater(pa.compute.binary_length(column), 0)).combine_chunks()
        for e in ("gpt2", "cl100k_base"):
            names = [n for n in candidates(e)[0]] + (["gigatoken+arrow"] if "gigatoken" in candidates(e)[0] else [])
            results[f"speed_{e}"] = speed(e, column, names, a.repeats)
            for k, v in results[f"speed_{e}"].items():
                print(f"{e} {k}: {v['tokens_per_s'] / 1e6:.2f} M tok/s ({v['tokens_per_cpu_s'] / 1e6:.2f} per CPU-s), CPU/wall {v['cpu_per_wall']:.2f}, "
                      f"RSS +{v['rss_growth'] / 1e6:.0f} MB", flush=True)
        if "gigatoken" in candidates("gpt2")[0]:
            results["threads_vs_processes_gpt2"] = threads_vs_procs("gpt2", column, a.threads, a.repeats)
            print("gigatoken gpt2", {k: f"{v / 1e6:.2f} M tok/s" for k, v in results["threads_vs_processes_gpt2"].items()})
    if a.json:
        a.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
