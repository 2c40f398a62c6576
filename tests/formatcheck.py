"""Shared by the tests of formats read through their trainers' own readers (test_format_*.py).

The reference is our ``npy`` export with the same options (its ``.npy`` shards read with
``np.load``): a format's reader must give the same token stream per split, in the same order, and
the same documents, each whole with its eot. Cases: plain, shuffled, a mixture of two runs (all
GPT-2, uint16) and a cl100k_base run (100,277 ids: uint32).

The reference itself is judged first, from the runs' part files alone (``readback``), never
taken on trust: a plain one must hold the manifest's documents in order (``expected_docs``); a
shuffled or mixed one (``npy_streams``) what docs/exports/shuffle-mix.md promises: the same
validation set as a plain export's (a mixture's divided by weight), every train document once and
not in manifest order; a mixture's runs each giving ``weight x --tokens`` train tokens, overshooting
by less than one document, each of their documents the same number of times give or take one.
Only the seeded order itself is our code's alone, the same in every format's reader.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from fractions import Fraction
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
    """{split: tokens} of our ``npy`` export with these options (the reference), a shuffled or
    mixed one checked against what such an export promises (the module's docstring)."""
    dest = export(cluster, out, to, format="npy", **options)
    streams = {}
    for split in ("val", "train"):
        shards = sorted(dest.glob(f"fineweb_{split}_*.npy"), key=lambda p: p.name[-10:])
        streams[split] = np.concatenate([np.load(p) for p in shards]) if shards else np.empty(0, np.uint16)
    if options.get("mix_with"):
        check_mixture([out, *map(Path, options["mix_with"])], streams, weights=options["weights"],
                      tokens=options["tokens"], val_tokens=options["val_tokens"])
    elif options.get("shuffle"):
        check_shuffled(out, streams, val_tokens=options["val_tokens"])
    return streams


def check_shuffled(out: Path, streams: dict[str, np.ndarray], *, val_tokens: int) -> None:
    val, train = expected_split(out, val_tokens)
    got = {split: docs_at_eot(streams[split], eot_of(out)) for split in ("val", "train")}
    assert Counter(got["val"]) == Counter(map(tuple, val)), "a shuffled export's validation set is not the plain one's"
    assert Counter(got["train"]) == Counter(map(tuple, train)), "not every train document once, whole"
    assert got["train"] != [tuple(d) for d in train], "a shuffled export in manifest order"


def check_mixture(runs: list[Path], streams: dict[str, np.ndarray], *, weights: tuple[float, ...], tokens: int,
                  val_tokens: int) -> None:
    """Each run's validation documents chosen as for it alone with its share of ``val_tokens``;
    its train documents repeated whole, then topped up, to its share of ``tokens``."""
    shares = [Fraction(repr(w)) / sum(Fraction(repr(v)) for v in weights) for w in weights]
    assert all((val_tokens * w).denominator == 1 for w in shares), "pick weights that divide --val-tokens exactly"
    splits = [expected_split(run, int(val_tokens * w)) for run, w in zip(runs, shares)]
    eot = eot_of(runs[0])
    assert Counter(docs_at_eot(streams["val"], eot)) == Counter(tuple(d) for val, _ in splits for d in val), \
        "the validation set is not each run's own, by weight"
    got = Counter(docs_at_eot(streams["train"], eot))
    owned = [Counter(map(tuple, train)) for _, train in splits]
    assert not set.intersection(*(set(o) for o in owned)), "the runs share a document: pick corpora that do not"
    assert sum(got.values()) == sum(got[d] for o in owned for d in o), "a train document of no run's train set"
    for own, w in zip(owned, shares):
        target, size = math.ceil(w * tokens), sum(len(d) * n for d, n in own.items())
        taken = sum(len(d) * got[d] for d in own)
        assert target <= taken < target + max(map(len, own)), (taken, target)
        epochs = target // size
        assert all(epochs * n <= got[d] <= (epochs + 1) * n for d, n in own.items()), "not whole epochs, then a top-up"


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
