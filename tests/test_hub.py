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
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from hubserver import HubServer
from readback import expected_tokens, read_documents
from tokenshards.storage import hub
from tokenshards.errors import UserError
from tokenshards.storage.hub import HubDataset

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


def _check_against_tiktoken(out: Path, root: Path, enc) -> None:
    """Every non-empty row of every served file is a document whose tokens are tiktoken's."""
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
            want_id = table["id"][row] if "id" in table else f"sample/10BT/{path.name}:{row}"
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


def test_tokenizing_while_downloading_writes_the_bytes_a_download_first_run_writes(server, tokenize, tmp_path):
    """Footers from the Hub, partitions started as each file arrives: the same job identity, plan,
    part files, done records and manifest as when every file was downloaded before planning."""
    first = dataclasses.replace(_dataset(server, tmp_path), cache_dir=str(tmp_path / "first"))
    hub.download(first, hub.list_files(first), announce=lambda m: None)  # then the run plans from local files
    n = len(server.requests)
    tokenize([], out=tmp_path / "a", hub=first, partition_bytes=300)
    assert not [r for r in server.requests[n:] if "/resolve/" in r.path]
    tokenize([], out=tmp_path / "b", hub=dataclasses.replace(first, cache_dir=str(tmp_path / "second")),
             partition_bytes=300)
    assert len(server.downloads()) == 2 * 3 and len(server.partial_reads()) == 3  # each run fetched each file once
    a, b = _tree(tmp_path / "a"), _tree(tmp_path / "b")
    assert sorted(a) == sorted(b) and len(a) > 8
    # Only the cache folder differs, and the job hash, which hashes the job identity holding it.
    jobs = [json.loads(t["manifest.json"])["job"].encode() for t in (a, b)]
    for name in a:
        assert a[name].replace(b"/first/", b"/second/").replace(*jobs) == b[name], name


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


def _tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` but OUT's lease (which names its holder), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "lease" not in p.name}


def test_workers_fetch_mode_downloads_once_per_machine(server, tokenize, tmp_path, gpt2):
    ds = _dataset(server, tmp_path, fetch="workers")
    _, out = tokenize([], hub=ds)
    _check_against_tiktoken(out, server.root, gpt2)
    fetched = sorted(r.path.rsplit("/", 1)[1] for r in server.downloads())
    assert fetched == [p.name for p in _served(server.root)]  # two workers, one machine: once each
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"] == f"hfcache://datasets/{REPO}@{server.commit}/sample/10BT/000_00000.parquet"


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
