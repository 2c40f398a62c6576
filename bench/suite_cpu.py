"""Where the test suite's CPU goes, by kind of process: the suite is CPU-bound on a 2-core machine
(its wall time follows its total CPU), so this is what to read before making it faster.

    .venv/bin/python bench/suite_cpu.py [PYTEST ARGS...]    # default: make test's parallel part

Runs pytest with every process it starts (workers, CLI calls, forkservers, emulators, readers),
samples each one's CPU every 0.25 s from /proc, and prints the total per kind, and the CLI calls
per subcommand. Processes are found in a cgroup-v1 cpuacct group when one can be made (root;
it also catches daemons that leave the process tree), else as descendants of pytest. A process
that lives under 0.25 s is missed: the cgroup's own total is printed beside the sampled one.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT = ["-q", "-n", "3", "--dist", "loadfile", "-m", "not serial", "tests"]
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
TICK = os.sysconf("SC_CLK_TCK")


def kind(cmd: str) -> str:
    """What a process is, from its command line."""
    args = cmd.split(" ")
    if "bin/tokenshards" in cmd or "-m tokenshards" in cmd:
        return "tokenshards CLI"
    if "multiprocessing.forkserver" in cmd:
        return "forkserver and the workers it forked"
    if "multiprocessing.spawn" in cmd or "--multiprocessing-fork" in cmd:
        return "spawned LocalCluster workers"
    if args[1:3] == ["-u", "-c"] or "-m pytest" in cmd:
        return "pytest processes (xdist's, or the one)"
    if "bin/dask " in cmd:
        return "dask scheduler / worker by hand"
    if "tokenshards-tests/readers" in cmd:
        return "trainers' reader venvs"
    if "moto" in cmd or "gcp_storage_emulator" in cmd or "azurite" in cmd or "hubserver" in cmd:
        return "store emulators"
    if "slurm" in cmd:
        return "slurm"
    return "other"


def _pids(group: Path | None, root: int) -> list[int]:
    if group is not None:
        return [int(p) for p in (group / "cgroup.procs").read_text().split()]
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
            except (OSError, ValueError):
                pass
    tree, grown = {root}, True
    while grown:
        grown = False
        for pid, parent in parents.items():
            if parent in tree and pid not in tree:
                tree.add(pid)
                grown = True
    return sorted(tree)


def main(argv: list[str]) -> int:
    group = CPUACCT / f"tokenshards-suite-{os.getpid()}"
    try:
        group.mkdir()
    except OSError:
        group = None
    preexec = (lambda: (group / "tasks").write_text(str(os.getpid()))) if group else None
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *(argv or DEFAULT)], cwd=REPO, preexec_fn=preexec)
    seen: dict[int, list] = {}
    began = time.monotonic()
    while proc.poll() is None:
        for pid in _pids(group, proc.pid):
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()
                cpu = (int(fields[11]) + int(fields[12])) / TICK
                if pid not in seen:
                    seen[pid] = [cpu, Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")]
                seen[pid][0] = max(seen[pid][0], cpu)
            except (OSError, ValueError):
                pass
        time.sleep(0.25)
    wall = time.monotonic() - began
    total = int((group / "cpuacct.usage").read_text()) / 1e9 if group else None
    by_kind: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    by_command: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
    for cpu, cmd in seen.values():
        by_kind[kind(cmd)][0] += 1
        by_kind[kind(cmd)][1] += cpu
        if kind(cmd) == "tokenshards CLI":
            found = re.search(r"(?:bin/tokenshards|-m tokenshards) (\S+)", cmd)
            name = f"{found.group(1) if found else '?'} {'--scheduler' if '--scheduler' in cmd else 'local'}"
            by_command[name][0] += 1
            by_command[name][1] += cpu
    sampled = sum(cpu for cpu, _ in seen.values())
    print(f"\n{wall:.0f} s of wall time; CPU sampled {sampled:.0f} s"
          + (f" of the cgroup's {total:.0f} s" if total is not None else " (no cgroup: descendants only)"))
    for name, (n, cpu) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cpu:7.1f} s  {n:5d} processes  {name}")
    print("tokenshards CLI calls:")
    for name, (n, cpu) in sorted(by_command.items(), key=lambda kv: -kv[1][1]):
        print(f"  {cpu:7.1f} s  {n:5d} calls      {name}")
    if group is not None:
        try:
            group.rmdir()
        except OSError:
            pass
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
