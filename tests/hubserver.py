"""A stand-in Hugging Face Hub for tests: serves one dataset (or model) repo from a folder to the real client.

It answers the requests huggingface_hub 2.x makes (read from its source, not guessed):

- ``GET /api/datasets/REPO[/revision/REV]``: repo info (``HfApi.dataset_info``); 404 with
  ``X-Error-Code: RepoNotFound`` / ``RevisionNotFound`` as the Hub does;
- ``GET /api/datasets/REPO/tree/REV[/PATH]?recursive=..``: tree listing (``list_repo_tree``),
  paginated with a ``Link: <...>; rel="next"`` header when ``page_size`` is set; a missing
  path is 404 ``EntryNotFound``;
- ``HEAD``/``GET /datasets/REPO/resolve/REV/PATH`` (``hf_hub_download``): ``X-Repo-Commit``,
  ``ETag`` (the LFS sha256 for LFS files, the git blob sha1 for others, as the Hub does),
  ``X-Linked-Size``/``X-Linked-Etag`` for LFS files, and ``Range`` requests (206).

And what its upload path sends (``HfApi.create_commit`` with ``HF_HUB_DISABLE_XET=1``: the
legacy LFS transfer; hf_xet's CAS protocol is not served), each write with ``Authorization:
Bearer TOKEN`` of a user in ``tokens`` who owns the repo's namespace (else 401 ``Invalid user
token`` / 403 as the Hub answers):

- ``GET /api/whoami-v2``; ``GET /api/datasets/REPO/auth-check/write`` (``HfApi.auth_check``);
  ``POST /api/repos/create`` (409 when it exists); ``POST /api/validate-yaml`` (a root README.md);
- ``POST /api/datasets/REPO/preupload/REV``: ``uploadMode`` ``lfs`` for the suffixes in
  ``LFS_SUFFIXES`` (the Hub's default ``.gitattributes``), else ``regular``, and the ``oid`` of the
  file already at that path (sha256 for LFS, git blob sha1 otherwise) so unchanged files are skipped;
- ``POST /datasets/REPO.git/info/lfs/objects/batch``: basic transfer; an object the server already
  holds (uploaded earlier, committed or not) gets no ``actions``, so it is not sent again;
  ``PUT /lfs-upload/REPO/OID`` (streamed to disk, sha256 checked) and ``POST /lfs-verify/REPO``;
- ``POST /api/datasets/REPO/commit/REV``: the NDJSON commit (``file`` base64, ``lfsFile``,
  ``deletedFile``, ``deletedFolder``); each commit gets a new commit id, which resolve and repo
  info then serve (``snapshot_download`` and ``hf_hub_download`` read what was uploaded).

A model repo (``repo_type="model"``, read only: a tokenizer's files) is served at the same
routes without the ``datasets`` part, as the Hub does: ``/api/models/REPO[/revision/REV]``,
``/api/models/REPO/tree/REV[/PATH]``, ``/REPO/resolve/REV/PATH``. With ``gated=True`` repo info
and the tree stay public (as on the Hub, where anyone sees a gated repo's files) but a file's
``resolve`` needs ``Authorization: Bearer TOKEN`` of a user in ``tokens``: without one (or with
an unknown one), 401 ``X-Error-Code: GatedRepo``; a user not in ``granted`` (who has not accepted
the licence), 403 ``GatedRepo``. huggingface_hub raises ``GatedRepoError`` for both.

Faults for tests: ``fail(...)`` answers matching requests (any method, uploads too) with a status
(429, 500...) a number of times; ``drop(...)`` sends headers and only part of a body, then closes
the connection (for a PUT or POST: reads the request, then hangs up without an answer); ``hold(...)``
keeps a file's download waiting until the test lets it go. Speed:
``rate`` caps each response's body, ``link_rate`` all of them together (one link, shared by
every connection, as a machine's network is). Every request is logged in ``requests`` so tests
can assert what the client fetched or sent (``downloads()``, ``uploads()``, ``commits()``); with
``log_file``, also as one JSON line per request once its body has gone out (client address, method,
path, Range header, status, body bytes sent), for a test whose server runs in another process or on
another (lab) machine.

Run alone to try ``make tokenize`` against it: ``python tests/hubserver.py ROOT --repo R``
(``--host``/``--port`` to listen elsewhere than 127.0.0.1, ``--log FILE`` for the JSON lines); with
``--token TOKEN=USER`` (and ``HF_HUB_DISABLE_XET=1`` on the client) ``export --to hf://`` too.
"""
from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit

