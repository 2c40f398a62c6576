"""What a new user trips on (issue 17), each through the command line as they would meet it:
an unquoted glob, llm.c's llama-3 layout, a tiny last shard, verify on the wrong folder, the demo's
summary line, what the make targets run, error wording, and the manifest's id column.

These tests assert what the commands print and do, never the README's or the docs' prose
(tests/test_docs.py builds the site and runs its examples)."""
from __future__ import annotations

import argparse
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import write_parquet
from readback import read_documents
from tokenshards.cli import build_parser, main
from tokenshards.tokenize import resume

ROOT = Path(__file__).resolve().parent.parent
TEXTS = [f"document {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 7) for i in range(90)]


def _files(folder: Path, *, names=("a", "b", "c"), ids=True, language=False) -> list[Path]:
    """Small parquet files of 30 documents each, several row groups."""
    paths = []
    for n, name in enumerate(names):
        texts = TEXTS[30 * n:30 * n + 30]
        columns = {"text": texts}
        if ids:
            columns["id"] = [f"{name}-{i}" for i in range(len(texts))]
        if language:
            columns["language"] = ["en"] * len(texts)
        paths.append(write_parquet(folder / f"{name}.parquet", columns, row_group_size=10))
    return paths


def _cli(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _tokenize(capsys, cluster, inputs, out: Path, *extra) -> str:
    code, _, err = _cli(capsys, ["tokenize", "--input", *inputs, "--out", out, "--scheduler", cluster.scheduler_address,
                                 "--progress", "none", *extra])
    assert code == 0, err
    return err


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _one_error(err: str) -> str:
    """The whole of stderr must be one `tokenshards: error:` line."""
    assert err.startswith("tokenshards: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err[len("tokenshards: error: "):-1]


# -- an unquoted glob ----------------------------------------------------------------------------------
def test_unquoted_glob_and_repeated_input_give_the_same_run(cluster, tmp_path, capsys):
    a, b, c = _files(tmp_path / "in")
    _tokenize(capsys, cluster, [a, b, c], tmp_path / "expanded")  # `--input in/*.parquet`, as the shell passes it
    _cli(capsys, ["tokenize", "--input", a, "--input", b, c, "--out", tmp_path / "mixed",
                  "--scheduler", cluster.scheduler_address, "--progress", "none"])
    expanded, mixed = _manifest(tmp_path / "expanded"), _manifest(tmp_path / "mixed")
    assert [i["path"] for i in expanded["inputs"]] == [str(a), str(b), str(c)]
    assert expanded["totals"]["docs"] == len(TEXTS) and mixed["job"] == expanded["job"]
    for entry in expanded["partitions"]:
        assert (tmp_path / "mixed" / entry["tokens_file"]).read_bytes() == (tmp_path / "expanded" / entry["tokens_file"]).read_bytes()


def test_unquoted_glob_for_train_bpe(cluster, tmp_path, capsys):
    files = _files(tmp_path / "in")
    runs = {}
    for name, inputs in (("expanded", ["--input", *files]), ("folder", ["--input", tmp_path / "in"])):
        code, out, err = _cli(capsys, ["train-bpe", *inputs, "--out", tmp_path / f"{name}.tiktoken", "--vocab-size", "300",
                                       "--scheduler", cluster.scheduler_address, "--progress", "none"])
        assert code == 0, err
        runs[name] = (tmp_path / f"{name}.tiktoken").read_bytes()
        assert f"in {len(TEXTS):,} documents" in out
    assert runs["expanded"] == runs["folder"]


def test_every_command_that_takes_inputs_takes_several_after_one_flag():
    parser = build_parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    with_input = {name: p for name, p in commands.items() if any("--input" in a.option_strings for a in p._actions)}
    assert set(with_input) == {"tokenize", "train-bpe"}
    for name, sub in with_input.items():
        required = [x for a in sub._actions if a.required and a.option_strings for x in (a.option_strings[0], "o.tiktoken")]
        args = parser.parse_args([name, "--input", "a.parquet", "b.parquet", "--input", "c.parquet", *required])
        assert args.input == ["a.parquet", "b.parquet", "c.parquet"], name


def test_a_command_line_naming_another_command_gets_the_same_parser_but_exports():
    """build_parser(argv) leaves export's parser a placeholder when argv names another command
    (its formats import numpy and pyarrow): every other command's parser is the one the whole
    parser has, and OTHER_COMMANDS names exactly those."""
    from tokenshards import cli

    def commands(parser):
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices

    whole = commands(build_parser())
    assert set(cli.OTHER_COMMANDS) == set(whole) - {"export"}
    for name in cli.OTHER_COMMANDS:
        named = commands(build_parser(["--debug", name]))
        assert list(named) == list(whole), name
        assert named[name].format_help() == whole[name].format_help(), name
    assert commands(build_parser(["export"]))["export"].format_help() == whole["export"].format_help()
    for argv in (["-h", "tokenize"], ["--help"], []):  # the command list shows export's whole help line
        assert cli._command_named(argv) is None


# -- llm.c exports: who reads them ---------------------------------------------------------------------
def test_llmc_export_of_a_wide_vocabulary_says_who_can_read_it(cluster, tmp_path, capsys):
    files = _files(tmp_path / "in")
    _tokenize(capsys, cluster, files, tmp_path / "cl100k", "--encoding", "cl100k_base")
    _tokenize(capsys, cluster, files, tmp_path / "gpt2")
    notes = {}
    for name in ("cl100k", "gpt2"):
        code, out, err = _cli(capsys, ["export", tmp_path / name, "--format", "llmc", "--to", tmp_path / f"{name}-llmc",
                                       "--val-tokens", "0", "--scheduler", cluster.scheduler_address])
        assert code == 0, err
        notes[name] = [line for line in out.splitlines() if "llama-3" in line]
    assert len(notes["cl100k"]) == 1 and not notes["gpt2"]
    line = notes["cl100k"][0]
    assert "magic 20240801, version 7, uint32" in line and "100,277-token vocabulary" in line
    assert "train_llama3.py reads it" in line and "C dataloader" in line and "modded-nanogpt" in line and "reject" in line
    header = np.fromfile(tmp_path / "cl100k-llmc" / "fineweb_train_000000.bin", dtype="<i4", count=3)
    assert header[:2].tolist() == [20240801, 7]
    # The --format help says the same; it does not promise modded-nanogpt for it.
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "llmc: llm.c .bin shards (GPT-2 layout, also read by modded-nanogpt; vocabularies over 65,536 ids get " \
           "llm.c's llama-3 layout, which only llm.c's train_llama3.py reads)" in help_text


# -- no shard too small to train on --------------------------------------------------------------------
@pytest.fixture
def gpt2_run(cluster, tmp_path, capsys):
    out = tmp_path / "run"
    _tokenize(capsys, cluster, _files(tmp_path / "in"), out)
    return out, _manifest(out)["totals"]["tokens"]


def _export(capsys, cluster, out: Path, to: Path, *options) -> tuple[list[Path], list[str]]:
    code, stdout, err = _cli(capsys, ["export", out, "--to", to, "--val-tokens", "0",
                                      "--scheduler", cluster.scheduler_address, *options])
    assert code == 0, err
    return sorted(p for p in to.iterdir() if p.suffix in (".bin", ".npy")), stdout.splitlines()


def _llmc_tokens(path: Path) -> np.ndarray:
    raw = path.read_bytes()
    header = np.frombuffer(raw[:1024], "<i4")
    assert header[:2].tolist() == [20240520, 1]
    tokens = np.frombuffer(raw[1024:], "<u2")
    assert len(tokens) == header[2]
    return tokens


def test_a_short_last_shard_joins_the_one_before(gpt2_run, cluster, tmp_path, capsys):
    out, total = gpt2_run
    shard = (total - 5) // 3  # three full shards and a tail of 5 to 7 tokens
    tail = total - 3 * shard
    assert 5 <= tail < shard // 100
    every = np.concatenate([np.asarray(t) for _, t in read_documents(out).values()])

    files, lines = _export(capsys, cluster, out, tmp_path / "llmc", "--format", "llmc", "--shard-tokens", shard,
                           "--min-shard-tokens", 1000)
    sizes = [len(_llmc_tokens(p)) for p in files]
    assert [p.name for p in files] == [f"fineweb_train_{i:06d}.bin" for i in range(3)]
    assert sizes == [shard, shard, shard + tail]
    assert np.concatenate([_llmc_tokens(p) for p in files]).tolist() == every.tolist()
    assert f"      train: 3 shards; the last, fineweb_train_000002.bin, holds {shard + tail:,} tokens: its final " \
           f"{tail:,} joined it rather than make a shard under --min-shard-tokens (1,000)" in lines
    record = json.loads((tmp_path / "llmc" / "fineweb_export.json").read_text())
    assert record["min_shard_tokens"] == 1000 and [f["tokens"] for f in record["files"]] == sizes

    # The default bound is 1% of --shard-tokens: the same fold, for npy too.
    files, lines = _export(capsys, cluster, out, tmp_path / "npy", "--format", "npy", "--shard-tokens", shard)
    assert [len(np.load(p)) for p in files] == [shard, shard, shard + tail]
    assert any(f"under --min-shard-tokens ({shard // 100:,})" in line for line in lines)

    # 0 keeps the tail as its own shard, and the summary says how small it is.
    files, lines = _export(capsys, cluster, out, tmp_path / "kept", "--format", "llmc", "--shard-tokens", shard,
                           "--min-shard-tokens", 0)
    assert [len(_llmc_tokens(p)) for p in files] == [shard, shard, shard, tail]
    assert f"      train: 4 shards; the last, fineweb_train_000003.bin, holds {tail:,} tokens" in lines

    # A bound above the shard size: shards join until the last one holds enough.
    files, _ = _export(capsys, cluster, out, tmp_path / "big", "--format", "llmc", "--shard-tokens", shard,
                       "--min-shard-tokens", 2 * shard)
    assert [len(_llmc_tokens(p)) for p in files] == [shard, 2 * shard + tail]

    # A split smaller than the bound stays one shard, and the summary says so.
    files, lines = _export(capsys, cluster, out, tmp_path / "one", "--format", "llmc", "--min-shard-tokens", total + 1)
    assert [len(_llmc_tokens(p)) for p in files] == [total]
    assert f"      train: 1 shard, fineweb_train_000000.bin, {total:,} tokens: the whole split, under " \
           f"--min-shard-tokens ({total + 1:,}); llm.c reads it with processes x B x T up to {total - 1:,}" in lines


def test_min_shard_tokens_is_refused_where_there_are_no_shards(tmp_path, capsys):
    code, _, err = _cli(capsys, ["export", tmp_path, "--format", "megatron", "--to", tmp_path / "d", "--min-shard-tokens", 5])
    assert code == 2 and _one_error(err) == "--min-shard-tokens applies to llmc, npy and hf; megatron writes one file per split"


# -- verify (export, inspect) on a folder that is not a run --------------------------------------------
@pytest.mark.parametrize("command", [["verify"], ["inspect"], ["export", "--format", "llmc", "--to", "unused"]])
def test_a_folder_that_is_not_a_run_is_named_as_such(command, tmp_path, capsys):
    inputs = tmp_path / "in"
    _files(inputs)
    code, _, err = _cli(capsys, [command[0], inputs, *command[1:]])
    message = _one_error(err)
    assert code == 2 and message == (
        f"{inputs}: no manifest.json; not a finished tokenshards run (not a tokenshards output at all: no parts/, "
        "no tokenshards-job.json; it holds parquet files, like an input folder; pass the --out folder of a "
        "`tokenshards tokenize` run)")
    code, _, err = _cli(capsys, [command[0], tmp_path / "typo", *command[1:]])
    assert code == 2 and _one_error(err) == (
        f"{tmp_path / 'typo'}: no manifest.json; not a finished tokenshards run (there is no such folder: "
        "check the path, or pass the --out folder of a `tokenshards tokenize` run)")
    assert "resume" not in message and "rerun" not in message


def test_an_unfinished_run_keeps_the_resume_advice(gpt2_run, tmp_path, capsys):
    out, _ = gpt2_run
    (out / "manifest.json").unlink()
    code, _, err = _cli(capsys, ["verify", out])
    assert code == 2 and _one_error(err) == f"{out} has no manifest.json: the run did not finish; rerun the same tokenize command to resume"
    # Killed before its first partition: only the job file is there.
    shutil.rmtree(out / "parts")
    code, _, err = _cli(capsys, ["verify", out])
    assert code == 2 and "rerun the same tokenize command to resume" in _one_error(err)


# -- the demo and the make targets ---------------------------------------------------------------------
# The demo corpus is this Python's own docs: on 3.11 (the machines' Python) verify ends with this line.
DEMO_SUMMARY = {(3, 11): "4 partitions, 624 documents, 640,041 tokens: OK"}


def test_demo_verify_ends_with_one_summary_line(cluster, tmp_path, capsys):
    """`make tokenize` then `make verify`: the same commands, ending with one summary line."""
    assert _cli(capsys, ["demo-corpus", "--to", tmp_path / "demo"])[0] == 0
    _tokenize(capsys, cluster, [f"{tmp_path / 'demo'}/*.parquet"], tmp_path / "out")
    code, out, err = _cli(capsys, ["verify", tmp_path / "out", "--scheduler", cluster.scheduler_address])
    assert code == 0, out + err
    printed = out.splitlines()[-1]
    assert re.fullmatch(r"\d+ partitions?, [\d,]+ documents?, [\d,]+ tokens?: OK", printed), printed
    if sys.version_info[:2] in DEMO_SUMMARY:
        assert printed == DEMO_SUMMARY[sys.version_info[:2]]


def _make_dry_run(*variables: str) -> list[str]:
    """The `tokenshards inspect` command `make inspect` would run, as arguments."""
    proc = subprocess.run(["make", "-n", "--no-print-directory", "inspect", *variables], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.replace("\\\n", " ").splitlines()  # make prints a recipe's continued lines as written
    line = next(line for line in lines if "tokenshards inspect" in line)
    return shlex.split(line)[1:]


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("git") is None, reason="needs make and git")
def test_make_inspect_writes_its_plot_into_the_run(gpt2_run, capsys):
    out, _ = gpt2_run
    args = _make_dry_run(f"OUT={out}")
    assert args == ["inspect", str(out), "--plot", f"{out}/lengths.png"]
    code, stdout, err = _cli(capsys, args)
    assert code == 0, err
    assert (out / "lengths.png").read_bytes().startswith(b"\x89PNG") and f"plot: {out}/lengths.png" in stdout
    # The demo's run by default, and git ignores where its plot goes.
    assert _make_dry_run()[:2] == ["inspect", "out/demo"]
    assert _make_dry_run("OUT=out/demo")[-1] == "out/demo/lengths.png"
    assert "--plot" not in _make_dry_run("OUT=out/demo", "PLOT=")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", "-q", "out/demo/lengths.png"], cwd=ROOT)
    assert ignored.returncode == 0


def test_jobs_scripts_run_with_the_project_python(cluster, tmp_path):
    """`.venv/bin/python jobs/tokenize_corpus.py ...` is `tokenshards tokenize ...`."""
    files = _files(tmp_path / "in")
    proc = subprocess.run([sys.executable, "jobs/tokenize_corpus.py", "--input", *map(str, files), "--out",
                           str(tmp_path / "out"), "--scheduler", cluster.scheduler_address, "--progress", "none"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _manifest(tmp_path / "out")["totals"]["docs"] == len(TEXTS)


# -- wording -------------------------------------------------------------------------------------------
PARTITION_MB = "must be a finite number of megabytes of at least 0.000001 (one byte); the default sizes partitions from the corpus"


@pytest.mark.parametrize("argv, message", [
    (["export", "OUT", "--format", "llmc", "--to", "D", "--shard-tokens", "0"], "--shard-tokens 0 must be at least 1"),
    (["export", "OUT", "--format", "llmc", "--to", "D", "--val-tokens", "-1"],
     "--val-tokens -1 must be 0 (no validation set) or more"),
    (["export", "OUT", "--format", "npy", "--to", "D", "--min-shard-tokens", "-1"],
     "--min-shard-tokens -1 must be 0 (keep every last shard as it is) or more"),
    (["export", "OUT", "--format", "llmc", "--to", "D", "--prefix", "a/b"],
     "--prefix 'a/b': expected a plain file name prefix such as 'fineweb'"),
    (["tokenize", "--input", "x.parquet", "--out", "O", "--workers", "0"], "--workers 0 must be at least 1"),
    (["tokenize", "--input", "x.parquet", "--out", "O", "--partition-mb", "0"],
     f"--partition-mb 0 {PARTITION_MB}"),
    (["tokenize", "--dataset", "HuggingFaceFW/fineweb", "--size", "10B", "--out", "O", "--keep-free-gb", "-1"],
     "--keep-free-gb -1 must be 0 or more"),
    (["train-bpe", "--input", "x.parquet", "--out", "v.tiktoken", "--partition-mb", "-2"], f"--partition-mb -2 {PARTITION_MB}"),
    (["verify", "OUT", "--deep", "-1"], "--deep -1 must be 0 or more documents"),
])
def test_errors_name_the_flag(argv, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _cli(capsys, argv)
    assert code == 2 and _one_error(err) == message
    assert not re.search(r"\b[a-z]+_[a-z_]+=", err)  # no `shard_tokens=0`: the user typed a flag


def test_one_file_one_language_one_partition(cluster, tmp_path, capsys):
    (path,) = _files(tmp_path / "in", names=("a",), language=True)
    err = _tokenize(capsys, cluster, [path], tmp_path / "out")
    assert "1 input file, 30 rows, " in err and " in 1 partition\n" in err
    code, out, _ = _cli(capsys, ["inspect", tmp_path / "out"])
    assert code == 0
    assert "inputs      1 file, 30 rows" in out and "(the inputs' 'language' column; 1 language)" in out
    assert not re.search(r"\b1 (files|languages|partitions)\b", out + err)
    code, out, _ = _cli(capsys, ["verify", tmp_path / "out", "--scheduler", cluster.scheduler_address])
    assert code == 0 and out.splitlines()[-1].startswith("1 partition, 30 documents, ")


# -- the manifest's id column --------------------------------------------------------------------------
def test_manifest_records_the_id_column_the_run_used(cluster, tmp_path, capsys):
    with_id = _files(tmp_path / "ids")
    without = _files(tmp_path / "plain", names=("d",), ids=False)
    other = write_parquet(tmp_path / "other" / "e.parquet", {"text": TEXTS[:5], "doc": [f"e{i}" for i in range(5)]})
    for name, inputs, extra, column in (("found", with_id, [], "id"), ("none", without, [], None),
                                        ("named", [other], ["--id-column", "doc"], "doc")):
        _tokenize(capsys, cluster, inputs, tmp_path / name, *extra)
        manifest = _manifest(tmp_path / name)
        assert manifest["id_column"] == column and "inputs_without_id_column" not in manifest, name
    ids = {doc_id for doc_id, _ in read_documents(tmp_path / "found").values()}
    assert ids == {f"{n}-{i}" for n in "abc" for i in range(30)}

    _tokenize(capsys, cluster, [with_id[0], *without], tmp_path / "mixed")
    manifest = _manifest(tmp_path / "mixed")
    assert manifest["id_column"] == "id" and manifest["inputs_without_id_column"] == [str(without[0])]

    # What the run was asked (find `id` by itself) stays the job's identity, as in runs made before
    # this change: an unfinished one of those resumes, and its manifest then names the column.
    out = tmp_path / "found"
    assert json.loads((out / resume.JOB_FILE).read_text())["id_column"] is None
    before = {p.name: p.read_bytes() for p in (out / "parts").iterdir()}
    (out / "manifest.json").unlink()
    err = _tokenize(capsys, cluster, with_id, out)
    committed = len(_manifest(out)["partitions"])
    assert f"{committed} already committed, skipping them" in err
    assert _manifest(out)["id_column"] == "id"
    assert {p.name: p.read_bytes() for p in (out / "parts").iterdir()} == before
