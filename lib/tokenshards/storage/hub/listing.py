"""Which files a Hub sample holds: ``--dataset REPO --size 10B`` → the parquet files of
``sample/10BT`` at one pinned commit, with sizes and etags, without downloading any."""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import httpx2
from huggingface_hub import HfApi, RepoFile, RepoFolder, constants
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import repo_folder_name

from ...errors import UserError
from ..hubspec import SAMPLE_DIR, HubDataset, folder_size
from .retry import first_line, retrying

COMMIT = re.compile(r"[0-9a-f]{40}")


@dataclass(frozen=True, kw_only=True)
class HubFile:
    path: str
    """Path in the repo, e.g. ``sample/10BT/000_00000.parquet``: also the document-id prefix."""
    size: int
    etag: str
    """As listed (the LFS sha256, else the git blob id; "" offline): for the record, since
    huggingface_hub itself keys downloads by the etag its HEAD request gets."""


@dataclass(frozen=True, kw_only=True)
class HubListing:
    repo: str
    revision: str
    commit: str
    folder: str
    files: tuple[HubFile, ...]

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)

    def describe(self) -> str:
        return f"{self.repo}@{self.revision} (commit {self.commit[:12]}) {self.folder}"

    def record(self) -> dict:
        """For a manifest's extra keys: which dataset, at which commit, the inputs came from."""
        return {"repo": self.repo, "revision": self.revision, "commit": self.commit, "folder": self.folder,
                "files": len(self.files), "bytes": self.bytes}


def list_files(ds: HubDataset) -> HubListing:
    """The parquet files of the size folder at one commit, with sizes and etags (no download).

    With HF_HUB_OFFLINE=1, the files already downloaded for that revision instead."""
    if constants.is_offline_mode():
        return _offline_listing(ds)
    api = HfApi(endpoint=ds.endpoint)
    where = f"dataset {ds.repo!r} on {ds.hub_endpoint}"
    try:
        info = retrying(lambda: api.dataset_info(ds.repo, revision=ds.revision), ds=ds)
        commit = info.sha
        files = _list_folder(api, ds, commit)
    except GatedRepoError as e:
        raise UserError(f"{where} is gated: accept its terms on the Hub and set HF_TOKEN (or `hf auth login`)") from e
    except RepositoryNotFoundError as e:
        raise UserError(f"{where} not found (or private: set HF_TOKEN); check --dataset") from e
    except RevisionNotFoundError as e:
        raise UserError(f"{where} has no revision {ds.revision!r}; check --revision (a branch, tag or commit)") from e
    except (HfHubHTTPError, httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot list {where} ({first_line(e)}); check your connection and "
                        "HF_ENDPOINT, or set HF_HUB_OFFLINE=1 to use the files already downloaded") from e
    return HubListing(repo=ds.repo, revision=ds.revision, commit=commit, folder=ds.folder, files=files)


def _list_folder(api: HfApi, ds: HubDataset, commit: str) -> tuple[HubFile, ...]:
    """The size folder's parquet files; a missing folder is a one-line error listing the sizes that exist.

    One request per 1,000 files for the folder itself; only when that finds nothing, the names
    under ``sample/``, and as a last resort (a server that lists no sub-folder) the whole tree."""
    def tree(path: str | None, recursive: bool) -> list:
        try:
            return retrying(lambda: list(api.list_repo_tree(ds.repo, path, recursive=recursive, repo_type="dataset",
                                                            revision=commit)), ds=ds)
        except EntryNotFoundError:
            return []

    files = _parquet_under(tree(ds.folder, True), ds.folder)
    if files:
        return files
    samples = sorted({e.path for e in tree(SAMPLE_DIR, False) if isinstance(e, RepoFolder)})
    if samples and ds.folder not in samples:
        raise UserError(_missing_size(ds, samples))
    everything = tree(None, True)
    files = _parquet_under(everything, ds.folder)
    if files:
        return files
    samples = sorted({"/".join(e.path.split("/")[:2]) for e in everything
                      if e.path.startswith(SAMPLE_DIR + "/") and e.path.count("/") >= 2})
    raise UserError(_missing_size(ds, samples))


def _parquet_under(entries: list, folder: str) -> tuple[HubFile, ...]:
    found = (_hub_file(e) for e in entries
             if isinstance(e, RepoFile) and e.path.startswith(folder + "/") and e.path.endswith(".parquet"))
    return tuple(sorted(found, key=lambda f: f.path))


def _hub_file(entry) -> HubFile:
    lfs = getattr(entry, "lfs", None)
    return HubFile(path=entry.path, size=int(lfs.size if lfs else entry.size),
                   etag=lfs.sha256 if lfs else entry.blob_id)


def _missing_size(ds: HubDataset, folders: list[str]) -> str:
    """One line naming the missing folder and the sizes that exist."""
    sizes = ", ".join(folder_size(f) for f in sorted(folders, key=lambda f: (len(f), f))) or f"none (no {SAMPLE_DIR}/ folder)"
    return (f"dataset {ds.repo!r} at revision {ds.revision!r} has no size {ds.size} (folder {ds.folder}); "
            f"sizes that exist: {sizes}")


def _offline_listing(ds: HubDataset) -> HubListing:
    """HF_HUB_OFFLINE=1: what an earlier download left for this revision (sizes from disk, no etags)."""
    if ds.download_dir:
        base = Path(ds.download_dir)
        commit = ds.revision if COMMIT.fullmatch(ds.revision) else "0" * 40
    else:
        storage = Path(ds.hub_cache) / repo_folder_name(repo_id=ds.repo, repo_type="dataset")
        ref = storage / "refs" / ds.revision
        commit = ds.revision if COMMIT.fullmatch(ds.revision) else (ref.read_text().strip() if ref.is_file() else "")
        base = storage / "snapshots" / commit
    found = sorted(p for p in (base / ds.folder).glob("**/*.parquet") if p.is_file()) if commit else []
    if not found:
        raise UserError(f"HF_HUB_OFFLINE is set and no file of {ds.repo}@{ds.revision} {ds.folder} was downloaded to "
                        f"{base if commit else ds.hub_cache}; download it first (unset HF_HUB_OFFLINE)")
    files = tuple(HubFile(path=p.relative_to(base).as_posix(), size=p.stat().st_size, etag="") for p in found)
    return HubListing(repo=ds.repo, revision=ds.revision, commit=commit, folder=ds.folder, files=files)
