"""A cluster config: one ``cluster_configs/NAME.yaml`` file (local, scheduler, slurm, kubernetes,
ssh), read and validated whole, backend options included, before anything starts: a typo or a
missing optional package is a one-line error, not a half-started cluster. ``connect`` turns a
valid one into a running cluster; ``slurm`` watches its SLURM jobs.
"""
from __future__ import annotations

import difflib
import importlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any

import dask
import yaml

from .. import limits
from ..errors import UserError

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
    if settings.get("workers") is not None:  # what this machine (local) or any cluster (the rest) can hold
        check = limits.local_workers if kind == "local" else (
            lambda option, n: limits.whole(option, n, low=1, high=limits.MAX_REMOTE_WORKERS, what="a number of workers"))
        check(f"--workers (or workers in {path})", settings["workers"])
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
    from dask_jobqueue.core import Job, JobQueueCluster  # optional: tokenshards[slurm]
    from dask_jobqueue.slurm import SLURMJob

    names = set()
    for fn in (SLURMJob.__init__, Job.__init__, JobQueueCluster.__init__):
        names |= set(inspect.signature(fn).parameters)
    return tuple(sorted(names - SLURM_RESERVED - set(SLURM_DEPRECATED)))
