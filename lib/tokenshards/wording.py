"""Small helpers for the sentences the commands print: counts, sizes, causes."""
from __future__ import annotations

import re


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``1 file``, ``2 files``, ``1,024 partitions``: a count with its noun in the right number."""
    return f"{n:,} {noun if n == 1 else (plural or noun + 's')}"


def brief(text: object, width: int = 200) -> str:
    """An error's text for one line: whitespace collapsed, cut at a word with `` …`` past
    ``width`` (a hard cut left "NameResolutio" behind)."""
    import textwrap

    flat = " ".join(str(text).split())
    return textwrap.shorten(flat, width=width, placeholder=" …") if len(flat) > width else flat


def human(n: float) -> str:
    """At most 6 characters below 1000P (``999``, ``999.9k``): a value that rounds up to 1000
    moves to the next unit (``1.0k``, not ``1000``)."""
    for unit in ("", "k", "M", "G", "T"):
        if abs(round(n, 1 if unit else 0)) < 1000:
            return f"{n:.1f}{unit}" if unit else f"{n:.0f}"
        n /= 1000
    return f"{n:.1f}P"


HUMAN_WIDTH = 6
"""``human``'s widest output below 1000P; the bar pads its numbers to it."""


# -- secrets: never said -----------------------------------------------------------------------------

HIDDEN = "<hidden>"
"""What a secret becomes in anything this process says."""

_SECRET_QUERY = re.compile(
    r"(?i)([?&;](?:access_token|id_token|refresh_token|token|sig|signature|x-amz-signature|x-amz-credential"
    r"|x-amz-security-token|awsaccesskeyid|key|client_secret|password|assertion|code)=)(?!<hidden>)[^&\s'\"#;)>]+")
"""A URL's query parameters that carry a credential: gcsfs's tokeninfo request (``access_token``), an
Azure SAS (``sig``), a presigned S3 URL (``X-Amz-Signature``, ``X-Amz-Credential``, ...)."""

_SECRET_FIELD = re.compile(
    r"(?i)((?:AccountKey|SharedAccessSignature|SharedAccessKey|Password|pwd)=)(?!<hidden>)[^;\s'\"]+"  # connection strings
    r"|((?:^|[\s{,(])['\"]?(?:private_key|private_key_id|client_secret|refresh_token|access_token|token|secret"
    r"|key|account_key|sas_token|connection_string|credential|aws_secret_access_key|aws_session_token"
    r"|aws_access_key_id)['\"]?\s*[:=]\s*)(['\"])(?:[^'\"\\]|\\.)*\3"  # JSON or a dict's repr
    r"|(authorization['\"]?\s*[:=]\s*['\"]?)(?!\s*['\"]?<hidden>)[^'\"\n{}]*[^'\"\n{}\s]")  # a header, as logged
_PRIVATE_KEY = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)", re.S)
_TOKEN_SHAPES = re.compile(r"\bya29\.[\w.-]+|\bhf_[A-Za-z0-9]{20,}|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
"""Credentials recognisable by their shape: Google OAuth access tokens, Hugging Face tokens, AWS key ids."""

_KNOWN: set[str] = set()
_LONGEST_FIRST: list[str] = []
"""``_KNOWN``, longest first (a connection string before the key inside it)."""
SHORTEST_SECRET = 8
"""Shorter values are not hidden by value (they would hide ordinary words); their fields still are."""


def hide(*values: object) -> None:
    """Remember credentials this process holds (storage options, tokens from the environment), so that
    ``scrub`` hides them wherever they turn up, in whatever form an error quotes them (as given,
    URL-encoded or decoded). Process-wide on purpose: a secret is one whatever object carries it, and a worker
    learns its secrets when it unpickles the storage options a task brought."""
    from urllib.parse import quote, quote_plus, unquote

    new = {form for value in values if isinstance(value, str) and len(value) >= SHORTEST_SECRET
           for form in (value, quote(value, safe=""), quote_plus(value), quote(value), unquote(value))
           if len(form) >= SHORTEST_SECRET} - _KNOWN
    if new:
        _KNOWN.update(new)
        _LONGEST_FIRST[:] = sorted(_KNOWN, key=len, reverse=True)
        _scrub_log_records()


def _scrub_log_records() -> None:
    """From the moment this process holds a credential, every log record it makes is scrubbed: the
    libraries it drives log requests, URLs and errors (urllib3 a URL with its query, botocore a
    request's headers at DEBUG, distributed a failed task's error), to whatever handler the user or
    Dask set up, and their texts are not ours to word. Installed once, as logging's record factory."""
    import logging

    previous = logging.getLogRecordFactory()
    if getattr(previous, "scrubs", False):
        return

    def factory(*args, **kwargs):
        record = previous(*args, **kwargs)
        try:
            message = record.getMessage()
            clean = scrub(message)
            if clean != message:
                record.msg, record.args = clean, ()
            if record.exc_info and record.exc_info[1] is not None:
                scrub_exception(record.exc_info[1])
        except Exception:  # noqa: BLE001 -- a record logging itself cannot format: logging says so later
            pass
        return record

    factory.scrubs = True
    logging.setLogRecordFactory(factory)


def scrub(text: str) -> str:
    """``text`` without credentials: the one function that hides them, applied where errors are worded
    (``UserError``), where a store's failure leaves the retry policy (``storage.retry``) and where
    warnings are said. Known values first (longest first: a connection string before its key), then
    query parameters, secret fields and private keys, then tokens known by their shape."""
    if not text:
        return text
    for value in _LONGEST_FIRST:
        if value in text:
            text = text.replace(value, HIDDEN)
    text = _SECRET_QUERY.sub(lambda m: m.group(1) + HIDDEN, text)
    text = _SECRET_FIELD.sub(_hide_field, text)
    text = _PRIVATE_KEY.sub(HIDDEN, text)
    return _TOKEN_SHAPES.sub(HIDDEN, text)


def _hide_field(m: re.Match) -> str:
    if m.group(1):
        return m.group(1) + HIDDEN
    if m.group(2):
        return f"{m.group(2)}{m.group(3)}{HIDDEN}{m.group(3)}"
    return m.group(4) + HIDDEN


def scrub_exception(e: BaseException) -> BaseException:
    """``e`` and the errors it carries (its cause, its context), their texts scrubbed in place, so that
    what is said of them anywhere (a task's error on the dashboard, a worker's log, ``--debug``'s
    traceback) holds no credential. Arguments that are not text (numbers, a botocore error's reply)
    stay as they are; one whose text changed becomes that text."""
    seen: set[int] = set()
    first = e
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        try:
            e.args = tuple(_scrubbed_arg(a) for a in e.args)
            for name in ("message", "msg", "reason", "strerror", "filename"):  # kept apart from args by some
                value = getattr(e, name, None)
                if isinstance(value, str) and scrub(value) != value:
                    setattr(e, name, scrub(value))
        except (AttributeError, TypeError):  # a read-only attribute: what str() gives is scrubbed where said
            pass
        e = e.__cause__ or e.__context__
    return first


def _scrubbed_arg(arg: object) -> object:
    if isinstance(arg, (int, float, bool, type(None), dict, list, tuple)):
        return arg
    text = str(arg)
    clean = scrub(text)
    return arg if clean == text else clean
