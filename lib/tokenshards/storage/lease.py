"""One live writer per output folder: a lease object in it, taken atomically, renewed while the
run lives, stale after a TTL (or at once when its process is gone from this machine: the same
host name, kernel boot and PID namespace, since containers often share a host name).

Why a lease and not a lock: a lock held by a process that crashed, or by a machine that went
away, would block the rerun forever; a lease expires. Why in OUT itself: it must work where OUT
lives (a local disk, a shared filesystem, S3) for every machine that can write there.

How each store makes "take it only if nobody holds it" atomic:
- Local and shared filesystems: the record is written to a temporary file, then ``os.link``-ed
  to the lease name; ``link`` fails when the name exists (atomic on local disks and on NFS, which
  ``O_EXCL`` was not before NFSv3). A stale lease is first renamed away (only one of two racers
  can rename the same file), checked to be the stale record that was judged, then replaced.
- S3: conditional PutObject. ``If-None-Match: *`` creates the lease only when absent, and
  ``If-Match: <ETag>`` renews or takes over only the exact version that was read, so two runs can
  never both win. AWS S3 has both since late 2024; moto 5 enforces both; s3fs 2026.9 maps the
  412 to ``FileExistsError`` / ``OSError``. We call botocore's ``put_object`` through
  ``fs.call_s3`` rather than s3fs's ``pipe_file(mode="create")`` because renewal needs
  ``If-Match`` too, and the ETag that comes back with each write.
- Google Cloud Storage: the same with generations: an upload with ``ifGenerationMatch=0`` creates
  the lease only when absent, ``ifGenerationMatch=<generation>`` renews or takes over only the
  version read (GCS answers 412 otherwise, which gcsfs raises as ``FileExistsError``).
- Azure Blob Storage: Put Blob with ``If-None-Match: *`` creates it, ``If-Match: <ETag>`` renews or
  takes over (409 BlobAlreadyExists / 412 ConditionNotMet otherwise).
- Other fsspec stores: check, then write (not atomic; said in the README).
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Callable

import fsspec

from ..untrusted import UnsafeFile, open_regular, parse_json, read_fd
from ..namespaces import process_space
from ..errors import UserError
from ..wording import brief, scrub
from .location import Location
from .store import (gcs_upload, is_azure, is_gcs, is_local, is_object_store, is_s3, storage_error, temporary_beside,
                    write_advice, write_atomic)

LEASE_FILE = ".tokenshards-lease.json"
DEFAULT_TTL = 120.0
"""Seconds a lease lives without renewal. Renewed every TTL/4, so a run survives three failed
renewals in a row (a storage hiccup) and a crashed run on another machine blocks a rerun for at
most two minutes. Clocks of the machines must agree to well within this."""


class LeaseHeld(UserError):
    """Another live run writes OUT; the message names it and says how to proceed."""


class LeaseLost(UserError):
    """This run's lease was taken over (it stalled past its TTL); it must not commit."""


LEASE_LIMIT = 1 << 20
"""The most of a lease file that is read: a record is ~300 bytes."""


def held_at(fs: fsspec.AbstractFileSystem, path: str) -> "LeaseRecord | None":
    """The lease record at ``path`` as a reader that is not its holder sees it (a task before it
    commits, a command asking whether a live run writes a folder): None when there is none, or what
    is there is not a record or not a regular file (a FIFO is never opened: it would hang). Read
    bounded, as every record; a store's failure is raised."""
    if is_local(fs):
        try:
            fd = open_regular(path)
        except (UnsafeFile, OSError):
            return None
        try:
            raw = read_fd(fd, limit=LEASE_LIMIT)
        except (UnsafeFile, OSError):
            return None
        finally:
            os.close(fd)
    else:
        try:
            raw = fs.cat_file(path, start=0, end=LEASE_LIMIT + 1)
        except FileNotFoundError:
            return None
    return LeaseRecord.from_bytes(raw)


class _Conflict(Exception):
    """A conditional write lost: somebody else's lease is in place."""


