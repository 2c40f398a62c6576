"""Where a job runs and how it reaches storage: the settings every job's config shares."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import limits
from ..errors import UserError
from ..storage.store import storage_options
from .progress import MODES


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Where a job runs and how it reaches storage: every command that starts Dask work takes
    these, and none of them changes what the job writes."""

    storage_options: dict = field(default_factory=dict)
    workers: int | None = None
    scheduler: str | None = None
    cluster_config: str | None = None
    """A ``cluster_configs/*.yaml``: local, an existing scheduler, SLURM, Kubernetes, SSH."""
    dashboard_address: str | None = "127.0.0.1:8787"
    """Loopback unless a host is named (``connect.loopback_unless_named``); None: no dashboard."""
    progress: str = "auto"
    """How progress shows (``progress.MODES``): a live line on a terminal, a short log, or nothing."""

    def __post_init__(self):
        # Checked once, and wrapped so that credentials never print (a repr, distributed's log of a failed task).
        object.__setattr__(self, "storage_options", storage_options(self.storage_options))
        if self.workers is not None:
            workers = limits.whole("--workers", self.workers, high=limits.MAX_COUNT,
                                   what="a number of workers")
            if workers < 1:
                raise UserError(f"--workers {workers} must be at least 1")
            # a cluster started here: what this machine can hold (limits.local_workers); else any cluster's
            object.__setattr__(self, "workers", limits.local_workers("--workers", workers)
                               if self.scheduler is None and self.cluster_config is None else
                               limits.whole("--workers", workers, low=1, high=limits.MAX_REMOTE_WORKERS,
                                            what="a number of workers"))
        if self.progress not in MODES:
            raise UserError(f"--progress {self.progress!r} not supported, expected one of {', '.join(MODES)}")
        if self.scheduler is not None and self.scheduler.lower().startswith(("http://", "https://")):
            raise UserError(f"--scheduler {self.scheduler!r} is a web address, likely the dashboard's URL (port 8787 by "
                            "default): pass the scheduler's own address, tcp://HOST:8786 unless it was started otherwise")
        check_dashboard_address(self.dashboard_address)
        if self.scheduler is not None and self.workers is not None:
            raise UserError(f"--workers {self.workers} sizes a local cluster; with --scheduler the scheduler's own workers "
                            "run: drop --workers, or start more with `dask worker`")


def check_dashboard_address(address) -> None:
    """``HOST:PORT`` or ``:PORT`` with a port in 0..65535 (0: any free port), else a one-line
    ``UserError``: distributed would take ``notaport`` with a traceback and ``:99999`` by moving
    to a random port without a word."""
    if address is None:
        return
    text = str(address)
    _, colon, port = text.rpartition(":")
    if not (port.isdigit() and int(port) <= 65535 and (colon or text.isdigit())):
        raise UserError(f"--dashboard-address {text!r}: expected HOST:PORT or :PORT with a port in 0..65535 "
                        "(e.g. :8787, 127.0.0.1:8787, or :0 for any free port)")
