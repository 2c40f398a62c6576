"""Publishing an export on the Hub: the real huggingface_hub client uploads to the stand-in Hub
(``hubserver.py``), and downloads what it uploaded the way modded-nanogpt's
``data/cached_fineweb10B.py`` does.

huggingface_hub reads HF_ENDPOINT, HF_HOME and HF_HUB_DISABLE_XET at import, so in-process tests set
its ``constants`` (``hub`` fixture); HF_TOKEN it reads when asked. The stand-in speaks the LFS
transfer, not hf_xet's CAS protocol: with hf_xet installed huggingface_hub 2.4 uses Xet for every
upload whatever the server says, and ``HF_HUB_DISABLE_XET=1`` is its own switch back to LFS.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from huggingface_hub import constants, hf_hub_download, snapshot_download

from hubserver import HubServer
from test_export import SHARD, VAL, read_llmc, tokenize_to, write_corpus
from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.export import ExportConfig
from tokenshards.export import publish
from tokenshards.export.publish import PublishConfig, run_publish

pytestmark = pytest.mark.filterwarnings(
    # huggingface_hub 2.4's LFS PUT passes the open file as ``data=`` (lfs._upload_single_part): its
    # call into httpx2, not ours; the file is still streamed from disk.
    "ignore:Use 'content=<...>' to upload raw bytes/text content.:DeprecationWarning")

REPO = "me/tokens"
DEST = f"hf://datasets/{REPO}/gpt2"
TOKENS = {"tok-me": "me", "tok-other": "other"}


@pytest.fixture(scope="module")
def run(tmp_path_factory, cluster):
    """A finished tokenize run (the export tests' corpus) and its llm.c export to a local folder."""
    root = tmp_path_factory.mktemp("publish")
    write_corpus(root / "in")
    out = tokenize_to(cluster, root / "in", root / "out", partition_bytes=6000)
    code = main(["export", str(out), "--format", "llmc", "--to", str(root / "local"), "--val-tokens", str(VAL),
                 "--shard-tokens", str(SHARD), "--scheduler", cluster.scheduler_address])
    assert code == 0
    return {"out": out, "local": root / "local"}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty stand-in Hub (``me/tokens`` not created yet), huggingface_hub pointed at it with
    user ``me``'s token, its home and cache in tmp_path, and no token file of this machine's."""
    with HubServer(tmp_path / "hub-repo", repo=REPO, tokens=TOKENS, exists=False) as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)  # and the URL template made from it at import
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", server.url + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        monkeypatch.setattr(constants, "HF_HOME", str(tmp_path / "hf-home"))
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-home" / "hub"))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf-home" / "token"))
        monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "hf-home" / "stored_tokens"))
        for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HF_TOKEN", "tok-me")
        yield server


def _publish_argv(run, cluster, *extra) -> list[str]:
    return ["export", str(run["out"]), "--format", "llmc", "--to", DEST, "--val-tokens", str(VAL),
            "--shard-tokens", str(SHARD), "--scheduler", cluster.scheduler_address, *extra]


def _local_files(run) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run["local"].iterdir()) if p.is_file()}


def _staging(tmp_path: Path) -> Path:
    return tmp_path / "hf-home" / "tokenshards" / "publish" / "datasets--me--tokens--gpt2"


def _error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


# -- the whole path ---------------------------------------------------------------------------

def test_publish_then_download_as_modded_nanogpt_does(run, cluster, hub, tmp_path, capsys):
    code = main(_publish_argv(run, cluster, "--create-repo"))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert f"output: {DEST}" in out.out and "published:" in out.out
    local = _local_files(run)
    assert "fineweb_export.json" in local and len(local) >= 4  # val + several train shards + the record

    # modded-nanogpt: hf_hub_download(repo_id=..., filename=fname, repo_type="dataset", local_dir=...)
    into = tmp_path / "fineweb10B"
    for name, data in local.items():
        path = hf_hub_download(repo_id=REPO, filename=f"gpt2/{name}", repo_type="dataset", local_dir=str(into),
                               endpoint=hub.url)
        assert Path(path).read_bytes() == data, name
    header, tokens = read_llmc(into / "gpt2" / "fineweb_train_000001.bin")
    assert header[0] == 20240520 and len(tokens) == SHARD

    snap = Path(snapshot_download(repo_id=REPO, repo_type="dataset", allow_patterns="gpt2/*", endpoint=hub.url,
                                  cache_dir=str(tmp_path / "snap-cache")))
    got = {p.name: p.read_bytes() for p in (snap / "gpt2").iterdir()}
    assert set(got) == set(local) | {"README.md"}
    assert all(got[n] == local[n] for n in local)

    # the card: the Hub's YAML header, then the facts
    card = got["README.md"].decode()
    record = json.loads(local["fineweb_export.json"])
    assert card.startswith("---\n") and "\nviewer: false\n" in card and "- tokenshards" in card
    assert str(run["out"]) in card and record["source_job"] and record["source_job"] in card
    assert "`gpt2`, n_vocab 50,257, eot id 50256, stored as uint16 (little-endian)" in card
    assert "before each document" in card and "`llmc`: llm.c" in card
    assert f"{SHARD:,} tokens each" in card
    for split, label in (("train", "Train"), ("val", "Validation")):
        s = record["splits"][split]
        assert f"| {label} | {s['tokens']:,} tokens, {s['docs']:,} documents" in card
    assert "source order" in card and f"{VAL:,} tokens requested" in card
    assert "hf_hub_download(repo_id='me/tokens', filename='gpt2/' + fname, repo_type='dataset'" in card
    # A repo without a card of its own gets this one at its root, its link to the record relative to the root.
    root_card = hub.root / "README.md"
    assert root_card.read_bytes() == got["README.md"].replace(b"](fineweb_export.json)", b"](gpt2/fineweb_export.json)")
    assert b"](gpt2/fineweb_export.json)" in root_card.read_bytes()

    # the same command again: nothing exported, nothing sent, no commit, same content
    before = {p: p.read_bytes() for p in sorted(hub.root.rglob("*")) if p.is_file()}
    n_requests = len(hub.requests)
    code = main(_publish_argv(run, cluster))
    err = capsys.readouterr().err
    assert code == 0 and "already holds this export" in err and "exporting into" not in err
    later = hub.requests[n_requests:]
    assert not [r for r in later if r.method in ("PUT", "POST")], later  # no preupload, upload or commit
    assert {p: p.read_bytes() for p in sorted(hub.root.rglob("*")) if p.is_file()} == before


def test_interrupted_upload_resumes_without_sending_twice(run, cluster, hub, tmp_path):
    """The Python form of rerunning the same command (the config the CLI builds), with 2 shards a commit."""
    hub.exists = True
    export = ExportConfig(out=str(run["out"]), format="llmc", to=DEST, val_tokens=VAL, shard_tokens=SHARD,
                          scheduler=cluster.scheduler_address, progress="none")
    config = PublishConfig(export=export, commit_files=2, retries=1, backoff=0.01)
    hub.fail(r"/preupload/", status=429, times=1, method="POST")  # huggingface_hub waits and retries
    # The second commit fails past every retry: one batch committed, the next one's objects sent but not committed.
    hub.fail(r"/api/datasets/me/tokens/commit/main", status=503, times=2, method="POST", after=1)
    with pytest.raises(UserError, match=r"uploading to hf://datasets/me/tokens/gpt2 stopped \(.*503.*rerun the same command"):
        run_publish(config, announce=lambda m: None)
    assert len(hub.committed) == 1 and len(hub.committed[0]) == 2
    assert len(hub.uploads()) == 4  # batch 1 (committed) and batch 2 (uploaded, its commit refused)

    lines = []
    run_publish(config, announce=lines.append)
    assert any("already holds this export" in m for m in lines)  # exported once
    assert any("8 files" in m and "2 already there" in m for m in lines)
    oids = [r.path.split("?")[0].rsplit("/", 1)[1] for r in hub.uploads()]
    assert len(oids) == len(set(oids)), "an object was sent twice"
    local = _local_files(run)
    shards = sorted(n for n in local if n.endswith(".bin"))
    assert sorted(oids) == sorted(hashlib.sha256(local[n]).hexdigest() for n in shards)
    # the rerun committed each remaining shard once, never the first batch's, then the record and the cards
    again = [p for commit in hub.committed[1:] for p in commit]
    order = [f["name"] for f in json.loads(local["fineweb_export.json"])["files"]]
    assert hub.committed[0] == [f"gpt2/{n}" for n in order[:2]]
    assert sorted(again) == sorted([f"gpt2/{n}" for n in order[2:]] + ["gpt2/fineweb_export.json", "gpt2/README.md",
                                                                       "README.md"])
    assert len(hub.commits()) == 1 + 4 + 1
    for name, data in local.items():
        assert (hub.root / "gpt2" / name).read_bytes() == data


# -- one line, before any work ----------------------------------------------------------------

def test_missing_token_is_one_line_before_any_work(run, cluster, hub, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("HF_TOKEN")
    assert main(_publish_argv(run, cluster, "--create-repo")) == 2
    line = _error_line(capsys)
    assert "needs a Hugging Face write token: set HF_TOKEN or run `hf auth login`" in line
    assert not _staging(tmp_path).exists() and not hub.requests

    monkeypatch.setenv("HF_TOKEN", "tok-nobody")
    assert main(_publish_argv(run, cluster)) == 2
    assert "does not accept the token from HF_TOKEN (401" in _error_line(capsys)
    assert not _staging(tmp_path).exists()


def test_missing_and_denied_repo_are_one_line_before_any_work(run, cluster, hub, tmp_path, capsys, monkeypatch):
    assert main(_publish_argv(run, cluster)) == 2
    line = _error_line(capsys)
    assert f"dataset repo {REPO} on {hub.url} does not exist" in line and "pass --create-repo" in line
    assert not _staging(tmp_path).exists()

    monkeypatch.setenv("HF_TOKEN", "tok-other")
    assert main(_publish_argv(run, cluster, "--create-repo")) == 2
    assert f"cannot create dataset repo {REPO} on {hub.url} as other (403)" in _error_line(capsys)

    hub.exists = True
    assert main(_publish_argv(run, cluster)) == 2
    line = _error_line(capsys)
    assert f"other may not write to dataset repo {REPO}" in line and "(403)" in line
    assert not _staging(tmp_path).exists()
    assert not [r for r in hub.requests if r.method == "PUT" or "/commit/" in r.path]


def test_bad_destinations_are_one_line(run, cluster, capsys):
    for to, words in (("hf://models/me/tokens", "exports go to a dataset repo"),
                      ("hf://datasets/me", "expected hf://datasets/ORG/NAME"),
                      ("hf://datasets/me/tokens/../x", "must be a plain folder path")):
        argv = _publish_argv(run, cluster)
        argv[argv.index(DEST)] = to
        assert main(argv) == 2
        assert words in _error_line(capsys)
    assert main(["export", str(run["out"]), "--format", "llmc", "--to", "somewhere", "--create-repo"]) == 2
    assert "apply to --to hf://" in _error_line(capsys)


# -- memory: shards go to huggingface_hub by path, and are hashed a chunk at a time ------------

def test_shards_are_never_read_whole(tmp_path, monkeypatch):
    path = tmp_path / "shard.bin"
    data = os.urandom(300_000)
    path.write_bytes(data)
    reads = []
    real_open = open

    class Spy:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            reads.append(n)
            return self.f.read(n)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(publish, "HASH_CHUNK", 65536)
    # Only the shard's reads: other threads of this process (the session's cluster, servers) open files too.
    monkeypatch.setattr("builtins.open", lambda p, mode="r", *a, **k: (
        Spy(real_open(p, mode, *a, **k)) if str(p) == str(path) else real_open(p, mode, *a, **k)))
    sha256, sha1 = publish.file_hashes(str(path))
    monkeypatch.undo()
    assert sha256 == hashlib.sha256(data).hexdigest()
    assert sha1 == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert reads and all(0 < n <= 65536 for n in reads)


def test_a_dir_holding_another_export_is_refused_unless_overwrite(run, cluster, hub, tmp_path, capsys):
    hub.exists = True
    assert main(_publish_argv(run, cluster)) == 0
    bigger = _publish_argv(run, cluster)
    bigger[bigger.index("--shard-tokens") + 1] = str(3 * SHARD)
    capsys.readouterr()
    n_requests = len(hub.requests)
    assert main(bigger) == 2
    line = _error_line(capsys)
    assert f"{DEST} already holds another export (" in line and "pass --overwrite" in line
    assert not [r for r in hub.requests[n_requests:] if r.method == "PUT" or "/commit/" in r.path]

    assert main([*bigger, "--overwrite"]) == 0
    assert "already holds this export" in capsys.readouterr().err  # the staged export, not a new one
    record = json.loads((hub.root / "gpt2" / "fineweb_export.json").read_text())
    assert record["shard_tokens"] == 3 * SHARD
    names = {p.name for p in (hub.root / "gpt2").iterdir()}
    assert names == {f["name"] for f in record["files"]} | {"fineweb_export.json", "README.md"}  # the extra shards went
    assert f"{3 * SHARD:,} tokens each" in (hub.root / "gpt2" / "README.md").read_text()


def test_a_dropped_upload_connection_is_retried(run, cluster, hub, tmp_path):
    hub.exists = True
    hub.root.mkdir()
    (hub.root / "README.md").write_text("---\nlicense: odc-by\n---\n# my own card\n")  # the publisher's: kept
    hub.drop(r"/lfs-upload/", method="PUT", times=1)  # huggingface_hub sends it again
    export = ExportConfig(out=str(run["out"]), format="llmc", to=DEST, val_tokens=VAL, shard_tokens=SHARD,
                          scheduler=cluster.scheduler_address, progress="none")
    run_publish(PublishConfig(export=export, staging=str(tmp_path / "stage"), backoff=0.01), announce=lambda m: None)
    assert [r for r in hub.requests if r.method == "PUT" and r.status == 0]
    local = _local_files(run)
    assert {n: (hub.root / "gpt2" / n).read_bytes() for n in local} == local
    assert (hub.root / "README.md").read_text().endswith("# my own card\n") and (hub.root / "gpt2" / "README.md").is_file()
    assert (tmp_path / "stage" / ".tokenshards-publish.json").is_file()
    assert not _staging(tmp_path).exists()


def test_cli_honours_hf_endpoint_hf_token_and_hf_home(run, cluster, tmp_path):
    """What a user sets, in a fresh process: HF_ENDPOINT, HF_TOKEN, HF_HOME (the staging folder's default)."""
    import subprocess
    import sys

    with HubServer(tmp_path / "hub-repo", repo=REPO, tokens=TOKENS, exists=False) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(HF_ENDPOINT=server.url, HF_TOKEN="tok-me", HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1")
        tokenshards = str(Path(sys.executable).with_name("tokenshards"))
        done = subprocess.run([tokenshards, *_publish_argv(run, cluster, "--create-repo", "--private")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert f"created private dataset repo {REPO}" in done.stderr
        assert _staging(tmp_path).is_dir()
        local = _local_files(run)
        assert {n: (server.root / "gpt2" / n).read_bytes() for n in local} == local


def test_the_card_of_a_shuffled_mixture_names_runs_weights_and_seed():
    from tokenshards.export.card import dataset_card
    from tokenshards.format.export_record import RECORD_FORMAT, ExportRecord

    record = ExportRecord.from_dict({"format": RECORD_FORMAT, "export_format": "npy", "source": None, "encoding": {"name": "cl100k_base", "n_vocab": 100277, "eot": 100257,
              "dtype": "uint32"}, "eot_position": "suffix", "dtype": "<u4", "shard_tokens": 1000, "min_shard_tokens": 10,
              "val_tokens_requested": 100, "val_selection": "per run, ...",
              "order": {"shuffle": True, "seed": 7, "key": "murmur3 ..."}, "tokens_requested": 5000,
              "sources": [{"path": "out/a", "source_job": "aaa", "weight": 0.75, "tokens": 3750, "epochs": 1.5},
                          {"path": "out/b", "source_job": "bbb", "weight": 0.25, "tokens": 1250, "epochs": 0.5}],
              "splits": {"val": {"docs": 3, "tokens": 120}, "train": {"docs": 40, "tokens": 5010}},
              "files": [{"name": "mix_val_000000.npy", "split": "val", "tokens": 120, "bytes": 608},
                        {"name": "mix_train_000001.npy", "split": "train", "tokens": 5010, "bytes": 20168}]})
    card = dataset_card(record, repo="me/mix", folder="", record_name="mix_export.json")
    assert card == dataset_card(record, repo="me/mix", folder="", record_name="mix_export.json")  # same bytes every time
    assert "`out/a` (job `aaa`); `out/b` (job `bbb`)" in card
    assert "`out/a` weight 0.75: 3,750 train tokens, 1.5 epochs; `out/b` weight 0.25" in card
    assert "shuffled over the whole corpus, seed 7" in card
    assert "`cl100k_base`, n_vocab 100,277, eot id 100257, stored as uint32 (little-endian)" in card
    assert "after each document" in card and "build-nanogpt `.npy` shards" in card
    assert "filename='' + fname" not in card and "hf_hub_download(repo_id='me/mix', filename=fname" in card


def test_the_card_of_a_packed_mixture_names_each_runs_sequences():
    """A rows export's sources carry sequences, not weights (the card once failed on them)."""
    from tokenshards.export.card import dataset_card
    from tokenshards.format.export_record import RECORD_FORMAT, ROWS, ExportRecord

    record = ExportRecord.from_dict({
        "format": RECORD_FORMAT, "export_format": "hf", "source": None, "source_job": "aaa",
        "encoding": {"name": "gpt2", "n_vocab": 50257, "eot": 50256, "dtype": "uint16"}, "eot_position": "prefix",
        "dtype": "<u2", "shard_tokens": None, "min_shard_tokens": None, "val_tokens_requested": 100,
        "val_selection": "per run, ...",
        "packing": {"seq_len": 256, "mode": "concat", "bos_align": False, "window_docs": None, "unit": "each ..."},
        "columns": ["input_ids", "seq_lengths"], "order": None,
        "sources": [{"path": "out/a", "source_job": "aaa", "sequences": 2473, "epochs": 0, "extra": 424},
                    {"path": "out/b", "source_job": "bbb", "sequences": 1272, "epochs": 1, "extra": 0}],
        "splits": {s: {"docs": 3, "tokens": 768, "rows": 3, "source_tokens": 770, "padding": 0, "dropped": 2}
                   for s in ("val", "train")},
        "files": [{"name": "train/fineweb-00000.parquet", "split": "train", "tokens": 768, "bytes": 4000}]})
    assert record.kind == ROWS
    card = dataset_card(record, repo="me/mix", folder="", record_name="fineweb_export.json")
    assert ("| Mixture | `out/a`: 424 train sequences (0 x its 2,473 + 424); `out/b`: 1,272 train sequences "
            "(1 x its 1,272 + 0) |") in card
    assert "`out/a` (job `aaa`); `out/b` (job `bbb`)" in card and "source order" in card


def test_progress_none_keeps_huggingface_hubs_bars_quiet(run, cluster, tmp_path):
    """``--progress none`` (and ``log``) is for logs and scripts: huggingface_hub's upload and
    download bars must not print either, even where the user's environment leaves them on."""
    import subprocess
    import sys

    with HubServer(tmp_path / "hub-repo", repo=REPO, tokens=TOKENS, exists=False) as server:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
        env.update(HF_ENDPOINT=server.url, HF_TOKEN="tok-me", HF_HOME=str(tmp_path / "hf-home"), HF_HUB_DISABLE_XET="1",
                   HF_HUB_DISABLE_TELEMETRY="1")
        tokenshards = str(Path(sys.executable).with_name("tokenshards"))
        done = subprocess.run([tokenshards, *_publish_argv(run, cluster, "--create-repo", "--progress", "none")], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "%|" not in done.stderr and "it/s]" not in done.stderr and "B/s]" not in done.stderr, done.stderr
        local = _local_files(run)
        assert {n: (server.root / "gpt2" / n).read_bytes() for n in local} == local
