"""No credential in any output: every kind of credential tokenshards takes, each with its request
failing in every way the tests can cause (refused, network down, no answer in time, and for a raw
GCS token Google's tokeninfo unreachable), and every byte the command said searched for the secrets
set: its output (with ``--debug``'s traceback, every cause in the chain), every log record (at DEBUG,
from every library), and what it wrote (the HTML
report, the run's manifest and records, an export's record). What a worker's failure leaves on the
scheduler (the dashboard's text, a worker's log line) is searched too.

Kinds: S3 access keys and session tokens (options and environment); GCS access tokens, service-account
JSON (a file, and inline); Azure account keys, SAS tokens and connection strings (options and
environment); Hugging Face tokens. Each secret is random per run and shaped as the real ones are.
"""
from __future__ import annotations

import base64
import contextlib
import itertools
import json
import logging
import re
import secrets
import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest
from conftest import write_parquet
from hypothesis import example, given
from hypothesis import strategies as st
from faultproxy import S3_503, FaultProxy
from s3server import free_port, s3_proxied  # noqa: F401  (a fixture)
from storecases import FAST_RETRY, store_case
from test_retries import REFUSED

from tokenshards import wording
from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.storage import store

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:google")  # gcsfs's datetime.utcfromtimestamp

QUICK = {**FAST_RETRY, "attempts": 2, "timeout": 0.3}
"""The retry policy here: each failure given up on after one retry, no answer waited for 0.3 s."""


def _forms(value: str) -> set[str]:
    """A secret as an output might carry it: as given, URL-encoded, and each part of a compound one."""
    found = {value, quote(value, safe=""), quote_plus(value)}
    for part in re.split(r"[;&]", value):
        if "=" in part and part.split("=", 1)[0].lower() in ("accountkey", "sig", "sharedaccesssignature"):
            found |= {part.split("=", 1)[1], quote(part.split("=", 1)[1], safe="")}
    return {f for f in found if len(f) >= 8}


def assert_hidden(text: str, hidden: list[str]) -> None:
    for value in hidden:
        for form in _forms(value):
            assert form not in text, f"a secret ({value[:5]}...) was said: ...{text[max(text.find(form) - 120, 0):text.find(form)]}"


@pytest.fixture
def said(capsys, caplog):
    """Everything a command says: its output and every log record any library makes, at DEBUG."""
    caplog.set_level(logging.DEBUG)

    class Said:
        def begin(self) -> None:
            """What the test itself did before (making buckets with its own keys) is not the command's."""
            capsys.readouterr()
            caplog.clear()

        def __call__(self, *files: Path) -> str:
            out, err = capsys.readouterr()
            records = "\n".join(caplog.handler.format(r) for r in caplog.records)
            written = "\n".join(f.read_text(errors="replace") for f in files if f.exists())
            return "\n".join((out, err, records, written))

    return Said()


def _argv(options: dict) -> list[str]:
    argv = []
    for key, value in options.items():
        argv += ["--storage-option", f"{key}={json.dumps(value) if isinstance(value, dict) else value}"]
    return argv


def _closed_port() -> str:
    return f"http://127.0.0.1:{free_port()}"


