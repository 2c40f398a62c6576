"""Format v1: file names, done records, resume, and the manifest written last (DESIGN.md)."""
from __future__ import annotations

import hashlib
import json

import fsspec

from .errors import OutputConflict
from .plan import BadInput, InputFile, Piece
from .store import join, read_json, write_json

FORMAT = "tokenshards/1"
MANIFEST = "manifest.json"
TOTAL_KEYS = ("rows", "docs", "tokens", "skipped_null", "skipped_empty")


def part_stem(index: int) -> str:
    return f"parts/part-{index:05d}"


def tokens_file(index: int) -> str:
    return f"{part_stem(index)}.tokens.npy"


def docs_file(index: int) -> str:
    return f"{part_stem(index)}.docs.parquet"


def done_file(index: int) -> str:
    return f"{part_stem(index)}.done.json"


def job_identity(*, encoding: dict, encoding_fingerprint: str, eot_position: str, text_column: str,
                 id_column: str | None, partition_bytes: int, inputs: list[dict]) -> dict:
    """What decides the bytes of every part file. Two runs may share OUT iff this is equal."""
    return {
        "format": FORMAT,
        "encoding": encoding,
        "encoding_sha256": encoding_fingerprint,
        "eot_position": eot_position,
        "text_column": text_column,
        "id_column": id_column,
        "partition_bytes": partition_bytes,
        "inputs": inputs,
    }


def identity_hash(identity: dict) -> str:
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()


def partition_entry(piece: Piece, *, docs: int, skipped_null: int, skipped_empty: int, tokens: int, sha256: str) -> dict:
    """A manifest ``partitions`` entry: also the body of the partition's done record."""
    return {
        "index": piece.index,
        "input": piece.input,
        "row_groups": list(piece.row_groups),
        "rows": piece.rows,
        "docs": docs,
        "skipped_null": skipped_null,
        "skipped_empty": skipped_empty,
        "tokens": tokens,
        "tokens_file": tokens_file(piece.index),
        "docs_file": docs_file(piece.index),
        "sha256": sha256,
    }


def done_record(entry: dict, job: str) -> dict:
    return {**entry, "job": job}


def committed_entries(fs: fsspec.AbstractFileSystem, root: str, *, job: str, pieces: list[Piece]) -> dict[int, dict]:
    """Partitions an earlier run of the *same* job committed (their done record exists).

    A done record of another job means OUT holds a different run: refuse, saying what differs.
    """
    by_index = {p.index: p for p in pieces}
    found: dict[int, dict] = {}
    for path in sorted(fs.glob(join(root, "parts", "part-*.done.json"))):
        record = read_json(fs, path)
        if record.get("job") != job:
            raise OutputConflict(
                f"{path} was written by a different run (other inputs or options); "
                "use another --out, or pass --overwrite to replace it"
            )
        piece = by_index.get(record["index"])
        if piece is None or record["input"] != piece.input or record["row_groups"] != list(piece.row_groups):
            raise OutputConflict(f"{path} does not match this run's partition plan; pass --overwrite to replace it")
        found[record["index"]] = {k: v for k, v in record.items() if k != "job"}
    return found


def describe_conflict(old: dict, new: dict) -> str:
    """Which top-level identity keys differ, for a one-line refusal."""
    keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
    return ", ".join(keys) if keys else "nothing visible"


def build_manifest(*, identity: dict, files: list[InputFile], skipped: list[BadInput], entries: list[dict],
                   extra: dict | None = None) -> dict:
    entries = sorted(entries, key=lambda e: e["index"])
    totals = {k: sum(int(e[k]) for e in entries) for k in TOTAL_KEYS}
    manifest = {
        "format": FORMAT,
        "encoding": identity["encoding"],
        "eot_position": identity["eot_position"],
        "text_column": identity["text_column"],
        "id_column": identity["id_column"],
        "inputs": [{"path": f.url, "name": f.name, "rows": f.rows, "bytes": f.bytes} for f in files],
        "partitions": entries,
        "totals": totals,
        "job": identity_hash(identity),
        "encoding_sha256": identity["encoding_sha256"],
        "partition_bytes": identity["partition_bytes"],
    }
    if skipped:
        manifest["skipped_inputs"] = [{"path": b.url, "reason": b.reason} for b in skipped]
    if extra:
        manifest.update(extra)
    return manifest


def write_manifest(fs: fsspec.AbstractFileSystem, root: str, manifest: dict) -> None:
    write_json(fs, join(root, MANIFEST), manifest)


def read_manifest(fs: fsspec.AbstractFileSystem, root: str) -> dict:
    return read_json(fs, join(root, MANIFEST))
