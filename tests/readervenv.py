"""A trainer's own reader in a venv of its own, built by the test suite and reused.

Some readers cannot be installed beside tokenshards (OLMo-core's cached-path needs
``huggingface_hub<2``, we need ``>=2.4``), and trainers run them in their own environments
anyway. ``reader_python(name, requirements)`` gives the ``python`` of a venv holding
``requirements`` (torch pinned first: ``TORCH``, the CPU build in the machines' wheel folder, so
pip never reaches for a newer CUDA build). The venv lives in ``readers/NAME-HASH`` in the suite's
cache outside the checkout (``cachedir.py``), HASH of the requirements, removals, stubs and this
Python's version, so a second run, or a second test module, reuses it (a changed spec builds a
new folder; the old one stays until removed by hand); a lock makes concurrent sessions build it once;
``.complete`` marks a finished build (a half-built folder is built again). When pip cannot
install the reader here, the test is skipped with pip's last lines as the reason.

The reader then runs as a script in that python (``run_reader``): it takes JSON arguments and
writes what it read (arrays as ``.npy``, JSON) for the test to compare with our own export.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import cachedir
import pytest

ROOT = cachedir.ROOT / "readers"
TORCH = "torch==2.13.0"
BUILD_TIMEOUT = 500
"""Seconds for one pip install (torch comes from the local wheel folder; the rest from the index).
A build took 75-160 s here (warm and cold pip cache)."""
TEST_TIMEOUT = 2 * BUILD_TIMEOUT + 300
"""For ``pytest.mark.timeout`` of a module whose first test builds a venv (its fixture counts)."""

_built: dict[str, Path] = {}
_failed: dict[str, str] = {}


def _pip(python: Path, args: list[str], log) -> None:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--no-input", *args]
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    done = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=BUILD_TIMEOUT)
    if done.returncode:
        raise RuntimeError(f"{' '.join(cmd)} exited with {done.returncode}")


def reader_python(name: str, requirements: tuple[str, ...], *, stubs: dict[str, str] | None = None,
                  remove: tuple[str, ...] = ()) -> Path:
    """The python of the reader venv ``name`` holding ``TORCH`` then ``requirements`` (built once).
    ``remove``: distributions pip installed that are then uninstalled; ``stubs``: files (path
    under site-packages: source) written in their place, for imports the reader's path never
    uses (a test says why in its docstring)."""
    stubs = stubs or {}
    key = hashlib.sha256(json.dumps([sys.version_info[:2], TORCH, *requirements, sorted(stubs.items()),
                                     remove]).encode()).hexdigest()[:12]
    folder = ROOT / f"{name}-{key}"
    if folder.name in _built:
        return _built[folder.name]
    if folder.name in _failed:  # tried in this session already
        pytest.skip(_failed[folder.name])
    python = folder / "bin" / "python"
    ROOT.mkdir(parents=True, exist_ok=True)
    with open(ROOT / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session building it: wait, then reuse
        if not (folder / ".complete").exists():
            shutil.rmtree(folder, ignore_errors=True)
            log_path = ROOT / f"{folder.name}.log"
            started = time.monotonic()
            with open(log_path, "w") as log:
                try:
                    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, stdout=log,
                                   stderr=subprocess.STDOUT)
                    _pip(python, [TORCH], log)  # first: what the reader's own torch requirement then finds
                    _pip(python, [TORCH, *requirements], log)  # again: the resolver keeps this torch
                    if remove:
                        cmd = [str(python), "-m", "pip", "uninstall", "-y", *remove]
                        log.write(f"$ {' '.join(cmd)}\n")
                        log.flush()
                        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT)
                    if stubs:
                        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                                   check=True, capture_output=True, text=True).stdout.strip())
                        for rel, source in stubs.items():
                            (site / rel).parent.mkdir(parents=True, exist_ok=True)
                            (site / rel).write_text(source)
                            log.write(f"stub {site / rel}\n")
                except (RuntimeError, subprocess.SubprocessError) as e:
                    log.close()
                    tail = "\n".join(log_path.read_text().splitlines()[-15:])
                    shutil.rmtree(folder, ignore_errors=True)
                    _failed[folder.name] = (f"cannot build the {name} reader venv here ({e}); pip's last lines "
                                            f"(whole log: {log_path}):\n{tail}")
                    pytest.skip(_failed[folder.name])
                log.write(f"built in {time.monotonic() - started:.0f} s\n")
            (folder / ".complete").write_text(json.dumps({"requirements": [TORCH, *requirements]}))
    _built[folder.name] = python
    return python


def run_reader(python: Path, script: str, args, *, timeout: int = 300) -> None:
    """Run a reader ``script`` (its source) in ``python`` with ``args`` as JSON in argv[1]; its
    output goes into the files the args name. Fails the test with the script's stderr."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    done = subprocess.run([str(python), "-c", script, json.dumps(args)], capture_output=True, text=True,
                          timeout=timeout, env=env)
    if done.returncode:
        pytest.fail(f"the reader script exited with {done.returncode}:\n{done.stderr[-4000:]}")