class _SilentTunnel:
    """A proxy that opens every CONNECT tunnel and then sends nothing: the client's TLS handshake
    times out as a ReadTimeout whose text names the host only, never the URL (a stalled proxy gives
    that or a ProxyError that names the URL, by timing: CI met the first, 28 Nov)."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}"
        self.held: list = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = self.server.accept()
                request = b""
                while b"\r\n\r\n" not in request and (chunk := conn.recv(4096)):
                    request += chunk
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                self.held.append(conn)  # open and silent until stop()

    def stop(self) -> None:
        self.server.close()
        for conn in self.held:
            conn.close()


def _error_line(text: str) -> str:
    """The command's one error line (``--debug`` printed the traceback before it, every cause in it:
    searched too)."""
    lines = [line for line in text.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


# -- S3 ---------------------------------------------------------------------------------------------------

S3_EXPIRED = {"status": 400, "headers": {"Content-Type": "application/xml"},
              "body": b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>ExpiredToken</Code><Message>The provided '
                      b"token has expired.</Message></Error>"}


@pytest.mark.parametrize("given", ["options", "session token", "environment"])
@pytest.mark.parametrize("failure", ["refused", "down", "no answer"])
def test_s3_keys_and_session_tokens(request, tmp_path, monkeypatch, said, given, failure):
    case = store_case(request, "s3")
    key = "AKIA" + secrets.token_hex(8).upper()
    secret = base64.b64encode(secrets.token_bytes(30)).decode()
    token = "FwoGZXIvYXdzE" + base64.b64encode(secrets.token_bytes(90)).decode()
    endpoint = _closed_port() if failure == "down" else case.proxy.url
    options = {"client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}, "retry": QUICK}
    if given == "environment":
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
        monkeypatch.setenv("AWS_SESSION_TOKEN", token)
        for name in ("AWS_PROFILE", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"):
            monkeypatch.setenv(name, "/dev/null") if name != "AWS_PROFILE" else monkeypatch.delenv(name, raising=False)
    else:
        options.update(key=key, secret=secret, **({"token": token} if given == "session token" else {}))
    if failure == "refused":
        case.proxy.fail(lambda r: True, times=10**6, **(S3_EXPIRED if given != "options" else REFUSED["s3"]))
    elif failure == "no answer":
        case.proxy.fault(lambda r: True, "stall", times=10**6, seconds=1.0)
    said.begin()
    code = main(["--debug", "verify", case.url("run"), *_argv(options)])
    text = said()
    line = _error_line(text)
    assert code == 2 and line.startswith(f"tokenshards: error: cannot read {case.url('run')}/manifest.json: ")
    assert_hidden(text, [key, secret, token])


# -- GCS --------------------------------------------------------------------------------------------------

def _access_token() -> str:
    return "ya29.a0" + base64.urlsafe_b64encode(secrets.token_bytes(120)).decode().rstrip("=")


@pytest.mark.parametrize("failure", ["refused", "down", "no answer", "tunnel, no answer"])
def test_gcs_tokeninfo_unreachable(request, monkeypatch, said, failure):
    """gcsfs asks Google's tokeninfo for a raw token's expiry, the token in the URL's query; here no
    request reaches Google: through a proxy (HTTPS_PROXY) that refuses, is not there, or never answers."""
    import gcsfs.credentials

    gcs = request.getfixturevalue("gcs")
    token = _access_token()
    stall = FaultProxy("127.0.0.1", free_port()).start()
    request.addfinalizer(stall.stop)
    stall.fault(lambda r: True, "stall", times=10**6, seconds=2.0)
    tunnel = _SilentTunnel()
    request.addfinalizer(tunnel.stop)
    proxy = {"refused": _closed_port(), "down": "http://no-such-proxy.invalid:3128", "no answer": stall.url,
             "tunnel, no answer": tunnel.url}[failure]
    monkeypatch.setenv("HTTPS_PROXY", proxy)
    monkeypatch.delenv("FETCH_RAW_TOKEN_EXPIRY", raising=False)
    monkeypatch.setattr(gcsfs.credentials, "TOKEN_INFO_TIMEOUT_SECONDS", 0.5)
    options = {"gcs": {"endpoint_url": gcs.endpoint_url, "token": token}, "retry": QUICK}
    said.begin()
    code = main(["--debug", "verify", f"gs://{gcs.make_bucket()}/run", *_argv(options)])
    text = said()
    line = _error_line(text)
    assert code == 2 and "its credentials could not be loaded" in line and "FETCH_RAW_TOKEN_EXPIRY=false" in line
    assert "tokeninfo?access_token=<hidden>" in line
    assert_hidden(text, [token])


def _service_account(token_uri: str) -> dict:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    return {"type": "service_account", "project_id": "p", "private_key_id": secrets.token_hex(20), "private_key": pem,
            "client_email": "tokenshards@p.iam.gserviceaccount.com", "client_id": "1", "token_uri": token_uri}


@pytest.mark.parametrize("kind", ["access token", "service account file", "service account inline"])
@pytest.mark.parametrize("failure", ["refused", "down", "no answer"])
def test_gcs_tokens_and_service_accounts(request, tmp_path, monkeypatch, said, kind, failure):
    gcs = request.getfixturevalue("gcs")
    case = store_case(request, "gcs")
    monkeypatch.setenv("FETCH_RAW_TOKEN_EXPIRY", "false")
    endpoint = _closed_port() if failure == "down" and kind == "access token" else gcs.endpoint_url
    hidden = []
    if kind == "access token":
        token = _access_token()
        hidden.append(token)
        if failure == "refused":
            case.proxy.fail(lambda r: True, times=10**6, **REFUSED["gcs"])
    else:
        # The key is refused (or not answered for) by its token endpoint, here the proxy: never Google.
        token_uri = _closed_port() + "/token" if failure == "down" else f"{gcs.endpoint_url}/token"
        if failure == "no answer":
            pytest.skip("google-auth waits 120 s for a token endpoint (its own default, not a setting we reach)")
        account = _service_account(token_uri)
        hidden += [account["private_key"], account["private_key_id"]]
        hidden += [line for line in account["private_key"].splitlines() if "PRIVATE KEY" not in line]
        case.proxy.fail(lambda r: r.path == "/token", times=10**6, status=400,
                        body={"error": "invalid_grant", "error_description": "Invalid JWT Signature."})
        if kind == "service account file":
            path = tmp_path / "sa.json"
            path.write_text(json.dumps(account))
            token = str(path)
        else:
            token = account
    if failure == "no answer":
        case.proxy.fault(lambda r: True, "stall", times=10**6, seconds=1.0)
    options = {"gcs": {"endpoint_url": endpoint, "token": token}, "retry": QUICK}
    said.begin()
    code = main(["--debug", "verify", case.url("run"), *_argv(options)])
    text = said()
    line = _error_line(text)
    assert code == 2 and line.startswith(f"tokenshards: error: cannot read {case.url('run')}/manifest.json: "), line
    if kind != "access token":
        assert "service account tokenshards@p.iam.gserviceaccount.com" in line
    assert_hidden(text, hidden)


# -- Azure ------------------------------------------------------------------------------------------------

def _sas() -> str:
    return (f"sv=2023-11-03&ss=b&srt=co&sp=rwdlac&se=2030-01-01T00:00:00Z&spr=https,http&"
            f"sig={quote(base64.b64encode(secrets.token_bytes(32)).decode(), safe='')}")


@pytest.mark.parametrize("kind", ["connection string", "connection string from the environment", "SAS in a connection "
                                  "string", "account key", "SAS token"])
@pytest.mark.parametrize("failure", ["refused", "down", "no answer"])
def test_azure_keys_sas_tokens_and_connection_strings(request, monkeypatch, said, kind, failure):
    azure = request.getfixturevalue("azure")
    case = store_case(request, "azure")
    for name in [n for n in __import__("os").environ if n.startswith("AZURE_")]:
        monkeypatch.delenv(name)
    key = base64.b64encode(secrets.token_bytes(64)).decode()
    sas = _sas()
    endpoint = f"{_closed_port() if failure == 'down' else case.proxy.url}/tokenshards"
    if kind in ("account key", "SAS token"):
        # adlfs reaches https://ACCOUNT.blob.core.windows.net with these: no network here (down, whatever the mode)
        azure_options = {"account_name": f"ts{uuid.uuid4().hex[:12]}",
                         **({"account_key": key} if kind == "account key" else {"sas_token": sas})}
        if failure != "down":
            pytest.skip("an account key or SAS token option reaches Azure itself, which no test here can")
    elif kind.startswith("SAS"):
        azure_options = {"connection_string": f"BlobEndpoint={endpoint};SharedAccessSignature={sas}"}
    else:
        azure_options = {"connection_string": f"DefaultEndpointsProtocol=http;AccountName=tokenshards;AccountKey={key};"
                                              f"BlobEndpoint={endpoint};"}
    if kind.endswith("environment"):
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azure_options["connection_string"])
        azure_options = {}
    if failure == "no answer":
        case.proxy.fault(lambda r: True, "stall", times=10**6, seconds=1.0)
    options = {**({"azure": azure_options} if azure_options else {}), "retry": QUICK}
    said.begin()
    code = main(["--debug", "verify", case.url("run"), *_argv(options)])
    text = said()
    line = _error_line(text)
    assert code == 2 and line.startswith("tokenshards: error: cannot read ") and "/run/manifest.json: " in line, line
    if failure == "refused":  # Azurite checks the signature itself: the key or SAS is not its account's
        assert "Azure refused the credentials sent" in line
    assert_hidden(text, [key, sas, azure.key])


# -- Hugging Face -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("failure", ["refused", "down"])
def test_hugging_face_tokens(tmp_path, monkeypatch, said, failure):
    from huggingface_hub import constants
    from hubserver import HubServer

    repo = tmp_path / "repo"
    write_parquet(repo / "sample" / "10BT" / "000_00000.parquet", {"text": ["a b c", "d e"]})
    token = "hf_" + "".join(secrets.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz") for _ in range(34))
    with HubServer(repo, repo="me/data", gated=True, tokens={}) as server:
        url = server.url if failure == "refused" else _closed_port()
        monkeypatch.setattr(constants, "ENDPOINT", url)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
        monkeypatch.setenv("HF_TOKEN", token)
        said.begin()
        code = main(["--debug", "download", "--dataset", "me/data", "--size", "10B", "--to", str(tmp_path / "d"), "--keep-free-gb", "0"])
    text = said()
    _error_line(text)
    assert code == 2
    assert_hidden(text, [token])


# -- what a run writes, and what a worker's failure leaves on the scheduler -------------------------------------

def test_a_run_with_failures_on_the_way_writes_no_secret(request, cluster, tmp_path, said):
    """A tokenize to S3 and an export from it, session token and all, through ~10% of requests
    throttled or reset: the runs' files, their records, the HTML report and every log hold no secret."""
    case = store_case(request, "s3")
    token = "FwoGZXIvYXdzE" + base64.b64encode(secrets.token_bytes(90)).decode()
    options = {**case.options(), "token": token}
    write_parquet(tmp_path / "in" / "a.parquet", {"text": [f"document {i} " * 20 for i in range(120)]}, row_group_size=40)
    before = len(case.proxy.answered)
    case.proxy.fail(_every(10), times=10**6, **S3_503)
    case.proxy.fault(_every(10), "reset", times=10**6)
    said.begin()
    assert main(["tokenize", "--input", str(tmp_path / "in" / "*.parquet"), "--out", case.url("run"), "--partition-mb",
                 "0.005", "--scheduler", cluster.scheduler_address, "--progress", "none", "--report",
                 str(tmp_path / "tokenize.html"), *_argv(options)]) == 0
    assert main(["export", case.url("run"), "--format", "llmc", "--to", case.url("llmc"), "--val-tokens", "1000",
                 "--scheduler", cluster.scheduler_address, "--progress", "none", *_argv(options)]) == 0
    assert case.proxy.faults("reset", since=before) > 0 and case.proxy.faults(503, since=before) > 0
    written = b"".join(case.direct.cat_file(p) for p in case.direct.find(case.bucket))
    assert b"export.json" in b"".join(p.encode() for p in case.direct.find(case.bucket))
    text = said(tmp_path / "tokenize.html") + written.decode("latin-1")
    assert_hidden(text, [token, case.server.secret, case.server.key])


