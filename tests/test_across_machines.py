"""Issue #22: tokenshards across machines that share no disk, through the CLI as a user runs it.

The machines are lab hosts (tests/lab.py): ``client`` runs ``tokenshards``, ``sched`` a
``dask scheduler``, ``w1`` and ``w2`` one ``dask worker`` each, ``s3`` moto's server and ``hub``
the stand-in Hub. Each has its own /tmp, home, host name and processes; only the hosts that a
test says share ``/mnt/shared`` see one folder in common. Every output document is compared with
tiktoken's gpt2 ``encode_ordinary`` (eot first).

Some of these tests describe what users must get and fail on a build that does not do it yet:
the failure is the product's (the harness checks itself before each run: workers connected, S3
and the Hub answering).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lab import PYTHON, TOKENSHARDS, Lab, LabS3
from readback import read_documents

EOT = 50256
BUCKET = "lab"
REPO_ID = "HuggingFaceFW/fineweb"
WORKER_HOSTS = ("w1", "w2")


# -- real text with awkward rows ------------------------------------------------------------------

def real_texts() -> list[str]:
    """Real prose and code that ships with Python: pydoc's help topics, then the standard library's sources."""
    from pydoc_data.topics import topics

    texts = [topics[k] for k in sorted(topics)]
    lib = Path(os.__file__).parent
    texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]
    return [t for t in texts if t.strip()]


AWKWARD = [
    None,
    "",
    "Before <|endoftext|> after: the special token's text is ordinary text here.",
    "<|endoftext|>",
    "émoji 🎉🚀 and a family 👨‍👩‍👧 in one line",
    "数据集与分词：中文文本。日本語のテキストも。한국어 문장.",
    "   \t\n  ",
    "tabs\tand\nnewlines\r\n and a NUL-free end",
    "Привет, мир! Ein Satz auf Deutsch, ça va?",
]


def make_files(n_files: int, rows: int, *, chars: int, start: int = 0, long_doc: int = 0) -> dict[str, list]:
    """{file name: texts}: real text cut to ``chars`` characters, the awkward rows spread through
    every file, and in the last file one long document of ``long_doc`` characters."""
    pool = real_texts()
    files, k = {}, start
    for f in range(n_files):
        texts = []
        for i in range(rows):
            if i % 9 == 4:
                texts.append(AWKWARD[(i // 9 + f) % len(AWKWARD)])
            else:
                texts.append(pool[k % len(pool)][:chars])
                k += 1
        files[f"{f:03d}_00000.parquet"] = texts
    if long_doc:
        last = list(files)[-1]
        body = "\n\n".join(pool[:200])
        files[last][len(files[last]) // 2] = (body * (long_doc // len(body) + 1))[:long_doc]
    return files


def write_files(folder: Path, files: dict[str, list], *, row_group_size: int, **options) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, texts in files.items():
        ids = [f"<urn:uuid:{name}-{i}>" for i in range(len(texts))]
        pq.write_table(pa.table({"text": pa.array(texts, pa.string()), "id": ids}), folder / name,
                       row_group_size=row_group_size, **options)


def check_exact(out: Path, files: dict[str, list], enc) -> int:
    """Every non-empty row of every file is one document whose tokens are [eot] + encode_ordinary(text)."""
    docs = read_documents(out)  # also checks contiguity, counts and each tokens file's sha256
    got = {(PurePosixPath(inp).name, row): tokens for (inp, row), (_, tokens) in docs.items()}
    expected = {(name, row): text for name, texts in files.items() for row, text in enumerate(texts) if text}
    assert sorted(got) == sorted(expected)
    for key, text in expected.items():
        assert got[key] == [EOT] + enc.encode_ordinary(text), f"document {key} differs from tiktoken's"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["skipped_null"] == sum(t is None for texts in files.values() for t in texts)
    assert manifest["totals"]["skipped_empty"] == sum(t == "" for texts in files.values() for t in texts)
    return len(expected)


def one_line_error(proc: subprocess.CompletedProcess, *patterns: str, code: int = 2) -> str:
    """The command failed with ``code``, no traceback, its last stderr line is ``tokenshards: error: ...``
    matching every pattern; returns that line."""
    assert proc.returncode == code, \
        f"exit {proc.returncode}, expected {code}\nstdout:\n{proc.stdout[-1500:]}\nstderr:\n{proc.stderr[-4000:]}"
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr[-4000:]
    lines = proc.stderr.strip().splitlines()
    assert lines, "nothing on stderr"
    last = lines[-1]
    assert last.startswith("tokenshards: error: "), proc.stderr[-4000:]
    for pattern in patterns:
        assert re.search(pattern, last), f"{pattern!r} not in the error line: {last}"
    return last


def names_machines(line: str, hosts=WORKER_HOSTS) -> None:
    for host in hosts:
        assert re.search(rf"\b{host}\b", line), f"the error does not name machine {host}: {line}"


def suggests_s3_or_shared(line: str, *urls: str) -> None:
    """Says to use s3:// (other than in the URLs the command was given) or a shared filesystem."""
    for url in urls:
        line = line.replace(url, "")
    assert re.search(r"s3://|shared", line, re.IGNORECASE), f"no s3:// or shared filesystem suggested: {line}"


