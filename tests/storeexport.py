"""Export and train-bpe on an object store, the cases GCS and Azure share (test_gcs.py and
test_azure.py call them with their emulator): a store's export read back equal to a local one, a
killed export that leaves nothing that looks committed, and a vocabulary trained from and to the
store equal to one trained locally.

``store`` is the emulator fixture (``gcs`` or ``azure``): ``fs()``, ``storage_options``, ``env()``,
``proxy``; ``scheme`` the URL scheme ("gs", "az"); ``bucket`` a new empty bucket (container).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import download
from test_s3 import write_corpus

from tokenshards.bpe.train import TrainBpeConfig, run_train_bpe
from tokenshards.export.command import ExportConfig, run_export
from tokenshards.storage.store import PARTS_FOLDER, filesystem, write_atomic
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize

VAL = 2000


def local_run(cluster, root: Path) -> Path:
    """A small tokenized run on local disk: the corpus of test_s3, many partitions."""
    write_corpus(root / "in")
    run_tokenize(TokenizeConfig(inputs=(str(root / "in" / "*.parquet"),), out=str(root / "run"), partition_bytes=6000,
                                scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    return root / "run"


def upload(store, scheme: str, local: Path, prefix: str) -> None:
    """Through our own store layer: gcsfs's ``pipe_file`` loses a trailing CR or LF of binary data
    on gcp-storage-emulator (see ``store.gcs_upload``)."""
    fs, root = filesystem(f"{scheme}://{prefix}", store.storage_options)
    for path in sorted(local.rglob("*")):
        if path.is_file():
            write_atomic(fs, f"{root}/{path.relative_to(local).as_posix()}", path.read_bytes())


def export(cluster, out: str, to: str, storage_options: dict | None = None, **options) -> None:
    run_export(ExportConfig(out=out, to=to, scheduler=cluster.scheduler_address, progress="none",
                            storage_options=storage_options or {}, **options), announce=lambda m: None)


def exports_equal_local(store, scheme: str, bucket: str, cluster, run: Path, tmp_path: Path, *, throttle=None) -> None:
    """A shuffled llmc export from the run on the store to the store, and a megatron export from
    local disk to the store, each byte-equal to the same export done locally. Small chunks make
    many parts per file (on GCS more than one compose request takes: a tree). ``throttle()``, called
    before each export to the store, sets the proxy's 429/503s: they are retried, not failures."""
    fs, options = store.fs(), store.storage_options
    upload(store, scheme, run, f"{bucket}/run")
    cases = {"llmc": dict(format="llmc", val_tokens=VAL, shuffle=True, seed=3, chunk_bytes=512),
             "megatron": dict(format="megatron", val_tokens=VAL, chunk_bytes=4096)}
    for name, opts in cases.items():
        local = tmp_path / f"local-{name}"
        export(cluster, str(run), str(local), **opts)
        source = f"{scheme}://{bucket}/run" if name == "llmc" else str(run)
        if throttle:
            throttle()
        export(cluster, source, f"{scheme}://{bucket}/{name}", options, **opts)
        keys = download(fs, f"{bucket}/{name}", tmp_path / f"store-{name}")
        names = sorted(p.name for p in local.iterdir())
        assert keys == names, (keys, names)  # nothing else: no parts left, no lease
        for key in names:
            if not key.endswith("_export.json"):
                assert (tmp_path / f"store-{name}" / key).read_bytes() == (local / key).read_bytes(), key
        record = json.loads((tmp_path / f"store-{name}" / "fineweb_export.json").read_text())
        assert record["files"] == json.loads((local / "fineweb_export.json").read_text())["files"]
    assert sum(1 for f in json.loads((tmp_path / "local-llmc" / "fineweb_export.json").read_text())["files"]
               if f["bytes"] > 32 * 512) >= 1  # a file of more parts than one compose request takes


def killed_export_leaves_nothing_committed(store, scheme: str, bucket: str, run: Path, tmp_path: Path, *,
                                           commit_request) -> None:
    """The CLI exports to the store; the proxy holds the first request that would make a file
    visible (``commit_request``: every chunk is in by then); the command and its workers are
    SIGKILLed there. No export file or record is visible; the same command then completes."""
    fs = store.fs()
    dest = f"{scheme}://{bucket}/killed"
    cmd = [sys.executable, "-m", "tokenshards", "export", str(run), "--format", "llmc", "--to", dest, "--val-tokens",
           str(VAL), "--shuffle", "--workers", "1", "--progress", "none"]
    release = store.proxy.hold(commit_request)
    log = tmp_path / "killed.log"
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(cmd, env=store.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert store.proxy.held.wait(120), log.read_text()
        finally:
            os.killpg(proc.pid, signal.SIGKILL)  # the client, its LocalCluster and workers: a machine lost
            proc.wait()
    finally:
        release.set()
    store.proxy.clear()
    left = [k.split(f"{bucket}/killed/", 1)[1] for k in fs.find(f"{bucket}/killed")]
    assert not [k for k in left if k.endswith((".bin", "_export.json"))], left
    # Besides its lease: the note of the files it was about to commit (export.common.begin_commits).
    assert ".fineweb_export.json.unfinished" in left, left
    assert all(k.startswith(PARTS_FOLDER + "/") or k in (".tokenshards-lease.json", ".fineweb_export.json.unfinished")
               for k in left), left

    if any(k.startswith(PARTS_FOLDER + "/") for k in left):  # GCS: part objects, billed though hidden
        # Another export into the folder, of other names: it clears them too, under the folder's lease.
        other = subprocess.run([*cmd[:cmd.index("--shuffle")], "--prefix", "other", "--workers", "1", "--progress", "none"],
                               env=store.env(), capture_output=True, text=True, timeout=180)
        assert other.returncode == 0, other.stderr
        fs.invalidate_cache()
        assert not [k for k in fs.find(f"{bucket}/killed") if f"/{PARTS_FOLDER}/" in k], fs.find(f"{bucket}/killed")

    rerun = subprocess.run(cmd, env=store.env(), capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    keys = download(fs, f"{bucket}/killed", tmp_path / "rerun")
    assert "fineweb_export.json" in keys and not [k for k in keys if k.startswith(PARTS_FOLDER)], keys


def train_bpe_equals_local(store, scheme: str, bucket: str, cluster, tmp_path: Path) -> None:
    """train-bpe reading parquet from the store and writing its files there: the same bytes as
    from and to local disk."""
    fs, options = store.fs(), store.storage_options
    write_corpus(tmp_path / "in")
    upload(store, scheme, tmp_path / "in", f"{bucket}/in")
    common = dict(vocab_size=400, scheduler=cluster.scheduler_address, progress="none", partition_bytes=6000)
    run_train_bpe(TrainBpeConfig(inputs=(str(tmp_path / "in" / "*.parquet"),), out=str(tmp_path / "local.tiktoken"),
                                 **common), announce=lambda m: None)
    run_train_bpe(TrainBpeConfig(inputs=(f"{scheme}://{bucket}/in/*.parquet",), out=f"{scheme}://{bucket}/v/local.tiktoken",
                                 storage_options=options, **common), announce=lambda m: None)
    assert fs.cat_file(f"{bucket}/v/local.tiktoken") == (tmp_path / "local.tiktoken").read_bytes()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert fs.cat_file(f"{bucket}/v/local.hf/{name}") == (tmp_path / "local.hf" / name).read_bytes()
    sidecar = json.loads(fs.cat_file(f"{bucket}/v/local.tiktoken.json"))
    assert sidecar["ranks_sha256"] == json.loads((tmp_path / "local.tiktoken.json").read_text())["ranks_sha256"]
