"""The one retry policy (``storage/retry.py``) on S3, GCS and Azure alike: every kind of request we
make (reads, existence checks, listings, writes, parted uploads) meets each failure the stores and
networks give (the stores' own throttling and server-error bodies, resets before and after the store
acted, bodies cut short, no answer) and still does its work; Retry-After is honoured; a refusal is
never retried; a failure that stays is one line. The lease's requests: test_lease.py.

The emulators sit behind fault proxies (``storecases``); the policy's waits are milliseconds here
(``FAST_RETRY``), its tries the same as a user's.
"""
from __future__ import annotations

import asyncio
import json
import email.utils
import random
import re
import time

import pytest
from faultproxy import AZURE_500, AZURE_503, GCS_429, GCS_503, S3_503, retry_after
from hypothesis import example, given
from hypothesis import strategies as st
from s3server import s3_proxied  # noqa: F401  (a fixture)
from conftest import write_parquet
from storecases import FAST_RETRY, store_case

from tokenshards.errors import UserError
from tokenshards.storage import store
from tokenshards.storage.location import Location
from tokenshards.storage.retry import RetryPolicy, Transient, retried, transient
from tokenshards.storage.retry import retry_after as parse_retry_after
from tokenshards.tokenize.command import run_tokenize
from tokenshards.tokenize.config import TokenizeConfig

STORES = ("s3", "gcs", "azure")

S3_500 = {"status": 500, "headers": {"Content-Type": "application/xml"},
          "body": b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an '
                  b"internal error. Please try again.</Message></Error>"}
THROTTLED = {"s3": (S3_503, S3_500), "gcs": (GCS_429, GCS_503), "azure": (AZURE_503, AZURE_500)}
"""Each store's own "try again" answers, bodies and all."""

REFUSED = {
    "s3": {"status": 403, "headers": {"Content-Type": "application/xml"},
           "body": b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>InvalidAccessKeyId</Code><Message>The AWS Access '
                   b"Key Id you provided does not exist in our records.</Message></Error>"},
    "gcs": {"status": 401, "headers": {"Content-Type": "application/json"},
            "body": b'{"error": {"code": 401, "message": "Invalid Credentials", "errors": [{"message": "Invalid '
                    b'Credentials", "domain": "global", "reason": "authError"}]}}'},
    "azure": {"status": 403, "headers": {"Content-Type": "application/xml", "x-ms-error-code": "AuthenticationFailed"},
              "body": b'<?xml version="1.0" encoding="utf-8"?><Error><Code>AuthenticationFailed</Code><Message>Server '
                      b"failed to authenticate the request. Make sure the value of Authorization header is formed "
                      b"correctly including the signature.</Message></Error>"},
}
SENT = {"s3": "an access key from --storage-option key/secret", "gcs": "no credentials (anonymous",
        "azure": "the account key of account tokenshards in a connection string"}
"""What each emulator's storage options send, as the refusal names it."""


# -- the policy on its own ------------------------------------------------------------------------------

@given(retry=st.integers(1, 60), first=st.floats(0, 10), cap=st.floats(0, 100), seed=st.integers(0, 2**32))
@example(retry=1, first=0.5, cap=16.0, seed=0)
@example(retry=40, first=0.5, cap=16.0, seed=1)  # 2**39 waits would overflow anything but the cap
def test_waits_double_up_to_the_cap_jittered_down_by_at_most_half(retry, first, cap, seed):
    policy = RetryPolicy(first_delay=first, max_delay=cap)
    ceiling = min(cap, first * 2 ** (retry - 1))
    assert ceiling / 2 <= policy.delay(retry, rng=random.Random(seed)) <= ceiling


def test_retry_after_is_honoured_up_to_its_cap():
    policy = RetryPolicy(retry_after_max=30)
    assert policy.delay(1, 7.0) == 7.0 and policy.delay(5, 0.0) == 0.0 and policy.delay(1, 3600.0) == 30
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after-ms": "1500"}) == 1.5 and parse_retry_after({"x-ms-retry-after-ms": "20"}) == 0.02
    soon = email.utils.formatdate(time.time() + 5, usegmt=True)
    assert 3 <= parse_retry_after({"Retry-After": soon}) <= 5
    assert parse_retry_after({"Retry-After": "whenever"}) is None and parse_retry_after({}) is None


