"""Clusters: the shipped configs turn into real backend objects, typos fail with the known keys,
and a real `dask scheduler` + `dask worker` pair runs the job while its dashboard answers."""
from __future__ import annotations

import os
import dataclasses
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from distributed import Client

from conftest import write_parquet
from readback import read_documents
from sshserver import start_ssh_server
from tokenshards.cli import main
from tokenshards.cluster.configfile import load_cluster_config
from tokenshards.cluster.connect import connect, kubernetes_spec, slurm_cluster
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.errors import UserError
from tokenshards.tokenize.command import run_tokenize

CONFIGS = Path(__file__).resolve().parent.parent / "cluster_configs"
DASK = str(Path(sys.executable).with_name("dask"))


def _config(tmp_path: Path, body: dict) -> str:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("name", ["local", "scheduler", "slurm", "kubernetes", "ssh"])
def test_every_shipped_config_validates(name):
    config = load_cluster_config(str(CONFIGS / f"{name}.yaml"))
    assert config.kind == name


def test_slurm_config_renders_a_job_script():
    """dask-jobqueue's own class accepts every option; its job script is what sbatch would get."""
    config = load_cluster_config(str(CONFIGS / "slurm.yaml"))
    # The shipped :8787 is often taken on a shared machine, and distributed then leaks a
    # socket (a ResourceWarning, an error here): keep the in-process scheduler on loopback.
    options = {**config.settings["options"], "scheduler_options": {"dashboard_address": "127.0.0.1:0", "host": "127.0.0.1"}}
    cluster = slurm_cluster(dataclasses.replace(config, settings={**config.settings, "options": options}))
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -p cpu" in script
    assert "#SBATCH --cpus-per-task=16" in script
    assert "#SBATCH -t 04:00:00" in script
    assert "-m distributed.cli.dask_worker" in script and "--nthreads 1" in script and "--nworkers 16" in script


def test_kubernetes_config_builds_an_operator_spec_with_current_commands():
    spec = kubernetes_spec(load_cluster_config(str(CONFIGS / "kubernetes.yaml")))
    assert spec["kind"] == "DaskCluster" and spec["metadata"]["name"] == "tokenshards"
    worker = spec["spec"]["worker"]
    assert worker["replicas"] == 8
    (container,) = worker["spec"]["containers"]
    assert container["args"][:4] == ["dask", "worker", "--nthreads", "1"]
    assert container["resources"]["limits"] == {"cpu": "1", "memory": "4Gi"}
    (scheduler,) = spec["spec"]["scheduler"]["spec"]["containers"]
    assert scheduler["args"][:2] == ["dask", "scheduler"]
    # distributed 2026.6 removed the hyphenated commands: no pod may run them.
    assert "dask-scheduler" not in json.dumps(spec) and '"dask-worker"' not in json.dumps(spec)


def test_workers_flag_overrides_the_config():
    assert load_cluster_config(str(CONFIGS / "kubernetes.yaml"), workers=3).workers == 3
    with pytest.raises(UserError, match=r"--workers does not apply to a cluster config of kind 'ssh'"):
        load_cluster_config(str(CONFIGS / "ssh.yaml"), workers=3)


