"""Issue 55: every case of its probe that failed, each an explicit test, through the one reader
(``format.run``) every command reads a run by. Each command runs in this process
(``tokenshards.cli.main``), on the session cluster where it needs one: a refusal is exit 2 and one
line naming the file and what is wrong, no traceback, nothing written; a FIFO never hangs a command
(the timeout fails the test); a pristine run beside a damaged one is left byte-identical."""
from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydoc_data.topics import topics

from conftest import write_parquet
from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.format import v1
from tokenshards.format.reader import TokenDataset
from tokenshards.format.records import parse_json, JsonError

TEXTS = [topics[name][:3000] for name in sorted(topics)[:20]]
pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("one-reader-in")
    write_parquet(root / "a.parquet", {"text": TEXTS[:10], "language": ["en"] * 10}, row_group_size=3)
    write_parquet(root / "b.parquet", {"text": TEXTS[10:]}, row_group_size=4)
    return root


def tokenize_argv(inputs: Path, out: Path, scheduler: str) -> list[str]:
    return ["tokenize", "--input", str(inputs / "a.parquet"), str(inputs / "b.parquet"), "--out", str(out),
            "--partition-mb", "0.008", "--scheduler", scheduler, "--progress", "none"]


@pytest.fixture(scope="module")
def run(inputs, cluster, tmp_path_factory) -> Path:
    """One real run, shared: tests damage copies of it."""
    out = tmp_path_factory.mktemp("one-reader-run") / "run"
    code = main(tokenize_argv(inputs, out, cluster.scheduler_address))
    assert code == 0 and len(manifest_of(out)["partitions"]) >= 3
    return out


