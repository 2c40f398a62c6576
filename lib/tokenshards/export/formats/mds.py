"""``mds``: MosaicML streaming's MDS, read by ``streaming.StreamingDataset`` and so by llm-foundry's
``StreamingTextDataset``: per split a folder (``train/``, ``val/``: a stream is one folder) of
``shard.NNNNN.mds`` files and the ``index.json`` naming them. One sample per document (its eot
included), one column ``tokens`` encoded ``bytes``: llm-foundry reads it with
``token_encoding_type`` set to the dtype the summary says (``uint16``, or ``uint32`` for
vocabularies over 65,536 ids; its default is int64). llm-foundry's own converters now write
``ndarray`` columns and call ``bytes`` samples legacy, but still read them (see the end for why not
``ndarray``).

A shard, as streaming's ``MDSWriter.encode_joint_shard`` lays it out: uint32 sample count, uint32
byte offset of every sample and of the shard's end (count + 1, from the file's start), the writer's
config as JSON (``json.dumps(sort_keys=True)``), then the samples, each the uint32 size of its
variable-size column and the tokens. With the ``bytes`` encoding a sample's size is 4 bytes plus
its tokens, so a shard's size needs only its document and token counts: shards are cut between
pieces of the split's stream (partitions, or buckets of a shuffled export), whose counts the
client knows, adding pieces while the shard stays within ``SIZE_LIMIT`` (a piece larger than that
is a shard of its own, as streaming's own writer makes a sample larger than its limit one).
(``ndarray:uint16`` would store each array's shape in 1, 2 or 4 bytes by its length, so a shard's
size would need every document's length before writing.) No compression, no hashes (streaming's
defaults); ``index.json`` as its writer writes it.
"""
from __future__ import annotations

import json

import numpy as np

from ...errors import UserError
from ..layout import DocRecords, Literal, OutFile, SizedDocs, Streams
from .base import Format, Plan, wide

SIZE_LIMIT = 1 << 26
"""Bytes a shard grows to before the next piece starts a new one: streaming's default ``size_limit``."""
MAX_SHARD = (1 << 32) - 1
"""Sample offsets are uint32."""


def shard_config() -> dict:
    """What ``MDSWriter(columns={"tokens": "bytes"}, size_limit=SIZE_LIMIT).get_config()`` gives."""
    return {"column_encodings": ["bytes"], "column_names": ["tokens"], "column_sizes": [None], "compression": None,
            "format": "mds", "hashes": [], "size_limit": SIZE_LIMIT, "version": 2}


def sample_offsets(starts: np.ndarray, ends: np.ndarray, base: int, itemsize: int) -> bytes:
    """uint32 offset of each of a shard's samples and of its end (worker side): ``base`` (the
    header's bytes), 4 per sample before it and the bytes of their tokens."""
    at = np.concatenate([starts, ends[-1:]]) - starts[0]
    return (base + 4 * np.arange(len(at)) + itemsize * at).astype("<u4").tobytes()


def _shards(streams: Streams, split: str, itemsize: int, fixed: int) -> list[list[int]]:
    """Pieces of ``split`` grouped into shards: each a list of piece numbers."""
    db, tb = streams.doc_bounds[split], streams.token_bounds[split]
    shards, size = [], 0
    for k in range(len(db) - 1):
        docs, tokens = int(db[k + 1] - db[k]), int(tb[k + 1] - tb[k])
        if not docs:
            continue
        nbytes = 8 * docs + itemsize * tokens  # its offsets, sizes and tokens
        if shards and size + nbytes <= SIZE_LIMIT:
            shards[-1].append(k)
            size += nbytes
        else:
            shards.append([k])
            size = fixed + nbytes
    return shards


class MDS(Format):
    name = "mds"
    reader = "llm-foundry (mosaicml-streaming)"
    help = "MosaicML MDS, index.json + shard.NNNNN.mds in train/ and val/ (StreamingDataset, llm-foundry's StreamingTextDataset)"
    fixed_names = "streaming's StreamingDataset reads index.json and the shard.*.mds files it names"

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        itemsize = np.dtype(plan.dtype).itemsize
        config = shard_config()
        config_data = json.dumps(config, sort_keys=True).encode()
        fixed = 4 + 4 + len(config_data)  # sample count, the end's offset, the config
        files = []
        for split in ("train", "val"):
            db, tb = streams.doc_bounds[split], streams.token_bounds[split]
            entries = []
            for number, pieces in enumerate(_shards(streams, split, itemsize, fixed)):
                first, last = int(db[pieces[0]]), int(db[pieces[-1] + 1])
                docs, tokens = last - first, int(tb[pieces[-1] + 1] - tb[pieces[0]])
                base = 4 + 4 * (docs + 1) + len(config_data)
                regions = (Literal(np.array([docs], "<u4").tobytes()),
                           DocRecords(split, first, docs, docs, 4 * (docs + 1), sample_offsets, (base, itemsize)),
                           Literal(config_data),
                           *(SizedDocs(split, int(db[k]), int(db[k + 1] - db[k]), int(tb[k + 1] - tb[k]), plan.dtype)
                             for k in pieces if db[k + 1] > db[k]))
                name = f"shard.{number:05d}.mds"
                f = OutFile(name=f"{split}/{name}", split=split, tokens=tokens, regions=regions)
                if f.nbytes > MAX_SHARD:
                    raise UserError(f"--format mds: shard {split}/{name} would hold {f.nbytes:,} bytes, over the "
                                    f"{MAX_SHARD:,} its uint32 sample offsets reach (one piece of the stream is that "
                                    "large); tokenize with a smaller --partition-mb, or shuffle (smaller buckets)")
                files.append(f)
                entries.append({"raw_data": {"basename": name, "bytes": f.nbytes, "hashes": {}}, "samples": docs,
                                "zip_data": None, **config})
            if entries:
                files.append(OutFile(name=f"{split}/index.json", split=split, tokens=0,
                                     regions=(Literal(json.dumps({"shards": entries, "version": 2},
                                                                 sort_keys=True).encode()),)))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{split}/{name}" for split in ("train", "val") for name in ("index.json", "shard.*.mds")]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        token_type = np.dtype(plan.dtype).name
        shards = sum(1 for f in files if f.name.endswith(".mds"))
        note = (f"mds: {shards} shards, one sample per document (its eot included), column 'tokens' as bytes: "
                f"StreamingDataset(local='DEST/train'), val/ likewise; llm-foundry's StreamingTextDataset with "
                f"token_encoding_type='{token_type}' (its default is int64)")
        if wide(plan.dtype):
            note += f"; uint32 ids for this {plan.n_vocab:,}-token vocabulary"
        return [note]


FORMAT = MDS()
