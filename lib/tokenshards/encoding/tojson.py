"""tiktoken-style ranks as a Hugging Face ``tokenizer.json`` (+ ``tokenizer_config.json``).

So a vocabulary trained by ``train-bpe`` (or any tiktoken encoding) loads in
``transformers.AutoTokenizer`` and gives tiktoken's ``encode_ordinary`` ids. Built with the
``tokenizers`` library itself, as ``transformers``' ``TikTokenConverter`` does, with three
differences that matter for exactness:

- every split of a token into two tokens is a merge (``_merges``), not one merge per token:
  tiktoken joins any adjacent pair whose join is a token, whatever the parts' ranks (" první"
  from " pr" + "vní" in Meta's Llama 3 ranks), and ``tokenizers`` only joins listed pairs;
- the split pattern is rewritten for Oniguruma (``onig_pattern``): there ``x{1,3}+`` is not
  possessive but "one or more of x{1,3}", and ``$`` is the end of a *line*;
- special tokens keep tiktoken's ids, gaps included (cl100k_base has them).

The result is checked against tiktoken on awkward text before it is returned.
"""
from __future__ import annotations

import hashlib
import json
import os

import tiktoken

from ..errors import UserError
from .records import cache_root
from .patterns import onig_pattern

def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map that the ByteLevel pre-tokenizer and decoder use."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


_BYTE_CHARS = _bytes_to_unicode()


def _as_unicode(token: bytes) -> str:
    return "".join(_BYTE_CHARS[b] for b in token)


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """Every pair of tokens that joins into a token, by the joined token's rank (then the split's
    place): tiktoken merges *any* adjacent pair whose join is a token, lowest rank first, whatever
    the parts' own ranks. Llama 3 forms " první" (rank 104,909) from " pr" + "vní" (110,114): a
    merge list of only lower-ranked parts, or one split per token, gave other ids on ~3% of
    documents. A token with no such pair is only met whole: ``ignore_merges`` finds it."""
    merges = []
    for token, _ in sorted(ranks.items(), key=lambda kv: kv[1]):
        for i in range(1, len(token)):
            if token[:i] in ranks and token[i:] in ranks:
                merges.append((token[:i], token[i:]))
    return merges


def _check_inputs(mergeable_ranks: dict[bytes, int], special_tokens: dict[str, int]) -> None:
    missing = [b for b in range(256) if bytes([b]) not in mergeable_ranks]
    if missing:
        raise UserError(f"the ranks lack single byte(s) {', '.join(f'{b:#04x}' for b in missing[:5])}: a byte-level BPE "
                        "needs all 256 to encode any text; these ranks are not a byte-level vocabulary")
    ids = sorted(mergeable_ranks.values())
    if len(set(ids)) != len(ids):
        raise UserError("two tokens in the ranks share an id; the ranks file is damaged: retrain or reload it")
    taken = set(ids)
    for token, id_ in special_tokens.items():
        if id_ in taken:
            raise UserError(f"special token {token!r} has id {id_}, which a mergeable token or another special already has; "
                            "give special tokens ids after the last rank")
        taken.add(id_)
        if _as_unicode(token.encode()) == token and token.encode() in mergeable_ranks:
            raise UserError(f"special token {token!r} is also an ordinary token of the ranks (id {mergeable_ranks[token.encode()]}); "
                            "Hugging Face would give both the same id: choose another special token string")


def tokenizer_json(mergeable_ranks: dict[bytes, int], pat_str: str, special_tokens: dict[str, int]) -> str:
    """A Hugging Face tokenizer.json (byte-level BPE) whose ids equal tiktoken.Encoding(pat_str, ranks, specials).encode_ordinary for every text, with the special tokens as special added tokens."""
    try:  # heavy: tokenizers, for train-bpe's .hf/ folder only (bpe.train imports this module)
        from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError as e:
        raise UserError(f"a Hugging Face tokenizer.json needs the tokenizers package ({e}): pip install 'tokenizers>=0.20'") from e

    _check_inputs(mergeable_ranks, special_tokens)
    vocab = {_as_unicode(token): rank for token, rank in mergeable_ranks.items()}
    # tokenizers gives an added token the id its model knows for it, else the next free one: put a
    # special in the model's vocabulary only where the next free id would not be tiktoken's.
    next_id = max(mergeable_ranks.values()) + 1
    for token, id_ in sorted(special_tokens.items(), key=lambda kv: kv[1]):
        if id_ != next_id:
            vocab[token] = id_
        next_id = max(next_id, id_ + 1)
    merges = [(_as_unicode(a), _as_unicode(b)) for a, b in _merges(mergeable_ranks)]
    try:
        split = Regex(onig_pattern(pat_str))
    except Exception as e:  # tokenizers raises a bare Exception for a pattern Oniguruma rejects
        raise UserError(f"Hugging Face tokenizers (Oniguruma) cannot compile the split pattern {pat_str!r} ({e}); "
                        "use the gpt2 or cl100k pattern, or one both regex engines accept") from e
    tok = Tokenizer(models.BPE(vocab, merges, ignore_merges=True, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(split, behavior="isolated", invert=False),
        # offsets stay those of the text (a piece's leading space is part of it, as in tiktoken)
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(token, special=True, normalized=False)
                            for token in sorted(special_tokens, key=special_tokens.get)])
    wrong = {token: tok.token_to_id(token) for token, id_ in special_tokens.items() if tok.token_to_id(token) != id_}
    assert not wrong, f"special token ids not kept: {wrong}"  # our bug, never the user's doing
    _check_against_tiktoken(tok, mergeable_ranks, pat_str, special_tokens)
    return tok.to_str()


