"""From the Hub, downloading and tokenizing overlap: through a link capped so that tokenizing
alone takes ~0.6 of the download, the whole job takes at most 1.15x the download alone.

All three runs are in this process, on the session cluster, so none pays an interpreter's or a
cluster's start-up (a real run starts its downloads before its cluster, so that overlaps too).
They tokenize with tiktoken, the slowest exact backend: the regime the issue names (tokenizing
at least half the download) then needs only ~200 MB of text, and the test stays short.

A run's fixed costs (connecting, listing, the footers, the last file's partitions after it arrives,
the commit: 1.0-1.4 s here) take 1.15x's slack from a short download. The corpus is sized so that
the download takes ~19 s on this machine's fast hours (28 files took 12 s once tokenizing got
faster, and then measured 1.09-1.12x: too close to the bound for a shared 2-core VM).

The stand-in Hub runs in this process, beside the client it times: it keeps each file's hashes
and sends bodies by sendfile (tests/hubserver.py). While it hashed the whole file for every
request, the footers alone delayed the first download by 1.3-1.8 s, and it measured 1.17-1.27x
right after the parallel part (one CI run and two fresh-clone runs failed).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from conftest import write_parquet
from hubserver import HubServer
from tokenshards.storage import hub
from tokenshards.storage.hub import HubDataset

pytestmark = pytest.mark.serial  # it measures wall time: run alone (make test)

REPO = "HuggingFaceFW/fineweb"
FILES = 44
PARTITION = 1_600_000
DOCS = 1_800
"""Bytes of text per partition: several per file, so that both workers share the last file."""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """FILES parquet files of ~4.7 MB of text each, words drawn from a made-up vocabulary."""
    root = tmp_path_factory.mktemp("capped")
    rng = np.random.default_rng(14)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=k)) for k in rng.integers(2, 10, size=20_000)])
    for n in range(FILES):
        words = rng.choice(vocab, size=(DOCS, 400))
        write_parquet(root / f"sample/10BT/{n:03d}_00000.parquet",
                      {"text": [" ".join(w) + "." for w in words], "id": [f"<urn:uuid:{n}-{i}>" for i in range(DOCS)]},
                      row_group_size=200)
    return root


def _dataset(server: HubServer, cache: Path) -> HubDataset:
    return HubDataset(repo=REPO, size="10B", endpoint=server.url, cache_dir=str(cache), backoff=0.05, keep_free=0)


def test_tokenizing_overlaps_a_capped_download(corpus, tokenize, tmp_path):
    files = sorted(corpus.glob("sample/10BT/*.parquet"))
    alone, _ = tokenize(files, out=tmp_path / "alone", partition_bytes=PARTITION, backend="tiktoken")
    tokenizing = alone.tokenize_seconds
    with HubServer(corpus, repo=REPO) as server:
        server.link_rate = int(sum(f.stat().st_size for f in files) / (tokenizing / 0.6))

        t0 = time.perf_counter()
        ds = _dataset(server, tmp_path / "download-alone")
        hub.download(ds, hub.list_files(ds), announce=lambda m: None)
        download = time.perf_counter() - t0

        t0 = time.perf_counter()
        both, out = tokenize([], out=tmp_path / "hub", hub=_dataset(server, tmp_path / "cache"), partition_bytes=PARTITION,
                             backend="tiktoken")
        whole = time.perf_counter() - t0
        assert len(server.downloads()) == 2 * FILES  # each file once per run
    note = (f"tokenizing alone {tokenizing:.2f} s, download alone {download:.2f} s, both {whole:.2f} s "
            f"(tokenizing {both.tokenize_seconds:.2f} s of it)")
    print(note)
    assert tokenizing >= 0.5 * download, note  # the case the issue describes
    assert whole <= 1.15 * download, note
    assert both.tokens == alone.tokens and both.partitions == alone.partitions
    parts = sorted(p for p in (tmp_path / "alone/parts").iterdir() if p.suffix in (".npy", ".parquet"))
    assert len(parts) == 2 * both.partitions
    for a in parts:  # tokens and docs files: the same bytes as from local copies
        assert (out / "parts" / a.name).read_bytes() == a.read_bytes(), a.name
