"""FineWeb from the Hub: the real huggingface_hub client against a stand-in Hub on 127.0.0.1.

In-process tests pass ``endpoint=`` and ``cache_dir=`` (huggingface_hub reads HF_ENDPOINT and
HF_HUB_CACHE at import); the CLI tests run ``tokenshards`` in a subprocess with the environment
a user would set.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from hubserver import HubServer
from readback import expected_tokens, read_documents
from tokenshards.errors import UserError
from tokenshards.format.v1 import JOB_FILE
from tokenshards.storage import hub, store
from tokenshards.storage.hub import HubDataset
from tokenshards.storage.store import filesystem
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize
from tokenshards.verify.command import VerifyConfig, run_verify

REPO = "HuggingFaceFW/fineweb"
TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TEXTS = ["Hello world.", "", None, "Ein Satz auf Deutsch.", "Привет, мир", "数据集", "<|endoftext|> is text here",
         "tabs\tand\nnewlines  ", "émoji 🎉 and more"]


def _fineweb_repo(root: Path) -> Path:
    """sample/10BT with three files (one without an id column), a decoy sample/100BT, a README."""
    for n in range(2):
        rows = [f"doc {n}-{i}: " + TEXTS[i % len(TEXTS)] * (1 + i % 3) if TEXTS[i % len(TEXTS)] else TEXTS[i % len(TEXTS)]
                for i in range(60)]
        write_parquet(root / f"sample/10BT/00{n}_00000.parquet",
                      {"text": rows, "id": [f"<urn:uuid:{n}-{i}>" for i in range(60)], "dump": ["CC-MAIN-2024-10"] * 60},
                      row_group_size=16)
    write_parquet(root / "sample/10BT/002_00000.parquet", {"text": [f"no id {i} " + "x" * i for i in range(25)]},
                  row_group_size=10)
    write_parquet(root / "sample/100BT/000_00000.parquet", {"text": ["not this one"], "id": ["z"]})
    (root / "README.md").write_text("---\nlicense: odc-by\n---\n# stand-in FineWeb\n")
    return root


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory) -> Path:
    return _fineweb_repo(tmp_path_factory.mktemp("fineweb"))


@pytest.fixture
def server(repo_root):
    with HubServer(repo_root, repo=REPO, page_size=2) as s:
        yield s


def _dataset(server: HubServer, tmp_path: Path, *, size: str = "10B", **kw) -> HubDataset:
    return HubDataset(repo=REPO, size=size, endpoint=server.url, cache_dir=str(tmp_path / "hf-cache"), backoff=0.05,
                      keep_free=0, **kw)


def _served(root: Path, folder: str = "sample/10BT") -> list[Path]:
    return sorted((root / folder).glob("*.parquet"))


def _check_against_tiktoken(out: Path, root: Path, enc, *, named: str = "sample/10BT/") -> None:
    """Every non-empty row of every served file is a document whose tokens are tiktoken's; a row
    of a file without ids is ``NAMED + FILE:ROW`` (an input's name: its path in the repo for a
    ``--dataset`` sample, its path under a glob's folder for ``--input``)."""
    docs = read_documents(out)
    by_name = {Path(inp).name: inp for inp, _ in docs}
    expected = 0
    for path in _served(root):
        table = pq.read_table(path).to_pydict()
        for row, text in enumerate(table["text"]):
            if not text:
                continue
            expected += 1
            doc_id, tokens = docs[(by_name[path.name], row)]
            assert tokens == expected_tokens(enc, text)
            want_id = table["id"][row] if "id" in table else f"{named}{path.name}:{row}"
            assert doc_id == want_id
    assert len(docs) == expected


def _env(tmp_path: Path, server: HubServer | None, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", **extra)
    if server is not None:
        env["HF_ENDPOINT"] = server.url
    return env


# -- pure parts --

@pytest.mark.parametrize("size, folder", [("10B", "sample/10BT"), ("100BT", "sample/100BT"), ("350b", "sample/350BT")])
def test_size_names_the_sample_folder(size, folder):
    assert hub.size_folder(size) == folder
    assert hub.folder_size(folder) == folder.split("/")[1][:-1]


def test_bad_size_and_repo_are_one_line_errors():
    with pytest.raises(UserError, match=r"--size 'lots': expected a sample size such as 10B"):
        HubDataset(repo=REPO, size="lots")
    with pytest.raises(UserError, match=r"--dataset 'fineweb': expected a dataset repo id OWNER/NAME"):
        HubDataset(repo="fineweb", size="10B")


def test_disk_check_refuses_before_filling_the_disk():
    hub.check_disk(need=10, free=100, keep_free=50, where="/d", what="x")
    with pytest.raises(UserError, match=r"not enough disk space in /d: x needs 60B and 50B must stay free, but only 100B"):
        hub.check_disk(need=60, free=100, keep_free=50, where="/d", what="x")


# -- listing and errors --

def test_listing_pins_a_commit_and_follows_pages(server, tmp_path):
    listing = hub.list_files(_dataset(server, tmp_path))
    assert listing.commit == server.commit
    assert [f.path for f in listing.files] == [f"sample/10BT/00{n}_00000.parquet" for n in range(3)]
    for f in listing.files:
        data = (server.root / f.path).read_bytes()
        assert (f.size, f.etag) == (len(data), hashlib.sha256(data).hexdigest())
    assert any("cursor=" in r.path for r in server.requests)  # the tree listing was paginated
    assert listing.record() == {"repo": REPO, "revision": "main", "commit": server.commit, "folder": "sample/10BT",
                                "files": 3, "bytes": sum(f.size for f in listing.files)}


def test_a_server_that_lists_only_the_root_still_works(repo_root, tmp_path):
    with HubServer(repo_root, repo=REPO, list_subfolders=False) as server:
        listing = hub.list_files(_dataset(server, tmp_path))
        assert [f.path for f in listing.files] == [f"sample/10BT/00{n}_00000.parquet" for n in range(3)]
        with pytest.raises(UserError, match=r"has no size 1B \(folder sample/1BT\); sizes that exist: 10B, 100B$"):
            hub.list_files(_dataset(server, tmp_path, size="1B"))


def test_missing_size_revision_and_repo_say_which(server, tmp_path):
    with pytest.raises(UserError, match=r"^dataset 'HuggingFaceFW/fineweb' at revision 'main' has no size 1000B "
                                        r"\(folder sample/1000BT\); sizes that exist: 10B, 100B$"):
        hub.list_files(_dataset(server, tmp_path, size="1000B"))
    with pytest.raises(UserError, match=r"has no revision 'v9'; check --revision"):
        hub.list_files(_dataset(server, tmp_path, revision="v9"))
    with pytest.raises(UserError, match=r"dataset 'HuggingFaceFW/nope' on http://127\.0\.0\.1:\d+ not found"):
        hub.list_files(HubDataset(repo="HuggingFaceFW/nope", size="10B", endpoint=server.url, backoff=0.05))
    assert not server.downloads()


# -- downloading --

def test_disk_too_small_refuses_before_any_download(server, tmp_path):
    ds = HubDataset(repo=REPO, size="10B", endpoint=server.url, cache_dir=str(tmp_path / "c"), keep_free=2**62)
    said = []
    with pytest.raises(UserError, match=r"not enough disk space in .*: fetching 3 files of HuggingFaceFW/fineweb@main"):
        hub.download(ds, hub.list_files(ds), announce=said.append)
    assert "3 files" in said[0] and "B free" in said[0]
    assert not server.downloads()


def test_429_and_5xx_are_retried(server, tmp_path):
    server.fail(r"/api/datasets/.*/revision/main", status=429, headers={"Retry-After": "0"})
    server.fail(r"000_00000\.parquet", status=429, method="GET", headers={"Retry-After": "0"})
    server.fail(r"001_00000\.parquet", status=503, method="GET")
    server.fail(r"002_00000\.parquet", status=502, method="GET", times=2)
    ds = _dataset(server, tmp_path)
    sources = hub.download(ds, hub.list_files(ds), announce=lambda m: None)
    for s in sources:
        assert Path(s.url).read_bytes() == (server.root / s.name).read_bytes()
    statuses = [r.status for r in server.requests if r.method == "GET"]
    assert statuses.count(429) == 2 and statuses.count(503) == 1 and statuses.count(502) == 2
    assert len(server.downloads()) == 3


def test_dropped_connection_resumes_with_a_range_request(tmp_path):
    """A big file's body stops after 11 MiB; huggingface_hub asks for the rest with Range."""
    root = tmp_path / "repo"
    rng = np.random.default_rng(0)
    write_parquet(root / "sample/10BT/000_00000.parquet",
                  {"text": ["t"] * 12, "blob": [rng.bytes(2**20) for _ in range(12)]})
    data = (root / "sample/10BT/000_00000.parquet").read_bytes()
    assert len(data) > 11 * 2**20
    with HubServer(root, repo=REPO) as server:
        server.drop(r"000_00000\.parquet", after_bytes=11 * 2**20)
        ds = _dataset(server, tmp_path)
        [source] = hub.download(ds, hub.list_files(ds), announce=lambda m: None)
        gets = [r for r in server.requests if r.method == "GET" and "/resolve/" in r.path]
    assert Path(source.url).read_bytes() == data
    assert [g.status for g in gets] == [-200, 206]  # hung up mid-body, then only the rest
    assert gets[1].range == f"bytes={10 * 2**20}-"  # from the last whole chunk huggingface_hub wrote
    assert not list((tmp_path / "hf-cache").rglob("*.incomplete"))


def test_interrupted_download_resumes_on_rerun_and_partial_files_are_never_used(server, tmp_path):
    server.fail(r"001_00000\.parquet", status=500, method="GET", times=10)
    ds = _dataset(server, tmp_path, retries=1, download_dir=str(tmp_path / "dl"))
    listing = hub.list_files(ds)
    with pytest.raises(UserError, match=r"cannot download sample/10BT/001_00000\.parquet of HuggingFaceFW/fineweb@"
                                        r".* after 2 attempts .*; rerun to resume"):
        hub.download(ds, listing, announce=lambda m: None)
    assert not (tmp_path / "dl/sample/10BT/001_00000.parquet").exists()  # no partial file where readers look
    fetched_first = {r.path for r in server.downloads()}
    server.clear_faults()
    # What a killed run leaves: huggingface_hub's per-process temporary files, never resumed.
    temp = tmp_path / "dl/.cache/huggingface/download/sample/10BT"
    stale, live = temp / "abc.stale.incomplete", temp / "abc.live.incomplete"
    for p in (stale, live):
        p.write_bytes(b"partial")
    os.utime(stale, (1e9, 1e9))
    said = []
    sources = hub.download(ds, hub.list_files(ds), announce=said.append)
    assert "2 already downloaded; fetching 1 files" in said[0]
    assert not stale.exists() and live.exists()  # an hour-old one is removed, a live one left alone
    again = [r.path for r in server.downloads() if r.path in fetched_first]
    assert len(again) == len(fetched_first)  # nothing downloaded twice
    assert [r.path.rsplit("/", 1)[1] for r in server.downloads()][-1] == "001_00000.parquet"
    for s in sources:
        assert Path(s.url).read_bytes() == (server.root / s.name).read_bytes()


def test_ctrl_c_stops_a_download_at_once_and_the_rerun_completes_it(server, tmp_path):
    server.rate = 200  # bytes/s: the larger files take 20 s or more
    cmd = [TOKENSHARDS, "download", "--dataset", REPO, "--size", "10B", "--to", str(tmp_path / "d"), "--keep-free-gb", "0"]
    proc = subprocess.Popen(cmd, env=_env(tmp_path, server), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not any(r.method == "GET" and "/resolve/" in r.path for r in server.requests):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert time.monotonic() - t0 < 10  # did not wait for the downloads to end
    present = list((tmp_path / "d").glob("sample/10BT/*.parquet"))
    assert len(present) < 3  # interrupted mid-download ...
    for p in present:  # ... and whatever is where readers look is whole
        assert p.read_bytes() == (server.root / "sample/10BT" / p.name).read_bytes()
    server.rate = None
    proc = subprocess.run(cmd, env=_env(tmp_path, server), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for p in _served(server.root):
        assert (tmp_path / "d/sample/10BT" / p.name).read_bytes() == p.read_bytes()


def test_a_local_copy_whose_size_or_etag_disagrees_is_fetched_again(server, tmp_path):
    ds = _dataset(server, tmp_path, download_dir=str(tmp_path / "dl"))
    sources = hub.download(ds, hub.list_files(ds), announce=lambda m: None)
    damaged = Path(sources[0].url)
    damaged.write_bytes(damaged.read_bytes()[:100])  # truncated behind huggingface_hub's back
    n = len(server.downloads())
    hub.download(ds, hub.list_files(ds), announce=lambda m: None)
    assert len(server.downloads()) == n + 1
    assert damaged.read_bytes() == (server.root / sources[0].name).read_bytes()

    # In the cache, blobs are named by etag: a new commit with changed content is a new blob.
    cache_ds = _dataset(server, tmp_path)
    first = hub.download(cache_ds, hub.list_files(cache_ds), announce=lambda m: None)
    old_blob = os.path.realpath(first[2].url)
    target = server.root / first[2].name
    original = target.read_bytes()
    try:
        write_parquet(target, {"text": ["changed on the Hub"]})
        server.commit = "f" * 40
        second = hub.download(cache_ds, hub.list_files(cache_ds), announce=lambda m: None)
        assert os.path.realpath(second[2].url) != old_blob
        assert Path(second[2].url).read_bytes() == target.read_bytes()
        assert os.path.basename(os.path.realpath(second[2].url)) == hashlib.sha256(target.read_bytes()).hexdigest()
        # In a download folder, huggingface_hub compares the etag it recorded with the new commit's
        # (here it copies the new blob from the cache above instead of fetching it a second time).
        folder = hub.download(ds, hub.list_files(ds), announce=lambda m: None)
        assert Path(folder[2].url).read_bytes() == target.read_bytes()
    finally:
        target.write_bytes(original)


# -- the whole job --

def test_full_run_downloads_each_file_once_and_matches_tiktoken(server, tokenize, tmp_path, gpt2):
    ds = _dataset(server, tmp_path)
    summary, out = tokenize([], hub=ds)
    _check_against_tiktoken(out, server.root, gpt2)
    fetched = sorted(r.path.rsplit("/", 1)[1] for r in server.downloads())
    assert fetched == [p.name for p in _served(server.root)]  # each once, and nothing of sample/100BT
    # Planned before the downloads ended: each footer read once, with one ranged GET of the file's end.
    footers = sorted(r.path.rsplit("/", 1)[1] for r in server.partial_reads())
    assert footers == [p.name for p in _served(server.root)]
    for r in server.partial_reads():
        first, last = map(int, r.range.removeprefix("bytes=").split("-"))
        size = (server.root / "sample/10BT" / r.path.rsplit("/", 1)[1]).stat().st_size
        assert last == size - 1 and last - first + 1 <= hub.FOOTER_TAIL
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["name"] for i in manifest["inputs"]] == [f"sample/10BT/00{n}_00000.parquet" for n in range(3)]
    assert all(f"snapshots/{server.commit}/sample/10BT/" in i["path"] for i in manifest["inputs"])

    n = len(server.requests)
    again, _ = tokenize([], hub=ds)  # a rerun: nothing fetched, every partition already committed
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]
    assert again.skipped_partitions == again.partitions == summary.partitions


@pytest.mark.parametrize("into", ["cache", "download_dir"])
def test_tokenizing_while_downloading_writes_the_bytes_a_download_first_run_writes(server, tokenize, tmp_path, into):
    """Footers from the Hub, partitions started as each file arrives (the last one is held back
    until a partition committed): the same job identity, plan, part files, done records and
    manifest as when every file was downloaded before planning, into the HF cache or a folder."""
    def dataset(folder: str) -> HubDataset:
        return dataclasses.replace(_dataset(server, tmp_path), **{"cache_dir" if into == "cache" else "download_dir":
                                                                   str(tmp_path / folder)})

    first = dataset("first")
    hub.download(first, hub.list_files(first), announce=lambda m: None)  # then the run plans from local files
    n = len(server.requests)
    tokenize([], out=tmp_path / "a", hub=first, partition_bytes=300)
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]
    last = "sample/10BT/002_00000.parquet"
    before = len(server.downloads(last))
    seen = _when_a_partition_commits(tmp_path / "b", server.hold(re.escape(last)), lambda: (
        len(server.downloads(last)) - before, list((tmp_path / "second").rglob(Path(last).name))))
    tokenize([], out=tmp_path / "b", hub=dataset("second"), partition_bytes=300)
    assert seen == [(True, (0, []))]  # a partition was committed while the last file was still missing
    assert len(server.downloads()) == 2 * 3 and len(server.partial_reads()) == 3  # each run fetched each file once
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert sorted(a) == sorted(b) and len(a) > 8
    # Only the download folder differs, and the job hash, which hashes the job identity holding it.
    jobs = [json.loads(t["manifest.json"])["job"].encode() for t in (a, b)]
    for name in a:
        assert a[name].replace(b"/first/", b"/second/").replace(*jobs) == b[name], name
    # Both runs knew each file by the etag the Hub listed, before it was downloaded or after.
    assert [i["identity"] for i in json.loads(b["manifest.json"])["inputs"]] == \
        [{"size": p.stat().st_size, "blob": server.etag(p.relative_to(server.root).as_posix())} for p in _served(server.root)]


def _when_a_partition_commits(out: Path, release: threading.Event, look) -> list:
    """On a thread: once OUT holds a done record (or after 60 s), note whether it does and
    ``look()``, then ``release``."""
    seen = []

    def watch() -> None:
        deadline = time.monotonic() + 60
        while not (committed := bool(list(out.glob("parts/part-*.done.json")))) and time.monotonic() < deadline:
            time.sleep(0.01)
        seen.append((committed, look()))
        release.set()

    threading.Thread(target=watch, name="test-watch", daemon=True).start()
    return seen


def test_a_download_failing_while_tokenizing_stops_the_run_and_the_rerun_resumes(server, tokenize, tmp_path, gpt2):
    server.fail(r"002_00000\.parquet", status=500, method="GET", times=10, ranged=False)  # footers read fine
    ds = _dataset(server, tmp_path, retries=1)
    with pytest.raises(UserError, match=r"^cannot download sample/10BT/002_00000\.parquet of HuggingFaceFW/fineweb@"
                                        r".* after 2 attempts .*; rerun to resume"):
        tokenize([], hub=ds, partition_bytes=300)
    assert not (tmp_path / "out/manifest.json").exists()
    fetched_first = {r.path for r in server.downloads()}
    assert len(fetched_first) == 2  # one at a time, in order: 000 and 001 arrived before 002 failed
    server.clear_faults()
    summary, out = tokenize([], hub=ds, partition_bytes=300)
    _check_against_tiktoken(out, server.root, gpt2)
    again = [r.path for r in server.downloads()]
    assert len(again) == 3 and set(again[:2]) == fetched_first  # the rerun fetched only the missing file
    assert summary.partitions > 3


def test_a_download_folder_file_is_known_by_the_etag_huggingface_hub_vouches_for(server, tmp_path):
    """``store.vouched_etag`` reads huggingface_hub's download records by its own reader's rule: the
    etag while the file's mtime is at most 1 s past the record, none after (then the mtime). A file
    no record vouches for is not present, and huggingface_hub checks it again and records it."""
    from huggingface_hub._local_folder import read_download_metadata

    ds = _dataset(server, tmp_path, download_dir=str(tmp_path / "dl"))
    listing = hub.list_files(ds)
    hub.download(ds, listing, announce=lambda m: None)
    f = listing.files[0]
    path = hub.local_path(ds, listing, f)
    fs, local = filesystem(str(path))
    assert store.vouched_etag(str(path)) == read_download_metadata(tmp_path / "dl", f.path).etag == f.etag
    assert store.file_identity(fs, local) == hub.downloaded_identity(f) and hub.is_present(ds, listing, f)
    record = tmp_path / "dl/.cache/huggingface/download" / f"{f.path}.metadata"
    commit, etag, _ = record.read_text().splitlines()
    stamp = time.time() - 10
    record.write_text(f"{commit}\n{etag}\n{stamp}\n")  # as if downloaded 10 s ago: the mtimes below are past
    for later, trusted in ((0.5, True), (1.5, False)):
        _set_mtime(path, stamp + later)
        assert (read_download_metadata(tmp_path / "dl", f.path) is not None) == trusted
        assert store.vouched_etag(str(path)) == (f.etag if trusted else None)
    st = path.stat()
    assert store.file_identity(fs, local) == (("size", f.size), ("mtime_ns", st.st_mtime_ns))
    assert not hub.is_present(ds, listing, f)
    n = len(server.downloads())
    hub.download(ds, listing, announce=lambda m: None)  # huggingface_hub hashes it: the same bytes, recorded again
    assert len(server.downloads()) == n and hub.is_present(ds, listing, f)


def test_an_out_an_earlier_version_made_from_a_download_folder_still_verifies_and_resumes(server, tokenize, cluster,
                                                                                         tmp_path):
    """Versions before download records were trusted knew a download folder's files by mtime (in the
    job file and the manifest): such an OUT still verifies and resumes, and is re-claimed by etag."""
    ds = _dataset(server, tmp_path, download_dir=str(tmp_path / "dl"))
    summary, out = tokenize([], hub=ds, partition_bytes=300)
    for name in (JOB_FILE, "manifest.json"):
        _as_recorded_by_mtime(out / name)
    report = run_verify(VerifyConfig(out=str(out), deep=10_000, scheduler=cluster.scheduler_address),
                        announce=lambda m: None)
    assert report.ok and report.compared > 0, report.problems
    n = len(server.requests)
    again, _ = tokenize([], hub=ds, partition_bytes=300)
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]
    assert again.skipped_partitions == again.partitions == summary.partitions
    assert all("blob" in i["identity"] for i in json.loads((out / JOB_FILE).read_text())["inputs"])