class _Unwritable(Exception):
    """A local lease file could not be written at all (a full disk, no permission)."""

    def __init__(self, error: OSError):
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True, kw_only=True)
class LeaseRecord:
    run: str
    command: str
    host: str
    pid: int
    started: float
    renewed: float
    ttl: float
    space: str = ""
    """Where ``pid`` names one process (``namespaces.process_space``: host name, kernel boot, PID
    namespace): two containers can share a host name and a pid. Empty in records of earlier
    versions, which are then judged by their expiry alone."""

    @property
    def expires(self) -> float:
        return self.renewed + self.ttl

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> "LeaseRecord | None":
        """None for a record that isn't one (half-written by a foreign tool, hand-edited, a field of
        the wrong type): stale. Nothing else reads a lease file, so nothing else must check one."""
        try:
            data = parse_json(raw[:LEASE_LIMIT + 1])  # bounded: no RecursionError, no NaN
            record = cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data or k != "space"})
        except (ValueError, TypeError, KeyError):
            return None
        texts = (record.run, record.command, record.host, record.space)
        numbers = (record.started, record.renewed, record.ttl)
        if not (all(isinstance(t, str) for t in texts) and type(record.pid) is int and record.pid > 0
                and all(type(n) in (int, float) and math.isfinite(n) for n in numbers)):
            return None
        return record

    def describe(self, now: float) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started))
        return (f"a {self.command} run on host {self.host}, pid {self.pid}, started {started}, "
                f"lease renewed {max(now - self.renewed, 0):.0f} s ago")

    def is_stale(self, now: float, *, space: str) -> bool:
        """Expired, or held by a process of this machine (this process space) that no longer exists."""
        return now > self.expires or (bool(self.space) and self.space == space and not _pid_alive(self.pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


# -- per-store atomic operations: a token identifies the version read or written --------------

class _LocalOps:
    def __init__(self, path: str):
        self.path = path

    def read(self) -> tuple[bytes, bytes] | None:
        # A regular file only, opened without blocking nor following a link (format.paths): a FIFO
        # or a folder put there is refused in one line, never waited on.
        try:
            fd = open_regular(self.path)
        except FileNotFoundError:
            return None
        except (UnsafeFile, OSError) as e:
            raise UserError(f"{self.path}: {e}; no tokenshards command writes that: remove it, then rerun") from e
        try:
            raw = read_fd(fd, limit=LEASE_LIMIT)
        except UnsafeFile as e:
            raise UserError(f"{self.path}: {e}; no tokenshards command writes that: remove it, then rerun") from e
        finally:
            os.close(fd)
        return raw, raw

    def create(self, data: bytes) -> bytes:
        tmp = temporary_beside(self.path)
        try:
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                raise _Unwritable(e) from e
            try:
                os.link(tmp, self.path)
            except FileExistsError as e:
                raise _Conflict() from e
        finally:  # a full disk keeps the temporary it could not fill: it goes too
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
        return data

    def replace(self, data: bytes, token: bytes, *, mine: bool) -> bytes:
        if mine:  # renewal: the owner rewrites its own record after checking it is still there
            current = self.read()
            if current is None or current[1] != token:
                raise _Conflict()
            write_atomic(fsspec.filesystem("file"), self.path, data)
            return data
        # Takeover of a stale lease: rename it away (one racer wins), check it is what we judged.
        aside = f"{self.path}.{uuid.uuid4().hex}.stale"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError as e:
            raise _Conflict() from e
        try:
            with open(aside, "rb") as f:
                if f.read() != token:  # renewed or replaced since we read it: put it back
                    with contextlib.suppress(FileExistsError):
                        os.link(aside, self.path)
                    raise _Conflict()
            return self.create(data)
        finally:
            os.remove(aside)

    def delete(self, token: bytes) -> None:
        current = self.read()
        if current is not None and current[1] == token:
            os.remove(self.path)


class _S3Ops:
    def __init__(self, fs, path: str):
        self.fs = fs
        self.bucket, _, self.key = path.partition("/")

    def read(self) -> tuple[bytes, str] | None:
        # HEAD, GET, HEAD: the body belongs to the ETag when both HEADs agree (each write's body differs).
        for _ in range(5):
            try:
                before = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)["ETag"]
                raw = self.fs.cat_file(f"{self.bucket}/{self.key}")
                after = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)["ETag"]
            except FileNotFoundError:
                return None
            if before == after:
                return raw, after
        raise OSError(errno.EAGAIN, f"s3://{self.bucket}/{self.key} keeps changing while read")

    def _put(self, data: bytes, **condition) -> str:
        try:
            return self.fs.call_s3("put_object", Bucket=self.bucket, Key=self.key, Body=data, **condition)["ETag"]
        except OSError as e:
            if _is_precondition(e):
                raise _Conflict() from e
            raise

    def create(self, data: bytes) -> str:
        return self._put(data, IfNoneMatch="*")

    def replace(self, data: bytes, token: str, *, mine: bool) -> str:
        try:
            return self._put(data, IfMatch=token)
        except FileNotFoundError as e:  # removed since: not ours any more
            raise _Conflict() from e

    def delete(self, token: str) -> None:
        current = self.read()
        if current is not None and current[1] == token:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key)


