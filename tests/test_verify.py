"""`tokenshards verify` on a real run (real LocalCluster, real tiktoken), then on copies of it
damaged one way at a time: each damage must be named, with its partition and file."""
import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from pydoc_data.topics import topics

from conftest import write_parquet
from tokenshards.format import v1
from tokenshards.cli import main
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.errors import UserError
from tokenshards.tokenize.command import run_tokenize
from tokenshards.verify.checks import _ranges, check_layout, choose_sample, compare_document
from tokenshards.verify.command import VerifyConfig, run_verify

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TEXTS = [topics[name] for name in sorted(topics)[:48]]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    """Real text (pydoc's help topics) in two files, one without an id column, with a null, an
    empty row and a text that spells the eot token."""
    root = tmp_path_factory.mktemp("verify-in")
    a = TEXTS[:24] + [None, "", "ordinary <|endoftext|> text"]
    write_parquet(root / "a.parquet", {"text": a, "id": [f"a{i}" for i in range(len(a))]}, row_group_size=4)
    write_parquet(root / "b.parquet", {"text": TEXTS[24:]}, row_group_size=4)
    return [root / "a.parquet", root / "b.parquet"]


@pytest.fixture(scope="module")
def run(cluster, inputs, tmp_path_factory):
    """One tokenize run shared by the module; tests damage copies of it."""
    out = tmp_path_factory.mktemp("verify-run") / "out"
    config = TokenizeConfig(inputs=tuple(map(str, inputs)), out=str(out), scheduler=cluster.scheduler_address,
                            partition_bytes=30_000, progress="none")
    run_tokenize(config, announce=lambda msg: None)
    assert len(_manifest(out)["partitions"]) >= 4
    return out


@pytest.fixture
def copy(run, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(run, out)
    return out


@pytest.fixture
def verify(cluster):
    def check(out, **options):
        config = VerifyConfig(out=str(out), scheduler=cluster.scheduler_address, **options)
        return run_verify(config, announce=lambda msg: None)

    return check


def _manifest(out: Path) -> dict:
    return json.loads((out / "manifest.json").read_text())


def _write_manifest(out: Path, manifest: dict) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest))


def _rewrite_tokens(out: Path, index: int, change) -> None:
    """Change partition ``index``'s token values and re-record its sha256 in the manifest and the
    done record, so the damage is invisible to every bookkeeping check."""
    path = out / v1.tokens_file(index)
    tokens = np.load(path)
    change(tokens)
    np.save(path, tokens)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = _manifest(out)
    manifest["partitions"][index]["sha256"] = sha
    _write_manifest(out, manifest)
    done = json.loads((out / v1.done_file(index)).read_text())
    (out / v1.done_file(index)).write_text(json.dumps({**done, "sha256": sha}))


def _docs(out: Path, index: int) -> dict:
    return pq.read_table(out / v1.docs_file(index)).to_pydict()


def test_a_real_run_passes_and_every_document_matches_tiktoken(run, verify):
    totals = _manifest(run)["totals"]
    report = verify(run, deep=10_000)
    assert report.problems == [] and report.warnings == []
    assert report.compared == totals["docs"] == 24 + 1 + 24
    assert report.summary() == (f"{report.partitions} partitions, {totals['docs']} documents, "
                                f"{totals['tokens']:,} tokens, {totals['docs']} documents re-tokenized: OK")


def test_suffix_run_passes(tokenize, inputs, verify):
    _, out = tokenize(inputs[:1], eot_position="suffix")
    report = verify(out, deep=5, seed=3)
    assert report.ok, report.problems
    assert report.compared == 5


def test_flipped_byte_in_tokens_file(copy, verify):
    path = copy / v1.tokens_file(1)
    raw = bytearray(path.read_bytes())
    raw[-7] ^= 0x10
    path.write_bytes(raw)
    report = verify(copy)
    assert not report.ok
    assert any(p.startswith("partition 1: parts/part-00001.tokens.npy: sha256 ") for p in report.problems), report.problems
    assert report.summary().endswith(f": {len(report.problems)} problem" + ("s" if len(report.problems) > 1 else ""))


