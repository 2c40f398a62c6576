"""``--format datatrove`` read by datatrove's own ``DatatroveFolderDataset`` / ``DatatroveFileDataset``
(what nanotron's Nanoset reads), never by our code: the same streams and documents as our ``npy``
export with the same options."""
from __future__ import annotations

import numpy as np
import pytest
from formatcheck import CASES, eot_of, expected_docs, export, export_with_summary, npy_streams, runs  # noqa: F401  (fixture)

dataset = pytest.importorskip("datatrove.utils.dataset", reason="datatrove (and torch) are in the test extra")


@pytest.mark.parametrize("case", CASES)
def test_datatrove_reader_gives_the_npy_streams_and_documents(case, cluster, runs, tmp_path):  # noqa: F811
    from formatcheck import case_options

    out, options = case_options(case, runs)
    reference = npy_streams(cluster, out, tmp_path / "npy", **options)
    dest, summary = export_with_summary(cluster, out, tmp_path / "dt", format="datatrove", **options)
    token_size = 4 if case == "wide" else 2
    said = "\n".join(summary.lines())
    assert f"token_size={token_size})" in said and ("needs token_size=4 (uint32)" in said) == (case == "wide")
    for split in ("train", "val"):
        ref = reference[split]
        folder = dest / split
        assert sorted(p.name for p in folder.iterdir()) == ["fineweb.ds", "fineweb.ds.index", "fineweb.ds.metadata"]
        name, count = (folder / "fineweb.ds.metadata").read_text().splitlines()[:2]
        assert name == f"{'cl100k_base' if case == 'wide' else 'gpt2'}|{token_size}" and int(count) == len(ref)
        # Training windows: seq_len + 1 tokens each, back to back; the split's tail under one window is not read.
        seq_len = 63
        windows = dataset.DatatroveFolderDataset(str(folder), seq_len=seq_len, token_size=token_size)
        assert len(windows) == len(ref) // (seq_len + 1)
        got = np.concatenate([windows[i]["input_ids"].numpy() for i in range(len(windows))])
        assert got.tolist() == ref[:len(got)].tolist()
        # The whole file as one window, with positions from .ds.index: 0 at every document's first token.
        whole = dataset.DatatroveFileDataset(str(folder / "fineweb.ds"), seq_len=len(ref) - 1, token_size=token_size,
                                             return_positions=True)
        item = whole[0]
        tokens, positions = item["input_ids"].numpy(), item["positions"].numpy()
        assert tokens.tolist() == ref.tolist()
        starts = np.flatnonzero(positions == 0).tolist() + [len(tokens)]
        docs = [tuple(tokens[a:b].tolist()) for a, b in zip(starts, starts[1:])]
        assert docs == expected_docs(case, out, reference, split)
        assert all(d[0] == eot_of(out) for d in docs)


def test_datatrove_folders_to_s3_match_local_and_leftovers_are_cleared(cluster, runs, s3, tmp_path):  # noqa: F811
    """Files in train/ and val/: a killed export's temporaries (local) and multipart uploads (S3)
    there are cleared, and the S3 objects are the local files' bytes."""
    out = runs["a"]
    local = tmp_path / "local"
    (local / "train").mkdir(parents=True)
    (local / "train" / "fineweb.ds.0123abcd.tmp").write_bytes(b"half")
    (local / "train" / "notes.txt.0123abcd.tmp").write_bytes(b"someone else's")
    export(cluster, out, local, format="datatrove", val_tokens=1500)
    assert sorted(p.name for p in (local / "train").glob("*.tmp")) == ["notes.txt.0123abcd.tmp"]
    fs, bucket = s3.fs(), s3.make_bucket()
    for key in ("dt/train/fineweb.ds", "dt/train/other.bin"):  # as a killed export leaves them
        fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)
    from tokenshards.export import ExportConfig, run_export

    run_export(ExportConfig(out=str(out), to=f"s3://{bucket}/dt", format="datatrove", val_tokens=1500,
                            storage_options=s3.storage_options, scheduler=cluster.scheduler_address), announce=lambda m: None)
    for split in ("train", "val"):
        for name in ("fineweb.ds", "fineweb.ds.index", "fineweb.ds.metadata"):
            assert fs.cat_file(f"{bucket}/dt/{split}/{name}") == (local / split / name).read_bytes(), name
    assert [u["Key"] for u in fs.call_s3("list_multipart_uploads", Bucket=bucket).get("Uploads", [])] == ["dt/train/other.bin"]
