"""What killed exports' parted uploads leave in DEST (never a visible file, but billed) is cleared by
the next export there (``store.remove_stale_parts``, under DEST's lease): against moto's S3 and the
GCS emulator, the real servers of those APIs."""
from __future__ import annotations

from tokenshards.storage import store


def test_open_multipart_uploads_under_the_folder_are_aborted_and_others_kept(s3):
    bucket = s3.make_bucket()
    fs, root = store.filesystem(f"s3://{bucket}/dest", s3.storage_options)
    check = s3.fs()
    for key in ("dest/train_000001.bin", "dest/sub/val_000000.bin", "elsewhere/x.bin"):
        check.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    check.pipe_file(f"{bucket}/dest/kept.bin", b"whole")
    assert store.remove_stale_parts(fs, root) == 2
    left = [u["Key"] for u in check.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])]
    assert left == ["elsewhere/x.bin"]
    assert check.cat_file(f"{bucket}/dest/kept.bin") == b"whole"


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
