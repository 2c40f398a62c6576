"""Which partitions a rerun may keep: the job identity claimed in OUT, the done records that
commit partitions, and clearing what killed or replaced runs left. The format itself (names,
entries, manifest) is ``format.v1``; this module only decides what of OUT belongs to this job."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Callable

from ..errors import OutputConflict, UserError
from ..format import run as run_files
from ..format import v1
from ..format.v1 import InputRecord, PartitionEntry
from ..storage.location import Location
from ..wording import counted
from ..corpus.plan import Piece

JOB_FILE = v1.JOB_FILE


def job_identity(*, encoding: dict, encoding_fingerprint: str, eot_position: str, text_column: str,
                 id_column: str | None, partition_bytes: int, inputs: list[dict]) -> dict:
    """What decides the bytes of every part file. Two runs may share OUT iff this is equal."""
    return {
        "format": v1.FORMAT,
        "encoding": encoding,
        "encoding_sha256": encoding_fingerprint,
        "eot_position": eot_position,
        "text_column": text_column,
        "id_column": id_column,
        "partition_bytes": partition_bytes,
        "inputs": inputs,
    }


def identity_hash(identity: dict) -> str:
    """The job hash in done records and the manifest. Inputs' file identities (mtime, ETag) are left
    out: they guard a rerun through ``claim_output``, and leaving them out keeps the hash (and the
    bytes of done records) what runs made before they were recorded have."""
    return hashlib.sha256(json.dumps(_without_file_identities(identity), sort_keys=True).encode()).hexdigest()


def _without_file_identities(identity: dict) -> dict:
    return {**identity, "inputs": [dataclasses.replace(i, identity=None).to_dict() for i in recorded_inputs(identity)]}


def recorded_inputs(identity: dict, *, url: str = "OUT") -> tuple[InputRecord, ...]:
    """A job identity's inputs (this run's, or the one OUT's job file records), as records."""
    try:
        return InputRecord.all_from(identity.get("inputs", []), where=f"{JOB_FILE} inputs")
    except v1.ManifestError as e:
        raise OutputConflict(f"{url}/{JOB_FILE}: {e}; pass --overwrite to replace it") from e


def committed_entries(out: Location, *, job: str, pieces: list[Piece], redo: list[str] | None = None,
                      kept: dict[int, PartitionEntry] | None = None, client=None,
                      encoding: dict | None = None) -> dict[int, PartitionEntry]:
    """Partitions an earlier run of the *same* job committed: their done record exists and so do
    their tokens and docs files, at the sizes the record gives (one listing of ``parts/``, not a
    HEAD per file). A committed partition whose files are gone or resized is left out, to be
    redone; why goes to ``redo``. With ``client`` (and the run's ``encoding`` block), every
    partition kept is also read back on the cluster and checked as any reader checks it
    (``format.run.check_partition``: sha256, exact ``.npy`` header, ids, docs table): one whose
    bytes are not those its record names is redone too, never kept.

    A done record of another job means OUT holds a different run: refuse, saying what differs.
    ``kept``: the partitions of the finished run a growth adds to (``tokenize --add``); their
    records must be those entries and their files whole, since their inputs are not read again.
    """
    kept = kept or {}
    by_index = {p.index: p for p in pieces}
    found: dict[int, PartitionEntry] = {}
    fs = out.fs
    listing = fs.find(out.join("parts"), detail=True) if out.exists("parts") else {}
    sizes = {_relative(out.root, path): info.get("size") for path, info in listing.items()}
    done = sorted(rel for rel in sizes if rel.endswith(".done.json") and rel.rsplit("/", 1)[-1].startswith("part-"))
    try:  # each a regular file inside OUT, of a done record's size, parsed bounded (format.run)
        records = run_files.read_done_records(out, done, sizes)
    except run_files.BadRunFile as e:
        raise OutputConflict(f"{e}; pass --overwrite to replace it") from e
    growth_kept: dict[int, tuple[PartitionEntry, str]] = {}
    for rel in done:
        path, record = out.shown(rel), records[rel]
        if record.job != job:
            raise OutputConflict(
                f"{path} was written by a different run (other inputs or options); "
                "use another --out, or pass --overwrite to replace it"
            )
        entry = record.entry
        if (misnamed := _names_problem(entry, rel)) is not None:
            raise OutputConflict(f"{path}: {misnamed}; pass --overwrite to replace it")
        if entry.index in kept:
            _check_kept(entry, kept[entry.index], _files_problem(entry, sizes), path=path, url=out.url)
            growth_kept[entry.index] = (entry, path)
            continue
        piece = by_index.get(entry.index)
        if (piece is None or entry.input != piece.input or entry.row_groups != tuple(piece.row_groups)
                or entry.rows != piece.rows):
            raise OutputConflict(f"{path} does not match this run's partition plan; pass --overwrite to replace it")
        problem = _files_problem(entry, sizes) or (
            f"its done record holds keys this version does not write ({', '.join(sorted(entry.extra))})"
            if entry.extra else None)  # nothing could vouch for them: the partition is written again
        if problem:
            if redo is not None:
                redo.append(f"partition {entry.index}: {problem}; redoing it")
            continue
        found[entry.index] = entry
    if client is not None and encoding is not None:
        checked = _check_contents(client, out, [*found.values(), *(e for e, _ in growth_kept.values())], encoding)
        for index, (problem, docs_sha256) in checked.items():
            if problem is not None:
                if index in growth_kept:
                    entry, path = growth_kept[index]
                    _check_kept(entry, entry, problem, path=path, url=out.url)
                found.pop(index, None)
                if redo is not None:
                    redo.append(f"partition {index}: {problem}; redoing it")
            elif index in found:
                found[index] = _completed(out, found[index], sizes, docs_sha256=docs_sha256, job=job)
    return found


