#!/usr/bin/env python3
"""train-bpe against Hugging Face ``tokenizers``' BPE trainer: same text, same vocab size.

    python bench/bpe_vs_tokenizers.py                          # the demo corpus (CPython's docs)
    python bench/bpe_vs_tokenizers.py --input 'DIR/**/*.parquet' --vocab-size 32768 --workers 2

Both train on the same documents: every row except each file's every 100th (row % 100 == 99),
which both are then measured on (UTF-8 bytes per token). ``tokenizers`` gets GPT-2's byte-level
pre-tokenizer (the same split as our ``--pattern gpt2``), ``<|endoftext|>`` as its one special
token and the 256-byte initial alphabet, so both vocabularies hold the same kinds of tokens.
Ours runs the real job (LocalCluster counting, client merging with ``--merger auto``: gigatoken's
Rust trainer on the counts when installed); its cluster start-up is shown apart. The same counts are
then merged in this process by both mergers (gigatoken and the Python loop), and the merges compared
with BpeTrainer's. Wall time and CPU time of this process are both shown: the machine may be shared.
Needs the ``test`` extra (``tokenizers``, ``gigatoken``). Not run by the tests.
"""
from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import tiktoken

HOLDOUT_EVERY = 100


def read_split(pattern: str, *, text_column: str = "text") -> tuple[list[str], list[str]]:
    """(training texts, held-back texts) by the rule train-bpe uses: row % 100 == 99 is held back."""
    train, heldout = [], []
    for path in sorted(glob.glob(pattern, recursive=True)):
        for row, text in enumerate(pq.read_table(path, columns=[text_column]).column(0).to_pylist()):
            if text:
                (heldout if row % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).append(text)
    return train, heldout


