"""Inputs as users really have them: bytes that are not UTF-8, dictionary-encoded text, one file
reached twice, and a file replaced while a run reads it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from readback import expected_tokens, read_documents

from conftest import not_utf8, write_parquet
import tokenshards.verify.command as verify_command
from tokenshards.encoding.backends import TiktokenBackend
from tokenshards.errors import UserError
from tokenshards.format import v1
from tokenshards.storage.location import Location
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.resume import JOB_FILE
from tokenshards.tokenize.command import run_tokenize
from tokenshards.verify.checks import Expected
from tokenshards.verify.command import VerifyConfig, run_verify

TEXTS = [f"document {i}: the cat sat on the mat, Straße 東京 🙂 " * (1 + i % 7) for i in range(60)]


@pytest.fixture
def bad_utf8(tmp_path):
    raw = [t.encode() for t in TEXTS]
    raw[13] = b"broken \xff\xfe bytes"
    raw[41] = b"\xc3"  # a truncated two-byte sequence
    raw[20] = None
    write_parquet(tmp_path / "in" / "bad.parquet", {"text": not_utf8(raw)}, row_group_size=10)
    write_parquet(tmp_path / "in" / "good.parquet", {"text": TEXTS}, row_group_size=10)
    return tmp_path / "in"


def test_invalid_utf8_is_one_line_naming_file_partition_and_row(tokenize, bad_utf8):
    with pytest.raises(UserError, match=r"bad\.parquet: (partition 1, row 13|partition 4, row 41): column 'text' is not valid UTF-8; "
                                        r"fix the file, or pass --on-bad-file skip to skip such rows$"):
        tokenize([bad_utf8], partition_bytes=2_000)


def test_invalid_utf8_rows_skipped_and_recorded_under_skip(tokenize, bad_utf8, gpt2, cluster):
    summary, out = tokenize([bad_utf8], partition_bytes=2_000, on_bad_file="skip")
    manifest = json.loads((out / "manifest.json").read_text())
    bad = [e for e in manifest["partitions"] if e.get("skipped_invalid")]
    assert [(e["invalid_rows"], e["skipped_invalid"]) for e in bad] == [([13], 1), ([41], 1)]
    for e in manifest["partitions"]:
        assert e["rows"] == e["docs"] + e["skipped_null"] + e["skipped_empty"] + e.get("skipped_invalid", 0)
    assert manifest["totals"]["skipped_invalid"] == 2 and manifest["totals"]["skipped_null"] == 1
    assert summary.docs == 2 * 60 - 3  # nothing else lost
    docs = read_documents(out)
    for (path, row), (_, tokens) in docs.items():
        assert tokens == expected_tokens(gpt2, TEXTS[row]), (path, row)
    assert not any(path.endswith("bad.parquet") and row in (13, 20, 41) for path, row in docs)
    assert run_verify(VerifyConfig(out=str(out), scheduler=cluster.scheduler_address), announce=lambda m: None).ok


def test_dictionary_encoded_text_is_text(tokenize, tmp_path, gpt2):
    texts = [TEXTS[i % 5] for i in range(40)]  # repetitive, as dictionary-encoded columns are
    write_parquet(tmp_path / "dict.parquet", {"text": pa.array(texts).dictionary_encode()}, row_group_size=8)
    assert pa.types.is_dictionary(pq.ParquetFile(tmp_path / "dict.parquet").schema_arrow.field("text").type)
    _, out = tokenize([tmp_path / "dict.parquet"])
    docs = read_documents(out)
    assert len(docs) == 40
    for (_, row), (_, tokens) in docs.items():
        assert tokens == expected_tokens(gpt2, texts[row])


def test_messages_never_suggest_the_flag_already_given(tokenize, tmp_path):
    write_parquet(tmp_path / "n.parquet", {"body": [1, 2], "content": ["a", "b"], "text": ["x", "y"]})
    with pytest.raises(UserError) as info:
        tokenize([tmp_path / "n.parquet"], text_column="body")
    assert "holds int64, not strings; string columns are content, text" in str(info.value)
    assert "--text-column" not in str(info.value)
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    summary, out = tokenize([tmp_path / "n.parquet", tmp_path / "junk.parquet"], on_bad_file="skip")
    reasons = [s["reason"] for s in json.loads((out / "manifest.json").read_text())["skipped_inputs"]]
    assert len(reasons) == 1 and "not a readable parquet file" in reasons[0]
    assert not any("--on-bad-file" in r for r in reasons)


def test_one_file_reached_twice_is_tokenized_once(cluster, tmp_path):
    write_parquet(tmp_path / "in" / "a.parquet", {"text": TEXTS[:10]})
    (tmp_path / "in" / "link.parquet").symlink_to(tmp_path / "in" / "a.parquet")
    os.link(tmp_path / "in" / "a.parquet", tmp_path / "in" / "hard.parquet")
    notes = []
    summary = run_tokenize(TokenizeConfig(inputs=(str(tmp_path / "in"), str(tmp_path / "in" / "a.parquet")),
                                          out=str(tmp_path / "out"), scheduler=cluster.scheduler_address,
                                          progress="none"), announce=notes.append)
    assert summary.docs == 10
    assert any("are one file (a symlink or hard link); tokenizing it once" in n and "link.parquet" in n
               and "hard.parquet" in n for n in notes)


def _same_layout_new_text(path: Path) -> None:
    """Replace ``path`` by a file with the same row groups and rows but other text (a re-export)."""
    table = pq.read_table(path)
    texts = [("REPLACED " + t) if t else t for t in table.column("text").to_pylist()]
    rg = pq.ParquetFile(path).metadata.row_group(0).num_rows
    tmp = path.with_suffix(".new")
    pq.write_table(pa.table({"text": texts}), tmp, row_group_size=rg)
    os.replace(tmp, path)


def test_input_replaced_mid_run_stops_naming_it(cluster, tmp_path, gpt2):
    write_parquet(tmp_path / "in" / "a.parquet", {"text": TEXTS}, row_group_size=5)
    write_parquet(tmp_path / "in" / "b.parquet", {"text": TEXTS}, row_group_size=5)

    def announce(msg: str) -> None:
        if "partitions" in msg and "input files" in msg:  # planned: the tasks start next
            _same_layout_new_text(tmp_path / "in" / "b.parquet")

    config = TokenizeConfig(inputs=(str(tmp_path / "in"),), out=str(tmp_path / "out"), partition_bytes=3_000,
                            scheduler=cluster.scheduler_address, progress="none", retries=0)
    with pytest.raises(UserError, match=r"in/b\.parquet changed since this run planned it \(.*mtime_ns.*\); stopped "
                                        r"before partition \d+ mixed old and new content; rerun once the input is final$"):
        run_tokenize(config, announce=announce)
    assert not (tmp_path / "out" / "manifest.json").exists()
    if list((tmp_path / "out" / "parts").glob("part-*.done.json")):
        # The same command again: the committed partitions were made from the old content. Mostly the
        # run committed them and kept its job file. Once (a CI run) it had stopped before its first
        # commit and removed its job file, and a task still running on this cluster (not the run's
        # own: it goes on) committed its partition while the run still held OUT's lease
        # (resume.claim_output's docstring): that partition is another job's.
        if (tmp_path / "out" / JOB_FILE).exists():
            refused = r"already holds a different run \(inputs \(0 added, 0 removed, 1 changed"
        else:
            refused = r"already holds output that is not this run's; use another --out, or pass --overwrite to replace it$"
        with pytest.raises(UserError, match=refused):
            run_tokenize(config, announce=lambda m: None)
        summary = run_tokenize(config.replace(overwrite=True), announce=lambda m: None)
    else:
        # Stopped before its first commit (the tasks that met the change ran first, as under load or
        # when small partitions share a task): nothing of the old content is kept, the job file is
        # gone, and the same command is a new run of the final input.
        assert not (tmp_path / "out" / JOB_FILE).exists()
        summary = run_tokenize(config, announce=lambda m: None)
    assert summary.docs == 2 * len(TEXTS)
    final = pq.read_table(tmp_path / "in" / "b.parquet").column("text").to_pylist()
    for (path, row), (_, tokens) in read_documents(tmp_path / "out").items():
        if path.endswith("b.parquet"):
            assert tokens == expected_tokens(gpt2, final[row]), (path, row)


def test_an_input_changed_after_its_run_is_named_by_the_same_command(cluster, tmp_path):
    """The branch of the test above that needs a commit before the change, made certain: a run's
    partitions were made from the content it recorded, so the same command refuses to mix."""
    write_parquet(tmp_path / "in" / "a.parquet", {"text": TEXTS}, row_group_size=5)
    write_parquet(tmp_path / "in" / "b.parquet", {"text": TEXTS}, row_group_size=5)
    config = TokenizeConfig(inputs=(str(tmp_path / "in"),), out=str(tmp_path / "out"), partition_bytes=3_000,
                            scheduler=cluster.scheduler_address, progress="none")
    run_tokenize(config, announce=lambda m: None)
    _same_layout_new_text(tmp_path / "in" / "b.parquet")
    with pytest.raises(UserError, match=r"already holds a different run \(inputs \(0 added, 0 removed, 1 changed"):
        run_tokenize(config, announce=lambda m: None)


def test_verify_deep_reports_a_changed_input_as_such(tokenize, tmp_path, cluster):
    write_parquet(tmp_path / "in" / "a.parquet", {"text": TEXTS}, row_group_size=5)
    _, out = tokenize([tmp_path / "in" / "a.parquet"], partition_bytes=3_000)
    _same_layout_new_text(tmp_path / "in" / "a.parquet")
    report = run_verify(VerifyConfig(out=str(out), deep=20, scheduler=cluster.scheduler_address),
                        announce=lambda m: None)
    assert report.problems and all("input changed since the run" in p for p in report.problems), report.problems
    assert not any("differs from tiktoken" in p for p in report.problems)


def test_verify_deep_reports_an_input_replaced_during_its_read(tokenize, tmp_path, monkeypatch, gpt2):
    """A worker keeps each input's footer for the version the run recorded; an input replaced
    between the check before the read and the read itself is reported as changed, never compared
    through the old footer."""
    src = tmp_path / "in" / "a.parquet"
    write_parquet(src, {"text": TEXTS}, row_group_size=5)
    _, out = tokenize([src], partition_bytes=3_000)
    manifest = v1.read_manifest(Location.at(str(out)))
    entry = manifest.by_index()[0]
    docs = pq.read_table(out / entry.docs_file)
    values = np.load(out / entry.tokens_file)
    recorded = {i["path"]: i["identity"] for i in manifest.inputs}

    class Encoder:
        def reference(self):
            return TiktokenBackend(gpt2)

    expected = Expected(dtype=manifest.encoding.dtype, n_vocab=manifest.encoding.n_vocab, eot=manifest.encoding.eot,
                        eot_position=manifest.eot_position, job=manifest.done_job(), text_column="text",
                        encoder=Encoder(), input_identities=recorded)
    sample = list(range(docs.num_rows))
    assert verify_command._compare_sample(entry, sample, docs, values, expected=expected,
                                      storage_options={}) == ([], len(sample))
    real = verify_command._read_rows

    def replaced_meanwhile(*args, **kwargs):
        _same_layout_new_text(src)
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_command, "_read_rows", replaced_meanwhile)
    problems, compared = verify_command._compare_sample(entry, sample, docs, values, expected=expected, storage_options={})
    assert compared == 0 and len(problems) == 1 and "input changed since the run" in problems[0], problems