def _every(n: int):
    """A rule's match for one request in ``n`` (of those it is asked about)."""
    count = itertools.count(1)
    return lambda request: next(count) % n == 0


def test_a_workers_failure_leaves_no_secret_on_the_scheduler(cluster):
    """The error a worker raises is what the dashboard shows and a worker logs ("Compute Failed ...
    Exception: ..."): scrubbed before it leaves the worker, whatever the library put in it."""
    from distributed import Client

    token = _access_token()
    options = store.storage_options({"gcs": {"endpoint_url": _closed_port(), "token": token}})
    with Client(cluster.scheduler_address) as client:
        future = client.submit(store.filesystem, "gs://bucket/x", options, pure=False)
        error = future.exception(timeout=60)
        texts = client.run_on_scheduler(lambda dask_scheduler, key=future.key: [
            str(getattr(dask_scheduler.tasks.get(key), name, "")) for name in ("exception_text", "traceback_text")])
        future.release()
    assert isinstance(error, UserError) and "tokeninfo?access_token=<hidden>" in str(error)
    assert_hidden("\n".join([str(error), repr(error), *texts]), [token])


# -- the scrubber on its own ------------------------------------------------------------------------------

SECRET_CHARS = st.sampled_from("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_.~")


@contextlib.contextmanager
def known_secrets():
    """``wording``'s secrets for one example only: the generated ones do not stay in this process."""
    kept = set(wording._KNOWN), list(wording._LONGEST_FIRST)
    try:
        yield
    finally:
        wording._KNOWN.clear()
        wording._KNOWN.update(kept[0])
        wording._LONGEST_FIRST[:] = kept[1]


