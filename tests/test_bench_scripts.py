"""The bench scripts that split a task's time read the task's own functions: a rename in the task
must fail here, not print 0% for a step in the next ``make bench``."""
import re
import subprocess
import sys
from pathlib import Path

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
