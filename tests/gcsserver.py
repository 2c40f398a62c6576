"""A real GCS JSON API for tests: gcp-storage-emulator (PyPI) in a subprocess on 127.0.0.1, with a
``FaultProxy`` in front, used through gcsfs as a user would.

    gcs.endpoint_url       the proxy's URL (what clients use; ``gcs.direct_url`` is the emulator's)
    gcs.proxy              the FaultProxy: inject 429/503/401/412, hold an upload mid-way, see requests
    gcs.storage_options    what a user would pass (the ``gcs`` section: endpoint, anonymous token)
    gcs.env()              environment for a subprocess (STORAGE_EMULATOR_HOST, nothing from ~/.config/gcloud)
    gcs.fs()               a fresh gcsfs filesystem on it
    gcs.make_bucket()      a new empty bucket; returns its name

What the emulator does not do (checked in its source, 2026.7.19): it never reads
``ifGenerationMatch`` (conditional writes are not enforced), never checks credentials, and does
not route DELETE of a resumable session. The proxy stands in where a test needs those answers:
``gcs.enforce_generations()`` makes it check ``ifGenerationMatch`` as GCS does (412 with GCS's body
unless the object's generation, 0 for none, is the one named), atomically with the write it lets through.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from dataclasses import dataclass

import pytest
from faultproxy import FaultProxy
from s3server import free_port


@dataclass
class GCSServer:
    direct_url: str
    proxy: FaultProxy

    @property
    def endpoint_url(self) -> str:
        return self.proxy.url

    @property
    def storage_options(self) -> dict:
        return {"gcs": {"endpoint_url": self.endpoint_url, "token": "anon"}}

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GOOGLE_", "GCSFS_", "STORAGE_EMULATOR", "CLOUDSDK_"))}
        env.update(STORAGE_EMULATOR_HOST=self.endpoint_url, CLOUDSDK_CONFIG=os.devnull, NO_GCE_CHECK="true")
        env.update(extra)
        return env

    def fs(self):
        from gcsfs.core import GCSFileSystem

        return GCSFileSystem(endpoint_url=self.direct_url, token="anon", skip_instance_cache=True,
                             use_listings_cache=False)

    def enforce_generations(self) -> None:
        """From now until the proxy's ``clear()``: uploads and deletes with ``ifGenerationMatch`` are
        refused as GCS refuses them when the object's generation is another."""
        self.proxy.guard(lambda request: _precondition(self.direct_url, request))

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"bucket-{uuid.uuid4().hex[:12]}"
        self.fs().mkdir(name)
        return name


PRECONDITION_FAILED = {"status": 412, "headers": {"Content-Type": "application/json; charset=UTF-8"},
                       "body": json.dumps({"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                                     "specified did not hold.", "errors": [{
                                                         "message": "At least one of the pre-conditions you specified "
                                                                    "did not hold.", "domain": "global",
                                                         "reason": "conditionNotMet", "locationType": "header",
                                                         "location": "If-Match"}]}}).encode()}


def _precondition(direct_url: str, request) -> dict | None:
    """GCS's answer to a request whose ``ifGenerationMatch`` does not hold, or None to let it through."""
    wanted = request.query.get("ifGenerationMatch", [None])[0]
    if wanted is None:
        return None
    parts = request.path.split("/")  # /upload/storage/v1/b/B/o?name=K or /storage/v1/b/B/o/K
    bucket = parts[parts.index("b") + 1]
    name = request.query["name"][0] if "name" in request.query else urllib.parse.unquote(parts[parts.index("o") + 1])
    try:
        with urllib.request.urlopen(f"{direct_url}/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}"
                                    "?fields=generation", timeout=10) as reply:
            current = str(json.loads(reply.read())["generation"])
    except urllib.error.HTTPError as e:
        e.close()
        if e.code != 404:
            raise
        current = "0"
    return None if current == wanted else PRECONDITION_FAILED


def start_emulator(timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "gcp_storage_emulator", "start", "-H", "127.0.0.1", "--port", str(port),
                             "--in-memory", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{url}/", timeout=1).close()
            return proc, url
        except (urllib.error.URLError, ConnectionError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"gcp-storage-emulator did not start on {url} (exit code {proc.poll()})")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def gcs():
    """One emulator per test process, shared by the modules it runs (each test makes its own bucket
    and clears the proxy's rules): its start and stop cost a second or two each."""
    pytest.importorskip("gcsfs", reason="the gcs extra is not installed (make install)")
    proc, url = start_emulator()
    proxy = FaultProxy("127.0.0.1", int(url.rsplit(":", 1)[1])).start()
    try:
        yield GCSServer(direct_url=url, proxy=proxy)
    finally:
        proxy.stop()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
