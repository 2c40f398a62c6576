"""``export ... --to hf://datasets/ORG/NAME[/DIR]``: an export, published as a Hub dataset repo.

1. Before any work, one line each on failure: a token, one the Hub accepts, the repo (created
   only with ``--create-repo``), write access (``storage.hubrepo``).
2. The ordinary export job writes into a local staging folder (``--staging``; default
   ``HF_HOME/tokenshards/publish/...`` on the client's machine: its workers write there, so on a
   cluster of several machines it must be a folder every worker sees; the export's same-view
   check says so). A stamp written after the export says which export it holds, so a rerun of the
   same command uploads it again without exporting again.
3. Upload with huggingface_hub's ``HfApi.create_commit``, ``commit_files`` shards a commit, files
   given by path (huggingface_hub streams each from disk: nothing here reads a shard whole), then
   the export record and the dataset card in the last commit, so a repo with a card is complete.

Why ``create_commit`` in batches (read in huggingface_hub 2.4's source): ``upload_large_folder``
is gone; ``upload_folder`` is one commit of everything unless hf_xet is installed. Each
``create_commit`` asks ``preupload`` what the Hub holds and drops files whose remote oid equals
theirs, and the LFS batch API gives no upload action for an object the Hub already has, even one
never committed: so a rerun sends neither the committed files nor the ones uploaded before an
interruption, and the Hub itself is the record of what was committed. The same call uses hf_xet's
protocol when hf_xet is installed (deduplicated chunks resume the same way) and the LFS basic
transfer (PUT, then verify) when it is not or ``HF_HUB_DISABLE_XET=1``. huggingface_hub retries
429/5xx on each PUT and preupload; its commit POST it does not retry, so each batch's
``create_commit`` is retried here (safe: a retry after a lost answer finds the files committed).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import json
import os
import posixpath
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..cluster.progress import draws_bars
from ..errors import UserError
from ..format.export_record import ExportRecord, ExportRecordError
from ..format.paths import UnsafeFile, local_look, read_local
from ..format.reader import open_manifest
from ..format.records import RECORD_LIMITS, parse_json
from ..format.run import read_record
from ..storage import hubrepo
from ..storage.hubrepo import HubDestination
from ..storage.location import Location
from ..wording import counted, human
from . import card as cards
from . import formats
from .command import ExportConfig, ExportSummary, run_export

COMMIT_FILES = 50
"""Shards per commit: 50 llm.c shards of 100 M tokens are 10 GB, well under what one Hub commit
takes, and a failed commit loses little."""
STAMP = ".tokenshards-publish.json"
HASH_CHUNK = 8 * 2**20
"""Bytes read at a time to hash a file (huggingface_hub reads its own copy the same way)."""
CARD = "README.md"


@dataclass(frozen=True, kw_only=True)
class PublishConfig:
    """An export (its ``to`` the hf:// URL) and how it reaches the Hub."""

    export: ExportConfig
    staging: str | None = None
    """A local folder for the export before upload; None: under HF_HOME (``default_staging``)."""
    create_repo: bool = False
    private: bool = False
    """With create_repo: the new repo is private."""
    endpoint: str | None = None
    """None: HF_ENDPOINT, as huggingface_hub read it at import."""
    commit_files: int = COMMIT_FILES
    retries: int = 5
    backoff: float = 1.0
    """Seconds before the first retry of a transient error; doubles each time, at most 60 s."""

    def __post_init__(self):
        HubDestination.parse(self.export.to)  # validates
        if self.private and not self.create_repo:
            raise UserError("--private applies to the repo --create-repo makes; an existing repo keeps its visibility")
        if self.staging is not None and not Location.at(self.staging).is_local:
            raise UserError(f"--staging {self.staging!r} must be a local folder (huggingface_hub uploads from disk)")
        if self.commit_files < 1 or self.retries < 0:
            raise UserError("commit_files must be at least 1, retries at least 0")

    @property
    def destination(self) -> HubDestination:
        return HubDestination.parse(self.export.to)


def default_staging(dest: HubDestination) -> str:
    from huggingface_hub import constants

    name = f"datasets--{dest.repo.replace('/', '--')}" + (f"--{dest.folder.replace('/', '--')}" if dest.folder else "")
    return str(Path(constants.HF_HOME) / "tokenshards" / "publish" / name)


def run_publish(config: PublishConfig, *, announce: Callable[[str], None] = print) -> ExportSummary:
    """Check, export into staging (or reuse it), upload; raises ``UserError`` for anything the user can fix."""
    from huggingface_hub import HfApi

    t0 = time.perf_counter()
    dest = config.destination
    api = HfApi(endpoint=config.endpoint)
    user = hubrepo.check_access(api, dest, create=config.create_repo, private=config.private, retries=config.retries,
                                backoff=config.backoff, announce=announce)
    announce(f"{dest.url}: {user} may write to it")
    staging = config.staging or default_staging(dest)
    summary, record_name = _stage(config, staging, announce=announce)
    record = _staged_record(Path(staging), record_name)
    card, root_card = (cards.dataset_card(record, repo=dest.repo, folder=dest.folder, record_name=record_name,
                                          at_root=at_root).encode() for at_root in (False, True))
    with _hub_bars_follow(config.export.progress):
        sent, commits, total = _upload(api, config, dest, staging, summary.files, record_name, card, root_card,
                                       announce=announce)
    endpoint = api.endpoint.rstrip("/")
    first = dest.path(summary.files[0]) if summary.files else dest.path(record_name)
    notes = (*summary.notes,
             f"published: {counted(total, 'file')} in {dest.url} ({endpoint}); {sent} sent in "
             f"{counted(commits, 'commit')}" + (", the rest were there already" if sent < total else ""),
             f"download: hf_hub_download(repo_id={dest.repo!r}, filename={first!r}, repo_type='dataset', local_dir=...)",
             f"staged in {staging} ({human(_folder_bytes(staging))}B): a rerun or --overwrite publishes it without exporting again; "
             "delete it when done")
    return dataclasses.replace(summary, to=dest.url, seconds=time.perf_counter() - t0, notes=notes)


@contextlib.contextmanager
def _hub_bars_follow(progress: str):
    """huggingface_hub's upload bars show only where ours would (a terminal, ``--progress bar``):
    under ``none`` or ``log`` they would fill a log. Its own switch, and the user's
    HF_HUB_DISABLE_PROGRESS_BARS, are left as they were."""
    from huggingface_hub.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    if draws_bars(progress) or are_progress_bars_disabled():
        yield
        return
    disable_progress_bars()
    try:
        yield
    finally:
        enable_progress_bars()


# -- staging --

def _stage(config: PublishConfig, staging: str, *, announce: Callable[[str], None]) -> tuple[ExportSummary, str]:
    """The export in ``staging``: the one a stamp there says is this export, else a fresh one."""
    export = config.export
    record_name = formats.get(export.format).record_name(export.name_prefix)
    key = _stage_key(export)
    stamp = Path(staging) / STAMP
    earlier = _read_json(stamp)
    if earlier is not None and earlier.get("export") == key:
        summary = _staged_summary(Path(staging), record_name, export.to)
        if summary is not None:
            announce(f"staging {staging} already holds this export (an earlier run's): uploading it")
            return summary, record_name
    # Ours to overwrite: the default folder, an empty one, or one a publish stamped (even one whose
    # export was killed halfway); a folder of the user's with other files in it is the export's to refuse.
    ours = earlier is not None or config.staging is None or not (Path(staging).is_dir() and any(Path(staging).iterdir()))
    Path(staging).mkdir(parents=True, exist_ok=True)
    _write_stamp(stamp, None)  # a half-made re-export must never be taken for the stamped one
    announce(f"exporting into the staging folder {staging}")
    summary = run_export(export.replace(to=staging, overwrite=export.overwrite or ours), announce=announce)
    _write_stamp(stamp, key)
    return summary, record_name


def _write_stamp(stamp: Path, key: dict | None) -> None:
    tmp = stamp.with_name(stamp.name + ".tmp")
    tmp.write_text(json.dumps({"export": key}, indent=1))
    os.replace(tmp, stamp)


def _stage_key(export: ExportConfig) -> dict:
    """What decides the exported bytes: the options, and which tokenize job made each run."""
    jobs = [open_manifest(run, export.storage_options).manifest.job for run in export.runs]
    return {"format": export.format, "runs": list(export.runs), "jobs": jobs, "shard_tokens": export.shard_tokens,
            "min_shard_tokens": export.min_shard_tokens, "val_tokens": export.val_tokens, "prefix": export.prefix,
            "shuffle": export.shuffled, "seed": export.seed,
            "weights": list(export.weights) if export.weights is not None else None, "tokens": export.tokens}


def _staged_summary(staging: Path, record_name: str, to: str) -> ExportSummary | None:
    """The summary of the export a staging folder holds, from its record; None when the record is
    not one (``ExportRecord.from_dict`` checks that every file it lists, what would be uploaded, is
    named relative to the staging folder), or a file is missing or of another size than it says."""
    try:
        record = _staged_record(staging, record_name)
        sizes = [local_look(str(staging), f.name)[1].st_size for f in record.files]  # regular files inside it
    except (OSError, ExportRecordError, UnsafeFile, UserError):
        return None  # exported again rather than trusted
    if sizes != [f.bytes for f in record.files]:
        return None
    val, train = record.splits["val"], record.splits["train"]
    return ExportSummary(to=to, files=[f.name for f in record.files], val_docs=val.docs, val_tokens=val.tokens,
                         train_docs=train.docs, train_tokens=train.tokens, seconds=0.0)


def _staged_record(staging: Path, record_name: str) -> ExportRecord:
    """The export record in the staging folder, read as every record is (``format.run``: a regular
    file inside the folder, bounded)."""
    return ExportRecord.from_dict(read_record(Location.at(str(staging)), record_name, kind="export record"))


def _read_json(path: Path):
    """The stamp's JSON, or None (missing, not a regular file, not JSON)."""
    try:
        return parse_json(read_local(str(path.parent), path.name, limit=RECORD_LIMITS["lease"]))
    except (OSError, ValueError, UserError):
        return None


def _folder_bytes(folder: str) -> int:
    return sum(p.stat().st_size for p in Path(folder).rglob("*") if p.is_file())


# -- upload --

def file_hashes(path: str) -> tuple[str, str]:
    """(sha256, git blob sha1) of a file, read ``HASH_CHUNK`` bytes at a time: the Hub names an
    LFS file by the first and a plain git file by the second."""
    size = os.path.getsize(path)
    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while piece := f.read(HASH_CHUNK):
            sha256.update(piece)
            sha1.update(piece)
    return sha256.hexdigest(), sha1.hexdigest()


def _same(remote, sha256: str, sha1: str) -> bool:
    if remote is None:
        return False
    return remote.lfs.sha256 == sha256 if remote.lfs else remote.blob_id == sha1


def _upload(api, config: PublishConfig, dest: HubDestination, staging: str, names: list[str], record_name: str,
            card: bytes, root_card: bytes, *, announce: Callable[[str], None]) -> tuple[int, int, int]:
    """Every shard not already on the Hub, ``commit_files`` a commit, then the record and the card
    (and the deletions --overwrite asks for). (files sent, commits made, files published). Into a
    DIR, ``card`` goes beside the shards (its paths relative to DIR) and ``root_card`` (the same,
    its paths relative to the root) to the root README.md when that is missing or a publish's."""
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    export = config.export
    remote = hubrepo.remote_files(api, dest, retries=config.retries, backoff=config.backoff)
    local = {n: file_hashes(os.path.join(staging, n)) for n in [*names, record_name]}
    patterns = formats.get(export.format).patterns(export.name_prefix) + [record_name]
    ours = {dest.path(n) for n in local}
    differ = [n for n in local if dest.path(n) in remote and not _same(remote[dest.path(n)], *local[n])]
    inside = f"{dest.folder}/" if dest.folder else ""
    stale = sorted(p for p in remote if p not in ours and p.startswith(inside)  # patterns may name sub-folders (train/...)
                   and any(fnmatch.fnmatchcase(p[len(inside):], pat) for pat in patterns))
    if (differ or stale) and not export.overwrite:
        shown = [posixpath.basename(p) for p in (differ + stale)]
        raise UserError(f"{dest.url} already holds another export ({', '.join(shown[:3])}{' ...' if len(shown) > 3 else ''}); "
                        "choose another DIR or pass --overwrite to replace it (the staged export is kept: no new export)")
    cards_todo = [(dest.path(CARD), card)]
    at_root = remote.get(CARD) if dest.folder else None
    if dest.folder and (at_root is None or _is_ours(api, dest, at_root, config)):
        cards_todo.append((CARD, root_card))  # the Hub shows the root README.md; a card of the publisher's own stays
    total = len(names) + 1 + len(cards_todo)
    shards = [n for n in names if not _same(remote.get(dest.path(n)), *local[n])]
    last = [n for n in (record_name,) if not _same(remote.get(dest.path(n)), *local[n])]
    cards_todo = [(path, data) for path, data in cards_todo
                  if not _same(remote.get(path), hashlib.sha256(data).hexdigest(), _git_sha1(data))]
    have = len(names) - len(shards)
    announce(f"uploading {counted(len(shards), 'file')} ({human(sum(os.path.getsize(os.path.join(staging, n)) for n in shards))}B) "
             f"to {dest.url}" + (f"; {have} already there" if have else "") + (f"; removing {len(stale)} of an earlier export" if stale else ""))

    def add(name: str) -> CommitOperationAdd:
        op = CommitOperationAdd(path_in_repo=dest.path(name), path_or_fileobj=os.path.join(staging, name))
        op.upload_info.sha256 = bytes.fromhex(local[name][0])  # hashed once, above
        return op

    batches = [shards[i:i + config.commit_files] for i in range(0, len(shards), config.commit_files)]
    commits = 0
    for i, batch in enumerate(batches, 1):
        _commit(api, config, dest, lambda batch=batch: [add(n) for n in batch],
                f"tokenshards export: {batch[0]} .. {batch[-1]} ({i}/{len(batches)})")
        commits += 1
        announce(f"committed {i}/{len(batches)}: {counted(len(batch), 'file')}, {batch[0]} .. {batch[-1]}")
    if last or cards_todo or stale:
        _commit(api, config, dest, lambda: [*(CommitOperationDelete(path_in_repo=p) for p in stale),
                                            *(add(n) for n in last),
                                            *(CommitOperationAdd(path_in_repo=p, path_or_fileobj=d) for p, d in cards_todo)],
                f"tokenshards export: {record_name} and the dataset card")
        commits += 1
    return len(shards) + len(last) + len(cards_todo), commits, total


def _commit(api, config: PublishConfig, dest: HubDestination, operations: Callable[[], list], message: str) -> None:
    """One ``create_commit``, retried whole on 429/5xx/network errors with fresh operations (an
    operation once committed cannot be reused); a failure is one line saying to rerun."""
    from huggingface_hub.errors import HfHubHTTPError

    try:
        hubrepo.retrying(lambda: api.create_commit(dest.repo, operations(), commit_message=message, repo_type="dataset"),
                         retries=config.retries, backoff=config.backoff)
    except Exception as e:
        if not (hubrepo.is_transient(e) or isinstance(e, (HfHubHTTPError, OSError, RuntimeError, ValueError))):
            raise  # huggingface_hub raises ValueError for a malformed or refusing LFS batch answer
        raise UserError(f"uploading to {dest.url} stopped ({hubrepo.first_line(_root_cause(e))}); rerun the same command "
                        "to resume: files already on the Hub are not sent again, the staged export is reused") from e


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None:
        e = e.__cause__
    return e


def _is_ours(api, dest: HubDestination, entry, config: PublishConfig) -> bool:
    """A root README.md a publish wrote (it carries ``card.MARKER``), so a newer one may replace it."""
    from huggingface_hub import hf_hub_download

    if entry.size > 2**20:
        return False
    path = hubrepo.retrying(lambda: hf_hub_download(dest.repo, CARD, repo_type="dataset", endpoint=api.endpoint,
                                                    cache_dir=None), retries=config.retries, backoff=config.backoff)
    with open(path, "rb") as f:
        return cards.MARKER.encode() in f.read(4096)


def _git_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
