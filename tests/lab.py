"""Machines on one box: a test harness for what happens across machines that share no disk.

Each lab host is a real separate host as far as the programs on it can tell:

- its own network namespace, its ``eth0`` a veth pair to a bridge that lives in a network
  namespace of its own, an address on a private /24 (10.213.N.0/24) that exists only inside the
  lab. The root namespace's network is never touched, and lab traffic never leaves the lab;
- its own host name, mount and PID namespaces: a long-lived init (PID 1 of the host) started with
  ``ip netns exec NS unshare --uts --mount --pid --fork --mount-proc`` sets the host name, makes
  its mounts private, mounts private tmpfs on ``/tmp``, ``/home`` and ``/dev/shm`` (``HOME`` is
  ``/home/<name>``) and a private ``/etc/hosts`` that names every lab host. Every command then
  enters all of them with ``nsenter -t <init> --net --uts --mount --pid``, so a host's processes
  share one PID namespace (pids collide across hosts, as on real machines);
- the checkout and its venv at their real paths, as one image would be: whatever of them (or of
  ``keep=``) lies under ``/tmp`` or ``/home`` (a CI clone in /tmp) is bound back into the
  private tmpfs at the same path;
- optionally one shared folder (``shared=[hosts]``): a directory of the test process bound at
  ``shared_path`` (default ``/mnt/shared``) on the hosts that ask for it, standing for NFS or a
  Slurm ``/scratch``. A missing mount point is made inside the host's mount namespace only.

    with Lab(["client", "sched", "w1", "w2"], shared=["client", "w1", "w2"]) as lab:
        sched = lab.start_scheduler("sched")
        lab.start_workers("w1", sched); lab.start_workers("w2", sched)
        lab.wait_for_workers(sched, 2)
        proc = lab.host("client").run([TOKENSHARDS, "tokenize", ..., "--scheduler", sched], timeout=120)
        lab.host("w1").path("/tmp/run")     # that host's /tmp/run, readable from the test process
        lab.kill_host("w2")                 # SIGKILL every process of w2, as a lost machine

Needs root, ``ip`` (iproute2), ``unshare`` and ``nsenter`` (util-linux). When a lab cannot be
made here, ``Lab.__enter__`` skips the test and says exactly why (``lab_unavailable()``).
Everything (namespaces, processes, mounts) goes at the end, on failure too; should the test
process itself die, every host's init sees its pipe close and takes the host's processes with
it, and the next lab removes the namespaces left behind.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterable, Mapping
from urllib.parse import urlsplit

import pytest

REPO = Path(__file__).resolve().parent.parent
LIB = REPO / "lib"
PYTHON = sys.executable
BIN = Path(sys.executable).parent
DASK = str(BIN / "dask")
TOKENSHARDS = str(BIN / "tokenshards")
HUBSERVER = str(REPO / "tests" / "hubserver.py")

PRIVATE = ("/tmp", "/home", "/dev/shm")
"""Folders every host gets a private tmpfs of."""
PREFIX = "tsl"
"""Namespace names: tsl<pid>x<n>-<host>, so that two runs never collide and a dead run's are known."""
REGION = "us-east-1"
_counter = itertools.count()

