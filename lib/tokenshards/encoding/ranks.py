"""A trained vocabulary on disk: ``NAME.tiktoken`` (tiktoken's ranks format) + ``NAME.tiktoken.json``.

The ranks file is exactly what ``tiktoken.load.load_tiktoken_bpe`` reads (base64 bytes, space,
rank, one a line). Its JSON sidecar carries what tiktoken needs besides the ranks (the split
pattern, the special tokens, n_vocab) and the sha256 of the ranks file, so a sidecar never
pairs with another run's ranks. The sidecar is written last: its presence commits the pair.

We read the bytes ourselves (fsspec) instead of calling ``load_tiktoken_bpe`` on the path:
tiktoken caches every path it reads under the sha1 of the *path*, so a file retrained in place
would be served stale from that cache.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import posixpath
import uuid

import tiktoken

from ..errors import UserError
from ..storage.store import check_bucket, filesystem, is_local, write_atomic
from .records import TiktokenParams

FORMAT = "tokenshards-bpe/1"
SUFFIX = ".tiktoken"
ENDOFTEXT = "<|endoftext|>"
ROUND_TRIP_PROBE = (
    "Hello, world! Grüße aus Köln. Привет, мир. 你好，世界。こんにちは 🤖🦀 naïve café\n"
    "\tdef f(x):\n        return x ** 2  # ok?\r\n\u0000\ufffd\U0010ffff <|endoftext|> 1234567890 "
)
"""Covers scripts, emoji, control characters, a tab, CRLF and the special token's text."""


def sidecar_path(path: str) -> str:
    return path + ".json"


def encoding_name(path: str) -> str:
    """``.../my.tiktoken`` → ``my``: what the manifest records as the encoding's name."""
    return posixpath.basename(path)[: -len(SUFFIX)] or "trained"


def dump_ranks(ranks: dict[bytes, int]) -> bytes:
    """tiktoken's format, as ``tiktoken.load.dump_tiktoken_bpe`` writes it (which needs blobfile)."""
    return b"".join(base64.b64encode(token) + b" %d\n" % rank
                    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]))


def parse_ranks(data: bytes, *, source: str) -> dict[bytes, int]:
    """The inverse of ``dump_ranks``; a bad line names the file and line number."""
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as e:
            raise UserError(f"{source}: line {number} is not `BASE64 RANK` ({line[:60]!r}); "
                            "the file is damaged: retrain it with `tokenshards train-bpe`") from e
    return ranks


def problems(ranks: dict[bytes, int]) -> list[str]:
    """Pure self-consistency check; an empty list means the ranks make a sound byte-level BPE:
    ranks are 0..n-1 without gaps or repeats, the 256 single bytes come first (rank = byte),
    and every longer token is the concatenation of two tokens of lower rank (an earlier merge)."""
    found: list[str] = []
    by_rank = sorted(ranks.items(), key=lambda kv: kv[1])
    if sorted(ranks.values()) != list(range(len(ranks))):
        found.append(f"ranks are not 0..{len(ranks) - 1} each once")
    for b in range(256):
        if ranks.get(bytes([b])) != b:
            found.append(f"single byte {b:#04x} does not have rank {b}")
            break
    for token, rank in by_rank:
        if len(token) < 2:
            continue
        if not any(ranks.get(token[:i], rank) < rank and ranks.get(token[i:], rank) < rank for i in range(1, len(token))):
            found.append(f"rank {rank} ({token!r}) is not two earlier tokens joined")
            if len(found) > 5:
                break
    return found


def round_trip_failures(encoding: tiktoken.Encoding, texts: list[str]) -> list[str]:
    """Texts that do not come back unchanged from encode_ordinary → decode (first 60 chars each)."""
    bad = []
    for text in texts:
        if encoding.decode(encoding.encode_ordinary(text)) != text:
            bad.append(text[:60])
    return bad


def encoding_params(*, name: str, pat_str: str, ranks: dict[bytes, int], specials: list[str]) -> TiktokenParams:
    """A trained vocabulary's encoding: special tokens take the ids after the last rank."""
    special_tokens = {token: len(ranks) + i for i, token in enumerate(specials)}
    return TiktokenParams(name=name, pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special_tokens,
                          explicit_n_vocab=len(ranks) + len(special_tokens))


