"""Meta's Llama 3 and Llama 4 tokenizers (kind ``tiktoken-file``): tiktoken-format rank files.

A rank file holds the merges only; the split pattern and the special tokens live in the code of
its family. That code is Meta's own ``Tokenizer`` class from the ``llama-models`` package, which
also ships the files: ``--encoding llama3`` is Meta's file read by Meta's class, and
``--encoding llama3:PATH`` another rank file of that family (a fine-tune's ``tokenizer.model``).
tiktoken's ``encode_ordinary`` with that pattern and those ranks is the reference.
"""
from __future__ import annotations

import hashlib
import importlib
from pathlib import Path


from ..errors import UserError
from ..wording import brief
from .encoders import LoadedEncoding
from .records import SourceFile, TiktokenParams
from .ranks import parse_ranks

FAMILIES = {"llama3": ("llama_models.llama3.tokenizer", "pat_str"),
            "llama4": ("llama_models.llama4.tokenizer", "O200K_PATTERN")}
"""Family → (Meta's module, the ``Tokenizer`` class attribute holding its split pattern)."""
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"


def family_and_path(spec: str) -> tuple[str, str | None] | None:
    """``llama3`` → ("llama3", None); ``llama3:PATH`` → ("llama3", PATH); anything else → None."""
    family, sep, path = spec.partition(":")
    if family not in FAMILIES:
        return None
    if sep and not path:
        raise UserError(f"--encoding {spec}: give the rank file after the colon, e.g. {family}:path/to/tokenizer.model")
    return family, (path or None)


def load(family: str, path: str | None = None) -> LoadedEncoding:
    """Meta's ``Tokenizer`` of ``family`` over ``path`` (default: the file ``llama-models`` ships)."""
    module_name, pattern_attr = FAMILIES[family]
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise UserError(f"--encoding {family} needs Meta's llama-models package: pip install llama-models "
                        "(or tokenshards[llama])") from e
    meta_class = module.Tokenizer
    file = Path(path).expanduser() if path else Path(module.__file__).parent / "tokenizer.model"
    try:
        data = file.read_bytes()
    except OSError as e:
        raise UserError(f"--encoding {family}:{path}: cannot read {file} ({e.strerror or type(e).__name__}); "
                        "give the path of a tiktoken-format tokenizer.model") from e
    ranks = parse_ranks(data, source=str(file))
    try:
        meta = meta_class(file)  # Meta's own class: its special tokens follow the file's last rank
    except Exception as e:  # noqa: BLE001  (whatever Meta's class raises for a file not of its family)
        raise UserError(f"--encoding {family}:{file}: Meta's {family} tokenizer cannot load it "
                        f"({type(e).__name__}: {brief(e, 160)})") from e
    name = family if path is None else f"{family}:{path}"
    params = TiktokenParams(name=name, pat_str=getattr(meta_class, pattern_attr), mergeable_ranks=ranks,
                            special_tokens=dict(meta.special_tokens))
    # Stable across installs (a venv elsewhere, a newer llama-models with the same file): the
    # files' sha256 say which vocabulary it is, the source where to find it again.
    source = f"llama-models {family}/tokenizer.model" if path is None else str(file)
    return LoadedEncoding(encoding=params.encoding(), params=params, source=source, kind="tiktoken-file",
                          files=(SourceFile(name=file.name, sha256=hashlib.sha256(data).hexdigest()),),
                          bos_name=BOS, eos_name=EOS, natural_boundary="bos")


def is_rank_file(data: bytes) -> bool:
    """Whether ``data`` starts like a tiktoken rank file (``BASE64 RANK`` lines)."""
    first = data[:256].split(b"\n", 1)[0].split()
    return len(first) == 2 and first[1].isdigit()
