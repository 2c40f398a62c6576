"""Inputs behind one interface: which machine fetches each Hub file (pure rules), and the runner's
lanes that keep a file's partitions on its machine (real LocalCluster)."""
from __future__ import annotations

import time

import pytest
from distributed import Client, get_worker

from tokenshards.cluster import runner
from tokenshards.corpus.inputs.placement import DownloadSite, Place, assign_files, download_sites


def _place(host: str, view: str, target: str = "/hf", *, free: int = 10**12, present=()) -> Place:
    return Place(host=host, view=view, target=target, free=free, present=frozenset(present))


def test_workers_sharing_a_download_folder_are_one_machine():
    places = {
        "tcp://a:1": _place("a", "boot1/mnt:1"), "tcp://a:2": _place("a", "boot1/mnt:1", free=5),
        "tcp://b:1": _place("b", "boot2/mnt:1", present=["x"]),
        # one host, two HF caches (HF_HOME per worker): two places for files to go
        "tcp://c:1": _place("c", "boot3/mnt:1", "/one"), "tcp://c:2": _place("c", "boot3/mnt:1", "/two"),
        # two containers with one host name and one path, but their own mounts
        "tcp://d:1": _place("d", "boot4/mnt:1"), "tcp://d:2": _place("d", "boot4/mnt:2"),
    }
    machines = download_sites(places, {"tcp://a:1": 2, "tcp://a:2": 2})
    assert [(m.name, m.workers, m.slots) for m in machines] == [
        ("a", ("tcp://a:1", "tcp://a:2"), 4), ("b", ("tcp://b:1",), 1),
        ("c:/one", ("tcp://c:1",), 1), ("c:/two", ("tcp://c:2",), 1),
        ("d (tcp://d:1)", ("tcp://d:1",), 1), ("d (tcp://d:2)", ("tcp://d:2",), 1)]
    assert machines[0].free == 5 and machines[1].present == {"x"}
    # Tasks go to a machine's host (a worker its nanny restarts elsewhere on it still counts) when
    # it is the only machine there, else to its workers' addresses.
    assert [m.where for m in machines[:3]] == [("a",), ("b",), ("tcp://c:1",)]


def _machine(name: str, slots: int = 1, present=()) -> DownloadSite:
    return DownloadSite(name=name, host=name, target="/hf", workers=(f"tcp://{name}:1",), slots=slots, free=0,
                   present=frozenset(present))


def test_each_file_goes_to_one_machine_balancing_bytes_per_thread():
    files = [("f1", 100), ("f2", 90), ("f3", 60), ("f4", 50), ("f5", 40)]
    owner = assign_files(files, [_machine("m1"), _machine("m2")])
    assert owner == {"f1": "m1", "f2": "m2", "f3": "m2", "f4": "m1", "f5": "m1"}  # 190 and 150 bytes
    # A machine with three times the threads takes about three times the bytes.
    owner = assign_files([(f"f{i}", 10) for i in range(8)], [_machine("big", slots=3), _machine("small")])
    assert sorted(owner.values()).count("big") == 6
    assert assign_files(files, [_machine("m1"), _machine("m2")]) == assign_files(list(reversed(files)),
                                                                               [_machine("m1"), _machine("m2")])


def test_a_file_already_on_a_machine_stays_there():
    files = [("f1", 100), ("f2", 100)]
    owner = assign_files(files, [_machine("m1", present=["f2"]), _machine("m2", present=["f1"])])
    assert owner == {"f1": "m2", "f2": "m1"}
    # ... unless that machine is busy enough to finish later even without the download.
    owner = assign_files([("f1", 100), ("f2", 100), ("f3", 100)], [_machine("m1", present=["f1", "f2", "f3"]),
                                                                   _machine("m2")])
    assert sorted(owner.values()) == ["m1", "m1", "m2"]


def _where(item: int) -> tuple[int, str, float, float]:
    started = time.monotonic()
    time.sleep(0.2)
    return item, get_worker().address, started, time.monotonic()


def test_a_lane_keeps_its_tasks_on_its_workers_a_few_at_a_time(cluster):
    """The other worker idles while the lane's worker is busy: Dask's work stealing would hand it
    any task queued there with loose restrictions (checked: ~7 of 20 such tasks, distributed
    2026.8); a lane submits only as many as its threads, so none is queued."""
    with Client(cluster) as client:
        first, second = sorted(client.nthreads())
        lane = runner.Lane(name="m1", workers=(first,), slots=1)
        submitted: list[list[int]] = []

        def submit(batch, where):
            submitted.append(list(batch))
            return [client.submit(_where, i, pure=False, **(where.restrictions() if where else {})) for i in batch]

        results = dict(runner.each_result_as_ready(client, list(range(9)), submit,
                                                   lane_of=lambda i: lane if i < 8 else None,
                                                   explain=runner.failure(str)))
    assert sorted(results) == list(range(9))
    assert {results[i][1] for i in range(8)} == {first}
    # The lane's items one at a time, each submitted once the one before it was done; the rest at once.
    assert submitted == [[0], [8], [1], [2], [3], [4], [5], [6], [7]]


def test_items_ready_at_once_go_out_in_growing_chunks(cluster):
    """The first chunk gives every worker thread two tasks; the rest follow in chunks four times
    larger, so the workers start while the client still builds tasks. Every item comes back."""
    assert [len(c) for c in runner.growing_chunks(list(range(100)), first=4)] == [4, 16, 64, 16]
    assert list(runner.growing_chunks([], first=4)) == []
    with Client(cluster) as client:
        first = runner.first_chunk(client)
        assert first == 8  # two per thread, and never fewer than 8
        submitted: list[list[int]] = []

        def submit(batch, lane):
            submitted.append(list(batch))
            return client.map(abs, batch, pure=False)

        results = dict(runner.each_result_as_ready(client, list(range(50)), submit, explain=runner.failure(str)))
    assert results == {i: i for i in range(50)}
    assert submitted == [list(range(8)), list(range(8, 40)), list(range(40, 50))]


def test_an_error_from_arrivals_stops_the_run_and_cancels_the_rest(cluster):
    def arrivals():
        yield "a"
        raise RuntimeError("download failed")

    with Client(cluster) as client:
        with pytest.raises(RuntimeError, match="download failed"):
            for _ in runner.each_result_as_ready(
                    client, [1, 2], lambda batch, lane: [client.submit(time.sleep, 5, pure=False) for _ in batch],
                    waiting_for=lambda i: "a" if i == 1 else "b", arrivals=arrivals(), explain=runner.failure(str)):
                pass
