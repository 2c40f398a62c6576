"""``npy``: build-nanogpt's shards, ``np.save`` of a 1-D array (its ``load_tokens`` casts to
int32): real ``.npy`` files with NumPy's header. (OLMo-core's raw memmaps, also named ``.npy``,
are the ``olmo`` format: neither is ever written or read as the other.)"""
from __future__ import annotations

import io

import numpy as np

from ..layout import OutFile, Streams
from .base import Format, Plan, shard_notes
from .llmc import sharded_files


def header(*, dtype: str, count: int) -> bytes:
    """Exactly the bytes ``np.save`` writes before a 1-D C-order array of this dtype and length."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)),
                                               "fortran_order": False, "shape": (count,)})
    return buf.getvalue()


class Npy(Format):
    name = "npy"
    reader = "build-nanogpt"
    help = "build-nanogpt .npy shards (np.save, uint16 or uint32)"
    card = "build-nanogpt `.npy` shards: `np.save` of a 1-D token array"
    sharded = True

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        return sharded_files(streams, plan, suffix="npy", head=lambda count: header(dtype=plan.dtype, count=count))

    def patterns(self, prefix: str) -> list[str]:
        return [f"{prefix}_val_*.npy", f"{prefix}_train_*.npy"]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        return shard_notes(files, shard_tokens=plan.shard_tokens, min_shard_tokens=plan.min_shard_tokens, reader=None)


FORMAT = Npy()
