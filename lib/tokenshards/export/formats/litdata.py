"""``litdata``: litdata's optimized dataset for ``StreamingDataset(DIR, item_loader=TokensLoader(block_size))``
(LitGPT's pretraining data): per split a folder (``train/``, ``val/``: the dataset takes one
folder) of ``chunk-0-N.bin`` files and the ``index.json`` naming them.

A chunk, as litdata's ``BinaryWriter._create_chunk`` lays it out: uint32 item count, uint32
offsets of the items (count + 1, from the file's start), then the items. Each of ours holds one
item, ``CHUNK_TOKENS`` tokens of the split's stream (the last fewer): ``TokensLoader`` reads a
chunk's data as one stream of ``block_size`` blocks and never looks at items. Tokens are
``no_header_tensor`` uint16 (torch dtype 20), or for vocabularies over 65,536 ids
``no_header_numpy`` uint32 (numpy dtype 6), as litdata's writer records a tensor or an array of
that dtype. ``index.json`` has the keys litdata's writer writes, without the merge time, so the
same export gives the same bytes.
"""
from __future__ import annotations

import json

import numpy as np

from ..layout import Literal, OutFile, Streams, TokenRun
from .base import Format, Plan, wide

CHUNK_TOKENS = 1 << 25
"""Tokens per chunk: 64 MiB of uint16 (litdata's own default chunk is 64 MB)."""
DATA_FORMATS = {"<u2": ("no_header_tensor:20", "tensor"), "<u4": ("no_header_numpy:6", "json")}
"""litdata's names for a uint16 torch tensor and a uint32 numpy array (``_TORCH_DTYPES_MAPPING``,
``_NUMPY_DTYPES_MAPPING``), and the ``types`` its writer records with each."""
LEAF_SPEC = json.dumps([1, {"type": None, "context": None, "children_spec": []}])
"""The pytree spec of an item that is one array (``data_spec``)."""


def chunk_header(nbytes: int) -> bytes:
    """One item of ``nbytes``: count 1, offsets [12, 12 + nbytes]."""
    return np.array([1, 12, 12 + nbytes], dtype="<u4").tobytes()


def index_json(chunks: list[tuple[str, int, int]], *, dtype: str) -> bytes:
    data_format, types = DATA_FORMATS[dtype]
    return json.dumps({
        "chunks": [{"chunk_bytes": nbytes, "chunk_size": 1, "dim": tokens, "filename": name}
                   for name, nbytes, tokens in chunks],
        "config": {"chunk_bytes": None, "chunk_size": CHUNK_TOKENS, "compression": None, "compression_batch_size": None,
                   "compression_level": None, "data_format": [data_format], "data_spec": LEAF_SPEC, "encryption": None,
                   "ipc_compression": None, "item_loader": "TokensLoader", "types": types},
    }, sort_keys=True).encode()


class Litdata(Format):
    name = "litdata"
    reader = "LitGPT (litdata)"
    help = "litdata optimized dataset, index.json + chunk-0-N.bin in train/ and val/ (StreamingDataset with TokensLoader)"
    fixed_names = "litdata's StreamingDataset reads index.json and the chunk-*.bin files it names"

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        itemsize = np.dtype(plan.dtype).itemsize
        files = []
        for split in ("train", "val"):
            total = streams.tokens(split)
            chunks = []
            for number, first in enumerate(range(0, total, CHUNK_TOKENS)):
                count = min(CHUNK_TOKENS, total - first)
                name = f"chunk-0-{number}.bin"
                f = OutFile(name=f"{split}/{name}", split=split, tokens=count,
                            regions=(Literal(chunk_header(count * itemsize)), TokenRun(split, first, count, plan.dtype)))
                files.append(f)
                chunks.append((name, f.nbytes, count))
            if chunks:
                files.append(OutFile(name=f"{split}/index.json", split=split, tokens=0,
                                     regions=(Literal(index_json(chunks, dtype=plan.dtype)),)))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{split}/{name}" for split in ("train", "val") for name in ("index.json", "chunk-*.bin")]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        note = (f"litdata: StreamingDataset('DEST/train', item_loader=TokensLoader(block_size=T + 1)), val/ likewise; "
                f"chunks of {CHUNK_TOKENS:,} tokens, of which TokensLoader reads whole blocks only (as with litdata's "
                "own optimize: up to block_size - 1 tokens at each chunk's end are not read)")
        if wide(plan.dtype):
            note += "; uint32 ids for this vocabulary: items come as numpy uint32 arrays"
        return [note]


FORMAT = Litdata()
