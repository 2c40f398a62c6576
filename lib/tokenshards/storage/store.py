"""Storage edge: one fsspec code path for local folders, s3://, gs:// and az:// (and anything fsspec opens).

Writes are atomic: a reader sees a whole object or none.
- Locally: a temporary name in the same folder, then ``os.replace`` (as tiktoken's cache does).
- On S3, small objects go in one PutObject whose body is complete before the request starts,
  so S3 stores all of it or nothing. Large ones go through an ``autocommit=False`` file: a
  multipart upload that only ``commit()`` completes; on any error it is aborted, and a process
  killed mid-upload leaves an incomplete multipart upload, which no listing or reader sees.
  (A plain ``with fs.open(...)`` would not do: s3fs commits on ``close()`` even while an
  exception unwinds, publishing a truncated object.)
- On Google Cloud Storage, small objects go in one media upload (the body is the object), stored whole
  or not at all; large ones in a resumable upload whose chunks say "total unknown" until
  ``commit()`` sends the last one with the total: only that request creates the object. A process
  killed before it leaves an unfinished session, never an object (GCS drops it after a week).
- On Azure Blob Storage, small objects go in one Put Blob; large ones are staged as blocks and
  appear only when the block list is committed (adlfs does that in ``close()``, after the last
  ``write``): a process killed before it leaves uncommitted blocks, which no listing or reader
  sees and Azure discards after a week (or when the name is written again).
- Elsewhere: the same ``autocommit=False`` file, committed only on success.

An export writes each file as numbered parts from many tasks at once (``begin_parts``, ``put_part``,
``commit_parts``): S3's multipart upload; on GCS, part objects in a hidden folder beside the file,
composed into it by the last request; on Azure, blocks staged by the tasks and committed as one
block list. In every case the file appears whole, in one request, or not at all.

Storage options are one mapping for every URL of a run: s3fs's keys go to S3, and the sections
``gcs`` and ``azure`` (JSON objects) go to gcsfs and adlfs only, over the plain keys that are not
s3fs's own (so an S3 input and a GCS output can be given in one command); the section ``retry`` sets
the one retry policy (``retry``) that every request to S3, GCS and Azure follows (``clients``).

Every process builds its own filesystem objects from (URL, storage options): the options travel
in the task graph, never an ``S3FileSystem`` (its event loop and connections belong to one
process). fsspec's instance cache is keyed by process id, so nothing built before a fork is reused.
"""
from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import posixpath
import re
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import fsspec

from ..errors import UserError
from ..wording import hide
from . import clients
from .clients import (AZURE_PROTOCOLS, GCS_PROTOCOLS, S3_PROTOCOLS, is_azure, is_gcs, is_local, is_object_store,  # noqa: F401
                      is_s3)
from .failures import _endpoint, _is_auth_failure, _is_denied, _one_line, storage_error, write_advice  # noqa: F401
from .retry import OPTION as RETRY_OPTION
from .retry import RetryPolicy

MIB = 2**20
MULTIPART_THRESHOLD = 8 * MIB
"""Objects below this go in one PUT (boto3's and the AWS CLI's default threshold)."""
PART_BYTES = 8 * MIB
"""Smallest multipart part (S3's floor is 5 MiB); grown for huge objects, see ``part_size``."""
MAX_PARTS = 10_000
"""S3's limit on parts per multipart upload."""


class StorageOptions(dict):
    """fsspec storage options whose repr hides values: a failing task's spec is logged by
    distributed ("Compute Failed ... Task: ..."), and credentials must never be printed. Made (or
    unpickled, on a worker), it tells ``wording.hide`` the credentials it holds, so that no error
    this process words can quote them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        hide(*secret_values(self))

    def __repr__(self) -> str:
        return f"StorageOptions(keys={sorted(self)})"

    __str__ = __repr__

    def __reduce__(self):
        return (StorageOptions, (dict(self),))


SECTIONS = {"gcs": GCS_PROTOCOLS, "azure": AZURE_PROTOCOLS}
"""Storage options meant for one store only: ``{"gcs": {...}, "azure": {...}}``."""
AZURE_CREDENTIAL_OPTIONS = ("connection_string", "account_name", "account_key", "sas_token", "credential", "anon")
S3_ONLY_OPTIONS = ("client_kwargs", "config_kwargs", "s3_additional_kwargs", "key", "secret")
"""s3fs's options that mean something else (or nothing) to gcsfs and adlfs: kept from them."""

SECRET_KEYS = frozenset({
    "key", "secret", "token", "hf_token", "hugging_face_hub_token", "azure_storage_account_key", "azure_storage_sas_token",
    "azure_storage_connection_string", "azure_client_secret", "session_token", "aws_access_key_id", "aws_secret_access_key", "aws_session_token",
    "account_key", "sas_token", "connection_string", "credential", "client_secret", "password", "private_key",
    "private_key_id", "refresh_token", "access_token"})
"""Option names (at any depth: ``client_kwargs``, the ``gcs``/``azure`` sections, a service account's
JSON given as the token) whose values are credentials."""