# PID 1 of a lab host: private mounts and host name, then it reaps orphans until its stdin (a
# pipe from the test process) closes; when it exits, the kernel kills the host's processes.
_INIT = r'''
import ctypes, json, os, select, socket, sys
cfg = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
MS_BIND, MS_REC, MS_PRIVATE = 4096, 16384, 1 << 18

def mount(src, dst, fstype=None, flags=0, data=None):
    enc = lambda s: None if s is None else s.encode()
    if libc.mount(enc(src), enc(dst), enc(fstype), flags, enc(data)) != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"mount {src} on {dst}: {os.strerror(e)}")

def fd_path(fd):
    return f"/proc/self/fd/{fd}"

def under(path, top):
    return path == top or path.startswith(top.rstrip("/") + "/")

def bind(fd, dst):
    if os.path.isdir(fd_path(fd)):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    mount(fd_path(fd), dst, None, MS_BIND | MS_REC)
    os.close(fd)

private = list(cfg["private"])

def mask(folder):
    """A tmpfs over ``folder`` holding what it held (bound back): room for a new mount point."""
    entries = []
    for name in sorted(os.listdir(folder)):
        p = os.path.join(folder, name)
        entries.append((name, os.readlink(p) if os.path.islink(p) else None,
                        None if os.path.islink(p) else os.open(p, os.O_PATH)))
    mount("lab", folder, "tmpfs", 0, "mode=755")
    for name, link, fd in entries:
        p = os.path.join(folder, name)
        if link is not None:
            os.symlink(link, p)
        else:
            bind(fd, p)
    private.append(folder)

def mount_point(dst):
    if os.path.isdir(dst):
        return
    parent = dst
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not any(under(parent, top) for top in private):
        if parent == "/":
            raise SystemExit(f"lab: will not make {dst} at the root of the filesystem")
        mask(parent)
    os.makedirs(dst)

socket.sethostname(cfg["hostname"])
mount(None, "/", None, MS_REC | MS_PRIVATE)
keep = [(os.open(p, os.O_PATH), p) for p in cfg["keep"]]
shared = [(os.open(src, os.O_PATH), dst) for src, dst in cfg["shared"]]
hosts = os.open(cfg["hosts"], os.O_PATH)
for top in cfg["private"]:
    mount("lab", top, "tmpfs", 0, "mode=1777" if top != "/home" else "mode=755")
for fd, path in keep:
    bind(fd, path)
for fd, dst in shared:
    mount_point(dst)
    bind(fd, dst)
mount(fd_path(hosts), "/etc/hosts", None, MS_BIND)
os.close(hosts)
os.makedirs(cfg["home"], exist_ok=True)
os.chdir(cfg["home"])
print("ready", flush=True)
while True:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    if select.select([0], [], [], 0.2)[0] and not os.read(0, 4096):
        break
'''


@functools.cache
def lab_unavailable() -> str | None:
    """Why a lab cannot be made here, or None. Tries the real thing once: a network namespace with
    a bridge and a veth pair in it, and UTS/mount/PID namespaces inside that."""
    if os.geteuid() != 0:
        return f"the lab needs root to make network, UTS, mount and PID namespaces (running as uid {os.geteuid()})"
    missing = [tool for tool in ("ip", "unshare", "nsenter") if shutil.which(tool) is None]
    if missing:
        return f"the lab needs {' and '.join(missing)} (iproute2, util-linux): not found on PATH"
    name = f"{PREFIX}{os.getpid()}probe"
    steps = [(["ip", "netns", "add", name], "cannot make a network namespace"),
             (["ip", "-n", name, "link", "add", "br0", "type", "bridge"], "cannot make a bridge in a network namespace"),
             (["ip", "-n", name, "link", "add", "v0", "type", "veth", "peer", "name", "v1"],
              "cannot make a veth pair in a network namespace"),
             (["ip", "netns", "exec", name, "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc", "true"],
              "cannot make UTS, mount and PID namespaces")]
    try:
        for cmd, what in steps:
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
            except (OSError, subprocess.TimeoutExpired) as e:
                return f"{what} (`{' '.join(cmd)}`: {e})"
            if r.returncode:
                return f"{what} (`{' '.join(cmd)}` exited {r.returncode}: {' '.join(r.stderr.split()) or 'no message'})"
    finally:
        subprocess.run(["ip", "netns", "del", name], capture_output=True)
    return None