def _completed(out: Location, entry: PartitionEntry, sizes: dict[str, int | None], *, docs_sha256: str,
               job: str) -> PartitionEntry:
    """A kept partition's entry with what its files were just checked to be, where its done record
    lacks it (a record of a version that wrote no sizes or docs hash): its done record is written
    again, so that the run's records say what a run of this version says. Its files are untouched."""
    filled = dataclasses.replace(
        entry, tokens_bytes=entry.tokens_bytes if entry.tokens_bytes is not None else sizes.get(entry.tokens_file),
        docs_bytes=entry.docs_bytes if entry.docs_bytes is not None else sizes.get(entry.docs_file),
        docs_sha256=entry.docs_sha256 or docs_sha256,
        mask_bytes=entry.mask_bytes if entry.mask_bytes is not None or not entry.mask_file else sizes.get(entry.mask_file))
    if filled != entry:
        out.write_atomic(v1.done_file(entry.index), v1.DoneRecord(entry=filled, job=job).to_bytes())
    return filled


def _names_problem(entry: PartitionEntry, relative: str) -> str | None:
    """A done record names its own partition's files, and is itself named after it: one that names
    another partition's files would commit them twice."""
    want = {"tokens_file": v1.tokens_file(entry.index), "docs_file": v1.docs_file(entry.index),
            "mask_file": v1.mask_file(entry.index) if entry.mask_file is not None else None}
    wrong = [f"{k} {getattr(entry, k)!r}" for k, v in want.items() if getattr(entry, k) != v]
    if relative != v1.done_file(entry.index):
        wrong.insert(0, f"index {entry.index}")
    return f"names {', '.join(wrong)}, not its own partition's files" if wrong else None


def check_committed(entry: PartitionEntry, *, out: str, storage_options: dict, dtype: str,
                    n_vocab: int) -> tuple[str | None, str | None]:
    """Worker task: (why a committed partition's files cannot be kept, or None; its docs file's
    sha256): each read back whole and checked as every reader checks them
    (``format.run.check_partition``)."""
    run = Location.at(out, storage_options)
    try:
        run_files.check_partition(run, entry, dtype=dtype, n_vocab=n_vocab)
        docs = entry.docs_sha256 or hashlib.sha256(run_files.read_bytes(run, entry.docs_file)).hexdigest()
    except run_files.BadRunFile as e:  # names the file and what is wrong
        return f"{e.path.rsplit('/', 1)[-1]} {e.problem}", None
    except FileNotFoundError:
        return f"{entry.docs_file} is missing", None
    return None, docs


def _check_contents(client, out: Location, entries: list[PartitionEntry],
                    encoding: dict) -> dict[int, tuple[str | None, str | None]]:
    """{index: (problem or None, docs sha256)} of the ``entries``, checked on the cluster (one task
    per partition: each reads its files once)."""
    if not entries:
        return {}
    from ..cluster import runner  # here: Dask, for the command that already runs on it

    futures = runner.submit(client, check_committed, entries, out=out.task_url, storage_options=out.storage_options,
                            dtype=encoding["dtype"], n_vocab=encoding["n_vocab"])
    results = runner.gather(client, futures, entries,
                            explain=runner.failure(lambda e: f"checking committed partition {e.index}"))
    return {e.index: r for e, r in zip(entries, results)}


