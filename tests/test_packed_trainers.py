"""``--format megatron|olmo --seq-len N`` read by the trainers' own readers, each in a venv of its
own (``readervenv.py``), never by our code: Megatron-core's ``GPTDataset`` (``sequence_length=N``,
``add_extra_token_to_sequence=False``, ``reset_position_ids``, ``reset_attention_mask``,
``eod_mask_loss``) and OLMo-core's ``NumpyFSLDataset`` (``generate_doc_lengths``,
``label_mask_paths``, ``get_labels``, ``iter_document_indices`` on the ``.csv.gz``).

For every packing (concat and best-fit, with and without --bos-align) of one small run tokenized
with ``--eot suffix`` (the boundary both trainers end a document at), each row the trainer yields
must be one of our packed rows (the ``npy`` export with the same options: ids, ``seq_lengths``,
``position_ids``), its documents (Megatron's position ids and attention mask, OLMo-core's
``doc_lens``) exactly the row's, and the padding out of the loss.

Megatron-core 0.16.1 is the newest release for Python 3.11 (0.17 on need 3.12); it installs with
torch, numpy and packaging alone (Transformer Engine and Apex are optional: it warns and falls back).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from readervenv import TEST_TIMEOUT, reader_python, run_reader
from test_export import tokenize_to, write_corpus
from test_packing import npy_rows

from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export

pytestmark = pytest.mark.timeout(TEST_TIMEOUT)  # the first test builds the reader venvs

N = 64
VAL = 1500
EOT = 50256
CASES = [("concat", False), ("concat", True), ("best-fit", False), ("best-fit", True)]
MEGATRON_CORE = ("megatron-core==0.16.1",)
OLMO_CORE = ("ai2-olmo-core==3.0.0",)

MEGATRON_READER = r'''
import json, sys
import numpy as np
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset
from megatron.core.datasets.utils import Split


class Tokenizer:  # what GPTDataset asks of one: the eod and the vocabulary size (no pad: Megatron's -1)
    def __init__(self, eod, vocab_size):
        self.eod, self.vocab_size = eod, vocab_size
        self.unique_identifiers = {"class": "Tokenizer", "eod": eod}


def dataset(a, extra):
    config = GPTDatasetConfig(random_seed=1234, sequence_length=a["seq"], tokenizer=Tokenizer(a["eot"], a["n_vocab"]),
                              reset_position_ids=True, reset_attention_mask=True, eod_mask_loss=True,
                              add_extra_token_to_sequence=extra, path_to_cache=a["cache"] + f"-{extra}", split="100,0,0")
    indexed = IndexedDataset(a["prefix"])
    return indexed, GPTDataset(indexed, a["prefix"], np.arange(len(indexed), dtype=np.int32), None, Split.train, config)


for a in json.loads(sys.argv[1]):
    indexed, ds = dataset(a, False)
    samples = [ds[i] for i in range(len(ds))]
    out = {key: np.stack([s[key].numpy() for s in samples]) for key in ("tokens", "labels", "loss_mask", "position_ids", "attention_mask")}
    _, extra = dataset(a, True)  # pretrain_gpt.py's default: each sample reads one more token
    out["extra_tokens"] = np.stack([extra[i]["tokens"].numpy() for i in range(len(extra))])
    np.savez(a["got"], documents=len(indexed), **out)
'''

OLMO_READER = r'''
import json, sys
import numpy as np
import torch
from olmo_core.data.numpy_dataset import NumpyFSLDataset
from olmo_core.data.utils import get_labels, iter_document_indices

for a in json.loads(sys.argv[1]):
    dtype = np.dtype(a["dtype"]).type
    ds = NumpyFSLDataset(a["path"], sequence_length=a["seq"], pad_token_id=a["eot"], eos_token_id=a["eot"],
                         vocab_size=a["n_vocab"], dtype=dtype, generate_doc_lengths=True,
                         label_mask_paths=[a["mask"]] if a["mask"] else None)
    ds.work_dir = a["work"]
    ds.prepare()
    items = [ds[i] for i in range(len(ds))]
    ids = torch.stack([x["input_ids"] for x in items])
    batch = {"input_ids": ids}
    if a["mask"]:
        batch["label_mask"] = torch.stack([x["label_mask"] for x in items])
    doc_lens = [x["doc_lens"].tolist() for x in items]
    pieces = [list(p) for p in iter_document_indices(a["path"], use_array_if_local=False, dtype=dtype)]
    np.savez(a["got"], input_ids=ids.numpy(), labels=get_labels(batch).numpy(),
             label_mask=batch["label_mask"].numpy() if a["mask"] else np.zeros(0, bool))
    with open(a["got"] + ".json", "w") as f:
        json.dump({"doc_lens": doc_lens, "pieces": pieces}, f)
'''


@pytest.fixture(scope="module")
def run(tmp_path_factory, cluster):
    root = tmp_path_factory.mktemp("packed-trainers")
    write_corpus(root / "in")
    return {"root": root, "out": tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000, eot_position="suffix")}


def export(cluster, run, name, **options) -> tuple[Path, list[str]]:
    to = run["root"] / name
    summary = run_export(ExportConfig(out=str(run["out"]), to=str(to), scheduler=cluster.scheduler_address,
                                      progress="none", seq_len=N, val_tokens=VAL, **options), announce=lambda m: None)
    return to, list(summary.notes)


@pytest.fixture(scope="module")
def exports(cluster, run):
    """Per case: the npy export (our rows) and the megatron and olmo ones, with the same options."""
    out = {}
    for mode, bos_align in CASES:
        key = f"{mode}{'-bos' if bos_align else ''}"
        options = {"pack": mode, "bos_align": bos_align}
        npy, _ = export(cluster, run, f"npy-{key}", format="npy", **options)
        megatron, m_notes = export(cluster, run, f"megatron-{key}", format="megatron", **options)
        olmo, o_notes = export(cluster, run, f"olmo-{key}", format="olmo", **options)
        out[key] = {"npy": npy, "megatron": megatron, "olmo": olmo, "notes": {"megatron": m_notes, "olmo": o_notes},
                    "padded": mode == "best-fit"}
    return out


def segments(lengths: list[int]) -> np.ndarray:
    """Each token's document number in a row (the padding after them: -1)."""
    return np.concatenate([np.full(n, i) for i, n in enumerate(lengths)] + [np.full(N - sum(lengths), -1)]).astype(int)


