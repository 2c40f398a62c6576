"""Where the work runs: a LocalCluster, an existing scheduler, or a cluster described by a
``cluster_configs/NAME.yaml`` file (local, scheduler, slurm, kubernetes, ssh).

Loading a config validates all of it, backend options included, before anything starts: a
typo or a missing optional package is a one-line error, not a half-started cluster. The
backends' own classes do the work (dask-jobqueue, dask-kubernetes, distributed's SSHCluster);
this module turns a file into their keyword arguments, and ``slurm`` watches the SLURM jobs.
"""
from __future__ import annotations

import contextlib
import difflib
import importlib
import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import dask
import yaml
from distributed import Client, LocalCluster, WorkerPlugin

from . import interrupt
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

KINDS = ("local", "scheduler", "slurm", "kubernetes", "ssh")
COMMON_KEYS = ("kind", "dask_config")
KIND_KEYS = {
    "local": ("workers", "threads_per_worker", "memory_limit", "dashboard_address"),
    "scheduler": ("address", "scheduler_file", "timeout"),
    "slurm": ("workers", "options"),
    "kubernetes": ("workers", "options"),
    "ssh": ("hosts", "connect_options", "worker_options", "scheduler_options", "remote_python"),
}
EXTRAS = {
    # kind: (module that must import, pip extra that installs it, package name)
    "slurm": ("dask_jobqueue", "slurm", "dask-jobqueue"),
    "kubernetes": ("dask_kubernetes.operator", "kubernetes", "dask-kubernetes"),
    "ssh": ("asyncssh", "ssh", "asyncssh"),
}
KUBERNETES_OPTIONS = ("name", "namespace", "image", "resources", "env", "worker_command", "scheduler_service_type",
                      "idle_timeout", "resource_timeout", "scheduler_forward_port")
# dask-jobqueue options that only rename newer ones: they warn (FutureWarning) on every use.
SLURM_DEPRECATED = {"project": "account", "extra": "worker_extra_args", "job_extra": "job_extra_directives",
                    "env_extra": "job_script_prologue", "header_skip": "job_directives_skip"}
# Set by this module, meaningless in a file, or refused by dask-jobqueue itself ("pass 'host'
# through 'scheduler_options'"): not accepted from a config.
SLURM_RESERVED = {"self", "scheduler", "name", "n_workers", "job_cls", "loop", "asynchronous", "config_name",
                  "scheduler_cls", "job_kwargs", "base_class_kwargs", "host", "dashboard_address"}


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """A validated ``cluster_configs/*.yaml``: ``settings`` holds the kind's own keys."""

    path: str
    kind: str
    settings: dict = field(default_factory=dict)
    dask_config: dict = field(default_factory=dict)

    @property
    def workers(self) -> int | None:
        return self.settings.get("workers")


# -- loading and validation (no cluster is started here) --

