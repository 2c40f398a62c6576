"""What ``inspect`` reads and where: shared by the command and its cluster path."""
from __future__ import annotations

from dataclasses import dataclass

from ..cluster.options import RunOptions


@dataclass(frozen=True, kw_only=True)
class InspectConfig(RunOptions):
    """What to inspect and where it runs; the CLI fills it."""

    out: str
    language_column: str = "language"

    def names_a_cluster(self) -> bool:
        return self.workers is not None or self.scheduler is not None or self.cluster_config is not None
