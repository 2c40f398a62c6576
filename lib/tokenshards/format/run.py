"""The one reader of a run in storage: every command (tokenize's resume and ``--add``, verify,
inspect, export, publish) and ``TokenDataset`` read OUT's records and files through here, and
nothing here trusts what it reads.

- A record (manifest, job file, done record) is read only when it is a regular file inside OUT
  (``paths``), no larger than its kind may be, and parsed bounded (``records.parse_json``) into its
  typed record.
- A tokens (or mask) file is read through its ``.npy`` header, checked exactly against the manifest
  (``arrays.header_problem``: dtype and byte order, one dimension, C order, length, size); a whole
  one also against its sha256 and the vocabulary.
- A docs table is read whole, checked against its sha256 where the run recorded one, and against
  the manifest and its tokens (``docs.docs_problems``) before any row of it is used.
- A finished run's records agree (``check_commit``): its manifest with its job file, each entry with
  its done record.
- A command's destination is neither under a file nor inside a run (``check_destination``).

Anything wrong is ``BadRunFile``: one line naming the file and what is wrong (a ``UserError``:
exit 2); a missing file is ``FileNotFoundError``, for the caller to say what it means.
"""
from __future__ import annotations

import hashlib
import os
import stat
import time
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from ..errors import UserError
from ..namespaces import process_space
from ..storage.lease import LEASE_FILE, held_at
from ..storage.location import Location
from ..storage.store import display_url
from .arrays import NPY_HEAD_PROBE, NpyHeaderError, header_problem, read_npy_header
from .docs import DocsError, docs_problems, parse_docs
from .names import JOB_FILE, MANIFEST, done_file
from .paths import UnsafeFile, file_kind, read_local, read_remote, remote_size
from . import paths
from .records import (RECORD_LIMITS, DoneRecord, JobRecord, JsonError, Manifest, ManifestError, PartitionEntry,
                      _first, done_problems, job_file_problems, parse_json)


class BadRunFile(UserError):
    """One of a run's files that cannot be used, said on one line: the file, what is wrong."""

    def __init__(self, path: str, problem: str, advice: str = ""):
        super().__init__(path, problem, advice)  # all in args: it pickles from a worker to the client

    @property
    def path(self) -> str:
        return self.args[0]

    @property
    def problem(self) -> str:
        return self.args[1]

    def __str__(self) -> str:
        return f"{self.args[0]}: {self.args[1]}" + (f"; {self.args[2]}" if self.args[2] else "")


# -- bytes and records --------------------------------------------------------------------------

def read_bytes(run: Location, relative: str, *, limit: int | None = None) -> bytes:
    """The bytes of ``relative`` (a path inside the run, already checked by ``relative_path_problem``),
    read only when it is a regular file inside OUT. ``FileNotFoundError`` when it is missing."""
    try:
        if run.is_local:
            return read_local(run.root, relative, limit=limit)
        with run.worded(relative, what="cannot read"):  # a store's refusal or outage: its own one line
            return read_remote(run.fs, run.join(relative), limit=limit)
    except UnsafeFile as e:
        raise BadRunFile(run.shown(relative), str(e)) from e
    except FileNotFoundError:
        raise
    except NotADirectoryError as e:
        raise BadRunFile(run.shown(relative), "cannot be reached: a folder on its way is a file") from e
    except OSError as e:
        raise BadRunFile(run.shown(relative), f"cannot be read ({type(e).__name__}: {e.strerror or e})") from e


def read_record(run: Location, relative: str, *, kind: str):
    """A JSON record's value (``kind``: a key of ``records.RECORD_LIMITS``), parsed bounded."""
    raw = read_bytes(run, relative, limit=RECORD_LIMITS[kind])
    try:
        return parse_json(raw)
    except JsonError as e:
        raise BadRunFile(run.shown(relative), str(e)) from e