def test_settings_come_from_the_storage_options_and_are_checked_there():
    assert RetryPolicy.of({"retry": {"attempts": 3}}) == RetryPolicy(attempts=3)
    assert RetryPolicy.of({}) == RetryPolicy()
    for bad, said in (({"atempts": 3}, "unknown key 'atempts'; expected some of attempts, first_delay"),
                      ({"attempts": 0}, "attempts must be a whole number of at least 1"),
                      ({"timeout": 0}, "timeout must be more than 0 seconds"),
                      ({"max_delay": "1s"}, "max_delay must be a number of seconds")):
        with pytest.raises(UserError, match=f"^--storage-option retry: {said}"):
            store.storage_options({"retry": bad})
    with pytest.raises(UserError, match="^--storage-option retry: expected a JSON object"):
        store.storage_options({"retry": 3})


def test_what_is_transient():
    class HttpError(Exception):  # gcsfs's, by its name and code
        def __init__(self, code):
            super().__init__(f"error, {code}")
            self.code = code

    assert transient(ConnectionResetError()) == transient(TimeoutError()) == Transient()
    assert transient(HttpError(503)) == Transient() and transient(HttpError(429)) == Transient()
    assert transient(HttpError(401)) is None and transient(HttpError(404)) is None
    assert transient(PermissionError("Forbidden")) is None and transient(FileNotFoundError("x")) is None
    assert transient(ValueError("bad")) is None


def test_the_error_that_stays_is_the_last_one_and_says_no_secret():
    calls = []

    async def once():
        calls.append(1)
        raise ConnectionResetError(f"reset while asking https://o/x?access_token=ya29.a0-secret-{len(calls)}")

    async def no_wait(_):
        pass

    with pytest.raises(ConnectionResetError) as info:
        asyncio.run(retried(RetryPolicy(attempts=3), once, sleep=no_wait))
    assert len(calls) == 3 and str(info.value) == "reset while asking https://o/x?access_token=<hidden>"


# -- every kind of request, every failure, on each store ---------------------------------------------

def _operations(location: Location):
    """(name, do it, what it must give): a read, an existence check, a listing, a write, a parted upload,
    and a read of what is not there (a 404, whose body the SDKs read after the answer)."""
    def parted():
        fs, path = location.fs, location.join("parted.bin")
        upload = store.begin_parts(fs, path)
        tag = store.put_part(upload, 1, b"part one", location.storage_options)
        store.commit_parts(fs, upload, {1: tag})
        return fs.cat_file(path)

    def missing():
        try:
            location.read_json("absent.json")
        except FileNotFoundError:
            return "not found"

    return [("read", lambda: location.read_json("obj.json"), {"n": 1}),
            ("exists", lambda: location.exists("obj.json"), True),
            ("list", lambda: sorted(p.rsplit("/", 1)[-1] for p in location.glob("*.json")),
             sorted({"obj.json", *(["new.json"] if location.exists("new.json") else [])})),
            ("write", lambda: (location.write_json("new.json", {"n": 2}), location.read_json("new.json"))[1], {"n": 2}),
            ("parted", parted, b"part one"),
            ("missing", missing, "not found")]


@pytest.mark.parametrize("kind", STORES)
def test_every_request_meets_every_failure_and_still_does_its_work(request, kind):
    case = store_case(request, kind)
    location = Location.at(case.url("run"), case.options(timeout=0.5))
    location.write_json("obj.json", {"n": 1})
    every = [("answer", dict(THROTTLED[kind][0])), ("reset", {}), ("reset", {"forward": True}), ("cut", {"forward": True})]
    reads = [("answer", dict(THROTTLED[kind][1])), ("short", {"forward": True})]  # the other answer, a body closed
    for name, operation, expected in _operations(location):
        for action, how in every + (reads if name in ("read", "missing") else []) + \
                ([("stall", {"seconds": 1.0})] if name == "read" else []):
            location.fs.invalidate_cache()
            before = len(case.proxy.answered)
            if action == "answer":
                case.proxy.fail(lambda r: True, times=1, **how)
            else:
                case.proxy.fault(lambda r: True, action, **how)
            got = operation()
            if name == "list":  # what is there now (a write above may have added new.json)
                expected = sorted(p.rsplit("/", 1)[-1] for p in case.direct.glob(case.key("run", "*.json")))
            assert got == expected, (name, action, how)
            said = [status for _, status in case.proxy.answered[before:]]
            assert said.count(how.get("status", action)) == 1, (name, action, how, said)  # met once, then retried


@pytest.mark.parametrize("kind", STORES)
def test_retry_after_is_waited_for(request, kind):
    case = store_case(request, kind)
    location = Location.at(case.url("run"), case.options())
    location.write_json("obj.json", {"n": 1})
    case.proxy.fail(lambda r: True, times=1, **retry_after(THROTTLED[kind][0], 1))
    started = time.monotonic()
    assert location.read_json("obj.json") == {"n": 1}
    assert time.monotonic() - started >= 0.95  # FAST_RETRY's own wait would be milliseconds


