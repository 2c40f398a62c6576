"""What the bench scripts share (``run.py`` and ``tokenizers_case.py``): the held-out corpus, one
whole command run and metered (wall time, peak memory and CPU of its process tree), our tokenize
command and Megatron's fast path run that way, and how repeats are ordered and summed up (rotated
order, medians, paired ratios)."""
from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "bench"
BIN = Path(sys.executable).parent


HELD_OUT_SEED = 24
"""make_corpus.py's order of documents for the bench; the tests never build a corpus with it."""


def build_corpus(dest: Path, mb: float, *, lang: str = "all", seed: int = HELD_OUT_SEED,
                 extra: tuple[str, ...] = (), shared: Path = SHARED) -> tuple[Path, str]:
    """(folder of parquet files, where the text came from); ``lang`` "all" is every language."""
    langs = [] if lang == "all" else ["--lang", lang]
    source = f"shared/bench/make_corpus.py (Debian docs, code and fortunes; {lang}; seed {seed})"
    if dest.exists() and any(dest.rglob("*.parquet")):
        return dest, (dest / "SOURCE").read_text() if (dest / "SOURCE").exists() else "cached"
    dest.mkdir(parents=True, exist_ok=True)
    maker = shared / "make_corpus.py"
    if maker.exists():
        proc = subprocess.run([sys.executable, str(maker), str(dest), "--mb", str(mb), "--no-token-count",
                               "--seed", str(seed), *langs, *extra], capture_output=True, text=True)
        if proc.returncode == 0:
            (dest / "SOURCE").write_text(source)
            return dest, source
        print(f"make_corpus.py failed ({proc.stderr.strip().splitlines()[-1:]}); using the demo corpus", file=sys.stderr)
    # Here, not at the top: tokenizers_case.py's bare and datatrove modes import this module and are timed.
    import pyarrow as pa
    import pyarrow.parquet as pq
    from tokenshards.demo import help_topics, stdlib_docstrings

    docs = [text for _, text in help_topics()] + [text for _, text in stdlib_docstrings()]
    target, rows, size, copy = int(mb * 1e6), [], 0, 0
    while size < target:
        for text in docs:
            rows.append(f"[copy {copy}] {text}")
            size += len(rows[-1].encode())
            if size >= target:
                break
        copy += 1
    shards = max(1, round(target / 64e6))
    per = -(-len(rows) // shards)
    for s in range(shards):
        chunk = rows[s * per:(s + 1) * per]
        pq.write_table(pa.table({"text": chunk, "id": [f"demo-{s}-{i}" for i in range(len(chunk))]}),
                       dest / f"000_{s:05d}.parquet", row_group_size=2000)
    (dest / "SOURCE").write_text("demo corpus scaled up (CPython docs)")
    return dest, "demo corpus scaled up (CPython docs)"


class PeakTreeRSS:
    """Peak resident memory of a process and all its descendants, sampled every 50 ms: RSS summed
    (a page shared by N processes counts N times), or with ``proportional`` the PSS (a shared page
    counts 1/N in each: the memory the tree really holds; reading it costs the run CPU). Also the
    CPU seconds of the tree: each process's last sample, summed (what a busy machine inflates less
    than wall time; a process's last 50 ms may be missed)."""

    def __init__(self, pid: int, *, proportional: bool = False):
        self.root = psutil.Process(pid)
        self.proportional = proportional
        self.peak = 0
        self.cpu: dict[int, float] = {}
        self.roles: dict[int, str] = {}
        """pid: ``role_of`` it, named when first seen."""
        self.threads: dict[int, dict[int, float]] = {}
        """pid: {thread id: CPU seconds} (Linux: /proc/PID/task), to tell a worker's event loop from its tasks."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            total = 0
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                break
            for p in procs:
                try:
                    total += p.memory_full_info().pss if self.proportional else p.memory_info().rss
                    t = p.cpu_times()
                    self.cpu[p.pid] = t.user + t.system
                    if p.pid not in self.roles:
                        self.roles[p.pid] = role_of(p, self.root)
                    # Merged, not replaced: an exiting process lists only the threads it has left.
                    self.threads.setdefault(p.pid, {}).update(thread_cpu(p.pid))
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


    def by_role(self) -> dict[str, float]:
        """CPU seconds per ``role_of``: client, forkserver, workers (summed), other."""
        out: dict[str, float] = {}
        for pid, cpu in self.cpu.items():
            role = self.roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + cpu
        return out

    def worker_threads(self) -> dict[str, float]:
        """The workers' CPU by thread, summed over workers: the event loop (the main thread), the
        busiest other thread (the task thread: one per worker here), and the rest (profiler,
        writer, monitors)."""
        loop = tasks = rest = 0.0
        for pid, threads in self.threads.items():
            if self.roles.get(pid) != "workers" or not threads:
                continue
            loop += threads.get(pid, 0.0)
            others = sorted((cpu for tid, cpu in threads.items() if tid != pid), reverse=True)
            tasks += others[0] if others else 0.0
            rest += sum(others[1:])
        return {"event_loop": loop, "task_thread": tasks, "other_threads": rest}


def role_of(process: psutil.Process, root: psutil.Process) -> str:
    """client (the command's own process, with a LocalCluster's scheduler in it), forkserver
    (multiprocessing's, which local workers are forked from), workers (its children, or any
    process named a Dask worker), other (a bare script's pool processes, ...)."""
    if process.pid == root.pid:
        return "client"
    try:
        cmdline = " ".join(process.cmdline())
        parent = process.ppid()
    except psutil.Error:
        return "other"
    if "multiprocessing.forkserver import main" in cmdline:
        # The server itself is the root's child; its forked children (the workers) keep its cmdline.
        return "forkserver" if parent == root.pid else "workers"
    return "workers" if "dask" in cmdline and "worker" in cmdline else "other"


def thread_cpu(pid: int) -> dict[int, float]:
    """{thread id: CPU seconds} of a process, from /proc (empty where there is none)."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14, 15 of stat)
    return out


def run_metered(cmd: list[str], *, proportional: bool = False, env: dict | None = None) -> tuple[str, float, int]:
    """(stdout, wall seconds, peak tree RSS, or PSS with ``proportional``) of one whole command;
    its stderr if it fails. CPU seconds, of the whole tree and of all but its root process (the
    workers, for our command), are left in ``LAST_CPU`` (a busy machine inflates them less than wall time)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    meter = PeakTreeRSS(proc.pid, proportional=proportional)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    peak = meter.stop()
    LAST_CPU.update(tree=sum(meter.cpu.values()), below_root=sum(meter.cpu.values()) - meter.cpu.get(proc.pid, 0.0),
                    by_role=meter.by_role(), worker_threads=meter.worker_threads())
    if proc.returncode:
        raise SystemExit(f"{Path(cmd[0]).name} {cmd[1]} failed:\n{stderr}")
    return stdout, wall, peak


LAST_CPU: dict = {"tree": 0.0, "below_root": 0.0, "by_role": {}, "worker_threads": {}}


def tiktoken_env(encoding: str) -> dict:
    """The shared scripts call tiktoken.get_encoding; offline, point them at a tiktoken cache
    holding the packaged, hash-checked rank files."""
    from tokenshards.encoding.encoders import OFFLINE_COPIES, prepare_offline_cache

    env = dict(os.environ)
    if "TIKTOKEN_CACHE_DIR" not in env and encoding in OFFLINE_COPIES:
        env["TIKTOKEN_CACHE_DIR"] = str(prepare_offline_cache(encoding))
    return env


def run_ours(corpus: Path, workers: int, backend: str, scratch: Path, keep: bool = False, *,
             proportional: bool = False, extra: tuple[str, ...] = (), env: dict | None = None) -> dict:
    """One whole tokenize command; with ``proportional`` its peak memory is PSS (and its time is not comparable)."""
    out = scratch / f"out-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(BIN / "tokenshards"), "tokenize", "--input", str(corpus), "--out", str(out), "--workers", str(workers),
           "--backend", backend, "--progress", "none", "--dashboard-address", ":0", *extra]
    stdout, wall, peak = run_metered(cmd, proportional=proportional, env=env)
    tokens = int(re.search(r"([\d,]+) tokens", stdout).group(1).replace(",", ""))
    phase = float(re.search(r"tokenizing phase ([\d.]+) s", stdout).group(1))
    partitions = int(re.search(r"([\d,]+) partitions? \(", stdout).group(1).replace(",", ""))
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {"out": str(out), "tokens": tokens, "partitions": partitions, "seconds": wall, "cpu_seconds": LAST_CPU["tree"],
            "worker_cpu_seconds": LAST_CPU["below_root"], "cpu_by_role": LAST_CPU["by_role"],
            "worker_threads_cpu": LAST_CPU["worker_threads"], "tokens_per_s": tokens / wall,
            "phase_seconds": phase, "phase_tokens_per_s": tokens / phase, "peak_rss_bytes": peak}


def run_peer(peer, jsonl: Path, scratch: Path) -> dict:
    """One whole run of Megatron's fast path, metered like ours; its own timer read from its output."""
    from peer_megatron import own_seconds, peer_env, read_back

    prefix = scratch / "megatron" / "out"
    shutil.rmtree(prefix.parent, ignore_errors=True)
    prefix.parent.mkdir(parents=True)
    stdout, wall, peak = run_metered(peer.command(jsonl, prefix), env=peer_env())
    tokens = int(read_back(prefix)[1].sum())
    own = own_seconds(stdout)
    return {"prefix": str(prefix), "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall,
            "own_timer_seconds": own, "own_timer_tokens_per_s": tokens / own, "peak_rss_bytes": peak}


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def ratio(ours: list[dict], key: str, theirs: list[dict], their_key: str = "tokens_per_s") -> float:
    """The median over repeats of ours / theirs within each repeat: the two ran minutes apart at
    most, so a load that comes and goes on this machine moves both."""
    return statistics.median(o[key] / t[their_key] for o, t in zip(ours, theirs))


def rotated(steps: list, r: int) -> list:
    """The repeat's order: each repeat starts one step later. A run here is slower when it follows
    another big one (measured: the second of two back-to-back runs of the same command took ~5%
    more worker CPU, whichever went second), so a fixed order would favour whatever runs first."""
    k = r % len(steps) if steps else 0
    return steps[k:] + steps[:k]


def prepare_peer(a) -> object:
    """Megatron's fast path, ready to run, or the reason it is not (one line)."""
    if a.no_peer:
        return "--no-peer"
    from peer_megatron import NotAvailable, prepare

    try:
        return prepare(a.megatron_src, a.scratch)
    except NotAvailable as e:
        return str(e)