def train_tokenizers(texts: list[str], *, vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def _from_byte_level(token: str) -> bytes:
    """A token of a byte-level ``tokenizers`` vocabulary (GPT-2's byte-to-character table) as bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    byte_of = {chr(b): b for b in printable}
    byte_of |= {chr(256 + i): b for i, b in enumerate(b for b in range(256) if b not in printable)}
    return bytes(byte_of[c] for c in token)


SEPARATOR = b"\x1e"
"""Between documents for gigatoken's trainer (ASCII record separator; no held-back text uses it)."""


def train_gigatoken(texts: list[str], *, vocab_size: int) -> dict[bytes, int]:
    """gigatoken's own ``train_bpe`` (Rust, its own pretokenizer and counting, all cores): its
    mergeable ranks (special tokens left out), for tiktoken to measure compression with."""
    import gigatoken

    from tokenshards.bpe.gigamerge import _quiet

    with _quiet():  # its progress lines
        vocab, _merges = gigatoken.train_bpe(SEPARATOR.join(t.encode() for t in texts), vocab_size, ["<|endoftext|>"],
                                             separator=SEPARATOR)
    return {token: rank for rank, token in vocab.items() if token != b"<|endoftext|>"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--input", help="parquet glob (default: the demo corpus, built in a temporary folder)")
    ap.add_argument("--vocab-size", type=int, default=32768)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--merger", default="auto", choices=["auto", "gigatoken", "python"], help="train-bpe's --merger")
    args = ap.parse_args()

    from distributed import LocalCluster

    from tokenshards.bpe import gigamerge
    from tokenshards.bpe.count import PATTERNS, count_texts
    from tokenshards.bpe.merge import train_merges
    from tokenshards.bpe.train import TrainBpeConfig, run_train_bpe
    from tokenshards.demo import build_demo_corpus
    from tokenshards.encoding.encoders import load_encoding

    with tempfile.TemporaryDirectory() as tmp:
        pattern = args.input
        if pattern is None:
            build_demo_corpus(Path(tmp) / "demo")
            pattern = str(Path(tmp) / "demo" / "*.parquet")
        train, heldout = read_split(pattern)
        train_bytes = sum(len(t.encode()) for t in train)
        heldout_bytes = sum(len(t.encode()) for t in heldout)
        print(f"text: {train_bytes / 1e6:.2f} MB in {len(train)} documents to train on, "
              f"{heldout_bytes / 1e6:.3f} MB in {len(heldout)} held back; vocab size {args.vocab_size}")

        t = time.perf_counter()
        with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address=":0",
                          silence_logs=logging.CRITICAL) as cluster:
            startup = time.perf_counter() - t
            out = str(Path(tmp) / "bench.tiktoken")
            config = TrainBpeConfig(inputs=(pattern,), out=out, vocab_size=args.vocab_size, scheduler=cluster.scheduler_address,
                                    progress="none", heldout_bytes=10**12, merger=args.merger)
            cpu, wall = time.process_time(), time.perf_counter()
            ours = run_train_bpe(config, announce=lambda msg: None)
            ours_wall, ours_cpu = time.perf_counter() - wall, time.process_time() - cpu
        enc = load_encoding(out).encoding
        ours_tokens = sum(len(enc.encode_ordinary(t)) for t in heldout)

        # The same steps in this one process, no cluster: CPU time that a busy machine distorts least.
        cpu = time.process_time()
        table = count_texts(train, pat_str=PATTERNS["gpt2"])
        count_cpu = time.process_time() - cpu
        cpu, wall = time.process_time(), time.perf_counter()
        fast = gigamerge.merge_counted(table, n_ranks=args.vocab_size - 1).result
        fast_cpu, fast_wall = time.process_time() - cpu, time.perf_counter() - wall
        cpu = time.process_time()
        words = zip(table.column("pretoken").to_pylist(), table.column("count").to_pylist())
        merged = train_merges(words, n_ranks=args.vocab_size - 1)
        loop_cpu = time.process_time() - cpu
        assert (fast if ours.merger.startswith("gigatoken") else merged).ranks == load_encoding(out).params.mergeable_ranks
        loop_tokens = sum(len(tiktoken.Encoding("loop", pat_str=PATTERNS["gpt2"], mergeable_ranks=merged.ranks,
                                                special_tokens={}).encode_ordinary(t)) for t in heldout)

        cpu, wall = time.process_time(), time.perf_counter()
        tok = train_tokenizers(train, vocab_size=args.vocab_size)
        hf_wall, hf_cpu = time.perf_counter() - wall, time.process_time() - cpu
        hf_tokens = sum(len(tok.encode(t).ids) for t in heldout)
        hf_merges = [m.split(" ") if isinstance(m, str) else m for m in json.loads(tok.to_str())["model"]["merges"]]
        hf_in_order = list(dict.fromkeys(_from_byte_level(a) + _from_byte_level(b) for a, b in hf_merges))
        same_as_hf = hf_in_order == sorted(fast.ranks, key=fast.ranks.get)[256:]
        assert all(tok.decode(tok.encode(t).ids) == t for t in heldout[:20])

        try:
            cpu, wall = time.process_time(), time.perf_counter()
            giga_ranks = train_gigatoken(train, vocab_size=args.vocab_size)
            giga_wall, giga_cpu = time.perf_counter() - wall, time.process_time() - cpu
            giga = tiktoken.Encoding("gigatoken-trained", pat_str=PATTERNS["gpt2"], mergeable_ranks=giga_ranks,
                                     special_tokens={})
            giga_tokens = sum(len(giga.encode_ordinary(t)) for t in heldout)
        except ImportError:
            giga_wall = None

    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"{'':24}{'wall s':>8}{'cpu s':>8}{'n_vocab':>9}{'bytes/token':>13}")
    print(f"{'tokenshards train-bpe':24}{ours_wall:8.2f}{ours_cpu:8.2f}{enc.n_vocab:9d}{heldout_bytes / ours_tokens:13.4f}"
          f"   (counting {ours.count_seconds:.2f} s on {args.workers} workers, merging {ours.merge_seconds:.2f} s "
          f"with {ours.merger}, checking+writing {ours.check_seconds:.2f} s; cluster start-up {startup:.2f} s not "
          f"included; cpu is the client's only)")
    print(f"{'  counting, one process':24}{'':8}{count_cpu:8.2f}   (one core, no cluster)")
    print(f"{'  merging: gigatoken':24}{fast_wall:8.2f}{fast_cpu:8.2f}{len(fast.ranks) + 1:9d}"
          f"{heldout_bytes / ours_tokens if ours.merger.startswith('gigatoken') else float('nan'):13.4f}"
          f"   (the same counts; its tokens in order {'==' if same_as_hf else '!='} BpeTrainer's)")
    print(f"{'  merging: Python loop':24}{'':8}{loop_cpu:8.2f}{len(merged.ranks) + 1:9d}{heldout_bytes / loop_tokens:13.4f}"
          "   (the same counts, one core)")
    print(f"{'tokenizers BpeTrainer':24}{hf_wall:8.2f}{hf_cpu:8.2f}{tok.get_vocab_size():9d}{heldout_bytes / hf_tokens:13.4f}")
    if giga_wall is not None:
        print(f"{'gigatoken train_bpe':24}{giga_wall:8.2f}{giga_cpu:8.2f}{len(giga_ranks) + 1:9d}"
              f"{heldout_bytes / giga_tokens:13.4f}   (its own pretokenizer and counting; compression measured "
              "through tiktoken with GPT-2's split)")
    print(f"ratio (ours / tokenizers): wall time {ours_wall / hf_wall:.2f}x, CPU of counting and merging in one "
          f"process vs tokenizers' CPU {(count_cpu + (fast_cpu if ours.merger.startswith('gigatoken') else loop_cpu)) / hf_cpu:.2f}x, compression "
          f"{(heldout_bytes / ours_tokens) / (heldout_bytes / hf_tokens):.4f}")


if __name__ == "__main__":
    main()