LFS_SUFFIXES = (".parquet", ".bin", ".npy", ".idx", ".model", ".safetensors")
"""Stored as LFS, as the Hub's default ``.gitattributes`` says (``*.parquet``, ``*.bin``, ``*.npy``...)."""
LINK_BURST = 1.0
"""Seconds of ``link_rate`` a sender may catch up after waking late. A network keeps delivering
into the kernel's socket buffers (Linux autotunes them to ~4-6 MB) while the processes at either
end wait for a core; this link's sender is a thread in the test's own process, and on a 2-core
machine busy tokenizing it woke late often enough that a burst of one chunk (0.05 s) lost a
quarter of the link's time (a 16.5 s download took 20.8 s beside the tokenizing workers)."""


@dataclass
class Fault:
    pattern: re.Pattern
    method: str | None
    times: int
    status: int | None = None
    headers: dict = field(default_factory=dict)
    drop_after: int | None = None
    ranged: bool | None = None
    """True: only GETs of a closed byte range (a footer read); False: all others; None: any."""
    after: int = 0
    """Matching requests let through first (e.g. the first commit of an upload)."""


@dataclass(frozen=True)
class Logged:
    method: str
    path: str
    range: str | None
    status: int
    client: str | None = None
    """The requesting host's address."""
    sent: int = 0
    """Body bytes written to the client (0 for HEAD; what went out before a drop or hang-up)."""


