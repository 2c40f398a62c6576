"""Crash points (``tokenshards.crashpoints``), tested where they are used: a command stopped
right after each of its commits leaves only what is committed whole or what the next run
ignores, and the rerun ends byte-identical to an uninterrupted run without redoing committed work.

Tokenize: one run stopped at each point in turn, locally and on S3 (moto), each rerun resuming
what the last left; a chat run at its mask file too. Points are failed there (``fail``: the write
path raises, its error handling runs) on the session cluster, its workers armed through
``client.run``; locally one worker point and the client's point are real kills (SIGKILL of the
worker and its machine, of the client). A lease taken over mid-run: nothing is committed after it.
Export: an npy export (files in byte ranges, its first stop a real kill) and an hf one (rows)
stopped after a file, the card, the record; the same command finishes an unfinished one.

What is on disk after a stop is judged from the files alone (sha256, the docs table's own counts),
never through the reader under test; committed files keep their identity across the rerun (inode
and mtime_ns locally, the object's version id on a versioned S3 bucket), so "never redo committed
work" is asserted rather than inferred from equal bytes.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from distributed import Client

from tokenshards import crashpoints
from tokenshards.errors import UserError
from tokenshards.export import ExportConfig, run_export
from tokenshards.storage.lease import DEFAULT_TTL, LEASE_FILE, Lease, LeaseLost
from tokenshards.storage.location import Location
from tokenshards.tokenize.command import run_tokenize
from tokenshards.tokenize.config import TokenizeConfig

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
WORDS = "the cat sat on a mat; Straße naïve café 東京 🙂 <|endoftext|> 1234567 tab\there".split(" ")
PARTITION_BYTES = 2_000
PARTITIONS = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Three small partitions (one per row group) of one file."""
    rng = random.Random(55)
    root = tmp_path_factory.mktemp("crash-corpus")
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) for _ in range(30 * PARTITIONS)]
    pq.write_table(pa.table({"text": texts}), root / "a.parquet", row_group_size=30)
    return root / "a.parquet"


CHAT_PARTITIONS = 3
CHAT_PARTITION_BYTES = 500


@pytest.fixture(scope="module")
def chat_corpus(tmp_path_factory) -> Path:
    """Conversations as JSON text, three partitions."""
    rng = random.Random(47)
    rows = [json.dumps([{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 20)))},
                        {"role": "assistant", "content": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 30)))}],
                       ensure_ascii=False) for _ in range(6 * CHAT_PARTITIONS)]
    path = tmp_path_factory.mktemp("crash-chat") / "chat.parquet"
    pq.write_table(pa.table({"messages": rows}), path, row_group_size=6)
    return path


CHAT_TEMPLATE = ("{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' }}"
                 "{%- if message.role == 'assistant' %}{% generation %}{{- message.content + '<|im_end|>' }}"
                 "{% endgeneration %}{%- else %}{{- message.content + '<|im_end|>' }}{%- endif %}{{- '\\n' }}"
                 "{%- endfor %}")
"""A chat template of Qwen's shape, its assistant turns marked for the mask."""