def write_trained(out: str, *, params: TiktokenParams, pattern_name: str, stats: dict, storage_options: dict | None = None) -> None:
    """Write the ranks file, then the sidecar that names its sha256 (the commit point)."""
    data = dump_ranks(params.mergeable_ranks)
    sidecar = {
        "format": FORMAT,
        "name": params.name,
        "pattern": pattern_name,
        "pat_str": params.pat_str,
        "special_tokens": params.special_tokens,
        "n_vocab": params.explicit_n_vocab,
        "mergeable_ranks": len(params.mergeable_ranks),
        "ranks_sha256": hashlib.sha256(data).hexdigest(),
        "training": stats,
    }
    fs, path = filesystem(out, storage_options)
    try:
        _make_parent(fs, path)
        write_atomic(fs, path, data)
        write_atomic(fs, sidecar_path(path), (json.dumps(sidecar, indent=1, ensure_ascii=False) + "\n").encode())
    except OSError as e:
        raise UserError(f"cannot write {out!r}: {type(e).__name__}: {e}; choose another --out or fix its permissions") from e


def check_writable(out: str, storage_options: dict | None = None) -> None:
    """Fail before training when OUT's folder cannot be written (a probe file, then removed)."""
    fs, path = filesystem(out, storage_options)
    check_bucket(fs, path, out, what="--out")  # s3fs's makedirs would create a missing bucket; tokenize never does
    probe = f"{path}.{uuid.uuid4().hex}.probe"
    try:
        _make_parent(fs, path)
        write_atomic(fs, probe, b"ok")
        fs.rm(probe)
    except OSError as e:
        raise UserError(f"cannot write {out!r}: {type(e).__name__}: {e}; choose another --out or fix its permissions") from e


def _make_parent(fs, path: str) -> None:
    """A local folder is made; object stores have none to make (and a bucket is never created)."""
    parent = posixpath.dirname(path)
    if parent and is_local(fs):
        fs.makedirs(parent, exist_ok=True)


def _read(url: str, storage_options: dict | None, what: str, *, ranks_path: str) -> bytes:
    fs, path = filesystem(url, storage_options)
    try:
        with fs.open(path, "rb") as f:
            return f.read()
    except FileNotFoundError as e:
        raise UserError(f"{what} {url!r} not found; train one with `tokenshards train-bpe --out {ranks_path}`") from e
    except OSError as e:
        raise UserError(f"cannot read {what} {url!r}: {type(e).__name__}: {e}") from e


def load_trained(path: str, *, storage_options: dict | None = None) -> tuple[tiktoken.Encoding, TiktokenParams]:
    """A ``.tiktoken`` written by ``train-bpe`` (local path or URL) as (encoding, its parameters),
    checked against its sidecar's hash and for self-consistency before anything uses it."""
    meta_url = sidecar_path(path)
    try:
        meta = json.loads(_read(meta_url, storage_options, "encoding sidecar", ranks_path=path))
    except ValueError as e:
        raise UserError(f"{meta_url}: not valid JSON ({e}); retrain with `tokenshards train-bpe`") from e
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{meta_url}: not a {FORMAT} sidecar (format={meta.get('format') if isinstance(meta, dict) else None!r}); "
                        "retrain with `tokenshards train-bpe`")
    data = _read(path, storage_options, "ranks file", ranks_path=path)
    digest = hashlib.sha256(data).hexdigest()
    if digest != meta.get("ranks_sha256"):
        raise UserError(f"{path}: sha256 {digest[:16]}… differs from the one its sidecar {meta_url} records "
                        f"({str(meta.get('ranks_sha256'))[:16]}…); the two files come from different runs: retrain, or copy both together")
    ranks = parse_ranks(data, source=path)
    found = problems(ranks)
    if found:
        raise UserError(f"{path}: not a consistent BPE vocabulary ({'; '.join(found[:3])}); retrain with `tokenshards train-bpe`")
    specials = sorted(meta["special_tokens"], key=meta["special_tokens"].get)
    # Named by the path as given, so the manifest's encoding name is what reloads it
    # (``verify --deep`` calls load_encoding(name)).
    params = encoding_params(name=path, pat_str=meta["pat_str"], ranks=ranks, specials=specials)
    if params.special_tokens != meta["special_tokens"] or params.explicit_n_vocab != meta.get("n_vocab"):
        raise UserError(f"{meta_url}: special tokens or n_vocab do not follow the {len(ranks)} ranks in {path}; retrain with `tokenshards train-bpe`")
    try:
        encoding = params.encoding()
    except ValueError as e:
        raise UserError(f"{path}: tiktoken rejects this vocabulary ({e}); retrain with `tokenshards train-bpe`") from e
    return encoding, params