@pytest.mark.parametrize("body, message", [
    ({"kind": "slurm", "workers": 2, "options": {"cores": 4, "memory": "8GB", "qeueu": "cpu"}},
     r"options \(kind: slurm\): unknown key\(s\) 'qeueu' \(did you mean 'queue'\?\); known keys: .*account.*walltime"),
    ({"kind": "kubernetes", "workers": 2, "options": {"imagee": "x"}},
     r"unknown key\(s\) 'imagee' \(did you mean 'image'\?\); known keys: env, idle_timeout, image,"),
    ({"kind": "kubernetes", "workers": 2, "options": {"resources": {"limit": {"cpu": 1}}}},
     r"options.resources: unknown key\(s\) 'limit' \(did you mean 'limits'\?\)"),
    ({"kind": "local", "worker": 2}, r"\(kind: local\): unknown key\(s\) 'worker' \(did you mean 'workers'\?\)"),
    ({"kind": "slurm", "workers": 2, "options": {"project": "p"}}, r"options.project is deprecated.*use options.account"),
    ({"kind": "slurm", "options": {}}, r"workers .* is required for kind slurm"),
    ({"kind": "slurm", "workers": 2, "options": {"cores": 4}}, r"options.memory is required \(per SLURM job, e.g. memory: 64GB\)"),
    ({"kind": "slurm", "workers": 2, "options": {"cores": 4, "memory": "8GB", "host": "h"}},
     r"unknown key\(s\) 'host'; known keys: .*scheduler_options"),
    ({"kind": "kubernetes", "workers": 2, "options": {"env": {"N": 5}}}, r"options.env must map names to strings"),
    ({"kind": "local", "workers": 0}, r"workers=0 must be a positive integer"),
    ({"kind": "lsf"}, r"kind='lsf' not supported, expected one of local, scheduler, slurm, kubernetes, ssh"),
    ({"kind": "scheduler"}, r"give exactly one of address .* or scheduler_file"),
    ({"kind": "scheduler", "address": "host:8786"}, r"address='host:8786' needs a protocol"),
    ({"kind": "ssh", "hosts": ["only-one"]}, r"hosts must list at least two host names"),
])
def test_config_mistakes_are_one_line_errors(tmp_path, body, message):
    with pytest.raises(UserError, match=message):
        load_cluster_config(_config(tmp_path, body))


def test_missing_config_lists_the_folder(tmp_path):
    (tmp_path / "mine.yaml").write_text("kind: local\n")
    with pytest.raises(UserError, match=r"cluster config .*nope.yaml not found; configs in .*: mine.yaml"):
        load_cluster_config(str(tmp_path / "nope.yaml"))


def test_missing_backend_package_names_the_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dask_jobqueue", None)  # as if it were not installed
    with pytest.raises(UserError, match=r"needs the dask-jobqueue package: pip install 'tokenshards\[slurm\]'"):
        load_cluster_config(str(CONFIGS / "slurm.yaml"))


def test_cli_reports_a_bad_config_without_traceback(tmp_path, capsys):
    path = _config(tmp_path, {"kind": "local", "threads": 2})
    code = main(["tokenize", "--input", str(tmp_path / "x.parquet"), "--out", str(tmp_path / "out"), "--cluster", path])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("tokenshards: error: ") and "Traceback" not in err


# -- a real `dask scheduler` and `dask worker`, as the README tells users to start them --

