"""One view of the three object stores' emulators behind their fault proxies, for tests that ask the
same of each (the retry policy, the lease, secrets): moto (S3), gcp-storage-emulator (GCS), Azurite.

    case = store_case(request, "gcs")       # in a test: the store's server, a new bucket
    case.url("out")                          gs://bucket-.../out
    case.options(attempts=3)                 storage options through the proxy, the retry policy short
    case.proxy                               the FaultProxy in front of the store
    case.direct                              an fsspec filesystem straight on the emulator (no proxy)
"""
from __future__ import annotations

from dataclasses import dataclass

from faultproxy import FaultProxy

from tokenshards.storage.retry import RetryPolicy

SCHEMES = {"s3": "s3", "gcs": "gs", "azure": "az"}

FAST_RETRY = {"attempts": RetryPolicy().attempts, "first_delay": 0.01, "max_delay": 0.05, "retry_after_max": 2.0,
              "timeout": 2.0}
"""The retry policy's settings for tests: a user's tries, waits of milliseconds."""


@dataclass
class StoreCase:
    store: str
    server: object
    proxy: FaultProxy
    bucket: str
    direct: object

    def url(self, *path: str) -> str:
        return "/".join([f"{SCHEMES[self.store]}://{self.bucket}", *path])

    def options(self, **retry) -> dict:
        return {**self.server.storage_options, "retry": {**FAST_RETRY, **retry}}

    def key(self, *path: str) -> str:
        """The path ``direct`` names it by."""
        return "/".join([self.bucket, *path])


def store_case(request, store: str) -> StoreCase:
    """The store's server (its fixture: the session's emulator, the module's proxy for S3) with a new empty
    bucket, its proxy's rules cleared."""
    if store == "s3":
        server = request.getfixturevalue("s3_proxied")
        bucket = server.make_bucket()
        direct = request.getfixturevalue("s3").fs()
    elif store == "gcs":
        server = request.getfixturevalue("gcs")
        bucket = server.make_bucket()
        direct = server.fs()
    else:
        server = request.getfixturevalue("azure")
        bucket = server.make_container()
        direct = server.fs()
    server.proxy.clear()
    request.addfinalizer(server.proxy.clear)
    return StoreCase(store=store, server=server, proxy=server.proxy, bucket=bucket, direct=direct)