def read_manifest_json(run: Location):
    """The manifest as JSON, unchecked: for ``verify``, which reports what is wrong rather than
    refusing. ``FileNotFoundError``; ``BadRunFile`` for what is no JSON file to read."""
    return read_record(run, MANIFEST, kind="manifest")


def read_manifest(run: Location, *, bookkeeping: bool = True) -> Manifest:
    """The checked manifest (``Manifest.from_dict``). ``FileNotFoundError``, else ``BadRunFile``."""
    raw = read_manifest_json(run)
    try:
        return Manifest.from_dict(raw, bookkeeping=bookkeeping)
    except ManifestError as e:
        raise BadRunFile(run.shown(MANIFEST), str(e)) from e


def read_job(run: Location) -> JobRecord:
    """The job file (``JobRecord``). ``FileNotFoundError``, else ``BadRunFile``."""
    raw = read_record(run, JOB_FILE, kind="job file")
    try:
        return JobRecord.from_dict(raw)
    except ManifestError as e:
        raise BadRunFile(run.shown(JOB_FILE), str(e)) from e


def read_done(run: Location, relative: str, *, sums: bool = True) -> DoneRecord:
    """One done record (``DoneRecord``). ``FileNotFoundError``, else ``BadRunFile``."""
    return parse_done(run, relative, read_bytes(run, relative, limit=RECORD_LIMITS["done record"]), sums=sums)


def parse_done(run: Location, relative: str, raw: bytes, *, sums: bool = True) -> DoneRecord:
    try:
        return DoneRecord.from_dict(parse_json(raw), where="done record", sums=sums)
    except (JsonError, ManifestError) as e:
        raise BadRunFile(run.shown(relative), str(e)) from e


def read_done_records(run: Location, relatives: list[str], sizes: dict[str, int | None]) -> dict[str, DoneRecord]:
    """Several done records, by path relative to OUT (``sizes``: a listing's sizes). On an object
    store one batched read (s3fs fetches them concurrently, which matters for 10^4 of them), once
    the listing says each is a file no larger than a done record may be."""
    if run.is_local:
        return {rel: read_done(run, rel) for rel in relatives}
    limit = RECORD_LIMITS["done record"]
    for rel in relatives:
        size = sizes.get(rel)
        if size is not None and size > limit:
            raise BadRunFile(run.shown(rel), f"is {size:,} bytes, more than a done record may be ({limit:,})")
    paths_ = {run.join(rel): rel for rel in relatives}
    with run.worded("parts", what="cannot read the done records in"):
        contents = run.fs.cat(list(paths_)) if paths_ else {}
    return {rel: parse_done(run, rel, contents[path][:limit + 1]) for path, rel in paths_.items()}


# -- token arrays ---------------------------------------------------------------------------------

class ArrayFile(NamedTuple):
    """Where a checked ``.npy`` file's values start, and how many bytes it holds."""

    offset: int
    size: int


def check_array(run: Location, relative: str, head: bytes, size: int, *, dtype: str, length: int) -> ArrayFile:
    """A ``.npy`` file's head and size, checked exactly against what the manifest says it holds."""
    try:
        header = read_npy_header(head)
    except NpyHeaderError as e:
        raise BadRunFile(run.shown(relative), f"is not a .npy file ({e})") from e
    problem = header_problem(header, dtype=dtype, length=length, size=size)
    if problem:
        raise BadRunFile(run.shown(relative), problem)
    return ArrayFile(header.offset, size)


