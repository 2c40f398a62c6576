"""SLURM for real: a single-node SLURM (slurmctld + slurmd + munged, Debian's slurm-wlm, see
slurmlab.py) runs the job's workers as batch jobs that dask-jobqueue submits with sbatch, from
a config made from the shipped cluster_configs/slurm.yaml, through the CLI.

The whole module is skipped, with the reason, where no SLURM can be brought up (not root, no
apt-get, daemons that do not start). The first test may install slurm-wlm and munge."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

import tokenshards
from readback import expected_tokens, read_documents
from slurmlab import SlurmUnavailable, start_slurm
from tokenshards.demo import build_demo_corpus

# Installing slurm-wlm on a fresh machine (apt-get update + install) can take minutes.
pytestmark = pytest.mark.timeout(900)

CONFIGS = Path(__file__).resolve().parent.parent / "cluster_configs"
TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
# The jobs run this interpreter with this package: on a real cluster, the same environment on a
# shared filesystem (or a module / venv the prologue activates).
LIB = str(Path(tokenshards.__file__).resolve().parent.parent)
GPT2_EOT = 50256


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    try:
        lab = start_slurm(tmp_path_factory.mktemp("slurmlab"))
    except SlurmUnavailable as e:
        pytest.skip(f"no single-node SLURM here: {e}")
    try:
        yield lab
    finally:
        lab.stop()
    assert lab.leftovers() == [], "processes of the SLURM lab outlived it"


@pytest.fixture
def slurm(lab):
    """The lab with an empty queue and an idle node before and after the test."""
    deadline = time.monotonic() + 30
    while (lab.jobs() or lab.node_state() != "idle") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert lab.jobs() == [] and lab.node_state() == "idle", (lab.jobs(), lab.node_state())
    yield lab
    deadline = time.monotonic() + 30
    while lab.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    left = lab.jobs()
    if left:
        lab.run("scancel", *[job["id"] for job in left])
    assert left == [], "the run left SLURM jobs behind"


def slurm_config(tmp_path: Path, lab, **changes) -> Path:
    """The shipped slurm.yaml, its values fitted to the one node: two jobs of one worker process
    each (so one can be cancelled), the interpreter and package of this test in the jobs."""
    raw = yaml.safe_load((CONFIGS / "slurm.yaml").read_text())
    shipped = set(raw["options"])
    raw["workers"] = 2
    raw["options"].update({
        "queue": lab.partition, "cores": 1, "processes": 1, "walltime": "00:10:00",
        "memory": "1GB" if lab.memory_mb >= 1024 else f"{lab.memory_mb // 2}MB",  # what sbatch --mem may ask of the node
        "python": sys.executable, "job_script_prologue": [f"export PYTHONPATH={LIB}"],
        "local_directory": str(tmp_path / "worker-space"), "log_directory": str(tmp_path / "job-logs"),
        "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
        **changes,
    })
    assert shipped <= set(raw["options"])
    path = tmp_path / "slurm.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> list[Path]:
    """The demo corpus (CPython's docs in FineWeb's columns, 624 documents), built once: four
    files of 39 row groups, so that --partition-mb 0.001 makes 156 small partitions."""
    return build_demo_corpus(tmp_path_factory.mktemp("demo"), row_group_rows=4)


def corpus(folder: Path, demo: list[Path], *, copies: int = 1) -> list[Path]:
    """The demo files ``copies`` times over, under other names, in one input folder."""
    inputs = folder / "in"
    inputs.mkdir()
    return [Path(shutil.copyfile(path, inputs / f"c{copy}_{path.name}")) for copy in range(copies) for path in demo]


def tokenize_command(inputs: list[Path], out: Path, config: Path) -> list[str]:
    return [TOKENSHARDS, "tokenize", "--input", str(inputs[0].parent), "--out", str(out), "--cluster", str(config),
            "--progress", "log", "--partition-mb", "0.001"]


class Run:
    """The CLI in a child process, its output in files (no pipe to fill up)."""

    def __init__(self, command: list[str], lab, folder: Path, name: str):
        self.stdout, self.stderr = folder / f"{name}.out", folder / f"{name}.err"
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.proc = subprocess.Popen(command, env=lab.env, cwd=folder, stdin=subprocess.DEVNULL, stdout=out, stderr=err)

    def wait(self, timeout: float = 240) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the run did not end within {timeout} s; stderr: {self.stderr.read_text()[-2000:]}")

    @property
    def output(self) -> tuple[str, str]:
        return self.stdout.read_text(), self.stderr.read_text()


def assert_exact(out: Path, inputs: list[Path], encoding) -> int:
    """Every document's tokens are [eot] + tiktoken's encode_ordinary(text); returns the count."""
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoding"]["eot"] == GPT2_EOT and manifest["eot_position"] == "prefix"
    texts = {}
    for path in inputs:
        for row, text in enumerate(pq.read_table(path, columns=["text"]).column("text").to_pylist()):
            texts[(path.name, row)] = text
    docs = {(Path(source).name, row): tokens for (source, row), (_, tokens) in read_documents(out).items()}
    assert set(docs) == set(texts)
    wrong = [key for key, tokens in docs.items() if tokens[0] != GPT2_EOT or tokens != expected_tokens(encoding, texts[key])]
    assert wrong == [], f"{len(wrong)} documents differ from tiktoken, e.g. {wrong[:3]}"
    return len(docs)


def job_log(tmp_path: Path, job_id: str) -> str:
    path = tmp_path / "job-logs" / f"dask-worker-{job_id}.err"
    return path.read_text(errors="replace") if path.exists() else ""


def test_tokenize_runs_in_slurm_batch_jobs(slurm, demo, tmp_path, gpt2):
    """sbatch gets two worker jobs, squeue shows them running during the run, their workers do
    the work (the scheduler is in the tokenshards process, no other worker exists), the output
    is exact and the jobs are cancelled when the run ends."""
    inputs = corpus(tmp_path, demo)
    out = tmp_path / "out"
    run = Run(tokenize_command(inputs, out, slurm_config(tmp_path, slurm)), slurm, tmp_path, "run")
    seen: dict[str, set] = {}
    while run.proc.poll() is None:
        for job in slurm.jobs():
            seen.setdefault(job["id"], set()).add((job["name"], job["state"], job["partition"]))
        time.sleep(0.2)
    code = run.wait()
    stdout, stderr = run.output
    assert code == 0, stderr
    assert re.match(r"dashboard: http://\S+/status  \(slurm cluster from \S+slurm\.yaml, scaling to 2 workers; ", stderr)
    assert "done: 624 documents" in stdout
    running = sorted(job_id for job_id, states in seen.items() if ("dask-worker", "RUNNING", slurm.partition) in states)
    assert len(running) == 2, seen
    for job_id in running:  # each job's worker joined the run's scheduler and loaded the encoder
        assert re.search(r"Starting Worker plugin tokenshards-encoder-gpt2", job_log(tmp_path, job_id)), job_log(tmp_path, job_id)
    assert assert_exact(out, inputs, gpt2) == 624


def test_a_cancelled_worker_job_does_not_spoil_the_run(slurm, demo, tmp_path, gpt2):
    """scancel of one of the two worker jobs while partitions are being committed: its tasks
    go to the other worker (or, if the run fails, the same command resumes); the output is exact."""
    inputs = corpus(tmp_path, demo, copies=3)  # 468 small partitions: ~10 s on one worker
    out = tmp_path / "out"
    command = tokenize_command(inputs, out, slurm_config(tmp_path, slurm))
    run = Run(command, slurm, tmp_path, "run")
    deadline = time.monotonic() + 120
    while True:
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output
        jobs = [job for job in slurm.jobs() if job["state"] == "RUNNING"]
        joined = [job for job in jobs if "Registered to:" in job_log(tmp_path, job["id"])]
        if len(joined) == 2 and any((out / "parts").glob("*.done.json")):
            break
        time.sleep(0.1)
    victim = joined[0]["id"]
    slurm.run("scancel", victim)
    while any(job["id"] == victim and job["state"] == "RUNNING" for job in slurm.jobs()):
        assert time.monotonic() < deadline, f"job {victim} still running after scancel"
        time.sleep(0.1)
    # The job was gone while the run still had work: it had not committed its manifest.
    assert run.proc.poll() is None and not (out / "manifest.json").exists()
    committed_then = len(list((out / "parts").glob("*.done.json")))
    code = run.wait()
    stdout, stderr = run.output
    assert "CANCELLED AT" in job_log(tmp_path, victim)
    assert committed_then < 468
    if code != 0:  # the run gave up: the same command resumes from the committed partitions
        rerun = Run(command, slurm, tmp_path, "rerun")
        code = rerun.wait()
        stdout, stderr = rerun.output
        assert code == 0, stderr
        resumed = re.search(r"468 partitions \((\d+) already committed\)", stdout)
        assert resumed and int(resumed.group(1)) >= committed_then, stdout
    assert code == 0, stderr
    assert "done: 1,872 documents" in stdout
    assert assert_exact(out, inputs, gpt2) == 1872


def test_a_job_sbatch_rejects_is_a_one_line_error(slurm, demo, tmp_path):
    """dask-jobqueue submits in the background; a job sbatch refuses would leave the run waiting
    for workers forever. tokenshards asks `sbatch --test-only` first and says what SLURM said."""
    inputs = corpus(tmp_path, demo)
    started = time.monotonic()
    run = Run(tokenize_command(inputs, tmp_path / "out", slurm_config(tmp_path, slurm, queue="nosuchpartition")),
              slurm, tmp_path, "run")
    code = run.wait(timeout=60)
    stdout, stderr = run.output
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert re.search(r"tokenshards: error: cluster config \S+slurm\.yaml: SLURM would not accept the worker job "
                     r"\(sbatch: error: invalid partition specified: nosuchpartition.*\); check options\.queue", stderr), stderr
    assert time.monotonic() - started < 30
    assert slurm.jobs() == []


def test_jobs_that_cannot_start_the_worker_stop_the_run(slurm, demo, tmp_path):
    """The nodes lack the Python environment: both jobs fail at once. Instead of waiting for
    workers forever, the run stops with what happened and what the nodes need."""
    inputs = corpus(tmp_path, demo)
    missing = tmp_path / "not-on-the-nodes" / "python"
    run = Run(tokenize_command(inputs, tmp_path / "out", slurm_config(tmp_path, slurm, python=str(missing))),
              slurm, tmp_path, "run")
    code = run.wait(timeout=90)
    stdout, stderr = run.output
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert re.search(r"tokenshards: error: every SLURM job of this run has ended \(\d+ FAILED, \d+ FAILED\) and "
                     r"dask-jobqueue does not submit them again; no worker ever connected: the nodes could not start "
                     r"Dask's worker; they need this Python environment \(options\.python, or options\.job_script_prologue "
                     rf"to activate it\); see the jobs' output in {re.escape(str(tmp_path))}/job-logs\. "
                     r"Committed partitions are kept", stderr), stderr
    logs = "".join(p.read_text() for p in (tmp_path / "job-logs").glob("*.err"))
    assert f"{missing}: No such file or directory" in logs


def test_when_every_worker_job_is_cancelled_the_run_stops_and_the_same_command_resumes(slurm, demo, tmp_path, gpt2):
    """scancel of both worker jobs mid-run: no worker is left and dask-jobqueue submits none again;
    the run stops with the reason instead of waiting forever, and the same command resumes."""
    inputs = corpus(tmp_path, demo, copies=2)  # 312 partitions
    out = tmp_path / "out"
    command = tokenize_command(inputs, out, slurm_config(tmp_path, slurm))
    run = Run(command, slurm, tmp_path, "run")
    deadline = time.monotonic() + 120
    while not any((out / "parts").glob("*.done.json")):
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output
        time.sleep(0.1)
    slurm.run("scancel", *[job["id"] for job in slurm.jobs()])
    code = run.wait(timeout=120)
    stdout, stderr = run.output
    assert code == 2, stderr
    assert re.search(r"tokenshards: error: every SLURM job of this run has ended \(\d+ CANCELLED, \d+ CANCELLED\) .*; "
                     r"their workers are gone \(cancelled, out of options\.walltime, or a node failed\); .* Committed "
                     r"partitions are kept: rerun the same command to resume", stderr), stderr
    assert not (out / "manifest.json").exists()
    committed = len(list((out / "parts").glob("*.done.json")))
    assert 0 < committed < 312

    rerun = Run(command, slurm, tmp_path, "rerun")
    code = rerun.wait()
    stdout, stderr = rerun.output
    assert code == 0, stderr
    assert f"312 partitions ({committed} already committed)" in stdout
    assert assert_exact(out, inputs, gpt2) == 1248