@pytest.mark.parametrize("kind", STORES)
def test_a_failure_that_stays_is_one_line_after_the_policys_tries(request, kind):
    case = store_case(request, kind)
    location = Location.at(case.url("run"), case.options())
    answer = THROTTLED[kind][0]
    case.proxy.fail(lambda r: True, times=10**6, **answer)
    before = len(case.proxy.log)
    with pytest.raises(UserError, match=rf"^output {case.url('run')}: {kind.upper() if kind != 'azure' else 'Azure'} kept "
                                        rf"answering {answer['status']}.* \(tried {FAST_RETRY['attempts']} times\): it is "
                                        r"overloaded or failing; try again later") as info:
        location.check_bucket(what="output")
    assert len(case.proxy.log) - before == FAST_RETRY["attempts"] and "\n" not in str(info.value)


@pytest.mark.parametrize("kind", STORES)
def test_a_refusal_is_said_at_once_naming_the_store_the_bucket_and_the_credential(request, kind):
    """Never retried: a refused credential fails the same way every time."""
    case = store_case(request, kind)
    location = Location.at(case.url("run"), case.options(attempts=7, first_delay=1.0))  # a retry would take seconds
    case.proxy.fail(lambda r: r.method in ("PUT", "POST"), times=10**6, **REFUSED[kind])
    before = len(case.proxy.log)
    store_name = {"s3": "S3", "gcs": "GCS", "azure": "Azure"}[kind]
    what = "container" if kind == "azure" else "bucket"
    started = time.monotonic()
    with pytest.raises(UserError, match=rf"^cannot write to output {case.url('run')}: {store_name} refused (the credentials "
                                        rf"sent|an anonymous request) for {what} '{case.bucket}' \({REFUSED[kind]['status']}"
                                        rf".*\): {re.escape(SENT[kind])}") as info:
        location.ensure_writable()
    writes = [r for r in case.proxy.log[before:] if r.method in ("PUT", "POST")]
    assert len(writes) == 1 and time.monotonic() - started < 3 and "\n" not in str(info.value)


# -- inputs on a store: --on-bad-file skip leaves out bad files, never a store's outage -------------------

@pytest.mark.parametrize("when", ["footer", "rows"])
def test_an_input_the_store_will_not_serve_stops_the_run_even_under_skip(request, cluster, tmp_path, when):
    """A file is "unreadable" when its bytes are not parquet; a store that keeps answering 503 to the
    GETs of one input is an outage: skipping that input would make a smaller corpus and exit 0. The
    run stops in one line naming the store's answer, and the same command finishes once it is served.
    ``footer``: the GETs fail from the start (the plan's footer read); ``rows``: once the run is
    planned (the partitions' reads)."""
    case = store_case(request, "s3")
    texts = [f"document {i} " + "words " * (i % 30) for i in range(200)]
    for name in ("a.parquet", "b.parquet"):
        write_parquet(tmp_path / name, {"text": texts}, row_group_size=50)
        case.direct.put_file(str(tmp_path / name), case.key("in", name))
    rules = []

    def fail_b() -> None:
        rules.append(case.proxy.fail(lambda r: r.method == "GET" and r.path.endswith("/in/b.parquet"), times=10**6,
                                     **S3_503))

    def announce(msg: str) -> None:
        if when == "rows" and "partitions" in msg and "input files" in msg:  # planned: the tasks start next
            fail_b()

    config = TokenizeConfig(inputs=(case.url("in"),), out=str(tmp_path / "out"), scheduler=cluster.scheduler_address,
                            progress="none", storage_options=case.options(), on_bad_file="skip",
                            partition_bytes=2_000, retries=0)
    if when == "footer":
        fail_b()
    with pytest.raises(UserError, match=rf"cannot read {re.escape(case.url('in', 'b.parquet'))}: S3 kept answering 503"
                                        rf".*\(tried {FAST_RETRY['attempts']} times\)") as info:
        run_tokenize(config, announce=announce)
    assert rules and case.proxy.faults(503) > 0
    assert "\n" not in str(info.value) and "skip" not in str(info.value)
    assert not (tmp_path / "out" / "manifest.json").exists()
    case.proxy.clear()
    summary = run_tokenize(config, announce=lambda m: None)
    assert summary.docs == 2 * len(texts)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert not manifest.get("skipped_inputs")
