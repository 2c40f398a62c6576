#!/usr/bin/env python3
"""`make bench`: our whole command vs. the machine's ceilings vs. the common mp.Pool baseline.

All run on the same corpus in one go, interleaved (A B C A B C ...), and we report medians
and ratios, never a lone absolute time: this machine is noisy. The ceilings are bare encoding
loops, one process per core, texts read before the clock starts: tiktoken's (the reference,
../shared/bench/raw_limit.py), the *fast ceiling* of splintr (``raw_limit.py --backend splintr``)
and, when gigatoken is installed, gigatoken's (``fast_ceiling.py`` here: raw_limit.py has no
loop for it). The baseline is ../shared/bench/peer_mp_pool.py; the corpus is
../shared/bench/make_corpus.py's when it can be built, else the demo corpus scaled up. The larger
corpus (``--memory-scale`` x) is run against the fast ceilings too.

    python bench/run.py [--mb 200] [--repeats 3] [--workers N] [--memory-scale 4]
    python bench/run.py --export-only OUT [--repeats 3]   # only the export targets, on a finished run

Export targets (issue 15): ``export --shuffle`` takes at most 2x an unshuffled export of the same
run, and its peak memory (process tree) stays flat when the run is 4x larger.

Writes bench/results.json (``--export-only``: bench/results-export.json).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SHARED = ROOT.parent / "shared" / "bench"
BIN = Path(sys.executable).parent


def build_corpus(dest: Path, mb: float) -> tuple[Path, str]:
    """(folder of parquet files, where the text came from)."""
    if dest.exists() and any(dest.rglob("*.parquet")):
        return dest, (dest / "SOURCE").read_text() if (dest / "SOURCE").exists() else "cached"
    dest.mkdir(parents=True, exist_ok=True)
    maker = SHARED / "make_corpus.py"
    if maker.exists():
        proc = subprocess.run([sys.executable, str(maker), str(dest), "--mb", str(mb), "--no-token-count"],
                              capture_output=True, text=True)
        if proc.returncode == 0:
            (dest / "SOURCE").write_text("shared/bench/make_corpus.py (Debian docs and fortunes)")
            return dest, "shared/bench/make_corpus.py (Debian docs and fortunes)"
        print(f"make_corpus.py failed ({proc.stderr.strip().splitlines()[-1:]}); using the demo corpus", file=sys.stderr)
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
    counts 1/N in each: the memory the tree really holds; reading it costs the run CPU)."""

    def __init__(self, pid: int, *, proportional: bool = False):
        self.root = psutil.Process(pid)
        self.proportional = proportional
        self.peak = 0
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
                except psutil.NoSuchProcess:
                    pass
            self.peak = max(self.peak, total)
            self._stop.wait(0.05)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.peak


