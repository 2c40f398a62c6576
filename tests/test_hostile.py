"""Issue 45: hostile manifests, impossible requests and everyday mistakes, each through the real
``tokenshards`` binary: a non-zero exit, one line naming the problem, no traceback, nothing
outside OUT opened (a FIFO would hang the command: every call has a timeout)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pydoc_data.topics import topics

from conftest import write_parquet
from tokenshards.errors import UserError
from tokenshards.format import v1
from tokenshards.format.reader import TokenDataset
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TEXTS = [topics[name] for name in sorted(topics)[:24]]
TIMEOUT = 120


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile-in")
    write_parquet(root / "a.parquet", {"text": TEXTS[:12] + [None, ""]}, row_group_size=4)
    write_parquet(root / "b.parquet", {"text": TEXTS[12:]}, row_group_size=4)
    return root


def _tokenize(cluster, inputs: Path, out: Path) -> Path:
    config = TokenizeConfig(inputs=(str(inputs / "a.parquet"), str(inputs / "b.parquet")), out=str(out),
                            scheduler=cluster.scheduler_address, partition_bytes=30_000, progress="none")
    run_tokenize(config, announce=lambda msg: None)
    return out


@pytest.fixture(scope="module")
def run(cluster, inputs, tmp_path_factory):
    """One real run shared by the module; tests damage copies of it."""
    out = _tokenize(cluster, inputs, tmp_path_factory.mktemp("hostile-run") / "out")
    assert len(_manifest(out)["partitions"]) >= 3
    return out


@pytest.fixture(scope="module")
def other_run(cluster, inputs, tmp_path_factory):
    """A second, valid run whose files a hostile manifest points at."""
    return _tokenize(cluster, inputs, tmp_path_factory.mktemp("hostile-other") / "out")


@pytest.fixture
def copy(run, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run, out)
    return out


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _edit(out: Path, change) -> None:
    manifest = _manifest(out)
    change(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest))


def _cli(*argv: str, cwd=None) -> tuple[int, str]:
    proc = subprocess.run([TOKENSHARDS, *argv], capture_output=True, text=True, timeout=TIMEOUT, cwd=cwd)
    return proc.returncode, proc.stdout + proc.stderr


def _refused(code: int, printed: str, *needles: str) -> str:
    """A non-zero exit, no traceback, and one error line holding every needle."""
    assert "Traceback" not in printed, printed
    assert code != 0, printed
    errors = [line for line in printed.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(errors) == 1, printed
    for needle in needles:
        assert needle in errors[0], printed
    return errors[0]


def _commands(out: Path, dest: Path, scheduler: str) -> dict[str, list[str]]:
    return {
        "inspect": ["inspect", str(out)],
        "export-llmc": ["export", str(out), "--format", "llmc", "--to", str(dest / "llmc"), "--val-tokens", "1000",
                        "--scheduler", scheduler],
        "export-npy": ["export", str(out), "--format", "npy", "--to", str(dest / "npy"), "--val-tokens", "1000",
                       "--scheduler", scheduler],
    }


def _every_command_refuses(out: Path, tmp_path: Path, scheduler: str, *needles: str) -> None:
    """verify reports the problem; inspect, export (llmc, npy) and TokenDataset refuse in one line;
    no export wrote a shard."""
    code, printed = _cli("verify", str(out), "--scheduler", scheduler)
    assert code != 0 and "Traceback" not in printed, printed
    assert any(line.startswith("problem: manifest.json: ") and all(n in line for n in needles)
               for line in printed.splitlines()), printed
    assert "partition(s)" not in printed and "unusable, nothing else checked" in printed, printed
    for name, argv in _commands(out, tmp_path / "dest", scheduler).items():
        line = _refused(*_cli(*argv), *needles)
        assert "manifest.json" in line, (name, line)
    assert not any(p.is_file() and not p.name.startswith(".") for p in (tmp_path / "dest").rglob("*")), \
        list((tmp_path / "dest").rglob("*"))
    with pytest.raises(UserError, match="manifest.json"):
        TokenDataset(str(out))


# -- hostile manifests ------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value, needles", [
    ("tokens", -5, ("partitions[0].tokens", "-5", "expected a count")),
    ("tokens", 10**30, ("partitions[0].tokens", "expected a count")),
    ("docs", "3", ("partitions[0].docs", "expected a count")),
])
def test_impossible_counts(copy, tmp_path, cluster, field, value, needles):
    _edit(copy, lambda m: m["partitions"][0].__setitem__(field, value))
    _every_command_refuses(copy, tmp_path, cluster.scheduler_address, *needles)


def test_tokens_that_do_not_add_up(copy, tmp_path, cluster):
    """Each count is possible, but the partitions no longer sum to the totals."""
    _edit(copy, lambda m: m["partitions"][0].__setitem__("tokens", m["partitions"][0]["tokens"] - 5))
    for name, argv in _commands(copy, tmp_path / "dest", cluster.scheduler_address).items():
        _refused(*_cli(*argv), "manifest.json", "totals.tokens is ")
    with pytest.raises(UserError, match=r"totals\.tokens is "):
        TokenDataset(str(copy))
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code != 0 and "problem: manifest.json: totals.tokens is " in printed and "Traceback" not in printed


@pytest.mark.parametrize("key, value, needles", [
    ("n_vocab", 1e20, ("encoding.n_vocab", "expected an int in 1..4294967296")),
    ("n_vocab", 2**40, ("encoding.n_vocab",)),
    ("eot", -1, ("encoding.eot is -1", "expected a token id")),
    ("eot", 50257, ("encoding.eot is 50257",)),
    ("dtype", "float64", ("encoding.dtype is 'float64'", "uint16")),
    ("dtype", "uint32", ("encoding.dtype 'uint32' does not fit n_vocab 50257", "'uint16'")),
    ("prefix", [50256, 70000], ("encoding.prefix holds 70000",)),
    ("suffix", "eot", ("encoding.suffix is 'eot'",)),
])
def test_impossible_encodings(copy, tmp_path, cluster, key, value, needles):
    _edit(copy, lambda m: m["encoding"].__setitem__(key, value))
    _every_command_refuses(copy, tmp_path, cluster.scheduler_address, *needles)


def test_unknown_eot_position(copy, tmp_path, cluster):
    _edit(copy, lambda m: m.__setitem__("eot_position", "middle"))
    _every_command_refuses(copy, tmp_path, cluster.scheduler_address, "eot_position is 'middle'")


@pytest.mark.parametrize("key", ["docs_file", "tokens_file"])
def test_absolute_path_into_another_run(copy, other_run, tmp_path, cluster, key):
    target = str(other_run / _manifest(other_run)["partitions"][0][key])
    _edit(copy, lambda m: m["partitions"][0].__setitem__(key, target))
    _every_command_refuses(copy, tmp_path, cluster.scheduler_address, f"partitions[0].{key}",
                           "not a path relative to OUT")


@pytest.mark.parametrize("path", ["../copy2/parts/part-00000.docs.parquet", "parts/../../x.parquet",
                                  "/etc/passwd", "file:///etc/passwd", "s3://bucket/x", "C:/x"])
def test_paths_outside_out(copy, tmp_path, cluster, path):
    _edit(copy, lambda m: m["partitions"][1].__setitem__("docs_file", path))
    _every_command_refuses(copy, tmp_path, cluster.scheduler_address, "partitions[1].docs_file", "relative to OUT")


def test_etc_passwd_is_never_read(copy, tmp_path, cluster):
    _edit(copy, lambda m: m["partitions"][0].__setitem__("tokens_file", "/etc/passwd"))
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code != 0 and "root:" not in printed and "Traceback" not in printed


@pytest.mark.parametrize("key", ["tokens_file", "docs_file"])
def test_a_fifo_is_never_opened(copy, tmp_path, cluster, key):
    """The file is replaced by a FIFO nobody writes: opening it would hang (the timeout fails the test)."""
    name = _manifest(copy)["partitions"][0][key]
    (copy / name).unlink()
    os.mkfifo(copy / name)
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code != 0 and "Traceback" not in printed
    assert f"problem: partition 0: {key} {name!r} is not a regular file (a FIFO)" in printed, printed
    for argv in _commands(copy, tmp_path / "dest", cluster.scheduler_address).values():
        _refused(*_cli(*argv), "is not a regular file (a FIFO)")
    with pytest.raises(UserError, match=r"a FIFO"):
        TokenDataset(str(copy))


def test_a_fifo_manifest_is_never_opened(copy, tmp_path, cluster):
    (copy / "manifest.json").unlink()
    os.mkfifo(copy / "manifest.json")
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code != 0 and "Traceback" not in printed and "not a regular file (a FIFO)" in printed, printed
    for argv in _commands(copy, tmp_path / "dest", cluster.scheduler_address).values():
        _refused(*_cli(*argv), "manifest.json", "not a regular file (a FIFO)")


def test_a_symlink_out_of_the_run(copy, other_run, tmp_path, cluster):
    name = _manifest(copy)["partitions"][0]["tokens_file"]
    (copy / name).unlink()
    (copy / name).symlink_to(other_run / name)
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code != 0 and f"is a symlink to {other_run / name}, outside OUT" in printed, printed
    for argv in _commands(copy, tmp_path / "dest", cluster.scheduler_address).values():
        _refused(*_cli(*argv), "outside OUT")


def test_the_untouched_run_still_passes(run, tmp_path, cluster):
    """The checks refuse nothing a real run writes."""
    code, printed = _cli("verify", str(run), "--scheduler", cluster.scheduler_address)
    assert code == 0, printed
    code, printed = _cli("export", str(run), "--format", "npy", "--to", str(tmp_path / "npy"), "--val-tokens", "1000",
                         "--scheduler", cluster.scheduler_address)
    assert code == 0, printed
    assert TokenDataset(str(run)).n_tokens == _manifest(run)["totals"]["tokens"]


def test_done_record_with_a_hostile_path_is_not_kept(copy, inputs, cluster):
    """A rerun into OUT parses done records with the same parser: a path outside OUT is refused."""
    record = json.loads((copy / v1.done_file(0)).read_text())
    record["tokens_file"] = "/etc/passwd"
    (copy / v1.done_file(0)).write_text(json.dumps(record))
    (copy / "manifest.json").unlink()
    code, printed = _cli("tokenize", "--input", str(inputs / "a.parquet"), str(inputs / "b.parquet"),
                         "--out", str(copy), "--partition-mb", "0.03", "--scheduler", cluster.scheduler_address)
    _refused(code, printed, "done.json", "not a path relative to OUT")


# -- impossible requests and everyday mistakes -------------------------------------------------------

def test_overwrite_removes_another_formats_export(run, tmp_path, cluster):
    dest = tmp_path / "dest"
    common = ["--to", str(dest), "--val-tokens", "1000", "--shard-tokens", "5000", "--scheduler", cluster.scheduler_address]
    code, printed = _cli("export", str(run), "--format", "llmc", *common)
    assert code == 0 and list(dest.glob("fineweb_*.bin")), printed
    code, printed = _cli("export", str(run), "--format", "npy", *common)
    _refused(code, printed, "already holds an export", "--overwrite")
    code, printed = _cli("export", str(run), "--format", "npy", *common, "--overwrite")
    assert code == 0, printed
    assert not list(dest.glob("fineweb_*.bin")), sorted(p.name for p in dest.iterdir())
    record = json.loads((dest / "fineweb_export.json").read_text())
    assert sorted(f["name"] for f in record["files"]) == sorted(p.name for p in dest.glob("fineweb_*.npy"))


@pytest.mark.parametrize("where", ["", "parts", "parts/deeper"])
def test_export_into_the_run_itself_is_refused(copy, cluster, where):
    to = copy / where if where else copy
    code, printed = _cli("export", str(copy), "--format", "npy", "--to", str(to), "--val-tokens", "1000",
                         "--scheduler", cluster.scheduler_address)
    _refused(code, printed, f"--to {to}", "the run", "choose a folder outside it")
    assert sorted(p.name for p in (copy / "parts").iterdir()) == sorted(p.name for p in (Path(str(copy)).parent / "copy" / "parts").iterdir())
    code, printed = _cli("verify", str(copy), "--scheduler", cluster.scheduler_address)
    assert code == 0, printed


def test_export_to_an_existing_file(run, tmp_path, cluster):
    target = tmp_path / "taken.txt"
    target.write_text("mine")
    code, printed = _cli("export", str(run), "--format", "llmc", "--to", str(target), "--val-tokens", "1000",
                         "--scheduler", cluster.scheduler_address)
    _refused(code, printed, str(target), "existing file, not a folder")
    assert target.read_text() == "mine"


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e-9", "0", "-3"])
def test_impossible_partition_sizes(inputs, tmp_path, value):
    code, printed = _cli("tokenize", "--input", str(inputs / "a.parquet"), "--out", str(tmp_path / "out"),
                         f"--partition-mb={value}", "--scheduler", "tcp://127.0.0.1:9")
    _refused(code, printed, "--partition-mb", "must be")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address", ["notaport", ":99999", "host:-1", "127.0.0.1:"])
def test_impossible_dashboard_addresses(run, address):
    code, printed = _cli("verify", str(run), f"--dashboard-address={address}")
    _refused(code, printed, f"--dashboard-address {address!r}", "port in 0..65535")


def test_the_dashboards_url_given_as_the_scheduler(run):
    code, printed = _cli("verify", str(run), "--scheduler", "http://127.0.0.1:8787")
    _refused(code, printed, "--scheduler 'http://127.0.0.1:8787'", "dashboard", "tcp://HOST:8786")


def test_a_run_that_failed_before_its_first_partition_is_not_told_to_resume(inputs, tmp_path):
    out = tmp_path / "out"
    code, printed = _cli("tokenize", "--input", str(inputs / "a.parquet"), "--out", str(out), "--text-column", "nosuch",
                         "--workers", "1", "--progress", "none")
    _refused(code, printed, "no text column 'nosuch'")
    assert not out.exists()  # what the run made went with it (tests/test_mistakes_more.py)
    (out / "parts").mkdir(parents=True)  # as a version before that, or a run still starting, left it
    for command in (["verify", str(out), "--scheduler", "tcp://127.0.0.1:9"], ["inspect", str(out)]):
        line = _refused(*_cli(*command), "stopped", "before its first partition")
        assert "resume" not in line.replace("nothing to check or resume", ""), line
