"""The export record's one class, pure: each kind of export's record read and written back key
for key (users' scripts read these files), and the parser refusing what no export writes.
No cluster, no files: milliseconds. Real exports' records are compared byte for byte in
tests/test_export.py, test_shuffle.py, test_packing.py and test_publish.py."""
import json
import re

import pytest

from tokenshards.format.export_record import (ORDERED, ROWS, SHUFFLED, ExportRecord, ExportRecordError, RECORD_FORMAT,
                                              record_problems)

ENCODING = {"name": "gpt2", "n_vocab": 50257, "eot": 50256, "dtype": "uint16"}
SETTINGS = {"encoding": ENCODING, "eot_position": "prefix", "dtype": "<u2", "shard_tokens": 100000,
            "min_shard_tokens": 1000, "val_tokens_requested": 20000}
FILES = [{"name": "fineweb_val_000000.bin", "split": "val", "tokens": 20100, "bytes": 41224},
         {"name": "fineweb_train_000001.bin", "split": "train", "tokens": 99000, "bytes": 199024}]
SPLITS = {"val": {"docs": 20, "tokens": 20100}, "train": {"docs": 600, "tokens": 99000}}


def _ordered() -> dict:
    return {"format": RECORD_FORMAT, "export_format": "llmc", "source": "runs/a", "source_job": None, **SETTINGS,
            "val_selection": "whole documents ...", "splits": SPLITS, "files": FILES}


def _shuffled() -> dict:
    return {"format": RECORD_FORMAT, "export_format": "npy", "source": None, **SETTINGS, "val_selection": "per run ...",
            "order": {"shuffle": True, "seed": 7, "key": "murmur3 ..."}, "tokens_requested": None,
            "train_tokens_target": 99000,
            "sources": [{"path": "runs/a", "source_job": "ab" * 32, "weight": 0.5, "tokens": 49500, "documents": 300,
                         "epochs": 0.912345, "full_epochs": 0, "val_tokens": 10050, "val_documents": 10},
                        {"path": "runs/b", "source_job": None, "weight": 0.5, "tokens": 49500, "documents": 300,
                         "epochs": 1.5, "full_epochs": 1, "val_tokens": 10050, "val_documents": 10}],
            "splits": SPLITS, "files": FILES}


def _rows() -> dict:
    return {"format": RECORD_FORMAT, "export_format": "hf", "source": "runs/a", "source_job": "ab" * 32,
            **SETTINGS, "shard_tokens": None, "min_shard_tokens": None, "val_selection": "per run ...",
            "packing": {"seq_len": 512, "mode": "best-fit", "bos_align": False, "window_docs": None, "unit": "each ..."},
            "columns": ["input_ids", "seq_lengths", "position_ids"], "order": None,
            "sources": [{"path": "runs/a", "source_job": "ab" * 32, "sequences": 190, "epochs": 1, "extra": 0}],
            "splits": {"val": {"docs": 20, "tokens": 20100, "rows": 40, "source_tokens": 20100, "padding": 380,
                               "dropped": 0},
                       "train": {"docs": 600, "tokens": 99000, "rows": 194, "source_tokens": 99000, "padding": 328,
                                 "dropped": 0}},
            "files": [{"name": "validation/fineweb-00000.parquet", "split": "val", "tokens": 20100, "bytes": 50000},
                      {"name": "train/fineweb-00000.parquet", "split": "train", "tokens": 99000, "bytes": 240000}]}


@pytest.mark.parametrize("make, kind", [(_ordered, ORDERED), (_shuffled, SHUFFLED), (_rows, ROWS)])
def test_each_kind_of_record_reads_back_key_for_key(make, kind):
    d = make()
    record = ExportRecord.from_dict(d)
    assert record.kind == kind
    assert json.dumps(record.to_dict(), indent=1) == json.dumps(d, indent=1)  # keys in order, nulls kept


def test_an_unpacked_rows_record_keeps_its_null_packing_and_order():
    d = {**_rows(), "packing": None, "columns": ["input_ids"]}
    record = ExportRecord.from_dict(d)
    assert record.kind == ROWS and record.packing is None and record.order is None
    assert json.dumps(record.to_dict()) == json.dumps(d)