def test_deleted_done_record(copy, verify):
    (copy / v1.done_file(2)).unlink()
    assert verify(copy).problems == [
        "partition 2: parts/part-00002.done.json is missing: the partition was never committed"]


def test_edited_manifest_count(copy, verify):
    manifest = _manifest(copy)
    manifest["partitions"][0]["docs"] += 1
    _write_manifest(copy, manifest)
    problems = verify(copy).problems
    docs = manifest["partitions"][0]["docs"]
    assert f"partition 0: parts/part-00000.docs.parquet: {docs - 1} documents, manifest says docs={docs}" in problems
    assert any(p.startswith("partition 0: rows ") and f"!= docs {docs} " in p for p in problems)
    assert any(p.startswith("manifest.json: totals.docs is ") for p in problems)
    assert any(p.startswith("partition 0: parts/part-00000.done.json: disagrees with manifest.json (docs: ") for p in problems)


def test_truncated_docs_file(copy, verify):
    path = copy / v1.docs_file(3)
    path.write_bytes(path.read_bytes()[:200])
    problems = verify(copy).problems
    assert len(problems) == 1 and problems[0].startswith("partition 3: parts/part-00003.docs.parquet unreadable (")


def test_changed_token_with_fixed_sha256_only_deep_catches(copy, verify):
    docs = _docs(copy, 0)
    at = docs["start"][1] + 1  # the first token after document 1's eot (prefix)

    def change(tokens):
        tokens[at] = (int(tokens[at]) + 1) % 50_000

    _rewrite_tokens(copy, 0, change)
    assert verify(copy).ok
    report = verify(copy, deep=10_000)
    assert len(report.problems) == 1
    assert report.problems[0].startswith(f"partition 0: document 1 (id 'a1', row {docs['row'][1]} of ")
    assert "differs from tiktoken encode_ordinary" in report.problems[0]
    assert "first difference at token 1 " in report.problems[0]


def test_moved_eot_is_caught_without_deep(copy, verify):
    start = _docs(copy, 1)["start"][2]
    _rewrite_tokens(copy, 1, lambda tokens: tokens.__setitem__(start, 13))
    problems = verify(copy).problems
    assert problems == [f"partition 1: parts/part-00001.tokens.npy: document 2 has 13 at token {start} "
                        "where its eot (50256, prefix) belongs (1 document(s) like this)"]


def test_big_endian_tokens_file(copy, verify):
    path = copy / v1.tokens_file(0)
    np.save(path, np.load(path).astype(">u2"))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    manifest = _manifest(copy)
    manifest["partitions"][0]["sha256"] = sha
    _write_manifest(copy, manifest)
    problems = verify(copy).problems
    assert "partition 0: parts/part-00000.tokens.npy: dtype >u2, expected <u2 (little-endian uint16)" in problems


def test_missing_and_duplicated_partitions(copy, verify):
    manifest = _manifest(copy)
    entries = manifest["partitions"]
    manifest["partitions"] = [entries[0], entries[0]] + entries[2:]
    _write_manifest(copy, manifest)
    problems = verify(copy).problems
    assert "partition 0: listed more than once in manifest.json" in problems
    assert any(p.startswith("manifest.json: partition indices 1 are missing") for p in problems)
    assert "parts/part-00001.tokens.npy: in parts/ but not listed in manifest.json (left by another run?)" in problems


def test_leftover_temporary_file_is_only_a_warning(copy, verify):
    (copy / "parts" / "part-00000.tokens.npy.0123abcd.tmp").write_bytes(b"partial")
    report = verify(copy)
    assert report.ok
    assert report.warnings == ["parts/part-00000.tokens.npy.0123abcd.tmp: temporary file left by an interrupted write; "
                               "safe to delete"]


