"""An HTTP proxy for tests, in front of a storage emulator: it forwards every request and can,
by rule, fail as the real stores and networks do: answer instead (a 429 or 503 burst with the
store's own body, a 401/403 the emulator would never send, a 412 the emulator does not enforce),
reset the connection (before the request reaches the store, or after: the store acted and the
reply is lost), cut a reply's body short (reset, or closed cleanly, half-way), give no answer for
a while, or hold a request until released (a client caught mid-upload).

    proxy = FaultProxy("127.0.0.1", upstream_port).start()
    proxy.url                                   http://127.0.0.1:PORT
    proxy.fail(lambda r: r.method == "PUT", times=2, **GCS_503)    # the next two PUTs get GCS's 503
    proxy.fail(match, times=1, **retry_after(AZURE_503, 1))        # ...with Retry-After: 1
    proxy.fault(match, "reset")                  # the connection is reset, nothing forwarded
    proxy.fault(match, "reset", forward=True)    # forwarded (the store acts), then reset: no reply
    proxy.fault(match, "cut", forward=True)      # the store's reply, its body reset half-way
    proxy.fault(match, "short", forward=True)    # ...or closed cleanly half-way (body cut in half)
    proxy.fault(match, "stall", seconds=3)       # no answer for 3 s, then the connection closes
    proxy.guard(check)                           # check(request) -> None (forward) or an answer to give:
                                                 # a precondition the emulator does not enforce, say
    proxy.hold(lambda r: "upload_id" in r.query)                   # such requests wait...
    proxy.held.wait(30)                                            # ...until one does
    proxy.log                                                      # every request seen (Request)
    proxy.stop()

The stores' own error bodies are here as answers to give (``GCS_429``, ``GCS_503``, ``AZURE_503``
(ServerBusy), ``AZURE_500`` (OperationTimedOut), ``S3_503`` (SlowDown)), each the status, body and
headers that store sends (their documented error formats).

Runs in a thread of the test process (so its rules are plain functions); one upstream
connection per request, bodies read whole (Content-Length or chunked) and answered with a
Content-Length, which is all the storage clients here send and expect.
"""
from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

ACTIONS = ("answer", "reset", "cut", "short", "stall", "hold")


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, list[str]]
    headers: dict[str, str]
    size: int
    body: bytes = field(default=b"", repr=False)

    def header(self, name: str) -> str:
        return self.headers.get(name.lower(), "")


@dataclass
class Rule:
    match: Callable[[Request], bool]
    status: int | None = 503
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    times: int = 1
    hold: threading.Event | None = None
    hits: int = 0
    action: str = "answer"
    forward: bool = False
    """Forward the request first (the store does the work), then fail the reply as ``action`` says."""
    seconds: float = 0.0


def _xml_error(code: str, message: str) -> bytes:
    return (f'\ufeff<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code><Message>{message}\n'
            f"RequestId:0f5b8c3e-601e-0062-4d5a-1f0a2b000000\nTime:2026-11-28T10:00:00.0000000Z</Message></Error>").encode()


def _gcs_error(code: int, message: str, reason: str, domain: str = "global") -> dict:
    return {"status": code, "headers": {"Content-Type": "application/json; charset=UTF-8"},
            "body": json.dumps({"error": {"code": code, "message": message,
                                          "errors": [{"message": message, "domain": domain, "reason": reason}]}}).encode()}


GCS_429 = _gcs_error(429, "The rate of change requests to the object b/o exceeds the rate limit. Please reduce the rate "
                          "of create, update, and delete requests.", "rateLimitExceeded", "usageLimits")
GCS_503 = _gcs_error(503, "We encountered an internal error. Please try again.", "backendError")
AZURE_503 = {"status": 503, "headers": {"Content-Type": "application/xml", "x-ms-error-code": "ServerBusy"},
             "body": _xml_error("ServerBusy", "The server is currently unable to receive requests. Please retry your request.")}
AZURE_500 = {"status": 500, "headers": {"Content-Type": "application/xml", "x-ms-error-code": "OperationTimedOut"},
             "body": _xml_error("OperationTimedOut", "Operation could not be completed within the specified time.")}
S3_503 = {"status": 503, "headers": {"Content-Type": "application/xml"},
          "body": b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request '
                  b"rate.</Message><RequestId>4442587FB7D0A2F9</RequestId><HostId>eftixk72aD6Ap51T</HostId></Error>"}


def retry_after(answer: dict, seconds: float) -> dict:
    """``answer`` with a ``Retry-After`` header (whole seconds, as the stores send it)."""
    return {**answer, "headers": {**answer["headers"], "Retry-After": str(seconds)}}


