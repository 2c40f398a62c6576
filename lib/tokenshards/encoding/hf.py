"""Hugging Face ``tokenizer.json`` (kind ``hf``): Qwen2.5/3, Llama 3.1, Gemma 3, DeepSeek-V3, OLMo...

The reference is the ``tokenizers`` library with ``encode_special_tokens = True`` and
``add_special_tokens=False``: a document's special-token strings stay text, and the post-processor
adds nothing to its ids (the run places the boundaries itself). The tokenizer's non-special added
tokens (Qwen's ``<think>``, Gemma's HTML tags) match text as they do for ``tokenizers``.
gigatoken loads the same file with its special added tokens left out, which makes it match no
special token in text; it is used only after it reproduces the reference.
"""
from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from ..errors import UserError
from ..wording import brief
from .backends import GigatokenBackend
from .boundaries import Boundaries
from .records import SourceFile
from .library import LibraryTokenizer, flat_ids, read_file, sha256
from .tojson import kept_text

SUPPORTED_MODELS = ("BPE", "Unigram")
"""Models for causal language models. WordPiece and WordLevel (BERT-style encoders) are refused."""
BOS_NAMES = ("<|begin_of_text|>", "<s>", "<bos>", "<|startoftext|>")
EOS_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|end▁of▁sentence|>")
"""End-of-text tokens, in the order they are looked for. A ``tokenizer_config.json``'s
``eos_token`` is often the chat's end-of-turn (Qwen3's ``<|im_end|>``, Gemma 3's
``<end_of_turn>``): documents of pretraining text end with the end-of-text token instead."""