def array_file(run: Location, relative: str, *, dtype: str, length: int) -> ArrayFile:
    """Look at a ``.npy`` file's header and size (a few KB read, never the values)."""
    try:
        if run.is_local:
            fd = paths.open_local(run.root, relative)
            try:
                return check_array(run, relative, os.pread(fd, NPY_HEAD_PROBE, 0), os.fstat(fd).st_size,
                                   dtype=dtype, length=length)
            finally:
                os.close(fd)
        path = run.join(relative)
        with run.worded(relative, what="cannot read"):
            size = remote_size(run.fs, path)
            head = run.fs.cat_file(path, start=0, end=min(NPY_HEAD_PROBE, size))
        return check_array(run, relative, head, size, dtype=dtype, length=length)
    except UnsafeFile as e:
        raise BadRunFile(run.shown(relative), str(e)) from e
    except (FileNotFoundError, BadRunFile):
        raise
    except OSError as e:
        raise BadRunFile(run.shown(relative), f"cannot be read ({type(e).__name__}: {e.strerror or e})") from e


def check_values(run: Location, relative: str, raw, *, dtype: str, length: int, sha256: str | None,
                 n_vocab: int | None = None) -> np.ndarray:
    """A whole ``.npy`` file's bytes checked: its sha256 is the one recorded (None: not recorded),
    its header exact, every value below ``n_vocab``. Its values, a view of ``raw``."""
    if sha256 is not None and (found := hashlib.sha256(raw).hexdigest()) != sha256:
        raise BadRunFile(run.shown(relative), f"sha256 {found[:12]}… is not the {sha256[:12]}… its run recorded: "
                         "the file changed after the run", "run `tokenshards verify`, or tokenize the run again")
    offset, _ = check_array(run, relative, bytes(raw[:NPY_HEAD_PROBE]), len(raw), dtype=dtype, length=length)
    values = np.frombuffer(raw, dtype=np.dtype(dtype).newbyteorder("<"), count=length, offset=offset)
    if n_vocab is not None and values.size and int(values.max()) >= n_vocab:
        raise BadRunFile(run.shown(relative), f"holds token id {int(values.max())}, outside the vocabulary "
                         f"(n_vocab {n_vocab})")
    return values


def read_array(run: Location, relative: str, *, dtype: str, length: int, sha256: str | None,
               n_vocab: int | None = None) -> np.ndarray:
    """A whole ``.npy`` file, read and checked (``check_values``)."""
    return check_values(run, relative, read_bytes(run, relative), dtype=dtype, length=length, sha256=sha256,
                        n_vocab=n_vocab)


# -- docs tables ----------------------------------------------------------------------------------

def check_docs(run: Location, entry: PartitionEntry, raw: bytes) -> pa.Table:
    """A docs file's bytes checked against its entry: a parquet file, of the sha256 the run recorded
    (where it did), then every row (``docs.docs_problems``); the table."""
    try:
        table = parse_docs(raw)
    except DocsError as e:
        raise BadRunFile(run.shown(entry.docs_file), str(e), "the output is damaged: run `tokenshards verify`") from e
    if entry.docs_sha256 is not None and (found := hashlib.sha256(raw).hexdigest()) != entry.docs_sha256:
        raise BadRunFile(run.shown(entry.docs_file), f"sha256 {found[:12]}… is not the {entry.docs_sha256[:12]}… its "
                         "run recorded: the file changed after the run",
                         "run `tokenshards verify`, or tokenize the run again")
    problems = docs_problems(table, n_docs=entry.docs, n_tokens=entry.tokens, n_rows=entry.rows)
    if problems:
        raise BadRunFile(run.shown(entry.docs_file), _first(problems), "run `tokenshards verify`")
    return table


def read_docs(run: Location, entry: PartitionEntry) -> pa.Table:
    """A partition's docs table, read whole and checked (``check_docs``)."""
    return check_docs(run, entry, read_bytes(run, entry.docs_file))


def check_done(run: Location, entry: PartitionEntry, *, job: str | None) -> None:
    """The partition's done record says what the manifest's entry says (``records.done_problems``)."""
    name = done_file(entry.index)
    problems = done_problems(entry, read_done(run, name, sums=False), job=job)
    if problems:
        raise BadRunFile(run.shown(name), _first(problems), "run `tokenshards verify`")


