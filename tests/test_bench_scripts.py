"""The bench scripts that split a task's time read the task's own functions: a rename in the task
must fail here, not print 0% for a step in the next ``make bench``."""
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

from tokenshards.demo import build_demo_corpus

REPO = Path(__file__).resolve().parents[1]


def test_where_time_goes_finds_every_step_of_a_real_task(tmp_path):
    build_demo_corpus(tmp_path / "corpus", files=2)
    done = subprocess.run([sys.executable, str(REPO / "bench" / "where_time_goes.py"), str(tmp_path / "corpus" / "*.parquet"),
                           "--partition-mb", "0.05", "--mb", "1"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    shares = dict(re.findall(r"^  (\S.*?)\s+(\d+\.\d)%", done.stdout, flags=re.M))
    assert {"tokenizer", "parquet decode", "write + fsync + commit", "file bytes + sha256", "eot placement",
            "spot check (tiktoken)", "UTF-8 validation", "the rest"} <= set(shares), done.stdout
    # Every step is some of the CPU on any real partition, the writes above all (three files, fsynced).
    assert float(shares["write + fsync + commit"]) > 0, done.stdout
    assert float(shares["tokenizer"]) > 0 and float(shares["parquet decode"]) > 0, done.stdout


def test_bench_report_says_what_the_whole_command_target_left_our_phase(capsys, monkeypatch):
    """``make bench`` prints, per corpus, what the 0.88 target allowed (the ceiling times only its
    encode call) and how fast, after our time outside the tokenizing phase, the phase would have had
    to run; here also from the kept 1 GB results, so a change in their shape fails here, not after a bench."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import run as bench

    ours = [{"seconds": 7.0, "phase_seconds": 5.0}, {"seconds": 8.0, "phase_seconds": 5.5},
            {"seconds": 9.0, "phase_seconds": 6.0}]
    budget = bench.whole_command_budget(ours, [{"seconds": 4.4}, {"seconds": 5.5}, {"seconds": 6.0}])
    assert budget["allowed_seconds"] == 5.5 / 0.88 and budget["outside_phase_seconds"] == 2.5
    assert budget["phase_vs_ceiling_needed"] == 5.5 / (5.5 / 0.88 - 2.5)
    assert bench.whole_command_budget(ours, [{"seconds": 1.0}])["phase_vs_ceiling_needed"] is None
    results = json.loads((REPO / "bench" / "results-1gb.json").read_text())
    for name, measured in results["corpora"].items():
        bench.print_corpus(name, measured, SimpleNamespace(workers=results["workers"], repeats=results["repeats"]))
    lines = re.findall(r"whole-command target allowed \d+\.\d\d s .*? left the phase \d+\.\d\dx bare gigatoken's encode",
                       capsys.readouterr().out)
    assert len(lines) == len(results["corpora"]), lines


def test_checks_bound_measures_each_check_a_run_keeps(tmp_path, monkeypatch):
    """``make bench-bound`` times the product's own checks (its spot-check sample, its planner, its
    writes): a rename there must fail here. Its report is also made from the kept 1 GB results."""
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import checks_bound

    build_demo_corpus(tmp_path / "corpus", files=2)
    checks = checks_bound.check_seconds(str(tmp_path / "corpus" / "*.parquet"), "gpt2", tokens=100_000)
    assert checks["partitions"] >= 2 and checks["spot_check"] > 0 and checks["sha256"] > 0, checks
    assert checks["all"] == checks["spot_check"] + checks["utf8"] + checks["sha256"]
    assert checks_bound.files_seconds(tmp_path) > 0
    assert len(list(tmp_path.glob("part-*"))) == checks_bound.FILES_REPEATS * len(checks_bound.PARTITION_FILE_BYTES)
    kept = json.loads((REPO / "bench" / "results-checks-bound.json").read_text())
    lines = checks_bound.describe(kept)
    assert [line.split()[0] for line in lines[1:]] == ["gpt2", "llama3", "qwen3"], lines
