"""An HTTP proxy for tests, in front of a storage emulator: it forwards every request and can,
by rule, answer instead (a 429 or 503 burst, a 401/403 the emulator would never send, a 412 the
emulator does not enforce) or hold a request until released (a client caught mid-upload).

    proxy = FaultProxy("127.0.0.1", upstream_port).start()
    proxy.url                                   http://127.0.0.1:PORT
    proxy.fail(lambda r: r.method == "PUT", status=503, times=2)   # the next two PUTs get 503
    proxy.hold(lambda r: "upload_id" in r.query)                   # such requests wait...
    proxy.held.wait(30)                                            # ...until one does
    proxy.log                                                      # every request seen (Request)
    proxy.stop()

Runs in a thread of the test process (so its rules are plain functions); one upstream
connection per request, bodies read whole (Content-Length or chunked) and answered with a
Content-Length, which is all the storage clients here send and expect.
"""
from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    size: int

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass
class Rule:
    match: Callable[[Request], bool]
    status: int = 503
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    hold: threading.Event | None = None
    hits: int = 0


class FaultProxy:
    def __init__(self, host: str, upstream_port: int):
        self.host, self.upstream_port = host, upstream_port
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self.answered: list[tuple[Request, int]] = []
        self.held = threading.Event()
        """Set when a request is being held."""
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                proxy._handle(self)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = do_PATCH = do_OPTIONS = _any

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True, name="fault-proxy")

    def start(self) -> "FaultProxy":
        self._thread.start()
        return self

    def stop(self) -> None:
        for rule in self.rules:
            if rule.hold is not None:
                rule.hold.set()
        self.server.shutdown()
        self.server.server_close()

    # rules
    def fail(self, match: Callable[[Request], bool], *, status: int, times: int = 1, body: bytes | dict = b"",
             headers: dict[str, str] | None = None) -> Rule:
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        rule = Rule(match=match, status=status, body=body, headers=dict(headers or {}), times=times)
        with self._lock:
            self.rules.append(rule)
        return rule

    def hold(self, match: Callable[[Request], bool]) -> threading.Event:
        """Requests matching are held (never forwarded nor answered) until the returned event is set."""
        release = threading.Event()
        with self._lock:
            self.rules.append(Rule(match=match, times=10**9, hold=release))
        return release

    def clear(self) -> None:
        with self._lock:
            for rule in self.rules:
                if rule.hold is not None:
                    rule.hold.set()
            self.rules.clear()

    # the work
    def _read_body(self, handler: BaseHTTPRequestHandler) -> bytes:
        if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
            pieces = []
            while True:
                size = int(handler.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while handler.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(pieces)
                pieces.append(handler.rfile.read(size))
                handler.rfile.readline()
        return handler.rfile.read(int(handler.headers.get("Content-Length") or 0))

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        parsed = urllib.parse.urlsplit(handler.path)
        body = self._read_body(handler)
        request = Request(method=handler.command, path=parsed.path, query=urllib.parse.parse_qs(parsed.query),
                          headers={k.lower(): v for k, v in handler.headers.items()}, size=len(body))
        with self._lock:
            self.log.append(request)
            rule = next((r for r in self.rules if r.hits < r.times and r.match(request)), None)
            if rule is not None:
                rule.hits += 1
        if rule is not None and rule.hold is not None:
            self.held.set()
            rule.hold.wait()
            handler.close_connection = True
            return
        if rule is not None:
            self._answer(handler, request, rule.status, rule.body, rule.headers)
            return
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.host, self.upstream_port, timeout=120)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            keep = ("transfer-encoding", "connection") if request.method == "HEAD" else \
                ("transfer-encoding", "connection", "content-length")
            self._answer(handler, request, reply.status, data,
                         {k: v for k, v in reply.getheaders() if k.lower() not in keep})
        finally:
            upstream.close()

    def _answer(self, handler, request: Request, status: int, body: bytes, headers: dict[str, str]) -> None:
        with self._lock:
            self.answered.append((request, status))
        handler.send_response(status)
        for k, v in headers.items():
            handler.send_header(k, v)
        if request.method == "HEAD":  # the upstream's Content-Length (the object's size) went with the headers
            if not any(k.lower() == "content-length" for k in headers):
                handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)
