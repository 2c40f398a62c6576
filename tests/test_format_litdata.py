"""``--format litdata`` read by litdata's own ``StreamingDataset`` with ``TokensLoader`` (LitGPT's
pretraining reader), never by our code: the same streams and documents as our ``npy`` export with
the same options."""
from __future__ import annotations

import json

import numpy as np
import pytest
from formatcheck import CASES, case_options, eot_of, expected_docs, export, npy_streams, runs  # noqa: F401  (fixture)

litdata = pytest.importorskip("litdata", reason="litdata (and torch) are in the test extra")


def read(folder, block_size: int) -> np.ndarray:
    from litdata.streaming.item_loader import TokensLoader

    ds = litdata.StreamingDataset(str(folder), item_loader=TokensLoader(block_size=block_size), shuffle=False)
    items = [np.asarray(ds[i]) for i in range(len(ds))]
    return np.concatenate(items) if items else np.empty(0, np.uint16)


# litdata's TokensLoader wraps its read-only memmap with torch.frombuffer (its own doing, any dataset).
@pytest.mark.filterwarnings("ignore:The given buffer is not writable:UserWarning")
@pytest.mark.parametrize("case", CASES)
def test_litdata_reader_gives_the_npy_streams_and_documents(case, cluster, runs, tmp_path, monkeypatch):  # noqa: F811
    from tokenshards.export.formats import litdata as fmt

    chunk = fmt.CHUNK_TOKENS
    if case != "plain":  # several chunks per split (the client plans them)
        chunk = 1000
        monkeypatch.setattr(fmt, "CHUNK_TOKENS", chunk)
    out, options = case_options(case, runs)
    reference = npy_streams(cluster, out, tmp_path / "npy", **options)
    dest = export(cluster, out, tmp_path / "ld", format="litdata", **options)
    for split in ("train", "val"):
        ref = reference[split]
        n_chunks = -(-len(ref) // chunk)
        folder = dest / split
        assert sorted(p.name for p in folder.iterdir()) == sorted(["index.json", *(f"chunk-0-{i}.bin" for i in range(n_chunks))])
        index = json.loads((folder / "index.json").read_text())
        assert [c["dim"] for c in index["chunks"]] == [min(chunk, len(ref) - i * chunk) for i in range(n_chunks)]
        # Blocks of one token: the whole stream, so every document whole with its eot.
        got = read(folder, 1)
        assert got.dtype == (np.uint32 if case == "wide" else np.uint16)
        assert got.tolist() == ref.tolist()
        assert [tuple(d) for d in _docs(got, eot_of(out))] == expected_docs(case, out, reference, split)
        # Training blocks: whole blocks of each chunk, in order.
        block = 100
        want = np.concatenate([ref[i:i + chunk][:len(ref[i:i + chunk]) // block * block] for i in range(0, len(ref), chunk)])
        assert read(folder, block).tolist() == want.tolist()


def _docs(tokens: np.ndarray, eot: int) -> list[tuple[int, ...]]:
    starts = np.flatnonzero(tokens == eot).tolist() + [len(tokens)]
    return [tuple(tokens[a:b].tolist()) for a, b in zip(starts, starts[1:])]