def _is_precondition(e: BaseException) -> bool:
    if isinstance(e, FileExistsError):
        return True
    response = getattr(e.__cause__, "response", None) or {}
    code = response.get("Error", {}).get("Code")
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)


class _GCSOps:
    """Conditional uploads by generation, through gcsfs's own request function (its retries, its
    credentials, its endpoint). The body is read at the generation its metadata named, so the
    token always belongs to the bytes."""

    def __init__(self, fs, path: str):
        self.fs = fs
        self.bucket, _, self.key = path.partition("/")

    def read(self) -> tuple[bytes, str] | None:
        for _ in range(5):
            try:
                meta = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, fields="generation", json_out=True)
                _, raw = self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, alt="media",
                                      generation=meta["generation"])
            except FileNotFoundError:
                continue  # gone, or replaced between the two requests: look again
            return raw, str(meta["generation"])
        return None

    def _upload(self, data: bytes, generation: str) -> str:
        try:
            reply = gcs_upload(self.fs, f"{self.bucket}/{self.key}", data, ifGenerationMatch=generation)
        except (FileExistsError, FileNotFoundError) as e:  # 412: another version is there (404: the bucket)
            if isinstance(e, FileNotFoundError) and generation == "0":
                raise
            raise _Conflict() from e
        return str(reply["generation"])

    def create(self, data: bytes) -> str:
        # Looked for first as well: a store that ignores the precondition (an emulator) still sees a
        # lease that is there; with GCS itself the 412 is what makes two racing creates safe.
        with contextlib.suppress(FileNotFoundError):
            self.fs.call("GET", "b/{}/o/{}", self.bucket, self.key, fields="generation", json_out=True)
            raise _Conflict()
        return self._upload(data, "0")

    def replace(self, data: bytes, token: str, *, mine: bool) -> str:
        return self._upload(data, token)

    def delete(self, token: str) -> None:
        with contextlib.suppress(FileNotFoundError, FileExistsError):
            self.fs.call("DELETE", "b/{}/o/{}", self.bucket, self.key, ifGenerationMatch=token)


