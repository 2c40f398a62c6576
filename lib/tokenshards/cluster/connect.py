"""Where the work runs: a LocalCluster, an existing scheduler, or a cluster described by a
``cluster_configs/NAME.yaml`` file (read and validated by ``configfile``).

The backends' own classes do the work (dask-jobqueue, dask-kubernetes, distributed's SSHCluster);
this module turns a valid config into their keyword arguments, and ``slurm`` watches the SLURM jobs.
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
from typing import Callable, Iterator

import dask
from distributed import Client, LocalCluster, SSHCluster, WorkerPlugin

from . import interrupt
from .configfile import ClusterConfig, load_cluster_config
from .prestart import REUSE_BYTES, gc_paused, reuse_freed_memory
from ..errors import UserError
from .slurm import SlurmJobsWatch, check_slurm_job
from ..wording import counted

CLUSTER_DEFAULTS = {
    # A worker that dies (OOM kill, lost machine) is not a task error: Dask reschedules its
    # tasks up to this many times before it gives up on them. Only schedulers started by this
    # process see it; start your own `dask scheduler` with DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES=5.
    "distributed.scheduler.allowed-failures": 5,
}

# -- turning a config into the backend's objects --

def slurm_cluster(config: ClusterConfig):
    """A ``SLURMCluster`` (its scheduler runs in this process; no job is submitted until
    ``scale``): ``.job_script()`` shows what ``sbatch`` would get."""
    from dask_jobqueue import SLURMCluster  # optional: tokenshards[slurm]

    options = {"silence_logs": "error", **config.settings["options"]}
    try:
        return SLURMCluster(**options)
    except (TypeError, ValueError) as e:
        raise UserError(f"cluster config {config.path}: dask-jobqueue rejected the options: {e}") from e


def kubernetes_spec(config: ClusterConfig) -> dict:
    """The ``DaskCluster`` resource the dask-kubernetes operator gets, built without a cluster.

    dask-kubernetes 2026.3 still starts pods with ``dask-scheduler`` / ``dask-worker``, commands
    distributed removed in 2026.6; the spec here runs ``dask scheduler`` / ``dask worker``.
    """
    from dask_kubernetes.operator import make_cluster_spec  # optional: tokenshards[kubernetes]

    options = config.settings["options"]
    spec = make_cluster_spec(
        name=options.get("name", "tokenshards"),
        image=options.get("image", "ghcr.io/dask/dask:latest"),
        n_workers=config.workers,
        resources=options.get("resources"),
        env=options.get("env"),
        worker_command=options.get("worker_command", "dask worker"),
        scheduler_service_type=options.get("scheduler_service_type", "ClusterIP"),
        idle_timeout=options.get("idle_timeout", 0),
    )
    for container in spec["spec"]["scheduler"]["spec"]["containers"]:
        if container["args"][:1] == ["dask-scheduler"]:
            container["args"] = ["dask", "scheduler"] + container["args"][1:]
    return spec


def kubernetes_cluster(config: ClusterConfig):
    from dask_kubernetes.operator import KubeCluster  # optional: tokenshards[kubernetes]

    options = config.settings["options"]
    extra = {k: options[k] for k in ("namespace", "resource_timeout", "scheduler_forward_port") if k in options}
    return KubeCluster(custom_cluster_spec=kubernetes_spec(config), shutdown_on_close=True, quiet=True, **extra)


def ssh_cluster(config: ClusterConfig):
    s = config.settings
    # One thread per worker process: tiktoken holds the GIL while it encodes.
    worker_options = {"nthreads": 1, **s.get("worker_options", {})}
    return SSHCluster(hosts=s["hosts"], connect_options=s.get("connect_options", {}), worker_options=worker_options,
                      scheduler_options=s.get("scheduler_options", {}), remote_python=s.get("remote_python"))


# -- the client --

def starts_local_cluster(*, scheduler: str | None, cluster_config: str | None, workers: int | None = None) -> bool:
    """Whether ``connect`` with these options starts a LocalCluster here (its workers then share
    this machine's disk): no ``--scheduler``, and no ``--cluster`` of another kind."""
    if scheduler:
        return False
    return cluster_config is None or load_cluster_config(cluster_config, workers=workers).kind == "local"


def loopback_unless_named(address: str) -> str:
    """``:PORT`` → ``127.0.0.1:PORT``: distributed binds a host-less dashboard to every interface,
    while the link it prints says 127.0.0.1; on a shared machine anyone on the network would see the
    task stream. Naming a host (``0.0.0.0:8787``) opens it on purpose."""
    text = str(address)
    return f"127.0.0.1{text}" if text.startswith(":") else text


def free_or_any_port(address: str) -> str:
    """``address``, or the same host with any free port (``:0``) when its port is taken. distributed,
    finding the dashboard's port taken, binds another itself but leaks the socket it tried (a
    ResourceWarning in every such run; common on a shared machine, or with several runs at once).
    The link announced is the one the dashboard got either way."""
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) == 0:
        return address
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tornado binds: TIME_WAIT is no conflict
        try:
            probe.bind((host or "0.0.0.0", int(port)))
        except OSError:
            return f"{host}:0"
    return address


