"""A Hub sample downloaded by this process, with its own progress lines: ``download`` (every
file, 8 at a time, then return) and ``Fetcher`` + ``arrivals`` (in the background, each file
reported as it is whole, for a job that tokenizes while it downloads)."""
from __future__ import annotations

import queue
import threading
import time
from typing import Callable, Iterator

from huggingface_hub import constants

from ...wording import human
from ...errors import UserError
from ..hubspec import HubDataset
from ..sources import ListedInput
from .cache import check_disk, clear_stale, free_bytes, is_present, local_sources, remember_revision, target
from .fetch import NoBar, fetch_file
from .listing import HubFile, HubListing

OVERLAP_DOWNLOADS = 1
"""Files downloaded at a time while tokenizing overlaps: through one link, k downloads at once
make the first whole file wait k times longer and leave k files to tokenize after the last byte
arrives; huggingface_hub's Xet path already fetches one file over many connections."""


def download(ds: HubDataset, listing: HubListing, *, announce: Callable[[str], None] = print) -> list[ListedInput]:
    """Fetch what is missing (after saying how much, and checking the disk); return local sources."""
    prepare_download(ds, listing, announce=announce)
    if not constants.is_offline_mode():
        _fetch_all(ds, listing, listing.files, announce=announce)  # present ones too: a HEAD checks their etag
        remember_revision(ds, listing)
    return local_sources(ds, listing)


def prepare_download(ds: HubDataset, listing: HubListing, *, announce: Callable[[str], None]) -> list[HubFile]:
    """What a download must fetch, after saying how much and checking the disk (offline: refuse
    when anything is missing). Fetches nothing."""
    clear_stale(ds, listing)
    todo = [f for f in listing.files if not is_present(ds, listing, f)]
    where = target(ds)
    need = sum(f.size for f in todo)
    free = free_bytes(where)
    have = len(listing.files) - len(todo)
    announce(f"{listing.describe()}: {len(listing.files)} files, {human(listing.bytes)}B"
             + (f"; {have} already downloaded" if have else "")
             + f"; fetching {len(todo)} files ({human(need)}B) into {where}, {human(free)}B free")
    check_disk(need=need, free=free, keep_free=ds.keep_free, where=where,
               what=f"fetching {len(todo)} files of {listing.describe()}")
    if constants.is_offline_mode() and todo:
        raise UserError(f"HF_HUB_OFFLINE is set but {len(todo)} files of {listing.describe()} are incomplete; "
                        "unset HF_HUB_OFFLINE to fetch them")
    return todo


def _fetch_all(ds: HubDataset, listing: HubListing, files, *, announce: Callable[[str], None],
               every: float = 15.0) -> None:
    """Every file through ``fetch_file``, ``max_workers`` at a time, with a progress line per file
    and one every ``every`` seconds (a FineWeb file is ~2 GB: minutes without a word otherwise)."""
    for _ in arrivals(Fetcher(ds, listing, files, workers=ds.max_workers).start(), announce=announce, every=every):
        pass


def arrivals(fetcher: "Fetcher", *, announce: Callable[[str], None], every: float = 15.0) -> Iterator[tuple[HubFile, str]]:
    """(file, local path) as each download ends, with a line per file and one every ``every``
    seconds. After an ordinary error the downloads under way are let finish, so a rerun finds them
    whole; leaving early stops the fetcher from starting more."""
    ready = ready_bytes = 0
    try:
        while ready < len(fetcher.files):
            try:
                f, path, error = fetcher.next(timeout=every)
            except queue.Empty:
                if fetcher.stopped():
                    return  # stopped by the job, which no longer waits for these files
                announce(fetcher.status(ready))
                continue
            if error is not None:
                fetcher.stop(wait=True)
                raise error
            ready, ready_bytes = ready + 1, ready_bytes + f.size
            announce(f"ready {ready}/{len(fetcher.files)} ({human(ready_bytes)}B of {human(fetcher.total)}B): {f.path}")
            yield f, path
    finally:
        fetcher.stop()


class Fetcher:
    """``files`` through ``fetch_file`` on background threads, ``workers`` at a time, started in
    the order given; each outcome lands on a queue as (file, local path, error), read with ``next``.

    Daemon threads, so that Ctrl-C stops at once instead of waiting for 2 GB downloads to end;
    what they leave is only huggingface_hub's temporary ``.incomplete`` files (see ``clear_stale``).
    ``stop`` starts no further file; ``stop(wait=True)`` also lets the ones under way finish."""

    def __init__(self, ds: HubDataset, listing: HubListing, files, *, workers: int):
        self.files = list(files)
        self.total = sum(f.size for f in self.files)
        self._counter = _ByteCounter()
        self._work: queue.Queue = queue.Queue()
        for f in self.files:
            self._work.put(f)
        self._results: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._t0 = time.monotonic()

        def worker() -> None:
            while not self._stop.is_set():
                try:
                    f = self._work.get_nowait()
                except queue.Empty:
                    return
                try:
                    self._results.put((f, fetch_file(ds, listing.repo, listing.commit, f, tqdm_class=self._counter.bar),
                                       None))
                except BaseException as e:  # handed to the reading thread, raised there
                    self._results.put((f, None, e))

        self._threads = [threading.Thread(target=worker, name=f"tokenshards-hub-{i}", daemon=True)
                         for i in range(min(workers, len(self.files)))]

    def start(self) -> "Fetcher":
        self._t0 = time.monotonic()
        for t in self._threads:
            t.start()
        return self

    def next(self, timeout: float | None = None) -> tuple[HubFile, str | None, BaseException | None]:
        """The next file done (or failed); ``queue.Empty`` after ``timeout`` seconds without one."""
        return self._results.get(timeout=timeout)

    def stop(self, *, wait: bool = False) -> None:
        self._stop.set()
        if wait:
            for t in self._threads:
                if t.is_alive():
                    t.join()

    def stopped(self) -> bool:
        """Stopped, and no download under way any more."""
        return self._stop.is_set() and not any(t.is_alive() for t in self._threads)

    def status(self, ready: int) -> str:
        rate = self._counter.n / max(time.monotonic() - self._t0, 1e-9)
        return f"downloading: {human(self._counter.n)}B received, {human(rate)}B/s, {ready}/{len(self.files)} files ready"


class _ByteCounter:
    """Bytes that huggingface_hub reports to its progress-bar class, summed over threads."""

    def __init__(self):
        self.n = 0
        lock = threading.Lock()
        counter = self

        class _Bar(NoBar):
            def update(self, n=1):
                with lock:
                    counter.n += n or 0

        self.bar = _Bar
