"""One live writer per OUT: the lease on a local disk and on S3 (moto enforces If-None-Match / If-Match);
on S3, GCS and Azure behind fault proxies, a renewal or creation whose answer was lost."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from s3server import s3_proxied  # noqa: F401  (a fixture)
from storecases import store_case

from tokenshards.namespaces import process_space
from tokenshards.storage.lease import LEASE_FILE, LEASE_LIMIT, Lease, LeaseHeld, LeaseLost, LeaseRecord, held_at
from tokenshards.storage.location import Location
from tokenshards.storage.store import filesystem


@pytest.fixture(params=["local", "s3"])
def out(request, tmp_path):
    """(fs, root, url) of an empty OUT on each store."""
    if request.param == "local":
        url = str(tmp_path / "out")
        options = {}
    else:
        server = request.getfixturevalue("s3")
        url = f"s3://{server.make_bucket()}/out"
        options = server.storage_options
    fs, root = filesystem(url, options)
    fs.makedirs(root, exist_ok=True)  # a local OUT exists once the run checked it is writable
    return fs, root, url


def _lease(out, **kw) -> Lease:
    fs, root, url = out
    return Lease(Location(url=url, fs=fs, root=root), command="tokenize", **kw)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_second_writer_refuses_naming_the_live_run(out):
    with _lease(out) as first:
        with pytest.raises(LeaseHeld, match=rf"being written by a tokenize run on host {socket.gethostname()}, "
                                            rf"pid {first.record.pid}, started 20\d\d-.* UTC.*wait for it to finish"):
            _lease(out).acquire()
    # released on exit: the next run takes it at once
    with _lease(out):
        pass


def test_expired_lease_is_taken_over(out):
    fs, root, _ = out
    now = time.time()
    stale = LeaseRecord(run="old", command="tokenize", host="elsewhere", pid=1, started=now - 900,
                        renewed=now - 300, ttl=120)
    fs.pipe_file(f"{root}/{LEASE_FILE}", stale.to_bytes())
    notes = []
    with _lease(out, announce=notes.append) as lease:
        assert lease.record.run != "old"
        lease.check()
    assert notes and "took over the stale lease of a tokenize run on host elsewhere, pid 1" in notes[0]


def test_lease_of_a_dead_process_on_this_host_is_stale_at_once(out):
    fs, root, _ = out
    now = time.time()
    crashed = LeaseRecord(run="crashed", command="tokenize", host=socket.gethostname(), pid=_dead_pid(),
                          started=now, renewed=now, ttl=3600, space=process_space())
    fs.pipe_file(f"{root}/{LEASE_FILE}", crashed.to_bytes())
    with _lease(out) as lease:
        assert lease.record.run != "crashed"


def test_a_machine_that_shares_this_host_name_keeps_its_lease_while_it_lives(out):
    """Containers often share one host name; a pid gone here says nothing of a pid there."""
    fs, root, url = out
    now = time.time()
    other = LeaseRecord(run="other", command="tokenize", host=socket.gethostname(), pid=_dead_pid(),
                        started=now, renewed=now, ttl=3600, space=f"{socket.gethostname()}/another-boot/pid:1")
    fs.pipe_file(f"{root}/{LEASE_FILE}", other.to_bytes())
    with pytest.raises(LeaseHeld, match=f"is being written by a tokenize run on host {socket.gethostname()}"):
        _lease(out).acquire()


def test_a_record_of_an_earlier_version_is_judged_by_its_expiry_alone(out):
    """Records written before ``space`` existed do not say which machine their pid is on."""
    fs, root, _ = out
    now = time.time()
    record = json.loads(LeaseRecord(run="old", command="tokenize", host=socket.gethostname(), pid=_dead_pid(),
                                    started=now, renewed=now, ttl=3600).to_bytes())
    del record["space"]
    fs.pipe_file(f"{root}/{LEASE_FILE}", json.dumps(record).encode())
    with pytest.raises(LeaseHeld, match="is being written by"):
        _lease(out).acquire()


@pytest.mark.parametrize("field, value", [("renewed", "soon"), ("ttl", None), ("pid", "1"), ("pid", -1),
                                          ("started", float("inf")), ("host", ["h"]), ("run", 5)])
def test_a_record_with_a_field_of_the_wrong_type_is_an_unreadable_one(out, field, value):
    """Hand-edited or foreign: taken over as unreadable, never a traceback when it is judged."""
    fs, root, _ = out
    now = time.time()
    record = json.loads(LeaseRecord(run="odd", command="tokenize", host="elsewhere", pid=1, started=now, renewed=now,
                                    ttl=3600).to_bytes())
    raw = json.dumps({**record, field: value}).encode()
    assert LeaseRecord.from_bytes(raw) is None
    fs.pipe_file(f"{root}/{LEASE_FILE}", raw)
    notes = []
    with _lease(out, announce=notes.append) as lease:
        assert lease.record.run != "odd"
    assert notes and "took over the stale lease of an unreadable record" in notes[0]


def test_renewed_while_the_run_lives(out):
    fs, root, _ = out
    with _lease(out, ttl=0.4) as lease:
        first = json.loads(fs.cat_file(f"{root}/{LEASE_FILE}"))["renewed"]
        time.sleep(1.0)  # the lease would have expired twice without renewal
        assert json.loads(fs.cat_file(f"{root}/{LEASE_FILE}"))["renewed"] > first
        with pytest.raises(LeaseHeld):
            _lease(out).acquire()
        lease.check()


def test_a_run_whose_lease_was_taken_knows_before_committing(out):
    fs, root, _ = out
    lease = _lease(out)
    lease.acquire()  # no renewal thread: as if the run stalled past its TTL
    now = time.time()
    expired = LeaseRecord(**{**json.loads(fs.cat_file(f"{root}/{LEASE_FILE}")), "renewed": now - 1000})
    fs.pipe_file(f"{root}/{LEASE_FILE}", expired.to_bytes())
    other = _lease(out)
    other.acquire()
    with pytest.raises(LeaseLost, match=r"lost its lease to a tokenize run on host .*no manifest was written"):
        lease.check()
    lease.release()  # must not remove the new owner's lease
    with pytest.raises(LeaseHeld):
        _lease(out).acquire()
    other.release()


def test_only_one_of_two_racing_takers_wins(out):
    fs, root, _ = out
    now = time.time()
    fs.pipe_file(f"{root}/{LEASE_FILE}", LeaseRecord(run="old", command="tokenize", host="x", pid=1, started=0,
                                                     renewed=now - 1000, ttl=1).to_bytes())
    a, b = _lease(out), _lease(out)
    # Both judged the same stale record; only one conditional replace can succeed.
    raw, token = a.ops.read()
    a.record = b.record = None
    from tokenshards.storage.lease import _Conflict
    won = []
    for lease in (a, b):
        try:
            lease.ops.replace(b"mine " + lease.path.encode(), token, mine=False)
            won.append(lease)
        except _Conflict:
            pass
    assert len(won) == 1


# -- a run that knows its own lease: answers lost on the way back ----------------------------------

def _is_lease_write(request) -> bool:
    """A write of the lease record: S3's and Azure's PUT of the key, GCS's upload naming it."""
    return request.method in ("PUT", "POST") and LEASE_FILE in (request.path + request.query.get("name", [""])[0])


