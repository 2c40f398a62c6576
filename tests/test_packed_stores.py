"""Packed exports (``export --seq-len N``) to an object store: the same bytes as the same export to
local disk, for ``hf`` (parquet shards in split folders and a card) and ``npy`` (row-shaped shards),
from a run on local disk and from the run on the store, through moto's S3 server (``s3server.py``). The writes go
through the same store layer on GCS and Azure, whose emulators test_gcs.py and test_azure.py
already run the unpacked exports on (``storeexport.py``); here they would add ~10 s each.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import storeexport
from conftest import download
from s3server import s3_proxied  # noqa: F401  (a fixture)
from storecases import store_case

from tokenshards.errors import UserError

SEQ = 64
CASES = {
    # hf: best-fit rows, shuffled, every optional column, small chunks (many parts per shard);
    # read from the run on the store.
    "hf": {"format": "hf", "seq_len": SEQ, "pack": "best-fit", "shuffle": True, "seed": 5,
           "val_tokens": storeexport.VAL, "columns": ("position_ids", "attention_mask", "labels"),
           "shard_tokens": 4_000, "chunk_bytes": 4096},
    # npy: concat rows in source order, read from local disk.
    "npy": {"format": "npy", "seq_len": SEQ, "val_tokens": storeexport.VAL, "shard_tokens": 4_000, "chunk_bytes": 4096},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cluster) -> Path:
    return storeexport.local_run(cluster, tmp_path_factory.mktemp("packed-stores"))


def test_packed_exports_to_s3_equal_local_ones(s3, cluster, run, tmp_path):
    store, scheme = s3, "s3"
    fs, bucket = store.fs(), store.make_bucket()
    storeexport.upload(store, scheme, run, f"{bucket}/run")
    for name, options in CASES.items():
        local = tmp_path / f"local-{name}"
        storeexport.export(cluster, str(run), str(local), **options)
        source = f"{scheme}://{bucket}/run" if name == "hf" else str(run)
        storeexport.export(cluster, source, f"{scheme}://{bucket}/{name}", store.storage_options, **options)
        got = tmp_path / f"store-{name}"
        keys = download(fs, f"{bucket}/{name}", got)
        names = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
        assert keys == names, (keys, names)  # nothing else: no parts left, no lease
        record = json.loads((local / "fineweb_export.json").read_text())
        assert json.loads((got / "fineweb_export.json").read_text())["files"] == record["files"]
        for key in names:
            if not key.endswith("_export.json"):
                assert (got / key).read_bytes() == (local / key).read_bytes(), key
        shards = [f["name"] for f in record["files"]]
        assert len(shards) > 2, shards  # several shards, each of many parts at these chunk sizes
        if name == "npy":
            rows = np.load(got / shards[0])
            assert rows.ndim == 2 and rows.shape[1] == SEQ
        else:
            table = pq.read_table(got / shards[0])
            assert {"input_ids", "seq_lengths", "position_ids", "attention_mask", "labels"} <= set(table.column_names)
            assert all(len(ids) == SEQ for ids in table.column("input_ids").to_pylist())


def test_a_packed_export_stopped_with_shards_committed_is_finished_by_the_same_command(request, cluster, run, tmp_path):
    """On a store each shard is committed by its worker as it ends, so the note that lists the
    export's files (``begin_commits``) is written before the first is submitted: an export stopped
    with some shards committed and no record is this export's own, unfinished, to its rerun (which
    replaces them without --overwrite), not "already holds an export". Stopped here by the store
    refusing one shard's upload (never retried: a refusal fails the same way every time)."""
    case = store_case(request, "s3")
    options = CASES["npy"]
    local = tmp_path / "local"
    storeexport.export(cluster, str(run), str(local), **options)
    shards = [f["name"] for f in json.loads((local / "fineweb_export.json").read_text())["files"]]
    last = sorted(s for s in shards if s.endswith(".npy") and "_train_" in s)[-1]
    case.proxy.fail(lambda r: r.method in ("PUT", "POST") and last in r.path, times=10**6, status=403,
                    headers={"Content-Type": "application/xml"},
                    body=b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>AccessDenied</Code>'
                         b"<Message>Access Denied</Message></Error>")
    with pytest.raises(UserError):
        storeexport.export(cluster, str(run), case.url("npy"), case.options(), **options)
    left = [k.rsplit("/", 1)[-1] for k in case.direct.find(case.key("npy"))]
    assert "fineweb_export.json" not in left and ".fineweb_export.json.unfinished" in left, left
    assert any(k in shards for k in left), left  # shards other workers committed before the refusal
    case.proxy.clear()
    storeexport.export(cluster, str(run), case.url("npy"), case.options(), **options)  # the same command
    got = tmp_path / "store"
    keys = download(case.direct, case.key("npy"), got)
    assert keys == sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    for key in keys:
        if not key.endswith("_export.json"):
            assert (got / key).read_bytes() == (local / key).read_bytes(), key
