"""A tokenizer from a Hugging Face Hub model repo: ``--encoding Qwen/Qwen3-8B[@REVISION]``.

Only the tokenizer's own files are fetched (never the weights), at the commit the revision
names when we look, so a run records a sha that means the same files forever. Every request goes
through huggingface_hub, so HF_ENDPOINT, HF_TOKEN (or the token ``hf auth login`` saved),
HF_HUB_CACHE and HF_HUB_OFFLINE mean what they mean to it; a second fetch is served from its
cache. Transient answers (429, 5xx, a dropped connection) are retried as ``storage.hub`` retries
its downloads. huggingface_hub is imported only when fetching: ``is_hub_repo_id`` runs while the
command line is parsed.
"""
from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from ..errors import UserError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "chat_template.jinja")
"""What a tokenizer is made of on the Hub (at the repo's root); whichever exist are fetched."""
VOCABULARY_FILES = ("tokenizer.json", "tokenizer.model")
"""At least one must exist: the others only configure a vocabulary."""
_NAME = r"[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
"""A Hub namespace or repo name: letters, digits, ``_ . -``, starting and ending with a letter or
digit, at most 96 characters (huggingface_hub's ``validate_repo_id``); no ``--`` or ``..`` either."""
_SPEC = re.compile(rf"({_NAME})/({_NAME})(?:@([A-Za-z0-9_][A-Za-z0-9_./-]*))?")
_FILE_SUFFIXES = (".json", ".model", ".tiktoken", ".vocab", ".txt")
"""``data/tokenizer.json`` is a valid repo id too; a name ending like a tokenizer file means a
path (one that may be missing: better "no such file" than "no such Hub repo")."""
_SHA = re.compile(r"[0-9a-f]{40}")
T = TypeVar("T")


@dataclass(frozen=True)
class HubTokenizer:
    """A tokenizer's files as downloaded from a Hub model repo at one commit."""

    repo: str
    """``Org/Name``, e.g. ``Qwen/Qwen3-8B``."""
    revision: str
    """The commit sha (40 hex) the files came from: a branch moves, a sha does not."""
    folder: Path
    """The local folder holding them (huggingface_hub's cache snapshot of that commit)."""
    files: tuple[str, ...]
    """The names fetched, in ``TOKENIZER_FILES`` order."""

    @property
    def source(self) -> str:
        """``Org/Name@SHA``: what a manifest records, and a spec that fetches the same files again."""
        return f"{self.repo}@{self.revision}"


def is_hub_repo_id(spec: str) -> bool:
    """'Org/Name' or 'Org/Name@REVISION' (Hub naming rules), and not an existing local path."""
    return _parse(spec) is not None and not Path(spec).exists()


def fetch_tokenizer(spec: str, *, announce: Callable[[str], None] = lambda msg: None, endpoint: str | None = None,
                    cache_dir: str | Path | None = None, retries: int = 5, backoff: float = 1.0) -> HubTokenizer:
    """Download the tokenizer files of ``spec`` (``Org/Name[@REVISION]``, revision ``main`` when
    none) at the commit the revision names now. ``endpoint``/``cache_dir``: None for HF_ENDPOINT /
    HF_HUB_CACHE (as huggingface_hub read them at import). Any failure is one ``UserError`` line.

    huggingface_hub is imported inside this module's functions: ``registry`` imports the module for
    ``is_hub_repo_id``, and a mistyped ``--encoding`` need not wait for it."""
    from huggingface_hub import constants  # heavy: huggingface_hub, for a repo id only

    parsed = _parse(spec)
    if parsed is None:
        raise UserError(f"--encoding {spec!r}: expected a Hub model repo ORG/NAME or ORG/NAME@REVISION, "
                        "e.g. Qwen/Qwen3-8B or meta-llama/Llama-3.1-8B@main")
    repo, revision = parsed
    where = (endpoint or constants.ENDPOINT).rstrip("/")
    cache = str(cache_dir) if cache_dir is not None else None
    if constants.is_offline_mode():
        return _from_cache(repo, revision, cache=cache, announce=announce)
    request = _Requests(repo=repo, revision=revision, where=where, retries=retries, backoff=backoff)
    sha, names = request(lambda: _listing(repo, revision, endpoint=endpoint))
    wanted = [n for n in TOKENIZER_FILES if n in names]
    _check_vocabulary(repo, f"{revision} ({sha[:12]})" if revision != sha else sha, wanted, where=f"on {where}")
    announce(f"fetching the tokenizer of {repo} at {sha[:12]}" + (f" ({revision})" if revision != sha else "")
             + f" from {where}: {', '.join(wanted)}")
    paths = [Path(request(lambda n=n: _download(repo, n, sha, endpoint=endpoint, cache_dir=cache))) for n in wanted]
    folder = _one_folder(paths)
    if revision != sha:
        _remember_ref(folder, revision, sha)
    return HubTokenizer(repo=repo, revision=sha, folder=folder, files=tuple(wanted))


