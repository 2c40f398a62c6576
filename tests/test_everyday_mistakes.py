"""Everyday mistakes of issue 45 that tokenize itself refuses, and the dashboard kept to this machine."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from conftest import write_parquet
from tokenshards.cluster.connect import loopback_unless_named
from tokenshards.errors import UserError
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import refuse_out_among_inputs

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))


@pytest.mark.parametrize("inputs,out,refused", [
    (("data",), "data/out", "is inside --input data"),
    (("data/",), "data", "is inside --input data/"),
    (("data/**",), "data/o", "would read the part files of --out data/o"),
    (("data/**/*.parquet",), "data/deep/o", "would read the part files"),
    (("data/*/*/*.parquet",), "data/o", "would read the part files"),
    (("data/*.parquet",), "data/o", None),  # the glob's * never reaches data/o/parts/
    (("data",), "elsewhere/out", None),
    (("data",), "data-out", None),  # a sibling whose name starts like the input's
    (("s3://bucket/corpus",), "s3://bucket/corpus/run", "is inside --input s3://bucket/corpus"),
    (("s3://bucket/corpus",), "s3://bucket/corpus-run", None),
])
def test_out_the_inputs_would_read_is_refused(tmp_path, monkeypatch, inputs, out, refused):
    monkeypatch.chdir(tmp_path)
    config = TokenizeConfig(inputs=inputs, out=out)
    if refused is None:
        refuse_out_among_inputs(config)
    else:
        with pytest.raises(UserError, match=refused.replace("*", r"\*")):
            refuse_out_among_inputs(config)


def test_out_inside_input_through_the_cli(tmp_path):
    write_parquet(tmp_path / "data" / "a.parquet", {"text": ["one document"]})
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--input", str(tmp_path / "data"), "--out", str(tmp_path / "data" / "out")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"tokenshards: error: --out {tmp_path}/data/out is inside --input "
                                                f"{tmp_path}/data: the next run would read its part files as corpus "
                                                "files; choose an --out outside the input folder"]
    assert not (tmp_path / "data" / "out").exists()


def test_dashboard_addresses():
    assert loopback_unless_named(":8787") == "127.0.0.1:8787"
    assert loopback_unless_named(":0") == "127.0.0.1:0"
    assert loopback_unless_named("0.0.0.0:8787") == "0.0.0.0:8787"  # opened on purpose
    assert loopback_unless_named("127.0.0.1:8787") == "127.0.0.1:8787"


def test_the_dashboard_listens_on_loopback_by_default(tmp_path):
    """The shipped default and a host-less :PORT: the dashboard's socket is bound to 127.0.0.1 only."""
    write_parquet(tmp_path / "a.parquet", {"text": [f"document {i} " * 200 for i in range(200)]})
    proc = subprocess.Popen([TOKENSHARDS, "tokenize", "--input", str(tmp_path / "a.parquet"), "--out", str(tmp_path / "o"),
                             "--workers", "1", "--progress", "none", "--dashboard-address", ":0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[str] = set()
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and time.monotonic() < deadline and not seen:
            try:
                seen = {c.laddr.ip for c in psutil.Process(proc.pid).net_connections(kind="tcp")
                        if c.status == psutil.CONN_LISTEN}
            except psutil.Error:
                pass
            time.sleep(0.05)
    finally:
        output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert seen and seen <= {"127.0.0.1"}, seen


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    write_parquet(root / "a.parquet", {"text": [f"document {i}: " + "words and more words " * (5 + i % 40) for i in range(300)]})
    out = root / "out"
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--input", str(root / "a.parquet"), "--out", str(out), "--workers", "1",
                           "--progress", "none", "--no-dashboard"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _export(run: Path, to: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([TOKENSHARDS, "export", str(run), "--format", "npy", "--to", str(to), "--val-tokens", "100",
                           "--workers", "1", "--progress", "none", "--no-dashboard", *args],
                          capture_output=True, text=True, timeout=180)


def test_a_mixture_the_client_cannot_plan_is_refused(small_run, tmp_path):
    """`--tokens 1T` of a small run: one line saying how many passes, before any ordering (the
    client grew to 14.8 GB before); nothing written."""
    proc = _export(small_run, tmp_path / "x", "--tokens", "1T")
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokenshards: error:")]
    assert errors == [proc.stderr.strip().splitlines()[-1]] and len(errors) == 1, proc.stderr
    assert errors[0].startswith("tokenshards: error: --tokens 1,000,000,000,000 asks ") and " passes over " in errors[0]
    assert "ordering" not in proc.stderr and not list((tmp_path / "x").glob("*.npy"))


def test_a_mixture_that_repeats_says_how_often(small_run, tmp_path):
    total = json.loads((small_run / "manifest.json").read_text())["totals"]["tokens"]
    proc = _export(small_run, tmp_path / "x", "--tokens", str(total * 3))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r": 3\.\d* passes over its [\d,]+ train tokens \(3 whole, each document that many times, then a top-up\)",
                     proc.stderr), proc.stderr


def _cli(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([TOKENSHARDS, *args], capture_output=True, text=True, timeout=timeout)


def test_a_misspelled_option_gets_a_suggestion_in_one_line():
    """argparse's own errors are one line like every other (issue 54: not its 14 lines of usage)."""
    proc = _cli("tokenize", "--inptu", "x", "--out", "y")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr == ("tokenshards: error: tokenize: unrecognized arguments: --inptu x (did you mean --input?) "
                           "(see tokenshards tokenize --help)\n")


@pytest.mark.parametrize("args, says", [
    (("export", "run", "--format", "hf", "--to", "x", "--seq-len", "abc"), "argument --seq-len: invalid int value: 'abc'"),
    (("export", "run", "--format", "hf", "--to", "x", "--pack", "first-fit"), "argument --pack: invalid choice: 'first-fit'"),
    (("export", "run", "--to", "x"), "the following arguments are required: --format"),
    (("frobnicate",), "invalid choice: 'frobnicate'"),
])
def test_argparses_own_errors_are_one_line(args, says, capsys):
    from tokenshards.cli import main

    with pytest.raises(SystemExit) as stopped:
        main(list(args))
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tokenshards: error: ") and says in err, err


def test_debug_after_the_subcommand(tmp_path):
    proc = _cli("verify", str(tmp_path / "nothing"), "--debug")
    assert proc.returncode == 2 and "unrecognized arguments" not in proc.stderr
    assert "Traceback" in proc.stderr  # what --debug is for


def test_scheduler_with_workers_is_refused(tmp_path):
    proc = _cli("tokenize", "--input", str(tmp_path), "--out", str(tmp_path / "o"), "--scheduler", "tcp://127.0.0.1:1",
                "--workers", "4")
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "tokenshards: error: --workers 4 sizes a local cluster; with --scheduler the scheduler's own workers run: drop "
        "--workers, or start more with `dask worker`"]


def test_inspect_plot_writes_what_its_name_says(small_run, tmp_path):
    proc = _cli("inspect", str(small_run), "--plot", str(tmp_path / "lengths.svg"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "lengths.svg").read_bytes().startswith(b"<?xml")
    proc = _cli("inspect", str(small_run), "--plot", str(tmp_path / "lengths.gif"))
    assert proc.returncode == 2 and proc.stderr.strip() == (f"tokenshards: error: --plot {tmp_path}/lengths.gif: name a "
                                                            ".png, .svg or .pdf file")


def test_npy_export_does_not_speak_of_llmc(small_run, tmp_path):
    proc = _export(small_run, tmp_path / "x")
    assert proc.returncode == 0 and "llm.c" not in proc.stdout, proc.stdout


def test_a_rerun_with_nothing_to_do_gives_no_rate_and_counts_its_start_up(small_run):
    began = time.monotonic()
    proc = _cli("tokenize", "--input", str(small_run.parent / "a.parquet"), "--out", str(small_run), "--workers", "1",
                "--progress", "none", "--no-dashboard")
    wall = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.splitlines()[1]
    said = re.fullmatch(r"\s+1 partition \(1 already committed\): nothing to tokenize, ([\d.]+) s", line)
    assert said, line
    assert float(said.group(1)) >= 0.7 * wall - 0.2, (said.group(1), wall)  # start-up included


def test_an_error_text_is_cut_at_a_word():
    from tokenshards.wording import brief

    cause = ("HTTPSConnectionPool(host='huggingface.co', port=443): Max retries exceeded with url: /api/datasets "
             "(Caused by NameResolutionError(\"<urllib3.connection.HTTPSConnection object at 0x7f0>: Failed to resolve "
             "'huggingface.co' ([Errno -3] Temporary failure in name resolution)\"))")
    short = brief(cause, 120)
    assert len(short) <= 120 and short.endswith(" …") and cause.startswith(short[:-2])
    assert cause.split()[len(short[:-2].split()) - 1] == short[:-2].split()[-1]  # the last word is whole
    assert brief("two\nlines") == "two lines"
