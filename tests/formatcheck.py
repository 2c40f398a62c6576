"""Shared by the tests of formats read through their trainers' own readers (test_format_*.py).

The reference is our ``npy`` export with the same options (its ``.npy`` shards read with
``np.load``): a format's reader must give the same token stream per split, in the same order, and
the same documents, each whole with its eot. Cases: plain, shuffled, a mixture of two runs (all
GPT-2, uint16) and a cl100k_base run (100,277 ids: uint32).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_export import expected_split, tokenize_to, write_corpus
from test_shuffle import write_other_corpus

from tokenshards.export import ExportConfig, run_export

VAL = 1500
CASES = ("plain", "shuffled", "mixed", "wide")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("formats")
    write_corpus(root / "in")
    write_other_corpus(root / "in2")
    return {
        "a": tokenize_to(cluster, root / "in", root / "a", partition_bytes=6000),
        "b": tokenize_to(cluster, root / "in2", root / "b", partition_bytes=3000),
        "wide": tokenize_to(cluster, root / "in", root / "wide", encoding="cl100k_base", partition_bytes=20_000),
    }


def case_options(case: str, runs: dict) -> tuple[Path, dict]:
    """(OUT, export options) of a case."""
    if case == "plain":
        return runs["a"], {"val_tokens": VAL}
    if case == "shuffled":
        return runs["a"], {"val_tokens": VAL, "shuffle": True, "seed": 3}
    if case == "mixed":
        return runs["a"], {"val_tokens": VAL, "mix_with": (str(runs["b"]),), "weights": (0.6, 0.4), "tokens": 20_000,
                           "seed": 1}
    if case == "wide":
        return runs["wide"], {"val_tokens": VAL}
    raise ValueError(case)


def export(cluster, out: Path, to: Path, **options) -> Path:
    return export_with_summary(cluster, out, to, **options)[0]


def export_with_summary(cluster, out: Path, to: Path, **options):
    summary = run_export(ExportConfig(out=str(out), to=str(to), scheduler=cluster.scheduler_address, **options),
                         announce=lambda m: None)
    return to, summary


def eot_of(out: Path) -> int:
    return json.loads((out / "manifest.json").read_text())["encoding"]["eot"]


def npy_streams(cluster, out: Path, to: Path, **options) -> dict[str, np.ndarray]:
    """{split: tokens} of our ``npy`` export with these options (the reference)."""
    dest = export(cluster, out, to, format="npy", **options)
    streams = {}
    for split in ("val", "train"):
        shards = sorted(dest.glob(f"fineweb_{split}_*.npy"), key=lambda p: p.name[-10:])
        streams[split] = np.concatenate([np.load(p) for p in shards]) if shards else np.empty(0, np.uint16)
    return streams


def docs_at_eot(tokens: np.ndarray, eot: int) -> list[tuple[int, ...]]:
    """A prefix-eot stream cut into documents (text never encodes to the eot id)."""
    tokens = np.asarray(tokens)
    starts = np.flatnonzero(tokens == eot).tolist()
    assert not len(tokens) or starts[0] == 0
    return [tuple(tokens[a:b].tolist()) for a, b in zip(starts, starts[1:] + [len(tokens)])]


def expected_docs(case: str, out: Path, streams: dict[str, np.ndarray], split: str) -> list[tuple[int, ...]]:
    """The documents of a split in export order: from the manifest for a plain export (checked
    against the reference stream), else the reference stream cut at each eot."""
    docs = docs_at_eot(streams[split], eot_of(out))
    if case in ("plain", "wide"):
        val, train = expected_split(out, VAL)
        assert docs == [tuple(d) for d in (val if split == "val" else train)]
    return docs