def test_megatron_gpt_dataset_yields_our_rows_with_their_documents(exports, tmp_path):
    python = reader_python("megatron-core", MEGATRON_CORE)
    jobs = []
    for key, e in exports.items():
        names = {"train": "fineweb_text_document", "val": "fineweb_val_text_document"}
        assert sorted(p.name for p in e["megatron"].glob("*_document.*")) == sorted(
            f"{n}.{s}" for n in names.values() for s in ("bin", "idx"))
        for split, name in names.items():
            ids, lens, _ = npy_rows(e["npy"], split)
            if split == "train":  # best-fit's padding is there to be masked
                assert any(sum(x) < N for x in lens) == e["padded"]
            assert (e["megatron"] / f"{name}.bin").read_bytes() == ids.astype("<u2").tobytes()  # our rows, in order
            jobs.append({"prefix": str(e["megatron"] / name), "seq": N, "eot": EOT, "n_vocab": 50257,
                         "cache": str(tmp_path / "cache" / key / split), "got": str(tmp_path / f"{key}-{split}.npz")})
        notes = "\n".join(e["notes"]["megatron"])
        assert "add_extra_token_to_sequence=False" in notes and f"ends with id {EOT}" in notes
        assert ("--eod-mask-loss keeps it out of the loss" in notes) == e["padded"]
    run_reader(python, MEGATRON_READER, jobs)
    for job in jobs:
        key, split = Path(job["got"]).stem.rsplit("-", 1)
        ids, lens, pos = npy_rows(exports[key]["npy"], split)
        got = np.load(job["got"])
        assert int(got["documents"]) == len(ids) and got["tokens"].shape == ids.shape  # one epoch: every row once
        ours: dict[tuple, list] = {}
        for row, lengths, p in zip(ids.tolist(), lens, pos):
            ours.setdefault(tuple(row), []).append((lengths, p))
        assert sorted(map(tuple, got["tokens"].tolist())) == sorted(map(tuple, ids.tolist()))  # Megatron's shuffle of whole rows
        # With add_extra_token_to_sequence (Megatron-LM's pretrain_gpt.py does not change it), the inputs are
        # still our rows, every row but one an epoch: the extra token is the next row's first, a label only.
        extra = got["extra_tokens"]
        assert len(extra) == len(ids) - 1 and all(tuple(row) in ours for row in extra.tolist())
        for tokens, labels, loss, position, attention in zip(got["tokens"], got["labels"], got["loss_mask"],
                                                             got["position_ids"], got["attention_mask"]):
            lengths, p = ours[tuple(tokens.tolist())][0]
            filled = sum(lengths)
            assert position[:filled].tolist() == p[:filled].tolist()  # restarting at each of our documents
            seg = segments(lengths)
            allowed = ~attention[0]  # Megatron's mask: True = masked
            causal = np.tril(np.ones((N, N), bool))
            same = (seg[:, None] == seg[None, :]) & causal
            assert (allowed[:filled, :filled] == same[:filled, :filled]).all()  # attention never crosses them
            assert labels[:-1].tolist() == tokens[1:].tolist()
            assert (loss[filled - 1:] == 0).all() if filled < N else loss[-1] == 0  # padding is never a target
            ends = np.cumsum(lengths) - 1  # each document's eot: its next token is another document's
            trained = np.ones(N, bool)
            trained[ends] = False
            trained[filled:] = False
            trained[-1] = False
            assert (loss.astype(bool) == trained).all()


