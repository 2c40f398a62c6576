"""Which machines the workers run on, and whether they see the client's local paths.

A Dask cluster need not share a disk: a local ``--out`` on the client is a different folder on
every worker machine, and a run that writes there ends "done" with its files scattered over
disks the user never looks at. So before any work, every command that hands a local path to
its workers asks one worker per other machine to read back what the client sees there (a
probe file the client writes in an output folder, the size and mtime of input files), and
stops in one line when a machine sees something else. Machines that share the client's view
(a LocalCluster, workers started on the same machine) are skipped, so a one-machine run pays
one ``client.run`` round trip and no task.

A machine is more than its host name (``namespaces.file_view``: where a path means one file).
"""
from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..errors import UserError
from ..namespaces import file_view

PROBE_PREFIX = ".tokenshards-view-probe-"
PROBE_SAMPLE = 8
"""Input files whose size and mtime each machine compares: the first, the last and some between."""
PROBE_TIMEOUT = 60.0
"""Seconds to wait for the probes: one tiny task per machine, queued behind nothing of ours."""


def _whoami() -> tuple[str, str]:
    return socket.gethostname(), file_view()


@dataclass(frozen=True, kw_only=True)
class Machine:
    name: str
    """Its host name, for messages."""
    view: str
    worker: str
    """One of its workers' addresses: where its probe runs."""


def other_machines(client) -> list[Machine]:
    """One entry per machine whose file view differs from this process's, with one worker each.
    Empty on a LocalCluster and whenever every worker shares this machine's view."""
    mine = file_view()
    found: dict[str, Machine] = {}
    for address, (name, view) in sorted(client.run(_whoami).items()):
        if view != mine and view not in found:
            found[view] = Machine(name=name, view=view, worker=address)
    return list(found.values())


# -- what is compared --

@dataclass(frozen=True, kw_only=True)
class PathUse:
    """A local path a command hands to its workers, and what they do there."""

    option: str
    """How the user named it: ``--out``, ``--input``, ``RUN``..."""
    url: str
    writes: bool
    """Workers write under it (a folder): checked with a probe file the client writes there."""
    files: tuple[str, ...] = ()
    """For reads: the files the workers will open (a sample is compared)."""


def reading_inputs(inputs: Sequence[str], urls: Sequence[str]) -> list[PathUse]:
    """The local files among ``urls`` that ``--input`` named, as workers read them (none: nothing to check)."""
    local = [u for u in urls if is_local_path(u)]
    if not local:
        return []
    named = inputs[0] if len(inputs) == 1 else os.path.commonpath(local)
    return [PathUse(option="--input", url=named, writes=False, files=tuple(local))]


def reading_run(option: str, url: str, files: Sequence[str]) -> PathUse:
    """A finished run's folder whose ``files`` (manifest, part files) the workers read."""
    return PathUse(option=option, url=url, writes=False, files=tuple(files))


def _stat(path: str) -> tuple[int, int] | None:
    """Size and mtime, read through an open file: on NFS, opening revalidates what a plain stat
    may take from another machine's attribute cache (close-to-open consistency)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
    except OSError:
        return None
    return st.st_size, int(st.st_mtime)


def _sample(files: Sequence[str]) -> list[str]:
    if len(files) <= PROBE_SAMPLE:
        return list(files)
    step = (len(files) - 1) / (PROBE_SAMPLE - 1)
    return [files[round(i * step)] for i in range(PROBE_SAMPLE)]


def _read_probe(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _look(expected: dict[str, object]) -> list[str]:
    """On a worker: the paths whose probe file or stat differs from what the client saw."""
    differs = []
    for path, want in expected.items():
        seen = _read_probe(path) if isinstance(want, bytes) else _stat(path)
        if seen != want:
            differs.append(path)
    return differs


def is_local_path(url: str) -> bool:
    """A path of this machine's filesystem, not a URL of a store every machine reaches (s3://,
    hf://, a worker-side ``hfcache://``): told by its form alone, no filesystem is built."""
    return "://" not in url or url.startswith("file://")


def _absolute(url: str) -> str:
    return os.path.abspath(url.removeprefix("file://"))