def _check_kept(entry: PartitionEntry, want: PartitionEntry, problem: str | None, *, path: str, url: str) -> None:
    """A partition of the run a growth keeps: never redone (its input is not read again)."""
    if entry != want:
        problem = "its done record differs from the manifest's entry"
    if problem:
        raise OutputConflict(f"{path}: partition {entry.index} of {entry.input}, kept from the run in {url}: "
                             f"{problem}; run `tokenshards verify` on it, or pass --overwrite to tokenize everything again")


def _relative(root: str, path: str) -> str:
    prefix = root.rstrip("/") + "/"
    return path[len(prefix):] if path.startswith(prefix) else path


def _files_problem(entry: PartitionEntry, sizes: dict[str, int | None]) -> str | None:
    """Why a committed partition's files cannot be trusted, or None. Done records from before
    sizes were recorded are checked for presence only."""
    files = [(entry.tokens_file, entry.tokens_bytes), (entry.docs_file, entry.docs_bytes)]
    if entry.mask_file:  # a chat partition's mask is committed with its tokens (the same done record)
        files.append((entry.mask_file, entry.mask_bytes))
    for name, want in files:
        if name not in sizes:
            return f"{name} is missing"
        if want is not None and sizes[name] is not None and sizes[name] != want:
            return f"{name} has {sizes[name]} bytes, its done record says {want}"
    return None


def describe_conflict(old: dict, new: dict) -> str:
    """What differs between two job identities, in a few words for a one-line refusal."""
    changes = []
    for key in sorted(set(old) | set(new)):
        if key == "inputs" or old.get(key) == new.get(key):
            continue
        if key == "encoding_sha256" and "encoding" in changes_of(old, new):
            continue  # the encoding's own change says it better
        if isinstance(old.get(key), dict) and isinstance(new.get(key), dict):  # the encoding block: what differs in it
            inner = old[key], new[key]
            changes += [f"{key} {k} {_shown(inner[0].get(k))} → {_shown(inner[1].get(k))}"
                        for k in sorted(set(inner[0]) | set(inner[1])) if inner[0].get(k) != inner[1].get(k)]
            continue
        changes.append(f"{key} {old.get(key)!r} → {new.get(key)!r}")
    old_inputs = {i.path: i for i in recorded_inputs(old)}
    new_inputs = {i.path: i for i in recorded_inputs(new)}
    added = len(new_inputs.keys() - old_inputs.keys())
    removed = len(old_inputs.keys() - new_inputs.keys())
    changed = sum(1 for k in old_inputs.keys() & new_inputs.keys() if old_inputs[k] != new_inputs[k])
    if added or removed or changed:
        changes.append(f"inputs ({added} added, {removed} removed, {changed} changed: size, rows or modification)")
    return "; ".join(changes) or "nothing visible"


def changes_of(old: dict, new: dict) -> set[str]:
    return {k for k in set(old) | set(new) if old.get(k) != new.get(k)}


def _shown(value) -> str:
    """A value of the encoding block, short: files by name and the start of their sha256."""
    if isinstance(value, list) and value and all(isinstance(v, dict) and "sha256" in v for v in value):
        return "[" + ", ".join(f"{v.get('name')} {str(v.get('sha256'))[:12]}…" for v in value) + "]"
    return repr(value)


def add_hint(old: dict, new: dict) -> str:
    """When ``new`` is ``old`` with more inputs (the same settings, every old input unchanged): how
    to add them instead (``tokenize --add``, ``tokenize.grow``); else nothing. The partition size
    may differ (an automatic one grows with the corpus): a growth reuses the recorded one."""
    settings = lambda identity: {k: v for k, v in _without_file_identities(identity).items()  # noqa: E731
                                 if k not in ("inputs", "partition_bytes")}
    new_inputs = {i.path: i for i in recorded_inputs(new)}
    old_inputs = recorded_inputs(old)
    if settings(old) != settings(new) or not all(new_inputs.get(i.path) == i for i in old_inputs):
        return ""
    added = len(new_inputs) - len(old_inputs)
    return (f"to add the {counted(added, 'new input')} to it, keeping its partitions, pass --add "
            "(or use another --out, or pass --overwrite to replace it)") if added > 0 else ""