def chat_tokenizer(folder: Path) -> Path:
    """A small byte-level BPE with a chat template, trained here by Hugging Face's own library:
    a real one (Qwen3's) costs each worker seconds to load, for nothing these tests look at."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([" ".join(WORDS)] * 10, trainer=trainers.BpeTrainer(
        vocab_size=400, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    folder = folder / "tokenizer"
    folder.mkdir()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>"}))
    return folder


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster, set_as_default=False) as c:
        yield c


def tokenize(corpus: Path, out: str, cluster, *, announce=lambda msg: None, **options):
    """The run, in this process, on the session cluster; a failed task is not retried."""
    config = TokenizeConfig(inputs=(str(corpus),), out=out, scheduler=cluster.scheduler_address, progress="none",
                            retries=0, **{"partition_bytes": PARTITION_BYTES, **options})
    return run_tokenize(config, announce=announce)


@pytest.fixture(scope="module")
def clean(corpus, cluster, tmp_path_factory) -> dict[str, bytes]:
    out = tmp_path_factory.mktemp("crash-clean") / "out"
    summary = tokenize(corpus, str(out), cluster)
    assert summary.partitions == PARTITIONS
    return LocalStore(out).files()


# -- OUT, local or on S3 -----------------------------------------------------------------------------
@dataclass
class LocalStore:
    root: Path

    @property
    def url(self) -> str:
        return str(self.root)

    def files(self) -> dict[str, bytes]:
        return {str(p.relative_to(self.root)): p.read_bytes() for p in sorted(self.root.rglob("*")) if p.is_file()}

    def read(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def exists(self, name: str) -> bool:
        return (self.root / name).exists()

    def identity(self, name: str):
        st = os.stat(self.root / name)
        return st.st_ino, st.st_mtime_ns


@dataclass
class S3Store:
    s3: object
    bucket: str
    prefix: str

    def __post_init__(self):
        self.fs = self.s3.fs()  # no listings cache: each look is fresh

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    def files(self) -> dict[str, bytes]:
        fs = self.fs
        return {key[len(self.bucket) + len(self.prefix) + 2:]: fs.cat_file(key)
                for key in sorted(fs.find(f"{self.bucket}/{self.prefix}"))}

    def read(self, name: str) -> bytes:
        return self.fs.cat_file(f"{self.bucket}/{self.prefix}/{name}")

    def exists(self, name: str) -> bool:
        return self.fs.exists(f"{self.bucket}/{self.prefix}/{name}")

    def identity(self, name: str):
        """Each write of an object on a versioned bucket is a new version, equal bytes or not."""
        head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=f"{self.prefix}/{name}")
        return head["VersionId"]


@pytest.fixture(scope="module")
def bucket(s3) -> str:
    name = s3.make_bucket()
    s3.fs().call_s3("put_bucket_versioning", Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return LocalStore(tmp_path / "out")
    s3 = request.getfixturevalue("s3")
    return S3Store(s3, request.getfixturevalue("bucket"), f"out-{request.node.name}".replace("[", "-").rstrip("]"))


def storage_options(store) -> dict:
    return store.s3.storage_options if isinstance(store, S3Store) else {}


# -- what is committed, judged from the files alone --------------------------------------------------
def committed(store) -> dict[int, list[str]]:
    """{partition: its done record and the files it names} for every done record in OUT, each
    checked whole: the tokens file's sha256 is the record's, the docs table counts its documents
    and tokens, a mask holds a byte per token. A manifest, if there is one, lists exactly these."""
    names = sorted(n for n in store.files() if n.startswith("parts/") and n.endswith(".done.json"))
    found = {}
    for name in names:
        record = json.loads(store.read(name))
        files = [name, record["tokens_file"], record["docs_file"], *([record["mask_file"]] if record.get("mask_file") else [])]
        assert all(store.exists(f) for f in files), f"{name} commits files that are not there: {files}"
        tokens = store.read(record["tokens_file"])
        assert hashlib.sha256(tokens).hexdigest() == record["sha256"], f"{name} commits a tokens file that is not whole"
        array = np.load(io.BytesIO(tokens))
        assert len(array) == record["tokens"]
        docs = pq.read_table(io.BytesIO(store.read(record["docs_file"])))
        assert docs.num_rows == record["docs"] and sum(docs["length"].to_pylist()) == record["tokens"], \
            f"{name} commits a docs file that is not whole"
        if record.get("mask_file"):
            assert len(np.load(io.BytesIO(store.read(record["mask_file"])))) == record["tokens"]
        found[record["index"]] = files
    if store.exists("manifest.json"):
        manifest = json.loads(store.read("manifest.json"))
        assert sorted(p["index"] for p in manifest["partitions"]) == sorted(found), "a manifest before its done records"
        assert len(found) == manifest["planned_partitions"]
    return found


def identities(store, parts: dict[int, list[str]]) -> dict[str, object]:
    return {name: store.identity(name) for files in parts.values() for name in files}


# -- arming ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def armed(client: Client | None, spec: str, action="fail"):
    """``spec`` armed on every worker of the session cluster (``client``), or in this process (None).
    Undone on the way out, once no worker runs a task any more."""
    if client is None:
        crashpoints.arm(spec, action)
    else:
        client.run(crashpoints.arm, spec, action)
    try:
        yield
    finally:
        if client is None:
            crashpoints.disarm()
        else:
            settle(client)
            client.run(crashpoints.disarm)


def settle(client: Client, timeout: float = 60) -> None:
    """Until no worker runs a task: a failed run's other tasks go on until they end, and may commit."""
    def busy(dask_worker) -> int:
        return len(dask_worker.active_threads)

    deadline = time.monotonic() + timeout
    while any(client.run(busy).values()):
        assert time.monotonic() < deadline, "workers still busy"
        time.sleep(0.05)


