"""The rest of issue 45, each through the real ``tokenshards`` binary: error paths that cancel
futures print one line and none of distributed's noise; no write probe or empty ``parts/`` left
behind; an interrupted export told the truth; a fixed-width progress line; integer plot ticks;
SIGTERM without a leaked-semaphore warning; ``verify --deep`` never echoing what a manifest says
of files outside OUT; and every command's documented failure cases without a traceback."""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import write_parquet

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))
TIMEOUT = 180
QUIET = ("--progress", "none", "--no-dashboard")


def _cli(*argv: str, timeout: int = TIMEOUT, env: dict | None = None, cwd=None) -> tuple[int, str]:
    proc = subprocess.run([TOKENSHARDS, *argv], capture_output=True, text=True, timeout=timeout, cwd=cwd,
                          env=None if env is None else {**os.environ, **env})
    return proc.returncode, proc.stdout + proc.stderr


def _one_line(code: int, printed: str, *needles: str) -> str:
    """A non-zero exit, no traceback nor distributed's noise, and one error line holding every needle."""
    assert "Traceback" not in printed and "Task exception was never retrieved" not in printed, printed
    assert code != 0, printed
    errors = [line for line in printed.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(errors) == 1, printed
    for needle in needles:
        assert needle in errors[0], printed
    return errors[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("more-in")
    write_parquet(root / "a.parquet", {"text": [f"document {i}: " + "words and more words " * (5 + i % 40)
                                                for i in range(400)]}, row_group_size=20)
    return root / "a.parquet"


@pytest.fixture(scope="module")
def small_run(corpus, tmp_path_factory, cluster) -> Path:
    out = tmp_path_factory.mktemp("more-run") / "out"
    code, printed = _cli("tokenize", "--input", str(corpus), "--out", str(out), "--scheduler", cluster.scheduler_address,
                         "--partition-mb", "0.02", "--progress", "none")
    assert code == 0, printed
    return out


# -- the progress line keeps its width ---------------------------------------------------------------

def test_the_progress_bar_keeps_its_width(corpus, tmp_path):
    # The same documents in five files: small partitions of one input share a task (tokenize.groups),
    # so the bar moves once per file here, and draws several frames to compare.
    table = pq.read_table(corpus)
    for i in range(5):
        write_parquet(tmp_path / "in" / f"{i}.parquet", {"text": table.column("text").to_pylist()[i * 80:(i + 1) * 80]},
                      row_group_size=20)
    code, printed = _cli("tokenize", "--input", str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--workers", "1",
                         "--partition-mb", "0.005", "--progress", "bar", "--no-dashboard",
                         env={"COLUMNS": "150"})
    assert code == 0 and "Traceback" not in printed, printed
    frames = [f.removesuffix("\x1b[K") for line in printed.splitlines() if "partitions " in line and "%" in line
              for f in line.split("\r") if f.strip()]
    assert len(frames) >= 4 and len({len(f) for f in frames}) == 1, frames


# -- the plot counts whole documents -------------------------------------------------------------------

def _tick_labels(svg: str, axis: str) -> list[str]:
    """The text of each major tick label on ``axis`` ('x' or 'y'): matplotlib's SVG keeps each
    text as a comment in its tick's group."""
    labels = []
    for group in re.split(rf'<g id="{axis}tick_\d+">', svg)[1:]:
        said = re.search(r"<!-- (.*?) -->", group)
        if said:
            labels.append(said.group(1))
    return labels


def test_the_plot_counts_whole_documents(tmp_path, cluster):
    """Five documents, one per length: the y axis says 0 and 1 (and nothing between), not
    0, 0, 0, 1, 1, 1 for ticks at 0.2 steps."""
    write_parquet(tmp_path / "few.parquet", {"text": ["one", "one two three", "a b c d e f g h", "x " * 30, "y " * 90]})
    code, printed = _cli("tokenize", "--input", str(tmp_path / "few.parquet"), "--out", str(tmp_path / "run"),
                         "--scheduler", cluster.scheduler_address, "--progress", "none")
    assert code == 0, printed
    code, printed = _cli("inspect", str(tmp_path / "run"), "--plot", str(tmp_path / "lengths.svg"))
    assert code == 0 and "Traceback" not in printed, printed
    ticks = _tick_labels((tmp_path / "lengths.svg").read_text(), "y")
    assert ticks and all(re.fullmatch(r"\d+", t) for t in ticks), ticks
    assert len(set(ticks)) == len(ticks) and ticks == sorted(ticks, key=int), ticks


# -- an interrupted export is told the truth -------------------------------------------------------------

def _interrupt_when(argv: list[str], seen: str, *, timeout: int = TIMEOUT, signum: int = signal.SIGINT) -> tuple[int, str]:
    """Run the command, send ``signum`` to it alone (as a terminal's Ctrl-C reaches it: its workers
    ignore SIGINT) once its stderr shows ``seen``; its exit code and everything it printed."""
    return _act_when(argv, seen, lambda proc: proc.send_signal(signum), timeout=timeout)


def _act_when(argv: list[str], seen: str, act, *, timeout: int = TIMEOUT) -> tuple[int, str]:
    """Run the command and call ``act(proc)`` once, when its stderr first shows ``seen``; its exit
    code and everything it printed."""
    err: list[str] = []
    with subprocess.Popen([TOKENSHARDS, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        def read():
            acted = False
            for line in proc.stderr:
                err.append(line)
                if seen in line and not acted and proc.poll() is None:
                    acted = True
                    act(proc)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        out = proc.stdout.read()
        proc.wait(timeout=timeout)
        reader.join(timeout=10)
    return proc.returncode, out + "".join(err)


def test_an_interrupted_export_is_not_told_to_resume(small_run, tmp_path):
    dest = tmp_path / "dest"
    code, printed = _interrupt_when(["export", str(small_run), "--format", "npy", "--to", str(dest), "--val-tokens", "100",
                                     "--workers", "1", "--progress", "log", "--no-dashboard"], "dashboard:")
    assert code == 130 and "Traceback" not in printed, printed
    said = [line for line in printed.splitlines() if line.startswith("tokenshards: interrupted")]
    assert said == [f"tokenshards: interrupted; an export does not resume: {dest} may hold part of this one (files "
                    "without their record, which no trainer should read); rerun with --overwrite to replace them"], printed
    assert "resume" not in said[0].replace("does not resume", "")
    code, printed = _cli("export", str(small_run), "--format", "npy", "--to", str(dest), "--val-tokens", "100",
                         "--workers", "1", "--overwrite", *QUIET)
    assert code == 0, printed
    assert (dest / "fineweb_export.json").is_file()


def test_sigterm_stops_tokenize_cleanly(corpus, tmp_path):
    """SIGTERM takes Ctrl-C's way out: the cluster closed in order, exit 143, one line, and no
    leaked-semaphore warning from multiprocessing's resource tracker; the run then resumes."""
    out = tmp_path / "out"
    argv = ["tokenize", "--input", str(corpus), "--out", str(out), "--workers", "2", "--partition-mb", "0.005",
            "--progress", "log", "--no-dashboard"]
    code, printed = _interrupt_when(argv, " ETA ", signum=signal.SIGTERM)  # the first progress line
    assert code == 143 and "Traceback" not in printed, printed
    assert "leaked semaphore" not in printed and "resource_tracker" not in printed, printed
    assert [line for line in printed.splitlines() if line.startswith("tokenshards: ")] == [
        "tokenshards: terminated (SIGTERM); committed partitions are kept, rerun the same command to resume"], printed
    code, printed = _cli(*argv)
    assert code == 0 and "already committed" in printed, printed


# -- a full disk leaves no write probe; a run that stops before its first partition leaves nothing ------

def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c",
                            "mount -t tmpfs tokenshards-probe /mnt"], capture_output=True)
    return probe.returncode == 0


FULL_DISK = r'''
set -u
mount -t tmpfs -o size=1m tokenshards-full "$DISK"
dd if=/dev/zero of="$DISK/fill" bs=64k 2>/dev/null
"$TS" tokenize --input "$IN" --out "$DISK/out" --workers 1 --progress none --no-dashboard
echo "@tokenize $?"
"$TS" export "$RUN" --format npy --to "$DISK/exp" --val-tokens 100 --workers 1 --progress none --no-dashboard
echo "@export $?"
echo "@left $(cd "$DISK" && ls -A | tr '\n' ' ')"
rm "$DISK/fill"
mount -o remount,size=64m "$DISK"
mkdir "$DISK/out"
touch -d '1 hour ago' "$DISK/out/.tokenshards-write-probe-0123.4567.tmp" "$DISK/out/.tokenshards-write-probe-89ab"
"$TS" tokenize --input "$IN" --out "$DISK/out" --workers 1 --progress none --no-dashboard >/dev/null
echo "@again $?"
echo "@then $(cd "$DISK/out" && ls -A | tr '\n' ' ')"
'''


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs `unshare --mount` and tmpfs mounts (root)")
def test_a_full_disk_leaves_no_write_probe(corpus, small_run, tmp_path):
    """A tmpfs filled to the last byte: tokenize and export each refuse in one line, leaving no
    ``.tokenshards-write-probe-*`` (nor an empty OUT); the next successful run clears probes an
    earlier one left."""
    disk = tmp_path / "disk"
    disk.mkdir()
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", FULL_DISK],
                          capture_output=True, text=True, timeout=2 * TIMEOUT,
                          env={**os.environ, "DISK": str(disk), "TS": TOKENSHARDS, "IN": str(corpus), "RUN": str(small_run)})
    said = dict(line[1:].split(" ", 1) for line in proc.stdout.splitlines() if line.startswith("@"))
    assert said.get("tokenize", "0") != "0" and said.get("export", "0") != "0", proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("tokenshards: error: ")]
    assert len(errors) == 2 and all("No space left on device" in e and "free some space" in e for e in errors), proc.stderr
    assert said["left"].split() == ["fill"], said  # no out/, no exp/ probe, nothing else
    assert said["again"] == "0", proc.stdout + proc.stderr
    assert "write-probe" not in said["then"] and "manifest.json" in said["then"], said