def test_other_vocabulary_is_caught_by_deep(copy, verify):
    manifest = _manifest(copy)
    manifest["encoding_sha256"] = "0" * 64
    _write_manifest(copy, manifest)
    assert verify(copy).problems[0].startswith("tokenshards-job.json: disagrees with manifest.json (encoding_sha256: ")
    job = json.loads((copy / v1.JOB_FILE).read_text())
    (copy / v1.JOB_FILE).write_text(json.dumps({**job, "encoding_sha256": "0" * 64}))  # as a run of another vocabulary
    assert verify(copy).ok
    problems = verify(copy, deep=1).problems
    assert len(problems) == 1 and problems[0].startswith("manifest.json: encoding_sha256 000000000000… is not the "
                                                         "fingerprint of 'gpt2'")


def test_wrong_format_stops_before_partitions(copy, verify):
    manifest = _manifest(copy)
    manifest["format"] = "tokenshards/2"
    _write_manifest(copy, manifest)
    report = verify(copy)
    assert report.problems == ["manifest.json: format is 'tokenshards/2', expected 'tokenshards/1'"]
    del manifest["totals"]
    manifest["format"] = "tokenshards/1"
    _write_manifest(copy, manifest)
    assert verify(copy).problems == ["manifest.json: required key 'totals' is missing"]
    (copy / "manifest.json").write_text("{")
    report = verify(copy)
    assert len(report.problems) == 1 and report.problems[0].startswith("manifest.json: not valid JSON (")
    assert report.summary() == f"{copy}: manifest.json unusable, nothing else checked: 1 problem"


def test_missing_manifest_is_a_user_error(copy, verify):
    (copy / "manifest.json").unlink()
    with pytest.raises(UserError, match=r"copy has no manifest\.json: the run did not finish; rerun the same tokenize"):
        verify(copy)


def test_a_run_copied_to_s3(s3, run, verify):
    """DESIGN: a finished folder can be copied to S3 as is; every task then reads through s3fs."""
    fs = s3.fs()
    dst = s3.make_bucket()
    for path in sorted(p for p in run.rglob("*") if p.is_file()):
        fs.put_file(str(path), f"{dst}/run/{path.relative_to(run).as_posix()}")
    out = f"s3://{dst}/run"
    report = verify(out, deep=3, storage_options=s3.storage_options)
    assert report.ok and report.compared == 3, report.problems
    assert s3.secret not in repr(VerifyConfig(out=out, storage_options=s3.storage_options))

    fs.rm(f"{dst}/run/{v1.done_file(1)}")
    fs.pipe(f"{dst}/run/parts/part-00002.docs.parquet.5e1f.tmp", b"partial")
    report = verify(out, storage_options=s3.storage_options)
    assert report.problems == ["partition 1: parts/part-00001.done.json is missing: the partition was never committed"]
    assert report.warnings == ["parts/part-00002.docs.parquet.5e1f.tmp: temporary file left by an interrupted write; "
                               "safe to delete"]


# -- pure parts ---------------------------------------------------------------------------------

def test_choose_sample_is_seeded_and_within_each_partition():
    counts = [(0, 5), (1, 0), (2, 3), (3, 10)]
    a = choose_sample(counts, n=6, seed=7)
    assert a == choose_sample(counts, n=6, seed=7) != choose_sample(counts, n=6, seed=8)
    assert sum(map(len, a.values())) == 6 and 1 not in a
    assert all(0 <= i < dict(counts)[k] for k, picks in a.items() for i in picks)
    assert choose_sample(counts, n=100, seed=0) == {0: list(range(5)), 2: list(range(3)), 3: list(range(10))}


def test_layout_checks():
    starts, lengths = np.array([0, 3, 5]), np.array([3, 2, 4])
    assert check_layout(starts, lengths, n_tokens=9, where="w") == []
    assert check_layout(starts, lengths, n_tokens=10, where="w") == ["w: documents cover 9 tokens, the array holds 10"]
    assert check_layout(np.array([1, 4, 7]), lengths, n_tokens=9, where="w") == [
        "w: first document starts at 1, expected 0",
        "w: document 2 starts at 7, expected 6 (1 gap(s) or overlap(s))"]


def test_compare_document_and_ranges():
    assert compare_document([1, 2, 3], [1, 2, 3]) is None
    assert compare_document([1, 2], [1, 2, 3]) == ("2 tokens stored, tiktoken gives 3; first difference at token 2 "
                                                  "(stored end, expected 3)")
    assert _ranges([1, 2, 3, 7, 9, 10]) == "1..3, 7, 9..10"


