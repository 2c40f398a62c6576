"""SentencePiece ``.model`` files (kind ``sentencepiece``): Llama 2, Mistral up to v0.3, Gemma.

The reference is the ``sentencepiece`` library, which never makes a control token (``<s>``,
``[INST]``) from text. gigatoken reads the same model with its control pieces marked unused, which
makes it match none of them in text either; it is used only after it reproduces the reference.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np

from ..errors import UserError
from .backends import GigatokenBackend
from .boundaries import Boundaries
from .records import SourceFile
from .library import LibraryTokenizer, flat_ids, read_file, sha256

CONTROL, USER_DEFINED, UNUSED = 3, 4, 5
"""``ModelProto.SentencePiece.Type`` values (sentencepiece_model.proto)."""


class SentencePieceTokenizer(LibraryTokenizer):
    kind = "sentencepiece"
    library = "sentencepiece"

    @functools.cached_property
    def _processor(self):
        import sentencepiece  # heavy: sentencepiece, for a SentencePiece encoding only

        return sentencepiece.SentencePieceProcessor(model_proto=self.payload)

    @property
    def n_vocab(self) -> int:
        return self._processor.get_piece_size()

    @property
    def bos(self) -> int | None:
        found = self._processor.bos_id()
        return found if found >= 0 else None

    @property
    def eos(self) -> int | None:
        found = self._processor.eos_id()
        return found if found >= 0 else None

    @property
    def natural(self) -> Boundaries:
        """SentencePiece models (Llama 2, Mistral, Gemma) are trained with the BOS first."""
        if self.bos is not None:
            return Boundaries(prefix=(self.bos,), why="its BOS before each document, as SentencePiece models are trained")
        if self.eos is not None:
            return Boundaries(suffix=(self.eos,), why="the model has no BOS: its EOS after each document")
        return Boundaries(why="the model has neither BOS nor EOS")

    def token_name(self, token: int) -> str:
        return self._processor.id_to_piece(token)

    def special_strings(self) -> list[str]:
        """Control pieces (never made from text) and user-defined ones (always made from text, which
        gigatoken 0.10 splits differently at a word's start: Mistral v3's ``[REFERENCE_DOC_0]``),
        alone, glued to words and between spaces."""
        from sentencepiece import sentencepiece_model_pb2  # heavy: protobuf's generated module (~25 ms)

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self.payload)
        pieces = ([p.piece for p in model.pieces if p.type == USER_DEFINED][:256]
                  + [p.piece for p in model.pieces if p.type == CONTROL][:256])
        return ([" ".join(pieces[i:i + 64]) for i in range(0, len(pieces), 64)]
                + [s for p in pieces[:64] for s in (p, f"x{p}y", f"a {p} b")])

    def reference(self):
        return SentencePieceReference(self._processor)

    def gigatoken(self):
        """gigatoken, with the documents that hold a user-defined piece's string handed to
        sentencepiece itself (gigatoken 0.10 splits those differently at a word's start)."""
        fast = GigatokenBackend(None, make=functools.partial(_gigatoken_without_controls, self.payload))
        user_defined = self._user_defined()
        return RoutedBackend(fast, self.reference(), user_defined) if user_defined else fast

    def _user_defined(self) -> list[str]:
        from sentencepiece import sentencepiece_model_pb2  # heavy: protobuf's generated module (~25 ms)

        model = sentencepiece_model_pb2.ModelProto()
        model.ParseFromString(self.payload)
        return [p.piece for p in model.pieces if p.type == USER_DEFINED]


def _gigatoken_without_controls(payload: bytes):
    import gigatoken  # optional: tokenshards[fast]
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString(payload)
    for piece in model.pieces:
        if piece.type == CONTROL:
            piece.type = UNUSED
    return gigatoken.Tokenizer.from_sentencepiece(model.SerializeToString())


class RoutedBackend:
    """A fast backend for every text but those containing one of ``strings``, which go to the
    reference: exact where the fast one differs only around those strings."""

    def __init__(self, fast, reference, strings: list[str]):
        self.fast, self.reference = fast, reference
        self.name = fast.name
        self.eot_token = None
        self._pattern = re.compile("|".join(map(re.escape, sorted(strings, key=len, reverse=True))))

    def encode_many(self, texts) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        routed = [i for i, text in enumerate(texts) if self._pattern.search(text)]
        if not routed:
            return self.fast.encode_many(texts)
        routed_set = set(routed)
        plain = [i for i in range(len(texts)) if i not in routed_set]
        flat, lengths = self.fast.encode_many([texts[i] for i in plain]) if plain else (np.zeros(0, np.uint32), [])
        ends = np.cumsum(lengths).tolist()
        pieces, all_lengths, k = [], np.empty(len(texts), dtype=np.int64), 0
        for i, text in enumerate(texts):
            if i in routed_set:
                pieces.append(self.reference.encode_one(text))
            else:
                pieces.append(flat[ends[k] - lengths[k]:ends[k]])
                k += 1
            all_lengths[i] = len(pieces[-1])
        return (np.concatenate(pieces) if pieces else np.zeros(0, np.uint32)), all_lengths


class SentencePieceReference:
    name = "sentencepiece"
    judge = "sentencepiece encode"
    eot_token = None

    def __init__(self, processor):
        self.processor = processor

    def encode_one(self, text: str) -> np.ndarray:
        return np.asarray(self.processor.encode(text), dtype=np.uint32)

    def encode_many(self, texts) -> tuple[np.ndarray, np.ndarray]:
        texts = list(texts)
        return flat_ids(self.processor.encode(texts, num_threads=1) if texts else [], len(texts))


def is_sentencepiece(data: bytes) -> bool:
    """Whether ``data`` parses as a SentencePiece model (a protobuf, not a text rank file)."""
    import sentencepiece  # heavy: sentencepiece, asked only of a file no other kind reads

    try:
        sentencepiece.SentencePieceProcessor(model_proto=data)
    except (RuntimeError, OSError, TypeError):
        return False
    return True


def load_file(path: Path, *, name: str, source: str, data: bytes | None = None) -> SentencePieceTokenizer:
    payload = data if data is not None else read_file(path, "SentencePiece model", fix="pass the tokenizer's .model file")
    if not is_sentencepiece(payload):
        raise UserError(f"{path}: not a SentencePiece model (sentencepiece cannot parse it); pass the tokenizer's .model file")
    return SentencePieceTokenizer(name=name, source=source, files=(SourceFile(name=path.name, sha256=sha256(payload)),),
                                  payload=payload)