# -- the lab: machines, a cluster, S3 ----------------------------------------------------------------

@dataclass
class World:
    lab: Lab
    s3: LabS3
    scheduler: str
    corpus: dict[str, list]
    workers: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def client(self):
        return self.lab.host("client")

    def ensure_workers(self) -> None:
        """One worker on each of w1 and w2, connected (a test may have killed a machine's)."""
        restarted = False
        for key in WORKER_HOSTS:
            if self.workers.get(key) is None or self.workers[key].poll() is not None:
                if self.workers.get(key) is not None:
                    self.lab.kill_host(key)  # whatever the lost worker left running
                self.workers[key] = self.lab.start_workers(key, self.scheduler)
                restarted = True
        if restarted:
            hosts = self.lab.wait_for_workers(self.scheduler, len(WORKER_HOSTS))
            assert sorted(hosts.values()) == sorted(WORKER_HOSTS)

    def tokenshards(self, *args: str, host: str = "client", env: dict | None = None,
                    timeout: float = 240) -> subprocess.CompletedProcess:
        return self.lab.host(host).run([TOKENSHARDS, *args], env=env, timeout=timeout)

    def download(self, url: str, name: str) -> Path:
        """An S3 prefix copied to the client's /tmp/dl/NAME; its path for this process."""
        return self.s3.get(url, f"/tmp/dl/{name}")


@pytest.fixture(scope="module")
def lab():
    with Lab(["client", "sched", "w1", "w2", "s3", "hub"], shared=["client", "w1", "w2"]) as lab:
        yield lab


@pytest.fixture(scope="module")
def world(lab):
    store = lab.start_moto("s3", via="client")
    for key in ("client", *WORKER_HOSTS):  # every machine that reads or writes S3 has credentials
        lab.host(key).env_defaults.update(store.env())
    scheduler = lab.start_scheduler("sched")
    w = World(lab=lab, s3=store, scheduler=scheduler, corpus=make_files(3, 90, chars=4000, long_doc=300_000))
    w.ensure_workers()
    write_files(w.client.path("/tmp/in"), w.corpus, row_group_size=10)
    store.make_bucket(BUCKET)
    store.put("/tmp/in", f"s3://{BUCKET}/in")
    assert sorted(PurePosixPath(p).name for p in store.glob(f"{BUCKET}/in/*.parquet")) == sorted(w.corpus)
    return w


@pytest.fixture
def cluster(world):
    world.ensure_workers()
    return world


TOKENIZE = ("tokenize", "--partition-mb", "0.02", "--progress", "none")


