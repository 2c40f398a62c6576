"""Format v1's one owner, pure: a partition's bytes and entry, the .npy header parser, the
manifest parsed and written back key for key. No cluster, no files: milliseconds."""
import hashlib
import io
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenshards.format import v1


@dataclass(frozen=True)
class _Piece:
    index: int = 7
    input: str = "s3://bucket/data/000.parquet"
    row_groups: tuple = (3, 5)
    rows: int = 6


def _manifest_dict() -> dict:
    """A manifest as tokenshards writes one (every optional key present), plus an unknown key."""
    entry = {"index": 0, "input": "/d/a.parquet", "row_groups": [0, 2], "rows": 5, "docs": 3, "skipped_null": 1,
             "skipped_empty": 1, "tokens": 12, "tokens_file": "parts/part-00000.tokens.npy",
             "docs_file": "parts/part-00000.docs.parquet", "sha256": "ab" * 32, "backend": "splintr 0.22.0"}
    return {
        "format": "tokenshards/1",
        "encoding": {"name": "gpt2", "n_vocab": 50257, "eot": 50256, "dtype": "uint16"},
        "eot_position": "prefix",
        "text_column": "text",
        "id_column": None,
        "inputs": [{"path": "/d/a.parquet", "name": "a.parquet", "rows": 5, "bytes": 100},
                   {"path": "/d/b.parquet", "name": "b.parquet", "rows": 5, "bytes": 90}],
        "partitions": [entry, {**entry, "index": 1, "input": "/d/b.parquet", "tokens_file": "parts/part-00001.tokens.npy",
                               "docs_file": "parts/part-00001.docs.parquet", "backend": "tiktoken 0.12.0"}],
        "totals": {"rows": 10, "docs": 6, "tokens": 24, "skipped_null": 2, "skipped_empty": 2},
        "job": "cd" * 32,
        "encoding_sha256": "ef" * 32,
        "partition_bytes": 8388608,
        "skipped_inputs": [{"path": "/d/c.parquet", "reason": "bad footer"}],
        "planned_partitions": 2,
        "hub": {"repo": "HuggingFaceFW/fineweb", "revision": "abc"},
        "someone_elses_key": [1, 2],
        "backend": "splintr 0.22.0, tiktoken 0.12.0",
    }


def test_manifest_round_trip_keeps_every_key_in_order():
    raw = _manifest_dict()
    manifest = v1.Manifest.from_dict(json.loads(json.dumps(raw)))
    assert isinstance(manifest.partitions[0], v1.PartitionEntry)
    assert manifest.partitions[1].backend == "tiktoken 0.12.0" and manifest.encoding.dtype == "uint16"
    assert manifest.extra == {"hub": raw["hub"], "someone_elses_key": [1, 2]}
    back = manifest.to_dict()
    assert back == raw
    assert json.dumps(back, indent=1) == json.dumps(raw, indent=1)  # the bytes written, key order included


def test_minimal_manifest_of_design_keys_round_trips():
    """DESIGN's required keys alone are a readable manifest (another writer may omit the rest)."""
    raw = {k: v for k, v in _manifest_dict().items() if k in v1.FORMAT_KEYS + ("id_column",)}
    raw["partitions"] = [{k: v for k, v in e.items() if k != "backend"} for e in raw["partitions"]]
    manifest = v1.Manifest.from_dict(raw)
    assert manifest.job is None and manifest.backend is None and manifest.partitions[0].backend is None
    assert manifest.to_dict() == raw


def test_manifest_is_version_checked_and_names_what_is_missing():
    raw = _manifest_dict()
    with pytest.raises(v1.ManifestError, match=r"^format 'tokenshards/2', expected 'tokenshards/1'$"):
        v1.Manifest.from_dict({**raw, "format": "tokenshards/2"})
    with pytest.raises(v1.ManifestError, match=r"^required key 'totals' is missing$"):
        v1.Manifest.from_dict({k: v for k, v in raw.items() if k != "totals"})
    with pytest.raises(v1.ManifestError, match=r"^encoding .* lacks one of name, n_vocab, eot, dtype$"):
        v1.Manifest.from_dict({**raw, "encoding": {"name": "gpt2"}})
    broken = [dict(raw["partitions"][0]), {k: v for k, v in raw["partitions"][1].items() if k not in ("sha256", "docs")}]
    with pytest.raises(v1.ManifestError, match=r"^partitions\[1\] lacks docs, sha256$"):
        v1.Manifest.from_dict({**raw, "partitions": broken})
    with pytest.raises(v1.ManifestError, match=r"^not a JSON object"):
        v1.Manifest.from_dict([])


