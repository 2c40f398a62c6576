"""A location in storage (``storage.location.Location``): built from a URL and storage options, it crosses
processes as them (never as its filesystem), and never shows the options' values."""
from __future__ import annotations

import pickle

from tokenshards.storage.location import Location
from tokenshards.storage.store import StorageOptions


def test_a_local_place_travels_as_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    location = Location.at("out", {"secret_key": "hunter2"})
    assert location.root == str(tmp_path / "out") and location.join("parts", "x") == str(tmp_path / "out/parts/x")
    sent = pickle.dumps(location)
    monkeypatch.chdir("/")  # a worker's working directory differs
    got = pickle.loads(sent)
    assert got == location and got.url == "out" and got.root == location.root and got.is_local
    assert isinstance(got.storage_options, StorageOptions) and dict(got.storage_options) == {"secret_key": "hunter2"}
    assert "hunter2" not in repr(location) + repr(got) + repr(got.storage_options)


def test_an_s3_place_is_rebuilt_from_its_url_and_options(s3):
    bucket = s3.make_bucket()
    location = Location.at(f"s3://{bucket}/run", s3.storage_options)
    location.write_json("a.json", {"n": 1})
    got = pickle.loads(pickle.dumps(location))
    assert got.read_json("a.json") == {"n": 1} and got.exists("a.json") and not got.exists("b.json")
    assert got.shown("a.json") == f"s3://{bucket}/run/a.json" and got.task_url == f"s3://{bucket}/run"
    assert b"S3FileSystem" not in pickle.dumps(location)  # the filesystem is built anew, never shipped