def _ip_batch(commands: list[str], netns: str | None = None, *, force: bool = False) -> None:
    """Several ``ip`` commands in one process; ``force``: go on past failures (clean-up)."""
    if not commands:
        return
    cmd = ["ip", *(["-n", netns] if netns else []), *(["-force"] if force else []), "-batch", "-"]
    r = subprocess.run(cmd, input="\n".join(commands) + "\n", capture_output=True, text=True, timeout=60)
    if r.returncode:
        raise RuntimeError(f"lab: `{' '.join(cmd)}` failed: {r.stderr.strip()}\n" + "\n".join(commands))


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (a killed test process may wait to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False
    except OSError:
        return True


def _killpg(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _children(pid: int) -> list[int]:
    out = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
    return out


def remove_stale_namespaces() -> list[str]:
    """Delete the network namespaces (and work folders) of labs whose test process is gone
    (killed before its clean-up); their hosts' processes went with it."""
    r = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30)
    stale = []
    for line in r.stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.match(rf"{PREFIX}(\d+)(x\d+-|probe)", name)
        if m and not _alive(int(m.group(1))):
            stale.append(name)
    _ip_batch([f"netns del {name}" for name in stale], force=True)
    for folder in Path(tempfile.gettempdir()).glob(f"tokenshards-{PREFIX}*x*-*"):
        m = re.match(rf"tokenshards-{PREFIX}(\d+)x\d+-", folder.name)
        if m and not _alive(int(m.group(1))):
            shutil.rmtree(folder, ignore_errors=True)
    return stale


class Host:
    """One machine of a lab. ``key`` is its name in the lab, ``name`` its host name (usually the same)."""

    def __init__(self, lab: "Lab", key: str, name: str, ip: str, netns: str):
        self.lab, self.key, self.name, self.ip, self.netns = lab, key, name, ip, netns
        self.home = f"/home/{name}"
        self.env_defaults: dict[str, str] = {}
        """Extra environment for every process started on this host (e.g. its credentials)."""
        self.init: subprocess.Popen | None = None
        self.pid: int | None = None
        """The init's pid as the test process sees it (``nsenter -t`` target)."""

    def __repr__(self) -> str:
        return f"Host({self.key!r}, name={self.name!r}, ip={self.ip!r})"

    # -- running things --
    def env(self, extra: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """A clean environment as on a fresh machine with this checkout's code: nothing of the
        test process's (no HF_*, AWS_*, DASK_* leaking in); ``None`` values remove a default."""
        env = {"PATH": f"{BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": self.home,
               "USER": "root", "LOGNAME": "root", "LANG": os.environ.get("LANG", "C.UTF-8"), "PYTHONPATH": str(LIB),
               "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        env.update(self.env_defaults)
        env.update(extra or {})
        return {k: v for k, v in env.items() if v is not None}

    def command(self, args: Iterable[str], cwd: str | None = None) -> list[str]:
        # --wd without a folder: the init's (HOME); nsenter would look a named one up in our namespace.
        chdir = ["env", f"--chdir={cwd}"] if cwd else []
        return ["nsenter", "-t", str(self.pid), "--net", "--uts", "--mount", "--pid", "--wd", "--", *chdir,
                *map(str, args)]

    def run(self, args: Iterable[str], *, env: Mapping[str, str | None] | None = None, timeout: float = 120,
            cwd: str | None = None, input: str | None = None) -> subprocess.CompletedProcess:
        """Run a command on this host and wait; stdout and stderr captured as text. On timeout the
        command's whole process group is killed and ``TimeoutExpired`` carries what it printed."""
        args = list(map(str, args))
        with subprocess.Popen(self.command(args, cwd), env=self.env(env), text=True, start_new_session=True,
                              stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
            try:
                out, err = proc.communicate(input, timeout=timeout)
            except subprocess.TimeoutExpired:
                _killpg(proc)
                out, err = proc.communicate()
                raise subprocess.TimeoutExpired(args, timeout, out, err) from None
        return subprocess.CompletedProcess(args, proc.returncode, out, err)

    def spawn(self, args: Iterable[str], *, log: str | Path, env: Mapping[str, str | None] | None = None,
              cwd: str | None = None) -> subprocess.Popen:
        """Start a command on this host in its own process group, stdout and stderr to ``log`` (a
        path of the test process). The lab stops it at the end; ``stop()`` does it sooner."""
        log = Path(log)
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as f:
            proc = subprocess.Popen(self.command(args, cwd), env=self.env(env), stdin=subprocess.DEVNULL, stdout=f,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        proc.log = log  # type: ignore[attr-defined]
        self.lab._spawned.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen, timeout: float = 10) -> int:
        """SIGTERM the process group, SIGKILL after ``timeout`` s; returns the exit code."""
        if proc.poll() is None:
            _killpg(proc, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _killpg(proc)
        return proc.wait()

    def python(self, code: str, *args: str, env: Mapping[str, str | None] | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess:
        """``python -c code args...`` on this host with the checkout's venv; raises on a non-zero exit."""
        r = self.run([PYTHON, "-c", code, *args], env=env, timeout=timeout)
        if r.returncode:
            raise RuntimeError(f"on {self.key}: python -c ... exited {r.returncode}:\n{r.stderr[-3000:]}")
        return r

    # -- looking at it --
    def path(self, path: str | os.PathLike) -> Path:
        """This host's file ``path`` as the test process can read and write it (through its init's root)."""
        path = os.fspath(path)
        if not path.startswith("/"):
            raise ValueError(f"{path!r}: give an absolute path on {self.key}")
        return Path(f"/proc/{self.pid}/root{path}")

    def pids(self) -> list[int]:
        """Every live process of this host but its init (pids as the test process sees them)."""
        ns = os.readlink(f"/proc/{self.pid}/ns/pid")
        found = []
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) == self.pid:
                continue
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                    found.append(int(entry.name))
        return found

    def pid_exists(self, pid: int) -> bool:
        """Whether ``pid`` (a pid as this host's own processes see them) is a process here."""
        return self.path(f"/proc/{pid}").exists()

    def set_next_pid(self, pid: int) -> None:
        """Make the next process started on this host get about ``pid`` (ns_last_pid): a pid
        far from any the other hosts will use."""
        r = self.run(["sh", "-c", f"echo {pid - 1} > /proc/sys/kernel/ns_last_pid"])
        if r.returncode:
            raise RuntimeError(f"on {self.key}: cannot set ns_last_pid: {r.stderr.strip()}")

    def listening(self, port: int) -> bool:
        """A TCP socket of this host listens on ``port`` (read from its /proc/net/tcp, no connection made)."""
        for table in ("tcp", "tcp6"):
            with contextlib.suppress(FileNotFoundError), open(f"/proc/{self.pid}/net/{table}") as f:
                for line in f.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        return True
        return False

    def wait_listening(self, port: int, *, proc: subprocess.Popen | None = None, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.listening(port):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"on {self.key}: {_inner(proc.args)} exited {proc.returncode} before listening on "
                                   f"{port}:\n{_tail(getattr(proc, 'log', None))}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"on {self.key}: nothing listens on {port} after {timeout:.0f} s\n"
                                   f"{_tail(getattr(proc, 'log', None))}")
            time.sleep(0.05)


def _inner(args) -> str:
    """The command a host ran, without the nsenter in front."""
    args = list(args)
    return " ".join(args[args.index("--") + 1:] if "--" in args else args)


def _tail(log: Path | None, n: int = 3000) -> str:
    if log is None or not Path(log).exists():
        return ""
    return Path(log).read_text(errors="replace")[-n:]


class Lab:
    """``with Lab(["client", "w1"], hostnames={...}, shared=["client", "w1"]) as lab:`` (see the module)."""

    def __init__(self, hosts: Iterable[str], *, hostnames: Mapping[str, str] | None = None,
                 shared: Iterable[str] = (), shared_path: str = "/mnt/shared", keep: Iterable[str | Path] = (),
                 workdir: str | Path | None = None):
        self.keys = list(hosts)
        if len(set(self.keys)) != len(self.keys) or not self.keys:
            raise ValueError(f"lab hosts must be distinct names, got {self.keys}")
        self.hostnames = {key: (hostnames or {}).get(key, key) for key in self.keys}
        self.shared_hosts = list(shared)
        unknown = [k for k in [*self.shared_hosts, *(hostnames or {})] if k not in self.keys]
        if unknown:
            raise ValueError(f"not lab hosts: {unknown}; hosts are {self.keys}")
        self.shared_path = shared_path
        self.keep = [Path(p) for p in keep]
        self._workdir_arg = Path(workdir) if workdir else None
        self.tag = f"{PREFIX}{os.getpid()}x{next(_counter)}"
        self.hosts: dict[str, Host] = {}
        self._netns: list[str] = []
        self._spawned: list[subprocess.Popen] = []
        self.workdir: Path | None = None
        self._own_workdir = False
        self.subnet: str | None = None

    # -- set-up and tear-down --
    def __enter__(self) -> "Lab":
        reason = lab_unavailable()
        if reason:
            pytest.skip(f"no lab on this machine: {reason}")
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        remove_stale_namespaces()
        if self._workdir_arg is None:
            self.workdir = Path(tempfile.mkdtemp(prefix=f"tokenshards-{self.tag}-"))
            self._own_workdir = True
        else:
            self.workdir = self._workdir_arg
            self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.shared_dir.mkdir(exist_ok=True)
        self.subnet = self._pick_subnet()
        bridge = f"{self.tag}-br"
        for i, key in enumerate(self.keys):
            self.hosts[key] = Host(self, key, self.hostnames[key], f"{self.subnet}.{11 + i}", f"{self.tag}-{key}")
        self._netns = [bridge, *(h.netns for h in self.hosts.values())]
        _ip_batch([f"netns add {name}" for name in self._netns])
        link = ["link add br0 type bridge", "link set br0 up", "link set lo up"]
        for i, host in enumerate(self.hosts.values()):
            link += [f"link add v{i} type veth peer name eth0 netns {host.netns}", f"link set v{i} master br0",
                     f"link set v{i} up"]
        _ip_batch(link, bridge)
        for host in self.hosts.values():
            _ip_batch(["link set lo up", f"addr add {host.ip}/24 dev eth0", "link set eth0 up"], host.netns)
        for host in self.hosts.values():
            self._start_init(host)
        for host in self.hosts.values():
            self._wait_init(host)

    def _pick_subnet(self) -> str:
        used = subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
        used += subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
        start = (os.getpid() * 7 + int(self.tag.rsplit("x", 1)[1]) * 37) % 187
        for n in range(187):
            subnet = f"10.213.{64 + (start + n) % 187}"
            if f"{subnet}." not in used:
                return subnet
        raise RuntimeError("lab: every 10.213.N.0/24 is in use in the root network namespace")

    def _keep_paths(self) -> list[str]:
        """The checkout, the venv, the interpreter and ``keep=``: those under a private folder, outermost first."""
        candidates = {REPO, Path(sys.prefix), Path(sys.base_prefix), Path(PYTHON).resolve().parent, *self.keep}
        paths = sorted({str(p.resolve()) for p in candidates if p.exists()} | {str(p) for p in candidates if p.exists()})
        inside = [p for p in paths if any(p == top or p.startswith(top + "/") for top in PRIVATE)]
        return [p for p in inside if not any(p != q and p.startswith(q + "/") for q in inside)]

    def _start_init(self, host: Host) -> None:
        hosts_file = self.workdir / f"hosts-{host.key}"
        lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback", f"{host.ip}\t{host.name}"]
        lines += [f"{h.ip}\t{h.name}" for h in self.hosts.values() if h is not host and h.name != host.name]
        hosts_file.write_text("\n".join(lines) + "\n")
        cfg = {"hostname": host.name, "private": list(PRIVATE), "keep": self._keep_paths(), "hosts": str(hosts_file),
               "home": host.home,
               "shared": [[str(self.shared_dir), self.shared_path]] if host.key in self.shared_hosts else []}
        host.init = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount", "--pid", "--fork", "--mount-proc",
             "--kill-child", "--", PYTHON, "-I", "-c", _INIT, json.dumps(cfg)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _wait_init(self, host: Host) -> None:
        line = host.init.stdout.readline()
        if line.strip() != "ready":
            host.init.kill()
            _, err = host.init.communicate()
            raise RuntimeError(f"lab: host {host.key} did not start: {line}{err}")
        # The init is unshare's child (ip netns exec execs unshare in place), in a PID namespace of its own.
        ours = os.readlink("/proc/self/ns/pid")
        todo = [host.init.pid]
        while todo:
            pid = todo.pop()
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/ns/pid") != ours:
                    host.pid = pid
                    break
            todo += _children(pid)
        if host.pid is None:
            raise RuntimeError(f"lab: cannot find the init of host {host.key} under pid {host.init.pid}")

    def close(self) -> None:
        """Kill every host (its init: the kernel takes the rest), reap, delete the namespaces."""
        for host in self.hosts.values():
            if host.pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(host.pid, signal.SIGKILL)
            if host.init is not None:
                with contextlib.suppress(OSError):
                    host.init.stdin.close()
                try:
                    host.init.wait(20)
                except subprocess.TimeoutExpired:
                    host.init.kill()
                    host.init.wait()
                host.init.stdout.close()
                host.init.stderr.close()
                host.init = None
        for proc in self._spawned:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                _killpg(proc)
                proc.wait()
        self._spawned.clear()
        if self._netns:
            with contextlib.suppress(RuntimeError):  # those never made
                _ip_batch([f"netns del {name}" for name in self._netns], force=True)
            self._netns = []
        if self._own_workdir and self.workdir is not None:
            shutil.rmtree(self.workdir, ignore_errors=True)
            self._own_workdir = False

    # -- the machines --
    def host(self, key: str) -> Host:
        try:
            return self.hosts[key]
        except KeyError:
            raise KeyError(f"no lab host {key!r}; hosts are {list(self.hosts)}") from None

    @property
    def shared_dir(self) -> Path:
        """The folder (of the test process) that ``shared_path`` shows on the hosts that share it."""
        return self.workdir / "shared"

    def log_path(self, key: str, what: str) -> Path:
        return self.workdir / "logs" / f"{key}-{what}.log"

    def kill_host(self, key: str, timeout: float = 10) -> list[int]:
        """SIGKILL every process of the host, as a machine that is lost; its init (and so its
        disk and address) stays, so a test can look at what it left and start it again."""
        host = self.host(key)
        killed: set[int] = set()
        deadline = time.monotonic() + timeout
        while pids := host.pids():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            killed.update(pids)
            if time.monotonic() > deadline:
                raise RuntimeError(f"lab: processes of {key} survive SIGKILL: {pids}")
            time.sleep(0.02)
        return sorted(killed)

    # -- services a test starts on hosts --
    def start_scheduler(self, key: str, *, port: int = 8786, env: Mapping[str, str] | None = None) -> str:
        """``dask scheduler`` on host ``key`` (allowed-failures 5, as the README tells users); its address."""
        host = self.host(key)
        proc = host.spawn([DASK, "scheduler", "--host", host.ip, "--port", str(port), "--dashboard-address",
                           f"{host.ip}:8787"], log=self.log_path(key, "scheduler"),
                          env={"DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "5", **(env or {})})
        host.wait_listening(port, proc=proc)
        return f"tcp://{host.ip}:{port}"

    def start_workers(self, key: str, scheduler: str, *, nworkers: int = 1,
                      env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """``dask worker SCHED --nthreads 1 --nworkers N`` on host ``key`` (one nanny per worker)."""
        host = self.host(key)
        return host.spawn([DASK, "worker", scheduler, "--nthreads", "1", "--nworkers", str(nworkers), "--host",
                           host.ip, "--no-dashboard"], log=self.log_path(key, "workers"), env=env)

    def wait_for_workers(self, scheduler: str, n: int, *, via: str | None = None, timeout: float = 90) -> dict:
        """Wait until exactly ``n`` workers are connected; {worker address: host name}."""
        via_host = self.host(via) if via else next(h for h in self.hosts.values()
                                                   if urlsplit(scheduler).hostname == h.ip)
        code = ("import sys, time\nfrom distributed import Client\n"
                "with Client(sys.argv[1], timeout='30s') as c:\n"
                "    deadline = time.monotonic() + float(sys.argv[3])\n"
                "    while len(c.scheduler_info(n_workers=-1)['workers']) != int(sys.argv[2]):\n"
                "        assert time.monotonic() < deadline, list(c.scheduler_info(n_workers=-1)['workers'])\n"
                "        time.sleep(0.1)\n"
                "    print(__import__('json').dumps(c.run(__import__('socket').gethostname)))\n")
        r = via_host.python(code, scheduler, str(n), str(timeout), timeout=timeout + 30)
        return json.loads(r.stdout.strip().splitlines()[-1])

    def start_moto(self, key: str, *, port: int = 5000, via: str | None = None) -> "LabS3":
        """moto's S3 server on host ``key``; ``via``: the host the returned helper runs its S3 calls on."""
        host = self.host(key)
        proc = host.spawn([PYTHON, "-m", "moto.server", "-H", host.ip, "-p", str(port)], log=self.log_path(key, "moto"))
        host.wait_listening(port, proc=proc)
        return LabS3(self, f"http://{host.ip}:{port}", via=self.host(via or key), log=proc.log)

    def start_hub(self, key: str, root: str, *, repo: str, port: int = 8000,
                  log: str = "/tmp/hub-requests.jsonl") -> "LabHub":
        """tests/hubserver.py serving ``root`` (a folder of host ``key``) as dataset repo ``repo``."""
        host = self.host(key)
        proc = host.spawn([PYTHON, HUBSERVER, root, "--repo", repo, "--host", host.ip, "--port", str(port), "--log", log],
                          log=self.log_path(key, "hub"))
        host.wait_listening(port, proc=proc)
        return LabHub(host, f"http://{host.ip}:{port}", repo, log)


class LabS3:
    """moto on a lab host, and S3 calls made from one (the test process cannot reach the lab's network)."""

    key = "tokenshards-lab-key"
    secret = "tokenshards-lab-secret"

    def __init__(self, lab: Lab, endpoint_url: str, *, via: Host, log: Path):
        self.lab, self.endpoint_url, self.via, self.log = lab, endpoint_url, via, log

    def env(self, **extra: str) -> dict[str, str]:
        """What a machine with credentials for this S3 has in its environment."""
        return {"AWS_ACCESS_KEY_ID": self.key, "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": REGION,
                "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_CONFIG_FILE": os.devnull,
                "AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_EC2_METADATA_DISABLED": "true", **extra}

    def _call(self, code: str, *args: str, via: Host | None = None) -> str:
        prelude = ("import json, sys, s3fs\n"
                   "fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)\n")
        return (via or self.via).python(prelude + code, *args, env=self.env()).stdout

    def make_bucket(self, name: str) -> str:
        self._call("fs.call_s3('create_bucket', Bucket=sys.argv[1])", name)
        return name

    def buckets(self) -> list[str]:
        return json.loads(self._call("print(json.dumps([b['Name'] for b in fs.call_s3('list_buckets')['Buckets']]))"))

    def put(self, local: str, url: str, *, via: Host | None = None) -> None:
        """Upload ``local`` (a file or folder of the ``via`` host) to ``url`` (s3://...)."""
        self._call("fs.put(sys.argv[1], sys.argv[2], recursive=True)", local, url, via=via)

    def get(self, url: str, local: str, *, via: Host | None = None) -> Path:
        """Download ``url`` (a prefix: recursively) to ``local`` on the ``via`` host; its path for the test process."""
        self._call("fs.get(sys.argv[1].rstrip('/') + '/', sys.argv[2].rstrip('/') + '/', recursive=True)", url, local,
                   via=via)
        return (via or self.via).path(local)

    def glob(self, pattern: str) -> list[str]:
        return json.loads(self._call("print(json.dumps(fs.glob(sys.argv[1])))", pattern))

    def exists(self, url: str) -> bool:
        return json.loads(self._call("print(json.dumps(fs.exists(sys.argv[1])))", url))

    def rm(self, url: str) -> None:
        self._call("fs.rm(sys.argv[1], recursive=True)", url)


class LabHub:
    """The stand-in Hub on a lab host, and its request log (one JSON line per request)."""

    def __init__(self, host: Host, url: str, repo: str, log: str):
        self.host, self.url, self.repo, self.log = host, url, repo, log

    def requests(self) -> list[dict]:
        path = self.host.path(self.log)
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def clear_log(self) -> None:
        self.host.path(self.log).write_text("")