def _parse(spec: str) -> tuple[str, str] | None:
    """(repo, revision) of a well-formed spec, else None."""
    m = _SPEC.fullmatch(spec)
    if not m:
        return None
    org, name, revision = m.group(1), m.group(2), m.group(3) or "main"
    if any("--" in part or ".." in part for part in (org, name)) or name.endswith(".git") \
            or name.lower().endswith(_FILE_SUFFIXES):
        return None
    if ".." in revision or "//" in revision or revision.endswith(("/", ".")):
        return None
    return f"{org}/{name}", revision


def _listing(repo: str, revision: str, *, endpoint: str | None) -> tuple[str, set[str]]:
    """The commit ``revision`` names now, and the paths of the files at that commit."""
    from huggingface_hub import HfApi  # heavy: huggingface_hub, for a repo id only

    api = HfApi(endpoint=endpoint)
    info = api.model_info(repo, revision=revision)
    if not info.sha or not _SHA.fullmatch(info.sha):
        raise UserError(f"{api.endpoint} gave no commit sha for {repo}@{revision} (got {info.sha!r}); "
                        "check that HF_ENDPOINT is a Hugging Face Hub")
    if info.siblings is not None:
        return info.sha, {s.rfilename for s in info.siblings}
    return info.sha, set(api.list_repo_files(repo, revision=info.sha))


def _download(repo: str, name: str, sha: str, *, endpoint: str | None, cache_dir: str | None) -> str:
    """One file into huggingface_hub's cache. It retries a failed HEAD itself (5 times, 1-8 s
    apart) before raising; ``_Requests`` retries what still fails, as ``storage.hub`` does."""
    from huggingface_hub import hf_hub_download  # heavy: huggingface_hub, for a repo id only

    from ..storage.hub.fetch import NoBar

    return hf_hub_download(repo, name, revision=sha, endpoint=endpoint, cache_dir=cache_dir, tqdm_class=NoBar)


def _remember_ref(snapshot: Path, revision: str, sha: str) -> None:
    """Record in the cache that ``revision`` named ``sha``, as huggingface_hub does (``refs/REVISION``)
    when asked for a branch: we download at the sha (a branch may move between two requests), so
    it never learns the branch, and HF_HUB_OFFLINE=1 could not find the files by it later."""
    ref = snapshot.parent.parent / "refs" / revision
    if snapshot.parent.name != "snapshots" or (ref.is_file() and ref.read_text() == sha):
        return
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f"{ref.name}.{uuid.uuid4().hex}.tmp")
    tmp.write_text(sha)
    os.replace(tmp, ref)


def _from_cache(repo: str, revision: str, *, cache: str | None, announce: Callable[[str], None]) -> HubTokenizer:
    """HF_HUB_OFFLINE=1: the files an earlier fetch of the same revision left in the cache."""
    from huggingface_hub import constants, hf_hub_download  # heavy: huggingface_hub, for a repo id only
    from huggingface_hub.errors import EntryNotFoundError

    paths: dict[str, Path] = {}
    for name in TOKENIZER_FILES:
        try:
            paths[name] = Path(hf_hub_download(repo, name, revision=revision, cache_dir=cache, local_files_only=True))
        except EntryNotFoundError:  # LocalEntryNotFoundError: not cached (or not in the repo)
            continue
    where = f"in the cache {cache or constants.HF_HUB_CACHE} (HF_HUB_OFFLINE is set; unset it to download)"
    _check_vocabulary(repo, revision, list(paths), where=where)
    folder = _one_folder(list(paths.values()))
    if not _SHA.fullmatch(folder.name):
        raise UserError(f"cached tokenizer of {repo}@{revision} is in {folder}, not in a commit's snapshot folder; "
                        "unset HF_HUB_OFFLINE to download it again")
    announce(f"using the cached tokenizer of {repo} at {folder.name[:12]} ({revision}): {', '.join(paths)}")
    return HubTokenizer(repo=repo, revision=folder.name, folder=folder, files=tuple(paths))