@given(secret=st.text(SECRET_CHARS, min_size=8, max_size=64), before=st.text(max_size=30), after=st.text(max_size=30))
@example(secret="abc123defg==", before="AccountKey=", after=";BlobEndpoint=http://x")
@example(secret="ya29.a0-token", before="GET /tokeninfo?access_token=", after=" HTTP/1.1")
def test_a_known_secret_is_hidden_in_any_text_and_form(secret, before, after):
    with known_secrets():
        wording.hide(secret)
        for form in (secret, quote(secret, safe=""), quote_plus(secret)):
            clean = wording.scrub(before + form + after)
            assert secret not in clean and quote(secret, safe="") not in clean
            assert wording.scrub(clean) == clean  # said once or twice, the same line


def test_credentials_are_known_by_their_fields_and_shapes():
    assert store.secret_values({"gcs": {"token": "/path/to/sa.json"}, "azure": {"connection_string":
                               "AccountName=a;AccountKey=k3y+value==;BlobEndpoint=http://h/a"}}) == \
        ["AccountName=a;AccountKey=k3y+value==;BlobEndpoint=http://h/a", "k3y+value=="]
    said = wording.scrub("GET https://h/c/b?sv=2023-11-03&sig=abc%2Bdef&se=x Authorization: Bearer ya29.zzz "
                         '{"private_key": "-----BEGIN PRIVATE KEY-----\\nMII\\n-----END PRIVATE KEY-----\\n"} '
                         "hf_abcdefghijklmnopqrstuvwxyz0123 AKIAABCDEFGHIJKLMNOP")
    assert said == ("GET https://h/c/b?sv=2023-11-03&sig=<hidden>&se=x Authorization: <hidden> "
                    '{"private_key": "<hidden>"} <hidden> <hidden>')
