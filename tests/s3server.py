"""A real S3 endpoint for tests: moto's server in a subprocess on 127.0.0.1, used through s3fs.

Every test module has the ``s3`` fixture (``conftest.py`` imports it); ``s3_proxied`` (import it
into the module) is the same server behind a ``FaultProxy`` (``s3_proxied.proxy``). Use:

    s3.endpoint_url        http://127.0.0.1:PORT
    s3.storage_options     what a user would pass with --storage-option (endpoint, key, secret)
    s3.env()               environment for a subprocess that should find the same server
    s3.fs()                a fresh s3fs.S3FileSystem on it (no instance cache, no stale listings)
    s3.make_bucket(name)   a new empty bucket; returns its name

The secret is unique per session so tests can assert it never appears in outputs or logs.
Credentials are passed explicitly (not through os.environ): the session's LocalCluster workers
may have been spawned before this fixture ran, and other tests must not see S3 variables.
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field

import pytest
from faultproxy import FaultProxy

REGION = "us-east-1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3Server:
    endpoint_url: str
    key: str = "tokenshards-test-key"
    secret: str = field(default_factory=lambda: f"tokenshards-secret-{uuid.uuid4().hex}")
    proxy: FaultProxy | None = None
    """``s3_proxied``'s: the FaultProxy that ``endpoint_url`` is (moto itself behind it)."""

    @property
    def storage_options(self) -> dict:
        return {"key": self.key, "secret": self.secret,
                "client_kwargs": {"endpoint_url": self.endpoint_url, "region_name": REGION}}

    def env(self, **extra: str) -> dict[str, str]:
        """os.environ plus credentials and ``AWS_ENDPOINT_URL`` for this server, nothing from ~/.aws."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update(AWS_ACCESS_KEY_ID=self.key, AWS_SECRET_ACCESS_KEY=self.secret, AWS_DEFAULT_REGION=REGION,
                   AWS_ENDPOINT_URL=self.endpoint_url, AWS_CONFIG_FILE=os.devnull,
                   AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true")
        env.update(extra)
        return env

    def fs(self):
        import s3fs

        return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, **self.storage_options)

    def make_bucket(self, name: str | None = None) -> str:
        name = name or f"bucket-{uuid.uuid4().hex[:12]}"
        self.fs().call_s3("create_bucket", Bucket=name)
        return name


def start_moto(*, env_extra: dict[str, str] | None = None, timeout: float = 30.0) -> tuple[subprocess.Popen, str]:
    """Start ``python -m moto.server`` on a free port and wait until it answers; returns
    (process, endpoint). ``env_extra={"INITIAL_NO_AUTH_ACTION_COUNT": "0"}`` makes it enforce
    authentication, so unknown keys get 403 (a stand-in for "access denied")."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            env={**os.environ, **(env_extra or {})},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1).close()
            return proc, endpoint
        except (urllib.error.URLError, ConnectionError, OSError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto server did not start on {endpoint} (exit code {proc.poll()})")
            time.sleep(0.1)


@pytest.fixture(scope="session")
def s3():
    proc, endpoint = start_moto()
    try:
        yield S3Server(endpoint_url=endpoint)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def s3_proxied(s3):
    """The session's moto server behind a ``FaultProxy`` of this module's own (a thread): same keys."""
    proxy = FaultProxy("127.0.0.1", int(s3.endpoint_url.rsplit(":", 1)[1])).start()
    try:
        yield S3Server(endpoint_url=proxy.url, key=s3.key, secret=s3.secret, proxy=proxy)
    finally:
        proxy.stop()
