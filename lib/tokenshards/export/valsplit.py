"""Which documents are validation: the smallest keys, whole documents, until --val-tokens.

A document's key is (blake2b-64 of its id, its input's position in the manifest, its row), so
the choice depends only on the documents themselves: not on the cluster, the partitioning or
the order tasks finish. The row breaks ties between equal ids.

Finding the threshold never brings every id to the client: each partition keeps only its own
smallest keys up to --val-tokens (no document past that prefix can be chosen), and a tree of
merges on the cluster keeps each intermediate list to one --val-tokens' worth of documents.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

CANDIDATE = np.dtype([("hash", "<u8"), ("input", "<i8"), ("row", "<i8"), ("length", "<i8"), ("part", "<i8")])
"""One document competing for the validation set; ``part`` is its partition's manifest position."""


@dataclass(frozen=True)
class Threshold:
    """The largest key in the validation set: a document is val iff its key is <= this."""

    hash: int
    input: int
    row: int


def id_hashes(ids: list[str]) -> np.ndarray:
    """blake2b (8-byte digest, big-endian) of each id's UTF-8 bytes, as uint64."""
    digests = b"".join(hashlib.blake2b(i.encode("utf-8"), digest_size=8).digest() for i in ids)
    return np.frombuffer(digests, dtype=">u8").astype(np.uint64)


def sort_candidates(c: np.ndarray) -> np.ndarray:
    return c[np.lexsort((c["row"], c["input"], c["hash"]))]


def take_prefix(sorted_c: np.ndarray, val_tokens: int) -> np.ndarray:
    """The shortest prefix holding at least ``val_tokens`` tokens (all of it when it holds fewer)."""
    reach = np.cumsum(sorted_c["length"])
    n = int(np.searchsorted(reach, val_tokens, side="left")) + 1
    return sorted_c[:n]


def candidates(*, hashes: np.ndarray, input_ordinal: int, rows: np.ndarray, lengths: np.ndarray, part: int,
               val_tokens: int) -> np.ndarray:
    """One partition's documents that could be val: its own smallest keys up to ``val_tokens``."""
    c = np.empty(len(hashes), CANDIDATE)
    c["hash"], c["input"], c["row"], c["length"], c["part"] = hashes, input_ordinal, rows, lengths, part
    return take_prefix(sort_candidates(c), val_tokens)


def merge(*lists: np.ndarray, val_tokens: int) -> np.ndarray:
    """Candidates of several subtrees → candidates of their union (associative, order-free)."""
    return take_prefix(sort_candidates(np.concatenate(lists)), val_tokens)


def is_val(*, hashes: np.ndarray, input_ordinal: int, rows: np.ndarray, threshold: Threshold | None) -> np.ndarray:
    """Boolean mask: key <= threshold, compared as (hash, input, row)."""
    if threshold is None:
        return np.zeros(len(hashes), dtype=bool)
    h = np.uint64(threshold.hash)
    if input_ordinal != threshold.input:
        tie = np.full(len(hashes), input_ordinal < threshold.input)
    else:
        tie = rows <= threshold.row
    return (hashes < h) | ((hashes == h) & tie)


def choose(final: np.ndarray, *, n_parts: int) -> tuple[Threshold, np.ndarray, np.ndarray]:
    """(threshold, val docs per partition, val tokens per partition) from the merged candidates."""
    last = final[-1]
    threshold = Threshold(hash=int(last["hash"]), input=int(last["input"]), row=int(last["row"]))
    docs = np.bincount(final["part"], minlength=n_parts).astype(np.int64)
    tokens = np.zeros(n_parts, dtype=np.int64)
    np.add.at(tokens, final["part"], final["length"])
    return threshold, docs, tokens