class HubServer:
    """Serves the files under ``root`` as repo ``repo`` (a ``dataset``, or a ``model``: ``repo_type``)
    at commit ``commit`` (branch ``main``)."""

    def __init__(self, root: Path, *, repo: str = "HuggingFaceFW/fineweb", commit: str | None = None,
                 page_size: int | None = None, branches: tuple[str, ...] = ("main",), list_subfolders: bool = True,
                 link_rate: int | None = None, host: str = "127.0.0.1", port: int = 0, log_file: Path | None = None,
                 tokens: dict[str, str] | None = None, exists: bool = True, repo_type: str = "dataset",
                 gated: bool = False, granted: frozenset[str] | None = None):
        if repo_type not in ("dataset", "model"):
            raise ValueError(f"repo_type={repo_type!r}: this stand-in serves 'dataset' or 'model' repos")
        self.root = Path(root)
        self.repo_type = repo_type
        self.gated = gated
        """True: downloads need the token of a user in ``tokens`` (and in ``granted``, when given)."""
        self.granted = granted
        """Users who accepted a gated repo's licence; None: every user with a token."""
        self.host, self.port = host, port
        self.log_file = Path(log_file) if log_file else None
        """One JSON line per request (a ``Logged``), appended once the body went out."""
        self.repo = repo
        self.tokens = dict(tokens or {})
        """Token → user name; a user may write to repos of its own namespace."""
        self.exists = exists
        """False: the repo answers 404 until ``POST /api/repos/create`` makes it (then empty)."""
        self._objects = Path(tempfile.mkdtemp(prefix="hubserver-lfs-"))
        """LFS objects received (``PUT``), by sha256, committed or not: the Hub keeps them too."""
        self.commit = commit or hashlib.sha1(f"{repo}@{time.time_ns()}".encode()).hexdigest()
        self.page_size = page_size
        self.branches = branches
        self.list_subfolders = list_subfolders
        """False: a tree request for a path is 404, as from a minimal server that lists only the root."""
        self.rate: int | None = None
        """Bytes per second for each file body (None: as fast as possible), to interrupt a download."""
        self.link_rate = link_rate
        """Bytes per second for all file bodies together (None: no cap): first come, first served."""
        self._link_free = 0.0
        self.requests: list[Logged] = []
        self.committed: list[list[str]] = []
        """The paths each successful commit added or removed, in order."""
        self._faults: list[Fault] = []
        self._holds: list[tuple[re.Pattern, threading.Event, float]] = []
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[tuple, dict]] = {}
        """Path → (the file's stat signature, its tree entry): the Hub stores a file's hashes at
        commit; hashing it again for every listing, HEAD and GET made the server, in the client's
        own process, the busiest thread of a test that times the client."""
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle --
    def start(self) -> "HubServer":
        handler = type("Handler", (_Handler,), {"hub": self})
        self._httpd = ThreadingHTTPServer((self.host, self.port), handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hubserver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._thread.join()
            self._httpd = None
        shutil.rmtree(self._objects, ignore_errors=True)

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    # -- test controls --
    def fail(self, path_regex: str, *, status: int, times: int = 1, method: str | None = None,
             headers: dict | None = None, ranged: bool | None = None, after: int = 0) -> None:
        """Answer the next ``times`` matching requests with ``status`` (e.g. 429 with Retry-After),
        once ``after`` of them have passed; ``ranged``: only footer-style reads of a closed range
        (True), or only the others (False)."""
        with self._lock:
            self._faults.append(Fault(re.compile(path_regex), method, times, status=status, headers=headers or {},
                                      ranged=ranged, after=after))

    def drop(self, path_regex: str, *, after_bytes: int = 0, times: int = 1, method: str = "GET") -> None:
        """For the next ``times`` matching GETs, send the headers and ``after_bytes`` of the body, then
        hang up; for a PUT or POST, read the request and hang up without an answer."""
        with self._lock:
            self._faults.append(Fault(re.compile(path_regex), method, times, drop_after=after_bytes))

    def hold(self, path_regex: str, *, timeout: float = 60.0) -> threading.Event:
        """Keep downloads of matching paths (GETs to a file's end; HEADs and footer reads pass)
        waiting until the returned event is set, or ``timeout`` seconds (a test that fails must
        not hang): a file that stays missing while the test looks at what the client does."""
        released = threading.Event()
        with self._lock:
            self._holds.append((re.compile(path_regex), released, timeout))
        return released

    def _wait_if_held(self, path: str) -> None:
        with self._lock:
            holds = [(event, timeout) for pattern, event, timeout in self._holds if pattern.search(path)]
        for event, timeout in holds:
            event.wait(timeout)

    def _write_log(self, record: Logged) -> None:
        if self.log_file is None:
            return
        with self._lock, self.log_file.open("a") as f:
            f.write(json.dumps(asdict(record)) + "\n")

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def downloads(self, path: str | None = None) -> list[Logged]:
        """Successful GETs of resolve URLs that carry a file to its end (optionally of one repo
        path): a whole file, or the rest of one after a dropped connection (``Range: bytes=N-``)."""
        return [r for r in self._bodies(path) if not _closed_range(r.range)]

    def partial_reads(self, path: str | None = None) -> list[Logged]:
        """Successful GETs of a closed byte range (``Range: bytes=A-B``), e.g. a parquet footer."""
        return [r for r in self._bodies(path) if _closed_range(r.range)]

    def uploads(self) -> list[Logged]:
        """Successful LFS object uploads (``PUT /lfs-upload/REPO/OID``)."""
        return [r for r in self.requests if r.method == "PUT" and r.path.startswith("/lfs-upload/") and r.status == 200]

    def commits(self) -> list[Logged]:
        """Successful commits (``POST /api/datasets/REPO/commit/REV``)."""
        return [r for r in self.requests if r.method == "POST" and "/commit/" in r.path and r.status == 200]

    def _bodies(self, path: str | None) -> list[Logged]:
        return [r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.status in (200, 206)
                and (path is None or r.path.endswith("/" + quote(path)))]

    def _through_link(self, n: int) -> None:
        """Wait until the link has carried the bytes sent before, then ``n`` more (first come, first
        served). A token bucket of ``LINK_BURST`` seconds: a sender woken late (a busy machine)
        catches up as a kernel's socket buffers would, yet no window carries more than that extra."""
        with self._lock:
            now = time.monotonic()
            start = max(self._link_free, now - LINK_BURST)
            self._link_free = start + n / self.link_rate
            until = self._link_free
        time.sleep(max(0.0, until - now))

    def _take_fault(self, method: str, path: str, range_header: str | None = None) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.ranged is not None and fault.ranged != _closed_range(range_header):
                    continue
                if fault.times > 0 and (fault.method in (None, method)) and fault.pattern.search(path):
                    if fault.after > 0:
                        fault.after -= 1
                        continue
                    fault.times -= 1
                    return fault
        return None

    # -- the repo --
    @property
    def api_path(self) -> str:
        """``/api/datasets/REPO`` or ``/api/models/REPO``."""
        return f"/api/{self.repo_type}s/{self.repo}"

    @property
    def repo_path(self) -> str:
        """Where ``resolve`` URLs start: ``/datasets/REPO``, or ``/REPO`` for a model."""
        return f"/datasets/{self.repo}" if self.repo_type == "dataset" else f"/{self.repo}"

    def may_download(self, authorization: str | None) -> int | None:
        """None when a file may be downloaded, else the status a gated repo answers (401, 403)."""
        if not self.gated:
            return None
        user = self.user(authorization)
        if user is None:
            return 401
        return None if self.granted is None or user in self.granted else 403

    def files(self) -> list[str]:
        if not self.exists:
            return []
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def user(self, authorization: str | None) -> str | None:
        """The user a ``Bearer`` token belongs to; None for none or an unknown one."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        return self.tokens.get(authorization[len("Bearer "):].strip())

    def may_write(self, user: str, repo: str) -> bool:
        return repo.split("/")[0] == user

    def remote_oid(self, path: str) -> str | None:
        """What preupload reports of the file at ``path``: sha256 for LFS, git blob sha1, or None."""
        if path not in self.files():
            return None
        e = self.entry(path)
        return e["lfs"]["oid"] if "lfs" in e else e["oid"]

    def signature(self, oid: str) -> str:
        """What makes an upload URL presigned: only the batch API hands it out."""
        return hashlib.sha256(f"{self.repo}:{oid}:{id(self)}".encode()).hexdigest()[:16]

    def has_object(self, oid: str, size: int) -> bool:
        f = self._objects / oid
        return f.is_file() and f.stat().st_size == size

    def apply_commit(self, lines: list[dict]) -> str | None:
        """Apply an NDJSON commit's operations; a new commit id, or the reason it is refused."""
        with self._lock:
            for item in lines[1:]:
                if item.get("key") == "lfsFile":
                    v = item["value"]
                    if not (self._objects / v["oid"]).is_file():
                        return f"LFS object {v['oid']} of {v['path']} was never uploaded"
                elif item.get("key") in ("deletedFile", "deletedFolder"):
                    if not (self.root / item["value"]["path"]).exists():
                        return f"A file with this name doesn't exist: {item['value']['path']}"
            for item in lines[1:]:
                key, v = item.get("key"), item.get("value", {})
                target = self.root / v.get("path", "")
                if key in ("file", "lfsFile"):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    tmp = target.with_name(target.name + ".hubserver-tmp")
                    if key == "file":
                        tmp.write_bytes(base64.b64decode(v["content"]))
                    else:
                        shutil.copyfile(self._objects / v["oid"], tmp)
                    os.replace(tmp, target)
                elif key == "deletedFile":
                    target.unlink()
                elif key == "deletedFolder":
                    shutil.rmtree(target)
            self.commit = hashlib.sha1(f"{self.repo}@{self.commit}@{time.time_ns()}".encode()).hexdigest()
            self.committed.append([item["value"]["path"] for item in lines[1:]])
            return None

    def entry(self, path: str) -> dict:
        """The tree entry of a file: its size and git and LFS hashes, computed once per version of it."""
        st = (self.root / path).stat()
        signature = (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)
        cached = self._entries.get(path)
        if cached is None or cached[0] != signature:
            cached = self._entries[path] = (signature, self._hashed(path))
        return copy.deepcopy(cached[1])  # a caller's changes stay its own

    def _hashed(self, path: str) -> dict:
        data = (self.root / path).read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        out = {"type": "file", "oid": blob, "size": len(data), "path": path}
        if path.endswith(LFS_SUFFIXES):
            sha256 = hashlib.sha256(data).hexdigest()
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(data)}\n"
            out["oid"] = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer.encode()).hexdigest()
            out["lfs"] = {"oid": sha256, "size": len(data), "pointerSize": len(pointer)}
        return out

    def etag(self, path: str) -> str:
        e = self.entry(path)
        return e["lfs"]["oid"] if "lfs" in e else e["oid"]

    def tree(self, folder: str, *, recursive: bool) -> list[dict] | None:
        files = self.files()
        prefix = folder.strip("/") + "/" if folder.strip("/") else ""
        if prefix and not any(f.startswith(prefix) for f in files):
            return None
        out: dict[str, dict] = {}
        for f in files:
            if not f.startswith(prefix):
                continue
            rest = f[len(prefix):].split("/")
            if recursive:
                for i in range(1, len(rest)):
                    d = prefix + "/".join(rest[:i])
                    out.setdefault(d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
                out[f] = self.entry(f)
            elif len(rest) == 1:
                out[f] = self.entry(f)
            else:
                d = prefix + rest[0]
                out.setdefault(d, {"type": "directory", "oid": hashlib.sha1(d.encode()).hexdigest(), "size": 0, "path": d})
        return [out[k] for k in sorted(out)]


class _Handler(BaseHTTPRequestHandler):
    hub: HubServer
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    # -- plumbing --
    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, *, head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if "Content-Length" not in (headers or {}):
            self.send_header("Content-Length", str(len(body)))
        # Logged before the headers go out: a client that has the whole answer (a HEAD's is its
        # headers) must find its request in the log (logging after the write raced the test thread
        # that reads the log).
        self.hub.requests.append(self._logged(status, 0 if head else len(body)))
        self.end_headers()
        sent = 0
        try:
            if not head:
                self.wfile.write(body)
                sent = len(body)
        finally:
            self.hub._write_log(self._logged(status, sent))

    def _logged(self, status: int, sent: int) -> Logged:
        return Logged(self.command, self.path, self.headers.get("Range"), status, client=self.client_address[0], sent=sent)

    def _json(self, status: int, obj, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), {"Content-Type": "application/json", **(headers or {})})

    def _error(self, status: int, code: str, message: str, *, head: bool = False) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code:
            headers["X-Error-Code"] = code
        self._send(status, body, headers, head=head)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    def do_POST(self) -> None:
        self._write()

    def do_PUT(self) -> None:
        self._write()

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def _dispatch(self, *, head: bool) -> None:
        hub = self.hub
        fault = hub._take_fault(self.command, self.path, self.headers.get("Range"))
        if fault is not None and fault.status is not None:
            self._send(fault.status, b"injected fault", {"Content-Type": "text/plain", **fault.headers}, head=head)
            return
        url = urlsplit(self.path)
        path = unquote(url.path)
        query = parse_qs(url.query)
        api = hub.api_path
        resolve = hub.repo_path + "/resolve/"
        if path == "/api/whoami-v2":
            self._whoami()
        elif path.startswith(api + "/auth-check"):
            self._auth_check(write=path.endswith("/write"))
        elif not hub.exists and (path == api or path.startswith((api + "/", resolve))):
            self._error(404, "RepoNotFound", "Repository not found", head=head)
        elif path.startswith(("/api/datasets/", "/api/models/")) and not path.startswith(api + "/") and path != api:
            self._error(404, "RepoNotFound", "Repository not found", head=head)
        elif path == api or path.startswith(api + "/revision/"):
            rev = path[len(api + "/revision/"):] if path != api else "main"
            if not self._known_revision(rev):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
                return
            self._json(200, {"id": hub.repo, "sha": hub.commit, "private": False, "gated": "manual" if hub.gated else False,
                             "disabled": False,
                             "siblings": [{"rfilename": f} for f in hub.files()]})
        elif path.startswith(api + "/tree/"):
            rev, _, folder = path[len(api + "/tree/"):].partition("/")
            if not self._known_revision(rev):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
                return
            entries = hub.tree(folder, recursive=query.get("recursive", ["false"])[0].lower() == "true")
            if entries is None or (folder and not hub.list_subfolders):
                self._error(404, "EntryNotFound", f"{folder} does not exist on {rev}", head=head)
                return
            self._paged(entries, query)
        elif path.startswith(resolve):
            rev, _, file = path[len(resolve):].partition("/")
            denied = hub.may_download(self.headers.get("Authorization"))
            if denied == 401:
                self._error(401, "GatedRepo", f"Access to {hub.repo_type} {hub.repo} is restricted. You must have access "
                            "to it and be authenticated to access it. Please log in.", head=head)
            elif denied == 403:
                self._error(403, "GatedRepo", f"Access to {hub.repo_type} {hub.repo} is restricted and you are not in "
                            f"the authorized list. Visit {hub.url}/{hub.repo} to ask for access.", head=head)
            elif not self._known_revision(rev):
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            elif not (hub.root / file).is_file() or file not in hub.files():
                self._error(404, "EntryNotFound", f"{file} does not exist on {rev}", head=head)
            else:
                self._file(file, head=head, drop_after=fault.drop_after if fault else None)
        elif path.startswith(("/datasets/", "/api/")) or re.match(r"/[^/]+/[^/]+/resolve/", path):
            self._error(404, "RepoNotFound", "Repository not found", head=head)
        else:
            self._send(404, b"not found", head=head)

    # -- writes --
    def _write(self) -> None:
        """POST and PUT: faults first (after reading the request, as a server would), then the route."""
        hub = self.hub
        fault = hub._take_fault(self.command, self.path)
        path = unquote(urlsplit(self.path).path)
        api = f"/api/datasets/{hub.repo}"
        if path.startswith("/lfs-upload/"):
            body = None  # streamed to disk below
        else:
            body = self._body()
        if fault is not None:
            if body is None:
                self._drain()
            if fault.status is not None:
                self._send(fault.status, b"injected fault", {"Content-Type": "text/plain", **fault.headers})
            else:
                self._hang_up()
            return
        if path == "/api/validate-yaml":
            self._json(200, {"warnings": []})
            return
        if path == "/api/repos/create":
            self._create_repo(json.loads(body or b"{}"))
            return
        if path.startswith(f"/lfs-upload/{hub.repo}/"):  # a presigned URL, as the Hub's are: no token
            oid = path.rsplit("/", 1)[1]
            if parse_qs(urlsplit(self.path).query).get("sig") != [hub.signature(oid)]:
                self._drain()
                self._error(403, "", "bad signature")
            else:
                self._lfs_put(oid)
            return
        user = hub.user(self.headers.get("Authorization"))
        if user is None:
            if body is None:
                self._drain()
            self._error(401, "", "Invalid username or password.")
            return
        repo = hub.repo if path.startswith((api + "/", f"/datasets/{hub.repo}.git/", f"/lfs-verify/{hub.repo}")) else None
        if repo is None or not hub.exists:
            self._error(404, "RepoNotFound", "Repository not found")
            return
        if not hub.may_write(user, repo):
            self._error(403, "", f"You don't have the rights to write to {repo}")
            return
        if path.startswith(api + "/preupload/"):
            self._preupload(json.loads(body))
        elif path == f"/datasets/{hub.repo}.git/info/lfs/objects/batch":
            self._lfs_batch(json.loads(body))
        elif path == f"/lfs-verify/{hub.repo}":
            v = json.loads(body)
            if hub.has_object(v["oid"], v["size"]):
                self._json(200, {"success": True})
            else:
                self._error(404, "", f"object {v['oid']} not found")
        elif path.startswith(api + "/commit/"):
            self._commit(body)
        else:
            self._error(404, "", f"no such endpoint: {self.command} {path}")

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            return b"".join(self._chunks())
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def _chunks(self):
        """The pieces of a ``Transfer-Encoding: chunked`` request body, as they arrive."""
        while True:
            size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return
            yield self.rfile.read(size)
            self.rfile.readline()

    def _stream_body(self):
        """The request body in pieces of at most 1 MiB: an upload is never held whole."""
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            yield from self._chunks()
            return
        left = int(self.headers.get("Content-Length") or 0)
        while left > 0:
            piece = self.rfile.read(min(left, 2**20))
            if not piece:
                raise ConnectionError("request body ended early")
            left -= len(piece)
            yield piece

    def _drain(self) -> None:
        for _ in self._stream_body():
            pass

    def _hang_up(self) -> None:
        self.hub.requests.append(Logged(self.command, self.path, None, 0))
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _whoami(self) -> None:
        user = self.hub.user(self.headers.get("Authorization"))
        if user is None:
            self._error(401, "", "Invalid credentials in Authorization header")
            return
        self._json(200, {"type": "user", "name": user, "orgs": [],
                         "auth": {"type": "access_token", "accessToken": {"displayName": "test", "role": "write"}}})

    def _auth_check(self, *, write: bool) -> None:
        hub = self.hub
        user = hub.user(self.headers.get("Authorization"))
        if not hub.exists:
            self._error(404, "RepoNotFound", "Repository not found")
        elif write and user is None:
            self._error(401, "", "Invalid username or password.")
        elif write and not hub.may_write(user, hub.repo):
            self._error(403, "", f"You don't have the rights to write to {hub.repo}")
        else:
            self._json(200, {})

    def _create_repo(self, payload: dict) -> None:
        hub = self.hub
        user = hub.user(self.headers.get("Authorization"))
        repo = f"{payload.get('organization') or user}/{payload.get('name')}"
        if user is None:
            self._error(401, "", "Invalid username or password.")
        elif not hub.may_write(user, repo):
            self._error(403, "", f"You don't have the rights to create a repo in {repo.split('/')[0]}")
        elif repo != hub.repo or payload.get("type") != "dataset":
            self._error(400, "", f"this stand-in serves only dataset {hub.repo}")
        elif hub.exists:
            self._error(409, "", "You already created this dataset repo")
        else:
            hub.exists = True
            self._json(200, {"url": f"{hub.url}/datasets/{repo}", "name": repo, "id": repo})

    def _preupload(self, payload: dict) -> None:
        files = [{"path": f["path"], "uploadMode": "lfs" if f["path"].endswith(LFS_SUFFIXES) else "regular",
                  "shouldIgnore": False, "oid": self.hub.remote_oid(f["path"])} for f in payload["files"]]
        self._json(200, {"files": files, "commitOid": self.hub.commit})

    def _lfs_batch(self, payload: dict) -> None:
        hub = self.hub
        objects = []
        for o in payload["objects"]:
            entry = {"oid": o["oid"], "size": o["size"], "authenticated": True}
            if not hub.has_object(o["oid"], o["size"]):
                entry["actions"] = {"upload": {"href": f"{hub.url}/lfs-upload/{hub.repo}/{o['oid']}?sig={hub.signature(o['oid'])}"},
                                    "verify": {"href": f"{hub.url}/lfs-verify/{hub.repo}"}}
            objects.append(entry)
        self._send(200, json.dumps({"transfer": "basic", "objects": objects}).encode(),
                   {"Content-Type": "application/vnd.git-lfs+json"})

    def _lfs_put(self, oid: str) -> None:
        hub = self.hub
        tmp = hub._objects / f"{oid}.{threading.get_ident()}.part"
        digest = hashlib.sha256()
        try:
            with open(tmp, "wb") as f:
                for piece in self._stream_body():
                    digest.update(piece)
                    f.write(piece)
        except (ConnectionError, OSError):
            tmp.unlink(missing_ok=True)
            self.close_connection = True
            return
        if digest.hexdigest() != oid:
            tmp.unlink()
            self._error(400, "", f"sha256 of the body is {digest.hexdigest()}, not {oid}")
            return
        os.replace(tmp, hub._objects / oid)
        self._send(200, b"", {"ETag": f'"{oid}"'})

    def _commit(self, body: bytes) -> None:
        hub = self.hub
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            self._error(400, "", "the commit's first line must be its header")
            return
        problem = hub.apply_commit(lines)
        if problem is not None:
            self._error(404 if "doesn't exist" in problem else 422, "", problem)
            return
        self._json(200, {"commitUrl": f"{hub.url}/datasets/{hub.repo}/commit/{hub.commit}", "commitOid": hub.commit,
                         "pullRequestUrl": None, "success": True})

    def _known_revision(self, rev: str) -> bool:
        return rev in self.hub.branches or rev == self.hub.commit

    def _paged(self, entries: list[dict], query: dict) -> None:
        size = self.hub.page_size
        if not size:
            self._json(200, entries)
            return
        start = int(query.get("cursor", ["0"])[0])
        headers = {}
        if start + size < len(entries):
            url = urlsplit(self.path)
            rest = {k: v[0] for k, v in query.items() if k != "cursor"}
            qs = "&".join(f"{k}={quote(v)}" for k, v in rest.items())
            host = self.headers.get("Host")
            headers["Link"] = f'<http://{host}{url.path}?{qs}&cursor={start + size}>; rel="next"'
        self._json(200, entries[start:start + size], headers)

    def _file(self, file: str, *, head: bool, drop_after: int | None) -> None:
        """A file, or the range of it asked for. Its bytes go from the page cache to the socket
        (``sendfile``), as a server's would: this server runs on the client's own cores."""
        hub = self.hub
        path = hub.root / file
        size = path.stat().st_size
        etag = hub.etag(file)
        headers = {"X-Repo-Commit": hub.commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream"}
        if file.endswith(LFS_SUFFIXES):
            headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
        status, first, length = 200, 0, size
        wanted = self.headers.get("Range")
        if wanted and not head:
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", wanted.strip())
            if not m or int(m.group(1)) >= size:
                self._send(416, b"", {"Content-Range": f"bytes */{size}"})
                return
            first = int(m.group(1))
            last = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            length = max(0, last - first + 1)
            status = 206
            headers["Content-Range"] = f"bytes {first}-{first + length - 1}/{size}"
        headers["Content-Length"] = str(length)
        if not head and not _closed_range(wanted):
            hub._wait_if_held(file)
        if (hub.rate or hub.link_rate) and not head:
            self._trickle(status, path, first, length, headers)
            return
        if drop_after is None or head:
            self._send(status, b"" if head else _read(path, first, length), headers, head=head)
            return
        # Hang up mid-body: the client sees fewer bytes than Content-Length promised.
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        part = _read(path, first, min(drop_after, length))
        self.wfile.write(part)
        self.wfile.flush()
        self.hub.requests.append(self._logged(-status, len(part)))
        self.hub._write_log(self.hub.requests[-1])
        self.close_connection = True
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _trickle(self, status: int, path: Path, first: int, length: int, headers: dict) -> None:
        """Send ``length`` bytes of ``path`` from ``first`` at ``hub.rate`` bytes/s and through
        ``hub.link_rate``; a client that hangs up just ends it."""
        hub = self.hub
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        step = max(1, min(r for r in (hub.rate, hub.link_rate) if r) // 20)
        sent = 0
        try:
            with path.open("rb") as f:
                while sent < length:
                    n = min(step, length - sent)
                    if hub.link_rate:
                        hub._through_link(n)
                    if self.connection.sendfile(f, first + sent, n) < n:
                        raise ConnectionError(f"{path}: shorter than when its size was read")
                    sent += n
                    if hub.rate:
                        time.sleep(n / hub.rate)
        except OSError:
            self.close_connection = True
            hub._write_log(self._logged(status, sent))
            return
        self.hub.requests.append(self._logged(status, sent))
        hub._write_log(self.hub.requests[-1])


def _read(path: Path, first: int, length: int) -> bytes:
    with path.open("rb") as f:
        f.seek(first)
        return f.read(length)


def _closed_range(header: str | None) -> bool:
    return bool(header and re.fullmatch(r"bytes=\d+-\d+", header.strip()))


def main() -> None:
    p = argparse.ArgumentParser(description="Serve a folder as a dataset or model repo to huggingface_hub (HF_ENDPOINT).")
    p.add_argument("root")
    p.add_argument("--repo", default="HuggingFaceFW/fineweb")
    p.add_argument("--repo-type", choices=("dataset", "model"), default="dataset",
                   help="serve a model repo (e.g. a tokenizer's files for --encoding ORG/NAME)")
    p.add_argument("--page-size", type=int)
    p.add_argument("--rate", type=float, metavar="MB_S", help="cap all downloads together at this many MB/s")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=0, help="port to listen on (default: a free one)")
    p.add_argument("--log", type=Path, metavar="FILE", help="append one JSON line per request to FILE")
    p.add_argument("--token", action="append", default=[], metavar="TOKEN=USER",
                   help="a token that may write to USER's repos (repeatable)")
    a = p.parse_args()
    with HubServer(Path(a.root), repo=a.repo, page_size=a.page_size, link_rate=int(a.rate * 1e6) if a.rate else None,
                   host=a.host, port=a.port, log_file=a.log, tokens=dict(t.split("=", 1) for t in a.token),
                   repo_type=a.repo_type) as hub:
        print(f"HF_ENDPOINT={hub.url}  (repo {hub.repo}, commit {hub.commit}); Ctrl-C stops", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