class HFTokenizer(LibraryTokenizer):
    kind = "hf"
    library = "tokenizers"

    @functools.cached_property
    def _tokenizer(self):
        import tokenizers  # heavy: only the tokenizer's own library needs it, not the fast backends

        tok = tokenizers.Tokenizer.from_str(self.payload.decode("utf-8"))
        tok.encode_special_tokens = True
        return tok

    @functools.cached_property
    def _json(self) -> dict:
        return json.loads(self.payload)

    @functools.cached_property
    def _json_without_specials(self) -> str:
        """The file with its special added tokens left out, as gigatoken loads it: made once per
        machine and kept on disk (``tojson.kept_text``; writing Qwen3's 11 MB as JSON again took
        ~0.25 s of the forkserver's CPU before the workers could start), read back at every build
        elsewhere. The backend built from it is verified against the reference as any other."""
        key = hashlib.sha256(b"hf-without-specials\0" + self.payload).hexdigest()
        return kept_text(key, self._strip_specials)

    def _strip_specials(self) -> str:
        spec = dict(self._json)
        spec["added_tokens"] = [a for a in spec.get("added_tokens", []) if not a.get("special")]
        return json.dumps(spec)

    @functools.cached_property
    def _config(self) -> dict:
        return json.loads(self.extra) if self.extra else {}

    @functools.cached_property
    def n_vocab(self) -> int:
        """One past the largest id (added tokens included), as the embedding table is sized."""
        vocab = self._tokenizer.get_vocab(with_added_tokens=True)
        return max(vocab.values()) + 1 if vocab else 0

    def _id(self, token) -> int | None:
        if isinstance(token, dict):  # tokenizer_config.json's AddedToken form
            token = token.get("content")
        return self._tokenizer.token_to_id(token) if isinstance(token, str) else None

    def _specials(self) -> list[str]:
        return [a["content"] for a in self._json.get("added_tokens", []) if a.get("special")]

    @functools.cached_property
    def _added(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(prefix, suffix) the post-processor adds to a single sequence."""
        bare = self._tokenizer.encode("a", add_special_tokens=False).ids
        full = self._tokenizer.encode("a", add_special_tokens=True).ids
        for i in range(len(full) - len(bare) + 1):
            if full[i:i + len(bare)] == bare:
                return tuple(full[:i]), tuple(full[i + len(bare):])
        return (), ()

    @property
    def bos(self) -> int | None:
        found = self._id(self._config.get("bos_token"))
        if found is None:
            specials = set(self._specials())
            found = next((self._id(n) for n in BOS_NAMES if n in specials), None)
        return found

    @property
    def eos(self) -> int | None:
        specials = set(self._specials())
        found = next((self._id(n) for n in EOS_NAMES if n in specials), None)
        return found if found is not None else self._id(self._config.get("eos_token"))

    @property
    def natural(self) -> Boundaries:
        prefix, suffix = self._added
        if prefix or suffix:
            return Boundaries(prefix=prefix, suffix=suffix, why="what the tokenizer's post-processor adds")
        config = self._config
        prefix = (self.bos,) if config.get("add_bos_token") and self.bos is not None else ()
        suffix = (self.eos,) if config.get("add_eos_token") and self.eos is not None else ()
        if prefix or suffix:
            return Boundaries(prefix=prefix, suffix=suffix, why="tokenizer_config.json's add_bos_token/add_eos_token")
        if self.eos is not None:
            return Boundaries(suffix=(self.eos,), why="the tokenizer adds nothing: its end-of-text token after each document")
        return Boundaries(why="the tokenizer adds nothing and has no end-of-text token")

    def token_name(self, token: int) -> str:
        return self._tokenizer.id_to_token(token) or str(token)

    def special_strings(self) -> list[str]:
        specials = self._specials()
        return [" ".join(specials[i:i + 64]) for i in range(0, len(specials), 64)] + [
            f"x{s}y {s}\n{s}{s}" for s in specials[:64]]

    def reference(self):
        return HFReference(self._tokenizer)

    def gigatoken(self):
        return GigatokenBackend(None, make=functools.partial(_gigatoken_from_json, self._json_without_specials))


def _gigatoken_from_json(data: str):
    import gigatoken  # optional: tokenshards[fast]

    return gigatoken.Tokenizer.from_json(data)


class HFReference:
    """``tokenizers`` encoding each text on the calling thread (its batch call would start a thread
    pool in every worker process), special-token strings as text, nothing added."""

    name = "tokenizers"
    judge = "tokenizers (encode_special_tokens, add_special_tokens=False)"
    eot_token = None

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_one(self, text: str) -> np.ndarray:
        return np.asarray(self.tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)

    def encode_many(self, texts) -> tuple[np.ndarray, np.ndarray]:
        encode = self.tokenizer.encode
        return flat_ids([encode(text, add_special_tokens=False).ids for text in texts], len(texts))


CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""Where newer tokenizers keep their chat template, beside ``tokenizer_config.json``; transformers
gives it priority over the config's ``chat_template`` (``PreTrainedTokenizerBase.from_pretrained``)."""


def load_folder(folder: Path, *, name: str, source: str) -> HFTokenizer:
    """``tokenizer.json`` (+ ``tokenizer_config.json`` and ``chat_template.jinja`` when present) of a folder."""
    return load_file(folder / "tokenizer.json", name=name, source=source)


def load_file(path: Path, *, name: str, source: str) -> HFTokenizer:
    fix = "pass a tokenizer.json, a folder holding one, or a Hub model repo id"
    payload = read_file(path, "tokenizer file", fix=fix)
    config_path = path.with_name("tokenizer_config.json")
    extra = read_file(config_path, "tokenizer config", fix=fix) if config_path.is_file() else b""
    files = [SourceFile(name=path.name, sha256=sha256(payload))]
    if extra:
        files.append(SourceFile(name=config_path.name, sha256=sha256(extra)))
    try:
        spec = json.loads(payload)
        config = json.loads(extra) if extra else {}
    except ValueError as e:
        raise UserError(f"{path if not extra else f'{path} or {config_path}'} is not valid JSON ({e}); {fix}") from e
    model = (spec.get("model") or {}).get("type") if isinstance(spec, dict) else None
    if model not in SUPPORTED_MODELS:
        raise UserError(f"{path}: a {model or 'unknown'} tokenizer; tokenshards encodes the tokenizers causal language "
                        f"models use ({' and '.join(SUPPORTED_MODELS)} models), not BERT-style WordPiece or WordLevel")
    if not isinstance(config, dict):
        raise UserError(f"{config_path}: not a JSON object; {fix}")
    template_path = path.with_name(CHAT_TEMPLATE_FILE)
    if template_path.is_file():  # as transformers loads it: the file's template is the default one
        data = read_file(template_path, "chat template", fix=fix)
        try:
            config = {**config, "chat_template": data.decode("utf-8")}
        except UnicodeDecodeError as e:
            raise UserError(f"{template_path}: not UTF-8 text ({e}); {fix}") from e
        files.append(SourceFile(name=template_path.name, sha256=sha256(data)))
        extra = json.dumps(config, ensure_ascii=False).encode()  # what the run records and ships: one config
    loaded = HFTokenizer(name=name, source=source, files=tuple(files), payload=payload, extra=extra)
    loaded._json = spec  # parsed once here (~0.3 s for Qwen3's 11 MB), not again by the properties
    try:
        loaded._tokenizer
    except Exception as e:  # tokenizers' own parse error: a newer format, a damaged file
        raise UserError(f"{path}: the tokenizers library cannot load it ({brief(e)}); "
                        "upgrade tokenizers, or check the file") from e
    return loaded