def test_1_s3_in_and_out_is_exact(cluster, gpt2):
    out = f"s3://{BUCKET}/run1"
    proc = cluster.tokenshards(*TOKENIZE, "--input", f"s3://{BUCKET}/in/*.parquet", "--out", out,
                               "--scheduler", cluster.scheduler)
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_exact(cluster.download(out, "run1"), cluster.corpus, gpt2)


def test_3_a_client_local_out_with_remote_workers_is_refused_before_tokenizing(cluster):
    inputs = f"s3://{BUCKET}/in/*.parquet"
    proc = cluster.tokenshards(*TOKENIZE, "--input", inputs, "--out", "/tmp/run", "--scheduler", cluster.scheduler)
    line = one_line_error(proc, r"/tmp/run\b")
    names_machines(line)
    suggests_s3_or_shared(line, inputs, f"s3://{BUCKET}/in")
    assert not cluster.client.path("/tmp/run/manifest.json").exists()
    for key in WORKER_HOSTS:
        written = sorted(p.name for p in cluster.lab.host(key).path("/tmp/run").rglob("part-*"))
        assert written == [], f"{key} wrote {written} to its own /tmp/run"


def test_4_a_client_local_input_with_remote_workers_is_refused(cluster):
    out = f"s3://{BUCKET}/run4"
    proc = cluster.tokenshards(*TOKENIZE, "--input", "/tmp/in/*.parquet", "--out", out, "--scheduler", cluster.scheduler)
    line = one_line_error(proc, r"/tmp/in\b")
    names_machines(line)
    suggests_s3_or_shared(line, out)
    assert not cluster.s3.glob(f"{BUCKET}/run4/parts/*")


def test_5_a_shared_filesystem_works_and_verifies(cluster, gpt2):
    files = make_files(2, 60, chars=3000, start=500)
    write_files(cluster.lab.shared_dir / "in5", files, row_group_size=10)
    proc = cluster.tokenshards(*TOKENIZE, "--input", "/mnt/shared/in5/*.parquet", "--out", "/mnt/shared/out5",
                               "--scheduler", cluster.scheduler)
    assert proc.returncode == 0, proc.stderr[-4000:]
    docs = check_exact(cluster.lab.shared_dir / "out5", files, gpt2)

    proc = cluster.tokenshards("verify", "/mnt/shared/out5", "--scheduler", cluster.scheduler, "--progress", "none")
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert re.search(rf"\b{docs:,} documents, [\d,]+ tokens: OK$", proc.stdout, re.MULTILINE), proc.stdout

    proc = cluster.tokenshards("inspect", "/mnt/shared/out5")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert re.search(rf"^documents\s+{docs:,} ", proc.stdout, re.MULTILINE), proc.stdout


def test_6_commands_on_a_client_local_run_with_remote_workers(cluster, gpt2):
    """A run made on the client alone (a local cluster), then looked at with the remote workers:
    each command that would run work on them refuses with one line naming the path and machines."""
    proc = cluster.tokenshards(*TOKENIZE, "--input", "/tmp/in/*.parquet", "--out", "/tmp/local-run", "--workers", "1")
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_exact(cluster.client.path("/tmp/local-run"), cluster.corpus, gpt2)
    remote = ("--scheduler", cluster.scheduler, "--progress", "none")
    results = {
        "verify": cluster.tokenshards("verify", "/tmp/local-run", *remote),
        "export": cluster.tokenshards("export", "/tmp/local-run", "--format", "llmc", "--to", "/tmp/x",
                                      "--val-tokens", "1000", *remote),
        "train-bpe": cluster.tokenshards("train-bpe", "--input", "/tmp/in/*.parquet", "--out", "/tmp/v.tiktoken",
                                         "--vocab-size", "300", *remote),
    }
    inspect = cluster.tokenshards("inspect", "/tmp/local-run")  # no --scheduler: it reads on the client
    failures = []
    for command, proc in results.items():
        try:
            line = one_line_error(proc, r"/tmp/(local-run|x|in|v\.tiktoken)\b")
            names_machines(line)
        except AssertionError as e:
            failures.append(f"{command}: {e}")
    assert inspect.returncode == 0, inspect.stderr[-4000:]

    # One part file gone on the client: no verify may pass, here or with the remote workers.
    manifest = json.loads(cluster.client.path("/tmp/local-run/manifest.json").read_text())
    gone = manifest["partitions"][1]["tokens_file"]
    cluster.client.path(f"/tmp/local-run/{gone}").unlink()
    local = cluster.tokenshards("verify", "/tmp/local-run", "--workers", "1", "--progress", "none")
    assert local.returncode == 1 and gone.rsplit("/", 1)[1] in local.stdout + local.stderr, local.stdout + local.stderr
    again = cluster.tokenshards("verify", "/tmp/local-run", *remote)
    assert again.returncode != 0, f"verify --scheduler passed on a folder missing {gone}:\n{again.stdout}{again.stderr}"
    assert not failures, "\n".join(failures)


