"""``llmc``: llm.c's ``write_datafile`` layout, read by llm.c and modded-nanogpt.

256 little-endian int32 (magic, version, token count, then zeros) followed by the tokens.
GPT-2-sized vocabularies: magic 20240520, version 1, uint16, read unchanged by llm.c's C loader
and modded-nanogpt's ``_load_data_shard``. Larger ones: llm.c's llama-3 variant, magic 20240801,
version 7, uint32, which only llm.c's ``train_llama3.py`` reads (the C loader says "Bad magic",
modded-nanogpt asserts the magic). Shard names follow llm.c's ``fineweb.py``: one running
number, validation shards first.
"""
from __future__ import annotations

import numpy as np

from ...errors import UserError
from ..layout import Literal, OutFile, Streams, TokenRun
from .base import Format, Plan, shard_notes, shard_sizes

HEADER_INTS = 256
GPT2 = (20240520, 1, "<u2")
LLAMA3 = (20240801, 7, "<u4")
MAX_TOKENS = 2**31 - 1
"""The header stores the token count in an int32."""
LLAMA3_READERS = ("llm.c's llama-3 layout (magic 20240801, version 7, uint32 tokens) for this {n_vocab:,}-token "
                  "vocabulary: llm.c's train_llama3.py reads it; llm.c's C dataloader (train_gpt2.c/.cu) and "
                  "modded-nanogpt read only the GPT-2 layout (magic 20240520, uint16) and reject these files")
"""What a llama-3 layout export says, so nobody finds out from a trainer's "Bad magic"."""


def header(*, magic: int, version: int, tokens: int) -> bytes:
    head = np.zeros(HEADER_INTS, dtype="<i4")
    head[:3] = magic, version, tokens
    return head.tobytes()


def sharded_files(streams: Streams, plan: Plan, *, suffix: str, head, limit: int | None = None) -> list[OutFile]:
    """llm.c's ``fineweb.py`` naming, shared with ``npy``: ``PREFIX_SPLIT_NNNNNN.SUFFIX``, one
    running number, validation first; ``head(count)`` is each shard's header."""
    files = []
    number = 0
    for split in ("val", "train"):
        first = 0
        for count in shard_sizes(streams.tokens(split), shard_tokens=plan.shard_tokens,
                                 min_shard_tokens=plan.min_shard_tokens):
            if limit is not None and count > limit:
                raise UserError(f"the last {split} shard would hold {count:,} tokens, over llm.c's limit of "
                                f"{limit:,} (an int32 in its header); pass a smaller --min-shard-tokens")
            files.append(OutFile(name=f"{plan.prefix}_{split}_{number:06d}.{suffix}", split=split, tokens=count,
                                 regions=(Literal(head(count)), TokenRun(split, first, count, plan.dtype))))
            number += 1
            first += count
    return files


class Llmc(Format):
    name = "llmc"
    reader = "llm.c, modded-nanogpt"
    help = ("llm.c .bin shards (GPT-2 layout, also read by modded-nanogpt; vocabularies over 65,536 ids get "
            "llm.c's llama-3 layout, which only llm.c's train_llama3.py reads)")
    card = ("llm.c `.bin` shards: a 256 × int32 header (magic, version, token count), then the tokens; "
            "read by llm.c and modded-nanogpt")
    sharded = True

    def check(self, config) -> None:
        if config.shard_tokens is not None and config.shard_tokens > MAX_TOKENS:
            raise UserError(f"--shard-tokens {config.shard_tokens:,} is over llm.c's limit of {MAX_TOKENS:,} "
                            "(its header stores the count in an int32)")

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        magic, version, _ = LLAMA3 if plan.dtype == LLAMA3[2] else GPT2
        return sharded_files(streams, plan, suffix="bin", limit=MAX_TOKENS,
                             head=lambda count: header(magic=magic, version=version, tokens=count))

    def patterns(self, prefix: str) -> list[str]:
        return [f"{prefix}_val_*.bin", f"{prefix}_train_*.bin"]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        notes = shard_notes(files, shard_tokens=plan.shard_tokens, min_shard_tokens=plan.min_shard_tokens)
        if plan.dtype == LLAMA3[2]:
            notes.append("note: " + LLAMA3_READERS.format(n_vocab=plan.n_vocab))
        return notes


FORMAT = Llmc()
