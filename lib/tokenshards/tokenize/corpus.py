"""The corpus step, shared by ``tokenize`` and ``train-bpe``: inputs (paths, globs, s3://, the Hub)
→ parquet footers read on the workers → a deterministic partition plan.

It runs in two halves around the cluster's start: ``locate`` before (listing inputs and the Hub,
and with ``--fetch client`` downloading, needs no workers), ``plan`` after (footers are read by
workers, and ``--fetch workers`` registers the Hub plugin on them).

``tokenize`` overlaps the download with tokenizing (``locate(overlap=True)``): the downloads run
in the background, the footers of files not yet here are read from the Hub with ranged GETs, so
the plan, the job identity and every byte are what a download-first run has; ``arrived`` then
tells the job which input is whole, and its partitions start.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from distributed import Client

from ..cluster import runner
from ..errors import UserError
from ..storage.hubspec import HubDataset
from ..storage.sources import Source, resolve_inputs
from .config import auto_partition_bytes
from .plan import BadInput, InputFile, Piece, footer_or_bad, plan_pieces, read_input_or_bad


@dataclass(frozen=True, kw_only=True)
class Located:
    """What the client found before any worker runs."""

    sources: list[Source]
    hub: HubDataset | None = None
    listing: object | None = None
    """The Hub listing (``hub.HubListing``) when reading the Hub, else None."""
    arriving: tuple = ()
    """Hub files (``hub.HubFile``) still downloading in the background, by ``fetcher``."""
    fetcher: object | None = None
    """The background downloads (``hub.Fetcher``): stop it when the run ends early."""

    def stop(self) -> None:
        """No more downloads started (the run ended, or failed before it needed them)."""
        if self.fetcher is not None:
            self.fetcher.stop()


@dataclass(frozen=True, kw_only=True)
class Corpus:
    sources: list[Source]
    files: list[InputFile]
    unreadable: list[BadInput]
    pieces: list[Piece]
    partition_bytes: int
    listing: object | None = None
    arriving: frozenset[str] = frozenset()
    """Inputs (urls) not downloaded yet: their partitions wait for ``arrived``."""

    @property
    def text_bytes(self) -> int:
        return sum(p.text_bytes for p in self.pieces)


def find_inputs(inputs: tuple[str, ...], *, storage_options: dict,
                announce: Callable[[str], None] = lambda msg: None) -> list[Source]:
    """The parquet files ``--input`` names (cheap: listings only), checked before the output is."""
    return resolve_inputs(inputs, storage_options, announce=announce) if inputs else []


def locate(sources: list[Source], *, hub: HubDataset | None, announce: Callable[[str], None],
           overlap: bool = False) -> Located:
    """List the Hub sample, and with ``--fetch client`` download it here (after the output and
    the encoding were checked: a typo must not cost a download). ``overlap``: start the download
    in the background instead; each file's identity once here is known from the listing
    (``hub.downloaded_identity``), in the HF cache and in a download folder alike."""
    if hub is None:
        return Located(sources=sources)
    from ..storage import hub as hub_io  # huggingface_hub: imported only by runs that read the Hub

    from huggingface_hub import constants

    listing = hub_io.list_files(hub)
    if hub.fetch == "client" and overlap:
        todo = hub_io.prepare_download(hub, listing, announce=announce)  # the same disk check
        fetcher = None
        if todo:
            fetcher = hub_io.Fetcher(hub, listing, todo, workers=min(hub.max_workers, hub_io.OVERLAP_DOWNLOADS)).start()
        elif not constants.is_offline_mode():
            hub_io.remember_revision(hub, listing)  # as ``download`` does, for HF_HUB_OFFLINE=1 reruns
        return Located(sources=sources + hub_io.local_sources(hub, listing), hub=hub, listing=listing,
                       arriving=tuple(todo), fetcher=fetcher)
    if hub.fetch == "client":
        sources = sources + hub_io.download(hub, listing, announce=announce)
    return Located(sources=sources, hub=hub, listing=listing)


def plan(client: Client, located: Located, *, text_column: str, id_column: str | None, storage_options: dict,
         partition_bytes: int | None, on_bad_file: str = "fail", announce: Callable[[str], None]) -> Corpus:
    """Footers on the workers (from the Hub for files still downloading), then the plan;
    unreadable inputs fail or (``skip``) are announced."""
    sources = list(located.sources)
    if located.listing is not None and located.hub.fetch == "workers":
        from ..storage import hub as hub_io

        sources += hub_io.prepare_workers(client, located.hub, located.listing, announce=announce)
    remote = _arriving_urls(located)
    here = [s for s in sources if s.url not in remote]
    files, unreadable = read_footers(client, here, text_column=text_column, id_column=id_column,
                                     storage_options=storage_options, on_bad_file=on_bad_file)
    if remote:
        found = {r.url: r for r in [*files, *unreadable, *_hub_footers(located, remote, text_column=text_column,
                                                                         id_column=id_column, on_bad_file=on_bad_file)]}
        ordered = [found[s.url] for s in sources]  # the order a download-first run has
        files = [r for r in ordered if isinstance(r, InputFile)]
        unreadable = [r for r in ordered if isinstance(r, BadInput)]
    if not files:
        raise UserError("every input was skipped as unreadable; nothing to tokenize")
    for bad in unreadable:
        announce(f"skipping unreadable input: {bad.reason}")
    size = partition_bytes or auto_partition_bytes(sum(sum(f.row_group_text_bytes) for f in files))
    return Corpus(sources=sources, files=files, unreadable=unreadable, pieces=plan_pieces(files, target_bytes=size),
                  partition_bytes=size, listing=located.listing,
                  arriving=frozenset(f.url for f in files if f.url in remote))


def _arriving_urls(located: Located) -> dict[str, object]:
    """Local url → Hub file, for the files still downloading."""
    if not located.arriving:
        return {}
    from ..storage import hub as hub_io

    return {str(hub_io.local_path(located.hub, located.listing, f)): f for f in located.arriving}


def _hub_footers(located: Located, remote: dict[str, object], *, text_column: str, id_column: str | None,
                 on_bad_file: str) -> list[InputFile | BadInput]:
    """The footers of files still downloading, from the Hub (ranged GETs, a few at a time), as
    ``InputFile``s of their local paths: the identity each will have there, the metadata it has."""
    from concurrent.futures import ThreadPoolExecutor

    from ..storage import hub as hub_io

    def one(item) -> InputFile | BadInput:
        url, f = item
        name = f.path
        return footer_or_bad(url, name,
                             lambda: (hub_io.downloaded_identity(f), hub_io.read_footer(located.hub, located.listing, f)),
                             on_bad_file=on_bad_file, text_column=text_column, id_column=id_column)

    with ThreadPoolExecutor(max_workers=min(8, len(remote))) as pool:
        return list(pool.map(one, remote.items()))


def arrived(located: Located, *, announce: Callable[[str], None]) -> Iterator[str]:
    """The url of each downloading input once it is whole and is the file planned (its identity);
    a failed download raises here, as ``download`` would."""
    if located.fetcher is None:
        return
    from ..storage import hub as hub_io
    from ..storage.store import describe_identity_change, file_identity, filesystem

    whole = 0
    for f, _ in hub_io.arrivals(located.fetcher, announce=announce):
        whole += 1
        url = str(hub_io.local_path(located.hub, located.listing, f))
        fs, path = filesystem(url, None)
        now, want = file_identity(fs, path), hub_io.downloaded_identity(f)
        if now != want:
            raise UserError(f"{url}: downloaded, but not the file the Hub listed "
                            f"({describe_identity_change(want, now)}){_unvouched(now)}; rerun")
        yield url
    if whole == len(located.arriving):
        hub_io.remember_revision(located.hub, located.listing)


def _unvouched(identity) -> str:
    """Why a file just downloaded into a folder can lack its etag: huggingface_hub's record of
    the download is older than the file by more than the 1 s it allows (``store.vouched_etag``)."""
    if "mtime_ns" not in dict(identity):
        return ""
    return ("; huggingface_hub's record of the download does not vouch for it (the file is newer than the record: "
            "written again since, or a filesystem clock ahead of this machine's)")


def wait_for_downloads(located: Located | None, *, announce: Callable[[str], None]) -> None:
    """Every background download whole, when no partition waits for one (a run leaves the
    sample downloaded, as a download-first run does)."""
    if located is not None:
        for _ in arrived(located, announce=announce):
            pass


def read_footers(client: Client, sources: list[Source], *, text_column: str, id_column: str | None,
                 storage_options: dict | None, on_bad_file: str = "fail") -> tuple[list[InputFile], list[BadInput]]:
    """Every source's footer, read by the workers (the client never opens a data file)."""
    futures = runner.submit(client, read_input_or_bad, [s.url for s in sources], [s.name for s in sources],
                            on_bad_file=on_bad_file, text_column=text_column, id_column=id_column,
                            storage_options=storage_options)
    results = runner.gather(client, futures, sources, explain=_unreachable_input)
    return [r for r in results if isinstance(r, InputFile)], [r for r in results if isinstance(r, BadInput)]


def _unreachable_input(source: Source, e: Exception) -> UserError:
    """botocore's own errors on a worker: no credentials there, no route to the store."""
    return UserError(f"{source.url}: a worker could not read it ({type(e).__name__}: {' '.join(str(e).split())[:200]}); "
                     "check that every worker has credentials and network access to the inputs")