def test_totals_read_by_name_and_written_back_in_order():
    raw = _manifest_dict()
    chat = {**raw["totals"], "skipped_invalid": 0, "skipped_bad": 2, "bad_rows": {"not_a_list": 2}, "later_key": 1}
    totals = v1.Totals.from_dict(chat)
    assert (totals.docs, totals.skipped_invalid, totals.bad_rows, totals.extra) == (6, 0, {"not_a_list": 2}, {"later_key": 1})
    assert json.dumps(totals.to_dict()) == json.dumps(chat)
    assert v1.Manifest.from_dict(raw).totals == v1.Totals(rows=10, docs=6, tokens=24, skipped_null=2, skipped_empty=2)
    with pytest.raises(v1.ManifestError, match=r"^totals lacks docs, skipped_empty$"):
        v1.Manifest.from_dict({**raw, "totals": {"rows": 10, "tokens": 24, "skipped_null": 2}})
    with pytest.raises(v1.ManifestError, match=r"^totals.bad_rows is 'x', expected counts by reason$"):
        v1.Manifest.from_dict({**raw, "totals": {**raw["totals"], "bad_rows": "x"}})
    with pytest.raises(v1.ManifestError, match=r"^totals.skipped_bad is -1, expected a count"):
        v1.Manifest.from_dict({**raw, "totals": {**raw["totals"], "skipped_bad": -1}})


def test_entry_dict_has_todays_key_order():
    entry = v1.PartitionEntry(index=2, input="x.parquet", row_groups=(0, 1), rows=3, docs=2, skipped_null=1,
                              skipped_empty=0, tokens=9, tokens_file=v1.tokens_file(2), docs_file=v1.docs_file(2),
                              sha256="00" * 32)
    assert list(entry.to_dict()) == list(v1.ENTRY_KEYS)
    assert entry.to_dict()["row_groups"] == [0, 1]
    assert v1.PartitionEntry.from_dict(entry.to_dict()) == entry
    with pytest.raises(v1.ManifestError, match=r"lacks index"):
        v1.PartitionEntry.from_dict({k: v for k, v in entry.to_dict().items() if k != "index"})


def test_partition_files_are_the_bytes_numpy_and_arrow_write():
    tokens = np.array([50256, 1, 2, 50256, 3, 50256, 4, 5, 6], dtype=np.uint16)
    ids, rows = ["a", "b", "x.parquet:9"], np.array([0, 2, 5], dtype=np.int64)
    starts, lengths = np.array([0, 3, 5]), np.array([3, 2, 4])
    files = v1.partition_files(_Piece(), tokens, ids=ids, rows=rows, starts=starts, lengths=lengths,
                               skipped_null=2, skipped_empty=1, backend="riptoken 1.0")
    tokens_bytes, docs_bytes, entry = files
    buf = io.BytesIO()
    np.save(buf, tokens.astype("<u2"), allow_pickle=False)
    assert tokens_bytes == buf.getvalue()
    docs = pq.read_table(io.BytesIO(docs_bytes))
    assert docs.schema == pa.schema([("id", pa.string()), ("row", pa.int64()), ("start", pa.int64()),
                                     ("length", pa.int64())])
    assert docs.to_pydict() == {"id": ids, "row": [0, 2, 5], "start": [0, 3, 5], "length": [3, 2, 4]}
    assert entry == v1.PartitionEntry(
        index=7, input="s3://bucket/data/000.parquet", row_groups=(3, 5), rows=6, docs=3, skipped_null=2,
        skipped_empty=1, tokens=9, tokens_file="parts/part-00007.tokens.npy", docs_file="parts/part-00007.docs.parquet",
        sha256=hashlib.sha256(tokens_bytes).hexdigest(), backend="riptoken 1.0",
        tokens_bytes=len(tokens_bytes), docs_bytes=len(docs_bytes), docs_sha256=hashlib.sha256(docs_bytes).hexdigest())
    # No backend named: no backend key (as before backends existed).
    assert "backend" not in v1.partition_files(_Piece(), tokens, ids=ids, rows=rows, starts=starts, lengths=lengths,
                                               skipped_null=2, skipped_empty=1).entry.to_dict()