@pytest.fixture(scope="module")
def unreadable(tmp_path_factory) -> Path:
    """Its footer reads (planned), its pages do not (every task fails)."""
    from conftest import corrupt_data_pages

    root = tmp_path_factory.mktemp("unreadable")
    return corrupt_data_pages(write_parquet(root / "broken.parquet", {"text": [f"text {i} " * 50 for i in range(200)]}))


@pytest.mark.parametrize("case", ["unknown encoding", "unreadable parquet", "missing text column"])
@pytest.mark.parametrize("folder", ["new", "empty"])
def test_a_run_that_stops_before_its_first_partition_leaves_nothing(corpus, unreadable, tmp_path, case, folder, cluster):
    """No parts/, no job file, no OUT it made: `verify OUT` finds no run to resume, and the same
    OUT takes the fixed command at once. A new OUT's run has a local cluster of its own to stop;
    an empty OUT's, and the fixed command, run on the session's cluster."""
    on_cluster = ("--scheduler", cluster.scheduler_address, "--progress", "none")
    out = tmp_path / "out"
    if folder == "empty":
        out.mkdir()
    argv = {"unknown encoding": ["--input", str(corpus), "--encoding", "nosuch"],
            "unreadable parquet": ["--input", str(unreadable)],
            "missing text column": ["--input", str(corpus), "--text-column", "nosuch"]}[case]
    code, printed = _cli("tokenize", *argv, "--out", str(out), *(("--workers", "1", *QUIET) if folder == "new" else on_cluster))
    _one_line(code, printed)
    if folder == "new":
        assert not out.exists(), sorted(p.name for p in out.rglob("*"))
    else:
        assert out.is_dir() and not list(out.iterdir()), sorted(p.name for p in out.rglob("*"))
    line = _one_line(*_cli("verify", str(out), "--scheduler", "tcp://127.0.0.1:9"), "no manifest.json")
    assert "resume" not in line, line
    code, printed = _cli("tokenize", "--input", str(corpus), "--out", str(out), *on_cluster)
    assert code == 0, printed