def test_a_point_fires_once_where_armed_and_a_mistyped_one_is_refused():
    try:
        crashpoints.arm(f"{crashpoints.DONE}@3=fail, {crashpoints.EXPORT_RECORD}=kill")  # the environment's form
        crashpoints.reached(crashpoints.DONE, 2)  # another partition
        crashpoints.reached(crashpoints.TOKENS, 3)  # another point
        with pytest.raises(crashpoints.CrashPointFailure, match="crash point tokenize.done@3"):
            crashpoints.reached(crashpoints.DONE, 3)
        crashpoints.reached(crashpoints.DONE, 3)  # once
        seen = []
        crashpoints.arm(crashpoints.MANIFEST, lambda point, key: seen.append((point, key)))
        crashpoints.reached(crashpoints.MANIFEST)
        assert seen == [(crashpoints.MANIFEST, None)]
    finally:
        crashpoints.disarm()
    crashpoints.reached(crashpoints.EXPORT_RECORD)  # disarmed: the kill is gone
    for spec in ("tokenize.nowhere=fail", "tokenize.done", "tokenize.done=explode"):
        with pytest.raises(ValueError):
            crashpoints.arm(spec)
    assert not crashpoints._armed


# -- tokenize ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stop:
    point: str
    committed: bool
    """Whether the partition (or the run) stopped there is committed."""
    kill: bool = False
    """SIGKILL rather than fail (local runs only): a CLI of its own, no error handling."""


STOPS = (Stop(crashpoints.DOCS, False, kill=True), Stop(crashpoints.TOKENS, False), Stop(crashpoints.DONE, True),
         Stop(crashpoints.MANIFEST, True, kill=True))


def test_a_run_stopped_at_each_point_in_turn_resumes_each_time(store, corpus, cluster, client, clean):
    """One run stopped at each point in turn, each rerun resuming what the last one left: a worker's
    points at a partition not yet committed, then the client's after the manifest; then the same
    command once more. After each stop, every done record commits whole files (and a manifest lists
    exactly them); no rerun rewrites a committed file. Locally the first and last stops are real
    kills: the CLI's one worker SIGKILLed at the docs file (then the CLI's whole process group, as
    a machine lost), the CLI SIGKILLed after its manifest (its lease left behind); on S3 all fail."""
    local = isinstance(store, LocalStore)
    stops = STOPS if local else tuple(Stop(s.point, s.committed) for s in STOPS)
    stop_in_turn(store, stops, corpus=corpus, cluster=cluster, client=client, clean=clean,
                 storage_options=storage_options(store))


def test_a_chat_run_stopped_after_its_mask_and_its_done_record_resumes(chat_corpus, cluster, client, tmp_path):
    """A chat run's mask file is committed with its tokens: before the done record."""
    options = dict(chat_column="messages", encoding=str(chat_tokenizer(tmp_path)), partition_bytes=CHAT_PARTITION_BYTES)
    clean_out = LocalStore(tmp_path / "clean")
    tokenize(chat_corpus, clean_out.url, cluster, **options)
    stop_in_turn(LocalStore(tmp_path / "out"), (Stop(crashpoints.MASK, False), Stop(crashpoints.DONE, True)),
                 corpus=chat_corpus, cluster=cluster, client=client, clean=clean_out.files(), partitions=CHAT_PARTITIONS,
                 **options)


