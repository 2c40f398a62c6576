"""The corpus step, shared by ``tokenize`` and ``train-bpe``: inputs (paths, globs, s3://, the Hub)
→ parquet footers → a deterministic partition plan.

It runs in two halves around the cluster's start: ``find_inputs`` and ``open_inputs`` before
(listing inputs and the Hub, needing no workers; on a local cluster a Hub download starts here,
to overlap the cluster's start), ``gather`` after (the inputs' worker set-up, their footers, the
plan). Every kind of input is one implementation of ``inputs.Inputs``: nothing here branches on
where a file comes from or who fetches it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from distributed import Client

from ..cluster.connect import starts_local_cluster
from ..cluster.options import RunOptions
from ..errors import UserError
from ..storage.hubspec import HubDataset
from ..storage.sources import ListedInput, resolve_inputs
from .inputs import FooterRequest, Inputs, open_inputs as _open_inputs
from .plan import BadInput, InputFile, Piece, auto_partition_bytes, plan_pieces


@dataclass(frozen=True, kw_only=True)
class Corpus:
    sources: list[ListedInput]
    files: list[InputFile]
    unreadable: list[BadInput]
    pieces: list[Piece]
    partition_bytes: int
    record: dict = field(default_factory=dict)
    """Extra manifest keys saying where the inputs came from (``{"hub": ...}``)."""
    arriving: frozenset[str] = frozenset()
    """Inputs (urls) not whole yet: their partitions wait for the inputs' ``arrivals``."""

    @property
    def text_bytes(self) -> int:
        return sum(p.text_bytes for p in self.pieces)


def find_inputs(inputs: tuple[str, ...], *, storage_options: dict,
                announce: Callable[[str], None] = lambda msg: None) -> list[ListedInput]:
    """The parquet files ``--input`` names (cheap: listings only), checked before the output is."""
    return resolve_inputs(inputs, storage_options, announce=announce) if inputs else []


def open_inputs(sources: list[ListedInput], *, hub: HubDataset | None, options: RunOptions, announce: Callable[[str], None],
                overlap: bool = False) -> Inputs:
    """``sources`` and the Hub sample as the run's inputs (after the output and the encoding were
    checked: a typo must not cost a download). ``overlap``: tokenize while the Hub downloads."""
    local = starts_local_cluster(scheduler=options.scheduler, cluster_config=options.cluster_config,
                                 workers=options.workers)
    return _open_inputs(sources, hub=hub, local_cluster=local, overlap=overlap, announce=announce)


def gather(client: Client, inputs: Inputs, *, text_column: str, id_column: str | None, storage_options: dict,
         partition_bytes: int | None, on_bad_file: str = "fail", announce: Callable[[str], None],
         first_index: int = 0, chat: bool = False) -> Corpus:
    """The inputs' worker set-up, their footers, then the plan; unreadable inputs fail or
    (``skip``) are announced. ``first_index``: the first partition's number (after the partitions
    of the run a growth adds to)."""
    inputs.set_up(client, announce=announce)
    found = inputs.footers(client, FooterRequest(text_column=text_column, id_column=id_column,
                                                 storage_options=storage_options, on_bad_file=on_bad_file,
                                                 chat=chat))
    files = [r for r in found if isinstance(r, InputFile)]
    unreadable = [r for r in found if isinstance(r, BadInput)]
    if not files:
        raise UserError("every input was skipped as unreadable (--on-bad-file skip): nothing is left to read")
    for bad in unreadable:
        announce(f"skipping unreadable input: {bad.reason}")
    size = partition_bytes or auto_partition_bytes(sum(sum(f.row_group_text_bytes) for f in files))
    arriving = inputs.arriving()
    return Corpus(sources=inputs.sources(), files=files, unreadable=unreadable,
                  pieces=plan_pieces(files, target_bytes=size, first_index=first_index), partition_bytes=size, record=inputs.record(),
                  arriving=frozenset(f.url for f in files if f.url in arriving))
