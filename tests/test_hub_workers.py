"""The Hub on a cluster whose machines share no disk, on one box: a real `dask scheduler` and two
`dask worker` processes, each in a mount namespace of its own with a tmpfs over the HF cache's
folder, so that each has its own HF cache at the very path of the client's (as on real machines),
and neither sees the client's. The stand-in Hub logs every request.

- ``--fetch auto`` (the default) sees that, says so, and has the workers fetch: each file by one
  machine, once, after planning read only footers (ranged GETs), and the part files are byte for
  byte those of a ``--fetch client`` run;
- an explicit ``--fetch client`` there stops in one line before downloading anything;
- on a local cluster, ``auto`` is ``client`` without asking the cluster anything.
"""
from __future__ import annotations

import contextlib
import re
import shutil
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest

from conftest import write_parquet
from daskprocs import dask_processes
from hubserver import HubServer
from tokenshards.errors import UserError
from tokenshards.storage.hub import FOOTER_TAIL, HubDataset
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize
from tokenshards.verify.command import VerifyConfig, run_verify

REPO = "HuggingFaceFW/fineweb"
PARTITION = 200_000


def _can_unshare() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tokenshards-probe /mnt"], capture_output=True)
    return probe.returncode == 0


pytestmark = pytest.mark.skipif(not _can_unshare(), reason="needs `unshare --mount` and tmpfs mounts (root)")


@pytest.fixture(scope="module")
def repo_root(tmp_path_factory) -> Path:
    """Three files of 0.6 to 1.5 MB (a footer read is a few % of each), several partitions each."""
    root = tmp_path_factory.mktemp("fineweb-workers")
    rng = np.random.default_rng(22)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(["".join(rng.choice(letters, size=k)) for k in rng.integers(2, 10, size=5_000)])
    for n, docs in enumerate((900, 600, 350)):
        words = rng.choice(vocab, size=(docs, 250))
        write_parquet(root / f"sample/10BT/{n:03d}_00000.parquet",
                      {"text": [" ".join(w) + "." for w in words], "id": [f"<urn:uuid:{n}-{i}>" for i in range(docs)]},
                      row_group_size=100)
    return root


@pytest.fixture
def server(repo_root):
    with HubServer(repo_root, repo=REPO) as s:
        yield s


def _dataset(server: HubServer, cache: Path, **kw) -> HubDataset:
    return HubDataset(repo=REPO, size="10B", endpoint=server.url, cache_dir=str(cache), backoff=0.05, keep_free=0, **kw)


