"""The rest of issue 45, each through the real ``tokenshards`` binary: error paths that cancel
futures print one line and none of distributed's noise; no write probe or empty ``parts/`` left
behind; an interrupted export told the truth; a fixed-width progress line; integer plot ticks;
SIGTERM without a leaked-semaphore warning; ``verify --deep`` never echoing what a manifest says
of files outside OUT; and every command's documented failure cases without a traceback."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import write_parquet

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TIMEOUT = 180
QUIET = ("--progress", "none", "--dashboard-address", ":0")


def _cli(*argv: str, timeout: int = TIMEOUT, env: dict | None = None, cwd=None) -> tuple[int, str]:
    proc = subprocess.run([TOKENSHARDS, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=None if env is None else {**os.environ, **env})
    return proc.returncode, proc.stdout + proc.stderr


def _one_line(code: int, printed: str, *needles: str) -> str:
    """A non-zero exit, no traceback nor distributed's noise, and one error line holding every needle."""
    assert "Traceback" not in printed and "Task exception was never retrieved" not in printed, printed
    assert code != 0, printed
    errors = [line for line in printed.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(errors) == 1, printed
    for needle in needles:
        assert needle in errors[0], printed
    return errors[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("more-in")
    write_parquet(root / "a.parquet", {"text": [f"document {i}: " + "words and more words " * (5 + i % 40)
                                                for i in range(400)]}, row_group_size=50)
    return root / "a.parquet"


@pytest.fixture(scope="module")
def small_run(corpus, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("more-run") / "out"
    code, printed = _cli("tokenize", "--input", str(corpus), "--out", str(out), "--workers", "1",
                         "--partition-mb", "0.02", *QUIET)
    assert code == 0, printed
    return out


# -- the progress line keeps its width ---------------------------------------------------------------

def test_the_progress_bar_keeps_its_width(corpus, tmp_path):
    code, printed = _cli("tokenize", "--input", str(corpus), "--out", str(tmp_path / "out"), "--workers", "1",
                         "--partition-mb", "0.005", "--progress", "bar", "--dashboard-address", ":0",
                         env={"COLUMNS": "150"})
    assert code == 0 and "Traceback" not in printed, printed
    frames = [f.removesuffix("\x1b[K") for line in printed.splitlines() if "partitions " in line and "%" in line
              for f in line.split("\r") if f.strip()]
    assert len(frames) >= 4 and len({len(f) for f in frames}) == 1, frames


# -- the plot counts whole documents -------------------------------------------------------------------

def _tick_labels(svg: str, axis: str) -> list[str]:
    """The text of each major tick label on ``axis`` ('x' or 'y'): matplotlib's SVG keeps each
    text as a comment in its tick's group."""
    labels = []
    for group in re.split(rf'<g id="{axis}tick_\d+">', svg)[1:]:
        said = re.search(r"<!-- (.*?) -->", group)
        if said:
            labels.append(said.group(1))
    return labels


def test_the_plot_counts_whole_documents(tmp_path):
    """Five documents, one per length: the y axis says 0 and 1 (and nothing between), not
    0, 0, 0, 1, 1, 1 for ticks at 0.2 steps."""
    write_parquet(tmp_path / "few.parquet", {"text": ["one", "one two three", "a b c d e f g h", "x " * 30, "y " * 90]})
    code, printed = _cli("tokenize", "--input", str(tmp_path / "few.parquet"), "--out", str(tmp_path / "run"),
                         "--workers", "1", *QUIET)
    assert code == 0, printed
    code, printed = _cli("inspect", str(tmp_path / "run"), "--plot", str(tmp_path / "lengths.svg"))
    assert code == 0 and "Traceback" not in printed, printed
    ticks = _tick_labels((tmp_path / "lengths.svg").read_text(), "y")
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    assert len(set(ticks)) == len(ticks) and ticks == sorted(ticks, key=int), ticks


# -- an interrupted export is told the truth -------------------------------------------------------------

def _interrupt_when(argv: list[str], seen: str, *, timeout: int = TIMEOUT) -> tuple[int, str]:
    """Run the command, send SIGINT to it alone (as a terminal's Ctrl-C reaches it: its workers
    ignore SIGINT) once its stderr shows ``seen``; its exit code and everything it printed."""
    import signal
    import threading

    err: list[str] = []
    with subprocess.Popen([TOKENSHARDS, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        def read():
            for line in proc.stderr:
                err.append(line)
                if seen in line and proc.poll() is None:
                    proc.send_signal(signal.SIGINT)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        out = proc.stdout.read()
        proc.wait(timeout=timeout)
        reader.join(timeout=10)
    return proc.returncode, out + "".join(err)


def test_an_interrupted_export_is_not_told_to_resume(small_run, tmp_path):
    dest = tmp_path / "dest"
    code, printed = _interrupt_when(["export", str(small_run), "--format", "npy", "--to", str(dest), "--val-tokens", "100",
                                     "--workers", "1", "--progress", "log", "--dashboard-address", ":0"], "dashboard:")
    assert code == 130 and "Traceback" not in printed, printed
    said = [line for line in printed.splitlines() if line.startswith("tokenshards: interrupted")]
    assert said == [f"tokenshards: interrupted; an export does not resume: {dest} may hold part of this one (files "
                    "without their record, which no trainer should read); rerun with --overwrite to replace them"], printed
    assert "resume" not in said[0].replace("does not resume", "")
    code, printed = _cli("export", str(small_run), "--format", "npy", "--to", str(dest), "--val-tokens", "100",
                         "--workers", "1", "--overwrite", *QUIET)
    assert code == 0, printed
    assert (dest / "fineweb_export.json").is_file()
