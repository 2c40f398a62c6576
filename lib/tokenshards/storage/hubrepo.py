"""A Hub dataset repo to publish into: ``hf://datasets/ORG/NAME[/DIR]``, its checks and its listing.

Every request goes through huggingface_hub (``HfApi``), so HF_ENDPOINT, HF_TOKEN (or the token
``hf auth login`` saved) and HF_HOME mean what they mean to it. Checked before any work, one
line each: a token at all, a token the Hub accepts (``whoami``), the repo (created only when
asked), write access to it (``auth_check(write=True)``). Transient answers (429, 5xx, a dropped
connection) are retried here as ``storage.hub`` retries its downloads.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

import httpx2
from huggingface_hub import HfApi, RepoFile, constants, get_token
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError, RepositoryNotFoundError

from ..errors import UserError
from .hub.retry import TRANSIENT_STATUS, first_line, retry_call
from .hubspec import SCHEME

_DEST = re.compile(r"hf://datasets/([A-Za-z0-9][\w.-]*)/([A-Za-z0-9][\w.-]*)(?:/(.*))?")


@dataclass(frozen=True, kw_only=True)
class HubDestination:
    """Where an export goes on the Hub: a dataset repo and a folder in it ("" for its root)."""

    repo: str
    folder: str = ""

    @classmethod
    def parse(cls, url: str) -> "HubDestination":
        m = _DEST.fullmatch(url)
        if not m:
            if not url[len(SCHEME):].startswith("datasets/"):
                raise UserError(f"--to {url!r}: exports go to a dataset repo, hf://datasets/ORG/NAME[/DIR]")
            raise UserError(f"--to {url!r}: expected hf://datasets/ORG/NAME or hf://datasets/ORG/NAME/DIR")
        folder = (m.group(3) or "").strip("/")
        if folder and any(part in ("", ".", "..") for part in folder.split("/")):
            raise UserError(f"--to {url!r}: DIR {folder!r} must be a plain folder path in the repo (no '.', '..' or '//')")
        return cls(repo=f"{m.group(1)}/{m.group(2)}", folder=folder)

    @property
    def url(self) -> str:
        return f"{SCHEME}datasets/{self.repo}" + (f"/{self.folder}" if self.folder else "")

    def path(self, name: str) -> str:
        """``name``'s path in the repo."""
        return f"{self.folder}/{name}" if self.folder else name


def check_access(api: HfApi, dest: HubDestination, *, create: bool, private: bool, retries: int, backoff: float,
                 announce: Callable[[str], None]) -> str:
    """Token, repo and write access, one line each on failure; the user name the token belongs to."""
    endpoint = api.endpoint.rstrip("/")
    token = api.token or get_token()
    if not token:
        raise UserError(f"publishing to {dest.url} needs a Hugging Face write token: set HF_TOKEN or run "
                        "`hf auth login` (huggingface_hub reads either)")
    try:
        user = retrying(lambda: api.whoami(token=token), retries=retries, backoff=backoff)["name"]
    except HfHubHTTPError as e:
        if _status(e) == 401:
            raise UserError(f"{endpoint} does not accept the token from {_token_source(token)} (401 Invalid user token); "
                            "set HF_TOKEN to a valid write token or run `hf auth login --force`") from e
        raise UserError(f"cannot check the token with {endpoint} ({first_line(e)}); check HF_ENDPOINT and your connection") from e
    except (httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot reach {endpoint} ({first_line(e)}); check HF_ENDPOINT and your connection") from e
    where = f"dataset repo {dest.repo} on {endpoint}"
    try:
        _write_check(api, dest, token, retries=retries, backoff=backoff)
    except RepositoryNotFoundError as e:
        if not create:
            raise UserError(f"{where} does not exist (or {user} cannot see it); create it on the Hub "
                            f"(`hf repo create {dest.repo} --repo-type dataset`) or pass --create-repo") from e
        _create(api, dest, token, private=private, user=user, where=where, retries=retries, backoff=backoff)
        announce(f"created {'private ' if private else ''}{where}")
        _write_check(api, dest, token, retries=retries, backoff=backoff, user=user, where=where)
    except HfHubHTTPError as e:
        raise _denied(e, user=user, where=where) from e
    return user


def _write_check(api: HfApi, dest: HubDestination, token: str, *, retries: int, backoff: float, user: str = "",
                 where: str = "") -> None:
    try:
        retrying(lambda: api.auth_check(dest.repo, repo_type="dataset", token=token, write=True), retries=retries,
                 backoff=backoff)
    except RepositoryNotFoundError:
        raise
    except HfHubHTTPError as e:
        if user:
            raise _denied(e, user=user, where=where) from e
        raise
    except (httpx2.HTTPError, OSError) as e:
        raise UserError(f"cannot reach {api.endpoint} ({first_line(e)}); check HF_ENDPOINT and your connection") from e


def _create(api: HfApi, dest: HubDestination, token: str, *, private: bool, user: str, where: str, retries: int,
            backoff: float) -> None:
    try:
        retrying(lambda: api.create_repo(dest.repo, repo_type="dataset", private=private, token=token, exist_ok=True),
                 retries=retries, backoff=backoff)
    except HfHubHTTPError as e:
        raise UserError(f"cannot create {where} as {user} ({_status(e) or first_line(e)}): the token may not create repos "
                        f"in {dest.repo.split('/')[0]!r}; create it on the Hub or use a token that can") from e


def _denied(e: HfHubHTTPError, *, user: str, where: str) -> UserError:
    status = _status(e)
    if status in (401, 403):
        return UserError(f"{user} may not write to {where} ({status}); use a token with write access to it "
                         "(HF_TOKEN, or `hf auth login`), or another repo")
    return UserError(f"cannot check write access to {where} ({first_line(e)})")


def remote_files(api: HfApi, dest: HubDestination, *, retries: int, backoff: float) -> dict[str, RepoFile]:
    """Files on ``main`` under the destination folder, and those at the repo's root (its card), by path."""
    def tree(folder: str | None, recursive: bool) -> list:
        try:
            return retrying(lambda: list(api.list_repo_tree(dest.repo, folder, recursive=recursive, repo_type="dataset")),
                            retries=retries, backoff=backoff)
        except EntryNotFoundError:
            return []

    entries = tree(dest.folder or None, True) + (tree(None, False) if dest.folder else [])
    return {e.path: e for e in entries if isinstance(e, RepoFile)}


def retrying(call, *, retries: int, backoff: float):
    """``call()``, retried on 429, 5xx and network errors (huggingface_hub retries its own
    uploads' PUTs this way, not its commit or its repo calls)."""
    return retry_call(call, retries=retries, backoff=backoff, transient=is_transient)


def is_transient(e: BaseException | None) -> bool:
    """429, 5xx or a network error, raised as such or anywhere down its causes (huggingface_hub
    wraps a failed LFS upload in ``RuntimeError("Error while uploading ...")``: deeper than the
    one level ``storage.hub``'s downloads look)."""
    seen = 0
    while e is not None and seen < 10:
        if isinstance(e, HfHubHTTPError) and e.response is not None:
            return e.response.status_code in TRANSIENT_STATUS
        if isinstance(e, httpx2.TransportError):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _status(e: HfHubHTTPError) -> int | None:
    return e.response.status_code if getattr(e, "response", None) is not None else None


def _token_source(token: str) -> str:
    return "HF_TOKEN" if token in (os.environ.get("HF_TOKEN"), os.environ.get("HUGGING_FACE_HUB_TOKEN")) \
        else f"the token file ({constants.HF_TOKEN_PATH})"

