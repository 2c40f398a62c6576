"""Pure: the seeded order of a shuffled export, as one sortable key per document copy.

A document's position comes from a keyed hash of its identity: the blake2b-64 of its ``id``
(the hash validation already uses), xor-ed with a 64-bit salt derived from (seed, what the key
is for, source, epoch), then through murmur3's 64-bit finalizer, a bijection whose every output
bit depends on every input bit. So the key depends only on the seed and the document: never on
the cluster, the number of workers or ``--partition-mb``; another seed (or epoch, or source) is
an unrelated order. Equal ids (equal hashes) are ordered by (source, epoch, input, row), so the
order is total and the bytes are fixed.

A shuffled export sorts every copy by one int64: bit 62 is the split (val 0, train 1) so each
split is a contiguous key range, and the 62 high bits of the position key follow.
"""
from __future__ import annotations

import hashlib

import numpy as np

SPLIT_BIT = 62
KEY_MAX = 2**63 - 1
SORT_COLUMNS = ("key", "src", "epoch", "input", "row")
"""The order of a shuffled export: the position key, then the document's identity for ties."""

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)
_S33 = np.uint64(33)


def salt(*, seed: int, purpose: str, source: int = 0, epoch: int = 0) -> np.uint64:
    """64 bits that make one order: ``purpose`` is ``val``, ``train`` or ``select``."""
    text = f"tokenshards-order/1 seed={seed} purpose={purpose} source={source} epoch={epoch}".encode()
    return np.frombuffer(hashlib.blake2b(text, digest_size=8).digest(), dtype=">u8").astype(np.uint64)[0]


def fmix64(x: np.ndarray) -> np.ndarray:
    """murmur3's finalizer (arrays only: numpy wraps array products silently, scalars warn)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> _S33
    x *= _M1
    x ^= x >> _S33
    x *= _M2
    x ^= x >> _S33
    return x


def keyed(hashes: np.ndarray, key_salt: np.uint64) -> np.ndarray:
    """uint64 position (or selection) keys of documents with these id hashes."""
    return fmix64(np.asarray(hashes, dtype=np.uint64) ^ key_salt)


def sort_keys(keys: np.ndarray, split: str) -> np.ndarray:
    """int64 sort keys: the split in bit 62, then the key's 62 high bits."""
    top = np.uint64(int(split == "train") << SPLIT_BIT)
    return ((np.asarray(keys, dtype=np.uint64) >> np.uint64(2)) | top).astype(np.int64)


def divisions(*, val_buckets: int, train_buckets: int) -> list[int]:
    """Bucket boundaries of the sort: ``val_buckets`` equal key ranges over val's half, then
    ``train_buckets`` over train's. Keys are uniform, so buckets are about equal; how many there
    are decides only how the work is cut, never the order."""
    bounds: list[int] = []
    half = 1 << SPLIT_BIT
    for base, n in ((0, val_buckets), (half, train_buckets)):
        bounds.extend(base + half * b // n for b in range(n))
    return bounds + [KEY_MAX]
