"""Format v1: file names, done records, resume, and the manifest written last (DESIGN.md)."""
from __future__ import annotations

import hashlib
import json

import fsspec

from ..errors import OutputConflict, UserError
from ..tokenize.plan import BadInput, InputFile, Piece
from ..storage.store import filesystem, join, read_json, write_json

FORMAT = "tokenshards/1"
MANIFEST = "manifest.json"
JOB_FILE = "tokenshards-job.json"
"""What the run in OUT was asked to do; written before the first partition, so a rerun with
other inputs or options can say exactly what differs."""
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


def partition_entry(piece: Piece, *, docs: int, skipped_null: int, skipped_empty: int, tokens: int, sha256: str,
                    backend: str = "") -> dict:
    """A manifest ``partitions`` entry: also the body of the partition's done record."""
    entry = {
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
    if backend:
        entry["backend"] = backend
    return entry


def done_record(entry: dict, job: str) -> dict:
    return {**entry, "job": job}


def committed_entries(fs: fsspec.AbstractFileSystem, root: str, *, job: str, pieces: list[Piece]) -> dict[int, dict]:
    """Partitions an earlier run of the *same* job committed (their done record exists).

    A done record of another job means OUT holds a different run: refuse, saying what differs.
    """
    by_index = {p.index: p for p in pieces}
    found: dict[int, dict] = {}
    paths = sorted(fs.glob(join(root, "parts", "part-*.done.json")))
    # One batched read: s3fs fetches the records concurrently, which matters for 10^4 of them.
    contents = fs.cat(paths) if paths else {}
    for path in paths:
        record = json.loads(contents[path])
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
    """What differs between two job identities, in a few words for a one-line refusal."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key == "inputs" or old.get(key) == new.get(key):
            continue
        changes.append(f"{key} {old.get(key)!r} → {new.get(key)!r}")
    old_inputs = {i["path"]: i for i in old.get("inputs", [])}
    new_inputs = {i["path"]: i for i in new.get("inputs", [])}
    added = len(new_inputs.keys() - old_inputs.keys())
    removed = len(old_inputs.keys() - new_inputs.keys())
    changed = sum(1 for k in old_inputs.keys() & new_inputs.keys() if old_inputs[k] != new_inputs[k])
    if added or removed or changed:
        changes.append(f"inputs ({added} added, {removed} removed, {changed} changed in size or rows)")
    return "; ".join(changes) or "nothing visible"


def claim_output(fs: fsspec.AbstractFileSystem, root: str, identity: dict, *, url: str) -> None:
    """Record this job in OUT, or refuse when OUT already holds a different one."""
    path = join(root, JOB_FILE)
    if fs.exists(path):
        old = read_json(fs, path)
        if old != identity:
            raise OutputConflict(f"{url} already holds a different run ({describe_conflict(old, identity)}); "
                                 "use another --out, or pass --overwrite to replace it")
        return
    if fs.exists(join(root, MANIFEST)) or fs.glob(join(root, "parts", "part-*.done.json")):
        raise OutputConflict(f"{url} already holds output that is not this run's; use another --out, or pass --overwrite to replace it")
    write_json(fs, path, identity)


def remove_run(fs: fsspec.AbstractFileSystem, root: str) -> None:
    """Everything a run writes in OUT (``--overwrite``); other files there are left alone."""
    for name in (MANIFEST, JOB_FILE, "parts"):
        path = join(root, name)
        if fs.exists(path):
            fs.rm(path, recursive=True)


def remove_stale_temporaries(fs: fsspec.AbstractFileSystem, root: str) -> int:
    """Temporary files of writers that died (a killed worker); a rerun rewrites their parts."""
    stale = fs.glob(join(root, "parts", "*.tmp"))
    for path in stale:
        fs.rm(path)
    return len(stale)


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
        manifest["skipped_inputs"] = [_skipped_entry(b) for b in skipped]
    if extra:
        manifest.update(extra)
    # Which tokenizers wrote the partitions: a resumed run's earlier partitions keep theirs.
    used = sorted({e["backend"] for e in entries if e.get("backend")})
    if used:
        manifest["backend"] = ", ".join(used)
    return manifest


def _skipped_entry(bad: BadInput) -> dict:
    entry = {"path": bad.url, "reason": bad.reason}
    if bad.partition is not None:
        entry.update(partition=bad.partition, row_groups=list(bad.row_groups))
    return entry


def write_manifest(fs: fsspec.AbstractFileSystem, root: str, manifest: dict) -> None:
    write_json(fs, join(root, MANIFEST), manifest)


def read_manifest(fs: fsspec.AbstractFileSystem, root: str) -> dict:
    return read_json(fs, join(root, MANIFEST))


def open_finished(out: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str, dict]:
    """(fs, root, manifest) of a finished run; anything else is a one-line ``UserError``."""
    fs, root = filesystem(out, storage_options)
    path = join(root, MANIFEST)
    try:
        manifest = read_manifest(fs, root)
    except FileNotFoundError as e:
        raise UserError(f"{out}: no {MANIFEST}; not a finished tokenshards run (is `tokenshards tokenize` still "
                        "running, or was it interrupted? rerun the same command to finish it)") from e
    except ValueError as e:
        raise UserError(f"{path}: not valid JSON ({e}); rerun `tokenshards tokenize` to rewrite it") from e
    if manifest.get("format") != FORMAT:
        raise UserError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT!r}")
    return fs, root, manifest