def stop_in_turn(store, stops: tuple[Stop, ...], *, corpus, cluster, client, clean: dict[str, bytes],
                 partitions: int = PARTITIONS, **options) -> None:
    parts: dict[int, list[str]] = {}
    for stop in stops:
        before = identities(store, parts)
        left = sorted(set(range(partitions)) - set(parts))
        key = left[min(1, len(left) - 1)] if stop.point != crashpoints.MANIFEST else None  # one committed before, if any
        spec = stop.point if key is None else f"{stop.point}@{key}"
        if stop.kill:
            killed_at(spec, corpus=corpus, out=store, cluster=cluster)
        else:
            with armed(client if key is not None else None, spec), \
                    pytest.raises((UserError, OSError), match=f"crash point {spec}"):
                tokenize(corpus, store.url, cluster, **options)
        parts = committed(store)
        assert {name: identity for name, identity in identities(store, parts).items() if name in before} == before, \
            f"the run stopped at {spec} rewrote files an earlier run committed"
        if key is not None:
            assert (key in parts) == stop.committed, spec
        assert store.exists("manifest.json") == (stop.point == crashpoints.MANIFEST)
    before = identities(store, parts)
    notes = []
    summary = tokenize(corpus, store.url, cluster, announce=notes.append, **options)
    assert summary.skipped_partitions == len(parts) and summary.partitions == partitions
    assert store.files() == clean
    assert identities(store, parts) == before, "the rerun rewrote committed files"
    if stops[-1].kill:
        assert any("took over the stale lease" in note for note in notes), notes