def secret_values(options, *, depth: int = 0) -> list[str]:
    """Every credential in ``options``: the values of ``SECRET_KEYS``, a connection string's key or SAS,
    a SAS's signature, and the secret fields of a service-account or authorized-user file named as a token."""
    found: list[str] = []
    for name, value in (options.items() if isinstance(options, dict) else ()):
        if isinstance(value, dict) and depth < 3:
            found += secret_values(value, depth=depth + 1)
        elif isinstance(value, str) and name in SECRET_KEYS:
            if name == "token" and (value in ("anon", "google_default", "cache", "cloud", "browser")
                                    or value.endswith(".json") or os.path.isfile(value)):  # a method, or a file
                found += _credential_file_secrets(value)
                continue
            found.append(value)
            for part in value.split(";"):  # a connection string's key or SAS
                field, _, inner = part.partition("=")
                if field.strip().lower() in ("accountkey", "sharedaccesssignature"):
                    found.append(inner)
            for part in re.split(r"[;&?]", value):  # a SAS's signature, alone or in a connection string
                field, _, inner = part.partition("=")
                if field.strip().lower() == "sig":
                    found.append(inner)
    return found


def _credential_file_secrets(path: str) -> list[str]:
    """The secret fields of a credentials file named as a GCS token (its path is no secret; on a
    worker that lacks the file, nothing)."""
    if not os.path.isfile(path):
        return []
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return []
    return [v for k, v in data.items() if k in SECRET_KEYS and isinstance(v, str)] if isinstance(data, dict) else []


MAPPING_OPTIONS = ("client_kwargs", "config_kwargs", "s3_additional_kwargs", RETRY_OPTION, *SECTIONS)
"""Options whose value is itself a mapping (on the command line: a JSON object)."""


def storage_options(options: dict | None) -> StorageOptions:
    """Checked and wrapped once, where every job's options are made (``RunOptions``); everything
    downstream, tasks included, passes the wrapped mapping on. A value of the wrong shape is one
    line here, not a traceback from deep inside s3fs on some worker."""
    if isinstance(options, StorageOptions):
        return options
    options = dict(options or {})
    for key in MAPPING_OPTIONS:
        if key in options and not isinstance(options[key], dict):
            # The value is not shown: it may hold a secret.
            raise UserError(f"--storage-option {key}: expected a JSON object, e.g. {key}={{\"region_name\": \"eu-west-1\"}}, "
                            f"got a {type(options[key]).__name__}; endpoint_url=... and region_name=... may also be given "
                            "on their own")
    RetryPolicy.of(options)  # its settings checked here, once
    return StorageOptions(options)


ENVIRONMENT_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY",
                       "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING", "AZURE_CLIENT_SECRET", "HF_TOKEN",
                       "HUGGING_FACE_HUB_TOKEN")
"""Credentials the libraries we drive read from the environment themselves."""


def with_env_endpoint(options: dict, environ) -> StorageOptions:
    """``options`` plus the endpoint named by ``AWS_ENDPOINT_URL_S3`` / ``AWS_ENDPOINT_URL`` (botocore's
    precedence) unless the options name one. Read once on the client and shipped with the
    options, so workers on other machines reach the same S3-compatible store (MinIO, R2, Ceph).

    Likewise ``STORAGE_EMULATOR_HOST`` (the Google clients' name for a GCS emulator) becomes the
    ``gcs`` section's ``endpoint_url``, anonymous unless a token is given, as the Google clients
    treat it, and ``GOOGLE_APPLICATION_CREDENTIALS`` its ``token`` (so a broken file is an error, not
    gcsfs's silent fall back to anonymous; each worker needs the file at that path).

    Azure's credentials from the environment (``AZURE_STORAGE_CONNECTION_STRING``, or
    ``AZURE_STORAGE_ACCOUNT_NAME`` with ``..._ACCOUNT_KEY`` or ``..._SAS_TOKEN``) go in the ``azure``
    section unless it names some: they travel to the workers inside the wrapped options, never printed.
    (An account name alone, as for an Azure AD identity, is shipped without a secret.)

    The credentials the environment holds (``ENVIRONMENT_SECRETS``) are hidden from every message
    this process words from here on (``wording.hide``), whether they reach the options or not."""
    hide(*secret_values({name.lower(): environ.get(name) for name in ENVIRONMENT_SECRETS}))
    options = storage_options(options)
    emulator = environ.get("STORAGE_EMULATOR_HOST")
    gcs = dict(options.get("gcs") or {})
    if emulator and emulator != "default" and not gcs.get("endpoint_url"):
        gcs["endpoint_url"] = emulator if emulator.startswith(("http://", "https://")) else f"http://{emulator}"
        if "token" not in gcs and "token" not in options and not environ.get("GOOGLE_APPLICATION_CREDENTIALS"):
            gcs["token"] = "anon"
    if environ.get("GOOGLE_APPLICATION_CREDENTIALS") and "token" not in gcs and "token" not in options:
        gcs["token"] = environ["GOOGLE_APPLICATION_CREDENTIALS"]
    if gcs != (options.get("gcs") or {}):
        options = storage_options({**options, "gcs": gcs})
    azure = dict(options.get("azure") or {})
    if not any(k in azure or k in options for k in AZURE_CREDENTIAL_OPTIONS):
        if environ.get("AZURE_STORAGE_CONNECTION_STRING"):
            azure["connection_string"] = environ["AZURE_STORAGE_CONNECTION_STRING"]
        elif environ.get("AZURE_STORAGE_ACCOUNT_NAME"):
            azure["account_name"] = environ["AZURE_STORAGE_ACCOUNT_NAME"]
            for key, name in (("account_key", "AZURE_STORAGE_ACCOUNT_KEY"), ("sas_token", "AZURE_STORAGE_SAS_TOKEN")):
                if environ.get(name):
                    azure[key] = environ[name]
        if azure:
            options = storage_options({**options, "azure": azure})
    endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if not endpoint or options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url"):
        return options
    return storage_options({**options, "client_kwargs": {**(options.get("client_kwargs") or {}), "endpoint_url": endpoint}})