PROBES = [
    "Hello, world! Grüße aus Köln. Привет, мир. 你好，世界。こんにちは 🤖🦀 naïve café\n",
    "\tdef f(x):\n        return x ** 2  # ok?\r\n\u0000\ufffd\U0010ffff <|endoftext|> 1234567890 ",
    "don't I'LL WE'VE ſ K 12345678 1,000.5 x   \n\n  \n y  ", "a  \nb\n\n", "   ", "\n", "x\r\n\r\n\t ",
    "e\u0301 \ufeff \u200b \u00a0a\u3000b \u2028 \u0085 ½ ² ٣ 𝟘 ǅ Ⅻ", "<|fim_prefix|><|endofprompt|> <|im_start|>",
]
"""Where the two regex engines could part ways: lines ending in spaces, digit runs, case folding
(ſ, K), Unicode spaces, letters and numbers outside ASCII, special-token strings as text."""


def _check_against_tiktoken(tok, ranks: dict[bytes, int], pat_str: str, special_tokens: dict[str, int]) -> None:
    """Cheap insurance that the rewritten pattern splits as tiktoken's does (a custom pattern may not)."""
    encoding = tiktoken.Encoding(name="tojson-check", pat_str=pat_str, mergeable_ranks=ranks, special_tokens=special_tokens)
    texts = PROBES + list(special_tokens)
    tok.encode_special_tokens = True  # special-token strings in the text are text, as in encode_ordinary
    try:
        got = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    finally:
        tok.encode_special_tokens = False
    for text, ids in zip(texts, got):
        want = encoding.encode_ordinary(text)
        if ids != want:
            raise UserError(f"the Hugging Face tokenizer built from pattern {pat_str!r} gives other ids than tiktoken for "
                            f"{text[:40]!r} ({ids[:8]} vs {want[:8]}): Oniguruma and fancy-regex split it differently, or the "
                            "pattern leaves characters unmatched (tiktoken drops those); use the gpt2 or cl100k pattern")


def tokenizer_config_json(special_tokens: dict[str, int], *, eos: str | None, bos: str | None = None,
                          model_max_length: int | None = None) -> str:
    """tokenizer_config.json that transformers.PreTrainedTokenizerFast / AutoTokenizer load beside it."""
    for role, token in (("eos", eos), ("bos", bos)):
        if token is not None and token not in special_tokens:
            raise UserError(f"{role}={token!r} is not one of the special tokens ({', '.join(special_tokens) or 'none'}); "
                            "pass one of them or None")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": {
            str(id_): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                       "single_word": False, "special": True}
            for token, id_ in sorted(special_tokens.items(), key=lambda kv: kv[1])
        },
        "eos_token": eos,
        "bos_token": bos,
        # False: decode(encode(text)) == text; cleaning would drop spaces before punctuation.
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
    }
    if model_max_length is not None:
        config["model_max_length"] = model_max_length
    return json.dumps(config, indent=2, ensure_ascii=False) + "\n"


CONVERSION = 2
"""Bumped whenever ``tokenizer_json``'s output changes (2: every split a merge), so a kept conversion
of an older one is never read back."""


def kept_tokenizer_json(mergeable_ranks: dict[bytes, int], pat_str: str) -> str:
    """``tokenizer_json(ranks, pat_str, {})``, kept on disk after the first time: converting Meta's
    128k Llama 3 ranks takes ~2-4 s per process (client, forkserver, each worker), reading it back
    well under 0.1 s. The backend built from it is verified against tiktoken as any other, so a
    kept file can never change a run's ids unnoticed."""
    digest = hashlib.sha256(b"%d\0%s\0" % (CONVERSION, pat_str.encode()))
    for token, rank in mergeable_ranks.items():  # length-prefixed: no two rank sets hash alike
        digest.update(len(token).to_bytes(2, "little") + token + rank.to_bytes(4, "little"))
    return kept_text(digest.hexdigest(), lambda: tokenizer_json(mergeable_ranks, pat_str, {}))


def kept_text(key: str, make) -> str:
    """``make()``'s text, kept on disk after the first time under ``key`` (a sha256 of everything
    that decides it). The file is named by the key and by its own content's sha256, which is
    checked on reading (a damaged file is made again); a read-only home makes it again each time."""
    folder = cache_root() / "tokenizer-json"
    for path in folder.glob(f"{key}-*.json"):
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.stem.endswith("-" + hashlib.sha256(data).hexdigest()[:16]):
            return data.decode("utf-8")
    text = make()
    data = text.encode("utf-8")
    path = folder / f"{key}-{hashlib.sha256(data).hexdigest()[:16]}.json"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: made again next time
    return text
