"""The interface every kind of input implements, and ``Several`` (inputs of more than one kind)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, Iterator

from distributed import Client

from ...cluster.runner import Lane
from ...storage.sources import ListedInput
from ..plan import BadInput, InputFile

Announce = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class FooterRequest:
    """What planning needs from a footer, and what to do with a file that has none."""

    text_column: str
    id_column: str | None
    storage_options: dict = field(default_factory=dict)
    on_bad_file: str = "fail"
    chat: bool = False
    """``text_column`` is ``--chat-column``'s: it must hold conversations."""


class Inputs(ABC):
    """Where a job's parquet files come from: tokenize and train-bpe read every kind through this.

    In the order a job calls them: ``sources`` (which files, listed before any cluster runs: a
    typo costs nothing), ``set_up`` (once the cluster runs: what the workers need, and what must be
    checked there), ``footers`` (each file's parquet metadata and the identity it has where tasks
    open it), then ``arriving``/``arrivals`` (which files are not whole yet, and each as it is) and
    ``lane_of`` (where a file's partitions should run). ``record`` goes into the manifest;
    ``close`` stops whatever still runs in the background."""

    @abstractmethod
    def sources(self) -> list[ListedInput]:
        """Every file, with the url tasks open it at and the name document ids use."""

    def set_up(self, client: Client, *, announce: Announce) -> None:
        """Once the cluster runs, before any footer is read. Nothing to do by default."""

    @abstractmethod
    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        """Each source's footer, in ``sources()`` order; an unreadable one is a ``BadInput`` under
        ``on_bad_file="skip"``, else an ``InputError``."""

    def arriving(self) -> frozenset[str]:
        """Urls of files not whole yet, whose partitions must wait for ``arrivals``. None by default."""
        return frozenset()

    def arrivals(self, *, announce: Announce) -> Iterator[str]:
        """Each url of ``arriving()`` once the file is whole (and is the file planned). It may block
        (a job iterates it on a thread of its own) and raises what must stop the run. Call once."""
        return iter(())

    def lane_of(self, url: str) -> Lane | None:
        """Where the partitions of ``url`` should run; None (the default): anywhere."""
        return None

    def record(self) -> dict:
        """Extra manifest keys saying where the inputs came from (e.g. ``{"hub": ...}``)."""
        return {}

    def close(self) -> None:
        """The run ended (or failed): stop what runs in the background. Nothing by default."""


class Several(Inputs):
    """Inputs of several kinds in one run (``--input`` paths besides ``--dataset``), in the order given."""

    def __init__(self, parts: list[Inputs]):
        self.parts = list(parts)

    def sources(self) -> list[ListedInput]:
        return [s for part in self.parts for s in part.sources()]

    def set_up(self, client: Client, *, announce: Announce) -> None:
        for part in self.parts:
            part.set_up(client, announce=announce)

    def footers(self, client: Client, request: FooterRequest) -> list[InputFile | BadInput]:
        return [r for part in self.parts for r in part.footers(client, request)]

    def arriving(self) -> frozenset[str]:
        return frozenset().union(*(part.arriving() for part in self.parts))

    def arrivals(self, *, announce: Announce) -> Iterator[str]:
        for part in self.parts:
            yield from part.arrivals(announce=announce)

    def lane_of(self, url: str) -> Lane | None:
        return next((lane for part in self.parts if (lane := part.lane_of(url)) is not None), None)

    def record(self) -> dict:
        return {k: v for part in self.parts for k, v in part.record().items()}

    def close(self) -> None:
        for part in self.parts:
            part.close()
