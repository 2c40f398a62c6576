"""A real `dask scheduler` and `dask worker` processes on 127.0.0.1, for tests where cluster
behaviour matters (worker deaths, lost clients)."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DASK = str(Path(sys.executable).with_name("dask"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DaskProcesses:
    def __init__(self, log_dir: Path):
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.log_dir = log_dir
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []

    def _spawn(self, name: str, args: list[str], env: dict | None = None, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
        # Own process group: SIGKILL takes the nanny and its worker together, like a lost machine.
        with open(self.log_dir / f"{name}.log", "wb") as log:
            return subprocess.Popen([*wrap, DASK, *args], stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env={**os.environ, **(env or {})})

    def start_scheduler(self) -> None:
        self.scheduler = self._spawn("scheduler", ["scheduler", "--host", "127.0.0.1", "--port", str(self.port),
                                                   "--no-dashboard"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return
            time.sleep(0.1)
        raise RuntimeError(f"dask scheduler did not listen on {self.port}")

    def start_worker(self, env: dict | None = None, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
        """``env``: extra environment variables, e.g. a PYTHONPATH that makes this machine differ;
        ``wrap``: a command the worker runs under (it ends with the worker's own command line),
        e.g. ``unshare`` for a mount namespace of its own."""
        worker = self._spawn(f"worker{len(self.workers)}", ["worker", self.address, "--nthreads", "1",
                                                            "--no-dashboard", "--host", "127.0.0.1"], env=env, wrap=wrap)
        self.workers.append(worker)
        return worker

    def wait_for_workers(self, n: int, timeout: float = 30) -> None:
        from distributed import Client

        with Client(self.address, timeout="10s") as client:
            client.wait_for_workers(n, timeout=timeout)

    @staticmethod
    def kill(proc: subprocess.Popen) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc is not None and proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    self.kill(proc)


@contextlib.contextmanager
def dask_processes(log_dir: Path, *, workers: int = 2):
    procs = DaskProcesses(log_dir)
    try:
        procs.start_scheduler()
        for _ in range(workers):
            procs.start_worker()
        if workers:
            procs.wait_for_workers(workers)
        yield procs
    finally:
        procs.close()