def filesystem(url: str, storage_options: dict | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """(filesystem, path inside it) for a local path or URL; each process builds its own. S3, GCS and
    Azure send every request through the one retry policy (``retry``; its settings are the storage
    options' ``retry`` section), through their classes in ``clients``.

    Cached listings are dropped: other processes (workers, an earlier run) write behind this
    instance's back, and resume must see what is really there.
    """
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    options = options_for(protocol, storage_options)
    try:
        if protocol in GCS_PROTOCOLS or protocol in AZURE_PROTOCOLS:
            fs, path = _cloud_filesystem(url, protocol, options, RetryPolicy.of(storage_options))
        elif protocol in S3_PROTOCOLS:
            fs, path = clients.s3_filesystem(url, options, RetryPolicy.of(storage_options))
        else:
            fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as e:
        extra = "gcs" if protocol in GCS_PROTOCOLS else "azure" if protocol in AZURE_PROTOCOLS else None
        hint = f"pip install 'tokenshards[{extra}]'" if extra else "install the package it names"
        raise UserError(f"cannot open {url!r}: {_one_line(e)}; {hint}") from e
    except (ValueError, TypeError) as e:
        # TypeError: an option the filesystem does not take (the message names the key, not values).
        raise UserError(f"cannot open {url!r}: {_one_line(e)}; check the URL and --storage-option keys") from e
    if is_s3(fs):
        _connect(fs, url)
    fs.invalidate_cache()
    return fs, path


def options_for(protocol: str, options: dict | None) -> dict:
    """The options ``protocol``'s filesystem is built with: without the other stores' sections (nor
    the retry policy's, which ``filesystem`` reads), and for GCS and Azure without s3fs's own keys,
    their own section laid over the rest."""
    options = dict(options or {})
    options.pop(RETRY_OPTION, None)
    sections = {name: options.pop(name, None) or {} for name in SECTIONS}
    for name, protocols in SECTIONS.items():
        if protocol in protocols:
            options = {k: v for k, v in options.items() if k not in S3_ONLY_OPTIONS}
            options.update(sections[name])
    return options


def _cloud_filesystem(url: str, protocol: str, options: dict, policy: RetryPolicy):
    """gcsfs and adlfs load credentials when built (a service-account file, a connection string, a
    raw token's expiry asked of Google): what they raise for a broken one (KeyError, ValueError,
    google.auth's errors, a tokeninfo request that failed) is one line."""
    gcs = protocol in GCS_PROTOCOLS
    try:
        return clients.gcs_filesystem(url, options, policy) if gcs else clients.azure_filesystem(url, options, policy)
    except (ImportError, UserError):
        raise
    except Exception as e:
        where = ("GOOGLE_APPLICATION_CREDENTIALS or --storage-option gcs='{\"token\": ...}'" if gcs else
                 "AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME/..._KEY or --storage-option azure='{...}'")
        tokeninfo = ""
        named, asked = "tokeninfo" in str(e), _failed_request_url(e)
        if gcs and (named or "tokeninfo" in asked):
            # gcsfs asks Google for a raw token's expiry, with the token in the URL (scrubbed by UserError).
            # A timeout's text names the host only: the request's URL is said then.
            shown = "" if named else f" ({asked})"
            tokeninfo = (f"; gcsfs asks Google's tokeninfo endpoint for a raw token's expiry{shown}: where that "
                         "endpoint cannot be reached, set FETCH_RAW_TOKEN_EXPIRY=false (on every worker too)")
        raise UserError(f"cannot open {url!r}: its credentials could not be loaded ({type(e).__name__}: {_one_line(e)}); "
                        f"check {where} and the --storage-option keys{tokeninfo}") from e


def _failed_request_url(e: BaseException) -> str:
    """The URL of the HTTP request behind ``e`` or an error it carries (requests' errors hold their
    request; a ReadTimeout's text names only the host), or ''."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        url = getattr(getattr(e, "request", None), "url", None)
        if isinstance(url, str):
            return url
        e = e.__cause__ or e.__context__
    return ""


def _connect(fs: fsspec.AbstractFileSystem, url: str) -> None:
    """s3fs builds its botocore client at the first request, deep inside whatever made it: an
    option botocore does not take (inside ``client_kwargs``, say) is found here instead, in one
    line. Once per filesystem instance (fsspec caches them); no request is sent."""
    try:
        fs.connect()
    except (TypeError, ValueError) as e:
        raise UserError(f"cannot open {url!r}: s3fs/botocore did not accept the storage options ({_one_line(e)}); "
                        "check the --storage-option keys and what client_kwargs/config_kwargs hold") from e


def join(root: str, *parts: str) -> str:
    return posixpath.join(root, *parts)


def display_url(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The path as a user would type it (``s3://bucket/key``; local paths stay plain)."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def part_size(nbytes: int) -> int:
    """Multipart part size for an object of ``nbytes``: ``PART_BYTES``, or more (whole MiB) when
    the object would otherwise need more than S3's 10,000 parts."""
    needed = -(-nbytes // MAX_PARTS)
    return max(PART_BYTES, -(-needed // MIB) * MIB)


IDENTITY_KEYS = ("ETag", "VersionId", "generation", "md5Hash", "etag", "version_id", "LastModified", "last_modified",
                 "mtime")
"""What fsspec stores report beside the size that changes when an object is replaced (S3, GCS, ...)."""


def file_identity(fs: fsspec.AbstractFileSystem, path: str) -> tuple[tuple[str, object], ...]:
    """What tells this version of a file from a replacement: its size plus what the store offers
    (local: mtime in ns; S3: ETag and version id; a Hugging Face cache blob: its content-hash name;
    a file huggingface_hub downloaded into a folder: the etag its record vouches for).
    A tuple of pairs, so the frozen plan objects holding it stay hashable.

    The Hub's two kinds are ("size", "blob") alike and known from the Hub's listing, before the
    file is here: a run can plan a file while it downloads and find that identity once it lands."""
    if is_local(fs):
        st = os.stat(path)
        real = os.path.realpath(path)
        if os.path.basename(os.path.dirname(real)) == "blobs":
            # huggingface_hub names cache blobs by their hash: a re-download is the same file.
            return (("size", st.st_size), ("blob", os.path.basename(real)))
        etag = vouched_etag(path, st)
        if etag is not None:
            return (("size", st.st_size), ("blob", etag))
        return _stat_identity(st)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        raise
    except Exception as e:  # a refusal, a failure the retry policy gave up on: one line, whoever asked
        if not is_object_store(fs):
            raise
        raise storage_error(e, display_url(fs, path), what="cannot read", fs=fs) from e
    found = [("size", info.get("size"))]
    found += [(k, str(info[k])) for k in IDENTITY_KEYS if info.get(k) not in (None, "")]
    if any(k in ("ETag", "etag", "VersionId", "generation", "md5Hash") for k, _ in found):
        found = [(k, v) for k, v in found if k not in ("LastModified", "last_modified", "mtime")]
    return tuple(found)


def file_identity_like(fs: fsspec.AbstractFileSystem, path: str, recorded) -> tuple[tuple[str, object], ...]:
    """``file_identity`` in the terms ``recorded`` used: a local file recorded by its mtime is
    described by its mtime again even when a download record vouches for it now (runs made before
    such records were trusted recorded mtimes, and a record written since changes no byte)."""
    if is_local(fs) and "mtime_ns" in dict(recorded):
        return _stat_identity(os.stat(path))
    return file_identity(fs, path)


def _stat_identity(st: os.stat_result) -> tuple[tuple[str, object], ...]:
    return (("size", st.st_size), ("mtime_ns", st.st_mtime_ns))


HF_DOWNLOAD_RECORDS = (".cache", "huggingface", "download")
"""Where huggingface_hub keeps, in a ``local_dir`` it downloads into, one record per file:
``DIR/.cache/huggingface/download/<path in DIR>.metadata`` (commit, etag, timestamp lines)."""


def vouched_etag(path: str, st: os.stat_result | None = None) -> str | None:
    """The etag in huggingface_hub's record of downloading ``path`` into a folder, if the record
    still vouches for the file; else None (no record, or the file was written after it).

    The rule is huggingface_hub's own (``_local_folder.read_download_metadata``): the record holds
    while the file's mtime is at most 1 s past the record's timestamp. It must be that rule and no
    stricter: huggingface_hub never re-fetches or re-records a file it trusts, so a file distrusted
    only here would stay distrusted. Read here, not through that function: it takes a lock by
    creating a file beside the record (failing on a read-only mount, waiting out a download in
    progress), writes ``.gitignore``/``CACHEDIR.TAG`` and deletes a record it cannot parse, while
    this runs on workers, for every partition, and must only read."""
    record = _download_record(path)
    if record is None:
        return None
    try:
        with open(record, encoding="utf-8") as f:
            _commit, etag, timestamp = (f.readline().strip() for _ in range(3))
        stamped = float(timestamp)
        st = st if st is not None else os.stat(path)
    except (OSError, ValueError):
        return None  # unreadable, or being rewritten this instant: vouches for nothing
    return etag if etag and st.st_mtime - 1 <= stamped else None


def _download_record(path: str) -> str | None:
    """huggingface_hub's record of ``path``, trying each folder above it as the ``local_dir``."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(len(parts) - 1, 0, -1):
        folder = os.sep.join(parts[:i]) or os.sep
        record = os.path.join(folder, *HF_DOWNLOAD_RECORDS, *parts[i:]) + ".metadata"
        if os.path.isfile(record):
            return record
    return None


def describe_identity_change(old, new) -> str:
    """'size 100 → 120, mtime_ns ... → ...' for a one-line message."""
    old, new = dict(old), dict(new)
    return ", ".join(f"{k} {old.get(k)} → {new.get(k)}" for k in sorted(set(old) | set(new))
                     if old.get(k) != new.get(k)) or "nothing visible"


def write_atomic(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` so that no reader ever sees a partial object."""
    if is_local(fs):
        _write_local(path, data)
    elif is_gcs(fs) and 0 < len(data) < MULTIPART_THRESHOLD:
        gcs_upload(fs, path, data)
    elif is_azure(fs) and len(data) < MULTIPART_THRESHOLD:
        # One Put Blob. Azure's SDK reads a memoryview (the tokens' buffer) as a stream of ints: bytes.
        fs.pipe_file(path, data if isinstance(data, bytes) else bytes(data))
    elif is_object_store(fs) and len(data) < MULTIPART_THRESHOLD:
        fs.pipe_file(path, data)  # one PutObject: stored whole or not at all
    else:
        _write_deferred(fs, path, data)


class PendingWrite:
    """A file on its way to ``path`` that no reader sees yet (``begin_write``): ``finish()`` returns
    once it is whole there, ``abort()`` drops what can be dropped. Meanwhile the caller does other
    work: the disk or the network catches up."""

    def finish(self) -> None:
        raise NotImplementedError

    def abort(self) -> None:
        raise NotImplementedError


def begin_write(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> PendingWrite:
    """Start ``write_atomic(fs, path, data)``. A local file of ``DIRECT_MIN_BYTES`` or more goes to
    the disk past the page cache (``_DirectWrite``), on a thread; a smaller one is written to a
    temporary file at once and its writeback started, so that the fsync in ``finish()`` mostly
    finds it done (a 6 MB tokens file here: fsync waited 3.5 ms, 0.2 ms after 6 ms of other work);
    an upload runs on a thread, the calling thread being the worker's only one."""
    if is_local(fs):
        if len(data) >= DIRECT_MIN_BYTES and DIRECT_FLAG:
            direct = _DirectWrite.begin(path, data)
            if direct is not None:
                return direct
        write = _LocalWrite(path, data)
        _start_writeback(write.file.fileno())
        return write
    return _ThreadWrite(_WAITS.submit(write_atomic, fs, path, data))


_WAITS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="tokenshards-write")
"""Threads that mostly wait (network): the bytes are made before they start."""


def temporary_beside(path: str) -> str:
    """A new name in ``path``'s folder (made if missing) to write under until the rename: the
    ``<path>.<uuid>.tmp`` that verify knows as a killed writer's leftover."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    return f"{path}.{uuid.uuid4().hex}.tmp"


class _LocalWrite(PendingWrite):
    """A temporary file beside ``path``, its bytes written; renamed over ``path`` after an fsync.
    (Local writes stay on the calling thread: handing one to a thread cost more CPU than it saved,
    0.96 against 0.64 ms at 20 KB, measured here.)"""

    def __init__(self, path: str, data: bytes):
        self.path, self.tmp = path, temporary_beside(path)
        self.file = open(self.tmp, "wb")
        try:
            self.file.write(data)
            self.file.flush()
        except BaseException:
            self.abort()
            raise

    def finish(self) -> None:
        try:
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        # On a full disk, close() flushes the bytes the failed write kept and fails the same way:
        # the temporary must go all the same (a probe's was left in OUT, kept by the next run).
        with contextlib.suppress(OSError):
            self.file.close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)


DIRECT_FLAG = getattr(os, "O_DIRECT", 0)
"""Linux's (and the BSDs') flag for I/O past the page cache; 0 where there is none (macOS, Windows)."""

DIRECT_MIN_BYTES = 1 * MIB
"""Files this large skip the page cache. Putting a file's bytes in the page cache costs ~2 ms of
CPU per MB on this VM (a 5.6 MB tokens file: 11-13 ms of the writer's CPU, fsync or not, against
0.3 ms and 1.9 ms of waiting for the disk written directly, medians here). A smaller file (a
docs file, a done record, the tokens of a tiny partition) keeps the buffered write: its few pages
cost less than the thread a direct write runs on."""

DIRECT_ALIGN = 4096
"""Direct I/O wants its buffer, file offset and length aligned to the device's logical block
(512 or 4096 bytes): a page satisfies both."""

SCRATCH_KEEP_BYTES = 32 * MIB
"""A thread's aligned buffer for direct writes is kept (its pages stay faulted in) up to this size;
a larger file gets a buffer of its own, handed back after its write."""

_SCRATCH = threading.local()


def _aligned_buffer(size: int) -> mmap.mmap:
    """A page-aligned buffer of at least ``size`` bytes: this thread's own, reused by its next
    direct write (a write is finished before the thread begins another)."""
    if size > SCRATCH_KEEP_BYTES:
        return mmap.mmap(-1, size)
    kept = getattr(_SCRATCH, "buffer", None)
    if kept is None or len(kept) < size:
        kept = _SCRATCH.buffer = mmap.mmap(-1, max(size, 8 * MIB))
    return kept


class _DirectWrite(PendingWrite):
    """A temporary file beside ``path`` written with ``O_DIRECT`` on a thread: from an aligned copy
    of the bytes, padded to a whole block, then cut to its length; ``finish()`` fsyncs it (the
    metadata and the device's cache still need it) and renames it over ``path``. Where the
    filesystem refuses direct I/O, the same file is written through the page cache instead."""

    @classmethod
    def begin(cls, path: str, data: bytes) -> "_DirectWrite | None":
        """The write under way, or None when this filesystem refuses ``O_DIRECT`` at open (tmpfs
        before Linux 6.6, some FUSE filesystems): then the caller writes it buffered."""
        tmp = temporary_beside(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | DIRECT_FLAG | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)  # Linux checks O_DIRECT after creating the file
            return None
        return cls(path, tmp, fd, data)

    def __init__(self, path: str, tmp: str, fd: int, data: bytes):
        self.path, self.tmp, self.fd = path, tmp, fd
        size = len(data)
        padded = -(-size // DIRECT_ALIGN) * DIRECT_ALIGN
        try:
            view = memoryview(_aligned_buffer(padded))[:padded]
            view[:size] = data
            self.future = _WAITS.submit(_write_direct, fd, view, size)
        except BaseException:
            self._discard()
            raise

    def finish(self) -> None:
        try:
            self.future.result()
            os.fsync(self.fd)
            self._close()
            os.replace(self.tmp, self.path)
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        with contextlib.suppress(BaseException):
            self.future.result()  # the thread reads the buffer until it ends
        self._discard()

    def _discard(self) -> None:
        """The file closed and its temporary removed: what an abort leaves (nothing)."""
        self._close()
        with contextlib.suppress(FileNotFoundError):
            os.remove(self.tmp)

    def _close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _write_direct(fd: int, padded: memoryview, size: int) -> None:
    """All of ``padded`` at offset 0 of a file opened with ``O_DIRECT``, then the file cut to
    ``size``. A filesystem that took the open but refuses the write itself (EINVAL: a logical block
    larger than ``DIRECT_ALIGN``, say) gets the bytes through the page cache instead."""
    try:
        _pwrite_all(fd, padded)
    except OSError as e:
        if e.errno != errno.EINVAL:
            raise
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~DIRECT_FLAG)
        _pwrite_all(fd, padded[:size])
    os.ftruncate(fd, size)


def _pwrite_all(fd: int, data: memoryview) -> None:
    done = 0
    while done < len(data):
        done += os.pwrite(fd, data[done:], done)


def _start_writeback(fd: int) -> None:
    """Ask the kernel to start writing the file's dirty pages now, without waiting for them.
    Linux starts that writeback on ``POSIX_FADV_DONTNEED``: one of the ways PostgreSQL's
    ``pg_flush_data`` does it where ``sync_file_range`` (which Python lacks) is missing. Elsewhere
    this does nothing, and the fsync does all the work."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


class _ThreadWrite(PendingWrite):
    def __init__(self, future):
        self.future = future

    def finish(self) -> None:
        self.future.result()

    def abort(self) -> None:
        # An upload in flight cannot be called back: let it end. A whole object left without its
        # done record is a leftover that a rerun rewrites (``tokenize/resume.py``).
        with contextlib.suppress(BaseException):
            self.future.result()


def _write_local(path: str, data: bytes) -> None:
    _LocalWrite(path, data).finish()


def _write_deferred(fs: fsspec.AbstractFileSystem, path: str, data: bytes) -> None:
    """Multipart upload of ``part_size`` parts, completed by ``commit()`` only after the last
    byte went out; aborted (``discard()``) on any error."""
    block = part_size(len(data))
    f = fs.open(path, "wb", autocommit=False, block_size=block)
    try:
        for start in range(0, len(data), block):
            f.write(data[start:start + block])  # each full block goes out as one part
        f.close()
        f.commit()
    except BaseException:
        with contextlib.suppress(Exception):  # keep the original error; an unaborted upload stays invisible
            _cancel_gcs_upload(fs, f) if is_gcs(fs) else f.discard()
        f.closed = True  # discarded: closing it later (``__del__``) must not try to upload again
        raise
    finally:
        # fsspec also queues deferred files on the (cached, long-lived) filesystem's transaction
        # object; we commit or discard ourselves, so drop it there rather than keep it forever.
        with contextlib.suppress(ValueError):
            fs.transaction.files.remove(f)


def gcs_upload(fs, path: str, data: bytes, **condition) -> dict:
    """One media upload (the body is the object, complete before the request starts: GCS stores
    all of it or nothing); ``condition``: ``ifGenerationMatch=...``. Returns the object's resource.
    Not gcsfs's ``pipe_file``: its multipart/related body is parsed lossily by some emulators
    (gcp-storage-emulator's email parser drops a trailing CR or LF of binary data)."""
    bucket, key, _ = fs.split_path(path)
    # ``_location``: the endpoint gcsfs itself uploads to (Google's, an emulator's, a private one).
    reply = fs.call("POST", f"{fs._location}/upload/storage/v1/b/{{}}/o", bucket, uploadType="media", name=key,
                    data=data, headers={"Content-Type": "application/octet-stream"}, json_out=True, **condition)
    fs.invalidate_cache(path)
    return reply


def _cancel_gcs_upload(fs, f) -> None:
    """Cancel a resumable session with one request (gcsfs's ``discard`` retries a refusal for ~30 s,
    and an emulator may not implement the DELETE): a session left open is invisible and expires."""
    location = getattr(f, "location", None)
    if not location:
        return

    async def cancel():
        session = await fs._set_session()
        async with session.delete(location.replace("&ifGenerationMatch=0", ""), headers=fs._get_headers(None)):
            pass

    fsspec.asyn.sync(fs.loop, cancel, timeout=10)
    f.location = None


def abort_stale_uploads(fs: fsspec.AbstractFileSystem, prefix: str) -> int:
    """S3 only: abort the unfinished multipart uploads under ``prefix`` (workers killed mid-upload).

    They were never visible, but S3 bills their parts until aborted. GCS and Azure have nothing
    to abort by prefix: an unfinished resumable session expires, uncommitted blocks are dropped when
    the rerun writes the name again (or after a week), and neither is listed. Call it only when no other
    writer is active under ``prefix`` (the rerun of the same job, as for local temporaries).
    """
    if not is_s3(fs):
        return 0
    bucket, _, key_prefix = prefix.partition("/")
    aborted, markers = 0, {}
    while True:
        page = fs.call_s3("list_multipart_uploads", Bucket=bucket, Prefix=key_prefix.rstrip("/") + "/", **markers)
        for upload in page.get("Uploads", []):
            fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"])
            aborted += 1
        if not page.get("IsTruncated"):
            return aborted
        markers = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}


# -- one object from parts that many processes write at once (export) ------------------------------

PARTS_FOLDER = ".tokenshards-parts"
"""GCS: where an object's parts wait, beside it (``DIR/.tokenshards-parts/NAME/00001``) until
composed into it: a hidden folder that no export's or trainer's glob matches."""

GCS_COMPOSE_MAX = 32
"""Source objects per GCS compose request (the API's limit); more are composed in a tree."""

AZURE_MAX_BLOCKS = 50_000
"""Azure's limit on committed blocks per block blob."""

PARTED_MIN_PART = {"s3": 5 * MIB, "gcs": 1, "azure": 1}
PARTED_MAX_PARTS = {"s3": MAX_PARTS, "gcs": MAX_PARTS, "azure": AZURE_MAX_BLOCKS}
"""Each store's rules for a parted object: S3's 5 MiB floor (but the last part) and 10,000 parts;
GCS has no floor (our own cap keeps the compose tree shallow), Azure 50,000 blocks."""


@dataclass(frozen=True)
class PartedUpload:
    """One object being written as numbered parts by many tasks at once, invisible until
    ``commit_parts``: an S3 multipart upload, GCS objects composed at the end, or Azure blocks
    staged then committed as one block list. Small and picklable: it travels with every task."""

    store: str
    """"s3", "gcs" or "azure"."""
    url: str
    """The object's URL, from which each process builds its own filesystem."""
    path: str
    upload_id: str = ""


def parted_store(fs: fsspec.AbstractFileSystem) -> str | None:
    """The store kind ``begin_parts`` takes for ``fs``, or None (local or another fsspec store)."""
    return "s3" if is_s3(fs) else "gcs" if is_gcs(fs) else "azure" if is_azure(fs) else None


def parted_part_size(store: str, nbytes: int, wanted: int) -> int:
    """The part size for an object of ``nbytes`` on ``store``: ``wanted``, or more when the store's
    floor or its part count demands it."""
    return max(wanted, PARTED_MIN_PART[store], -(-nbytes // PARTED_MAX_PARTS[store]))


def begin_parts(fs: fsspec.AbstractFileSystem, path: str) -> PartedUpload:
    """Client side. GCS: parts an earlier (killed) writer of this name left are removed first;
    the caller holds the folder's lease, so nobody else writes them."""
    store = parted_store(fs)
    url = fs.unstrip_protocol(path)
    if store == "s3":
        bucket, key, _ = fs.split_path(path)
        return PartedUpload(store, url, path, fs.call_s3("create_multipart_upload", Bucket=bucket, Key=key)["UploadId"])
    if store == "gcs":
        _remove_parts(fs, _gcs_parts_folder(path))
    elif store != "azure":
        raise ValueError(f"no parted upload for {type(fs).__name__}")
    return PartedUpload(store, url, path)


def put_part(upload: PartedUpload, number: int, data: bytes, storage_options: dict | None) -> str:
    """Worker side: part ``number`` (from 1) of ``upload``; returns what ``commit_parts`` needs of it."""
    fs, _ = filesystem(upload.url, storage_options)
    if upload.store == "s3":
        bucket, key, _ = fs.split_path(upload.path)
        return fs.call_s3("upload_part", Bucket=bucket, Key=key, UploadId=upload.upload_id, PartNumber=number,
                          Body=data)["ETag"]
    if upload.store == "gcs":  # one media upload: the part object is whole or absent
        return str(gcs_upload(fs, _gcs_part(upload.path, number), bytes(data)).get("generation", ""))
    container, blob, _ = fs.split_path(upload.path)

    async def stage():
        async with fs.service_client.get_blob_client(container, blob) as client:
            await client.stage_block(_azure_block_id(number), bytes(data), length=len(data))

    fsspec.asyn.sync(fs.loop, stage)
    return _azure_block_id(number)


def commit_parts(fs: fsspec.AbstractFileSystem, upload: PartedUpload, tags: dict[int, str]) -> None:
    """Client side, once every part is in: the object appears, whole, in one request (S3's
    CompleteMultipartUpload, GCS's last compose, Azure's Put Block List)."""
    numbers = sorted(tags)
    if upload.store == "s3":
        bucket, key, _ = fs.split_path(upload.path)
        fs.call_s3("complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id,
                   MultipartUpload={"Parts": [{"PartNumber": n, "ETag": tags[n]} for n in numbers]})
    elif upload.store == "gcs":
        if numbers:
            _gcs_compose(fs, upload.path, [_gcs_part(upload.path, n) for n in numbers])
        else:
            gcs_upload(fs, upload.path, b"")
        _remove_parts(fs, _gcs_parts_folder(upload.path))
    else:
        from azure.storage.blob import BlobBlock

        container, blob, _ = fs.split_path(upload.path)

        async def commit():
            async with fs.service_client.get_blob_client(container, blob) as client:
                await client.commit_block_list([BlobBlock(block_id=tags[n]) for n in numbers])

        fsspec.asyn.sync(fs.loop, commit)
    fs.invalidate_cache(upload.path)


def abort_parts(fs: fsspec.AbstractFileSystem, upload: PartedUpload) -> None:
    """Client side, on failure: drop the parts. Azure's uncommitted blocks cannot be deleted: no
    listing or reader sees them, and Azure discards them after a week or at the name's next write."""
    if upload.store == "s3":
        bucket, key, _ = fs.split_path(upload.path)
        fs.call_s3("abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload.upload_id)
    elif upload.store == "gcs":
        _remove_parts(fs, _gcs_parts_folder(upload.path))


def _gcs_parts_folder(path: str) -> str:
    folder, name = posixpath.split(path)
    return join(folder, PARTS_FOLDER, name)


def _gcs_part(path: str, number: int) -> str:
    return join(_gcs_parts_folder(path), f"{number:05d}")


def _gcs_compose(fs, path: str, sources: list[str]) -> None:
    """Compose ``sources`` into ``path``, through intermediate objects beside the parts when there
    are more than a request takes. Only the last request writes ``path``: it appears whole."""
    level = 0
    while len(sources) > GCS_COMPOSE_MAX:
        groups = [sources[i:i + GCS_COMPOSE_MAX] for i in range(0, len(sources), GCS_COMPOSE_MAX)]
        sources = [join(_gcs_parts_folder(path), f"c{level}-{i:05d}") for i in range(len(groups))]
        for target, group in zip(sources, groups):
            fs.merge(target, group)
        level += 1
    fs.merge(path, sources)


def remove_stale_parts(fs: fsspec.AbstractFileSystem, prefix: str) -> int:
    """Client side, holding the lease of the folder ``prefix``: the GCS part objects killed exports
    left in ``PARTS_FOLDER``s there, whatever file they were for (hidden, but billed). That folder is
    ours alone, and the lease keeps every other export out. Not S3's multipart uploads: another
    tool's may share the prefix, so an export aborts only those of its own names (``export.common``).
    Azure lists nothing: uncommitted blocks go when the name is written again, or after a week.
    Returns how many went."""
    if not is_gcs(fs):
        return 0
    with contextlib.suppress(FileNotFoundError):
        stale = [path for path in fs.find(prefix) if f"/{PARTS_FOLDER}/" in f"/{path[len(prefix):].lstrip('/')}"]
        if stale:
            fs.rm(stale)
        return len(stale)
    return 0


def _remove_parts(fs, folder: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        found = fs.find(folder)
        if found:
            fs.rm(found)


def _azure_block_id(number: int) -> str:
    """Block ids of one blob must be of one length; the SDK base64-encodes them."""
    return f"tokenshards-{number:06d}"


def write_json(fs: fsspec.AbstractFileSystem, path: str, obj) -> None:
    write_atomic(fs, path, (json.dumps(obj, indent=1, sort_keys=False) + "\n").encode())


def read_json(fs: fsspec.AbstractFileSystem, path: str):
    """One GET on S3 (``open`` would first HEAD the object): resume reads every done record."""
    return json.loads(fs.cat_file(path))


def check_bucket(fs: fsspec.AbstractFileSystem, path: str, url: str, *, what: str) -> None:
    """Object stores: fail now, in one line naming ``url``, if the bucket (container) is missing,
    the endpoint does not answer or the credentials are refused. A 403 here is not final (a role
    may read a prefix without the bucket-level right): the listing or write that follows reports it."""
    if not is_object_store(fs):
        return
    bucket = path.split("/", 1)[0]
    kind = "container" if is_azure(fs) else "bucket"
    try:
        if is_s3(fs):
            fs.call_s3("head_bucket", Bucket=bucket)
        elif is_gcs(fs):
            fs.call("GET", "b/{}", bucket, fields="name", json_out=True)
        else:
            _azure_container_properties(fs, bucket)
    except Exception as e:
        if _is_denied(e) and not _is_auth_failure(e):
            return
        if isinstance(e, FileNotFoundError) or type(e).__name__ == "ResourceNotFoundError":
            raise UserError(f"{what} {url}: {kind} {bucket!r} does not exist at {_endpoint(fs) or 'the endpoint'}; "
                            "create it first or fix the URL") from e
        raise storage_error(e, url, what=what, fs=fs) from e


def _azure_container_properties(fs, container: str) -> None:
    async def properties():
        async with fs.service_client.get_container_client(container) as client:
            await client.get_container_properties()

    fsspec.asyn.sync(fs.loop, properties)
