"""A worker parses each file's parquet footer once, never serves a replaced file's old one, and
the job submits partitions grouped by file so that a small cache is enough."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tokenshards.encoding.encoders import load_encoding
from tokenshards.encoding.backends import TiktokenBackend
from tokenshards.errors import InputChanged
from tokenshards.format import v1
from tokenshards.corpus import footers
from tokenshards.corpus.footers import FooterCache
from tokenshards.corpus.plan import Piece, plan_pieces, read_input_metadata, submission_order
from tokenshards.tokenize.task import TaskSettings, tokenize_partition


def _meta(path, rows):
    pq.write_table(pa.table({"text": [f"row {i}" for i in range(rows)]}), path, row_group_size=max(1, rows // 4))
    return pq.ParquetFile(path).metadata


def test_the_cache_keys_by_identity_and_is_bounded(tmp_path):
    metas = [_meta(tmp_path / f"{i}.parquet", 8 + i) for i in range(4)]
    cache = FooterCache(max_files=2, max_bytes=10**9)
    assert cache.get("a", ()) is None
    cache.keep("a", (), metas[0])  # no identity: never kept (the file could have changed)
    assert cache.get("a", ()) is None
    cache.keep("a", (("size", 1),), metas[0])
    assert cache.get("a", (("size", 1),)) is metas[0]
    assert cache.get("a", (("size", 2),)) is None  # a replaced file misses
    cache.keep("b", (("size", 1),), metas[1])
    cache.get("a", (("size", 1),))  # a is now the most recent
    cache.keep("c", (("size", 1),), metas[2])
    assert cache.get("b", (("size", 1),)) is None and cache.get("a", (("size", 1),)) is metas[0]
    small = FooterCache(max_files=8, max_bytes=metas[0].serialized_size + metas[1].serialized_size)
    for i, m in enumerate(metas[:3]):
        small.keep(str(i), (("size", i),), m)
    assert small.get("0", (("size", 0),)) is None and small.get("2", (("size", 2),)) is metas[2]


def _count_parses(monkeypatch) -> list[bool]:
    """A list that gets, for each ParquetFile opened from now on, whether it parsed the footer
    (no ``metadata`` handed in)."""
    parsed = []
    real = pq.ParquetFile.__init__

    def counting(self, source, *args, metadata=None, **kwargs):
        parsed.append(metadata is None)
        real(self, source, *args, metadata=metadata, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "__init__", counting)
    return parsed


class _Encoder:
    def __init__(self, backend):
        self._backend = backend

    def backend(self):
        return self._backend


def test_a_worker_parses_a_file_footer_once_and_a_replaced_file_is_refused(tmp_path, monkeypatch, gpt2):
    src = tmp_path / "in.parquet"
    texts = [f"document {i}: some text, 🙂 and 中文 {i * 7}" for i in range(400)]
    pq.write_table(pa.table({"text": texts}), src, row_group_size=20)
    f = read_input_metadata(str(src), "in", text_column="text", id_column=None)
    pieces = plan_pieces([f], target_bytes=1)
    assert len(pieces) == 20
    monkeypatch.setattr(footers, "WORKER_FOOTERS", FooterCache())
    import tokenshards.corpus.read as read
    monkeypatch.setattr(read, "WORKER_FOOTERS", footers.WORKER_FOOTERS)
    parsed = _count_parses(monkeypatch)
    out = tmp_path / "out"
    settings = TaskSettings(out=str(out), storage_options={}, encoder=None, dtype="uint16", eot_position="prefix",
                            job="j", backend="tiktoken")
    backend = TiktokenBackend(load_encoding("gpt2").encoding)
    for piece in pieces:
        tokenize_partition(piece, settings=settings, backend=backend)
    assert sum(parsed) == 1 and len(parsed) == 20
    # The tokens are still every document's encode_ordinary, eot first.
    tokens = np.concatenate([np.load(out / v1.tokens_file(p.index)) for p in pieces])
    want = [t for text in texts for t in [gpt2.eot_token] + gpt2.encode_ordinary(text)]
    assert tokens.tolist() == want
    # A replacement (new identity) is refused before its rows meet the old footer.
    pq.write_table(pa.table({"text": texts[::-1]}), src, row_group_size=20)
    os.utime(src, ns=(1, 1))
    with pytest.raises(InputChanged, match="changed since this run planned it"):
        tokenize_partition(pieces[3], settings=settings, backend=backend)


def _piece(index, url, size):
    return Piece(index=index, input=url, name=url, row_groups=(index, index + 1), first_row=index, rows=1,
                 text_bytes=size, id_column=None)


def test_submission_groups_pieces_by_file_and_puts_small_ends_last():
    pieces = [_piece(0, "a", 100), _piece(1, "a", 100), _piece(2, "a", 10), _piece(3, "b", 100), _piece(4, "b", 30),
              _piece(5, "c", 100), _piece(6, "c", 100)]
    order = submission_order(list(reversed(pieces)))
    assert [p.index for p in order] == [0, 1, 3, 5, 6, 4, 2]
    assert submission_order([]) == []


def test_verify_deep_reads_a_file_footer_once_per_worker(tmp_path, monkeypatch):
    """``verify --deep`` re-reads sampled rows partition by partition: with the identity the run
    recorded, one parse of the footer serves them all; without one, each read parses it again."""
    import tokenshards.verify.command as verify_command

    src = tmp_path / "in.parquet"
    texts = [f"document {i}: 🙂 中文 {i}" for i in range(200)]
    pq.write_table(pa.table({"text": texts}), src, row_group_size=20)
    monkeypatch.setattr(verify_command, "WORKER_FOOTERS", FooterCache())
    parsed = _count_parses(monkeypatch)
    identity = (("size", os.path.getsize(src)),)
    for g in range(10):
        got = verify_command._read_rows(str(src), [g * 20 + 3], row_groups=(g, g + 1), text_column="text",
                                    storage_options={}, identity=identity)
        assert got == {g * 20 + 3: texts[g * 20 + 3]}
    assert parsed.count(True) == 1 and len(parsed) == 10
    parsed.clear()
    for g in range(3):
        verify_command._read_rows(str(src), [g * 20], row_groups=(g, g + 1), text_column="text", storage_options={})
    assert parsed == [True, True, True]