@pytest.mark.parametrize("dtype", ["<u2", "<u4", ">u2"])
def test_npy_header_parser_reads_what_numpy_writes(dtype):
    values = np.arange(1000, dtype=dtype)
    buf = io.BytesIO()
    np.save(buf, values, allow_pickle=False)
    raw = buf.getvalue()
    header = v1.read_npy_header(raw)
    assert header.dtype == np.dtype(dtype) and header.shape == (1000,) and not header.fortran_order
    assert raw[header.offset:] == values.tobytes()
    assert v1.read_npy_header(raw[:v1.NPY_HEAD_PROBE]) == header  # the probe a range reader fetches suffices


def test_npy_header_parser_refuses_what_is_not_npy():
    with pytest.raises(v1.NpyHeaderError, match=r"the magic string is not correct"):
        v1.read_npy_header(b"PAR1 not numpy at all")
    with pytest.raises(v1.NpyHeaderError):
        v1.read_npy_header(b"\x93NUMPY\x01\x00")  # cut inside the header
    assert issubclass(v1.NpyHeaderError, ValueError)


def test_done_record_reads_back_as_the_entry_it_commits(tmp_path):
    """A done record is written from the entry, and resume reads committed entries back typed, equal."""
    from tokenshards.errors import OutputConflict
    from tokenshards.storage.location import Location
    from tokenshards.tokenize import resume

    tokens = np.array([50256, 1, 2], dtype=np.uint16)
    files = v1.partition_files(_Piece(), tokens, ids=["a"], rows=[0], starts=[0], lengths=[3], skipped_null=5,
                               skipped_empty=0, backend="tiktoken 0.12.0")
    entry = files.entry
    (tmp_path / "parts").mkdir()
    (tmp_path / entry.tokens_file).write_bytes(files.tokens)  # resume trusts a partition whose files are there
    (tmp_path / entry.docs_file).write_bytes(files.docs)
    done = tmp_path / v1.done_file(entry.index)
    done.write_bytes(v1.DoneRecord(entry=entry, job="job-1").to_bytes())
    assert list(json.loads(done.read_text())) == list(v1.ENTRY_KEYS) + ["backend", "tokens_bytes", "docs_bytes", "docs_sha256", "job"]
    out = Location.at(str(tmp_path))
    assert resume.committed_entries(out, job="job-1", pieces=[_Piece()]) == {7: entry}
    with pytest.raises(OutputConflict, match=r"does not match this run's partition plan"):
        resume.committed_entries(out, job="job-1", pieces=[_Piece(row_groups=(3, 4))])
    with pytest.raises(OutputConflict, match=r"written by a different run"):
        resume.committed_entries(out, job="job-2", pieces=[_Piece()])


def test_job_hash_leaves_out_file_identities_and_old_job_files_still_resume(tmp_path):
    """Inputs' mtimes/ETags guard reruns (claim_output) but are not part of the job hash, so done
    records keep the hash runs made before had; an OUT claimed by such a run still resumes."""
    from tokenshards.storage.location import Location
    from tokenshards.tokenize import resume

    def identity(with_file_identity: bool) -> dict:
        inputs = [{"path": "a.parquet", "rows": 3, "bytes": 10,
                   **({"identity": {"size": 10, "mtime_ns": 1}} if with_file_identity else {})}]
        return resume.job_identity(encoding={"name": "gpt2"}, encoding_fingerprint="f", eot_position="prefix",
                                   text_column="text", id_column=None, partition_bytes=100, inputs=inputs)

    assert resume.identity_hash(identity(True)) == resume.identity_hash(identity(False))
    out = Location.at(str(tmp_path))
    resume.claim_output(out, identity(False))  # an OUT claimed before identities
    resume.claim_output(out, identity(True))  # resumes
