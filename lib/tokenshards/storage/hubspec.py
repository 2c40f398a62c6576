"""Which Hub sample to fetch, and how: parsed and validated without importing huggingface_hub
(~0.1 s), which only runs that touch the Hub need (the ``hub`` package)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import UserError

FETCH_MODES = ("auto", "client", "workers")
SAMPLE_DIR = "sample"
PROTOCOL = "hfcache"
"""``hfcache://datasets/REPO@COMMIT/PATH``: a Hub file that each worker machine opens from its own
copy (``--fetch workers``, ``hub/workerfs.py``). Named here so that code that only tells such a
reference apart does not import huggingface_hub for it."""
SCHEME = "hf://"
"""A Hub dataset repo as an export's destination (``hf://datasets/ORG/NAME[/DIR]``, ``hubrepo``)."""
_SIZE = re.compile(r"(\d+)\s*BT?", re.IGNORECASE)


@dataclass(frozen=True, kw_only=True)
class HubDataset:
    """A Hub dataset sample to tokenize, and where and how to fetch it."""

    repo: str
    size: str
    revision: str = "main"
    fetch: str = "auto"
    """Who downloads: ``client`` (this process), ``workers`` (each machine its own files), or
    ``auto``: client on a local cluster or when every worker sees this machine's download folder,
    else workers (``inputs.choose``)."""
    download_dir: str | None = None
    """A plain folder holding ``sample/10BT/*.parquet`` (huggingface_hub's ``local_dir``), e.g. on a
    shared filesystem; None: huggingface_hub's cache (``cache_dir``, default HF_HUB_CACHE)."""
    cache_dir: str | None = None
    endpoint: str | None = None
    """None: HF_ENDPOINT, as huggingface_hub read it at import."""
    keep_free: int = 2**30
    """Bytes that must stay free on the download disk after the download."""
    max_workers: int = 8
    retries: int = 5
    backoff: float = 1.0
    """Seconds before the first retry of a transient error; doubles each time, at most 60 s."""

    def __post_init__(self):
        if self.repo.count("/") != 1 or not all(self.repo.split("/")):
            raise UserError(f"--dataset {self.repo!r}: expected a dataset repo id OWNER/NAME, e.g. HuggingFaceFW/fineweb")
        size_folder(self.size)  # validates
        if self.fetch not in FETCH_MODES:
            raise UserError(f"--fetch {self.fetch!r} not supported, expected one of {FETCH_MODES}")
        if self.keep_free < 0:
            raise UserError(f"--keep-free-gb {self.keep_free / 2**30:g} must be 0 or more")
        if self.max_workers < 1 or self.retries < 0:
            raise UserError("max_workers must be at least 1, retries at least 0")

    @property
    def folder(self) -> str:
        return size_folder(self.size)

    @property
    def hub_endpoint(self) -> str:
        from huggingface_hub import constants  # heavy: the CLI imports this module at start

        return (self.endpoint or constants.ENDPOINT).rstrip("/")

    @property
    def hub_cache(self) -> str:
        from huggingface_hub import constants  # heavy: the CLI imports this module at start

        return self.cache_dir or constants.HF_HUB_CACHE


def is_hub_url(url: str) -> bool:
    """Whether ``url`` names a Hub dataset repo (``export --to hf://...`` publishes there)."""
    return url.startswith(SCHEME)


def size_folder(size: str) -> str:
    """``10B`` (or ``10BT``) → ``sample/10BT``: FineWeb's and FineWeb-Edu's sample folders."""
    m = _SIZE.fullmatch(size.strip())
    if not m:
        raise UserError(f"--size {size!r}: expected a sample size such as 10B, 100B or 350B")
    return f"{SAMPLE_DIR}/{int(m.group(1))}BT"


def folder_size(folder: str) -> str:
    """``sample/10BT`` → ``10B``, the spelling ``--size`` takes."""
    name = folder.rstrip("/").rsplit("/", 1)[-1]
    return name[:-1] if name.upper().endswith("BT") else name

