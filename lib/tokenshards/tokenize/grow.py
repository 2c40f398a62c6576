"""Growing a finished run with more inputs (``tokenize --add``): the inputs already in OUT keep
their partitions (never read again), the new ones are planned and numbered after them, and the
manifest, written last as always, lists them all.

What makes that possible: a partition's bytes depend only on its own input, the settings and
the partition size, which OUT records and a growth reuses; every done record of a grown run
carries its first run's job hash (``parts_job``), so no committed record is rewritten. Each input
records the ``generation`` that added it (0: the first run), in the job file and the manifest.

Which run in OUT a command continues is decided here, before any footer is read: ``start``
returns None for an ordinary run (``resume.claim_output`` then decides as before), or a
``Growth``: what is kept, which inputs to plan, from which partition number.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

from ..errors import InputChanged, OutputConflict, UserError
from ..format import run as run_files
from ..format import v1
from ..format.v1 import InputRecord, Manifest, PartitionEntry
from ..storage.hubspec import PROTOCOL
from ..storage.sources import ListedInput
from ..storage.location import Location
from ..storage.store import describe_identity_change, file_identity_like, filesystem
from ..wording import counted
from .resume import describe_conflict, read_job_identity, recorded_inputs


@dataclass(frozen=True, kw_only=True)
class Growth:
    kept: Manifest
    """The finished run in OUT, whose inputs and partitions stay as they are."""
    recorded: dict
    """OUT's job file."""
    generation: int
    """The generation this growth adds (its inputs' ``generation``)."""
    first_index: int
    sources: tuple[ListedInput, ...]
    """The inputs to plan and tokenize; empty: nothing to add."""

    @property
    def parts_job(self) -> str:
        return self.kept.done_job()

    @property
    def partition_bytes(self) -> int:
        return int(self.recorded["partition_bytes"])

    def kept_entries(self) -> dict[int, PartitionEntry]:
        return {e.index: e for e in self.kept.partitions}

    def identity(self, added: dict) -> dict:
        """The grown run's job identity (its job file): ``added`` is the identity of the new inputs
        alone (``resume.job_identity``); kept inputs stay as recorded."""
        kept = {i.path for i in self.kept.input_records}
        return {**added, "inputs": [i.to_dict() for i in recorded_inputs(self.recorded) if i.path in kept]
                + [dataclasses.replace(i, generation=self.generation).to_dict() for i in recorded_inputs(added)],
                "parts_job": self.parts_job}

    def claim(self, out: Location, identity: dict) -> None:
        """Record the grown run in OUT's job file, or refuse when the settings differ from the run
        it grows, or an input of an unfinished growth changed since that growth planned it."""
        url = out.url
        settings = lambda d: {k: v for k, v in d.items() if k not in ("inputs", "parts_job")}  # noqa: E731
        old, new = settings(self.recorded), settings(identity)
        if old != new:
            raise OutputConflict(f"{url} holds a run with other options ({describe_conflict(old, new)}); "
                                 "--add keeps its options: drop the differing ones, or use another --out")
        before = {i.path: i for i in recorded_inputs(self.recorded, url=url)}
        for now in recorded_inputs(identity):
            old = before.get(now.path)
            if old is not None and old != now:
                raise InputChanged(f"{now.path} changed since an unfinished --add planned it "
                                   f"({describe_input_change(old, now)}); restore it, or pass --overwrite to tokenize "
                                   "everything again")
        if identity != self.recorded:
            out.write_json(v1.JOB_FILE, identity)

    def manifest(self, added: Manifest, *, planned: int) -> Manifest:
        """The grown run's manifest from ``added``, the manifest of the new partitions alone."""
        grown = v1.grown_manifest(self.kept, added, generation=self.generation, parts_job=self.parts_job)
        return dataclasses.replace(grown, planned_partitions=planned)

    def nothing_to_add(self, url: str, *, add: bool) -> str:
        generations = sorted({i.added_by for i in self.kept.input_records})
        held = (f"{counted(len(self.kept.inputs), 'input')} in {counted(len(generations), 'generation')} "
                f"(last: {generations[-1]})")
        if add:
            return f"--add: nothing to add: every input given is already in {url} ({held}); it is left unchanged"
        return f"nothing to do: {url} is a finished run of these inputs ({held}); it is left unchanged"


def describe_input_change(old: InputRecord, new: InputRecord) -> str:
    """What differs between two records of one input (rows, bytes, file identity)."""
    changes = [f"{k} {getattr(old, k)} → {getattr(new, k)}" for k in ("rows", "bytes") if getattr(old, k) != getattr(new, k)]
    if old.identity is not None and old.identity != new.identity:
        changes.append(describe_identity_change(old.identity, new.identity or {}))
    return ", ".join(changes) or "nothing visible"


def is_grown(recorded: dict) -> bool:
    return "parts_job" in recorded


