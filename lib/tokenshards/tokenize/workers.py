"""What the local workers of a run start with, handed to ``cluster.prestart`` by the command line:
the modules a partition's task imports and, when the command names its encodings and backend,
those encoders built once in the server (``encoding.prebuilt``)."""
from __future__ import annotations

from typing import Sequence

from ..cluster.prestart import ForkserverPreload
from ..encoding import prebuilt

TASK_MODULES = ("tokenshards.tokenize.task", "tokenshards.corpus.read", "tokenshards.tokenize.groups")
"""What a partition's task names (``test_a_partition_task_names_only_modules_the_workers_start_with``),
and a group's (``tokenize.groups``: several small partitions to a task)."""


def forkserver_preload(encodings: str | Sequence[str] = (), backend: str | None = None) -> ForkserverPreload:
    return ForkserverPreload(modules=TASK_MODULES).then(prebuilt.preload(encodings, backend))
