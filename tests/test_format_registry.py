"""Pure: what every registered format promises the drivers, checked for all of them at once, so a
new format module is held to it by being registered."""
from __future__ import annotations

import fnmatch

import numpy as np
import pytest

from tokenshards.errors import UserError
from tokenshards.export import formats
from tokenshards.export.config import ExportConfig
from tokenshards.export.formats import hf
from tokenshards.export.layout import Streams, chunk_file


def streams(val_docs: int = 3, val_tokens: int = 90) -> Streams:
    return Streams.from_counts(docs=np.array([10, 0, 12]), tokens=np.array([100, 0, 150]),
                               val_docs=np.array([val_docs, 0, 0]), val_tokens=np.array([val_tokens, 0, 0]))


@pytest.mark.parametrize("name", formats.FORMATS)
@pytest.mark.parametrize("dtype", ["<u2", "<u4"])
def test_every_format_names_its_files_and_carries_every_token_once(name, dtype):
    fmt = formats.get(name)
    assert fmt.name == name and fmt.reader and fmt.help
    if getattr(fmt, "rows", False):  # written row group by row group (export/packed.py): what it names is checked here
        check_row_format_names(fmt)
        return
    try:
        stored = fmt.dtype(dtype)
    except UserError as e:  # a format may refuse a vocabulary, in one line naming the alternatives
        assert dtype == "<u4" and "export --format" in str(e)
        return
    assert np.dtype(stored).itemsize == np.dtype(dtype).itemsize
    for s in (streams(), streams(0, 0)):
        plan = formats.Plan(prefix="x", dtype=stored, n_vocab=100_277 if dtype == "<u4" else 50_257, encoding="e",
                            eot=0, shard_tokens=40, min_shard_tokens=0)
        files = fmt.files(s, plan)
        names = [f.name for f in files]
        assert len(set(names)) == len(names)
        # Every file is found again by the format's patterns (--overwrite, leftovers), the record is not.
        patterns = fmt.patterns("x")
        assert all(any(fnmatch.fnmatchcase(n, p) for p in patterns) for n in names), (names, patterns)
        assert not any(fnmatch.fnmatchcase(fmt.record_name("x"), p) for p in patterns)
        for split in ("val", "train"):
            assert sum(f.tokens for f in files if f.split == split) == s.tokens(split)
            assert bool([f for f in files if f.split == split]) == bool(s.tokens(split))
        for f in files:  # any chunking renders exactly the planned bytes (checked by the writer too)
            assert sum(c.nbytes for c in chunk_file(f, s, chunk_bytes=7)) == f.nbytes
        assert all(isinstance(n, str) for n in fmt.notes(files, plan))


def check_row_format_names(fmt) -> None:
    """A format written row group by row group (hf, the one) has no ``files``: the packed writer
    names its shards with ``hf.shard_name``. Every such name is found again by the format's
    patterns (--overwrite, leftovers, a killed export's rerun) for its own prefix only; the record,
    the dataset card (``_check_card``'s) and the note of an unfinished export are not."""
    assert fmt.name == "hf", f"{fmt.name}: a new row format: say here how the packed writer names its files"
    with pytest.raises(NotImplementedError):  # a byte-range driver must never write it
        fmt.files(streams(), formats.Plan(prefix="x", dtype="<u2", n_vocab=50_257, shard_tokens=40, min_shard_tokens=0))
    names = [hf.shard_name("x", split, i) for split in ("train", "val") for i in (0, 1, 12345)]
    assert len(set(names)) == len(names)
    assert all(any(fnmatch.fnmatchcase(n, p) for p in fmt.patterns("x")) for n in names), (names, fmt.patterns("x"))
    assert not any(fnmatch.fnmatchcase(n, p) for n in names for p in fmt.patterns("y"))
    others = [fmt.record_name("x"), "README.md", f".{fmt.record_name('x')}.unfinished"]
    assert not any(fnmatch.fnmatchcase(n, p) for n in others for p in fmt.patterns("x"))
    assert {n.split("/")[0] for n in names} == {"train", "validation"}  # the splits datasets.load_dataset names


def test_options_follow_the_registry():
    sharded = [f.name for f in formats.REGISTRY.values() if f.sharded]
    assert sharded == ["llmc", "npy", "hf"]
    for fmt in formats.REGISTRY.values():
        if not fmt.sharded:
            with pytest.raises(UserError, match=rf"--shard-tokens applies to llmc, npy and hf; {fmt.name} writes"):
                ExportConfig(out="o", to="d", format=fmt.name, shard_tokens=10)
        if fmt.fixed_names:
            with pytest.raises(UserError, match=rf"--prefix does not apply to {fmt.name}: "):
                ExportConfig(out="o", to="d", format=fmt.name, prefix="p")
        else:
            ExportConfig(out="o", to="d", format=fmt.name, prefix="p")


def test_olmo_files_are_never_taken_for_npy_exports_and_back():
    """Both end in .npy: OLMo-core's raw arrays live in train/ and val/, ours at DEST's top, and
    neither format's patterns find the other's files."""
    s = streams()
    for a, b in (("olmo", "npy"), ("npy", "olmo")):
        plan = formats.Plan(prefix="fineweb", dtype="<u2", n_vocab=50_257, shard_tokens=40, min_shard_tokens=0)
        names = [f.name for f in formats.get(a).files(s, plan)]
        assert not any(fnmatch.fnmatchcase(n, p) for n in names for p in formats.get(b).patterns("fineweb"))
