"""The one configuration object of ``tokenshards export``, checked when built (format rules
through the registry, ``formats.get(...).check``)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from .. import limits
from ..cluster.options import RunOptions
from ..errors import UserError
from ..format.reader import has_masks
from . import formats
from .formats.hf import OPTIONAL_COLUMNS
from .pack import MODES

DEFAULT_SHARD_TOKENS = 100_000_000
"""llm.c's and build-nanogpt's FineWeb shard size."""
DEFAULT_VAL_TOKENS = 10_485_760
"""modded-nanogpt evaluates on this many validation tokens."""
DEFAULT_CHUNK_BYTES = 64 * 2**20
"""Bytes one task renders and writes: its memory bound, and S3's part size (>= 5 MiB)."""


@dataclass(frozen=True, kw_only=True)
class ExportConfig(RunOptions):
    """What decides the exported bytes (above the line) and how the job runs (below it)."""

    out: str
    format: str
    to: str
    shard_tokens: int | None = None
    """Sharded formats only (llmc, npy); None means DEFAULT_SHARD_TOKENS."""
    min_shard_tokens: int | None = None
    """Sharded formats only: a split's last shard under this joins the one before it; None means 1%
    of the shard size (``formats.MIN_SHARD_FRACTION``), 0 never joins."""
    val_tokens: int = DEFAULT_VAL_TOKENS
    prefix: str | None = None
    """None: ``fineweb``; formats whose reader wants fixed names refuse one."""
    overwrite: bool = False
    shuffle: bool = False
    """Train (and validation) documents in a seeded order over the whole corpus (shuffle.py)."""
    seed: int | None = None
    """None: 0. Only with shuffle."""
    mix_with: tuple[str, ...] = ()
    """More finished runs to mix with ``out`` (a mixture is always shuffled)."""
    weights: tuple[float, ...] | None = None
    """One per run, normalised; None: each run's train tokens (every document once)."""
    tokens: int | None = None
    """Train tokens of the mixture; None: the most that takes no run twice."""
    seq_len: int | None = None
    """Packed sequences of this many tokens (``pack.py``), in the formats of ``formats.PACKED``."""
    pack: str | None = None
    """With seq_len: ``concat`` (None) or ``best-fit``."""
    bos_align: bool = False
    columns: tuple[str, ...] | None = None
    """Packed hf's optional columns (``formats.hf.OPTIONAL_COLUMNS``); None: position_ids."""
    # -- how it runs (and RunOptions): never changes the output bytes --
    chunk_bytes: int = DEFAULT_CHUNK_BYTES

    def __post_init__(self):
        super().__post_init__()
        self._bound_numbers()
        fmt = formats.get(self.format)
        names = [f.name for f in formats.REGISTRY.values() if f.sharded]
        sharded = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        for flag, value in (("--shard-tokens", self.shard_tokens), ("--min-shard-tokens", self.min_shard_tokens)):
            if value is not None and not fmt.sharded:
                raise UserError(f"{flag} applies to {sharded}; {self.format} writes one file per split")
        if self.shard_tokens is not None and self.shard_tokens < 1:
            raise UserError(f"--shard-tokens {self.shard_tokens} must be at least 1")
        if self.min_shard_tokens is not None and self.min_shard_tokens < 0:
            raise UserError(f"--min-shard-tokens {self.min_shard_tokens} must be 0 (keep every last shard as it is) or more")
        fmt.check(self)
        if self.val_tokens < 0:
            raise UserError(f"--val-tokens {self.val_tokens} must be 0 (no validation set) or more")
        if self.prefix is not None:
            if fmt.fixed_names:
                raise UserError(f"--prefix does not apply to {self.format}: {fmt.fixed_names}")
            if not self.prefix or "/" in self.prefix or self.prefix.startswith("."):
                raise UserError(f"--prefix {self.prefix!r}: expected a plain file name prefix such as 'fineweb'")
        if self.chunk_bytes < 1:
            raise UserError(f"chunk_bytes={self.chunk_bytes} must be positive")
        if not self.shuffled and self.seed is not None:
            raise UserError("--seed orders a shuffled export; add --shuffle")
        if self.tokens is not None and self.tokens < 1:
            raise UserError(f"--tokens {self.tokens} must be at least 1")
        if self.weights is not None and len(self.weights) != len(self.runs):
            raise UserError(f"--weights has {len(self.weights)} values for {len(self.runs)} runs; give one weight per run, in the same order")
        for run, w in zip(self.runs, self.weights or ()):
            if not (math.isfinite(w) and w > 0):
                raise UserError(f"weight {w!r} for {run} must be a positive number")
        if len(set(self.runs)) != len(self.runs):
            raise UserError(f"a run is given twice ({', '.join(self.runs)}); to weigh it more, use --weights")
        self._check_packing()

    def _bound_numbers(self) -> None:
        """Every number finite, whole where a count is meant, and within what an export can do
        (``limits``), before anything else is looked at: one line each, never an OverflowError."""
        # The lower bounds are said below, each in its own words; these are what no option may pass.
        counts = (("--shard-tokens", "shard_tokens", limits.MAX_COUNT), ("--min-shard-tokens", "min_shard_tokens",
                  limits.MAX_COUNT), ("--val-tokens", "val_tokens", limits.MAX_COUNT), ("--tokens", "tokens", limits.MAX_COUNT),
                  ("--seq-len", "seq_len", limits.MAX_SEQ_LEN), ("chunk_bytes", "chunk_bytes", 2**40))
        for option, name, high in counts:
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, limits.whole(option, value, high=high, what="a count"))
        if self.seed is not None:
            object.__setattr__(self, "seed", limits.whole("--seed", self.seed, low=limits.MIN_SEED, high=limits.MAX_SEED,
                                                          what="a seed"))
        if self.weights is not None:
            object.__setattr__(self, "weights", tuple(limits.number("--weights", w, high=limits.MAX_WEIGHT, what="a weight")
                                                      for w in self.weights))

    def _check_packing(self) -> None:
        if self.seq_len is None:
            for flag, given in (("--pack", self.pack is not None), ("--bos-align", self.bos_align),
                                ("--columns", self.columns is not None)):
                if given:
                    raise UserError(f"{flag} shapes packed sequences; add --seq-len N (e.g. --seq-len 2048)")
            if self.format == "hf" and len(self.runs) > 1:
                raise UserError("a mixture in hf format needs --seq-len N: weights divide rows of equal size; "
                                "or export each run on its own")
            return
        packing = (*formats.PACKED, *formats.PACKED_IN_TRAINER_FILES)
        if self.format not in packing:
            raise UserError(f"--seq-len: {self.format} is a flat token stream its trainer cuts into sequences itself; "
                            f"packed sequences are written by {', '.join(packing)} (--format hf)")
        if self.seq_len < 2:
            raise UserError(f"--seq-len {self.seq_len} must be at least 2")
        if self.pack is not None and self.pack not in MODES:
            raise UserError(f"--pack {self.pack!r} not supported, expected one of {MODES}")
        unknown = sorted(set(self.columns or ()) - set(OPTIONAL_COLUMNS))
        if unknown:
            raise UserError(f"--columns {','.join(unknown)}: expected some of {','.join(OPTIONAL_COLUMNS)} "
                            "(input_ids and seq_lengths are always written)")
        if self.columns is not None and self.format in formats.PACKED_IN_TRAINER_FILES:
            raise UserError(f"--columns: {self.format} writes the token ids alone; its trainer derives position ids and "
                            "masks from them (docs/exports/packing.md): leave out --columns")
        if self.columns and self.format != "hf" and set(self.columns) - {"position_ids"}:
            raise UserError(f"--columns: {self.format} writes input_ids, seq_lengths and position_ids; "
                            "attention_mask and labels are hf's (--format hf)")

    @property
    def pack_mode(self) -> str:
        return self.pack or "concat"

    @property
    def extra_columns(self) -> tuple[str, ...]:
        """Optional columns written (packed only): as asked, else position ids."""
        if self.seq_len is None:
            return ()
        return tuple(self.columns) if self.columns is not None else ("position_ids",)

    @property
    def rows(self) -> bool:
        """Written row by row (``packed.py``): every packed export, and hf always."""
        return self.seq_len is not None or self.format == "hf"

    @property
    def fmt(self) -> formats.Format:
        return formats.get(self.format)

    @property
    def runs(self) -> tuple[str, ...]:
        return (self.out, *self.mix_with)

    @property
    def shuffled(self) -> bool:
        """Mixing (several runs, --weights or --tokens) is always shuffled."""
        return self.shuffle or bool(self.mix_with) or self.weights is not None or self.tokens is not None

    @property
    def name_prefix(self) -> str:
        return self.prefix or formats.DEFAULT_PREFIX

    @property
    def shard_size(self) -> int:
        return self.shard_tokens or DEFAULT_SHARD_TOKENS

    @property
    def min_shard_size(self) -> int:
        if self.min_shard_tokens is not None:
            return self.min_shard_tokens
        return self.shard_size // formats.MIN_SHARD_FRACTION

    def plan(self, manifest, *, dtype: str) -> formats.Plan:
        """What the format's files depend on besides the streams (``manifest``: the run's, or the
        first of a mixture's, which agree on the encoding and the eot)."""
        enc = manifest.encoding
        return formats.Plan(prefix=self.name_prefix, dtype=dtype, n_vocab=enc.n_vocab, encoding=enc.name, eot=enc.eot,
                            eot_position=manifest.eot_position, shard_tokens=self.shard_size,
                            min_shard_tokens=self.min_shard_size, mask=has_masks(manifest))

    def replace(self, **changes) -> "ExportConfig":
        return dataclasses.replace(self, **changes)
