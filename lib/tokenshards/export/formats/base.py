"""Pure: what one export format is, as the drivers (``export/command.py``, ``export/shuffle.py``) use it.

A format is one object: the files it writes for a split's stream (names and regions, see
``export/layout.py``: headers and index arrays included), the dtype it stores and what it refuses,
which of the shared options apply, and what its summary says. Both drivers take the files from
``Format.files`` and write them with the same writer, so a format never knows whether the
documents come in manifest order or shuffled.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import UserError
from ..layout import OutFile, Streams

DEFAULT_PREFIX = "fineweb"
"""llm.c's and modded-nanogpt's default globs (``fineweb_train_*.bin``) then match unchanged."""
MIN_SHARD_FRACTION = 100
"""Default --min-shard-tokens: 1% of --shard-tokens (1,000,000 of the default 100,000,000, more
than one step of 8 processes x B 64 x T 1024 in llm.c), so no shard is over 1.01x the size asked."""


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a format's files depend on besides the streams."""

    prefix: str
    dtype: str
    """What ``Format.dtype`` chose."""
    n_vocab: int
    encoding: str = ""
    """The run's encoding name (some formats record it)."""
    eot: int = -1
    eot_position: str = "prefix"
    """Where each document's eot is (``--eot`` of the run): prefix, suffix or none."""
    shard_tokens: int
    min_shard_tokens: int
    mask: bool = False
    """A chat run's: its assistant mask is exported beside the tokens where the format has a place for it."""


class Format:
    """One export format. Subclasses set the class attributes and override what differs."""

    name: str = ""
    reader: str = ""
    """Who reads the files, one phrase (``--help``, the README's table)."""
    help: str = ""
    """One line for ``--format``'s help."""
    sharded: bool = False
    """``--shard-tokens`` / ``--min-shard-tokens`` apply (else one file, or the format's own pieces, per split)."""
    fixed_names: str = ""
    """Why ``--prefix`` does not apply, when the reader wants fixed names; empty: it applies."""
    card: str = ""
    """What the files are, in Markdown, for a published export's dataset card; empty: ``help``."""

    def dtype(self, source_dtype: str) -> str:
        """The dtype the format stores; refuses what its reader cannot take. By default the
        run's own: little-endian uint16, or uint32 for vocabularies over 65,536 ids."""
        return "<u4" if wide(source_dtype) else "<u2"

    def check(self, config) -> None:
        """Limits of this format on the options (``ExportConfig`` calls it when built)."""

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        raise NotImplementedError

    def patterns(self, prefix: str) -> list[str]:
        """Globs (relative to DEST) matching every file an export of this format could write,
        to find an earlier one's."""
        raise NotImplementedError

    def record_name(self, prefix: str) -> str:
        return f"{prefix}_export.json"

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        """What the summary says about these files (sizes, limits, who reads them)."""
        return []


def wide(source_dtype: str) -> bool:
    return np.dtype(source_dtype).itemsize > 2


def shard_sizes(total: int, *, shard_tokens: int, min_shard_tokens: int = 0) -> list[int]:
    """Tokens per shard of a split: ``shard_tokens`` each, the remainder last; a last shard under
    ``min_shard_tokens`` joins the one before it (again, until it holds enough or is the only one).
    llm.c's loader stops on a shard smaller than one step (processes x B x T + 1 tokens)."""
    sizes = [shard_tokens] * (total // shard_tokens) + ([total % shard_tokens] if total % shard_tokens else [])
    while len(sizes) > 1 and sizes[-1] < min_shard_tokens:
        tail = sizes.pop()
        sizes[-1] += tail
    return sizes


def shard_notes(files: list[OutFile], *, shard_tokens: int, min_shard_tokens: int, reader: str | None = "llm.c") -> list[str]:
    """For sharded formats: each split's shard count and what became of its last, shorter part;
    ``reader``, the trainer whose batch limit a lone short shard sets (None: none is named)."""
    notes = []
    for split in ("val", "train"):
        shards = [f for f in files if f.split == split]
        if not shards:
            continue
        last = shards[-1]
        if len(shards) == 1:
            note = f"{split}: 1 shard, {last.name}, {last.tokens:,} tokens"
            if last.tokens < min_shard_tokens:
                note += f": the whole split, under --min-shard-tokens ({min_shard_tokens:,})"
                if reader:
                    note += f"; {reader} reads it with processes x B x T up to {last.tokens - 1:,}"
        elif last.tokens > shard_tokens:
            note = (f"{split}: {len(shards)} shards; the last, {last.name}, holds {last.tokens:,} tokens: its final "
                    f"{last.tokens - shard_tokens:,} joined it rather than make a shard under --min-shard-tokens "
                    f"({min_shard_tokens:,})")
        else:
            note = f"{split}: {len(shards)} shards; the last, {last.name}, holds {last.tokens:,} tokens"
        notes.append(note)
    return notes


def unsupported(name: str, known: tuple[str, ...]) -> UserError:
    return UserError(f"--format {name!r} not supported, expected one of {known}")
