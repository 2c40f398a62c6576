#!/usr/bin/env python3
"""`make bench`'s scale rehearsal (issue 48): the whole pipeline at sizes 10x apart, to see what grows.

For each ``--tokens`` size: a FineWeb-shaped corpus from ../shared/bench/make_corpus.py (held-out
seed 24; its pool holds ~1 GB of unique text, so a larger corpus repeats documents: the builder's
own warning is kept in the results and printed), then on one cluster started the documented way
(``dask scheduler`` and ``dask worker`` processes, one single-threaded worker per core) the four
commands a user runs: ``tokenize``, a shuffled ``export`` (llmc), ``verify --deep``, ``inspect``.
For each: the wall time, the peak RSS of the client (the command's process), the scheduler and each
worker (the kernel's high-water mark, reset before each command through ``/proc/PID/clear_refs``;
sampled with psutil where that cannot be reset), their CPU time, the manifest's size, and the
client's and the scheduler's CPU time per partition. The ratios between sizes show what grows with
the corpus. The machine's 1-minute load is recorded before each command (shared machines vary).

    python bench/scale.py --tokens 100M --tokens 1B [--workers 2] [--deep 1000] [--keep] [--no-export]
    python bench/scale.py --tokens 10B --out bench/results-scale-10b.json   # make bench-10b: a real 10 BT run
    python bench/scale.py --tokens 1B --row-group-rows 125 --partition-mb 0.4   # 10 BT's ~5,400 partitions

The client and the scheduler scale with partitions, not tokens: the second form gives 1 B tokens
the partition count 10 BT plans (a partition is at least one row group, hence the small row groups).

At 10 B tokens (issue 57, ``make bench-10b``) this is a real run of a 10 BT sample's size on one
machine: ~26 GB of text (the pool's ~1 GB repeated ~26 times: its documents and their token counts
repeat, which flatters gigatoken's pretoken cache; memory and the per-partition figures do not depend
on it), then the four commands. Free space is checked first (``disk_plan``: the corpus's parquet ~1.24
B a token, the run's folder ~2.06 B, the shuffled llmc export ~2 B: ~53 GB in all at 10 B); export
runs only where what is left fits it, and is reported as skipped otherwise. A command that fails is
reported (``failed``) and the report is written all the same: it runs unattended to the end. Per
command it reports the wall time, tokenize's tokens/s, peak memory of the client, scheduler and each
worker, CPU, and the bytes the client, scheduler and workers read (``read_chars``: through system
calls, page cache or not) and wrote to storage (``write_bytes``, O_DIRECT included), from /proc; and
prints the row for docs/scaling.md's measured table.

Writes bench/results-scale.json (``--out``). Corpora stay in bench/corpus/ (reused); the runs go to
bench/scratch/scale/ and are removed after each size unless ``--keep``.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MAKE_CORPUS = ROOT.parent / "shared" / "bench" / "make_corpus.py"
BIN = Path(sys.executable).parent
SEED = 24
"""make_corpus.py's held-out order (bench/run.py's HELD_OUT_SEED): no test builds it."""

TOKENS_PER_MB = 385_000
"""GPT-2 tokens per MB of make_corpus text, all languages (bench/results-1gb.json: 405,065,154
tokens in 1,053 MB): turns ``--tokens`` into the builder's ``--mb``; the run reports the real count."""

VAL_TOKENS = 10_485_760
"""export's default validation set; a tenth of the run below ~100 M tokens (smoke runs)."""

UNITS = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_tokens(text: str) -> int:
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMBGT]?)\s*", text.upper())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a number of tokens such as 100M or 1B")
    return int(float(match[1]) * UNITS[match[2]])


