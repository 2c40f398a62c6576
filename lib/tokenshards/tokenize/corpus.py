"""The corpus step, shared by ``tokenize`` and ``train-bpe``: inputs (paths, globs, s3://, the Hub)
→ parquet footers read on the workers → a deterministic partition plan.

It runs in two halves around the cluster's start: ``locate`` before (listing inputs and the Hub,
and with ``--fetch client`` downloading, needs no workers), ``plan`` after (footers are read by
workers, and ``--fetch workers`` registers the Hub plugin on them).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from distributed import Client

from ..cluster import runner
from ..errors import UserError
from ..storage.hubspec import HubDataset
from ..storage.sources import Source, resolve_inputs
from .config import auto_partition_bytes
from .plan import BadInput, InputFile, Piece, plan_pieces, read_input_or_bad


@dataclass(frozen=True, kw_only=True)
class Located:
    """What the client found before any worker runs."""

    sources: list[Source]
    hub: HubDataset | None = None
    listing: object | None = None
    """The Hub listing (``hub.HubListing``) when reading the Hub, else None."""


@dataclass(frozen=True, kw_only=True)
class Corpus:
    sources: list[Source]
    files: list[InputFile]
    unreadable: list[BadInput]
    pieces: list[Piece]
    partition_bytes: int
    listing: object | None = None

    @property
    def text_bytes(self) -> int:
        return sum(p.text_bytes for p in self.pieces)


def find_inputs(inputs: tuple[str, ...], *, storage_options: dict,
                announce: Callable[[str], None] = lambda msg: None) -> list[Source]:
    """The parquet files ``--input`` names (cheap: listings only), checked before the output is."""
    return resolve_inputs(inputs, storage_options, announce=announce) if inputs else []


def locate(sources: list[Source], *, hub: HubDataset | None, announce: Callable[[str], None]) -> Located:
    """List the Hub sample, and with ``--fetch client`` download it here (after the output and
    the encoding were checked: a typo must not cost a download)."""
    if hub is None:
        return Located(sources=sources)
    from ..storage import hub as hub_io  # huggingface_hub: imported only by runs that read the Hub

    listing = hub_io.list_files(hub)
    if hub.fetch == "client":
        sources = sources + hub_io.download(hub, listing, announce=announce)
    return Located(sources=sources, hub=hub, listing=listing)


def plan(client: Client, located: Located, *, text_column: str, id_column: str | None, storage_options: dict,
         partition_bytes: int | None, on_bad_file: str = "fail", announce: Callable[[str], None]) -> Corpus:
    """Footers on the workers, then the plan; unreadable inputs fail or (``skip``) are announced."""
    sources = list(located.sources)
    if located.listing is not None and located.hub.fetch == "workers":
        from ..storage import hub as hub_io

        sources += hub_io.prepare_workers(client, located.hub, located.listing, announce=announce)
    files, unreadable = read_footers(client, sources, text_column=text_column, id_column=id_column,
                                     storage_options=storage_options, on_bad_file=on_bad_file)
    if not files:
        raise UserError("every input was skipped as unreadable; nothing to tokenize")
    for bad in unreadable:
        announce(f"skipping unreadable input: {bad.reason}")
    size = partition_bytes or auto_partition_bytes(sum(sum(f.row_group_text_bytes) for f in files))
    return Corpus(sources=sources, files=files, unreadable=unreadable, pieces=plan_pieces(files, target_bytes=size),
                  partition_bytes=size, listing=located.listing)


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
