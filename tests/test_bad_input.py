"""Bad input: one line naming the file and column, a non-zero exit, and no manifest."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import corrupt_data_pages, write_parquet
from readback import read_documents
from tokenshards.errors import InputError, OutputConflict, UserError
from tokenshards.verify.command import VerifyConfig, run_verify

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TEXTS = [f"document number {i} with some words in it" for i in range(200)]


@pytest.fixture
def good(tmp_path):
    return write_parquet(tmp_path / "in" / "good.parquet", {"text": TEXTS, "id": [str(i) for i in range(200)]},
                         row_group_size=50)


def test_missing_text_column_lists_columns(tokenize, tmp_path):
    path = write_parquet(tmp_path / "a.parquet", {"body": ["x"], "url": ["u"]})
    with pytest.raises(InputError, match=r"a\.parquet: no text column 'text'; columns are body, url; pass --text-column NAME"):
        tokenize([path])
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_text_column_not_strings(tokenize, tmp_path):
    path = write_parquet(tmp_path / "a.parquet", {"text": [1, 2]})
    with pytest.raises(InputError, match=r"a\.parquet: column 'text' holds int64, not strings"):
        tokenize([path])


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_unreadable_file_named(tokenize, good, damage):
    raw = good.read_bytes()
    good.write_bytes(b"not parquet at all" * 10 if damage == "garbage" else raw[: len(raw) // 2])
    with pytest.raises(InputError, match=r"good\.parquet: not a readable parquet file .*pass --on-bad-file skip"):
        tokenize([good])


def test_corrupt_pages_fail_the_job_naming_the_row_groups(tokenize, good, tmp_path):
    corrupt_data_pages(good)
    with pytest.raises(InputError, match=r"good\.parquet: row groups \d+\.\.\d+ unreadable"):
        tokenize([good], partition_bytes=1)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_skip_records_unreadable_files_and_partitions(tokenize, good, tmp_path, cluster):
    broken = tmp_path / "in" / "broken.parquet"
    broken.write_bytes(b"garbage")
    pages = write_parquet(tmp_path / "in" / "pages.parquet", {"text": TEXTS}, row_group_size=100)
    corrupt_data_pages(pages)
    summary, out = tokenize([tmp_path / "in"], on_bad_file="skip")
    manifest = json.loads((out / "manifest.json").read_text())
    skipped = {Path(s["path"]).name: s for s in manifest["skipped_inputs"]}
    assert set(skipped) == {"broken.parquet", "pages.parquet"}
    assert "not a readable parquet file" in skipped["broken.parquet"]["reason"]
    assert skipped["pages.parquet"]["row_groups"] == [0, 2]
    # Recorded as why, never with advice to pass the flag this run was given.
    assert not any("on-bad-file" in s["reason"] or "re-download" in s["reason"] for s in skipped.values()), skipped
    docs = read_documents(out)
    assert {Path(k[0]).name for k in docs} == {"good.parquet"} and summary.docs == 200
    # The skipped partition leaves a gap in the indices that verify accounts for.
    report = run_verify(VerifyConfig(out=str(out), scheduler=cluster.scheduler_address), announce=lambda m: None)
    assert report.ok, report.problems
    assert manifest["planned_partitions"] == len(manifest["partitions"]) + 1


def test_an_unreadable_input_error_says_the_skip_flag_and_travels_from_a_worker_whole():
    """Its message ends with what to do, the skip flag last; its reason (what skip records) has
    neither; a pickled copy (a worker's error reaching the client) is the same error."""
    import pickle

    from tokenshards.errors import UnreadableInput

    e = UnreadableInput("f.parquet: row groups 0..3 unreadable (bad page)", "re-download the file")
    assert str(e) == "f.parquet: row groups 0..3 unreadable (bad page); re-download the file, or pass --on-bad-file skip"
    assert e.reason == "f.parquet: row groups 0..3 unreadable (bad page)"
    copy = pickle.loads(pickle.dumps(e))
    assert isinstance(copy, InputError) and (str(copy), copy.reason) == (str(e), e.reason)
    assert InputError("f.parquet: no text column 'text'").reason == "f.parquet: no text column 'text'"


def test_path_matching_nothing(tokenize, tmp_path):
    with pytest.raises(UserError, match=r"input '.*nothing-\*\.parquet' matches no file"):
        tokenize([tmp_path / "nothing-*.parquet"])


def test_an_input_matching_nothing_is_said_before_dask_dataframe_is_imported(tmp_path):
    """The command's own process: a mistake found before any graph is built does not wait for
    dask.dataframe (~0.3 s of imports here) to be said."""
    probe = ("import sys; from tokenshards.cli import main; "
             f"code = main(['tokenize', '--input', {str(tmp_path / 'nothing.parquet')!r}, '--out', {str(tmp_path / 'out')!r}]); "
             "print(code, 'dask.dataframe' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["2", "False"], done.stderr
    assert done.stderr.strip().endswith("matches no file; check the path or glob (quote globs so the shell leaves them alone)")


def test_output_that_cannot_be_written(tokenize, good, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(UserError, match=r"cannot write to output '.*a-file/out'"):
        tokenize([good], out=blocker / "out")


def test_rerun_with_other_options_refuses_unless_overwrite(tokenize, good, tmp_path):
    tokenize([good])
    with pytest.raises(OutputConflict, match=r"already holds a different run \(eot_position 'prefix' → 'suffix'\)"):
        tokenize([good], eot_position="suffix")
    extra = write_parquet(tmp_path / "in" / "extra.parquet", {"text": ["more"]})
    with pytest.raises(OutputConflict, match=r"inputs \(1 added, 0 removed, 0 changed"):
        tokenize([good, extra])
    summary, out = tokenize([good], eot_position="suffix", overwrite=True)
    assert json.loads((out / "manifest.json").read_text())["eot_position"] == "suffix"


@pytest.mark.parametrize("args, message", [
    (["--text-column", "body"], r"no text column 'body'; columns are text, id"),
    (["--encoding", "nope"], r"unknown encoding 'nope'"),
])
def test_cli_one_line_exit_2_no_traceback(good, tmp_path, args, message):
    out = tmp_path / "cli"
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--input", str(good), "--out", str(out), "--workers", "1",
                           "--no-dashboard", "--progress", "none", *args],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokenshards: error:")]
    assert len(errors) == 1 and __import__("re").search(message, errors[0]), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "manifest.json").exists()


def test_debug_shows_the_traceback(good, tmp_path):
    proc = subprocess.run([TOKENSHARDS, "--debug", "tokenize", "--input", str(good), "--out", str(tmp_path / "o"),
                           "--encoding", "nope"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" in proc.stderr


def test_a_path_workers_cannot_see_says_they_need_the_same_path(tmp_path):
    from tokenshards.corpus.plan import read_input_metadata

    with pytest.raises(InputError, match=r"gone\.parquet: file not found on a worker; workers must see the same path"):
        read_input_metadata(str(tmp_path / "gone.parquet"), "gone.parquet", text_column="text", id_column=None)
