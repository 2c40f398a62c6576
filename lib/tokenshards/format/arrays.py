"""Token arrays as format v1 stores them: ``.npy`` files, 1-D, little-endian, C order. Their bytes
(``npy_bytes``), the one header parser (``read_npy_header``) and the exact check of a header
against what the manifest says the file holds (``header_problem``)."""
from __future__ import annotations

import io
from typing import NamedTuple

import numpy as np

NPY_HEAD_PROBE = 4096
"""Bytes enough to parse a ``.npy`` header; np.save pads 1-D headers to 64 or 128 bytes."""


class NpyHeaderError(ValueError):
    """Bytes that do not start with a ``.npy`` header."""


def npy_bytes(tokens: np.ndarray) -> bytearray:
    """``np.save``'s bytes of the 1-D array stored little-endian, whatever the machine's order.
    Made with one copy of the tokens (``np.save`` into a buffer makes two or three)."""
    little = np.ascontiguousarray(tokens.astype(tokens.dtype.newbyteorder("<"), copy=False))
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, np.lib.format.header_data_from_array_1_0(little))
    header = head.getvalue()
    out = bytearray(len(header) + little.nbytes)
    out[:len(header)] = header
    np.frombuffer(out, dtype=little.dtype, offset=len(header))[:] = little
    return out


class NpyHeader(NamedTuple):
    shape: tuple
    fortran_order: bool
    dtype: np.dtype
    offset: int
    """Where the array's bytes start."""


def read_npy_header(raw: bytes) -> NpyHeader:
    """Parse a ``.npy`` header from the file's first bytes (``NPY_HEAD_PROBE`` are enough for
    what np.save writes). By hand, because np.load accepts what format v1 doesn't (big-endian,
    pickles, Fortran order) and a range reader has only the head."""
    buf = io.BytesIO(raw)
    try:
        version = np.lib.format.read_magic(buf)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran_order, dtype = read(buf)
    except (ValueError, EOFError) as e:
        raise NpyHeaderError(str(e)) from e
    return NpyHeader(shape=tuple(shape), fortran_order=bool(fortran_order), dtype=dtype, offset=buf.tell())



def header_problem(header: NpyHeader, *, dtype: str, length: int, size: int | None = None) -> str | None:
    """Why a ``.npy`` file with this header (and ``size`` bytes in all) is not the array the manifest
    names, or None: exactly ``dtype`` stored little-endian (``>u2`` holds other ids than ``<u2``),
    one dimension of ``length``, C order, and nothing missing or left over after it."""
    want = np.dtype(dtype).newbyteorder("<")
    if header.dtype.str != want.str:
        return f"holds {header.dtype.str} values, expected {want.str} (little-endian {np.dtype(dtype).name})"
    if header.fortran_order:
        return "is stored in Fortran order, expected C order"
    if header.shape != (length,):
        return f"holds an array of shape {header.shape}, expected ({length},): one dimension, the manifest's length"
    if size is not None and size != header.offset + length * want.itemsize:
        return (f"is {size:,} bytes, its header and the manifest make it {header.offset + length * want.itemsize:,} "
                "(truncated, or bytes appended)")
    return None