def load_cluster_config(path: str, *, workers: int | None = None) -> ClusterConfig:
    """Read and validate a cluster config; ``workers`` (``--workers``) overrides its ``workers``."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = yaml.safe_load(f)
    except FileNotFoundError as e:
        folder = os.path.dirname(path) or "."
        known = sorted(n for n in os.listdir(folder) if n.endswith((".yaml", ".yml"))) if os.path.isdir(folder) else []
        hint = f"; configs in {folder}: {', '.join(known)}" if known else "; see cluster_configs/ in the project for examples"
        raise UserError(f"cluster config {path} not found{hint}") from e
    except OSError as e:
        raise UserError(f"cannot read cluster config {path}: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise UserError(f"cluster config {path} is not valid YAML: {' '.join(str(e).split())}") from e
    return parse_cluster_config(raw, path=path, workers=workers)


def parse_cluster_config(raw: Any, *, path: str, workers: int | None = None) -> ClusterConfig:
    """Validate the parsed YAML of one config (pure apart from importing the backend package)."""
    if not isinstance(raw, dict):
        raise UserError(f"cluster config {path}: expected a mapping with a `kind:` key, found {type(raw).__name__}")
    kind = raw.get("kind")
    if kind not in KINDS:
        raise UserError(f"cluster config {path}: kind={kind!r} not supported, expected one of {', '.join(KINDS)}")
    _reject_unknown(raw, COMMON_KEYS + KIND_KEYS[kind], where=f"cluster config {path} (kind: {kind})")
    dask_config = raw.get("dask_config") or {}
    if not isinstance(dask_config, dict):
        raise UserError(f"cluster config {path}: dask_config must be a mapping of Dask config keys to values")
    settings = {k: v for k, v in raw.items() if k not in COMMON_KEYS and v is not None}
    if workers is not None:
        if "workers" not in KIND_KEYS[kind]:
            raise UserError(f"--workers does not apply to a cluster config of kind {kind!r} ({path}); "
                            "set the workers in the config instead")
        settings["workers"] = workers
    _check_positive_int(settings, "workers", path)
    _check_positive_int(settings, "threads_per_worker", path)
    if kind in ("slurm", "kubernetes") and "workers" not in settings:
        raise UserError(f"cluster config {path}: workers (how many worker processes to start) is required for kind {kind}")
    if kind in EXTRAS:
        _require_backend(kind, path)
    check = {"scheduler": _check_scheduler, "slurm": _check_slurm, "kubernetes": _check_kubernetes, "ssh": _check_ssh}
    if kind in check:
        check[kind](settings, path)
    return ClusterConfig(path=path, kind=kind, settings=settings, dask_config=dask_config)


def _reject_unknown(mapping: dict, known, *, where: str) -> None:
    unknown = [k for k in mapping if k not in known]
    if not unknown:
        return
    hints = []
    for k in unknown:
        close = difflib.get_close_matches(str(k), [str(n) for n in known], n=1)
        hints.append(f"{k!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise UserError(f"{where}: unknown key(s) {', '.join(hints)}; known keys: {', '.join(sorted(known))}")


def _check_positive_int(settings: dict, key: str, path: str) -> None:
    value = settings.get(key)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise UserError(f"cluster config {path}: {key}={value!r} must be a positive integer")


def _check_slurm(settings: dict, path: str) -> None:
    for old, new in SLURM_DEPRECATED.items():
        if old in (settings.get("options") or {}):
            raise UserError(f"cluster config {path}: options.{old} is deprecated in dask-jobqueue; use options.{new}")
    settings["options"] = _check_options(settings.get("options"), slurm_option_names(), path, "slurm")
    for key, example in (("cores", "cores: 16"), ("memory", "memory: 64GB")):
        # dask-jobqueue would fail later, after starting its scheduler.
        if key not in settings["options"] and dask.config.get(f"jobqueue.slurm.{key}", None) is None:
            raise UserError(f"cluster config {path}: options.{key} is required (per SLURM job, e.g. {example})")


def _check_kubernetes(settings: dict, path: str) -> None:
    settings["options"] = _check_options(settings.get("options"), KUBERNETES_OPTIONS, path, "kubernetes")
    env = settings["options"].get("env")
    if env is not None and not (isinstance(env, dict) and all(isinstance(v, str) for v in env.values())):
        raise UserError(f"cluster config {path}: options.env must map names to strings (quote numbers: \"5\")")
    resources = settings["options"].get("resources")
    if resources is not None:
        if not isinstance(resources, dict):
            raise UserError(f"cluster config {path}: options.resources must be a mapping with limits and/or requests")
        _reject_unknown(resources, ("limits", "requests"), where=f"cluster config {path} options.resources")


def _check_ssh(settings: dict, path: str) -> None:
    hosts = settings.get("hosts")
    if not (isinstance(hosts, list) and len(hosts) >= 2 and all(isinstance(h, str) and h for h in hosts)):
        raise UserError(f"cluster config {path}: hosts must list at least two host names: the scheduler's first, "
                        "then one per worker host (repeat the first to run a worker beside the scheduler)")
    for key in ("connect_options", "worker_options", "scheduler_options"):
        if not isinstance(settings.get(key, {}), dict):
            raise UserError(f"cluster config {path}: {key} must be a mapping")


def _check_scheduler(settings: dict, path: str) -> None:
    address, scheduler_file = settings.get("address"), settings.get("scheduler_file")
    if bool(address) == bool(scheduler_file):
        raise UserError(f"cluster config {path}: give exactly one of address (e.g. tcp://HOST:8786) or scheduler_file "
                        "(the file `dask scheduler --scheduler-file FILE` writes)")
    if address and (not isinstance(address, str) or "://" not in address):
        raise UserError(f"cluster config {path}: address={address!r} needs a protocol, e.g. tcp://HOST:8786")


def _check_options(options: Any, known, path: str, kind: str) -> dict:
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise UserError(f"cluster config {path}: options must be a mapping of {kind} cluster arguments")
    _reject_unknown(options, known, where=f"cluster config {path} options (kind: {kind})")
    return dict(options)


def _require_backend(kind: str, path: str) -> None:
    module, extra, package = EXTRAS[kind]
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"cluster config {path} (kind: {kind}) needs the {package} package: "
                        f"pip install 'tokenshards[{extra}]' (or pip install {package})") from e


def slurm_option_names() -> tuple[str, ...]:
    """What ``SLURMCluster`` accepts, read from dask-jobqueue's own signatures so the list
    follows the installed version (its cluster takes the job's options as ``**kwargs``)."""
    from dask_jobqueue.core import Job, JobQueueCluster
    from dask_jobqueue.slurm import SLURMJob

    names = set()
    for fn in (SLURMJob.__init__, Job.__init__, JobQueueCluster.__init__):
        names |= set(inspect.signature(fn).parameters)
    return tuple(sorted(names - SLURM_RESERVED - set(SLURM_DEPRECATED)))


# -- turning a config into the backend's objects --

def slurm_cluster(config: ClusterConfig):
    """A ``SLURMCluster`` (its scheduler runs in this process; no job is submitted until
    ``scale``): ``.job_script()`` shows what ``sbatch`` would get."""
    from dask_jobqueue import SLURMCluster

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
    from dask_kubernetes.operator import make_cluster_spec

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
    from dask_kubernetes.operator import KubeCluster

    options = config.settings["options"]
    extra = {k: options[k] for k in ("namespace", "resource_timeout", "scheduler_forward_port") if k in options}
    return KubeCluster(custom_cluster_spec=kubernetes_spec(config), shutdown_on_close=True, quiet=True, **extra)


def ssh_cluster(config: ClusterConfig):
    from distributed import SSHCluster

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


@contextlib.contextmanager
def connect(*, workers: int | None = None, scheduler: str | None = None, dashboard_address: str = "127.0.0.1:8787",
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
            with interrupt.children_ignore_ctrl_c(), gc_paused():  # bokeh's dashboard, mostly: prestart.gc_paused
                cluster = LocalCluster(n_workers=n, threads_per_worker=s.get("threads_per_worker", 1), processes=True,
                                       memory_limit=s.get("memory_limit", "auto"),
                                       dashboard_address=loopback_unless_named(s.get("dashboard_address", dashboard_address)),
                                       silence_logs=logging.CRITICAL)
            # Its workers are on this machine: results come straight from them, not relayed by
            # the scheduler (which, in this process, would serialize each result once more).
            with cluster, Client(cluster, direct_to_workers=True) as client:
                announce(f"dashboard: {client.dashboard_link}  (local cluster{source}: {counted(n, 'process worker')})")
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
        n = len(client.scheduler_info(n_workers=-1)["workers"])
        announce(f"dashboard: {client.dashboard_link}  (scheduler {client.scheduler.address}, {counted(n, 'worker')}"
                 + ("; tasks wait until a `dask worker` joins" if n == 0 else "") + ")")
        yield client


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