@contextlib.contextmanager
def _own_disk_workers(hf: Path, logs: Path):
    """A scheduler and two workers, each with an empty tmpfs of its own over ``hf``; its address."""
    own_disk = ("unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount -t tmpfs tokenshards-test "$0" && exec "$@"', str(hf))
    logs.mkdir()
    with dask_processes(logs, workers=0) as procs:
        for _ in range(2):
            procs.start_worker(wrap=own_disk)
        procs.wait_for_workers(2, timeout=60)
        yield procs.address


@pytest.fixture
def machines(tmp_path):
    """(scheduler address, HF folder): two workers whose own tmpfs covers the HF folder."""
    hf = tmp_path / "hf"
    hf.mkdir()
    with _own_disk_workers(hf, tmp_path / "logs") as address:
        yield address, hf


def _body_bytes(server: HubServer, path: str, size: int) -> int:
    """Bytes of ``path`` the Hub sent: whole files, the rest of a file, and ranges."""
    total = 0
    for r in server.downloads(path) + server.partial_reads(path):
        if not r.range:
            total += size
        else:
            first, _, last = r.range.removeprefix("bytes=").partition("-")
            total += (int(last) if last else size - 1) - int(first) + 1
    return total


def _parts(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((out / "parts").iterdir()) if p.name.endswith((".npy", ".parquet"))}


def test_auto_has_each_machine_fetch_its_own_files_once(server, machines, tokenize, tmp_path):
    address, hf = machines
    said: list[str] = []
    downloads_when_planned: list[int] = []

    def announce(msg: str) -> None:
        said.append(msg)
        if "input file" in msg and "partition" in msg:  # planned: the tasks start next
            downloads_when_planned.append(len(server.downloads()))

    config = TokenizeConfig(inputs=(), out=str(tmp_path / "workers"), hub=_dataset(server, hf / "hub"),
                            partition_bytes=PARTITION, scheduler=address, progress="none")
    summary = run_tokenize(config, announce=announce)
    host = socket.gethostname()
    assert f"hub: workers fetch the files themselves ({host} does not see this machine's HF cache {hf / 'hub'}); " \
           "each file goes to one machine" in said
    assert any(re.search(r"sample/10BT: 3 files, .* over 2 machines: ", m) for m in said), said
    assert not [m for m in said if "changed since this run planned it" in m]

    assert downloads_when_planned == [0]  # planning downloaded nothing ...
    files = sorted(server.root.glob("sample/10BT/*.parquet"))
    for p in files:
        name = p.relative_to(server.root).as_posix()
        [footer] = server.partial_reads(name)  # ... it read each footer once, by range
        first, last = map(int, footer.range.removeprefix("bytes=").split("-"))
        assert last == p.stat().st_size - 1 and last - first + 1 <= FOOTER_TAIL
        assert len(server.downloads(name)) == 1, name  # one machine fetched it, once
        assert _body_bytes(server, name, p.stat().st_size) <= 1.3 * p.stat().st_size
    assert summary.partitions > 2 * len(files)
    assert not list(hf.rglob("*.parquet"))  # nothing was downloaded into the client's own HF folder

    client_run, out = tokenize([], out=tmp_path / "client", hub=_dataset(server, tmp_path / "client-hf", fetch="client"),
                               partition_bytes=PARTITION)
    assert client_run.partitions == summary.partitions and client_run.tokens == summary.tokens
    assert _parts(out) == _parts(tmp_path / "workers")  # byte for byte


def test_fetch_client_where_workers_cannot_see_the_download_stops_before_downloading(server, machines, tmp_path):
    address, hf = machines
    config = TokenizeConfig(inputs=(), out=str(tmp_path / "out"), hub=_dataset(server, hf / "hub", fetch="client"),
                            scheduler=address, progress="none")
    host = socket.gethostname()
    with pytest.raises(UserError, match=rf"^--fetch client downloads into this machine's \({re.escape(host)}\) HF cache "
                                        rf"{re.escape(str(hf / 'hub'))}, which the workers on {re.escape(host)} do not "
                                        r"see: their tasks would find no file there; use --fetch workers \(each machine "
                                        r"fetches the files of its own partitions\), or --download-dir DIR on a "
                                        r"filesystem every machine mounts"):
        run_tokenize(config, announce=lambda m: None)
    assert not [r for r in server.requests if "/resolve/" in r.path]  # not a byte of any file
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_auto_on_a_local_cluster_downloads_here_and_says_so_before_the_cluster_starts(server, tmp_path):
    said: list[str] = []
    config = TokenizeConfig(inputs=(), out=str(tmp_path / "out"), hub=_dataset(server, tmp_path / "hf"), workers=1,
                            dashboard_address=":0", progress="none")
    run_tokenize(config, announce=said.append)
    line = f"hub: this machine downloads into {tmp_path / 'hf'} (a local cluster: its workers share this machine's disk)"
    assert line in said
    dashboard = next(i for i, m in enumerate(said) if m.startswith("dashboard: "))
    assert said.index(line) < dashboard  # decided, and downloading, before the cluster started
    assert len(server.downloads()) == 3


def test_verify_deep_on_a_fresh_cluster_reads_the_sampled_row_groups_from_the_hub(server, machines, tmp_path,
                                                                                  monkeypatch):
    """Verify later, on machines that never held the files (a new cluster): ``--deep`` reads the
    sampled documents' row groups from the Hub by range at the run's commit, downloading no file."""
    from huggingface_hub import constants

    address, hf = machines
    out = tmp_path / "workers"
    run_tokenize(TokenizeConfig(inputs=(), out=str(out), hub=_dataset(server, hf / "hub"), partition_bytes=PARTITION,
                                scheduler=address, progress="none"), announce=lambda m: None)
    before = len(server.requests)
    with _own_disk_workers(hf, tmp_path / "fresh-logs") as fresh:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)  # HF_ENDPOINT, as verify's process read it
        report = run_verify(VerifyConfig(out=str(out), deep=6, scheduler=fresh), announce=lambda m: None)
    assert report.ok, report.lines()
    assert report.compared == 6
    read = [r for r in server.requests[before:] if "/resolve/" in r.path and r.method == "GET"]
    assert read and all(r.range and r.status == 206 for r in read), [(r.path, r.range, r.status) for r in read]
    files = {p.relative_to(server.root).as_posix(): p.stat().st_size for p in server.root.glob("sample/10BT/*.parquet")}
    sent = sum(_range_bytes(r.range, files[r.path.split("/", 6)[-1]]) for r in read)
    assert sent < 0.5 * sum(files.values())  # six documents' row groups and the footers, not the files
    assert not list(hf.rglob("*.parquet"))


def _range_bytes(header: str, size: int) -> int:
    first, _, last = header.removeprefix("bytes=").partition("-")
    return (int(last) if last else size - 1) - int(first) + 1


def test_train_bpe_with_workers_fetching_has_each_file_fetched_once(server, machines, cluster, tmp_path):
    """train-bpe plans like tokenize and counts each file's partitions on the machine it was given
    to (its ``Lane``): one download per file, and the ranks of a ``--fetch client`` run."""
    from tokenshards.bpe.train import TrainBpeConfig, run_train_bpe

    address, hf = machines
    said: list[str] = []
    run_train_bpe(TrainBpeConfig(inputs=(), hub=_dataset(server, hf / "hub"), out=str(tmp_path / "workers.tiktoken"),
                                 vocab_size=400, partition_bytes=PARTITION, scheduler=address, progress="none"),
                  announce=said.append)
    assert any(re.search(r"sample/10BT: 3 files, .* over 2 machines: ", m) for m in said), said
    for p in sorted(server.root.glob("sample/10BT/*.parquet")):
        assert len(server.downloads(p.relative_to(server.root).as_posix())) == 1, p.name

    run_train_bpe(TrainBpeConfig(inputs=(), hub=_dataset(server, tmp_path / "client-hf", fetch="client"),
                                 out=str(tmp_path / "client.tiktoken"), vocab_size=400, partition_bytes=PARTITION,
                                 scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    assert (tmp_path / "workers.tiktoken").read_bytes() == (tmp_path / "client.tiktoken").read_bytes()
