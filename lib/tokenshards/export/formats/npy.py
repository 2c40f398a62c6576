"""``npy``: build-nanogpt's shards, ``np.save`` of a 1-D array (its ``load_tokens`` casts to
int32): real ``.npy`` files with NumPy's header. (OLMo-core's raw memmaps, also named ``.npy``,
are the ``olmo`` format: neither is ever written or read as the other.)"""
from __future__ import annotations

import io

import numpy as np

from ..layout import Literal, MaskRun, OutFile, Streams
from .base import Format, Plan, shard_notes
from .llmc import sharded_files


def header(*, dtype: str, count: int) -> bytes:
    """Exactly the bytes ``np.save`` writes before a 1-D C-order array of this dtype and length."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (count,)})
    return buf.getvalue()


MASK_FOLDER = "mask"


class Npy(Format):
    name = "npy"
    reader = "build-nanogpt"
    help = "build-nanogpt .npy shards (np.save, uint16 or uint32)"
    card = "build-nanogpt `.npy` shards: `np.save` of a 1-D token array"
    sharded = True

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        files = sharded_files(streams, plan, suffix="npy", head=lambda count: header(dtype=plan.dtype, count=count))
        if not plan.mask:
            return files
        # A chat run's: each shard's assistant mask (uint8, 1 = take the loss) under mask/, same name.
        # Not beside the shards: build-nanogpt takes every file whose name holds the split's.
        return files + [OutFile(name=f"{MASK_FOLDER}/{f.name}", split=f.split, tokens=0,
                                regions=(Literal(header(dtype="|u1", count=f.tokens)),
                                         MaskRun(f.split, f.regions[1].first, f.tokens)))
                        for f in files]

    def patterns(self, prefix: str) -> list[str]:
        return [f"{prefix}_val_*.npy", f"{prefix}_train_*.npy", f"{MASK_FOLDER}/{prefix}_val_*.npy",
                f"{MASK_FOLDER}/{prefix}_train_*.npy"]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        shards = [f for f in files if not f.name.startswith(f"{MASK_FOLDER}/")]
        notes = shard_notes(shards, shard_tokens=plan.shard_tokens, min_shard_tokens=plan.min_shard_tokens, reader=None)
        if len(shards) < len(files):
            notes.append(f"{MASK_FOLDER}/: each shard's assistant mask (uint8, 1 = take the loss), same name and length")
        return notes


FORMAT = Npy()
