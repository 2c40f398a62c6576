"""One place that turns what a user types after ``--encoding`` into a loaded tokenizer.

Every kind is one module with its loader, reference, fast path, boundaries and identity:

| kind            | named as                                             | module      | reference     |
|-----------------|------------------------------------------------------|-------------|---------------|
| ``tiktoken``    | ``gpt2``, ``cl100k_base``, ...; ``FILE.tiktoken``    | encoders    | tiktoken      |
| ``tiktoken-file``| ``llama3``, ``llama4``, ``llama3:PATH``             | meta        | tiktoken      |
| ``hf``          | ``tokenizer.json``, a folder, a Hub repo id          | hf          | tokenizers    |
| ``sentencepiece``| a ``.model`` file (or a folder holding one)         | spmodel     | sentencepiece |

The client loads a tokenizer once; ``EncoderPlugin`` ships it to the workers, which never
download anything or read a cache. The CLI's help, the forkserver's preload and the checks of
``verify --deep`` read this module.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from ..errors import UserError
from . import encoders, hf, hubtokenizer, meta, spmodel
from .library import read_file
from .names import FORMS


def load(spec: str, *, announce: Callable[[str], None] = lambda msg: None):
    """The tokenizer ``spec`` names, loaded on the client. Raises ``UserError`` in one line."""
    if spec in encoders.known_names() or spec.endswith(".tiktoken"):
        return encoders.load_encoding(spec, announce=announce)
    family = meta.family_and_path(spec)
    if family is not None:
        return meta.load(*family)
    if "://" not in spec:
        path = Path(spec).expanduser()
        if path.is_dir():
            return _load_folder(path, name=spec, source=os.path.abspath(path))
        if path.is_file():
            return _load_file(path, name=spec, source=os.path.abspath(path))
    if hubtokenizer.is_hub_repo_id(spec):
        found = hubtokenizer.fetch_tokenizer(spec, announce=announce)
        return _load_folder(found.folder, name=found.repo, source=f"{found.repo}@{found.revision}")
    if spec.endswith((".json", ".model")) or os.sep in spec:
        raise UserError(f"--encoding {spec}: no such file or folder")
    raise UserError(f"unknown encoding {spec!r}: expected one of: {'; '.join(FORMS)}")


def load_offline(spec: str):
    """``load`` where it needs no network and no remote store, else None: for a process that
    must never wait on a download (the workers' forkserver)."""
    if spec in encoders.known_names() or spec.endswith(".tiktoken"):
        return encoders.load_offline(spec)
    if "://" in spec:
        return None
    if meta.family_and_path(spec) is not None or os.path.exists(spec):
        try:
            return load(spec)
        except UserError:
            return None
    return None


def _load_folder(folder: Path, *, name: str, source: str):
    if (folder / "tokenizer.json").is_file():
        return hf.load_folder(folder, name=name, source=source)
    if (folder / "tokenizer.model").is_file():
        return _load_file(folder / "tokenizer.model", name=name, source=source)
    raise UserError(f"--encoding {name}: {folder} holds neither tokenizer.json nor tokenizer.model")


def _load_file(path: Path, *, name: str, source: str):
    if path.suffix == ".json":
        return hf.load_file(path, name=name, source=source)
    data = read_file(path, "tokenizer file", fix="pass a tokenizer.json, a SentencePiece .model or a tiktoken rank file")
    if meta.is_rank_file(data):
        raise UserError(f"--encoding {name}: a tiktoken-format rank file holds no split pattern or special tokens; "
                        f"name its family: {' or '.join(f'{f}:{name}' for f in meta.FAMILIES)}")
    return spmodel.load_file(path, name=name, source=source, data=data)
