"""A place in storage (``storage.place.Place``): built from a URL and storage options, it crosses
processes as them (never as its filesystem), and never shows the options' values."""
from __future__ import annotations

import pickle

from tokenshards.storage.place import Place
from tokenshards.storage.store import StorageOptions


def test_a_local_place_travels_as_its_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    place = Place.at("out", {"secret_key": "hunter2"})
    assert place.root == str(tmp_path / "out") and place.join("parts", "x") == str(tmp_path / "out/parts/x")
    sent = pickle.dumps(place)
    monkeypatch.chdir("/")  # a worker's working directory differs
    got = pickle.loads(sent)
    assert got == place and got.url == "out" and got.root == place.root and got.is_local
    assert isinstance(got.storage_options, StorageOptions) and dict(got.storage_options) == {"secret_key": "hunter2"}
    assert "hunter2" not in repr(place) + repr(got) + repr(got.storage_options)


def test_an_s3_place_is_rebuilt_from_its_url_and_options(s3):
    bucket = s3.make_bucket()
    place = Place.at(f"s3://{bucket}/run", s3.storage_options)
    place.write_json("a.json", {"n": 1})
    got = pickle.loads(pickle.dumps(place))
    assert got.read_json("a.json") == {"n": 1} and got.exists("a.json") and not got.exists("b.json")
    assert got.shown("a.json") == f"s3://{bucket}/run/a.json" and got.task_url == f"s3://{bucket}/run"
    assert b"S3FileSystem" not in pickle.dumps(place)  # the filesystem is built anew, never shipped