def killed_at(spec: str, *, corpus: Path, out: LocalStore, cluster) -> None:
    """The CLI SIGKILLed at ``spec``. A worker's point: the CLI starts its own cluster of one worker,
    whose environment arms it; once the point's file is there, the CLI's whole process group goes
    (the worker, killed there, would be restarted and its partition retried). The client's point:
    the CLI runs on the session cluster and kills itself there."""
    cmd = [TOKENSHARDS, "tokenize", "--input", str(corpus), "--out", out.url,
           "--partition-mb", str(PARTITION_BYTES / 1e6), "--progress", "none"]
    env = {**os.environ, crashpoints.ENVIRONMENT: f"{spec}=kill"}
    point, _, key = spec.partition("@")
    if point == crashpoints.MANIFEST:
        proc = subprocess.run([*cmd, "--scheduler", cluster.scheduler_address], capture_output=True, text=True,
                              timeout=300, env=env)
        assert proc.returncode == -signal.SIGKILL, proc.stderr
        return
    assert point == crashpoints.DOCS, "a worker's point is killed where its file shows it was reached"
    docs = out.root / "parts" / f"part-{int(key):05d}.docs.parquet"
    proc = subprocess.Popen([*cmd, "--workers", "1", "--no-dashboard"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not docs.exists():
            assert proc.poll() is None and time.monotonic() < deadline, f"the run never reached {spec}"
            time.sleep(0.01)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # Its tokens file was on its way: half-written, under a temporary name no run takes for it (a
    # retry on the restarted worker, killed with the group, may have left more).
    left = sorted(p.name for p in docs.parent.glob(f"part-{int(key):05d}.*"))
    temporary = rf"part-{int(key):05d}\.(tokens\.npy|docs\.parquet)\.\w+\.tmp"
    assert docs.name in left and any(".tokens.npy." in name for name in left), left
    assert all(re.fullmatch(temporary, name) for name in left if name != docs.name), left


# -- the lease ---------------------------------------------------------------------------------------
def taken_over(url: str, options: dict):
    """A crash point's action: a successor takes OUT's lease over, as it may once this run's has
    expired (its clock past the expiry rather than a two-minute wait)."""
    def act(point, key):
        Lease(Location.at(url, options), command="tokenize", clock=lambda: time.time() + 3 * DEFAULT_TTL).acquire()

    return act


@pytest.mark.parametrize("store, point, committed_before", [("local", crashpoints.TOKENS, False),
                                                              ("s3", crashpoints.TOKENS, False),
                                                              ("local", crashpoints.DONE, True)], indirect=["store"])
def test_a_run_whose_lease_was_taken_over_commits_nothing_more(point, committed_before, store, corpus, cluster, client):
    """The lease is taken over mid-run, on the worker that writes the run's one partition: after
    its data files (the worker looks again before the done record) or after its done record (the
    client looks again before the manifest, as it does on every store: ``Lease.check``). Nothing
    is committed after the takeover, and the successor's lease stays in place."""
    options = storage_options(store)
    with armed(client, f"{point}@0", taken_over(store.url, options)), pytest.raises(LeaseLost):
        tokenize(corpus, store.url, cluster, storage_options=options, partition_bytes=10**9)
    assert sorted(committed(store)) == ([0] if committed_before else [])
    assert not store.exists("manifest.json")
    assert json.loads(store.read(LEASE_FILE))["renewed"] > time.time() + DEFAULT_TTL  # the successor's, still there


# -- export ----------------------------------------------------------------------------------------
EXPORTS = {
    "npy": (dict(format="npy", val_tokens=200, shard_tokens=700),
            (Stop(crashpoints.EXPORT_FILE, False, kill=True), Stop(crashpoints.EXPORT_RECORD, True))),
    "hf": (dict(format="hf", val_tokens=200, shard_tokens=700, seq_len=64),
           (Stop(crashpoints.EXPORT_FILE, False), Stop(crashpoints.EXPORT_CARD, False),
            Stop(crashpoints.EXPORT_RECORD, True))),
}
"""An export of each writer (files in byte ranges, ``common``; rows, ``packed``) and its points in
order (``committed``: the export is finished once stopped there)."""
NOTE = ".fineweb_export.json.unfinished"
"""What an export leaves in DEST while it commits its files (``export.common.begin_commits``)."""


def export(run: Path, to: Path, cluster, *, announce=lambda msg: None, **options):
    return run_export(ExportConfig(out=str(run), to=str(to), scheduler=cluster.scheduler_address, progress="none",
                                   **options), announce=announce)


@pytest.fixture(scope="module")
def run(clean, tmp_path_factory) -> Path:
    """The clean run, as a folder to export."""
    out = tmp_path_factory.mktemp("crash-run")
    for name, data in clean.items():
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    return out


@pytest.mark.parametrize("kind", EXPORTS)
def test_an_export_stopped_at_each_point_is_finished_whole_or_finished_by_the_same_command(kind, run, cluster, tmp_path):
    """Stopped after one of its files (the npy export's client SIGKILLed there, its CLI on the session
    cluster), or after hf's card: no record, the files there whole, listed in the note as the
    export's own, and the same command again (no --overwrite) ends with what an uninterrupted
    export writes. Stopped after the record: the export is finished, and exactly so."""
    options, stops = EXPORTS[kind]
    export(run, tmp_path / "clean", cluster, **options)
    want = LocalStore(tmp_path / "clean").files()
    record = json.loads(want["fineweb_export.json"])
    assert len(record["files"]) > 2
    for stop in stops:
        to = tmp_path / stop.point
        if stop.kill:
            flags = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
            proc = subprocess.run([TOKENSHARDS, "export", str(run), "--to", str(to), *flags, "--progress", "none",
                                   "--scheduler", cluster.scheduler_address], capture_output=True, text=True, timeout=300,
                                  env={**os.environ, crashpoints.ENVIRONMENT: f"{stop.point}=kill"})
            assert proc.returncode == -signal.SIGKILL, proc.stderr
        else:
            with armed(None, stop.point), pytest.raises(OSError, match=f"crash point {stop.point}"):
                export(run, to, cluster, **options)
        left = {name: data for name, data in LocalStore(to).files().items() if name != LEASE_FILE}  # a killed one's
        assert ("fineweb_export.json" in left) == stop.committed
        if stop.committed:
            assert left == want
            continue
        note = json.loads(left.pop(NOTE))  # what the export was committing: its files, whole or not there
        assert set(note["files"]) == {f["name"] for f in record["files"]} and "fineweb_export.json" not in left
        whole = {name: data for name, data in left.items() if not name.endswith(".tmp")}  # temporaries: never taken
        assert whole and all(data == want[name] for name, data in whole.items())
        notes = []
        export(run, to, cluster, announce=notes.append, **options)  # the same command: no --overwrite
        assert LocalStore(to).files() == want
        assert any("took over the stale lease" in n for n in notes) == stop.kill, notes