def dashboard_arguments(address: str | None) -> dict:
    """``LocalCluster``'s arguments for a dashboard at ``address`` (``loopback_unless_named``,
    ``free_or_any_port``), or for none (None). Without one, distributed's scheduler still serves its
    other routes (health, metrics), on 8787 unless told: a free loopback port, and bokeh never imported."""
    if address is None:
        return {"dashboard_address": "127.0.0.1:0", "scheduler_kwargs": {"dashboard": False}}
    return {"dashboard_address": free_or_any_port(loopback_unless_named(address))}


@contextlib.contextmanager
def connect(*, workers: int | None = None, scheduler: str | None = None, dashboard_address: str | None = "127.0.0.1:8787",
            announce: Callable[[str], None] = print, cluster_config: str | None = None) -> Iterator[Client]:
    """A client on an existing scheduler, on the cluster a config file describes, or on a fresh
    LocalCluster (one thread per process worker: tiktoken holds the GIL on ``encode_ordinary``,
    so threads would not help). The first thing announced is the dashboard link."""
    if cluster_config and scheduler:
        raise UserError("pass either --scheduler or --cluster, not both")
    config = load_cluster_config(cluster_config, workers=workers) if cluster_config else None
    with dask.config.set(CLUSTER_DEFAULTS), dask.config.set(config.dask_config if config else {}):
        if config is not None and config.kind == "scheduler":
            s = config.settings
            with _remote_client(address=s.get("address"), scheduler_file=s.get("scheduler_file"),
                                timeout=s.get("timeout", "30s"), announce=announce) as client:
                yield client
        elif scheduler:
            with _remote_client(address=scheduler, announce=announce) as client:
                yield client
        elif config is not None and config.kind != "local":
            with _backend_client(config, announce=announce) as client:
                yield client
        else:
            s = config.settings if config else {}
            n = s.get("workers") or workers or os.cpu_count() or 1
            source = f" ({config.path})" if config else ""
            address = s.get("dashboard_address", dashboard_address)  # None: no dashboard (--no-dashboard, or null)
            with interrupt.children_ignore_ctrl_c(), gc_paused():  # bokeh's dashboard, mostly: prestart.gc_paused
                cluster = LocalCluster(n_workers=n, threads_per_worker=s.get("threads_per_worker", 1), processes=True,
                                       memory_limit=s.get("memory_limit", "auto"), silence_logs=logging.CRITICAL,
                                       **dashboard_arguments(address))
            # Its workers are on this machine: results come straight from them, not relayed by
            # the scheduler (which, in this process, would serialize each result once more).
            with cluster, Client(cluster, direct_to_workers=True) as client:
                link = "off" if address is None else client.dashboard_link
                announce(f"dashboard: {link}  (local cluster{source}: {counted(n, 'process worker')})")
                if os.environ.get("MALLOC_TRIM_THRESHOLD_") != REUSE_BYTES:  # not forked from our forkserver
                    client.register_plugin(ReuseFreedMemory())
                yield client