def test_a_failure_after_a_committed_partition_keeps_it_for_resume(corpus, unreadable, tmp_path):
    """--partition-mb small enough that the good file commits partitions before the broken one
    fails: what was committed stays, with the job file, and verify says to resume."""
    out = tmp_path / "out"
    code, printed = _cli("tokenize", "--input", str(corpus), str(unreadable), "--out", str(out), "--workers", "1",
                         "--partition-mb", "0.02", *QUIET)
    _one_line(code, printed, "broken.parquet")
    if not list((out / "parts").glob("part-*.done.json")):
        pytest.skip("the broken file's partition failed before any other committed")
    assert (out / "tokenshards-job.json").is_file()


# -- verify --deep never describes a file a manifest points at ---------------------------------------------

def _point_inputs_at(run: Path, copy: Path, target: str) -> None:
    shutil.copytree(run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    old = manifest["inputs"][0]["path"]
    manifest["inputs"][0]["path"] = target
    for entry in manifest["partitions"]:
        if entry["input"] == old:
            entry["input"] = target
    (copy / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("target", ["shadow", "fifo", "other parquet"])
def test_verify_deep_never_echoes_an_inputs_size_or_time(small_run, tmp_path, target):
    """A manifest whose input is /etc/shadow (or a secret of the same kind), a FIFO, or another
    parquet file: one line per input, never its size, mtime or bytes; a FIFO is never opened."""
    secret = Path("/etc/shadow")
    if target == "shadow" and not secret.is_file():
        secret = tmp_path / "shadow"
        secret.write_text("root:x:19000:0:99999:7:::\n")
        secret.chmod(0o600)
    path = {"shadow": secret, "fifo": tmp_path / "pipe", "other parquet": tmp_path / "other.parquet"}[target]
    if target == "fifo":
        os.mkfifo(path)
    elif target == "other parquet":
        write_parquet(path, {"text": ["something else entirely"] * 3})
    _point_inputs_at(small_run, tmp_path / "copy", str(path))
    code, printed = _cli("verify", str(tmp_path / "copy"), "--deep", "20", "--workers", "1", *QUIET, timeout=120)
    assert code == 1 and "Traceback" not in printed, printed
    about = [line for line in printed.splitlines() if str(path) in line and "disagrees with manifest.json" not in line]
    info = os.stat(path)
    for line in about:
        assert str(info.st_size) not in line.split(str(path), 1)[1] and str(info.st_mtime_ns) not in line, line
        assert not re.search(r"(size|mtime_ns) \d", line) and "root:" not in line and "→" not in line, line
    if target == "other parquet":
        assert about and all("its mtime_ns and size differ from what the run recorded" in line for line in about), about
    else:
        want = "is not a regular file (a FIFO); it is not opened" if target == "fifo" else "is not a parquet file"
        assert about == [f"problem: input {path}: {want}; --deep compared none of its documents"], printed


# -- error paths that give up futures print one line, none of distributed's noise -------------------------

def test_a_damaged_part_under_a_tree_of_tasks_is_one_line(small_run, tmp_path):
    """A docs file damaged in place (its size kept) fails one leaf of the validation tree (more
    than 8 partitions: inner nodes no client holds). Cancelling that tree tripped ``assert
    ts.who_wants`` in distributed's scheduler: "Task exception was never retrieved" and a traceback
    before the error; and the cause's own line break split the error line."""
    copy = tmp_path / "copy"
    shutil.copytree(small_run, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    assert len(manifest["partitions"]) > 8, "the validation tree needs an inner level"
    victim = copy / manifest["partitions"][len(manifest["partitions"]) // 2]["docs_file"]
    raw = bytearray(victim.read_bytes())
    raw[8:len(raw) - 200] = b"\xff" * (len(raw) - 208)
    victim.write_bytes(bytes(raw))
    for shuffle in ((), ("--shuffle",)):
        code, printed = _cli("export", str(copy), "--format", "npy", "--to", str(tmp_path / "dest"), "--val-tokens", "100",
                             "--workers", "2", *shuffle, *QUIET)
        line = _one_line(code, printed, victim.name, "unreadable")
        assert printed.rstrip().endswith(line) and "AssertionError" not in printed, printed


@pytest.mark.parametrize("replacement", ["gone", "another run"])
def test_an_export_whose_run_is_replaced_while_it_reads_says_so(small_run, tmp_path, replacement):
    """What `tokenize --overwrite` of the run does to an export reading it, made certain: once the
    export's cluster is up (its manifest read), the run goes away, or another run takes its place.
    One line saying the run was replaced (not "the output is damaged"), no record written."""
    run = tmp_path / "run"
    shutil.copytree(small_run, run)
    dest = tmp_path / "dest"

    def replace(proc):
        os.rename(run, tmp_path / "old")
        if replacement == "another run":
            shutil.copytree(tmp_path / "old", run)  # same files, a new manifest.json (what a rerun writes)

    code, printed = _act_when(["export", str(run), "--format", "npy", "--to", str(dest), "--val-tokens", "100",
                               "--workers", "2", *QUIET], "dashboard:", replace)
    _one_line(code, printed, f"{run} was replaced while it was read",
              "is gone" if replacement == "gone" else "changed", "export it again")
    assert "damaged" not in printed and not (dest / "fineweb_export.json").exists(), printed


def test_a_rerun_writes_a_damaged_manifest_again_from_the_done_records(corpus, small_run, tmp_path, cluster):
    """The done records commit a run; its manifest is written from them. A rerun of the same command
    over a finished run whose manifest was edited (a negative count) rewrites it as it was, and
    verify says OK (docs/guide/tokenize.md, "Resuming")."""
    out = tmp_path / "out"
    shutil.copytree(small_run, out)
    good = json.loads((out / "manifest.json").read_text())
    damaged = json.loads(json.dumps(good))
    damaged["partitions"][0]["tokens"] = -5
    (out / "manifest.json").write_text(json.dumps(damaged))
    code, printed = _cli("tokenize", "--input", str(corpus), "--out", str(out), "--scheduler", cluster.scheduler_address,
                         "--partition-mb", "0.02", "--progress", "none")
    assert code == 0 and "nothing to tokenize" in printed, printed
    again = json.loads((out / "manifest.json").read_text())
    assert again["partitions"] == good["partitions"] and again["totals"] == good["totals"]
    code, printed = _cli("verify", str(out), "--scheduler", cluster.scheduler_address, "--progress", "none")
    assert code == 0 and "OK" in printed, printed


# -- every command's failure cases, none with a traceback ---------------------------------------------------

def _hostile_copies(run: Path, root: Path) -> dict[str, Path]:
    """Copies of a real run, each broken as tests/test_hostile.py breaks them."""
    copies = {}

    def copy(name: str, change=None) -> Path:
        out = root / name
        shutil.copytree(run, out)
        if change is not None:
            manifest = json.loads((out / "manifest.json").read_text())
            change(manifest)
            (out / "manifest.json").write_text(json.dumps(manifest))
        copies[name] = out
        return out

    copy("negative", lambda m: m["partitions"][0].__setitem__("tokens", -5))
    copy("huge", lambda m: m["partitions"][0].__setitem__("tokens", 10**30))
    copy("dtype", lambda m: m["encoding"].__setitem__("dtype", "float64"))
    copy("passwd", lambda m: m["partitions"][0].__setitem__("tokens_file", "/etc/passwd"))
    copy("escape", lambda m: m["partitions"][1].__setitem__("docs_file", "../x/parts/part-00000.docs.parquet"))
    fifo = copy("fifo")
    (fifo / "manifest.json").unlink()
    os.mkfifo(fifo / "manifest.json")
    return copies


def test_no_command_prints_a_traceback_for_a_mistake(corpus, small_run, tmp_path):
    """Every command's documented failure cases (tests/test_hostile.py, tests/test_everyday_mistakes.py
    and a few more): each exits non-zero, and none prints a Python traceback or distributed's
    "Task exception was never retrieved"."""
    bad = _hostile_copies(small_run, tmp_path / "hostile")
    bad_to_grow = _hostile_copies(small_run, tmp_path / "hostile-grown")  # tokenize --add takes OUT's lease: copies of its own
    a_file = tmp_path / "taken.txt"
    a_file.write_text("mine")
    data = corpus.parent
    nothing = str(tmp_path / "nothing")
    offline = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_DISABLE_TELEMETRY": "1"}
    no_scheduler = ("--scheduler", "tcp://127.0.0.1:9")
    cases: dict[str, tuple[list[str], dict | None]] = {
        # tokenize
        "tokenize: no such input": (["tokenize", "--input", nothing, "--out", str(tmp_path / "o1"), *QUIET], None),
        "tokenize: unknown encoding": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o2"),
                                        "--encoding", "nosuch", *QUIET], None),
        "tokenize: no such text column": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o3"),
                                           "--text-column", "nosuch", "--workers", "1", *QUIET], None),
        "tokenize: --out inside --input": (["tokenize", "--input", str(data), "--out", str(data / "out"), *QUIET], None),
        "tokenize: --out an existing file": (["tokenize", "--input", str(corpus), "--out", str(a_file), *QUIET], None),
        "tokenize: --partition-mb nan": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o4"),
                                          "--partition-mb=nan", *no_scheduler], None),
        "tokenize: --dashboard-address notaport": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o5"),
                                                    "--dashboard-address", "notaport"], None),
        "tokenize: the dashboard's URL as --scheduler": (["tokenize", "--input", str(corpus), "--out",
                                                          str(tmp_path / "o6"), "--scheduler", "http://127.0.0.1:8787"], None),
        "tokenize: --scheduler with --workers": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o7"),
                                                  *no_scheduler, "--workers", "4"], None),
        "tokenize: misspelled option": (["tokenize", "--inptu", str(corpus), "--out", str(tmp_path / "o8")], None),
        "tokenize: more --encoding than --out": (["tokenize", "--input", str(corpus), "--out", str(tmp_path / "o9"),
                                                  "--encoding", "gpt2", "cl100k_base"], None),
        # --add reads OUT's manifest (through the one reader) before any cluster: without it, tokenize
        # rebuilds the manifest from the done records and never reads it (this case once only waited
        # 15 s for the unreachable scheduler, and never read the hostile run it names).
        **{f"tokenize --add: hostile manifest ({name})": (["tokenize", "--add", "--input", str(corpus), "--out",
                                                         str(bad_to_grow[name]), *no_scheduler], None)
           for name in ("negative", "fifo")},
        # export
        "export: no such run": (["export", nothing, "--format", "npy", "--to", str(tmp_path / "e1")], None),
        "export: --to an existing file": (["export", str(small_run), "--format", "npy", "--to", str(a_file)], None),
        "export: --to the run itself": (["export", str(small_run), "--format", "npy", "--to", str(small_run / "parts")], None),
        "export: --tokens 1T": (["export", str(small_run), "--format", "npy", "--to", str(tmp_path / "e2"),
                                 "--tokens", "1T", "--workers", "1", *QUIET], None),
        "export: --val-tokens over the run": (["export", str(small_run), "--format", "npy", "--to", str(tmp_path / "e3"),
                                               "--val-tokens", "10G", *QUIET], None),
        "export: --staging without hf://": (["export", str(small_run), "--format", "npy", "--to", str(tmp_path / "e4"),
                                             "--staging", str(tmp_path / "s")], None),
        "export: unknown format": (["export", str(small_run), "--format", "nosuch", "--to", str(tmp_path / "e5")], None),
        **{f"export: hostile manifest ({name})": (["export", str(path), "--format", "llmc", "--to", str(tmp_path / f"e-{name}"),
                                                   "--val-tokens", "100", *no_scheduler], None)
           for name, path in bad.items()},
        "export --shuffle: negative counts": (["export", str(bad["negative"]), "--format", "npy", "--shuffle", "--to",
                                               str(tmp_path / "e6"), *no_scheduler], None),
        # verify
        "verify: no such folder": (["verify", nothing, *no_scheduler], None),
        "verify: an input folder": (["verify", str(data), *no_scheduler], None),
        "verify: --deep -1": (["verify", str(small_run), "--deep", "-1"], None),
        "verify: --dashboard-address :99999": (["verify", str(small_run), "--dashboard-address=:99999"], None),
        **{f"verify: hostile manifest ({name})": (["verify", str(path), *no_scheduler], None) for name, path in bad.items()},
        # inspect
        "inspect: no such folder": (["inspect", nothing], None),
        "inspect: --plot lengths.gif": (["inspect", str(small_run), "--plot", str(tmp_path / "lengths.gif")], None),
        **{f"inspect: hostile manifest ({name})": (["inspect", str(path)], None) for name, path in bad.items()},
        # train-bpe
        "train-bpe: no such input": (["train-bpe", "--input", nothing, "--out", str(tmp_path / "v.tiktoken")], None),
        "train-bpe: --vocab-size 10": (["train-bpe", "--input", str(corpus), "--out", str(tmp_path / "v.tiktoken"),
                                        "--vocab-size", "10"], None),
        "train-bpe: --out under a file": (["train-bpe", "--input", str(corpus), "--out", str(a_file / "v.tiktoken")], None),
        "train-bpe: a broken --pattern": (["train-bpe", "--input", str(corpus), "--out", str(tmp_path / "v.tiktoken"),
                                           "--pattern", "("], None),
        # download
        "download: no --dataset": (["download"], None),
        "download: the Hub unreachable": (["download", "--dataset", "nosuch/repo", "--size", "10B", "--to",
                                           str(tmp_path / "dl")], offline),
        # demo-corpus
        "demo-corpus: --to an existing file": (["demo-corpus", "--to", str(a_file)], None),
        "demo-corpus: --to where no folder can be made": (["demo-corpus", "--to", "/proc/tokenshards-demo"], None),
        "no command at all": ([], None),
    }
    # The commands are separate processes that mostly wait (start-up, a refused connection): three
    # at a time, each in its own output folder, they take a third of the wall time.
    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        ran = {name: pool.submit(_cli, *argv, env=env, timeout=120) for name, (argv, env) in cases.items()}
    printed_tracebacks = {}
    for name, future in ran.items():
        code, printed = future.result()
        if code == 0 or "Traceback" in printed or "Task exception was never retrieved" in printed:
            printed_tracebacks[name] = (code, printed[-2000:])
    assert not printed_tracebacks, "\n\n".join(f"{name} (exit {code}):\n{text}"
                                               for name, (code, text) in printed_tracebacks.items())
    assert a_file.read_text() == "mine"
