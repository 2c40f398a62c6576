#!/usr/bin/env python3
"""A fast ceiling for a backend that ../shared/bench/raw_limit.py has no loop for (gigatoken).

    python bench/fast_ceiling.py 'DIR/*.parquet' [--procs N] [--encoding gpt2] [--backend gigatoken]

raw_limit.py's method, unchanged: texts are read and split before timing starts; each of N
processes times only its bare encoding of 1/N of the texts, here gigatoken's own batch call
(``encode_batch(texts, parallel=False)``: one thread, one flat id buffer back), built from
tiktoken's ranks with gigatoken's pretokenizer for the pattern and no special tokens. Prints
raw_limit.py's line: `limit procs=.. tokens=.. seconds=.. tokens_per_s=..` (eot counted per text,
as there), seconds being the slowest process's time.
"""
import argparse
import glob
import multiprocessing as mp
import os
import tempfile
import time

import pyarrow.parquet as pq

PRETOKENIZER = {"gpt2": "gpt2", "r50k_base": "gpt2", "cl100k_base": "gpt4"}


def work(args):
    name, texts, backend = args
    import base64

    import gigatoken
    import tiktoken

    enc = tiktoken.get_encoding(name)
    with tempfile.NamedTemporaryFile(suffix=".tiktoken") as f:
        f.write(b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in sorted(enc._mergeable_ranks.items(), key=lambda kv: kv[1])))
        f.flush()
        tok = gigatoken.Tokenizer.from_tiktoken(f.name, pretokenizer=PRETOKENIZER[name], special_tokens={})
    tok.encode_batch(["warm up"], parallel=False)
    t0 = time.perf_counter()
    layout = tok.encode_batch(texts, parallel=False).layout
    n = int(layout.offsets[-1] - layout.offsets[0]) + len(texts)
    return n, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("pattern")
    ap.add_argument("--procs", type=int, default=os.cpu_count())
    ap.add_argument("--encoding", default="gpt2")
    ap.add_argument("--backend", default="gigatoken", choices=["gigatoken"])
    a = ap.parse_args()
    texts = [t for f in sorted(glob.glob(a.pattern)) for t in pq.read_table(f, columns=["text"]).column(0).to_pylist() if t]
    chunks = [texts[i::a.procs] for i in range(a.procs)]
    ctx = mp.get_context("fork")
    with ctx.Pool(a.procs) as pool:
        res = pool.map(work, [(a.encoding, c, a.backend) for c in chunks])
    toks = sum(r[0] for r in res)
    secs = max(r[1] for r in res)
    print(f"limit procs={a.procs} tokens={toks} seconds={secs:.3f} tokens_per_s={toks / secs:.0f}")


if __name__ == "__main__":
    main()