# -- the command ------------------------------------------------------------------------------

def test_cli_clean_run(run, cluster, capsys):
    """In-process (a subprocess costs seconds of imports); the damaged run below goes through the real binary."""
    assert main(["verify", str(run), "--deep", "3", "--seed", "1", "--scheduler", cluster.scheduler_address]) == 0
    totals = _manifest(run)["totals"]
    assert capsys.readouterr().out.splitlines() == [
        f"{len(_manifest(run)['partitions'])} partitions, {totals['docs']} documents, "
        f"{totals['tokens']:,} tokens, 3 documents re-tokenized: OK"]


def test_cli_cluster_config(run, cluster, tmp_path, capsys):
    config = tmp_path / "here.yaml"
    config.write_text(f"kind: scheduler\naddress: {cluster.scheduler_address}\n")
    assert main(["verify", str(run), "--cluster", str(config)]) == 0
    assert capsys.readouterr().out.endswith(" tokens: OK\n")


def test_cli_damaged_run_exits_1_with_a_line_per_problem(copy, cluster):
    (copy / v1.done_file(0)).unlink()
    (copy / "parts" / "stray.npy").write_bytes(b"x")
    proc = subprocess.run([TOKENSHARDS, "verify", str(copy), "--scheduler", cluster.scheduler_address],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout.splitlines() == [
        "problem: parts/stray.npy: in parts/ but not listed in manifest.json (left by another run?)",
        "problem: partition 0: parts/part-00000.done.json is missing: the partition was never committed",
        proc.stdout.splitlines()[-1],
    ]
    assert proc.stdout.splitlines()[-1].endswith(" tokens: 2 problems")


def test_cli_missing_manifest_is_one_line(tmp_path, capsys):
    (tmp_path / "half" / "parts").mkdir(parents=True)  # an unfinished run: parts/, no manifest yet
    (tmp_path / "half" / v1.done_file(0)).write_text("{}")
    assert main(["verify", str(tmp_path / "half")]) == 2
    assert capsys.readouterr().err == (f"tokenshards: error: {tmp_path / 'half'} has no manifest.json: the run did "
                                       "not finish; rerun the same tokenize command to resume\n")
    # A path with no run at all (a typo) is not told to resume (issue 17).
    assert main(["verify", str(tmp_path / "nothing")]) == 2
    assert capsys.readouterr().err == (f"tokenshards: error: {tmp_path / 'nothing'}: no manifest.json; not a finished "
                                       "tokenshards run (there is no such folder: check the path, or pass the --out "
                                       "folder of a `tokenshards tokenize` run)\n")


def _drop_partition(out: Path, index: int) -> dict:
    """Remove partition ``index`` from the manifest and OUT as a careful tamperer would: its files,
    its share of the totals and of planned_partitions, so every bookkeeping check still adds up."""
    manifest = _manifest(out)
    entry = next(e for e in manifest["partitions"] if e["index"] == index)
    manifest["partitions"].remove(entry)
    for key in manifest["totals"]:
        manifest["totals"][key] -= entry[key]
    manifest["planned_partitions"] -= 1
    _write_manifest(out, manifest)
    for name in (entry["tokens_file"], entry["docs_file"], v1.done_file(index)):
        (out / name).unlink()
    return entry


def test_last_partition_removed_from_manifest_and_out(copy, verify):
    last = max(e["index"] for e in _manifest(copy)["partitions"])
    entry = _drop_partition(copy, last)
    problems = verify(copy).problems
    assert any(p.startswith(f"input {entry['input']}: its partitions cover ") and "(a partition is missing" in p
               for p in problems), problems


def test_middle_partition_removed_leaves_a_row_group_gap(copy, verify):
    manifest = _manifest(copy)
    first_of_b = min(e["index"] for e in manifest["partitions"] if e["input"].endswith("b.parquet"))
    entry = _drop_partition(copy, first_of_b)
    problems = verify(copy).problems
    assert any(p.startswith(f"input {entry['input']}: partition ") and "expected 0 (row groups missing)" in p
               for p in problems), problems
