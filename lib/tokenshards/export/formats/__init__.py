"""The export formats, one module each, in one registry.

Each module defines one ``Format`` (``base.py``) as ``FORMAT``: its files, dtype rules and
limits, summary notes and which trainer reads it. The CLI's ``--format`` choices and help, the
options' checks and both export drivers go through ``get(name)``: a new format is a new module
here, its line in ``_MODULES``, and its test.
"""
from __future__ import annotations

from ..layout import OutFile, Streams
from . import datatrove, hf, litdata, llmc, mds, megatron, nanogpt, npy, olmo
from .base import DEFAULT_PREFIX, MIN_SHARD_FRACTION, Format, Plan, shard_sizes, unsupported

_MODULES = (llmc, npy, nanogpt, megatron, olmo, datatrove, litdata, mds, hf)
PACKED = ("hf", "npy")
"""Formats whose packed rows (``--seq-len N``) carry our ``seq_lengths`` and position ids."""
PACKED_IN_TRAINER_FILES = ("megatron", "olmo")
"""Formats whose packed rows go into the trainer's own files, one file per split (``export/packed.py``):
the documents in a row are what its reader derives from them (``formats/megatron.py``,
``formats/olmo.py``), never ``seq_lengths`` or position ids of ours. The other formats are flat
streams their trainers cut."""
REGISTRY: dict[str, Format] = {m.FORMAT.name: m.FORMAT for m in _MODULES}
FORMATS = tuple(REGISTRY)


def get(name: str) -> Format:
    try:
        return REGISTRY[name]
    except KeyError:
        raise unsupported(name, FORMATS) from None


def shard_files(*, fmt: str, prefix: str, streams: Streams, shard_tokens: int, dtype: str,
                min_shard_tokens: int = 0, n_vocab: int = 0) -> list[OutFile]:
    """The files of ``fmt`` for these streams; splits with no tokens get no file."""
    return get(fmt).files(streams, Plan(prefix=prefix, dtype=dtype, n_vocab=n_vocab, shard_tokens=shard_tokens,
                                        min_shard_tokens=min_shard_tokens))


__all__ = ["DEFAULT_PREFIX", "FORMATS", "PACKED", "PACKED_IN_TRAINER_FILES", "MIN_SHARD_FRACTION", "REGISTRY", "Format", "Plan", "get", "shard_files",
           "shard_sizes"]