def test_olmo_fsl_dataset_yields_our_rows_with_their_documents(exports, tmp_path):
    python = reader_python("olmo-core", OLMO_CORE)
    jobs = []
    for key, e in exports.items():
        for split in ("train", "val"):
            ids, _, _ = npy_rows(e["npy"], split)
            folder = e["olmo"] / split
            mask = folder / "label_mask" / "fineweb.npy"
            assert sorted(p.name for p in folder.glob("*")) == ["fineweb.csv.gz", "fineweb.npy"] + (
                ["label_mask"] if e["padded"] else [])
            assert (folder / "fineweb.npy").read_bytes() == ids.astype("<u2").tobytes()
            jobs.append({"path": str(folder / "fineweb.npy"), "mask": str(mask) if e["padded"] else None, "seq": N,
                         "eot": EOT, "n_vocab": 50257, "dtype": "uint16", "work": str(tmp_path / "work" / key / split),
                         "got": str(tmp_path / f"{key}-{split}.npz")})
        notes = "\n".join(e["notes"]["olmo"])
        assert f"sequence_length={N}, dtype=uint16, generate_doc_lengths=True, eos_token_id={EOT}" in notes
        assert ("label_mask_paths=DEST/train/label_mask/*.npy" in notes) == e["padded"]
    run_reader(python, OLMO_READER, jobs)
    for job in jobs:
        key, split = Path(job["got"]).stem.rsplit("-", 1)
        ids, lens, _ = npy_rows(exports[key]["npy"], split)
        got = np.load(job["got"])
        read = json.loads(Path(job["got"] + ".json").read_text())
        assert got["input_ids"].tolist() == ids.tolist()  # every row, in order
        at = 0
        pieces = []
        for r, (lengths, doc_lens) in enumerate(zip(lens, read["doc_lens"])):
            filled = sum(lengths)
            assert doc_lens == lengths + [1] * (N - filled)  # each padding eot is a document of its own
            for n in lengths:
                pieces.append([at, at + n])
                at += n
            at = (r + 1) * N
            labels = got["labels"][r]
            if job["mask"]:
                assert got["label_mask"][r].tolist() == [i < filled for i in range(N)]
                assert (labels[filled - 1:] == -100).all()  # padding is never a target
            assert labels[:filled - 1].tolist() == ids[r, 1:filled].tolist()
        assert read["pieces"] == pieces  # the .csv.gz: every packed document's start,end in the array


def test_packed_trainer_formats_refuse_columns_and_flat_formats_still_refuse_seq_len():
    with pytest.raises(UserError, match="writes the token ids alone"):
        ExportConfig(out="run", to="dest", format="olmo", seq_len=N, columns=("position_ids",))
    with pytest.raises(UserError, match="flat token stream .* npy, megatron, olmo"):
        ExportConfig(out="run", to="dest", format="datatrove", seq_len=N)