class FaultProxy:
    def __init__(self, host: str, upstream_port: int):
        self.host, self.upstream_port = host, upstream_port
        self.rules: list[Rule] = []
        self.log: list[Request] = []
        self.answered: list[tuple[Request, int]] = []
        """Every reply given (forwarded or made up) with its status; a fault's is its action's name."""
        self.held = threading.Event()
        """Set when a request is being held."""
        self.guards: list[Callable[[Request], dict | None]] = []
        self._lock = threading.Lock()
        self._guarded = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _any(self):
                try:
                    proxy._handle(self)
                except (ConnectionError, OSError):  # the client went away (it timed out, or was killed)
                    self.close_connection = True

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
        """Matching requests are answered ``status`` (with ``body`` and ``headers``), never forwarded."""
        return self.fault(match, "answer", status=status, times=times, body=body, headers=headers)

    def fault(self, match: Callable[[Request], bool], action: str, *, times: int = 1, forward: bool = False,
              status: int | None = None, body: bytes | dict = b"", headers: dict[str, str] | None = None,
              seconds: float = 0.0) -> Rule:
        """Matching requests fail as ``action`` says (``ACTIONS``). ``forward``: the store gets the
        request and answers it first; the fault then happens to its reply (a lost reply, a body cut
        short). Without it, "cut" and "short" cut the answer ``status``/``body``/``headers`` given."""
        if action not in ACTIONS:
            raise ValueError(f"action {action!r}: expected one of {ACTIONS}")
        if isinstance(body, dict):
            body = json.dumps(body).encode()
        rule = Rule(match=match, status=status, body=body, headers=dict(headers or {}), times=times, action=action,
                    forward=forward, seconds=seconds)
        with self._lock:
            self.rules.append(rule)
        return rule

    def guard(self, check: Callable[[Request], dict | None]) -> None:
        """Before a request is forwarded, ``check(request)`` may answer it instead (a dict of ``status``,
        ``body``, ``headers``). Checks and forwarding happen one request at a time, so a check that
        reads the store's state (an object's generation) and the write it lets through are atomic,
        as the real store's precondition is. Cleared by ``clear``."""
        with self._lock:
            self.guards.append(check)

    def hold(self, match: Callable[[Request], bool]) -> threading.Event:
        """Requests matching are held (never forwarded nor answered) until the returned event is set;
        ``held`` is set again only by one of them."""
        release = threading.Event()
        self.held.clear()
        with self._lock:
            self.rules.append(Rule(match=match, times=10**9, hold=release, action="hold"))
        return release

    def clear(self) -> None:
        with self._lock:
            for rule in self.rules:
                if rule.hold is not None:
                    rule.hold.set()
            self.rules.clear()
            self.guards.clear()

    def faults(self, action: str | int, *, since: int = 0) -> int:
        """How many requests met a fault of ``action`` (or were answered the status ``action``), of
        those answered since ``answered[since]`` (a proxy may serve many tests)."""
        with self._lock:
            return sum(1 for _, status in self.answered[since:] if status == action)

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
                          headers={k.lower(): v for k, v in handler.headers.items()}, size=len(body), body=body)
        with self._lock:
            self.log.append(request)
            rule = next((r for r in self.rules if r.hits < r.times and r.match(request)), None)
            if rule is not None:
                rule.hits += 1
        if rule is None:
            self._answer(handler, request, *self._forward(handler, request, body))
            return
        if rule.action == "hold":
            self.held.set()
            rule.hold.wait()
            handler.close_connection = True
            return
        if rule.action == "answer":
            self._answer(handler, request, rule.status, rule.body, rule.headers)
            return
        reply = self._forward(handler, request, body) if rule.forward else (rule.status, rule.body, rule.headers)
        with self._lock:
            self.answered.append((request, rule.action))
        if rule.action == "stall":
            time.sleep(rule.seconds)
            self._reset(handler)
        elif rule.action == "reset" or request.method == "HEAD":  # a HEAD's reply has no body to cut
            self._reset(handler)
        else:  # "cut" or "short": the headers promise the whole body, half of it comes
            status, data, headers = reply
            handler.send_response(status)
            for k, v in headers.items():
                handler.send_header(k, v)
            handler.send_header("Content-Length", str(len(data)))
            handler.end_headers()
            handler.wfile.write(data[:len(data) // 2])
            handler.wfile.flush()
            if rule.action == "cut":
                self._reset(handler)
            else:
                handler.connection.shutdown(socket.SHUT_WR)
                handler.close_connection = True

    def _forward(self, handler: BaseHTTPRequestHandler, request: Request, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        if not self.guards:
            return self._upstream(handler, request, body)
        with self._guarded:
            for check in list(self.guards):
                answer = check(request)
                if answer is not None:
                    return answer["status"], answer["body"], answer["headers"]
            return self._upstream(handler, request, body)

    def _upstream(self, handler: BaseHTTPRequestHandler, request: Request, body: bytes) -> tuple[int, bytes, dict[str, str]]:
        headers = {k: v for k, v in handler.headers.items() if k.lower() not in ("transfer-encoding", "connection")}
        headers["Content-Length"] = str(len(body))
        upstream = http.client.HTTPConnection(self.host, self.upstream_port, timeout=120)
        try:
            upstream.request(handler.command, handler.path, body=body, headers=headers)
            reply = upstream.getresponse()
            data = reply.read()
            keep = ("transfer-encoding", "connection") if request.method == "HEAD" else \
                ("transfer-encoding", "connection", "content-length")
            return reply.status, data, {k: v for k, v in reply.getheaders() if k.lower() not in keep}
        finally:
            upstream.close()

    @staticmethod
    def _reset(handler: BaseHTTPRequestHandler) -> None:
        """Close with a TCP reset (SO_LINGER 0), as a dropped connection or a killed peer does."""
        handler.close_connection = True
        sock = handler.connection
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()

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