def claim_output(out: Location, identity: dict, *, identity_like: Callable[[str, dict], dict] | None = None,
                 job: str | None = None) -> None:
    """Record this job in OUT, or refuse when OUT already holds a different one.

    ``identity_like(path, recorded)``: an input's file identity now, in the terms ``recorded``
    used (``store.file_identity_like``), for inputs the job file recorded in other terms.
    ``job``: the hash this run's done records carry. Done records without a job file are this
    run's when every one carries it: a run that failed before its first commit removes its job
    file, and a task still running on a cluster it does not own may commit after that."""
    url = out.url
    _check_own_files(out)
    if out.exists(JOB_FILE):
        old = read_job_identity(out)
        if not any(i.identity is not None for i in recorded_inputs(old, url=url)):
            identity = _without_file_identities(identity)  # recorded by a version that kept no file identities
        elif identity_like is not None and old != identity:
            restated = _in_terms_of(old, identity, identity_like)
            if restated == old:
                # The same files, recorded from now on as this version sees them (etag, not mtime), so
                # that one huggingface_hub fetches again (same etag, new mtime) still resumes.
                out.write_json(JOB_FILE, identity)
                return
            identity = restated
        if old != identity:
            raise OutputConflict(f"{url} already holds a different run ({describe_conflict(old, identity)}); "
                                 + (add_hint(old, identity) or "use another --out, or pass --overwrite to replace it"))
        return
    done = out.glob("parts", "part-*.done.json")
    if out.exists(v1.MANIFEST) or (done and not (job is not None and _all_written_by(out, done, job))):
        raise OutputConflict(f"{url} already holds output that is not this run's; use another --out, or pass --overwrite to replace it")
    out.write_json(JOB_FILE, identity)


def _check_own_files(out: Location) -> None:
    """What a run writes in a local OUT is of the kind it writes: ``parts/`` a folder inside OUT
    (a symlink would send every part file elsewhere, into another run perhaps), ``manifest.json``
    and the job file not folders (the commit would fail after all the work)."""
    if not out.is_local:
        return
    parts = out.join("parts")
    if os.path.islink(parts) or (os.path.lexists(parts) and not os.path.isdir(parts)):
        raise OutputConflict(f"{out.shown('parts')}: is {'a symlink' if os.path.islink(parts) else 'not a folder'}; a "
                             "run writes its part files in a folder of its own: remove it, or pass --overwrite")
    for name in (v1.MANIFEST, JOB_FILE):
        if os.path.isdir(out.join(name)) and not os.path.islink(out.join(name)):
            raise OutputConflict(f"{out.shown(name)}: is a folder, not the run's {name}: remove it, or pass --overwrite")


def _all_written_by(out: Location, done: list[str], job: str) -> bool:
    """Whether each of the ``done`` records in OUT is one that ``job`` wrote (``format.run``: each a
    regular file inside OUT, read bounded)."""
    relatives = [_relative(out.root, path) for path in done]
    try:
        records = run_files.read_done_records(out, relatives, {})
        return all(records[rel].job == job for rel in relatives)
    except (UserError, OSError, KeyError):  # unreadable or not a done record: not provably this run's
        return False


def read_job_identity(out: Location) -> dict:
    """The job identity OUT's job file records, read as every record is (``format.run.read_job``:
    a regular file inside OUT, bounded, checked by ``records.job_problems``). ``FileNotFoundError``
    when there is none; ``OutputConflict`` naming the file and the problem for anything else."""
    try:
        return run_files.read_job(out).identity
    except run_files.BadRunFile as e:
        raise OutputConflict(f"{e}; pass --overwrite to replace it (or use another --out)") from e


def _in_terms_of(old: dict, identity: dict, identity_like: Callable[[str, dict], dict]) -> dict:
    """``identity`` with each input's file identity restated in the terms the job file ``old``
    recorded it in, where they differ: a file in a download folder that a version before
    huggingface_hub's download records were trusted recorded by mtime, and this one by etag."""
    recorded = {i.path: i.identity for i in recorded_inputs(old) if i.identity is not None}

    def restated(i: InputRecord) -> dict:
        before = recorded.get(i.path)
        if before is None or i.identity is None or set(before) == set(i.identity):
            return i.to_dict()
        try:
            return dataclasses.replace(i, identity=identity_like(i.path, before)).to_dict()
        except FileNotFoundError:
            return i.to_dict()  # not here (yet): it differs from the record, as the identity says

    return {**identity, "inputs": [restated(i) for i in recorded_inputs(identity)]}


def remove_run(out: Location) -> None:
    """Everything a run writes in OUT (``--overwrite``, under OUT's lease); other files there are left alone."""
    for name in (v1.MANIFEST, JOB_FILE, "parts"):
        try:
            if out.exists(name):
                out.fs.rm(out.join(name), recursive=True)
        except OSError as e:  # a straggling writer (a worker of a dead client) adding files meanwhile
            raise UserError(f"--overwrite could not remove {out.url}/{name} ({type(e).__name__}: {e}); "
                            "is something else still writing there? rerun once it stopped") from e


def remove_stale_temporaries(out: Location) -> int:
    """Temporary files of writers that died (a killed worker); a rerun rewrites their parts."""
    stale = out.glob("parts", "*.tmp")
    for path in stale:
        out.fs.rm(path)
    return len(stale)