@pytest.fixture
def copy(run, tmp_path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def manifest_of(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def refused(capsys, *argv, needles=()) -> str:
    """Exit 2, no traceback, one error line holding every needle."""
    code, out, err = cli(capsys, *argv)
    assert "Traceback" not in out + err, out + err
    errors = [line for line in err.splitlines() if line.startswith("tokenshards: error: ")]
    assert code == 2 and len(errors) == 1, (code, out, err)
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def export_argv(out: Path, dest: Path, scheduler: str, *extra) -> list:
    return ["export", out, "--format", "npy", "--to", dest, "--val-tokens", "0", "--scheduler", scheduler,
            "--progress", "none", *extra]


def every_reader_refuses(capsys, out: Path, tmp_path: Path, scheduler: str, *needles: str, inspect: bool = True) -> None:
    """export, inspect (``inspect``: it reads the damaged file; it reads no tokens file) and
    TokenDataset refuse in one line holding the needles; verify exits non-zero; the export wrote
    nothing."""
    dest = tmp_path / "dest"
    refused(capsys, *export_argv(out, dest, scheduler), needles=needles)
    assert not dest.exists() or not [p for p in dest.rglob("*") if p.is_file()], list(dest.rglob("*"))
    if inspect:
        refused(capsys, "inspect", out, needles=needles)
    with pytest.raises(UserError) as raised:
        ds = TokenDataset(str(out))
        for i in range(len(ds)):
            ds.doc(i)
    assert all(n in str(raised.value) for n in needles), raised.value
    code, printed, err = cli(capsys, "verify", out, "--scheduler", scheduler)
    assert code in (1, 2) and "Traceback" not in printed + err, printed + err


def rewrite_tokens(out: Path, index: int, values: np.ndarray, *, fix_sha: bool) -> None:
    """Partition ``index``'s tokens file rewritten as ``np.save`` writes ``values``; with ``fix_sha``
    its sha256 (and size) updated in the manifest and the done record, as a careful vandal would."""
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    raw = buf.getvalue()
    (out / v1.tokens_file(index)).write_bytes(raw)
    if fix_sha:
        update_entry(out, index, sha256=hashlib.sha256(raw).hexdigest(), tokens_bytes=len(raw))


def update_entry(out: Path, index: int, **fields) -> None:
    manifest = manifest_of(out)
    manifest["partitions"][index].update(fields)
    (out / "manifest.json").write_text(json.dumps(manifest))
    done = out / v1.done_file(index)
    done.write_text(json.dumps({**json.loads(done.read_text()), **fields}))


def tokens_of(out: Path, index: int) -> np.ndarray:
    return np.load(out / v1.tokens_file(index))


# -- wrong output with exit 0 --------------------------------------------------------------------

def test_big_endian_tokens_with_a_fixed_sha256_are_refused(copy, tmp_path, cluster, capsys):
    rewrite_tokens(copy, 0, tokens_of(copy, 0).astype(">u2"), fix_sha=True)
    every_reader_refuses(capsys, copy, tmp_path, cluster.scheduler_address, v1.tokens_file(0), "holds >u2 values",
                         inspect=False)


def test_overlapping_documents_are_refused(copy, tmp_path, cluster, capsys):
    """``start[1] = 0``: document 0 would be written twice and document 1 dropped. The run is made as
    an older version made it (no docs_sha256), so only the table's own consistency can tell."""
    path = copy / v1.docs_file(1)
    table = pq.read_table(path).to_pydict()
    table["start"][1] = 0
    pq.write_table(__import__("pyarrow").table(table), path)
    manifest = manifest_of(copy)
    for entry in manifest["partitions"]:
        entry.pop("docs_sha256")
        entry["docs_bytes"] = (copy / entry["docs_file"]).stat().st_size
        done = copy / v1.done_file(entry["index"])
        done.write_text(json.dumps({**entry, "job": json.loads(done.read_text())["job"]}))
    (copy / "manifest.json").write_text(json.dumps(manifest))
    every_reader_refuses(capsys, copy, tmp_path, cluster.scheduler_address, v1.docs_file(1), "document 1 starts at 0",
                         "overlap")


def test_tokens_whose_bytes_are_not_their_sha256_are_never_copied(copy, tmp_path, cluster, capsys):
    values = tokens_of(copy, 2).copy()
    values[5] = (int(values[5]) + 1) % 50_000
    rewrite_tokens(copy, 2, values, fix_sha=False)
    dest = tmp_path / "dest"
    refused(capsys, *export_argv(copy, dest, cluster.scheduler_address), needles=(v1.tokens_file(2), "sha256"))
    assert not [p for p in dest.rglob("*") if p.is_file()]
    with pytest.raises(UserError, match="sha256"):  # locally, TokenDataset hashes a file at its first read
        TokenDataset(str(copy)).tokens(0, manifest_of(copy)["totals"]["tokens"])


# -- another run damaged -------------------------------------------------------------------------

def test_an_export_into_another_run_is_refused(run, copy, tmp_path, cluster, capsys):
    before = snapshot(copy)
    for to in (copy / "parts", copy, copy / "parts" / "deeper"):
        refused(capsys, *export_argv(run, to, cluster.scheduler_address), needles=(str(to), "the run", str(copy)))
    assert snapshot(copy) == before


def test_a_tokenize_into_another_run_is_refused(copy, inputs, cluster, capsys):
    before = snapshot(copy)
    argv = tokenize_argv(inputs, copy / "parts" / "sub", cluster.scheduler_address)
    refused(capsys, *argv, needles=("--out", "inside the run", str(copy)))
    assert snapshot(copy) == before


# -- read outside OUT ----------------------------------------------------------------------------

def test_a_manifest_that_is_a_symlink_out_of_the_run(copy, run, tmp_path, cluster, capsys):
    elsewhere = tmp_path / "elsewhere.json"
    shutil.copy(run / "manifest.json", elsewhere)
    (copy / "manifest.json").unlink()
    (copy / "manifest.json").symlink_to(elsewhere)
    every_reader_refuses(capsys, copy, tmp_path, cluster.scheduler_address, "manifest.json", "outside OUT")


# -- hangs ---------------------------------------------------------------------------------------

def test_a_fifo_as_a_runs_input_never_hangs_inspect(inputs, cluster, tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(inputs, folder)
    out = tmp_path / "run"
    assert main(tokenize_argv(folder, out, cluster.scheduler_address)) == 0
    (folder / "a.parquet").unlink()
    os.mkfifo(folder / "a.parquet")
    code, printed, err = cli(capsys, "inspect", out)
    assert code == 0 and "Traceback" not in err, err
    assert f"input {folder / 'a.parquet'} is not a regular file (a FIFO)" in printed, printed


@pytest.mark.parametrize("victim", ["job", "done", "lease"])
def test_a_fifo_in_an_unfinished_run_is_one_line(copy, inputs, cluster, capsys, victim):
    (copy / "manifest.json").unlink()
    name = {"job": v1.JOB_FILE, "done": v1.done_file(1), "lease": ".tokenshards-lease.json"}[victim]
    if (copy / name).exists():
        (copy / name).unlink()
    os.mkfifo(copy / name)
    refused(capsys, *tokenize_argv(inputs, copy, cluster.scheduler_address), needles=(name, "not a regular file (a FIFO)"))


# -- tracebacks ----------------------------------------------------------------------------------

def test_a_manifest_nested_100000_deep(copy, tmp_path, cluster, capsys):
    (copy / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    every_reader_refuses(capsys, copy, tmp_path, cluster.scheduler_address, "manifest.json", "nested 100,000 levels deep")
    with pytest.raises(JsonError, match="nested"):
        parse_json(b'{"a": ' * 70 + b"1" + b"}" * 70)
    assert parse_json(b'{"a": "[[[[{{{{"}') == {"a": "[[[[{{{{"}  # brackets inside strings do not count


def test_a_job_file_holding_null(copy, inputs, cluster, capsys):
    (copy / "manifest.json").unlink()
    (copy / v1.JOB_FILE).write_text("null")
    refused(capsys, *tokenize_argv(inputs, copy, cluster.scheduler_address), needles=(v1.JOB_FILE, "not a JSON object"))


@pytest.mark.parametrize("length", [-5, None])
def test_a_docs_length_of_minus_five_or_null(copy, capsys, length):
    path = copy / v1.docs_file(0)
    table = pq.read_table(path).to_pydict()
    table["length"][1] = length
    pq.write_table(__import__("pyarrow").table(table, schema=pq.read_schema(path)), path)
    refused(capsys, "inspect", copy, needles=(v1.docs_file(0),))


def test_verify_given_the_manifest_file(run, cluster, capsys):
    refused(capsys, "verify", run / "manifest.json", "--scheduler", cluster.scheduler_address,
            needles=("manifest.json", "is a file, not a run's folder"))


def test_a_dangling_parquet_symlink_in_an_input_folder(inputs, tmp_path, capsys):
    folder = tmp_path / "in"
    shutil.copytree(inputs, folder)
    (folder / "c.parquet").symlink_to(tmp_path / "gone.parquet")
    refused(capsys, "tokenize", "--input", folder, "--out", tmp_path / "out", "--scheduler", "tcp://127.0.0.1:9",
            needles=("c.parquet", "does not exist"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("option, value", [("--tokens", "inf"), ("--tokens", "1e400"), ("--seq-len", str(10**23)),
                                           ("--val-tokens", str(10**20)), ("--shard-tokens", "nan")])
def test_impossible_export_numbers(run, tmp_path, capsys, option, value):
    extra = ["--shuffle"] if option == "--tokens" else []
    fmt = "hf" if option == "--seq-len" else "npy"
    refused(capsys, "export", run, "--format", fmt, "--to", tmp_path / "dest", option, value, *extra,
            "--scheduler", "tcp://127.0.0.1:9", needles=(option,))
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("option, value", [("--sample-bytes", "inf"), ("--vocab-size", "5000000000"),
                                           ("--min-count", "1e400")])
def test_impossible_train_bpe_numbers_before_counting(inputs, tmp_path, capsys, option, value):
    """Refused before any input is read or a cluster started (the scheduler named does not exist)."""
    refused(capsys, "train-bpe", "--input", inputs, "--out", tmp_path / "v.tiktoken", option, value,
            "--scheduler", "tcp://127.0.0.1:9", needles=(option,))
    assert not list(tmp_path.iterdir())


def test_an_export_under_a_file(run, inputs, cluster, capsys):
    refused(capsys, *export_argv(run, inputs / "a.parquet" / "sub", cluster.scheduler_address),
            needles=("a.parquet is a file, not a folder",))


# -- impossible requests accepted ------------------------------------------------------------------

def test_a_thousand_workers_on_this_machine(inputs, tmp_path, capsys):
    line = refused(capsys, "tokenize", "--input", inputs, "--out", tmp_path / "out", "--workers", "1000",
                   needles=("--workers 1,000", "at most", "per core"))
    assert not (tmp_path / "out").exists(), line


def test_out_inside_an_input_folder_reached_through_a_symlink(inputs, tmp_path, capsys):
    (tmp_path / "link").symlink_to(inputs)
    refused(capsys, "tokenize", "--input", inputs, "--out", tmp_path / "link" / "out", "--scheduler", "tcp://127.0.0.1:9",
            needles=("is inside --input",))
    assert not (inputs / "out").exists()


# -- the Python API ------------------------------------------------------------------------------

@pytest.mark.parametrize("damage, needle", [
    (lambda t: t.reshape(-1, 1), "shape"),
    (lambda t: t.astype("<u4"), "holds <u4 values"),
])
def test_token_dataset_refuses_arrays_of_another_shape_or_dtype(copy, damage, needle):
    rewrite_tokens(copy, 1, damage(tokens_of(copy, 1)), fix_sha=True)
    with pytest.raises(UserError, match=needle):
        ds = TokenDataset(str(copy))
        ds.tokens(0, ds.n_tokens)


def test_token_dataset_refuses_a_truncated_tokens_file(copy):
    path = copy / v1.tokens_file(1)
    path.write_bytes(path.read_bytes()[:-7])
    ds = TokenDataset(str(copy), check_sha256=False)  # the size alone tells
    with pytest.raises(UserError, match=r"truncated"):
        ds.tokens(0, ds.n_tokens)


def test_the_pristine_run_reads_as_before(run, tmp_path, cluster, capsys):
    """Nothing here refuses what a real run writes (and none of the above touched it)."""
    before = snapshot(run)
    code, printed, err = cli(capsys, "verify", run, "--scheduler", cluster.scheduler_address)
    assert code == 0, printed + err
    code, printed, err = cli(capsys, *export_argv(run, tmp_path / "npy", cluster.scheduler_address))
    assert code == 0 and "every tokens file's sha256" in err, err
    ds = TokenDataset(str(run))
    stream = np.concatenate([tokens_of(run, e["index"]) for e in manifest_of(run)["partitions"]])
    assert ds.tokens(0, ds.n_tokens).tolist() == stream.tolist()
    assert snapshot(run) == before


# -- the same checks on an object store ------------------------------------------------------------

def test_an_object_store_run_goes_through_the_same_checks(copy, s3, capsys):
    """No links or FIFOs there, but headers, sizes, docs tables and kinds of object are checked alike:
    a big-endian tokens file (its sha256 rewritten), a docs table whose documents overlap (re-signed),
    and a "folder" where a done record belongs."""
    import hashlib

    rewrite_tokens(copy, 0, tokens_of(copy, 0).astype(">u2"), fix_sha=True)
    path = copy / v1.docs_file(1)
    table = pq.read_table(path).to_pydict()
    table["start"][1] = 0
    pq.write_table(__import__("pyarrow").table(table), path)
    update_entry(copy, 1, docs_sha256=hashlib.sha256(path.read_bytes()).hexdigest(), docs_bytes=path.stat().st_size)
    fs, bucket = s3.fs(), s3.make_bucket()
    for p in sorted(copy.rglob("*")):
        if p.is_file():
            fs.put_file(str(p), f"{bucket}/run/{p.relative_to(copy).as_posix()}")
    fs.put_file(str(copy / v1.done_file(2)), f"{bucket}/run/{v1.done_file(2)}/inside")  # a prefix, not an object
    fs.rm(f"{bucket}/run/{v1.done_file(2)}")
    url = f"s3://{bucket}/run"
    ds = TokenDataset(url, storage_options=s3.storage_options)
    with pytest.raises(UserError, match=r"part-00000.tokens.npy: holds >u2 values"):
        ds.tokens(0, 10)
    with pytest.raises(UserError, match=r"part-00001.docs.parquet: document 1 starts at 0"):
        ds.doc(len(pq.read_table(copy / v1.docs_file(0))) + 1)
    options = [f"--storage-option={k}={v}" for k, v in s3.storage_options.items() if isinstance(v, str)]
    options += [f"--storage-option=endpoint_url={s3.storage_options['client_kwargs']['endpoint_url']}"] \
        if "client_kwargs" in s3.storage_options else []
    refused(capsys, "inspect", url, *options, needles=("part-00001.docs.parquet", "document 1 starts at 0"))
    from tokenshards.format import run as run_files
    from tokenshards.storage.location import Location

    with pytest.raises(run_files.BadRunFile, match=r"is not a file but a folder"):
        run_files.read_done(Location.at(url, s3.storage_options), v1.done_file(2))
