"""A real single-node SLURM on this machine for tests: munged, slurmctld and slurmd (Debian's
slurm-wlm) run as root from a slurm.conf of our own in a temporary folder, on free ports.

Nothing outside that folder is used or changed apart from installing the packages when they are
missing: every command gets ``SLURM_CONF`` pointing at our conf (the Debian package's /etc/slurm
never gets in the way), munged uses its own key and socket (``AuthInfo=socket=...``), and
``stop()`` cancels the lab's jobs, stops the daemons and ends any process still carrying our
``SLURM_CONF`` in its environment (the jobs' own processes inherit it through sbatch).

Where a lab cannot be had (not root, no apt-get, install failed, a daemon did not come up) a
``SlurmUnavailable`` says exactly what failed; the tests turn it into a skip.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PACKAGES = ("slurm-wlm", "munge")
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "sinfo")
SBIN = ("/usr/sbin", "/sbin")


class SlurmUnavailable(Exception):
    """Why no SLURM lab could be brought up here (the reason a skipped test shows)."""


def _which(name: str) -> str | None:
    path = os.pathsep.join([os.environ.get("PATH", ""), *SBIN])
    return shutil.which(name, path=path)


def ensure_installed(*, timeout: float = 600) -> dict[str, str]:
    """Paths of the SLURM and munge binaries, installing the Debian packages first when one is
    missing (as CI does on a fresh machine: ``apt-get update && apt-get install``)."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        if os.geteuid() != 0:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed and not root, so cannot "
                                   f"apt-get install {' '.join(PACKAGES)}")
        if _which("apt-get") is None:
            raise SlurmUnavailable(f"{', '.join(missing)} not installed and no apt-get here to install "
                                   f"{' '.join(PACKAGES)}")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES]):
            try:
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise SlurmUnavailable(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from e
            if proc.returncode != 0:
                tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
                raise SlurmUnavailable(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {tail}")
        missing = [b for b in BINARIES if _which(b) is None]
        if missing:
            raise SlurmUnavailable(f"{', '.join(missing)} still missing after apt-get install {' '.join(PACKAGES)}")
    return {b: _which(b) for b in BINARIES}


def slurm_version() -> str:
    """The installed slurm-wlm, e.g. ``22.05.8``."""
    out = subprocess.run([_which("slurmctld") or "slurmctld", "-V"], capture_output=True, text=True).stdout
    return out.split()[-1] if out.strip() else "unknown"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_total_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise SlurmUnavailable("no MemTotal in /proc/meminfo")


@dataclass
class SlurmLab:
    folder: Path
    conf: Path
    partition: str
    node: str
    cpus: int
    memory_mb: int
    bin: dict[str, str]
    daemons: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The environment for any command that talks to this SLURM."""
        path = os.pathsep.join([os.path.dirname(self.bin["sbatch"]), os.environ.get("PATH", "")])
        return {**os.environ, "SLURM_CONF": str(self.conf), "PATH": path}

    def run(self, *cmd: str, timeout: float = 30) -> str:
        proc = subprocess.run([self.bin.get(cmd[0], cmd[0]), *cmd[1:]], env=self.env, capture_output=True,
                              text=True, timeout=timeout)
        if proc.returncode != 0:
            raise RuntimeError(f"`{' '.join(cmd)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    def jobs(self) -> list[dict[str, str]]:
        """This SLURM's jobs as squeue lists them: id, name, state (e.g. RUNNING), partition."""
        out = self.run("squeue", "--noheader", "--format=%i|%j|%T|%P")
        return [dict(zip(("id", "name", "state", "partition"), line.split("|"))) for line in out.splitlines() if line]

    def node_state(self) -> str:
        return self.run("sinfo", "--noheader", "--Node", "--format=%T", f"--nodes={self.node}").strip()

    def log(self, name: str, lines: int = 15) -> str:
        path = self.folder / "log" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return " | ".join(text.strip().splitlines()[-lines:])

    # -- start and stop --

    def write_conf(self) -> None:
        f = self.folder
        for sub in ("state", "spool", "log", "run", "munge"):
            (f / sub).mkdir(mode=0o700, exist_ok=True)
        (f / "plugstack.conf").write_text("")  # not the package's /etc/slurm/plugstack.conf
        munge_socket = f / "munge" / "munge.socket"
        # SelectType cons_tres with CR_CPU: a job gets the CPUs it asks for (dask-jobqueue's
        # --cpus-per-task); FORCE:2 lets two jobs share a CPU, so two one-CPU worker jobs run even
        # on a one-core machine. RealMemory fits the machine (slurmd drains a node that has less).
        self.conf.write_text("\n".join([
            "ClusterName=tokenshardslab",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={munge_socket}",
            f"StateSaveLocation={f / 'state'}",
            f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={f / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"PlugStackConfig={f / 'plugstack.conf'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobContainerType=job_container/none",
            "SwitchType=switch/none",
            "MpiDefault=none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "SchedulerType=sched/builtin",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none",
            "JobCompType=jobcomp/none",
            "ReturnToService=2",
            "MailProg=/bin/true",
            "KillWait=5",  # seconds between SIGTERM and SIGKILL on scancel / walltime
            "InactiveLimit=0",
            "MinJobAge=60",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:2",
            "",
        ]))

    def _start(self, name: str, cmd: list[str]) -> None:
        out = open(self.folder / "log" / f"{name}.out", "wb")
        with out:
            self.daemons[name] = subprocess.Popen(cmd, env=self.env, stdin=subprocess.DEVNULL, stdout=out,
                                                  stderr=subprocess.STDOUT, start_new_session=True)

    def _wait(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.daemons.items():
                if proc.poll() is not None:
                    out = (self.folder / "log" / f"{name}.out").read_text(errors="replace").strip().splitlines()
                    said = " | ".join(out[-5:]) or self.log(name, 5) or "(it printed nothing)"
                    raise SlurmUnavailable(f"{name} exited with {proc.returncode} while waiting for {what}: {said}")
            try:
                if ready():
                    return
            except (RuntimeError, subprocess.TimeoutExpired, OSError):
                pass
            time.sleep(0.5)
        raise SlurmUnavailable(f"{what} not within {timeout:.0f} s; slurmctld log: {self.log('slurmctld', 5)}; "
                               f"slurmd log: {self.log('slurmd', 5)}")

    def start(self, *, timeout: float = 90) -> None:
        f = self.folder
        key = f / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        socket_path = f / "munge" / "munge.socket"
        # --force: munged refuses root and a socket folder under the world-writable /tmp otherwise.
        self._start("munged", [self.bin["munged"], "--foreground", "--force", f"--socket={socket_path}",
                               f"--key-file={key}", f"--pid-file={f / 'run' / 'munged.pid'}",
                               f"--log-file={f / 'log' / 'munged.log'}", f"--seed-file={f / 'munge' / 'seed'}"])
        self._wait("munged's socket", socket_path.exists, timeout=20)
        self._start("slurmctld", [self.bin["slurmctld"], "-D", "-c", "-f", str(self.conf)])
        self._wait("slurmctld to answer", lambda: self.run("sinfo", "--noheader", timeout=5) is not None, timeout=timeout)
        self._start("slurmd", [self.bin["slurmd"], "-D", "-f", str(self.conf), "-N", self.node])
        self._wait(f"node {self.node} idle in sinfo", lambda: self.node_state() == "idle", timeout=timeout)

    def stop(self) -> None:
        """Cancel every job, stop the daemons, end what is left of the jobs; nothing outlives this."""
        try:
            if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
                subprocess.run([self.bin["scancel"], "--full", "--partition", self.partition], env=self.env,
                               capture_output=True, timeout=15)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self.jobs():
                    time.sleep(0.5)
        except (RuntimeError, subprocess.TimeoutExpired, OSError):
            pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.daemons.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=15)
        for pid in self.leftovers():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self) -> list[int]:
        """Processes (other than this one) whose environment names our slurm.conf: the daemons'
        and the jobs' (slurmstepd, the batch script, dask workers), which sbatch exports it to."""
        marker = f"SLURM_CONF={self.conf}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes()
            except OSError:
                continue
            if marker in environ.split(b"\0"):
                found.append(int(entry))
        return found


def start_slurm(folder: Path, *, partition: str = "debug", timeout: float = 90) -> SlurmLab:
    """Install if needed, write the conf, start munged + slurmctld + slurmd and wait until the
    node is idle. Raises SlurmUnavailable (the daemons stopped again) when any of it fails."""
    if os.geteuid() != 0:
        raise SlurmUnavailable("the SLURM lab runs munged, slurmctld and slurmd as root; this test runs as "
                               f"uid {os.geteuid()}")
    binaries = ensure_installed()
    node = socket.gethostname().split(".")[0]
    lab = SlurmLab(folder=Path(folder), conf=Path(folder) / "slurm.conf", partition=partition, node=node,
                   cpus=os.cpu_count() or 1, memory_mb=max(256, _mem_total_mb() * 3 // 4), bin=binaries)
    lab.write_conf()
    try:
        lab.start(timeout=timeout)
    except BaseException:
        lab.stop()
        raise
    return lab