def start(out: Location, *, add: bool, sources: list[ListedInput], partition_bytes: int | None,
          announce: Callable[[str], None] = lambda msg: None) -> Growth | None:
    """How this command continues the run in OUT: None for an ordinary run (no run there yet, or
    a run never grown and no ``--add``), else the ``Growth`` to make or finish. One-line
    refusals for what cannot be added; inputs already in OUT that are named again are checked
    against their recorded identity (a listing, never their footers)."""
    url = out.url
    try:
        recorded = read_job_identity(out)
    except FileNotFoundError:
        if add:
            announce(f"--add: {url} holds no run yet; this is its first")
        return None
    if not add and not is_grown(recorded):
        return None
    named = [s.url for s in sources]
    try:
        kept = run_files.read_manifest(out)
    except FileNotFoundError:
        if set(named) == {i.path for i in recorded_inputs(recorded, url=url)}:
            return None  # the first run, unfinished: finishing it is an ordinary resume
        raise OutputConflict(f"{url} holds an unfinished run of other inputs; rerun its own command to finish it "
                             "before adding inputs, or pass --overwrite to replace it") from None
    except run_files.BadRunFile as e:
        raise OutputConflict(f"{e}; run `tokenshards verify {url}`, or pass --overwrite") from e
    if partition_bytes is not None and partition_bytes != recorded.get("partition_bytes"):
        raise OutputConflict(f"--partition-mb {partition_bytes / 1e6:g} differs from the "
                             f"{recorded.get('partition_bytes', 0) / 1e6:g} MB the run in {url} was cut with; a growth "
                             "reuses it: drop --partition-mb")
    in_manifest = {i.path for i in kept.input_records}
    # The inputs are reached with OUT's storage options: one mapping for every URL of a run.
    _check_named_unchanged(recorded, [u for u in named if u in in_manifest], url=url,
                           storage_options=out.storage_options)
    fresh, generation, finishing = inputs_to_add(recorded, kept, named, add=add, url=url)
    growth = Growth(kept=kept, recorded=recorded, generation=generation, first_index=v1.planned_count(kept),
                    sources=tuple(s for s in sources if s.url in fresh))
    if growth.sources:
        announce(f"--add: {url} keeps its {counted(len(kept.inputs), 'input')} and "
                 f"{counted(len(kept.partitions), 'partition')} as they are; {'finishing' if finishing else 'adding'} "
                 f"{counted(len(growth.sources), 'input')} as generation {generation}, partitions from {growth.first_index}")
    return growth


def inputs_to_add(recorded: dict, kept: Manifest, named: list[str], *, add: bool, url: str) -> tuple[set[str], int, bool]:
    """(the inputs of ``named`` to plan, their generation, whether they finish an interrupted
    growth), given OUT's job file and finished manifest; or a one-line refusal. Pure.

    Inputs in the job file but not in the manifest are an unfinished growth: only the same inputs
    may be named beyond those in OUT, until it is finished. Without ``--add`` (a grown run), the
    named inputs must be the run's."""
    recorded_paths = [i.path for i in recorded_inputs(recorded, url=url)]
    in_manifest = {i.path for i in kept.input_records}
    pending = [p for p in recorded_paths if p not in in_manifest]
    fresh = {u for u in named if u not in in_manifest}
    if pending and fresh != set(pending):
        raise OutputConflict(f"{url} holds an unfinished --add of {counted(len(pending), 'input')} (first: {pending[0]}); "
                             "rerun that command to finish it before adding others")
    if not add and set(named) != set(recorded_paths):
        added, removed = set(named) - set(recorded_paths), set(recorded_paths) - set(named)
        hint = (f"; to add the {counted(len(added), 'new input')}, pass --add" if not removed
                else "; use another --out, or pass --overwrite to replace it")
        raise OutputConflict(f"{url} holds a grown run of other inputs ({len(added)} added, {len(removed)} removed){hint}")
    if pending:
        return fresh, max(i.added_by for i in recorded_inputs(recorded, url=url)), True
    return fresh, max((i.added_by for i in kept.input_records), default=0) + 1, False


def _check_named_unchanged(recorded: dict, urls: list[str], *, url: str, storage_options: dict) -> None:
    """Inputs already in OUT and named again must be the files their partitions were made of."""
    before = {i.path: i.identity for i in recorded_inputs(recorded, url=url)}
    for path in urls:
        old = before.get(path)
        if not old or path.startswith(f"{PROTOCOL}://"):
            continue  # recorded without an identity (an early version), or opened by workers only
        try:
            now = dict(file_identity_like(*filesystem(path, storage_options), old))
        except FileNotFoundError as e:
            raise UserError(f"{path}: listed a moment ago, gone now; rerun once it is back") from e
        if now != dict(old):
            raise InputChanged(f"{path} changed since it was added to {url} ({describe_identity_change(old, now)}); "
                               "its partitions there are of the earlier version: restore it, add it under another name, "
                               "or pass --overwrite to tokenize everything again")