@pytest.fixture(scope="module")
def dask_scheduler(tmp_path_factory):
    """`dask scheduler` and one `dask worker` on 127.0.0.1 (~4 s to start)."""
    folder = tmp_path_factory.mktemp("scheduler")
    port, dashboard = _free_port(), _free_port()
    scheduler_file = folder / "scheduler.json"
    procs = [subprocess.Popen([DASK, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--dashboard-address", f"127.0.0.1:{dashboard}", "--scheduler-file", str(scheduler_file)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    address = f"tcp://127.0.0.1:{port}"
    try:
        procs.append(subprocess.Popen([DASK, "worker", address, "--host", "127.0.0.1", "--nthreads", "1", "--nworkers", "1",
                                       "--no-dashboard", "--local-directory", str(folder)],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 60
        while not scheduler_file.exists():
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        with Client(address, timeout="30s") as client:
            client.wait_for_workers(1, timeout=60)
        yield {"address": address, "dashboard": dashboard, "scheduler_file": str(scheduler_file)}
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@pytest.fixture
def corpus(tmp_path):
    texts = [f"document {i}: " + "the quick brown fox jumps over the lazy dog " * (1 + i % 7) for i in range(400)]
    return write_parquet(tmp_path / "in" / "c.parquet", {"text": texts}, row_group_size=50)


def test_dashboard_answers_during_a_run_on_a_real_scheduler(dask_scheduler, corpus, tmp_path):
    """The first announced line is the dashboard link; a real GET of it, made while the job
    runs (from inside the announce callback), answers 200; the performance report is saved."""
    seen: list[str] = []
    statuses: list[int] = []

    def announce(message: str) -> None:
        seen.append(message)
        if message.startswith("dashboard: "):
            url = message.split()[1]
            with urllib.request.urlopen(url, timeout=30) as response:
                statuses.append(response.status)
                assert b"<html" in response.read(4096).lower()

    report = tmp_path / "report.html"
    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), scheduler=dask_scheduler["address"],
                            progress="none", partition_bytes=2000, report=str(report))
    summary = run_tokenize(config, announce=announce)

    assert seen[0] == (f"dashboard: http://127.0.0.1:{dask_scheduler['dashboard']}/status  "
                       f"(scheduler {dask_scheduler['address']}, 1 worker)")
    assert statuses == [200]
    assert summary.partitions == 8 and summary.docs == 400
    assert len(read_documents(tmp_path / "out")) == 400
    assert report.stat().st_size > 10_000 and "Dask Performance Report" in report.read_text()
    assert seen[-1] == f"performance report: {report}"


def test_cli_runs_through_a_scheduler_file_config(dask_scheduler, corpus, tmp_path, capsys):
    path = _config(tmp_path, {"kind": "scheduler", "scheduler_file": dask_scheduler["scheduler_file"], "timeout": "20s"})
    code = main(["tokenize", "--input", str(corpus), "--out", str(tmp_path / "out"), "--cluster", path,
                 "--progress", "log", "--partition-mb", "0.002"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.err.splitlines()
    assert re.fullmatch(rf"dashboard: http://127\.0\.0\.1:{dask_scheduler['dashboard']}/status  \(scheduler .*\)", lines[0])
    assert lines[-1].startswith("partitions 8/8  ")
    assert "done: 400 documents" in captured.out


def test_unreachable_scheduler_is_a_user_error(tmp_path, corpus):
    path = _config(tmp_path, {"kind": "scheduler", "address": f"tcp://127.0.0.1:{_free_port()}", "timeout": "1s"})
    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), cluster_config=path, progress="none")
    with pytest.raises(UserError, match=r"cannot reach the Dask scheduler at tcp://127\.0\.0\.1:\d+: .*is `dask scheduler` running there\?"):
        run_tokenize(config, announce=lambda m: None)


def test_local_config_starts_a_local_cluster(tmp_path, corpus):
    path = _config(tmp_path, {"kind": "local", "workers": 1, "dashboard_address": "127.0.0.1:0"})
    seen: list[str] = []
    statuses: list[int] = []

    def announce(message: str) -> None:
        seen.append(message)
        if message.startswith("dashboard: "):  # a real request while the cluster is up
            with urllib.request.urlopen(message.split()[1], timeout=30) as response:
                statuses.append(response.status)

    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), cluster_config=path, progress="none")
    summary = run_tokenize(config, announce=announce)
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/status  \(local cluster \(.*cluster\.yaml\): 1 process worker\)",
                        seen[0])
    assert statuses == [200]
    assert summary.docs == 400


def test_scheduler_and_cluster_together_is_refused(tmp_path, corpus):
    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), scheduler="tcp://127.0.0.1:1",
                            cluster_config=str(CONFIGS / "local.yaml"), progress="none")
    with pytest.raises(UserError, match=r"pass either --scheduler or --cluster, not both"):
        run_tokenize(config, announce=lambda m: None)


def test_ssh_config_runs_the_job_through_a_real_ssh_server(tmp_path, corpus):
    """distributed's SSHCluster, unchanged, logs in to a real SSH server on 127.0.0.1 (asyncssh)
    that runs its commands through the shell: scheduler and worker start, the job runs."""
    server, stop = start_ssh_server(tmp_path)
    try:
        path = _config(tmp_path, {
            "kind": "ssh", "hosts": ["127.0.0.1", "127.0.0.1"], "connect_options": server.connect_options(),
            "scheduler_options": {"host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0"},
            "worker_options": {"host": "127.0.0.1", "n_workers": 1}, "remote_python": sys.executable,
        })
        seen: list[str] = []
        config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), cluster_config=path, progress="none")
        summary = run_tokenize(config, announce=seen.append)
    finally:
        stop()
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/status  \(ssh cluster from .*cluster\.yaml\)", seen[0])
    assert summary.docs == 400 and len(read_documents(tmp_path / "out")) == 400