class ReuseFreedMemory(WorkerPlugin):
    """``prestart.reuse_freed_memory`` on every worker of a cluster we did not start with our
    forkserver (``dask worker`` by hand, SLURM, Kubernetes, SSH), those that join later included."""

    name = "tokenshards-reuse-freed-memory"
    idempotent = True

    def setup(self, worker):
        reuse_freed_memory()


@contextlib.contextmanager
def _remote_client(*, address: str | None = None, scheduler_file: str | None = None, timeout: str = "15s",
                   announce: Callable[[str], None]) -> Iterator[Client]:
    where = address or f"the scheduler file {scheduler_file}"
    if scheduler_file and not os.path.exists(scheduler_file):
        raise UserError(f"scheduler file {scheduler_file} not found; start `dask scheduler --scheduler-file {scheduler_file}` first")
    try:
        client = Client(address=address, scheduler_file=scheduler_file, timeout=timeout)
    except (OSError, TimeoutError) as e:
        raise UserError(f"cannot reach the Dask scheduler at {where}: {e}; is `dask scheduler` running there?") from e
    with client:
        client.register_plugin(ReuseFreedMemory())
        info = client.scheduler_info(n_workers=-1)
        n = len(info["workers"])
        link = served_dashboard(client, info) or "off"
        announce(f"dashboard: {link}  (scheduler {client.scheduler.address}, {counted(n, 'worker')}"
                 + ("; tasks wait until a `dask worker` joins" if n == 0 else "") + ")")
        yield client


def served_dashboard(client: Client, info: dict) -> str | None:
    """The scheduler's dashboard link, or None when it serves none. A scheduler always runs its HTTP
    server (health, metrics: ``info["services"]["dashboard"]`` is its port) but only one started with
    a dashboard has a ``/status`` (``dask scheduler --no-dashboard``: 404; HEAD, so that bokeh renders
    nothing, answers 405 where the page is). Asked once, briefly; a
    server this machine cannot reach (another network, a tunnel) keeps its link: the browser may."""
    import urllib.error
    import urllib.request

    port = (info.get("services") or {}).get("dashboard")
    if port is None:
        return None
    link = client.dashboard_link
    host = client.scheduler.address.split("://", 1)[-1].rsplit(":", 1)[0].strip("[]")
    scheme = "https" if link and link.startswith("https:") else "http"
    probe = urllib.request.Request(f"{scheme}://{host}:{port}/status", method="HEAD")  # no page rendered
    try:
        with urllib.request.urlopen(probe, timeout=DASHBOARD_PROBE_SECONDS):
            return link
    except urllib.error.HTTPError as e:
        e.close()
        return None if e.code == 404 else link
    except (OSError, ValueError):
        return link


DASHBOARD_PROBE_SECONDS = 3.0


@contextlib.contextmanager
def _backend_client(config: ClusterConfig, *, announce: Callable[[str], None]) -> Iterator[Client]:
    build = {"slurm": slurm_cluster, "kubernetes": kubernetes_cluster, "ssh": ssh_cluster}[config.kind]
    try:
        cluster = build(config)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cluster config {config.path}: could not start the {config.kind} cluster: "
                        f"{type(e).__name__}: {e}") from e
    with cluster, Client(cluster) as client:
        client.register_plugin(ReuseFreedMemory())
        if config.kind == "slurm":
            check_slurm_job(cluster, config)
        if config.kind == "slurm" and config.workers:
            cluster.scale(n=config.workers)
        announce(f"dashboard: {client.dashboard_link}  ({config.kind} cluster from {config.path}"
                 + (f", scaling to {config.workers} workers; tasks start as they join" if config.workers else "") + ")")
        if config.kind != "slurm":
            yield client
            return
        with SlurmJobsWatch(cluster, client, config) as watch:
            try:
                yield client
            except Exception as e:
                if watch.reason:  # the watch closed the client: whatever failed here failed for its reason
                    raise UserError(watch.reason) from e
                raise