def build_corpus(tokens: int, row_group_rows: int | None = None) -> dict:
    """The corpus folder for ``tokens`` (built once, then reused) and what the builder said."""
    mb = -(-tokens // TOKENS_PER_MB)
    dest = ROOT / "bench" / "corpus" / f"{mb}mb-all-seed{SEED}{f'-rg{row_group_rows}' if row_group_rows else ''}"
    said = dest / "BUILD.txt"
    if not any(dest.rglob("*.parquet")):
        dest.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([sys.executable, str(MAKE_CORPUS), str(dest), "--mb", str(mb), "--no-token-count",
                               "--seed", str(SEED), *(["--row-group-rows", str(row_group_rows)] if row_group_rows else [])],
                              capture_output=True, text=True)
        if proc.returncode:
            sys.exit(f"make_corpus.py failed: {proc.stderr.strip()[-500:]}")
        said.write_text(proc.stderr + proc.stdout)
        (dest / "SOURCE").write_text(f"shared/bench/make_corpus.py (Debian docs, code and fortunes; all; seed {SEED})")
    text = said.read_text() if said.exists() else ""
    repeats = next((line.strip() for line in text.splitlines() if "repeats documents" in line), None)
    files = sorted(dest.rglob("*.parquet"))
    return {"path": str(dest), "mb": mb, "files": len(files), "parquet_bytes": sum(f.stat().st_size for f in files),
            "repeats": repeats, "glob": str(dest / "sample" / "*" / "*.parquet")}


# -- the cluster, as a user starts it -------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """``dask scheduler`` and ``--workers`` ``dask worker --nthreads 1`` processes (no nanny, so
    each worker is one process whose memory is its own), with `make worker`'s environment."""

    def __init__(self, workers: int, logs: Path):
        port = free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        env = {**os.environ, "MIMALLOC_PURGE_DELAY": os.environ.get("MIMALLOC_PURGE_DELAY", "1000"),
               "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "5"}
        logs.mkdir(parents=True, exist_ok=True)
        self.scheduler = subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                           "--dashboard-address", "127.0.0.1:0"], env=env,
                                          stdout=subprocess.DEVNULL, stderr=(logs / "scheduler.log").open("w"))
        self.workers = [subprocess.Popen([str(BIN / "dask"), "worker", self.address, "--nthreads", "1", "--no-nanny",
                                          "--memory-limit", "0", "--name", f"w{i}", "--dashboard-address", "127.0.0.1:0"],
                                         env=env, stdout=subprocess.DEVNULL, stderr=(logs / f"worker{i}.log").open("w"))
                        for i in range(workers)]
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)

    def processes(self) -> dict[str, int]:
        return {"scheduler": self.scheduler.pid, **{f"worker{i}": w.pid for i, w in enumerate(self.workers)}}

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            proc.terminate()
        for proc in [*self.workers, self.scheduler]:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- one command, measured ----------------------------------------------------------------------
def reset_peak(pid: int) -> bool:
    """Linux >= 4.0: writing 5 to clear_refs resets VmHWM to the current RSS."""
    try:
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def status_bytes(pid: int, field: str) -> int | None:
    """``VmHWM`` (peak RSS) or ``VmRSS`` of a process, from /proc/PID/status."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


class Sampler(threading.Thread):
    """Every 0.1 s: RSS (psutil; the fallback where the high-water mark cannot be reset) and its
    anonymous part (/proc's RssAnon): file pages a process maps (parquet read through a memory
    map, say) count in RSS but are the page cache's, dropped under pressure."""

    def __init__(self, pids: dict[str, int]):
        super().__init__(daemon=True)
        self.pids, self.stop = pids, threading.Event()
        self.peak, self.peak_anon = dict.fromkeys(pids, 0), dict.fromkeys(pids, 0)
        self.io: dict[str, dict] = {}
        """name: the process's last I/O counters (``io_counters``), read while it lived."""

    def run(self) -> None:
        procs = {name: psutil.Process(pid) for name, pid in self.pids.items()}
        while True:
            for name, proc in procs.items():
                try:
                    self.peak[name] = max(self.peak[name], proc.memory_info().rss)
                    self.io[name] = io_of(proc)
                except psutil.Error:
                    pass
                self.peak_anon[name] = max(self.peak_anon[name], status_bytes(proc.pid, "RssAnon") or 0)
            if self.stop.wait(0.1):
                return


IO_FIELDS = ("read_bytes", "write_bytes", "read_chars", "write_chars")
"""From /proc/PID/io: bytes the process had read from and written to storage (``read_bytes``: what
the page cache did not hold; ``write_bytes`` includes O_DIRECT writes) and through system calls
(``read_chars``/``write_chars``, cached or not)."""


def io_of(proc: psutil.Process) -> dict:
    counters = proc.io_counters()
    return {f: getattr(counters, f, 0) for f in IO_FIELDS}