# -- the Hub -------------------------------------------------------------------------------------------

@dataclass
class Hub:
    url: str
    files: dict[str, list]
    sizes: dict[str, int]
    requests: callable
    clear: callable


@pytest.fixture(scope="module")
def hub(world):
    """The stand-in Hub on host ``hub``: sample/10BT with three ~1 MB files of five row groups each."""
    lab = world.lab
    files = make_files(3, 150, chars=8000, start=60)
    root = lab.host("hub").path("/tmp/repo")
    write_files(root / "sample/10BT", files, row_group_size=30, compression="none", use_dictionary=False)
    (root / "README.md").write_text("---\nlicense: odc-by\n---\n# stand-in FineWeb\n")
    server = lab.start_hub("hub", "/tmp/repo", repo=REPO_ID)
    sizes = {name: (root / "sample/10BT" / name).stat().st_size for name in files}
    assert min(sizes.values()) > 500_000, sizes  # footers (64 KiB reads) stay a small share of a file
    return Hub(url=server.url, files=files, sizes=sizes, requests=server.requests, clear=server.clear_log)


def _hub_traffic(hub: Hub, lab: Lab) -> list[str]:
    """What the Hub's request log shows against the spec: the client reads footers only (closed
    ranges that end at a file's end), and each file's bytes cross the network about once per run
    (at most 1.3x its size over all machines: once, plus footer reads). Returns the problems."""
    host_of = {h.ip: key for key, h in lab.hosts.items()}
    served = {name: 0 for name in hub.files}
    by_host: dict[str, dict[str, int]] = {name: {} for name in hub.files}
    problems = []
    for r in hub.requests():
        name = r["path"].split("?")[0].rsplit("/", 1)[-1]
        if r["method"] != "GET" or "/resolve/" not in r["path"] or name not in served:
            continue
        served[name] += r["sent"]
        host = host_of.get(r["client"], r["client"])
        by_host[name][host] = by_host[name].get(host, 0) + r["sent"]
        if host == "client":
            m = re.fullmatch(r"bytes=(\d+)-(\d+)", r["range"] or "")
            if not (m and int(m.group(1)) > 0 and int(m.group(2)) == hub.sizes[name] - 1):
                problems.append(f"the client GET {name} ({r['range'] or 'whole file'}, {r['sent']:,} bytes): "
                                "more than its footer")
    for name, sent in served.items():
        if sent > 1.3 * hub.sizes[name]:
            problems.append(f"{name}: {sent:,} bytes served for a {hub.sizes[name]:,}-byte file "
                            f"({sent / hub.sizes[name]:.2f}x; by host: {by_host[name]})")
    return problems


def _hub_run(cluster: World, hub: Hub, out: str, *extra: str) -> subprocess.CompletedProcess:
    hub.clear()
    return cluster.tokenshards("tokenize", "--partition-mb", "0.15", "--progress", "none", "--dataset", REPO_ID,
                               "--size", "10B", *extra, "--out", out, "--scheduler", cluster.scheduler,
                               env={"HF_ENDPOINT": hub.url})  # the client only: workers get it from the run


