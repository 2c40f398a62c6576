"""A real Azure Blob Storage API for tests: Microsoft's Azurite (npm ``azurite``) in a subprocess on
127.0.0.1, with a ``FaultProxy`` in front, used through adlfs as a user would.

Azurite is installed on first use into the suite's cache (``cachedir.py``) with ``npm install``; node
must be on PATH (the tests skip, saying so, where it is not). Its account is made per session
(``AZURITE_ACCOUNTS``) with a random key, so tests can assert the key never appears in outputs.

    azure.connection_string   the account's connection string, through the proxy
    azure.proxy               the FaultProxy: inject 429/503, hold a block upload, see requests
    azure.storage_options     what a user would pass (the ``azure`` section: the connection string)
    azure.env()               environment for a subprocess (AZURE_STORAGE_CONNECTION_STRING)
    azure.fs()                a fresh adlfs filesystem straight on Azurite
    azure.make_container()    a new empty container; returns its name

Azurite checks the Shared Key signature (a wrong key gets 403 AuthenticationFailed) and enforces
``If-None-Match: *`` and ``If-Match`` on Put Blob, so nothing here stands in for those.
"""
from __future__ import annotations

import base64
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from cachedir import ROOT
from faultproxy import FaultProxy
from s3server import free_port

AZURITE_VERSION = "3.35.0"
CACHE = ROOT / f"azurite-{AZURITE_VERSION}"
ACCOUNT = "tokenshards"


def azurite_binary() -> Path:
    """``CACHE/node_modules/.bin/azurite-blob``, installed with npm the first time."""
    binary = CACHE / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("Azurite needs node and npm on PATH")
    CACHE.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(CACHE), f"azurite@{AZURITE_VERSION}"],
                          capture_output=True, text=True, timeout=600)
    if done.returncode != 0 or not binary.exists():
        raise RuntimeError(f"npm install azurite@{AZURITE_VERSION} failed: {done.stderr[-2000:]}")
    return binary


@dataclass
class AzureServer:
    direct_url: str
    proxy: FaultProxy
    key: str = field(default_factory=lambda: base64.b64encode(uuid.uuid4().bytes * 4).decode())

    def connection_string(self, *, key: str | None = None, direct: bool = False) -> str:
        endpoint = self.direct_url if direct else self.proxy.url
        return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key or self.key};"
                f"BlobEndpoint={endpoint}/{ACCOUNT};")

    @property
    def storage_options(self) -> dict:
        return {"azure": {"connection_string": self.connection_string()}}

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
        env.update(AZURE_STORAGE_CONNECTION_STRING=self.connection_string())
        env.update(extra)
        return env

    def fs(self):
        from adlfs import AzureBlobFileSystem

        return AzureBlobFileSystem(connection_string=self.connection_string(direct=True), skip_instance_cache=True,
                                   use_listings_cache=False)

    def make_container(self, name: str | None = None) -> str:
        name = name or f"c{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name


def start_azurite(key: str, workdir: Path, timeout: float = 60.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    workdir.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(azurite_binary()), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--inMemoryPersistence",
                             "--silent", "--skipApiVersionCheck", "--disableTelemetry"],
                            cwd=workdir, env={**os.environ, "AZURITE_ACCOUNTS": f"{ACCOUNT}:{key}"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/{ACCOUNT}?comp=list", timeout=1).close()
            return proc, url
        except urllib.error.HTTPError:  # it answers (403: the request is not signed)
            return proc, url
        except (urllib.error.URLError, ConnectionError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"Azurite did not start on {url} (exit code {proc.poll()})")
            time.sleep(0.2)


@pytest.fixture(scope="session")
def azure(tmp_path_factory):
    """One Azurite per test process, shared by the modules it runs (each test makes its own
    container and clears the proxy's rules): its start and stop cost a few seconds each."""
    pytest.importorskip("adlfs", reason="the azure extra is not installed (make install)")
    key = base64.b64encode(uuid.uuid4().bytes * 4).decode()
    proc, url = start_azurite(key, tmp_path_factory.mktemp("azurite"))
    proxy = FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])).start()
    try:
        yield AzureServer(direct_url=url, proxy=proxy, key=key)
    finally:
        proxy.stop()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