def test_keys_this_version_does_not_know_are_kept_after_its_own():
    d = {**_ordered(), "someone_elses_key": [1, 2]}
    assert list(ExportRecord.from_dict(d).to_dict()) == list(d)


def test_records_written_before_min_shard_tokens_still_read():
    d = _ordered()
    del d["min_shard_tokens"]
    assert ExportRecord.from_dict(d).min_shard_tokens is None


def test_typed_fields_read_by_name():
    record = ExportRecord.from_dict(_shuffled())
    assert record.order.seed == 7 and record.sources[1].epochs == 1.5 and record.sources[0].source_job == "ab" * 32
    assert record.splits["train"].tokens == 99000 and [f.name for f in record.files_of("val")] == ["fineweb_val_000000.bin"]
    assert record.encoding.n_vocab == 50257


@pytest.mark.parametrize("change, needle", [
    ({"format": "tokenshards-export/2"}, "format 'tokenshards-export/2', expected 'tokenshards-export/1'"),
    ({"export_format": 3}, "export_format is 3, expected a string"),
    ({"encoding": {**ENCODING, "n_vocab": -1}}, "encoding.n_vocab is -1"),
    ({"eot_position": "middle"}, "eot_position is 'middle'"),
    ({"dtype": "<f4"}, "dtype is '<f4', expected an integer dtype"),
    ({"dtype": "no such dtype"}, "dtype is 'no such dtype'"),
    ({"val_tokens_requested": True}, "val_tokens_requested is True, expected a count"),
    ({"shard_tokens": -5}, "shard_tokens is -5, expected a count"),
    ({"splits": {"val": {"docs": 1, "tokens": 2}}}, "splits is {'val': {'docs': 1, 'tokens': 2}}, expected an object with val and train"),
    ({"splits": {**SPLITS, "train": {"docs": "600", "tokens": 1}}}, "splits.train.docs is '600', expected a count"),
    ({"files": {"name": "x"}}, "files is {'name': 'x'}, expected a list"),
    ({"files": [{**FILES[0], "name": "/etc/passwd"}]}, "files[0].name '/etc/passwd' is not a path relative to OUT"),
    ({"files": [{**FILES[0], "name": "../elsewhere/x.bin"}]}, "files[0].name '../elsewhere/x.bin' is not a plain path"),
    ({"files": [{**FILES[0], "bytes": 1.5}]}, "files[0].bytes is 1.5, expected a count"),
    ({"files": [{**FILES[0], "split": "test"}]}, "files[0].split is 'test', expected one of ('val', 'train')"),
    ({"order": {"shuffle": True, "seed": "7", "key": "k"}}, "order is {'shuffle': True, 'seed': '7', 'key': 'k'}"),
    ({"sources": [{"path": "a", "source_job": None, "weight": float("nan")}]}, "sources[0].weight is nan, expected a number"),
    ({"sources": [{"path": "a", "source_job": 5}]}, "sources[0].source_job is 5, expected a string"),
    ({"packing": {"seq_len": 0.5, "mode": "concat", "bos_align": False, "unit": "u"}}, "packing is {"),
    ({"columns": "input_ids"}, "columns is 'input_ids', expected a list of names"),
])
def test_what_no_export_writes_is_refused_by_name(change, needle):
    d = {**_ordered(), **change}
    with pytest.raises(ExportRecordError, match="^" + re.escape(needle)):
        ExportRecord.from_dict(d)


@pytest.mark.parametrize("raw, needle", [(b"[1, 2]", "not a JSON object but list"), (b"{", "not JSON"),
                                          (b"\xff\xfe", "not JSON")])
def test_bytes_that_are_not_a_record(raw, needle):
    with pytest.raises(ExportRecordError, match=needle):
        ExportRecord.from_bytes(raw)


def test_a_missing_key_is_named():
    d = _ordered()
    del d["files"]
    assert record_problems(d) == ["required key 'files' is missing"]