def test_7_the_hub_without_a_flag_workers_fetch_each_file_about_once(cluster, hub, gpt2):
    out = f"s3://{BUCKET}/hub7"
    proc = _hub_run(cluster, hub, out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_exact(cluster.download(out, "hub7"), hub.files, gpt2)
    problems = _hub_traffic(hub, cluster.lab)
    if not any(re.search(r"\bworkers\b", line, re.I) and re.search(r"fetch", line, re.I)
               for line in proc.stderr.splitlines()):
        problems.append(f"no line says that the workers fetch the files (and why):\n{proc.stderr}")
    assert not problems, "\n".join(problems)


def test_7b_the_hub_into_a_shared_download_dir_the_client_downloads(cluster, hub, gpt2):
    out = f"s3://{BUCKET}/hub7b"
    proc = _hub_run(cluster, hub, out, "--download-dir", "/mnt/shared/hf")
    assert proc.returncode == 0, proc.stderr[-4000:]
    check_exact(cluster.download(out, "hub7b"), hub.files, gpt2)
    problems = [p for p in _hub_traffic(hub, cluster.lab) if not p.startswith("the client GET")]  # it downloads here
    if not any(re.search(r"\bclient\b|this machine", line, re.I) and re.search(r"download|fetch", line, re.I)
               and re.search(r"\bworkers\b", line, re.I) for line in proc.stderr.splitlines()):
        problems.append(f"no line says that the client downloads (and the workers read its folder):\n{proc.stderr}")
    assert not problems, "\n".join(problems)


# -- a machine lost mid-run ----------------------------------------------------------------------------

def test_2_a_worker_machine_killed_mid_run(cluster, gpt2):
    out = f"s3://{BUCKET}/run2"
    cmd = [TOKENSHARDS, *TOKENIZE, "--input", f"s3://{BUCKET}/in/*.parquet", "--out", out,
           "--scheduler", cluster.scheduler]
    log = cluster.lab.workdir / "logs" / "client-run2.log"
    moto_log = cluster.s3.log
    seen = len(moto_log.read_text(errors="replace"))
    run = cluster.client.spawn(cmd, log=log)
    deadline = time.monotonic() + 120
    first_done = re.compile(rf'"PUT /{BUCKET}/run2/parts/part-\d+\.done\.json[^"]*" 200')
    while not first_done.search(moto_log.read_text(errors="replace")[seen:]):
        assert run.poll() is None, f"the run ended before any partition committed:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, "no partition committed in 120 s"
        time.sleep(0.05)
    killed = cluster.lab.kill_host("w2")
    assert killed and run.poll() is None, "the run was over before w2 was lost: nothing was tested"
    code = run.wait(240)
    assert not cluster.s3.exists(f"{BUCKET}/run2/manifest.json") or code == 0
    if code != 0:  # a rerun (w1 alone) resumes what was committed
        rerun = cluster.tokenshards(*cmd[1:])
        assert rerun.returncode == 0, f"run: exit {code}\n{log.read_text()[-3000:]}\nrerun:\n{rerun.stderr[-3000:]}"
    check_exact(cluster.download(out, "run2"), cluster.corpus, gpt2)


# -- the lease across machines with one host name ---------------------------------------------------------

HOLD = """
import sys, time
from tokenshards.storage.lease import Lease
from tokenshards.storage.location import Location
import os
with Lease(Location.at(sys.argv[1], {}), command="tokenize"):
    print("held", os.getpid(), flush=True)
    time.sleep(float(sys.argv[2]))
"""


def test_8_a_live_lease_on_another_machine_of_the_same_host_name_is_not_taken_over():
    with Lab(["a", "b"], hostnames={"a": "node", "b": "node"}, shared=["a", "b"]) as lab:
        a, b = lab.host("a"), lab.host("b")
        assert a.run(["hostname"]).stdout.strip() == b.run(["hostname"]).stdout.strip() == "node"
        files = make_files(1, 30, chars=2000)
        write_files(lab.shared_dir / "in", files, row_group_size=10)
        out = "/mnt/shared/out8"
        a.set_next_pid(30000)  # far above any pid b will use during its run
        for _ in range(5):
            holder = a.spawn([PYTHON, "-c", HOLD, out, "120"], log=lab.log_path("a", "holder"))
            deadline = time.monotonic() + 60
            while not (m := re.search(r"held (\d+)", holder.log.read_text())):
                assert holder.poll() is None, holder.log.read_text()
                assert time.monotonic() < deadline
                time.sleep(0.05)
            pid = int(m.group(1))
            if not b.pid_exists(pid):
                break
            a.stop(holder)
        assert not b.pid_exists(pid)
        lease = lab.shared_dir / "out8" / ".tokenshards-lease.json"
        record = json.loads(lease.read_text())
        assert (record["host"], record["pid"]) == ("node", pid)

        proc = b.run([TOKENSHARDS, "tokenize", "--input", "/mnt/shared/in/*.parquet", "--out", out, "--workers", "1",
                      "--progress", "none"], timeout=180)
        one_line_error(proc, r"is being written by")
        assert json.loads(lease.read_text())["run"] == record["run"], "b took the lease over"
        assert not (lab.shared_dir / "out8" / "manifest.json").exists()
        assert holder.poll() is None
        a.stop(holder)


# -- storage options of the wrong shape, and a missing bucket (no lab) ------------------------------------

@pytest.fixture(scope="module")
def s3_input(s3, tmp_path_factory):  # noqa: F811
    folder = tmp_path_factory.mktemp("s3in")
    write_files(folder, make_files(1, 20, chars=500), row_group_size=10)
    bucket = s3.make_bucket()
    s3.fs().put(str(folder / "000_00000.parquet"), f"{bucket}/in/000_00000.parquet")
    return bucket


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([TOKENSHARDS, *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command", ["tokenize", "verify", "export", "train-bpe", "inspect"])
def test_9_a_storage_option_of_the_wrong_shape_is_one_line(command, s3, s3_input):  # noqa: F811
    bucket = s3_input
    bad = ["--storage-option", 'client_kwargs={"x": 1}']
    args = {
        "tokenize": ["tokenize", "--input", f"s3://{bucket}/in/*.parquet", "--out", f"s3://{bucket}/o9", "--workers", "1"],
        "verify": ["verify", f"s3://{bucket}/o9", "--workers", "1"],
        "export": ["export", f"s3://{bucket}/o9", "--format", "llmc", "--to", f"s3://{bucket}/x9", "--workers", "1"],
        "train-bpe": ["train-bpe", "--input", f"s3://{bucket}/in/*.parquet", "--out", f"s3://{bucket}/v.tiktoken",
                      "--workers", "1"],
        "inspect": ["inspect", f"s3://{bucket}/o9"],
    }[command]
    proc = _cli([*args, *bad], s3.env(PYTHONPATH=str(Path(__file__).resolve().parent.parent / "lib")))
    one_line_error(proc, r"client_kwargs")


def test_9b_train_bpe_never_creates_a_missing_bucket(s3, s3_input):  # noqa: F811
    missing = f"missing-{uuid.uuid4().hex[:12]}"
    proc = _cli(["train-bpe", "--input", f"s3://{s3_input}/in/*.parquet", "--out", f"s3://{missing}/x.tiktoken",
                 "--workers", "1", "--vocab-size", "300", "--progress", "none"],
                s3.env(PYTHONPATH=str(Path(__file__).resolve().parent.parent / "lib")))
    problems = [f"train-bpe created bucket {missing}"] if s3.fs().exists(missing) else []
    try:
        one_line_error(proc, rf"\b{missing}\b.*does not exist|does not exist.*\b{missing}\b")
    except AssertionError as e:
        problems.append(str(e))
    assert not problems, "\n".join(problems)
