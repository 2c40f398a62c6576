"""The GCS part objects killed exports leave in DEST (hidden, but billed) are cleared by the next
export there, whatever their names (``store.remove_stale_parts``, under DEST's lease); S3's
multipart uploads of other names are not: against the GCS emulator and moto's S3."""
from __future__ import annotations

from tokenshards.storage import store


def test_s3_multipart_uploads_are_left_to_the_export_of_their_names(s3):
    """Another tool's upload may share DEST's prefix: an export aborts only its own names' uploads
    (``export.common._clear_unfinished``; test_export's test_from_s3_to_s3_matches_local)."""
    bucket = s3.make_bucket()
    fs, root = store.filesystem(f"s3://{bucket}/dest", s3.storage_options)
    check = s3.fs()
    check.call_s3("create_multipart_upload", Bucket=bucket, Key="dest/other.bin")
    assert store.remove_stale_parts(fs, root) == 0
    assert [u["Key"] for u in check.call_s3("list_multipart_uploads", Bucket=bucket)["Uploads"]] == ["dest/other.bin"]


def test_gcs_part_objects_under_the_folder_are_removed_and_nothing_else(gcs):
    bucket = gcs.make_bucket()
    fs, root = store.filesystem(f"gs://{bucket}/dest", gcs.storage_options)
    check = gcs.fs()
    parts = [f"dest/{store.PARTS_FOLDER}/train_000001.bin/00001", f"dest/{store.PARTS_FOLDER}/train_000001.bin/c0-00000",
             f"dest/val/{store.PARTS_FOLDER}/val_000000.bin/00002"]
    kept = ["dest/train_000001.bin", "dest/fineweb_export.json", f"elsewhere/{store.PARTS_FOLDER}/x.bin/00001",
            "dest/not.tokenshards-parts/00001"]
    for key in parts + kept:
        check.pipe_file(f"{bucket}/{key}", b"x")
    assert store.remove_stale_parts(fs, root) == len(parts)
    check.invalidate_cache()
    assert sorted(k.split("/", 1)[1] for k in check.find(bucket)) == sorted(kept)
    assert store.remove_stale_parts(fs, f"{bucket}/nothing-here") == 0