def check_partition(run: Location, entry: PartitionEntry, *, dtype: str, n_vocab: int, job: str | None = None,
                    done: bool = False) -> int:
    """Every file of a partition read whole and checked against its entry: its tokens (and mask)
    array (``read_array``: sha256, exact header, ids), its docs table (``read_docs``), with ``done``
    its done record (``check_done``: the manifest's ``job``). What an export must know of every
    file it copies before it writes a byte, and a rerun of every partition it keeps. Returns the
    bytes read."""
    checks = [(entry.tokens_file, lambda: read_array(run, entry.tokens_file, dtype=dtype, length=entry.tokens,
                                                     sha256=entry.sha256, n_vocab=n_vocab))]
    if entry.mask_file:
        checks.append((entry.mask_file, lambda: read_array(run, entry.mask_file, dtype="uint8", length=entry.tokens,
                                                           sha256=entry.mask_sha256, n_vocab=2)))
    checks.append((entry.docs_file, lambda: read_docs(run, entry)))
    if done:
        checks.append((done_file(entry.index), lambda: check_done(run, entry, job=job)))
    for name, check in checks:
        try:
            check()
        except FileNotFoundError as e:
            raise BadRunFile(run.shown(name), "is missing, yet the manifest lists it",
                             "run `tokenshards verify`, or tokenize the run again") from e
    return (entry.tokens_bytes or 0) + (entry.docs_bytes or 0) + (entry.mask_bytes or 0)


# -- where a command may write ---------------------------------------------------------------------

def check_destination(location: Location, option: str, *, may_be_a_run: bool = False) -> None:
    """One line, before anything is read or written, when ``location`` cannot be a command's
    destination (``option``: how the command names it): it lies under a file (``--to
    some.parquet/sub``), or inside a tokenshards run (a folder above it holds a run's job file, its
    manifest beside ``parts/``, or committed partitions), whose files it would join: that run would
    no longer verify. ``may_be_a_run``: the folder itself may hold a run (``tokenize --out``: its own,
    to resume). Local folders are compared once every symlink is resolved."""
    shown = f"{option} {location.url}"
    real = os.path.realpath(location.root) if location.is_local else location.root.rstrip("/")
    for folder, is_file in _folders_up(location, real):
        named = folder if location.is_local else display_url(location.fs, folder)
        if is_file:
            if folder == real:
                raise UserError(f"{shown}: is an existing file, not a folder; choose a folder (it is made if missing)")
            what = "output" if option == "--out" else option  # as ensure_writable says it of an --out
            raise UserError(f"cannot write to {what} {location.url!r}: {named} is a file, not a folder, so nothing can "
                            f"be written under it; choose another {option}")
        if folder == real and may_be_a_run:
            continue
        why = _holds_a_run(location, folder)
        if why:
            where = "is the run" if folder == real else "is inside the run"
            raise UserError(f"{shown}: {where} in {named}{_live_writer(location, folder)} (it holds {why}); its files "
                            "would mix with that run's and it would no longer verify: choose a folder outside it")


def _folders_up(location: Location, folder: str):
    """(folder, whether it is a file) from ``folder`` up to the root of its filesystem (a bucket on
    object stores), those that exist."""
    while True:
        try:
            if location.is_local:
                if os.path.exists(folder):
                    yield folder, not os.path.isdir(folder)
            elif location.fs.exists(folder):
                yield folder, location.fs.isfile(folder)
        except Exception:  # noqa: BLE001 -- unreachable, credentials refused (a store's own errors are no OSError):
            pass  # the command's first write says so, in its own words (Location.ensure_writable, check_bucket)
        parent = os.path.dirname(folder) if location.is_local else folder.rsplit("/", 1)[0]
        if not parent or parent == folder or (not location.is_local and "/" not in folder):
            return
        folder = parent