@pytest.fixture(params=["s3", "gcs", "azure"])
def behind_proxy(request):
    """A ``StoreCase`` per object store (GCS behind a stand-in that enforces ifGenerationMatch)."""
    case = store_case(request, request.param)
    if case.store == "gcs":
        case.server.enforce_generations()
    return case


@pytest.mark.parametrize("fault", ["reset", "stall"])
def test_a_renewal_whose_answer_was_lost_reads_the_lease_back_and_carries_on(behind_proxy, fault):
    """The store wrote the renewal; its answer never came (a reset, or none before the timeout). The
    retry meets the new version (412), the run reads the lease back, finds its own and carries on:
    it still commits (``check``) and removes its lease at the end."""
    case = behind_proxy
    location = Location.at(case.url("out"), case.options(timeout=0.5))
    lease = Lease(location, command="tokenize")
    lease.acquire()
    created, before = lease.token, len(case.proxy.answered)
    case.proxy.fault(_is_lease_write, fault, forward=True, seconds=1.5)
    lease.check()  # renews once: the lost answer, then a precondition that no longer holds
    assert lease.lost is None and lease.token != created
    assert case.proxy.faults(fault, since=before) == 1
    stored = LeaseRecord.from_bytes(case.direct.cat_file(case.key("out", LEASE_FILE)))
    assert stored == lease.record  # the renewal is there, and it is this run's
    lease.release()
    assert not case.direct.exists(case.key("out", LEASE_FILE))


def test_a_creation_whose_answer_was_lost_is_this_runs_lease(behind_proxy):
    case = behind_proxy
    lease = Lease(Location.at(case.url("out"), case.options()), command="tokenize")
    case.proxy.fault(_is_lease_write, "reset", forward=True)
    lease.acquire()
    assert LeaseRecord.from_bytes(case.direct.cat_file(case.key("out", LEASE_FILE))) == lease.record
    lease.check()
    lease.release()
    assert not case.direct.exists(case.key("out", LEASE_FILE))


def test_a_renewal_lost_to_another_run_is_still_lost(behind_proxy):
    """The read-back finds another run's record: lost, and its record is left alone."""
    case = behind_proxy
    lease = Lease(Location.at(case.url("out"), case.options()), command="tokenize")
    lease.acquire()
    now = time.time()
    other = LeaseRecord(run="other", command="export", host="elsewhere", pid=7, started=now, renewed=now, ttl=120)
    case.direct.pipe_file(case.key("out", LEASE_FILE), other.to_bytes())
    with pytest.raises(LeaseLost, match=r"lost its lease to a export run on host elsewhere, pid 7"):
        lease.check()
    lease.release()
    assert LeaseRecord.from_bytes(case.direct.cat_file(case.key("out", LEASE_FILE))) == other


def test_a_reader_sees_the_lease_bounded_and_never_waits_on_it(out):
    """``held_at``, what a task reads before each commit and a command before it writes beside a
    run: the record, or None for nothing there, a file that is no record (a huge one is read only
    to the limit) and, locally, a FIFO (never opened: it would hang)."""
    fs, root, url = out
    path = f"{root}/{LEASE_FILE}"
    assert held_at(fs, path) is None
    with _lease(out) as mine:
        held = held_at(fs, path)
        assert held is not None and held.run == mine.record.run
    fs.pipe_file(path, b'{"run": "' + b"x" * (3 * LEASE_LIMIT) + b'"}')
    assert held_at(fs, path) is None
    if fs.protocol in ("file", ("file", "local")) or root.startswith("/"):
        fs.rm(path)
        os.mkfifo(path)
        assert held_at(fs, path) is None
