"""SLURM jobs seen from the client: what dask-jobqueue leaves unsaid.

dask-jobqueue submits worker jobs in the background and never submits an ended job again, so a
job SLURM rejects, or jobs that all ended (no Python on the nodes, walltime, ``scancel``), would
leave a run waiting for workers forever. ``check_slurm_job`` asks sbatch first; ``SlurmJobsWatch``
stops a run whose jobs have all ended, with the reason.
"""
from __future__ import annotations

import os
import subprocess
import tempfile
import threading

from distributed import Client

from ..errors import UserError
from .configfile import ClusterConfig


def check_slurm_job(cluster, config: ClusterConfig) -> None:
    """Ask sbatch whether it would run the worker job (``sbatch --test-only``: nothing is submitted).

    dask-jobqueue submits in the background: a job sbatch rejects (unknown partition, more CPUs or
    memory than a node has, no sbatch here) is only a traceback in the log, and the run then waits
    for workers forever."""
    extra = [str(a) for a in config.settings["options"].get("submit_command_extra") or []]
    with tempfile.TemporaryDirectory(prefix="tokenshards-slurm-") as folder:
        script = os.path.join(folder, "worker-job.sh")
        with open(script, "w", encoding="utf-8") as f:
            f.write(cluster.job_script())
        try:
            proc = subprocess.run(["sbatch", *extra, "--test-only", script], capture_output=True, text=True, timeout=60)
        except FileNotFoundError as e:
            raise UserError(f"cluster config {config.path} (kind: slurm): sbatch not found on PATH; run tokenshards "
                            "where SLURM's commands work (e.g. a login node)") from e
        except subprocess.TimeoutExpired as e:
            raise UserError(f"cluster config {config.path}: `sbatch --test-only` gave no answer within 60 s; "
                            "is slurmctld reachable (try `sinfo`)?") from e
    if proc.returncode != 0:
        said = "; ".join(line.strip() for line in (proc.stderr or proc.stdout).splitlines() if line.strip())
        raise UserError(f"cluster config {config.path}: SLURM would not accept the worker job ({said}); check "
                        "options.queue, cores, memory and walltime against `sinfo`")


# squeue's names of job states that will never (again) give a worker.
SLURM_ENDED = frozenset({"BOOT_FAIL", "CANCELLED", "COMPLETED", "COMPLETING", "DEADLINE", "FAILED", "NODE_FAIL",
                         "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "GONE"})


def slurm_job_states(job_ids) -> dict[str, str]:
    """``{job id: squeue's state}``; a job squeue no longer knows (purged after MinJobAge) is GONE."""
    proc = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i %T", f"--jobs={','.join(job_ids)}"],
                          capture_output=True, text=True, timeout=30)
    if proc.returncode != 0 and "Invalid job id" not in proc.stderr:
        raise RuntimeError(f"squeue failed (exit {proc.returncode}): {proc.stderr.strip()}")
    listed = dict(line.split(None, 1) for line in proc.stdout.splitlines() if line.strip())
    return {job_id: listed.get(job_id, "GONE").strip() for job_id in job_ids}


class SlurmJobsWatch:
    """Stops a run whose SLURM jobs have all ended while no worker is connected: jobs that could
    not start Dask's worker on the node, ran out of walltime or were cancelled. dask-jobqueue does
    not submit them again, so without this the run would wait for workers forever.

    A thread checks every ``every`` seconds; on the second check in a row that finds it so, it
    keeps the reason and closes the client, which cancels the run's tasks in the main thread."""

    def __init__(self, cluster, client: Client, config: ClusterConfig, *, every: float = 5.0):
        self.cluster, self.client, self.config, self.every = cluster, client, config, every
        self.reason: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="tokenshards-slurm-watch", daemon=True)

    def __enter__(self) -> "SlurmJobsWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        seen: list[str] = []  # every job submitted so far (a lost worker's job leaves cluster.workers)
        joined = False  # whether any worker ever connected
        strikes = 0
        while not self._stop.wait(self.every):
            for job in dict(self.cluster.workers).values():
                if getattr(job, "job_id", None) and job.job_id not in seen:
                    seen.append(job.job_id)
            try:
                workers = self.client.scheduler_info(n_workers=-1)["workers"]
                # A worker may come and go between two checks: the scheduler's event log has it.
                joined = joined or bool(workers) or any(
                    isinstance(msg, dict) and msg.get("action") == "add-worker" for _, msg in self.client.get_events("all"))
                states = slurm_job_states(seen) if seen and not workers else {}
            except Exception:  # squeue or the scheduler did not answer this time: ask again later
                strikes = 0
                continue
            strikes = strikes + 1 if states and all(s in SLURM_ENDED for s in states.values()) else 0
            if strikes >= 2 and not self._stop.is_set():
                self.reason = self._explain(states, joined=joined)
                self.client.close()
                return

    def _explain(self, states: dict[str, str], *, joined: bool) -> str:
        logs = self.config.settings["options"].get("log_directory")
        where = f"in {logs}" if logs else "in slurm-JOBID.out where tokenshards was started"
        jobs = ", ".join(f"{job_id} {state}" for job_id, state in states.items())
        why = ("their workers are gone (cancelled, out of options.walltime, or a node failed)" if joined else
               "no worker ever connected: the nodes could not start Dask's worker; they need this Python environment "
               "(options.python, or options.job_script_prologue to activate it)")
        return (f"every SLURM job of this run has ended ({jobs}) and dask-jobqueue does not submit them again; {why}; "
                f"see the jobs' output {where}. Committed partitions are kept: rerun the same command to resume")