def _live_writer(location: Location, folder: str) -> str:
    """", being written by ..." when a live run holds the lease of ``folder`` (``storage.lease``), else ""."""
    path = os.path.join(folder, LEASE_FILE) if location.is_local else f"{folder}/{LEASE_FILE}"
    try:
        held = held_at(location.fs, path)
    except (OSError, ValueError):
        return ""
    now = time.time()
    return f", being written by {held.describe(now)}" if held and not held.is_stale(now, space=process_space()) else ""


def _holds_a_run(location: Location, folder: str) -> str | None:
    """What in ``folder`` says a tokenshards run is there, or None. A lone ``manifest.json`` (a web
    app's, say) is not enough: a run's sits beside ``parts/``."""
    fs = location.fs
    inside = os.path.join if location.is_local else (lambda *parts: "/".join(parts))
    try:
        if fs.exists(inside(folder, JOB_FILE)):
            return JOB_FILE
        if fs.isdir(inside(folder, "parts")):
            if fs.exists(inside(folder, MANIFEST)):
                return f"{MANIFEST} and parts/"
            if fs.glob(inside(folder, "parts", "part-*.done.json")):
                return "committed partitions in parts/"
    except Exception:  # noqa: BLE001 -- as in _folders_up: the first write says what is wrong with the store
        return None
    return None


# -- a finished run -------------------------------------------------------------------------------

def local_file_problems(run: Location, manifest: Manifest) -> list[str]:
    """Where OUT is a local folder: every file the manifest lists that exists must be a regular
    file inside OUT once symlinks are followed (a FIFO would hang whoever opens it, a symlink
    could lead into another run or the system). Only ``lstat``/``stat``, never an open; a missing
    file is left to whoever reads it. Paths already passed ``relative_path_problem``."""
    if not run.is_local:
        return []
    root = run.root
    base = os.path.realpath(root)
    inside = base.rstrip(os.sep) + os.sep
    folders: dict[str, bool] = {}
    problems = []
    for e in manifest.by_index():
        files = (("tokens_file", e.tokens_file), ("docs_file", e.docs_file), ("done record", done_file(e.index)),
                 *((("mask_file", e.mask_file),) if e.mask_file else ()))
        for key, rel in files:
            path = os.path.join(root, rel)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as err:
                problems.append(f"partition {e.index}: {key} {rel!r} cannot be looked at ({type(err).__name__}: {err})")
                continue
            folder = os.path.dirname(rel)
            if folder not in folders:
                folders[folder] = (os.path.realpath(os.path.join(root, folder)) + os.sep).startswith(inside)
            if stat.S_ISLNK(info.st_mode):
                real = os.path.realpath(path)
                if not real.startswith(inside):
                    problems.append(f"partition {e.index}: {key} {rel!r} is a symlink to {real}, outside OUT")
                    continue
                try:
                    info = os.stat(real)
                except OSError:
                    continue  # a dangling link reads as missing
            elif not folders[folder]:
                problems.append(f"partition {e.index}: {key} {rel!r} lies outside OUT (its folder is a symlink)")
                continue
            if not stat.S_ISREG(info.st_mode):
                problems.append(f"partition {e.index}: {key} {rel!r} is not a regular file "
                                f"({file_kind(info.st_mode)}); it is not opened")
    return problems


class FinishedRun(NamedTuple):
    """A finished run, opened: where it is and its checked manifest."""

    location: Location
    manifest: Manifest


def open_finished(out: str, storage_options: dict | None = None) -> FinishedRun:
    """A finished run; anything else is a one-line ``UserError``."""
    run = Location.at(out, storage_options)
    refuse_a_file(run)
    try:
        manifest = read_manifest(run)
    except FileNotFoundError as e:
        raise UserError(not_a_run(run) or
                        f"{out}: no {MANIFEST}; not a finished tokenshards run (is `tokenshards tokenize` still "
                        "running, or was it interrupted? rerun the same command to finish it)") from e
    except BadRunFile as e:
        if e.problem.startswith(("format ", "is not", "is a symlink", "lies outside", "cannot be")):
            raise
        if e.problem.startswith(("not valid JSON", "nested")):
            raise BadRunFile(e.path, e.problem, "rerun `tokenshards tokenize` to rewrite it") from e
        raise BadRunFile(e.path, e.problem, f"run `tokenshards verify {out}`") from e
    problems = local_file_problems(run, manifest)
    if problems:
        raise UserError(f"{run.shown(MANIFEST)}: {_first(problems)}; run `tokenshards verify {out}`")
    check_commit(run, manifest, done_records=run.is_local)
    return FinishedRun(run, manifest)


