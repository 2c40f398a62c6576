"""The bounds of every numeric option, checked when a command's configuration is built, before any
work: a value that is not a finite number (``inf``, ``nan``, ``1e400``), not whole where a count is
meant, or outside what the command can do (``10**20`` tokens) is one line naming the option, never
an ``OverflowError`` deep inside."""
from __future__ import annotations

import math
import os

from .errors import UserError

MAX_COUNT = 2**53
"""Tokens, documents, bytes, rows: 9 quadrillion, more than any corpus, and every count up to it is
exact as a float too (numpy and the progress lines may hold one as a float)."""
MAX_SEED = 2**64 - 1
MIN_SEED = -(2**63)
MAX_SEQ_LEN = 2**31 - 1
"""Packed rows store positions and sequence lengths as int32 (Hugging Face's and Megatron's)."""
MAX_VOCAB = 2**32
"""Format v1 stores ids as uint32 at most: a vocabulary holds ids below 2**32."""
MAX_WEIGHT = 1e15
MAX_REMOTE_WORKERS = 100_000
"""A cluster config's workers (SLURM, Kubernetes): far more than any cluster here, small enough to plan."""
WORKERS_PER_CORE = 4
"""Local process workers beyond one per core only share cores (tiktoken holds the GIL per process);
a few more hide I/O waits, and past this many they cost memory and start-up for nothing."""
MEMORY_PER_WORKER = 500 * 2**20
"""A local process worker's memory at start (~0.3 GB: Dask, the encoding; docs/guide/tokenize.md),
with room for its first partition."""


def whole(option: str, value, *, low: int | None = None, high: int, what: str = "a whole number") -> int:
    """``value`` as an int in ``low..high`` (``low`` None: the option says its own lower bound after
    this), else a one-line ``UserError`` naming ``option``. Floats are taken when finite and whole
    (``1e9``); ``inf``, ``nan`` and ``1.5`` are not."""
    expected = f"{what} of at most {high:,}" if low is None else f"{what} from {low:,} to {high:,}"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise UserError(f"{option} {value!r}: expected {expected}")
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{option} {value!r}: not a finite number; expected {expected}")
        if not value.is_integer():
            raise UserError(f"{option} {value!r}: not a whole number; expected {expected}")
        value = int(value)
    if value > high or (low is not None and value < low):
        shown = f"{value:,}" if abs(value) < 10**30 else f"{float(value):.3g}"
        raise UserError(f"{option} {shown}: out of range; expected {expected}")
    return value


def number(option: str, value, *, high: float, what: str = "a number") -> float:
    """``value`` as a finite float of at most ``high`` in size (the option says its own lower
    bound after this), else one line."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(float(value)):
        raise UserError(f"{option} {value!r}: not a finite number; expected {what} of at most {high:g}")
    if abs(value) > high:
        raise UserError(f"{option} {value:g}: out of range; expected {what} of at most {high:g}")
    return float(value)


def cores() -> int:
    """The cores this process may run on (its affinity: a container's or ``taskset``'s share)."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def memory() -> int:
    """This machine's memory in bytes (0 when it cannot tell)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return 0


def local_workers_cap() -> tuple[int, str]:
    """(the most local process workers this machine can hold, how that was decided): at most
    ``WORKERS_PER_CORE`` per core and one per ``MEMORY_PER_WORKER`` of memory."""
    n_cores, mem = cores(), memory()
    by_cores = WORKERS_PER_CORE * n_cores
    by_memory = max(1, mem // MEMORY_PER_WORKER) if mem else by_cores
    cap = max(1, min(by_cores, by_memory))
    how = (f"{WORKERS_PER_CORE} per core on its {n_cores} core{'s' if n_cores != 1 else ''}"
           + (f", and one per {MEMORY_PER_WORKER / 2**30:.1f} GiB of its {mem / 2**30:.1f} GiB of memory" if mem else ""))
    return cap, how


def local_workers(option: str, value) -> int:
    """``--workers`` for a cluster started on this machine: a whole number from 1 to what it can hold."""
    n = whole(option, value, low=1, high=10**9, what="a number of workers")
    cap, how = local_workers_cap()
    if n > cap:
        raise UserError(f"{option} {n:,}: this machine can hold at most {cap} local process workers ({how}); pass "
                        f"{option} {cap} or fewer, or run on a cluster (--scheduler, --cluster)")
    return n