def local_uses(uses: Iterable[PathUse]) -> list[PathUse]:
    return [u for u in uses if is_local_path(u.url)]


def check_same_view(client, uses: Iterable[PathUse]) -> None:
    """Stop, in one line, when a worker machine sees something else than this one at a local
    path the command hands to the workers. Costs one ``client.run`` and one task per other machine."""
    for use, names in blind_machines(client, uses).items():
        raise UserError(_not_shared(use, names))


def blind_machines(client, uses: Iterable[PathUse]) -> dict[PathUse, list[str]]:
    """Each local path that some worker machines see otherwise than this one → their host names."""
    import distributed  # here, not above: inspect's stats take is_local_path without Dask's start-up

    uses = local_uses(uses)
    if not uses:
        return {}
    # A cluster still starting (SLURM jobs in the queue) is checked on its first worker: the job
    # waits for one anyway. Later ones are not; tokenize checks its parts before committing.
    wait_for_a_worker(client)
    machines = other_machines(client)
    if not machines:
        return {}
    expected: dict[str, object] = {}
    probes: list[str] = []
    owner: dict[str, PathUse] = {}
    try:
        for use in uses:
            if use.writes:
                path = os.path.join(_absolute(use.url), f"{PROBE_PREFIX}{uuid.uuid4().hex}")
                token = uuid.uuid4().bytes
                probes.append(path)  # removed below even when the write fails (a full disk keeps the file)
                _write_probe(path, token, use)
                expected[path], owner[path] = token, use
            for f in _sample([_absolute(p) for p in use.files]):
                expected[f], owner[f] = _stat(f), use
        futures = [client.submit(_look, expected, workers=[m.worker], allow_other_workers=False, pure=False,
                                 key=f"tokenshards-view-probe-{uuid.uuid4().hex}") for m in machines]
        try:
            distributed.wait(futures, timeout=PROBE_TIMEOUT)
            results = client.gather(futures)
        except TimeoutError as e:
            for future in futures:  # released, as runner.drop does (machines is imported by runner)
                future.release()
            raise UserError(f"the workers on {', '.join(m.name for m in machines)} did not answer a check of the local "
                            f"paths within {PROBE_TIMEOUT:.0f} s; are they busy with another job?") from e
    finally:
        for p in probes:
            try:
                os.remove(p)
            except OSError:
                pass
    blind: dict[PathUse, set[str]] = {}
    for machine, differs in zip(machines, results):
        for path in differs:
            blind.setdefault(owner[path], set()).add(machine.name)
    return {use: sorted(names) for use, names in blind.items()}


def wait_for_a_worker(client, *, every: float = 2.0) -> None:
    """Until one worker is connected, or the client is closed (a watch that gave up on the
    cluster closes it: ``slurm.SlurmJobsWatch``), which raises here as any lost client would."""
    while True:
        try:
            client.wait_for_workers(1, timeout=every)
            return
        except TimeoutError:
            if client.status != "running":
                raise RuntimeError(f"the Dask client was closed ({client.status}) while waiting for a worker") from None


def _write_probe(path: str, token: bytes, use: PathUse) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(token)
    except OSError as e:
        raise UserError(f"cannot write to {use.option} {use.url}: {type(e).__name__}: {e.strerror or e}; "
                        "choose another path or fix its permissions") from e


def listed(names: list[str], *, most: int = 5) -> str:
    """Host names for a message: the first ``most``, then how many more."""
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _not_shared(use: PathUse, machines: list[str]) -> str:
    here = socket.gethostname()
    hosts = listed(machines)
    if use.writes:
        return (f"{use.option} {use.url} is a local path of this machine ({here}), and the workers on {hosts} see "
                f"another folder there: what they write would land on their own disks, not in {here}'s {use.url}; "
                "use s3://BUCKET/PREFIX, or a folder on a filesystem every machine mounts (NFS, a cluster's /scratch)")
    return (f"{use.option} {use.url}: the workers on {hosts} do not see the files this machine ({here}) sees there; "
            "put them on s3://BUCKET/PREFIX or on a filesystem every machine mounts "
            "(Hub inputs: --fetch workers)")
