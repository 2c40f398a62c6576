"""``hf``: a Hugging Face dataset: parquet shards in split folders and a dataset card whose
``configs``/``data_files`` YAML ``datasets.load_dataset`` and the Hub's viewer read.

Rows are documents (``input_ids``), or with ``--seq-len N`` packed sequences of N tokens
(``input_ids``, ``seq_lengths``: the lengths of the row's segments, its documents then its padding
as one segment more, so that they cover the row as TRL's padding-free collator and flash-attention's
cu_seqlens need; the columns asked with ``--columns``; ``labels`` where some token is not a target:
a chat run's, best-fit's padding). Parquet is not a byte layout tasks can write in pieces, so this
format is written row group by row group by ``export/packed.py``, never through ``Format.files``.
"""
from __future__ import annotations

import json

import pyarrow as pa

from ...format.export_record import ExportRecord
from ..layout import OutFile, Streams
from .base import Format, Plan

SPLIT_DIRS = {"train": "train", "val": "validation"}
"""``validation`` is ``datasets.Split.VALIDATION``'s name: what trainers' scripts ask for."""
LABEL_IGNORE = -100
"""What ``labels`` hold where no loss is taken: PyTorch's cross-entropy ``ignore_index``."""
OPTIONAL_COLUMNS = ("position_ids", "attention_mask", "labels")
CARD_MARKER = "<!-- written by tokenshards export --format hf -->"


def shard_name(prefix: str, split: str, index: int) -> str:
    return f"{SPLIT_DIRS[split]}/{prefix}-{index:05d}.parquet"


def schema(columns: tuple[str, ...], *, packed: bool) -> pa.Schema:
    """``input_ids`` int32 (any vocabulary), then what the export carries."""
    fields = [pa.field("input_ids", pa.list_(pa.int32()))]
    if packed:
        fields.append(pa.field("seq_lengths", pa.list_(pa.int32())))
    types = {"position_ids": pa.int32(), "attention_mask": pa.int8(), "labels": pa.int32()}
    fields += [pa.field(c, pa.list_(types[c])) for c in OPTIONAL_COLUMNS if c in columns]
    return pa.schema(fields)


def configs_yaml(splits: list[str], *, folder: str = "") -> list[str]:
    """The card's ``configs`` entry: one ``data_files`` glob per split that has rows."""
    inside = f"{folder}/" if folder else ""
    lines = ["configs:", "- config_name: default", "  data_files:"]
    for split in ("train", "val"):
        if split in splits:
            lines += [f"  - split: {SPLIT_DIRS[split]}", f"    path: {json.dumps(inside + SPLIT_DIRS[split] + '/*.parquet')}"]
    return lines


def local_card(record: ExportRecord) -> str:
    """The README.md an hf export writes beside its shards (a publish replaces it with the full card)."""
    splits = [f.split for f in record.files]
    packing = record.packing
    rows = (f"sequences of {packing.seq_len:,} tokens ({packing.mode}); `seq_lengths` cover each row: its "
            "documents, then its padding (if any) as a segment of its own" if packing and packing.seq_len
            else "one document per row")
    lines = ["---", *configs_yaml(splits), "tags:", "- tokenshards", "- tokenized", "---", CARD_MARKER, "",
             f"# {record.encoding.name} tokens", "",
             f"Written by `tokenshards export --format hf`: {rows}; columns "
             + ", ".join(f"`{c}`" for c in record.columns or ("input_ids",)) + ". "
             "`datasets.load_dataset(PATH)` reads it; every fact is in the export record beside this card.", ""]
    return "\n".join(lines)


class HuggingFace(Format):
    name = "hf"
    reader = "Hugging Face datasets, Trainer, TRL"
    help = "Hugging Face dataset: parquet shards in train/ and validation/ with a README.md card (load_dataset)"
    card = "Hugging Face dataset: parquet shards of `input_ids` (and, packed, `seq_lengths`, `position_ids`, ...)"
    sharded = True
    rows = True
    """Written row group by row group (``export/packed.py``), not in byte ranges."""

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        raise NotImplementedError("hf is written by export/packed.py")

    def patterns(self, prefix: str) -> list[str]:
        return [f"{SPLIT_DIRS['train']}/{prefix}-*.parquet", f"{SPLIT_DIRS['val']}/{prefix}-*.parquet"]


FORMAT = HuggingFace()