def _check_vocabulary(repo: str, revision: str, names: list[str], *, where: str) -> None:
    if not any(n in names for n in VOCABULARY_FILES):
        raise UserError(f"Hub repo {repo}@{revision} has no tokenizer.json or tokenizer.model {where} (found "
                        f"{', '.join(names) or 'no tokenizer files'}); use a repo that ships its tokenizer, "
                        "e.g. the base model's")


def _one_folder(paths: list[Path]) -> Path:
    folders = {p.parent for p in paths}
    if len(folders) != 1:
        raise UserError(f"tokenizer files ended up in {len(folders)} folders ({', '.join(map(str, sorted(folders)))}), "
                        "not one snapshot; clear them from HF_HUB_CACHE and fetch again")
    return folders.pop()


@dataclass(frozen=True, kw_only=True)
class _Requests:
    """Runs one Hub request: retried while the error may pass, then one ``UserError`` line."""

    repo: str
    revision: str
    where: str
    retries: int
    backoff: float

    def __call__(self, call: Callable[[], T]) -> T:
        import httpx2  # heavy: huggingface_hub, for a repo id only
        from huggingface_hub.errors import (GatedRepoError, OfflineModeIsEnabled, RepositoryNotFoundError,
                                            RevisionNotFoundError)

        from ..storage.hub.retry import first_line, is_transient, retry_call

        repo, where = self.repo, self.where
        try:
            return retry_call(call, retries=self.retries, backoff=self.backoff, refused_retries=min(self.retries, 2))
        except UserError:
            raise
        except GatedRepoError as e:  # before RepositoryNotFoundError: it is one
            raise _gated(repo) from e
        except RevisionNotFoundError as e:
            raise UserError(f"Hub repo {repo} has no revision {self.revision!r} on {where}: use a branch, tag or "
                            "commit sha it has (e.g. main)") from e
        except RepositoryNotFoundError as e:
            raise UserError(f"Hub model repo {repo} not found on {where}: check the name (ORG/NAME, as on the Hub); "
                            "if it is private, set HF_TOKEN to a token with read access to it") from e
        except OfflineModeIsEnabled as e:
            raise UserError(f"cannot fetch the tokenizer of {repo}: HF_HUB_OFFLINE is set and it is not cached") from e
        except Exception as e:
            status = _status(e)
            if status in (401, 403):
                raise _gated(repo) from e
            if is_transient(e) and status is not None:
                raise UserError(f"{where} kept answering HTTP {status} while fetching the tokenizer of {repo} "
                                f"(tried {self.retries + 1} times); try again later") from e
            if is_transient(e) or isinstance(e, httpx2.HTTPError):
                raise UserError(f"cannot reach {where} to fetch the tokenizer of {repo} ({first_line(_cause(e))}); "
                                "check HF_ENDPOINT and your connection") from e
            raise UserError(f"cannot fetch the tokenizer of {repo} from {where}: {first_line(e)}") from e


def _gated(repo: str) -> UserError:
    return UserError(f"Hub repo {repo} is gated or private: accept its licence on the Hub and set HF_TOKEN "
                     "(a token with read access)")


def _http_error(e: BaseException) -> BaseException:
    """The HTTP error itself, where huggingface_hub wrapped it ("cannot find the requested files")."""
    from huggingface_hub.errors import HfHubHTTPError  # heavy: huggingface_hub, for a repo id only

    cause = e.__cause__
    return cause if not isinstance(e, HfHubHTTPError) and isinstance(cause, HfHubHTTPError) else e


def _cause(e: BaseException) -> BaseException:
    """The network error under huggingface_hub's wrapping, else ``e``."""
    return e.__cause__ if e.__cause__ is not None and type(e).__name__ == "LocalEntryNotFoundError" else e


def _status(e: BaseException) -> int | None:
    response = getattr(_http_error(e), "response", None)
    return getattr(response, "status_code", None)