def test_report_into_a_missing_folder_fails_before_any_work(tmp_path, corpus):
    config = TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), report=str(tmp_path / "no" / "r.html"),
                            scheduler="tcp://127.0.0.1:1", progress="none")
    with pytest.raises(UserError, match=r"--report .*r\.html: folder .*no does not exist; create it or choose another file"):
        run_tokenize(config, announce=lambda m: None)


def test_a_folder_is_not_a_config(tmp_path):
    with pytest.raises(UserError, match=r"cannot read cluster config .*: Is a directory"):
        load_cluster_config(str(tmp_path))


def test_a_worker_without_the_fast_backend_is_a_one_line_error(tmp_path, corpus):
    """The client verified gigatoken (auto's first choice), one machine of the cluster cannot import
    it: the user is told which worker, and what to do, in one line (not a traceback from inside the plugin)."""
    from daskprocs import dask_processes

    shadow = tmp_path / "shadow" / "gigatoken"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('gigatoken is not installed on this machine')\n")
    with dask_processes(tmp_path, workers=0) as procs:
        procs.start_worker(env={"PYTHONPATH": str(shadow.parent)})
        procs.wait_for_workers(1)
        proc = subprocess.run([str(Path(sys.executable).with_name("tokenshards")), "tokenize", "--input", str(corpus),
                               "--out", str(tmp_path / "out"), "--scheduler", procs.address, "--progress", "none"],
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if line.startswith("tokenshards: error:")]
    assert re.search(r"worker tcp://127\.0\.0\.1:\d+ cannot load the gigatoken backend \(.*not installed on this "
                     r"machine\); install tokenshards\[fast\] on every worker, or pass --backend tiktoken", error), error
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and mallinfo2")
def test_a_hand_started_worker_keeps_freed_memory_for_reuse(tmp_path, corpus, monkeypatch):
    """Dask starts a worker with MALLOC_TRIM_THRESHOLD_=65536, which pins glibc's mmap threshold at
    128 KiB: every array of a partition is mmapped, faulted in and unmapped, task after task. Our
    LocalCluster's workers start with other settings (``prestart.worker_environment``); a worker
    started by hand gets them (``mallopt``) from the plugin a command registers as it connects."""
    from daskprocs import dask_processes

    from tokenshards.cluster.prestart import worker_environment

    # By hand means from a shell: not with the allocator settings an earlier test's local cluster
    # left in this process's environment (start_forkserver sets them for the server it starts).
    for name in worker_environment({"MALLOC_TRIM_THRESHOLD_": "65536"}, inherited={}):
        monkeypatch.delenv(name, raising=False)
    for name in [n for n in os.environ if n.startswith(("MALLOC_", "MIMALLOC_", "DASK_", "GLIBC_TUNABLES"))]:
        monkeypatch.delenv(name)

    def allocator_settings() -> dict:
        import os

        return {k: v for k, v in os.environ.items() if k.startswith(("MALLOC_", "MIMALLOC_", "DASK_", "GLIBC_"))}

    def mmapped_bytes_of_a_4mib_array() -> int:
        """On a worker (nested: pickled whole, not by module): what glibc mmaps for a 4 MiB array held."""
        import ctypes

        import numpy as np

        class MallInfo2(ctypes.Structure):
            _fields_ = [(name, ctypes.c_size_t) for name in
                        ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

        mallinfo2 = ctypes.CDLL(None).mallinfo2
        mallinfo2.restype = MallInfo2
        before = mallinfo2().hblkhd
        held = np.empty(4 * 2**20, dtype=np.uint8)
        grown = mallinfo2().hblkhd - before
        del held
        return grown

    with dask_processes(tmp_path, workers=1) as procs, Client(procs.address, timeout="30s") as client:
        [before] = client.run(mmapped_bytes_of_a_4mib_array).values()
        # A worker that compiled its imports from source (no .pyc, PYTHONDONTWRITEBYTECODE set) freed
        # large mmapped blocks on the way, and glibc raised its mmap threshold past 4 MiB: make
        # install compiles bytecode (that was why this failed in fresh clones on 27 Nov).
        assert before >= 4 * 2**20, ("Dask's default no longer mmaps a 4 MiB array: this test has lost its point "
                                     f"(the worker's allocator settings: {client.run(allocator_settings)}; "
                                     "or the venv has no bytecode: run make install)")
        run_tokenize(TokenizeConfig(inputs=(str(corpus),), out=str(tmp_path / "out"), scheduler=procs.address,
                                    progress="none"), announce=lambda m: None)
        [after] = client.run(mmapped_bytes_of_a_4mib_array).values()
    assert after == 0


PRESTARTED_WORKER_PROBE = r"""
import gc, signal, sys
from tokenshards.cluster.prestart import start_forkserver
from tokenshards.cluster.connect import connect
from tokenshards.tokenize.workers import forkserver_preload

if __name__ == "__main__":
    assert start_forkserver(forkserver_preload())
    with connect(workers=2, dashboard_address=":0", announce=lambda m: None) as client:
        def probe(dask_worker):  # before any task: a spawned worker has imported none of these yet
            from distributed.versions import _version_cached
            return (sorted(m for m in ("pandas", "tokenshards.tokenize.task", "splintr", "gigatoken", "awkward")
                           if m in sys.modules),
                    # Dask's monitors at prestart.COARSER_MONITORS' rates (ms), not every 10 and 20 ms
                    (dask_worker.periodic_callbacks["profile"].callback_time, dask_worker._tick_interval * 1000),
                    signal.getsignal(signal.SIGINT) == signal.SIG_IGN,
                    # its handshake's versions came from the server's cache (else: all misses)
                    _version_cached.cache_info().hits > 0,
                    # the server imported with its collector stopped (forkserver_begin), then froze
                    # what it made and started it again (forkserver_preload): the worker collects
                    gc.isenabled() and gc.get_freeze_count() > 100_000)
        print(sorted(client.run(probe).values()))
"""


def test_local_workers_fork_from_a_preloaded_server_and_ignore_ctrl_c(tmp_path):
    """What the command line does first (prestart.py): workers start with the task modules already
    imported and the versions their handshake sends already known (``forkserver_preload``), with
    the garbage collector running again over a frozen heap, Dask's profiler and event-loop tick at
    a tenth of their default rates (``prestart.COARSER_MONITORS``), and ignore SIGINT so that only
    the client handles a terminal's Ctrl-C."""
    script = tmp_path / "probe.py"
    script.write_text(PRESTARTED_WORKER_PROBE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    preloaded = ["awkward", "gigatoken", "pandas", "splintr", "tokenshards.tokenize.task"]
    assert proc.stdout.strip() == repr([(preloaded, (100.0, 100.0), True, True, True)] * 2)


FORKSERVER_START_PROBE = r"""
import os, sys
from tokenshards.cluster import prestart
from tokenshards.cli import console_main

def started(preload):  # the moment the command line starts the forkserver: what this process holds then
    print(sorted(m for m in ("numpy", "pyarrow", "fsspec", "pandas", "distributed") if m in sys.modules), flush=True)
    os._exit(0)

if __name__ == "__main__":
    prestart.start_forkserver = started
    console_main(sys.argv[1:])
"""


@pytest.mark.parametrize("command", ["tokenize", "verify"])
def test_a_local_run_starts_its_forkserver_before_numpy_and_pyarrow(tmp_path, command):
    """The forkserver imports and builds what the workers need on the other core while this process
    imports the rest: it starts before numpy, pyarrow and fsspec, which export's formats import
    (cli.build_parser leaves export's parser a placeholder on another command's line), ~0.3 s
    earlier here."""
    script = tmp_path / "probe.py"
    script.write_text(FORKSERVER_START_PROBE)
    argv = {"tokenize": ["tokenize", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out")],
            "verify": ["verify", str(tmp_path / "out")]}[command]
    proc = subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout.strip()) == (0, "[]"), proc.stderr


PREBUILT_PROBE = r"""
import sys
from tokenshards.cluster.prestart import start_forkserver
from tokenshards.cluster.connect import connect
from tokenshards.encoding import prebuilt
from tokenshards.encoding.backends import choose
from tokenshards.encoding.encoders import load_encoding
from tokenshards.encoding.plugin import EncoderPlugin
from tokenshards.tokenize.workers import forkserver_preload

if __name__ == "__main__":
    loaded = load_encoding("gpt2")  # keeps gpt2 parsed: the server prebuilds only what loads offline
    preload = forkserver_preload("gpt2", "auto")
    assert start_forkserver(preload)
    prebuilt.started(preload)
    with connect(workers=2, dashboard_address=":0", announce=lambda m: None) as client:
        here = choose("auto", loaded.encoding, loaded.params)
        there = prebuilt.ask(loaded.fingerprint, "auto")
        assert (there.name, there.note) == (here.name, here.note), (there, here)
        assert prebuilt.ask(loaded.fingerprint, "splintr") is None  # another request: chosen here
        assert prebuilt.ask("0" * 64, "auto") is None  # another encoding: chosen here
        plugin = EncoderPlugin(loaded, backend=there.name)
        client.register_plugin(plugin)
        text = "<|endoftext|> prebuilt 🙂 中文 " * 50
        def probe(dask_worker):
            backend = dask_worker.plugins[plugin.name].backend
            flat, _ = backend.encode_many([text])
            return backend is prebuilt._prebuilt[0].backend, flat.tolist()
        want = loaded.encoding.encode_ordinary(text)
        print(sorted(client.run(probe).values()) == [(True, want)] * 2)
"""


def test_local_workers_start_with_the_encoder_their_server_verified_and_built(tmp_path):
    """With the command line's encoding and backend, the forkserver verifies and builds the
    encoder once (prebuilt.py): the client takes its verdict, the workers its very objects."""
    script = tmp_path / "probe.py"
    script.write_text(PREBUILT_PROBE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True"


def test_a_prebuilt_encoder_serves_only_its_own_fingerprint_and_backend(monkeypatch, gpt2):
    from tokenshards.encoding import prebuilt
    from tokenshards.encoding.backends import Choice, TiktokenBackend

    backend = TiktokenBackend(gpt2)
    monkeypatch.setattr(prebuilt, "_prebuilt", (prebuilt.Prebuilt(
        fingerprint="f" * 64, requested="auto", choice=Choice("tiktoken", "note"), encoding=gpt2, backend=backend),))
    assert prebuilt.for_worker("f" * 64, "tiktoken") == (gpt2, backend)
    assert prebuilt.for_worker("e" * 64, "tiktoken") is None
    assert prebuilt.for_worker("f" * 64, "gigatoken") is None
    assert prebuilt.ask("f" * 64, "auto") is None  # only the process that requested a prebuild asks


def test_forkserver_lets_workers_reuse_freed_memory_unless_dask_config_says_otherwise():
    """Dask's default trim threshold would make glibc mmap and unmap every partition-sized array;
    Arrow's allocator keeps freed pages for the next read unless the environment already says how."""
    from tokenshards.cluster.prestart import worker_environment

    mimalloc = {"MIMALLOC_PURGE_DELAY": "1000"}
    dask_default = {"MALLOC_TRIM_THRESHOLD_": 65536, "OMP_NUM_THREADS": 1}
    assert worker_environment(dask_default) == {"MALLOC_TRIM_THRESHOLD_": str(32 * 2**20),
                                                "MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "OMP_NUM_THREADS": "1", **mimalloc}
    assert worker_environment({"MALLOC_TRIM_THRESHOLD_": 0, "OMP_NUM_THREADS": 4},
                              inherited={"MIMALLOC_PURGE_DELAY": "50", "PATH": "/bin"}) == {
        "MALLOC_TRIM_THRESHOLD_": "0", "OMP_NUM_THREADS": "4", **mimalloc, "MIMALLOC_PURGE_DELAY": "50"}


def test_start_up_pauses_the_garbage_collector_and_freezes_what_it_made():
    """``prestart.gc_paused``: the collector is off inside the block, on again after it with what
    the block made frozen, also when the block raises; a block inside another, or where the
    collector was off already, leaves it as it found it."""
    import gc

    from tokenshards.cluster.prestart import gc_paused

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        with gc_paused():
            assert not gc.isenabled()
            made = [[i] for i in range(1_000)]
            with gc_paused():
                assert not gc.isenabled()
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(made)
        with pytest.raises(ValueError, match="in start-up"), gc_paused():
            raise ValueError("in start-up")
        assert gc.isenabled()
        gc.disable()
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
        gc.unfreeze()


@pytest.mark.parametrize("command, runs", [
    (["tokenize", "--out", "o"], "run_tokenize_each"),
    (["export", "o", "--to", "d", "--format", "nanogpt"], "run_export"),
    (["verify", "o"], "run_verify"),
    (["train-bpe", "--out", "v.tiktoken"], "run_train_bpe"),
])
def test_each_cluster_command_names_the_job_it_imports_at_start_up(command, runs):
    """The command line imports the command's job module while a local cluster's forkserver starts,
    with the collector paused (``cli._prestart_local_workers``): it must be the module holding the
    function the command runs."""
    import importlib

    from tokenshards.cli import build_parser

    args, _ = build_parser().parse_known_args(command)
    assert callable(getattr(importlib.import_module(args.command_module), runs))


def test_default_local_cluster_has_a_worker_per_core():
    """No --workers, --scheduler or --cluster: what `make tokenize` runs on."""
    import os

    from tokenshards.cluster.connect import connect

    said = []
    with connect(dashboard_address=":0", announce=said.append) as client:
        workers = client.scheduler_info(n_workers=-1)["workers"]
    assert len(workers) == (os.cpu_count() or 1)
    assert said and said[0].startswith("dashboard: ") and "process worker" in said[0]


def test_a_taken_dashboard_port_gives_another_without_a_leaked_socket():
    """distributed, finding the dashboard's port taken, binds another but leaks the socket it tried
    (a ResourceWarning: an error in this suite). ``connect`` asks for any free port instead, and the
    link it announces is the dashboard's real one."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = []
        with connect(workers=1, dashboard_address=f"127.0.0.1:{port}", announce=said.append) as client:
            link = client.dashboard_link
    assert f":{port}/" not in link and link.startswith("http://127.0.0.1:"), link
    assert said[0].startswith(f"dashboard: {link}"), said


def test_no_dashboard_starts_none_and_takes_no_fixed_port(tmp_path):
    """--no-dashboard: the local cluster's scheduler serves no dashboard, and its other routes
    (health) listen on a free loopback port, never 8787; the first line says the dashboard is off.
    Refused beside --dashboard-address in one line."""
    said = []
    with connect(workers=1, dashboard_address=None, announce=said.append) as client:
        port = client.cluster.scheduler.http_server.port
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=10) as answer:
            assert answer.read() == b"ok"
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10)
        missing.value.close()  # the error holds the response's socket
        assert missing.value.code == 404
    assert port != 8787
    assert said[0] == "dashboard: off  (local cluster: 1 process worker)", said
    proc = subprocess.run([str(Path(sys.executable).with_name("tokenshards")), "verify", str(tmp_path), "--no-dashboard",
                           "--dashboard-address", ":0"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "not allowed with argument --no-dashboard" in proc.stderr.splitlines()[-1], proc.stderr