class _AzureOps:
    """Conditional Put Blob and Delete Blob on the blob client of adlfs's service client; a GET
    returns the body with its ETag, so the token always belongs to the bytes."""

    def __init__(self, fs, path: str):
        self.fs = fs
        self.container, _, self.blob = path.partition("/")

    def _call(self, operation):
        async def run():
            async with self.fs.service_client.get_blob_client(self.container, self.blob) as client:
                return await operation(client)

        return fsspec.asyn.sync(self.fs.loop, run)

    def read(self) -> tuple[bytes, str] | None:
        from azure.core.exceptions import ResourceNotFoundError  # optional: tokenshards[azure]

        async def download(client):
            stream = await client.download_blob()
            return await stream.readall(), stream.properties.etag

        try:
            return self._call(download)
        except ResourceNotFoundError:
            return None

    def _put(self, data: bytes, **condition) -> str:
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError  # optional

        try:
            reply = self._call(lambda client: client.upload_blob(data, **condition))
        except (ResourceExistsError, ResourceModifiedError) as e:
            raise _Conflict() from e
        except ResourceNotFoundError as e:
            if condition.get("overwrite") is False:
                raise  # the container is missing
            raise _Conflict() from e
        return reply["etag"]

    def create(self, data: bytes) -> str:
        return self._put(data, overwrite=False)  # If-None-Match: *

    def replace(self, data: bytes, token: str, *, mine: bool) -> str:
        from azure.core import MatchConditions  # optional: tokenshards[azure]

        return self._put(data, overwrite=True, etag=token, match_condition=MatchConditions.IfNotModified)

    def delete(self, token: str) -> None:
        from azure.core import MatchConditions  # optional: tokenshards[azure]
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        with contextlib.suppress(ResourceNotFoundError, ResourceModifiedError):
            self._call(lambda client: client.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified))


class _GenericOps:
    """Stores without conditional writes here: check, then write (a narrow race remains)."""

    def __init__(self, fs, path: str):
        self.fs, self.path = fs, path

    def read(self):
        try:
            raw = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return None
        return raw, raw

    def create(self, data: bytes):
        if self.fs.exists(self.path):
            raise _Conflict()
        write_atomic(self.fs, self.path, data)
        return data

    def replace(self, data: bytes, token, *, mine: bool):
        current = self.read()
        if current is None and not mine:
            return self.create(data)
        if current is None or current[1] != token:
            raise _Conflict()
        write_atomic(self.fs, self.path, data)
        return data

    def delete(self, token) -> None:
        current = self.read()
        if current is not None and current[1] == token:
            self.fs.rm(self.path)


def _ops(fs, path: str):
    if is_local(fs):
        return _LocalOps(path)
    if is_s3(fs):
        return _S3Ops(fs, path)
    if is_gcs(fs):
        return _GCSOps(fs, path)
    if is_azure(fs):
        return _AzureOps(fs, path)
    return _GenericOps(fs, path)


# -- the lease ----------------------------------------------------------------------------------

