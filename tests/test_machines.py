"""Which machine a worker is on, and the check that other machines see the client's local paths.

Several real machines are in test_across_machines.py (namespaces); here, what one machine shows."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from distributed import Client

from tokenshards import namespaces
from tokenshards.cluster import machines
from tokenshards.errors import UserError
from tokenshards.tokenize.command import _check_parts_here
from tokenshards.storage.location import Location


def test_a_local_cluster_is_one_machine_and_costs_no_probe(cluster, tmp_path):
    with Client(cluster) as client:
        assert machines.other_machines(client) == []
        before = set(os.listdir(tmp_path))
        machines.check_same_view(client, [machines.PathUse(option="--out", url=str(tmp_path / "out"), writes=True)])
        assert set(os.listdir(tmp_path)) == before  # no probe file was even written


def test_workers_counted_as_another_machine_read_the_probe_back(cluster, tmp_path, monkeypatch):
    """The probe itself, through real tasks: this process pretends to be another machine, so
    every worker is probed, and each sees what it does (the same disk)."""
    with Client(cluster) as client:
        monkeypatch.setattr(machines, "file_view", lambda: "elsewhere")
        found = machines.other_machines(client)
        assert len(found) == 1  # the two workers share one view: one probe
        data = tmp_path / "in.parquet"
        data.write_bytes(b"x" * 10)
        uses = [machines.PathUse(option="--out", url=str(tmp_path / "out"), writes=True),
                *machines.reading_inputs((str(data),), [str(data)])]
        assert machines.blind_machines(client, uses) == {}
        assert not [n for n in os.listdir(tmp_path / "out") if n.startswith(machines.PROBE_PREFIX)]


def test_a_worker_that_sees_another_file_is_named(cluster, tmp_path, monkeypatch):
    with Client(cluster) as client:
        monkeypatch.setattr(machines, "file_view", lambda: "elsewhere")
        data = tmp_path / "in.parquet"
        data.write_bytes(b"x" * 10)
        use = machines.PathUse(option="--input", url=str(data), writes=False, files=(str(data),))
        monkeypatch.setattr(machines, "_stat", lambda path: (99, 0))  # what this machine "sees"
        with pytest.raises(UserError, match=rf"^--input {data}: the workers on \S+ do not see the files this machine"):
            machines.check_same_view(client, [use])


def test_the_lease_and_the_probe_tell_machines_apart_by_more_than_their_name():
    space, view = namespaces.process_space(), namespaces.file_view()
    assert space.startswith(os.uname().nodename + "/") and "/pid:" in space
    assert "/mnt:" in view and os.uname().nodename not in view


def test_no_manifest_lists_a_part_this_machine_does_not_see(tmp_path):
    """A worker that joined after the start-up check, on a machine without the client's OUT."""
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "part-00000.tokens.npy").write_bytes(b"")
    out = Location.at(str(tmp_path))
    entries = [SimpleNamespace(tokens_file="parts/part-00000.tokens.npy"),
               SimpleNamespace(tokens_file="parts/part-00001.tokens.npy")]
    _check_parts_here(out, entries[:1])
    with pytest.raises(UserError, match=r"this machine's folder lacks 1 part file the workers wrote "
                                        r"\(first: parts/part-00001\.tokens\.npy\).*no manifest was written"):
        _check_parts_here(out, entries)