def run_metered(cmd: list[str], *, proportional: bool = False) -> tuple[str, float, int]:
    """(stdout, wall seconds, peak tree RSS, or PSS with ``proportional``) of one whole command;
    its stderr if it fails."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    meter = PeakTreeRSS(proc.pid, proportional=proportional)
    stdout, stderr = proc.communicate()
    wall = time.perf_counter() - t0
    peak = meter.stop()
    if proc.returncode:
        raise SystemExit(f"{Path(cmd[0]).name} {cmd[1]} failed:\n{stderr}")
    return stdout, wall, peak


def run_ours(corpus: Path, workers: int, backend: str, scratch: Path, keep: bool = False, *,
             proportional: bool = False) -> dict:
    """One whole tokenize command; with ``proportional`` its peak memory is PSS (and its time is not comparable)."""
    out = scratch / f"out-{backend}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [str(BIN / "tokenshards"), "tokenize", "--input", str(corpus), "--out", str(out), "--workers", str(workers),
           "--backend", backend, "--progress", "none", "--dashboard-address", ":0"]
    stdout, wall, peak = run_metered(cmd, proportional=proportional)
    tokens = int(re.search(r"([\d,]+) tokens", stdout).group(1).replace(",", ""))
    phase = float(re.search(r"tokenizing phase ([\d.]+) s", stdout).group(1))
    if not keep:
        shutil.rmtree(out, ignore_errors=True)
    return {"out": str(out), "tokens": tokens, "seconds": wall, "tokens_per_s": tokens / wall, "phase_seconds": phase,
            "phase_tokens_per_s": tokens / phase, "peak_rss_bytes": peak}


def run_export(out: Path, workers: int, scratch: Path, *, shuffle: bool) -> dict:
    """One whole ``tokenshards export --format llmc`` command: wall time and peak tree memory."""
    dest = scratch / ("export-shuffled" if shuffle else "export")
    shutil.rmtree(dest, ignore_errors=True)
    # The default validation size (modded-nanogpt's), or a tenth of a run too small for it.
    tokens = json.loads((Path(out) / "manifest.json").read_text())["totals"]["tokens"]
    val = 10_485_760 if tokens > 2 * 10_485_760 else tokens // 10
    cmd = [str(BIN / "tokenshards"), "export", str(out), "--format", "llmc", "--to", str(dest), "--workers", str(workers),
           "--val-tokens", str(val), "--dashboard-address", ":0", "--progress", "none"] + (["--shuffle"] if shuffle else [])
    stdout, wall, peak = run_metered(cmd)
    shutil.rmtree(dest, ignore_errors=True)
    # The summary's first line: "done: N files; val D documents, T tokens; train D documents, T tokens; ..."
    done = next(line for line in stdout.splitlines() if line.startswith("done:"))
    tokens = sum(int(n.replace(",", "")) for n in re.findall(r"([\d,]+) tokens", done))
    return {"tokens": tokens, "seconds": wall, "peak_rss_bytes": peak}


def replicate_run(src: Path, dest: Path, times: int) -> Path:
    """A finished run ``times`` as large as ``src``: every partition again under other ids and
    input names (token files hard-linked where possible), so export's memory can be checked on
    a larger run without tokenizing more text."""
    if (dest / "manifest.json").exists():
        return dest
    manifest = json.loads((src / "manifest.json").read_text())
    parts = sorted(manifest["partitions"], key=lambda e: e["index"])
    (dest / "parts").mkdir(parents=True, exist_ok=True)
    entries, inputs = [], []
    for copy in range(times):
        inputs += [{**i, "path": f"{i['path']}#copy{copy}"} for i in manifest["inputs"]]
        for e in parts:
            n = len(entries)
            names = {"tokens_file": f"parts/part-{n:05d}.tokens.npy", "docs_file": f"parts/part-{n:05d}.docs.parquet"}
            try:
                os.link(src / e["tokens_file"], dest / names["tokens_file"])
            except OSError:
                shutil.copyfile(src / e["tokens_file"], dest / names["tokens_file"])
            table = pq.read_table(src / e["docs_file"])
            ids = pa.array([f"{x}#copy{copy}" for x in table.column("id").to_pylist()], pa.string())
            pq.write_table(table.set_column(table.schema.get_field_index("id"), "id", ids), dest / names["docs_file"])
            entries.append({**e, **names, "index": n, "input": f"{e['input']}#copy{copy}"})
    totals = {k: sum(int(e[k]) for e in entries) for k in manifest["totals"]}
    (dest / "manifest.json").write_text(json.dumps({**manifest, "inputs": inputs, "partitions": entries, "totals": totals}))
    return dest


def export_targets(small: Path, big: Path, workers: int, repeats: int, scratch: Path) -> dict:
    """Unshuffled and shuffled exports of ``small`` interleaved; one shuffled export of ``big``."""
    plain, shuffled = [], []
    for r in range(repeats):
        plain.append(run_export(small, workers, scratch, shuffle=False))
        shuffled.append(run_export(small, workers, scratch, shuffle=True))
        print(f"export repeat {r + 1}/{repeats}: unshuffled {plain[-1]['seconds']:.1f} s, shuffled {shuffled[-1]['seconds']:.1f} s",
              file=sys.stderr)
    big_run = run_export(big, workers, scratch, shuffle=True)
    ratio = median(shuffled, "seconds") / median(plain, "seconds")
    growth = big_run["peak_rss_bytes"] / median(shuffled, "peak_rss_bytes")
    return {"runs": {"unshuffled": plain, "shuffled": shuffled, "shuffled_larger_run": big_run},
            "tokens": [plain[0]["tokens"], big_run["tokens"]],
            "shuffled_vs_unshuffled_time": ratio, "target_time": 2.0, "time_ok": ratio <= 2.0,
            "shuffled_peak_rss_bytes": [median(shuffled, "peak_rss_bytes"), big_run["peak_rss_bytes"]],
            "memory_growth": growth, "memory_ok": growth <= 1.25}


def print_export(e: dict) -> None:
    small, big = e["tokens"]
    print(f"export --shuffle vs unshuffled (llmc, {small:,} tokens): x{e['shuffled_vs_unshuffled_time']:.2f} time "
          f"(target <= 2: {'ok' if e['time_ok'] else 'MISSED'})")
    print(f"export --shuffle peak RSS at {small:,} vs {big:,} tokens: {e['shuffled_peak_rss_bytes'][0] / 1e6:.0f} MB vs "
          f"{e['shuffled_peak_rss_bytes'][1] / 1e6:.0f} MB, x{e['memory_growth']:.2f} (target flat, <= 1.25: "
          f"{'ok' if e['memory_ok'] else 'MISSED'})")


def tiktoken_env(encoding: str) -> dict:
    """The shared scripts call tiktoken.get_encoding; offline, point them at a tiktoken cache
    holding the packaged, hash-checked rank files."""
    from tokenshards.encoding.encoders import OFFLINE_COPIES, prepare_offline_cache

    env = dict(os.environ)
    if "TIKTOKEN_CACHE_DIR" not in env and encoding in OFFLINE_COPIES:
        env["TIKTOKEN_CACHE_DIR"] = str(prepare_offline_cache(encoding))
    return env


def run_script(script: str, args: list[str]) -> dict:
    path = HERE / script if (HERE / script).exists() else SHARED / script
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True,
                          env=tiktoken_env("gpt2"))
    if proc.returncode:
        raise SystemExit(f"{script} failed:\n{proc.stderr}")
    line = proc.stdout.strip().splitlines()[-1]
    fields = dict(kv.split("=") for kv in line.split()[1:])
    return {"tokens": int(fields["tokens"]), "seconds": float(fields["seconds"]), "tokens_per_s": float(fields["tokens_per_s"])}


def fast_ceilings() -> dict[str, tuple[str, list[str]]]:
    """backend -> (script, extra args) of each fast ceiling this machine can run."""
    from tokenshards.encoding.backends import _installed

    found = {}
    if _installed("splintr"):
        found["splintr"] = ("raw_limit.py", ["--backend", "splintr"])
    if _installed("gigatoken"):
        found["gigatoken"] = ("fast_ceiling.py", ["--backend", "gigatoken"])
    return found


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    global SHARED
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=200, help="text in the corpus (default 200 MB)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--memory-scale", type=float, default=4, help="second corpus size for the memory check (x --mb)")
    ap.add_argument("--corpus-dir", type=Path, default=HERE / "corpus")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results.json (results-export.json)")
    ap.add_argument("--export-only", type=Path, metavar="RUN", help="measure only the export targets on this finished run")
    ap.add_argument("--skip-export", action="store_true", help="leave out the export targets")
    ap.add_argument("--shared", type=Path, default=SHARED, help="where raw_limit.py and the others live (default ../shared/bench)")
    a = ap.parse_args()
    SHARED = a.shared
    if a.export_only:
        a.out = a.out or HERE / "results-export.json"
        with tempfile.TemporaryDirectory(prefix="tokenshards-bench-") as tmp:
            big = replicate_run(a.export_only, Path(tmp) / "larger-run", round(a.memory_scale))
            results = {"run": str(a.export_only), "workers": a.workers, "repeats": a.repeats,
                       "larger_run": f"{a.export_only} x{round(a.memory_scale)} (replicate_run)",
                       "export": export_targets(a.export_only, big, a.workers, a.repeats, Path(tmp))}
        a.out.write_text(json.dumps(results, indent=1) + "\n")
        print_export(results["export"])
        print(f"written to {a.out}")
        return
    a.out = a.out or HERE / "results.json"
    if not (SHARED / "raw_limit.py").exists():
        raise SystemExit(f"{SHARED}/raw_limit.py not found: the ceiling and baseline scripts live in shared/bench")

    corpus, source = build_corpus(a.corpus_dir / f"{a.mb:g}mb", a.mb)
    pattern = str(corpus / "**" / "*.parquet") if any(corpus.glob("*/**/*.parquet")) else str(corpus / "*.parquet")
    files = sorted(Path(p) for p in __import__("glob").glob(pattern, recursive=True))
    glob_arg = str(files[0].parent / "*.parquet")
    from tokenshards.encoding.backends import FAST_BACKENDS, _installed

    # The reference, then every installed fast backend, fastest first: the first is what --backend auto picks.
    backends = ["tiktoken"] + [b for b in FAST_BACKENDS if _installed(b)]
    default = backends[1] if len(backends) > 1 else "tiktoken"
    runs: dict[str, list[dict]] = {f"ours_{b}": [] for b in backends}
    runs.update(ceiling=[], baseline=[])
    fast = fast_ceilings()
    runs.update({f"fast_ceiling_{b}": [] for b in fast})
    with tempfile.TemporaryDirectory(prefix="tokenshards-bench-") as tmp:
        scratch = Path(tmp)
        for r in range(a.repeats):
            for b in backends:
                keep = b == default and r == a.repeats - 1 and not a.skip_export  # the run the export targets read
                runs[f"ours_{b}"].append(run_ours(corpus, a.workers, b, scratch, keep=keep))
            runs["ceiling"].append(run_script("raw_limit.py", [glob_arg, "--procs", str(a.workers)]))
            for b, (script, extra) in fast.items():
                runs[f"fast_ceiling_{b}"].append(run_script(script, [glob_arg, "--procs", str(a.workers), *extra]))
            runs["baseline"].append(run_script("peer_mp_pool.py", [glob_arg, str(scratch / "peer"), "--procs", str(a.workers)]))
            shutil.rmtree(scratch / "peer", ignore_errors=True)
            print(f"repeat {r + 1}/{a.repeats}: " + ", ".join(f"{k} {v[-1]['tokens_per_s'] / 1e6:.2f} M tok/s"
                                                         for k, v in runs.items()), file=sys.stderr)
        memory = {}
        if a.memory_scale:
            big, _ = build_corpus(a.corpus_dir / f"{a.mb * a.memory_scale:g}mb", a.mb * a.memory_scale)
            big_files = sorted(big.rglob("*.parquet"))
            big_glob = str(big_files[0].parent / "*.parquet")
            small_peak = median(runs[f"ours_{default}"], "peak_rss_bytes")
            if not a.skip_export:  # the smaller run moves aside for the export targets; the larger one is kept too
                Path(runs[f"ours_{default}"][-1]["out"]).rename(scratch / "export-small-run")
            # Untimed: the same two runs with the tree's PSS (shared pages split, not counted per process).
            pss = [run_ours(c, a.workers, default, scratch, proportional=True)["peak_rss_bytes"] for c in (corpus, big)]
            big_run = run_ours(big, a.workers, default, scratch, keep=not a.skip_export)
            big_peak = big_run["peak_rss_bytes"]
            memory = {"backend": default, "corpus_mb": [a.mb, a.mb * a.memory_scale],
                      "peak_rss_bytes": [small_peak, big_peak], "growth": big_peak / small_peak,
                      "peak_pss_bytes": pss, "pss_growth": pss[1] / pss[0],
                      "larger_corpus_run": big_run,
                      # The fast ceilings again on the same larger corpus (their rate depends on the text).
                      "larger_corpus_fast_ceilings": {
                          b: run_script(script, [big_glob, "--procs", str(a.workers), *extra])
                          for b, (script, extra) in fast.items()}}
        export = {}
        if not a.skip_export:
            small_out = scratch / "export-small-run" if a.memory_scale else Path(runs[f"ours_{default}"][-1]["out"])
            big_out = Path(memory["larger_corpus_run"]["out"]) if memory else replicate_run(small_out, scratch / "larger-run", 4)
            export = export_targets(small_out, big_out, a.workers, a.repeats, scratch)

    ceiling = median(runs["ceiling"], "tokens_per_s")
    baseline = median(runs["baseline"], "tokens_per_s")
    results = {
        "corpus": {"mb": a.mb, "files": len(files), "source": source}, "workers": a.workers, "repeats": a.repeats,
        "medians_tokens_per_s": {k: median(v, "tokens_per_s") for k, v in runs.items()},
        "ratios": {}, "memory": memory, "export": export, "runs": runs,
    }
    fast_rates = {b: median(runs[f"fast_ceiling_{b}"], "tokens_per_s") for b in fast}
    results["fast_ceilings_tokens_per_s"] = fast_rates
    for b in backends:
        ours = runs[f"ours_{b}"]
        results["ratios"][b] = {
            "whole_command_vs_ceiling": median(ours, "tokens_per_s") / ceiling,
            "tokenizing_phase_vs_ceiling": median(ours, "phase_tokens_per_s") / ceiling,
            "whole_command_vs_mp_pool": median(ours, "tokens_per_s") / baseline,
            "peak_rss_mb": median(ours, "peak_rss_bytes") / 1e6,
        }
        for f, rate in fast_rates.items():
            results["ratios"][b][f"whole_command_vs_fast_ceiling_{f}"] = median(ours, "tokens_per_s") / rate
            results["ratios"][b][f"tokenizing_phase_vs_fast_ceiling_{f}"] = median(ours, "phase_tokens_per_s") / rate
    if memory:
        # The fixed start-up weighs less on more text; the ceiling is a rate, so this run's median applies.
        big_run = memory["larger_corpus_run"]
        big_scale = f"{a.mb * a.memory_scale:g}_mb"
        results["ratios"][default][f"whole_command_vs_ceiling_at_{big_scale}"] = big_run["tokens_per_s"] / ceiling
        for f, run in memory["larger_corpus_fast_ceilings"].items():
            results["ratios"][default][f"whole_command_vs_fast_ceiling_{f}_at_{big_scale}"] = big_run["tokens_per_s"] / run["tokens_per_s"]
            results["ratios"][default][f"tokenizing_phase_vs_fast_ceiling_{f}_at_{big_scale}"] = big_run["phase_tokens_per_s"] / run["tokens_per_s"]
    a.out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"corpus: {a.mb:g} MB of text ({source}), {a.workers} workers, median of {a.repeats} interleaved runs")
    print(f"ceiling (bare tiktoken x{a.workers}): {ceiling / 1e6:.2f} M tokens/s; mp.Pool baseline: {baseline / 1e6:.2f} M tokens/s")
    for f, rate in fast_rates.items():
        print(f"fast ceiling (bare {f} x{a.workers}): {rate / 1e6:.2f} M tokens/s")
    for b, r in results["ratios"].items():
        rate = results["medians_tokens_per_s"][f"ours_{b}"]
        print(f"tokenshards --backend {b}: {rate / 1e6:.2f} M tokens/s, whole command {r['whole_command_vs_ceiling']:.2f} of ceiling, tokenizing phase "
              f"{r['tokenizing_phase_vs_ceiling']:.2f}, {r['whole_command_vs_mp_pool']:.2f}x mp.Pool, peak RSS {r['peak_rss_mb']:.0f} MB")
        for f in fast_rates:
            print(f"    vs the fast ceiling of {f}: whole command {r[f'whole_command_vs_fast_ceiling_{f}']:.2f}, "
                  f"tokenizing phase {r[f'tokenizing_phase_vs_fast_ceiling_{f}']:.2f}")
    if memory:
        big_run = memory["larger_corpus_run"]
        print(f"tokenshards --backend {default} on {a.mb * a.memory_scale:g} MB (one run): whole command "
              f"{big_run['tokens_per_s'] / ceiling:.2f} of ceiling, tokenizing phase {big_run['phase_tokens_per_s'] / ceiling:.2f}")
        for f, run in memory["larger_corpus_fast_ceilings"].items():
            print(f"    vs the fast ceiling of {f} there: whole command {big_run['tokens_per_s'] / run['tokens_per_s']:.2f}, "
                  f"tokenizing phase {big_run['phase_tokens_per_s'] / run['tokens_per_s']:.2f}")
        print(f"peak RSS (--backend {default}) at {a.mb:g} MB vs {a.mb * a.memory_scale:g} MB of text: x{memory['growth']:.2f}")
        print(f"peak PSS (shared pages split among processes; untimed runs): {memory['peak_pss_bytes'][0] / 1e6:.0f} MB vs "
              f"{memory['peak_pss_bytes'][1] / 1e6:.0f} MB, x{memory['pss_growth']:.2f}")
    if export:
        print_export(export)
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