def cpu_seconds(pid: int) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return float("nan")


def measure(name: str, argv: list[str], cluster: Cluster | None, logs: Path) -> dict:
    """Run one command to its end; its wall time, peaks and CPU, and those of the cluster's processes."""
    others = cluster.processes() if cluster else {}
    exact = all([reset_peak(pid) for pid in others.values()])
    # Workers and the scheduler live through every command of a size: what a command adds is its
    # peak over what the process already held (a worker keeps its encoder and tokenizer cache).
    start = {k: status_bytes(pid, "VmRSS") for k, pid in others.items()}
    start_anon = {k: status_bytes(pid, "RssAnon") for k, pid in others.items()}
    io_before = {}
    for k, pid in others.items():
        try:
            io_before[k] = io_of(psutil.Process(pid))
        except psutil.Error:
            io_before[k] = dict.fromkeys(IO_FIELDS, 0)
    cpu_before = {k: cpu_seconds(pid) for k, pid in others.items()}
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    with (logs / f"{name}.log").open("w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        sampler = Sampler({**others, "client": proc.pid})
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    sampler.stop.set()
    sampler.join()
    if proc.returncode:
        raise StepFailed(f"{name} failed ({proc.returncode}): {(logs / f'{name}.log').read_text()[-2000:]}")
    zero = dict.fromkeys(IO_FIELDS, 0)
    processes = {"client": {"peak_rss": usage.ru_maxrss * 1024, "cpu_s": usage.ru_utime + usage.ru_stime,
                            "io": sampler.io.get("client", zero)}}
    for key, pid in others.items():
        after = sampler.io.get(key, io_before[key])
        processes[key] = {"peak_rss": (status_bytes(pid, "VmHWM") if exact else None) or sampler.peak[key],
                          "start_rss": start[key], "start_anon": start_anon[key], "peak_anon": sampler.peak_anon[key],
                          "cpu_s": cpu_seconds(pid) - cpu_before[key],
                          "io": {f: after[f] - io_before[key][f] for f in IO_FIELDS}}
    io = {f: sum(p["io"][f] for p in processes.values()) for f in IO_FIELDS}
    return {"command": " ".join(Path(a).name if a.startswith(str(BIN)) else a for a in argv), "wall_s": wall,
            "load_1min_before": load, "peak_rss_exact": exact, "processes": processes, "io": io}


class StepFailed(RuntimeError):
    """A command of the rehearsal exited non-zero: recorded in the report, which is still written."""


PARQUET_BYTES_PER_TOKEN = 1.24
"""make_corpus's parquet (Snappy) per GPT-2 token: 502 MB for the 1 GB corpus's 405 M tokens."""
RUN_BYTES_PER_TOKEN = 2.06
"""A run's folder per GPT-2 token: uint16 tokens (2 B) and each document's docs row, records, manifest."""
EXPORT_BYTES_PER_TOKEN = 2.0
"""llmc's shards: uint16 tokens (2 B) and a 1 KB header per 100 M tokens."""
MARGIN = 1.1
"""Free space asked for beyond the estimate: others share the disk, and estimates are estimates."""


def disk_plan(tokens: int, *, corpus_built: bool) -> dict:
    """What each step writes (estimates from the measured rates above) and what is free now."""
    need = {"corpus": 0 if corpus_built else int(tokens * PARQUET_BYTES_PER_TOKEN),
            "tokenize": int(tokens * RUN_BYTES_PER_TOKEN), "export": int(tokens * EXPORT_BYTES_PER_TOKEN)}
    (ROOT / "bench").mkdir(exist_ok=True)
    free = shutil.disk_usage(ROOT / "bench").free
    return {"needs_bytes": need, "free_bytes": free, "margin": MARGIN,
            "export_fits": free >= MARGIN * sum(need.values()),
            "tokenize_fits": free >= MARGIN * (need["corpus"] + need["tokenize"])}


def describe_disk(plan: dict) -> str:
    n = plan["needs_bytes"]
    return (f"disk: {plan['free_bytes'] / 1e9:,.1f} GB free; needs corpus {n['corpus'] / 1e9:,.1f} GB (0: built already), "
            f"tokenize {n['tokenize'] / 1e9:,.1f} GB, shuffled export {n['export'] / 1e9:,.1f} GB (x{plan['margin']} margin): "
            f"export {'fits' if plan['export_fits'] else 'does NOT fit: it is skipped'}")


def rehearse(tokens: int, *, workers: int, deep: int, keep: bool, scratch: Path, backend: str | None,
             partition_mb: float | None, row_group_rows: int | None, export: bool = True) -> dict:
    """The four commands at one size. A command that fails is recorded (``failed``) and the later
    ones still run where they can: the report is written whatever happens, for unattended runs."""
    mb = -(-tokens // TOKENS_PER_MB)
    built = any((ROOT / "bench" / "corpus" / f"{mb}mb-all-seed{SEED}{f'-rg{row_group_rows}' if row_group_rows else ''}").rglob("*.parquet"))
    plan = disk_plan(tokens, corpus_built=built)
    print(describe_disk(plan), file=sys.stderr, flush=True)
    if not plan["tokenize_fits"]:
        sys.exit(f"not enough disk for {tokens / 1e9:g} B tokens: {describe_disk(plan)}")
    t0 = time.perf_counter()
    corpus = build_corpus(tokens, row_group_rows)
    corpus["build_s"] = time.perf_counter() - t0
    if corpus["repeats"]:
        print(f"corpus: {corpus['repeats']}", file=sys.stderr)
    work = scratch / f"{tokens}{f'-p{partition_mb:g}' if partition_mb else ''}{f'-rg{row_group_rows}' if row_group_rows else ''}"
    shutil.rmtree(work, ignore_errors=True)
    logs = work / "logs"
    out, dest = work / "run", work / "llmc"
    cluster = Cluster(workers, logs)
    tool = str(BIN / "tokenshards")
    at = ["--scheduler", cluster.address, "--progress", "log"]
    steps, failed, skipped, manifest = {}, {}, {}, None

    def step(name: str, argv: list[str]) -> None:
        print(f"  {name} ...", file=sys.stderr, flush=True)
        try:
            steps[name] = measure(name, argv, cluster, logs)
            print(f"  {name}: {steps[name]['wall_s']:.1f} s", file=sys.stderr, flush=True)
        except StepFailed as e:
            failed[name] = str(e)
            print(f"  {name} FAILED: {str(e)[:300]}", file=sys.stderr, flush=True)

    try:
        step("tokenize", [tool, "tokenize", "--input", corpus["glob"], "--out", str(out), *at,
                          *(["--backend", backend] if backend else []),
                          *(["--partition-mb", str(partition_mb)] if partition_mb else [])])
        if "tokenize" in steps:
            manifest = json.loads((out / "manifest.json").read_text())
            step("verify", [tool, "verify", str(out), "--deep", str(deep), *at])
            # On the cluster since issue 48 (a run this size is past inspect's in-process bound anyway).
            step("inspect", [tool, "inspect", str(out), *at])
            free = shutil.disk_usage(work).free
            if not export:
                skipped["export"] = "--no-export"
            elif free < MARGIN * tokens * EXPORT_BYTES_PER_TOKEN:
                skipped["export"] = (f"{free / 1e9:,.1f} GB free after tokenize, the shuffled export needs "
                                     f"~{tokens * EXPORT_BYTES_PER_TOKEN / 1e9:,.1f} GB")
            else:
                val = min(VAL_TOKENS, manifest["totals"]["tokens"] // 10)
                step("export", [tool, "export", str(out), "--format", "llmc", "--to", str(dest),
                                "--val-tokens", str(val), "--shuffle", "--seed", "0", *at])
            for name, why in skipped.items():
                print(f"  {name} skipped: {why}", file=sys.stderr, flush=True)
    finally:
        cluster.close()
    partitions = len(manifest["partitions"]) if manifest else 0
    for step_result in steps.values():
        for key in ("client", "scheduler"):
            if key in step_result["processes"] and partitions:
                step_result[f"{key}_cpu_ms_per_partition"] = 1000 * step_result["processes"][key]["cpu_s"] / partitions
    done_tokens = manifest["totals"]["tokens"] if manifest else 0
    if "tokenize" in steps:
        steps["tokenize"]["tokens_per_s"] = done_tokens / steps["tokenize"]["wall_s"]
    result = {
        "tokens_asked": tokens, "tokens": done_tokens, "docs": manifest["totals"]["docs"] if manifest else 0,
        "partitions": partitions, "manifest_bytes": (out / "manifest.json").stat().st_size if manifest else 0,
        "run_bytes": folder_bytes(out), "export_bytes": folder_bytes(dest), "corpus": corpus, "workers": workers,
        "backend": backend or "auto", "partition_mb": partition_mb, "disk": plan, "steps": steps,
        "failed": failed, "skipped": skipped,
    }
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
    return result


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


# -- the report ---------------------------------------------------------------------------------
def mb(n) -> str:
    return "-" if n is None else f"{n / 1e6:,.0f}"


def table(results: list[dict]) -> str:
    lines = ["| tokens | partitions | manifest | step | wall s | client peak MB | scheduler peak MB | worker peaks MB (+ over the step's start) | "
             "client CPU ms/partition | scheduler CPU ms/partition | read / written GB | load before |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        for name, s in r["steps"].items():
            p = s["processes"]
            workers = " / ".join(f"{mb(v['peak_rss'])} (+{mb(v['peak_rss'] - v['start_rss']) if v['start_rss'] else '?'})"
                                 for k, v in p.items() if k.startswith("worker")) or "-"
            lines.append(f"| {r['tokens'] / 1e6:,.0f} M | {r['partitions']:,} | {r['manifest_bytes'] / 1e3:,.0f} kB | {name} "
                         f"| {s['wall_s']:.1f} | {mb(p['client']['peak_rss'])} | {mb(p.get('scheduler', {}).get('peak_rss'))} "
                         f"| {workers} | {s['client_cpu_ms_per_partition']:.1f} "
                         f"| {s.get('scheduler_cpu_ms_per_partition', float('nan')):.1f} "
                         f"| {s['io']['read_chars'] / 1e9:,.2f} / {s['io']['write_bytes'] / 1e9:,.2f} | {s['load_1min_before']:.1f} |")
    return "\n".join(lines)


def measured_row(r: dict) -> str:
    """The size's figures as a row of docs/scaling.md's measured table."""
    steps = r["steps"]
    tok = steps.get("tokenize")
    if tok is None:
        return f"| {r['tokens_asked'] / 1e9:g} B | tokenize failed: {r['failed'].get('tokenize', '?')[:80]} |"
    workers = [v["peak_rss"] for k, v in tok["processes"].items() if k.startswith("worker")]
    io = tok["io"]

    def wall(name: str) -> str:
        if name in steps:
            return f"{steps[name]['wall_s']:,.0f} s"
        return "failed" if name in r["failed"] else f"skipped ({r['skipped'].get(name, '?')})"

    took = f"{tok['wall_s'] / 60:,.1f} min" if tok["wall_s"] >= 120 else f"{tok['wall_s']:.0f} s"
    return (f"| {r['tokens'] / 1e9:.2f} B | {r['partitions']:,} | {took} | "
            f"{tok['tokens_per_s'] / 1e6:.1f} M | {tok['processes']['client']['peak_rss'] / 1e6:,.0f} MB | "
            f"{max(workers) / 1e6:,.0f} MB | {r['manifest_bytes'] / 1e6:.2f} MB | {wall('verify')} | {wall('inspect')} | "
            f"{wall('export')} | {io['read_chars'] / 1e9:,.1f} / {io['write_bytes'] / 1e9:,.1f} GB | "
            f"{tok['load_1min_before']:.1f} |")


MEASURED_HEADER = ("| tokens | partitions | tokenize wall | tokens/s | client peak | worker peak | manifest | verify --deep | "
                   "inspect | export --shuffle | tokenize read / written | load before |\n"
                   "|---|---|---|---|---|---|---|---|---|---|---|---|")


def growth(results: list[dict]) -> list[str]:
    """Largest over smallest size, per step and process: what grows with the corpus."""
    if len(results) < 2:
        return []
    small, large = results[0], results[-1]
    scale = large["tokens"] / small["tokens"]
    lines = [f"growth from {small['tokens'] / 1e6:,.0f} M to {large['tokens'] / 1e6:,.0f} M tokens (x{scale:.1f}); "
             f"partitions x{large['partitions'] / small['partitions']:.1f}, manifest x{large['manifest_bytes'] / small['manifest_bytes']:.1f}"]
    for name in [n for n in large["steps"] if n in small["steps"]]:
        a, b = small["steps"][name], large["steps"][name]
        parts = [f"wall x{b['wall_s'] / a['wall_s']:.1f}"]
        for key in b["processes"]:
            pa, pb = a["processes"][key]["peak_rss"], b["processes"][key]["peak_rss"]
            if pa and pb:
                parts.append(f"{key} peak x{pb / pa:.2f}")
            sa, sb = a["processes"][key].get("start_rss"), b["processes"][key].get("start_rss")
            if sa and sb and key.startswith("worker"):
                parts.append(f"{key} added {mb(pa - sa)} -> {mb(pb - sb)} MB")
                ya, yb = a["processes"][key].get("peak_anon"), b["processes"][key].get("peak_anon")
                if ya and yb:
                    parts.append(f"{key} anonymous peak {mb(ya)} -> {mb(yb)} MB")
        added = large["partitions"] - small["partitions"]
        if added > 0:  # start-up is the same at both sizes: the difference is what each partition costs
            for key in ("client", "scheduler"):
                if key in b["processes"]:
                    cost = 1000 * (b["processes"][key]["cpu_s"] - a["processes"][key]["cpu_s"]) / added
                    parts.append(f"{key} CPU {cost:.1f} ms per added partition")
        lines.append(f"  {name}: " + ", ".join(parts))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=parse_tokens, action="append", help="corpus size in GPT-2 tokens (repeat)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--deep", type=int, default=1000, help="verify --deep N")
    parser.add_argument("--backend", help="tokenize --backend (default: tokenize's own, auto)")
    parser.add_argument("--partition-mb", type=float,
                        help="tokenize --partition-mb: small partitions give a small corpus a large corpus's partition "
                             "count (10 BT plans ~5,400, 100 BT and 350 BT 16,384), which is what the client and the "
                             "scheduler scale with); a partition is at least one row group: see --row-group-rows")
    parser.add_argument("--row-group-rows", type=int, help="make_corpus.py --row-group-rows (default: its own)")
    parser.add_argument("--keep", action="store_true", help="keep the runs in bench/scratch/scale/")
    parser.add_argument("--no-export", action="store_true", help="leave out the shuffled export")
    parser.add_argument("--out", type=Path, default=None, help="default bench/results-scale[-BACKEND].json")
    args = parser.parse_args()
    args.out = args.out or HERE / ("results-scale" + (f"-{args.backend}" if args.backend else "")
                                   + (f"-partition-mb-{args.partition_mb:g}" if args.partition_mb else "") + ".json")
    sizes = sorted(args.tokens or [100 * 10**6, 10**9])
    scratch = ROOT / "bench" / "scratch" / "scale"
    results = []
    for tokens in sizes:
        print(f"rehearsal at {tokens / 1e6:,.0f} M tokens ...", file=sys.stderr, flush=True)
        results.append(rehearse(tokens, workers=args.workers, deep=args.deep, keep=args.keep, scratch=scratch,
                                backend=args.backend, partition_mb=args.partition_mb,
                                row_group_rows=args.row_group_rows, export=not args.no_export))
        args.out.write_text(json.dumps({"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                        "cpus": os.cpu_count(), "memory_bytes": psutil.virtual_memory().total,
                                        "results": results}, indent=1) + "\n")
    done = [r for r in results if r["steps"]]
    print(table(done))
    print("\nfor docs/scaling.md (measured):\n" + MEASURED_HEADER)
    for r in results:
        print(measured_row(r))
    for r in results:
        if r["corpus"]["repeats"]:
            print(f"note: {r['tokens_asked'] / 1e6:,.0f} M tokens: {r['corpus']['repeats']}")
        for name, why in {**r["failed"], **r["skipped"]}.items():
            print(f"note: {r['tokens_asked'] / 1e6:,.0f} M tokens: {name} {'FAILED' if name in r['failed'] else 'skipped'}: "
                  f"{why[:300]}")
    for line in growth(done):
        print(line)
    print(f"wrote {args.out}")
    if any(r["failed"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