class Lease:
    """``with Lease(location, command="tokenize") as lease:`` owns OUT (a ``Location``) for the block:
    taken on entry (or ``LeaseHeld``), renewed by a daemon thread, released on exit. Call
    ``check()`` right before the commit point."""

    def __init__(self, location: Location, *, command: str, ttl: float = DEFAULT_TTL, clock: Callable[[], float] = time.time,
                 announce: Callable[[str], None] = lambda msg: None):
        self.location, self.command, self.ttl, self.clock, self.announce = location, command, ttl, clock, announce
        self.fs, self.url = location.fs, location.url
        self.path = location.join(LEASE_FILE)
        self.ops = _ops(self.fs, self.path)
        self.host = socket.gethostname()
        self.space = process_space()
        self.record: LeaseRecord | None = None
        self.token = None
        self.lost: LeaseRecord | None = None
        """Set when a renewal found another run's lease in place."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # taking and giving back
    def acquire(self) -> None:
        with self._worded("cannot take the lease"):
            self._acquire()

    @contextlib.contextmanager
    def _worded(self, what: str):
        """A store's failure while taking or checking the lease, as one line naming the lease file."""
        try:
            yield
        except (UserError, _Conflict):
            raise
        except Exception as e:
            if not is_object_store(self.fs):
                raise
            raise storage_error(e, self.location.shown(LEASE_FILE), what=what, fs=self.fs) from e

    def _acquire(self) -> None:
        now = self.clock()
        self.record = LeaseRecord(run=uuid.uuid4().hex, command=self.command, host=self.host, pid=os.getpid(),
                                  started=now, renewed=now, ttl=self.ttl, space=self.space)
        for _ in range(5):  # each round: someone else's lease changed under us; look again
            try:
                self.token = self.ops.create(self.record.to_bytes())
                return
            except _Conflict:
                pass
            except _Unwritable as e:
                raise UserError(f"cannot write to {self.url}: {type(e.error).__name__}: {e.error}; "
                                f"{write_advice(e.error, 'folder')}") from e.error
            current = self.ops.read()
            if current is None:
                continue  # released meanwhile
            raw, token = current
            held = LeaseRecord.from_bytes(raw)
            if held is not None and held.run == self.record.run:
                # Our own create, retried after a reply that was lost (a timeout, a 503): it is ours.
                self.token = token
                return
            now = self.clock()
            if held is not None and not held.is_stale(now, space=self.space):
                raise LeaseHeld(
                    f"{self.url} is being written by {held.describe(now)}; wait for it to finish or use another "
                    f"--out (if that run is dead, its lease expires {max(held.expires - now, 0):.0f} s from now; "
                    f"or delete {self.location.shown(LEASE_FILE)} once you are sure)")
            try:
                self.token = self.ops.replace(self.record.to_bytes(), token, mine=False)
            except _Conflict:
                continue
            except _Unwritable as e:
                raise UserError(f"cannot write to {self.url}: {type(e.error).__name__}: {e.error}; "
                                f"{write_advice(e.error, 'folder')}") from e.error
            what = held.describe(now) if held is not None else "an unreadable record"
            self.announce(f"{self.url}: took over the stale lease of {what}")
            return
        raise LeaseHeld(f"{self.url}: its lease {self.location.shown(LEASE_FILE)} keeps changing hands; "
                        "another run is starting there, try again in a minute")

    def release(self) -> None:
        self._stop_renewing()
        if self.token is not None and self.lost is None:
            with contextlib.suppress(Exception):  # a store that fails now: the lease expires by itself
                self.ops.delete(self.token)
        self.token = None

    # keeping it
    def renew(self) -> None:
        """Extend the lease; on a lost conditional write, remember who holds OUT now.

        A renewal whose answer never came (no reply, a reset: the store may have written it or not)
        or whose retry met its own first write (a precondition that no longer holds because the
        write landed) is read back, as the lease's creation is: a record of this run, from this
        process, is still this run's lease, whichever version is there; the run carries on with
        it. Only another run's record, or none, means the lease was lost. A failure that leaves the
        record unread, or this run's record expired, is raised: this run cannot say it holds OUT."""
        with self._lock:
            if self.lost is not None or self.record is None:
                return
            record = LeaseRecord(**{**asdict(self.record), "renewed": self.clock()})
            failure: Exception | None = None
            try:
                self.token = self.ops.replace(record.to_bytes(), self.token, mine=True)
                self.record = record
                return
            except _Conflict:
                pass
            except Exception as e:  # noqa: BLE001 -- ambiguous: read back below, raised if that cannot say
                failure = e
            current = self.ops.read()
            held = LeaseRecord.from_bytes(current[0]) if current else None
            if held is not None and self._is_mine(held):
                self.token, self.record = current[1], held
                if failure is not None and held.renewed != record.renewed and self.clock() > held.expires:
                    raise failure
                return
            self.lost = held or self.record

    def _is_mine(self, held: LeaseRecord) -> bool:
        """Written by this run (its random id) from this process: the holder and its token."""
        mine = self.record
        return (held.run, held.host, held.pid, held.space, held.started) == \
            (mine.run, mine.host, mine.pid, mine.space, mine.started)

    def check(self) -> None:
        """Raise ``LeaseLost`` unless this run still holds OUT (renews once, so the answer is fresh)."""
        with self._worded("cannot renew the lease"):
            self.renew()
        if self.lost is not None:
            by = self.lost.describe(self.clock()) if self.lost.run != self.record.run else "nobody (it was removed)"
            raise LeaseLost(f"{self.url}: this run lost its lease to {by} (it stalled past the {self.ttl:.0f} s "
                            "lease); no manifest was written: OUT is that run's now")

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl / 4):
            try:
                self.renew()
            except Exception as e:  # noqa: BLE001 -- a storage hiccup: the next tick tries again
                self.announce(f"warning: could not renew the lease on {self.url} ({type(e).__name__}: {brief(scrub(str(e)))})")

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def __enter__(self) -> "Lease":
        self.acquire()
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="tokenshards-lease", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