def test_a_download_folder_file_edited_since_is_seen_as_changed_and_fetched_again(server, tokenize, cluster, tmp_path):
    """A folder's file edited in place (same size): a run reading it stops naming it, verify --deep
    reports it, and the next run has huggingface_hub fetch it again and redoes no partition; so
    does a rerun with HF_HUB_OFFLINE=1, which asks the Hub nothing."""
    ds = _dataset(server, tmp_path, download_dir=str(tmp_path / "dl"))
    summary, out = tokenize([], hub=ds)
    name = "sample/10BT/001_00000.parquet"

    def edit_once_planned(msg: str) -> None:
        if "partitions" in msg and "input files" in msg:  # planned: the tasks start next
            _edit_in_place(tmp_path / "dl", name)

    config = TokenizeConfig(inputs=(), out=str(tmp_path / "b"), hub=ds, scheduler=cluster.scheduler_address,
                            progress="none", retries=0)
    with pytest.raises(UserError, match=r"^\S+/dl/sample/10BT/001_00000\.parquet changed since this run planned it "
                                        r"\(blob \w+ → None, mtime_ns None → \d+\); stopped before partition \d+ mixed "
                                        r"old and new content; rerun once the input is final$"):
        run_tokenize(config, announce=edit_once_planned)
    report = run_verify(VerifyConfig(out=str(out), deep=10_000, scheduler=cluster.scheduler_address),
                        announce=lambda m: None)
    # What differs is named, its values never shown (they come from the manifest and a file it names).
    assert report.problems and all(f"input changed since the run ({tmp_path / 'dl' / name}: its blob and mtime_ns "
                                   "differ from what the run recorded)" in p for p in report.problems), report.problems
    n = len(server.downloads())
    again, _ = tokenize([], hub=ds)
    assert [r.path.rsplit("/", 1)[1] for r in server.downloads()[n:]] == ["001_00000.parquet"]
    assert again.skipped_partitions == again.partitions == summary.partitions
    assert (tmp_path / "dl" / name).read_bytes() == (server.root / name).read_bytes()

    n = len(server.requests)
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--dataset", REPO, "--size", "10B", "--download-dir", str(tmp_path / "dl"),
                           "--out", str(out), "--scheduler", cluster.scheduler_address, "--progress", "none"],
                          env=_env(tmp_path, None, HF_HUB_OFFLINE="1"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"({summary.partitions} already committed)" in proc.stdout
    assert len(server.requests) == n


def _set_mtime(path: Path, seconds: float) -> None:
    ns = int(seconds * 1e9)
    os.utime(path, ns=(ns, ns))


def _edit_in_place(folder: Path, name: str) -> None:
    """Overwrite a few bytes of ``folder/name`` (same size) as an edit 2 s after huggingface_hub
    recorded its download would: it trusts the record up to 1 s past it."""
    from huggingface_hub._local_folder import read_download_metadata

    stamp = read_download_metadata(folder, name).timestamp
    path = folder / name
    with open(path, "r+b") as f:
        f.seek(path.stat().st_size // 2)
        f.write(b"EDIT")
    _set_mtime(path, stamp + 2)


def _as_recorded_by_mtime(path: Path) -> None:
    """A job file or manifest rewritten as versions before download records were trusted wrote it."""
    record = json.loads(path.read_text())
    for i in record["inputs"]:
        st = os.stat(i["path"])
        i["identity"] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    path.write_text(json.dumps(record, indent=1) + "\n")


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but OUT's lease (which names its holder), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "lease" not in p.name}


def test_a_later_reading_plugin_replaces_an_earlier_one_but_never_a_runs(monkeypatch):
    """Readers after a run (verify, inspect) register the run's Hub references again, maybe with
    another download folder: the latest reader's entry counts, but a fetching run's entry (on
    the same cluster) stays, since it knows where the run's copies are."""
    from tokenshards.storage.hub.listing import HubListing
    from tokenshards.storage.hub.workerfs import HubCacheFileSystem, HubFetchPlugin, cache_uri, reading_plugins

    monkeypatch.setattr(HubCacheFileSystem, "datasets", {})
    commit = "c" * 40
    identities = {cache_uri(REPO, commit, "sample/10BT/000_00000.parquet"): {"size": 10, "etag": "e"}}
    key = (REPO, commit)
    for folder in ("/first", "/second"):
        [plugin] = reading_plugins(identities, endpoint="http://hub.test", download_dir=folder)
        plugin.setup(worker=None)
        assert HubCacheFileSystem.datasets[key].ds.download_dir == folder and not HubCacheFileSystem.datasets[key].fetch
    listing = HubListing(repo=REPO, revision=commit, commit=commit, folder="sample/10BT",
                         files=tuple(plugin.files.values()))
    HubFetchPlugin(plugin.ds, listing).setup(worker=None)  # a run on this cluster
    plugin.setup(worker=None)
    assert HubCacheFileSystem.datasets[key].fetch


def test_workers_fetch_mode_downloads_once_per_machine(server, tokenize, tmp_path, gpt2):
    ds = _dataset(server, tmp_path, fetch="workers")
    _, out = tokenize([], hub=ds)
    _check_against_tiktoken(out, server.root, gpt2)
    fetched = sorted(r.path.rsplit("/", 1)[1] for r in server.downloads())
    assert fetched == [p.name for p in _served(server.root)]  # two workers, one machine: once each
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"] == f"hfcache://datasets/{REPO}@{server.commit}/sample/10BT/000_00000.parquet"


def test_verify_deep_reads_a_workers_mode_run_from_its_download_folder_not_the_hub(server, tokenize, tmp_path,
                                                                                   monkeypatch):
    """A ``--fetch workers --download-dir DIR`` run records DIR; ``verify --deep`` on a new cluster
    reads the sampled documents from the copies there (``--download-dir`` says where they are
    now), asking the Hub for nothing."""
    from huggingface_hub import constants

    ds = _dataset(server, tmp_path, fetch="workers", download_dir=str(tmp_path / "dl"))
    _, out = tokenize([], hub=ds, partition_bytes=300)
    assert json.loads((out / "manifest.json").read_text())["hub"]["download_dir"] == str(tmp_path / "dl")

    n = len(server.requests)
    monkeypatch.setattr(constants, "ENDPOINT", server.url)  # HF_ENDPOINT, as verify's process read it
    report = run_verify(VerifyConfig(out=str(out), deep=10_000, workers=1, dashboard_address=":0", progress="none"),
                        announce=lambda m: None)  # a new cluster: the run's fetching plugin is not on it
    assert report.ok and report.compared > 0, report.problems
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]

    (tmp_path / "dl").rename(tmp_path / "moved")  # where the machines mount it now
    moved = str(tmp_path / "moved")
    proc = subprocess.run([TOKENSHARDS, "verify", str(out), "--deep", "10000", "--download-dir", moved,
                           "--workers", "1", "--no-dashboard", "--progress", "none"],
                          env=_env(tmp_path, server), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{report.compared:,} documents re-tokenized: OK" in proc.stdout
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]


def test_inspect_counts_a_workers_mode_run_per_language_from_its_copies_or_the_hub(server, tokenize, tmp_path):
    """``inspect`` reads a ``--fetch workers`` run's per-language column (here FineWeb's ``dump``)
    from this machine's copies in the run's download folder, else by range from the Hub: the
    same counts as for a run that read local files."""
    _, local = tokenize([], out=tmp_path / "local", hub=_dataset(server, tmp_path, download_dir=str(tmp_path / "a")))
    _, out = tokenize([], hub=_dataset(server, tmp_path, fetch="workers", download_dir=str(tmp_path / "dl")))

    def languages(run: Path) -> list[str]:
        proc = subprocess.run([TOKENSHARDS, "inspect", str(run), "--language-column", "dump"],
                              env=_env(tmp_path, server), capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        lines = [re.sub(r"input \S+/(sample/10BT/)", r"input \1", line) for line in proc.stdout.splitlines()]
        return lines[next(i for i, line in enumerate(lines) if line.startswith("per language")):]  # inputs by name

    expected = languages(local)
    assert any("CC-MAIN-2024-10" in line for line in expected), expected
    n = len(server.requests)
    assert languages(out) == expected
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]  # its copies here

    shutil.rmtree(tmp_path / "dl")
    n = len(server.requests)
    assert languages(out) == expected
    read = [r for r in server.requests[n:] if "/resolve/" in r.path and r.method == "GET"]
    assert read and all(r.range and r.status == 206 for r in read)  # by range, no file downloaded


def test_a_workers_mode_out_an_earlier_version_made_still_resumes(server, tokenize, tmp_path):
    """Versions before this one knew a Hub reference (``hfcache://``) by its size only: such an OUT
    is re-claimed (its job file records the etag from now on) and resumes, fetching nothing again."""
    ds = _dataset(server, tmp_path, fetch="workers")
    summary, out = tokenize([], hub=ds, partition_bytes=300)
    record = json.loads((out / JOB_FILE).read_text())
    for i in record["inputs"]:
        i["identity"] = {"size": i["identity"]["size"]}
    (out / JOB_FILE).write_text(json.dumps(record, indent=1) + "\n")
    n = len(server.requests)
    again, _ = tokenize([], hub=ds, partition_bytes=300)
    assert again.skipped_partitions == again.partitions == summary.partitions
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path and r.range is None]
    assert all(set(i["identity"]) == {"size", "etag"} for i in json.loads((out / JOB_FILE).read_text())["inputs"])