def commit_problems(run: Location, manifest: Manifest) -> list[str]:
    """What the run's job file says against its manifest (``records.job_file_problems``), each
    naming the file; nothing when there is no job file (a finished folder may be copied without it)."""
    try:
        job = read_job(run)
    except FileNotFoundError:
        return []
    except BadRunFile as e:
        return [f"{JOB_FILE}: {e.problem}"]
    return [f"{JOB_FILE}: {p}" for p in job_file_problems(manifest, job)]


def check_commit(run: Location, manifest: Manifest, *, done_records: bool) -> None:
    """Refuse a finished run whose records disagree: the manifest and the job file written from the
    same job identity (``commit_problems``), and with ``done_records`` each partition's entry and
    its done record (locally, where reading them all costs little; an export checks each on the
    cluster, ``check_partition``)."""
    problems = commit_problems(run, manifest)
    if problems:
        raise UserError(f"{run.url}/{problems[0]}; one of them was changed after the run: run `tokenshards verify "
                        f"{run.url}`")
    if done_records:
        for entry in manifest.by_index():
            try:
                check_done(run, entry, job=manifest.done_job())
            except FileNotFoundError as e:
                raise BadRunFile(run.shown(done_file(entry.index)), "is missing, yet the manifest lists the partition",
                                 "run `tokenshards verify`") from e


def refuse_a_file(run: Location) -> None:
    """A run is a folder: a file named instead (``verify RUN/manifest.json``) is said in one line."""
    try:
        is_file = os.path.isfile(run.root) if run.is_local else run.fs.isfile(run.root)
    except OSError:
        return  # an unreachable store: the reading that follows says so
    if is_file:
        raise UserError(f"{run.url}: is a file, not a run's folder; pass the folder that holds {MANIFEST} "
                        "(the tokenize run's --out)")


def not_a_run(run: Location) -> str | None:
    """The one-line reason when ``run`` (which has no manifest.json) holds no tokenshards run at
    all, or one that stopped before committing anything; None when it holds an unfinished run
    that a rerun resumes (its job file, or a committed partition, is there)."""
    start = f"{run.url}: no manifest.json; not a finished tokenshards run"
    advice = "pass the --out folder of a `tokenshards tokenize` run"
    if not run.exists():
        return f"{start} (there is no such folder: check the path, or {advice})"
    if run.exists(JOB_FILE):
        return None
    if run.exists("parts"):
        # Without a job file, a parts/ holding no done record is what a run that failed before its
        # first partition (unknown encoding, missing column) leaves: there is nothing to resume.
        try:
            if run.glob("parts", "part-*.done.json"):
                return None
        except OSError:
            return None
        return (f"{start}: parts/ holds no committed partition and there is no {JOB_FILE}, so there is nothing "
                "to check or resume: a tokenize run there stopped (or is still starting) before its first "
                "partition; fix what it reported and run it again")
    return _not_a_run_at_all(run, start, advice)


def _not_a_run_at_all(run: Location, start: str, advice: str) -> str:
    looks_like = ""
    try:  # one listing of the folder itself: cheap even when it is a large input prefix
        if run.glob("*.parquet"):
            looks_like = "; it holds parquet files, like an input folder"
    except OSError:
        pass
    return f"{start} (not a tokenshards output at all: no parts/, no {JOB_FILE}{looks_like}; {advice})"
