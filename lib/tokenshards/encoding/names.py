"""What ``--encoding``, ``--boundary`` and ``--backend`` accept: the registry's words, light enough
for the CLI to build its parser without importing a tokenizer library."""
from __future__ import annotations

FORMS = ("a tiktoken encoding (gpt2, cl100k_base, o200k_base, ...)", "a train-bpe FILE.tiktoken",
         "llama3 or llama4 (Meta's files from llama-models)",
         "FAMILY:PATH for a tiktoken-format tokenizer.model (llama3:PATH, llama4:PATH)",
         "a tokenizer.json or a folder holding one", "a SentencePiece .model",
         "a Hub model repo id (Qwen/Qwen3-8B, meta-llama/Llama-3.1-8B@REVISION)")
"""Every way to name a tokenizer, in the order ``registry.load`` tries them."""

FAST_BACKENDS = ("gigatoken", "splintr", "riptoken")
"""Exact Rust BPEs ``auto`` tries, fastest first (GPT-2, one core, bench corpus, Arrow in, ids out:
gigatoken ~3x splintr, splintr ~2.9x and riptoken ~1.8x tiktoken's ``encode_ordinary``; docs/scaling.md).
splintr and riptoken take tiktoken's encodings only; gigatoken every kind it loads."""
BACKENDS = ("auto", "reference", "tiktoken", *FAST_BACKENDS)
"""``reference``: the tokenizer's own library (tiktoken, tokenizers, sentencepiece); ``tiktoken`` is
its older name for tiktoken's encodings."""