# -- the command line, with the environment a user sets --

def test_cli_tokenize_honours_hf_endpoint_and_hf_home(server, cluster, tmp_path, gpt2):
    out = tmp_path / "out"
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--dataset", REPO, "--size", "10B", "--out", str(out),
                           "--scheduler", cluster.scheduler_address, "--progress", "none", "--keep-free-gb", "0"],
                          env=_env(tmp_path, server), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{REPO}@main (commit {server.commit[:12]}) sample/10BT: 3 files" in proc.stderr
    assert "B free" in proc.stderr
    _check_against_tiktoken(out, server.root, gpt2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"].startswith(str(tmp_path / "hf-home" / "hub" / "datasets--HuggingFaceFW--fineweb"))
    assert manifest["hub"]["commit"] == server.commit and manifest["hub"]["folder"] == "sample/10BT"

    # HF_HUB_OFFLINE=1: the files already in HF_HOME, no request at all.
    n = len(server.requests)
    proc = subprocess.run([TOKENSHARDS, "download", "--size", "10B"], env=_env(tmp_path, None, HF_HUB_OFFLINE="1"),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "3 already downloaded; fetching 0 files" in proc.stderr
    assert len(server.requests) == n


def test_cli_missing_size_is_one_line_and_exit_2(server, tmp_path):
    proc = subprocess.run([TOKENSHARDS, "download", "--dataset", REPO, "--size", "1000B", "--to", str(tmp_path / "d")],
                          env=_env(tmp_path, server), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "tokenshards: error: dataset 'HuggingFaceFW/fineweb' at revision 'main' has no size 1000B (folder sample/1000BT); "
        "sizes that exist: 10B, 100B"]


def test_cli_download_to_a_folder(server, tmp_path):
    proc = subprocess.run([TOKENSHARDS, "download", "--dataset", REPO, "--size", "10B", "--to", str(tmp_path / "d"),
                           "--keep-free-gb", "0"], env=_env(tmp_path, server), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"downloaded: 3 parquet files in {tmp_path / 'd' / 'sample' / '10BT'}"
    for p in _served(server.root):
        assert (tmp_path / "d/sample/10BT" / p.name).read_bytes() == p.read_bytes()


def test_a_reading_plugin_opens_this_machines_copy_else_ranges_of_the_hub(server, tmp_path):
    """``verify --deep``'s plugin for ``hfcache://`` references: a file downloaded here is read from
    here; one that is not is read by range at the pinned commit, and nothing is downloaded; a run's
    (fetching) registration of the same commit is left in place."""
    from huggingface_hub import constants
    from tokenshards.storage.hub.listing import list_files
    from tokenshards.storage.hub.fetch import fetch_file
    from tokenshards.storage.hub.workerfs import HubCacheFileSystem, cache_uri, reading_plugins, reference_identity

    ds = _dataset(server, tmp_path)
    listing = list_files(ds)
    present, absent = listing.files[0], listing.files[1]
    fetch_file(ds, listing.repo, listing.commit, present)
    identities = {cache_uri(listing.repo, listing.commit, f.path): dict(reference_identity(f)) for f in listing.files}
    original = constants.HF_HUB_CACHE
    constants.HF_HUB_CACHE = str(tmp_path / "hf-cache")  # as a worker with HF_HUB_CACHE set reads it
    [plugin] = reading_plugins(identities, endpoint=server.url)
    try:
        plugin.setup(worker=None)
        before = len(server.requests)
        for f in (present, absent):
            url = cache_uri(listing.repo, listing.commit, f.path)
            fs, path = filesystem(url)
            assert store.file_identity_like(fs, path, identities[url]) == tuple(identities[url].items())
            with fs.open(path, "rb") as opened:
                table = pq.ParquetFile(opened).read_row_group(1, columns=["text"])
            assert table.column("text").to_pylist() == pq.read_table(server.root / f.path).column("text").to_pylist()[16:32]
        hub_reads = [r for r in server.requests[before:] if "/resolve/" in r.path]
        assert hub_reads and all(r.path.endswith(absent.path) and r.range for r in hub_reads)
        assert not server.downloads(absent.path)
    finally:
        constants.HF_HUB_CACHE = original
        plugin.teardown(worker=None)

    from tokenshards.storage.hub import HubFetchPlugin
    run = HubFetchPlugin(ds, listing)
    run.setup(worker=None)
    try:
        plugin.setup(worker=None)  # a verify on the run's cluster: the run's entry serves it
        assert HubCacheFileSystem.datasets[run.key].fetch
    finally:
        run.teardown(worker=None)


def test_cli_hf_urls_as_inputs_tokenize_grow_and_verify(server, tmp_path, gpt2):
    """``--input hf://datasets/REPO/...`` (fsspec's HfFileSystem, as the help says) reads the Hub
    directly; ``--add`` grows such a run, and the grown run is the bytes of one run of all files.
    Each command starts its own cluster: its workers must see HF_ENDPOINT, as a user's would."""
    def cli(*args: str) -> str:
        proc = subprocess.run([TOKENSHARDS, *args, "--workers", "2", "--progress", "none"],
                              env=_env(tmp_path, server), capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout + proc.stderr

    url = f"hf://datasets/{REPO}/sample/10BT"
    grown, single = tmp_path / "grown", tmp_path / "single"
    cli("tokenize", "--input", f"{url}/00[01]_00000.parquet", "--out", str(grown))
    assert "3 partitions (2 already committed)" in cli("tokenize", "--add", "--input", f"{url}/*.parquet", "--out", str(grown))
    cli("tokenize", "--input", f"{url}/*.parquet", "--out", str(single))

    _check_against_tiktoken(grown, server.root, gpt2, named="")
    kept, whole = (json.loads((out / "manifest.json").read_text()) for out in (grown, single))
    assert [p["sha256"] for p in kept["partitions"]] == [p["sha256"] for p in whole["partitions"]]
    assert [i["path"] for i in kept["inputs"]] == [f"{url}/{p.name}" for p in _served(server.root)]
    assert "20 documents re-tokenized: OK" in cli("verify", str(grown), "--deep", "20")
