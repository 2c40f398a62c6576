"""Issue 55: a fuzzer of runs. Hypothesis mutates a finished run and an unfinished one (manifest
fields, types and paths; docs tables; ``.npy`` headers and bytes; job, done and lease records; file
kinds: symlink, FIFO, folder, missing), and every reading command runs on it in this process
(``tokenshards.cli.main``: verify, inspect, export --format npy, tokenize's resume; and
``TokenDataset``; ``make fuzz`` also reruns tokenize on the damaged finished run). Each either gives the pristine run's result byte for byte or refuses in one line
(verify: exit 1 listing problems): never exit 0 with other bytes, never a traceback, never a hang
(an alarm fails the example).

``make test`` runs a short, fixed (derandomized) budget; ``make fuzz`` a long random one
(``TOKENSHARDS_FUZZ_EXAMPLES``). Every failing example ever found stays below as an ``@example``.

Mutations are plain data, so that an example reads as what it does. A JSON path's steps are keys,
or ints taken modulo the size of the object or list at that step. What a "careful vandal" does
(``fix``: the sha256 and size of a changed file rewritten in its records too) is only drawn for
changes that break what a file must be (a header, a shape, a docs table's layout): a value changed
and re-signed consistently is another run, which no reader can tell from this one. Likewise, a few
manifest fields are recorded nowhere else (``MANIFEST_ONLY``): changed, they are another run's
metadata; for them the token data (the exported shards, ``TokenDataset``'s documents) must still be
the pristine run's, or refused.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import stat
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from pydoc_data.topics import topics

from conftest import write_parquet
from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.format import v1
from tokenshards.format.reader import TokenDataset

LONG = int(os.environ.get("TOKENSHARDS_FUZZ_EXAMPLES", "0"))
"""``make fuzz``: examples per test (random); 0: the short, fixed budget of ``make test``."""
TIMEOUT = 60
"""Seconds one command may take before it counts as a hang."""
PARTS = 5
LEASE = ".tokenshards-lease.json"
MANIFEST_ONLY = ("id_column", "backend", "skipped_inputs", "hub", "chat", "inputs_without_id_column")
"""Manifest keys no other file of a run records (nor ``inputs[*]``'s ``name``, ``identity`` and
``generation``, nor keys this version does not know)."""
DELETE = "<delete>"
TEXTS = [topics[name][:1500] for name in sorted(topics)[30:42]]


def budget(short: int):
    return settings(max_examples=LONG or short, deadline=None, derandomize=not LONG, database=None if not LONG else
                    settings.default.database, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.function_scoped_fixture])


# -- mutations, as data ----------------------------------------------------------------------------

RECORDS = ("manifest.json", v1.JOB_FILE, "done", LEASE)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
    st.sampled_from([0, -1, 1, -5, 2**31, 2**32, 2**53, 2**63, 2**64, 10**30, 1.5, "", "../x", "/etc/passwd",
                     "parts/part-00001.tokens.npy", "parts/part-00000.docs.parquet", "manifest.json", "s3://b/k",
                     "uint32", ">u2", "0" * 64, "f" * 64, "prefix", "suffix", "none", "gpt2", "tokenshards/1"]))
VALUES = st.one_of(st.just(DELETE), st.recursive(SCALARS, lambda c: st.lists(c, max_size=3)
                                                 | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=5))
STEPS = st.lists(st.one_of(st.integers(0, 40), st.sampled_from(["partitions", "encoding", "inputs", "totals", "x"])),
                 min_size=1, max_size=4).map(tuple)
PART = st.integers(0, PARTS - 1)

json_set = st.tuples(st.just("json"), st.sampled_from(RECORDS), PART, STEPS, VALUES)
json_raw = st.tuples(st.just("json-raw"), st.sampled_from(RECORDS), PART,
                     st.sampled_from(["truncate", "garbage", "deep", "null", "empty", "nan", "huge-int"]),
                     st.integers(0, 10**6))
docs_ops = st.sampled_from(["start", "length", "row", "null:start", "null:length", "null:row", "null:id", "drop:start",
                            "drop:id", "int32:length", "float:start", "string:row", "drop-row", "dup-row", "swap-rows"])
docs = st.tuples(st.just("docs"), PART, docs_ops, st.integers(0, 10**6), st.integers(-3, 3), st.booleans())
ids = st.tuples(st.just("docs"), PART, st.just("id"), st.integers(0, 10**6), st.integers(-3, 3), st.just(False))
npy = st.tuples(st.just("npy"), PART, st.sampled_from(["<u2", ">u2", "<u4", "<i2", "|u1", "<f2", "<u8"]),
                st.sampled_from(["same", "column", "row", "plus1", "minus1", "scalar", "fortran"]), st.booleans())
raw_bytes = st.tuples(st.just("bytes"), st.sampled_from(["tokens", "docs"]), PART,
                      st.sampled_from(["flip", "truncate", "append"]), st.integers(0, 10**6))
kinds = st.tuples(st.just("kind"), st.sampled_from(["manifest.json", v1.JOB_FILE, "done", "tokens", "docs", "parts",
                                                    LEASE]), PART,
                  st.sampled_from(["missing", "folder", "fifo", "link-outside", "link-outside-fifo", "link-other",
                                   "link-dangling", "link-inside-same"]))
MUTATIONS = st.one_of(json_set, json_raw, docs, ids, npy, raw_bytes, kinds)


def apply(mutation: tuple, out: Path, outside: Path) -> bool:
    """Make ``mutation`` in the run in ``out`` (``outside``: a folder beside it). False when it does
    not apply here (the manifest of an unfinished run)."""
    kind = mutation[0]
    if kind in ("json", "json-raw"):
        name = _record(mutation[1], mutation[2])
        path = out / name
        if name == LEASE and not path.exists():
            path.write_text(json.dumps(STALE_LEASE))
        if not path.exists():
            return False
        if kind == "json":
            before = json.loads(path.read_text())
            after = _set(json.loads(path.read_text()), mutation[3], mutation[4])
            if after == before and type(after) is type(before):
                return False  # no change (a key that is not there deleted): the file keeps its bytes
            path.write_text(json.dumps(after))
        else:
            path.write_bytes(_raw(path.read_bytes(), mutation[3], mutation[4]))
        return True
    if kind == "docs":
        return _docs(out, *mutation[1:])
    if kind == "npy":
        return _npy(out, *mutation[1:])
    if kind == "bytes":
        _, what, part, op, at = mutation
        path = out / (v1.tokens_file(part) if what == "tokens" else v1.docs_file(part))
        raw = bytearray(path.read_bytes())
        if op == "flip":
            raw[at % len(raw)] ^= 0x01
        elif op == "truncate":
            raw = raw[:at % len(raw)]
        else:
            raw += bytes([at % 256]) * (1 + at % 7)
        path.write_bytes(bytes(raw))
        return True
    _, target, part, how = mutation
    name = "parts" if target == "parts" else _record(target, part) if target in RECORDS else (
        v1.tokens_file(part) if target == "tokens" else v1.docs_file(part))
    path = out / name
    if not path.exists() and target != LEASE:
        return False
    if how.startswith("link") or how in ("missing", "folder", "fifo"):
        saved = outside / f"copy-{path.name}"
        if path.is_dir():
            shutil.copytree(path, saved, dirs_exist_ok=True)
            shutil.rmtree(path)
        elif path.exists():
            shutil.copy(path, saved)
            path.unlink()
    if how == "folder":
        path.mkdir()
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "link-outside":
        path.symlink_to(saved if saved.exists() else outside)
    elif how == "link-outside-fifo":
        path.symlink_to(outside / "fifo")
    elif how == "link-dangling":
        path.symlink_to(outside / "gone")
    elif how == "link-other":  # another file of the run, of the same kind
        other = {"tokens": v1.tokens_file((part + 1) % PARTS), "docs": v1.docs_file((part + 1) % PARTS),
                 "done": v1.done_file((part + 1) % PARTS)}.get(target, "manifest.json" if name != "manifest.json"
                                                                  else v1.JOB_FILE)
        path.symlink_to(out / other)
    elif how == "link-inside-same":  # the same bytes, reached through a link that stays inside OUT
        if not saved.exists():
            return False
        inside = out / f"{path.name}.real"
        (shutil.copytree if saved.is_dir() else shutil.copy)(saved, inside)
        path.symlink_to(inside)
    return True


STALE_LEASE = {"run": "r", "command": "tokenize", "host": "elsewhere", "pid": 4242, "started": 1.0, "renewed": 1.0,
               "ttl": 120.0, "space": "another machine"}


def _record(target: str, part: int) -> str:
    return v1.done_file(part) if target == "done" else target


KEYS: list = []
"""The keys the last JSON mutation reached (``_set``), for the judge."""


def _set(doc, steps: tuple, value):
    """``doc`` with the node ``steps`` lead to set to ``value`` (or deleted)."""
    KEYS.clear()
    if not isinstance(doc, (dict, list)) or not steps:
        return value if value != DELETE else None
    node, parent, key = doc, None, None
    for step in steps:
        if isinstance(node, dict) and node:
            key = step if isinstance(step, str) else sorted(node)[step % len(node)]
        elif isinstance(node, list) and node:
            key = step % len(node) if isinstance(step, int) else 0
        else:
            break
        parent = node
        KEYS.append(key)
        if isinstance(node, dict) and key not in node:
            break
        node = node[key]
    if parent is None:
        return doc
    if value == DELETE:
        if isinstance(parent, dict):
            parent.pop(key, None)
        else:
            del parent[key]
    else:
        parent[key] = value
    return doc


def _raw(raw: bytes, op: str, at: int) -> bytes:
    return {"truncate": raw[:at % max(len(raw), 1)], "garbage": bytes([at % 256]) * 9 + raw,
            "deep": b"[" * (at % 200_000 + 1) + b"]" * (at % 200_000 + 1), "null": b"null", "empty": b"",
            "nan": raw.replace(b'"tokens": ', b'"tokens": NaN, "x": ', 1),
            "huge-int": raw.replace(b'"docs": ', b'"docs": ' + b"9" * 5000 + b', "y": ', 1)}[op]


def _fix(out: Path, part: int, **fields) -> None:
    """A careful vandal: the changed file's sha256 and size rewritten in the manifest and done record."""
    for path in (out / "manifest.json", out / v1.done_file(part)):
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        entry = doc["partitions"][part] if path.name == "manifest.json" else doc
        entry.update(fields)
        path.write_text(json.dumps(doc))


def _docs(out: Path, part: int, op: str, row: int, delta: int, fix: bool) -> bool:
    path = out / v1.docs_file(part)
    table = pq.read_table(path)
    n = table.num_rows
    i = row % n
    cols = {c: table.column(c).to_pylist() for c in table.column_names}
    types = {c: table.schema.field(c).type for c in table.column_names}
    what, _, column = op.partition(":")
    if op in ("start", "length", "row"):
        cols[op][i] += delta or 1
    elif op == "id":
        cols["id"][i] = cols["id"][i] + "x" * (abs(delta) + 1)
    elif what == "null":
        cols[column][i] = None
    elif what == "drop":
        del cols[column], types[column]
    elif what in ("int32", "float", "string"):
        types[column] = {"int32": pa.int32(), "float": pa.float64(), "string": pa.string()}[what]
        cols[column] = [None if v is None else (str(v) if what == "string" else v) for v in cols[column]]
    elif op == "drop-row":
        cols = {c: v[:i] + v[i + 1:] for c, v in cols.items()}
    elif op == "dup-row":
        cols = {c: v[:i + 1] + v[i:] for c, v in cols.items()}
    elif op == "swap-rows":
        j = (i + 1) % n
        for v in cols.values():
            v[i], v[j] = v[j], v[i]
    buf = io.BytesIO()
    pq.write_table(pa.table({c: pa.array(v, types[c]) for c, v in cols.items()}), buf)
    path.write_bytes(buf.getvalue())
    if fix and op not in ("id", "row"):
        import hashlib
        _fix(out, part, docs_sha256=hashlib.sha256(buf.getvalue()).hexdigest(), docs_bytes=len(buf.getvalue()))
    return True


def _npy(out: Path, part: int, descr: str, shape: str, fix: bool) -> bool:
    path = out / v1.tokens_file(part)
    values = np.load(path)
    changed = values.astype(descr)
    changed = {"same": changed, "column": changed.reshape(-1, 1), "row": changed.reshape(1, -1),
               "plus1": np.append(changed, changed[:1]), "minus1": changed[:-1], "scalar": changed[:1].reshape(()),
               "fortran": np.asfortranarray(np.stack([changed, changed], axis=1))}[shape]
    buf = io.BytesIO()
    np.save(buf, changed, allow_pickle=False)
    path.write_bytes(buf.getvalue())
    if fix:
        import hashlib
        _fix(out, part, sha256=hashlib.sha256(buf.getvalue()).hexdigest(), tokens_bytes=len(buf.getvalue()))
    return True


def manifest_only(mutation: tuple) -> bool:
    """A change of metadata only the manifest records (``MANIFEST_ONLY``): the keys it reached."""
    if mutation[0] != "json" or mutation[1] != "manifest.json" or not KEYS:
        return False
    first = KEYS[0]
    known = set(v1.Manifest.__dataclass_fields__) | set(v1.FORMAT_KEYS)
    return (first in MANIFEST_ONLY or first not in known
            or (first == "inputs" and len(KEYS) > 2 and KEYS[2] in ("name", "identity", "generation")))


# -- running the commands ----------------------------------------------------------------------------

class Hang(Exception):
    pass


@contextlib.contextmanager
def alarm(seconds: int):
    def ring(*_):
        raise Hang(f"no answer in {seconds} s")

    before = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)


def cli(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), alarm(TIMEOUT):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as e:  # argparse
            code = e.code
    return code, out.getvalue(), err.getvalue()


def snapshot(folder: Path, *, through_links: bool = False) -> dict:
    """Every entry under ``folder``, by kind: a file's bytes, a link's target, a FIFO, a folder.
    ``through_links``: a link that stays inside ``folder`` as the bytes it reaches, and the files
    only such links reach (``*.real``, made by the ``link-inside-same`` mutation) left out."""
    found = {}
    if not folder.exists():
        return found
    for path in sorted(folder.rglob("*")):
        mode = path.lstat().st_mode
        rel = str(path.relative_to(folder))
        if through_links and path.name.endswith(".real"):
            continue
        if through_links and stat.S_ISLNK(mode) and path.resolve().is_relative_to(folder.resolve()):
            mode = path.stat().st_mode
        found[rel] = (path.read_bytes() if stat.S_ISREG(mode) else ("link", os.readlink(path)) if stat.S_ISLNK(mode)
                      else ("dir",) if stat.S_ISDIR(mode) else ("other",))
    return found


def documents(out: Path):
    ds = TokenDataset(str(out))
    return [(ds.doc(i).tolist(), ds.doc_id(i), ds.doc_source(i)) for i in range(len(ds))]


class Bench:
    """The pristine run, where each example's copy of it lives, and the pristine results."""

    def __init__(self, root: Path, inputs: Path, scheduler: str):
        self.root, self.inputs, self.scheduler = root, inputs, scheduler
        self.pristine = root / "pristine"
        self.out, self.dest, self.outside = root / "work" / "run", root / "work" / "dest", root / "outside"
        self.tokenize = ["tokenize", "--input", inputs / "a.parquet", inputs / "b.parquet", "--out", self.out,
                         "--partition-mb", "0.006", "--scheduler", scheduler, "--progress", "none"]
        code, _, err = cli(*self.tokenize)
        assert code == 0, err
        shutil.copytree(self.out, self.pristine)
        assert len(json.loads((self.pristine / "manifest.json").read_text())["partitions"]) == PARTS
        self.reset()
        self.results = self.read()
        self.files = snapshot(self.pristine)

    def reset(self, *, finished: bool = True) -> None:
        for folder in (self.out, self.dest, self.outside):
            if folder.is_symlink() or folder.exists():
                shutil.rmtree(folder)
        shutil.copytree(self.pristine, self.out, symlinks=True)
        if not finished:
            (self.out / "manifest.json").unlink()
        self.outside.mkdir(parents=True)
        os.mkfifo(self.outside / "fifo")

    def export(self) -> tuple[int, str, str]:
        return cli("export", self.out, "--format", "npy", "--to", self.dest, "--val-tokens", "0",
                   "--scheduler", self.scheduler, "--progress", "none")

    def read(self) -> dict:
        """What each reader gives now: (exit code, what it printed or wrote)."""
        results = {}
        code, out, err = cli("verify", self.out, "--scheduler", self.scheduler, "--progress", "none")
        results["verify"] = (code, out, err)
        results["inspect"] = cli("inspect", self.out)
        code, out, err = self.export()
        results["export"] = (code, snapshot(self.dest), err)
        try:
            with alarm(TIMEOUT):
                results["dataset"] = (0, documents(self.out), "")
        except UserError as e:
            results["dataset"] = (2, None, f"tokenshards: error: {e}")
        return results


def refusal(name: str, code: int, printed, err: str) -> None:
    """A refusal in one line (verify: exit 1 with its problems listed), no traceback."""
    text = (printed if isinstance(printed, str) else "") + err
    assert "Traceback" not in text, f"{name}: {text}"
    if name == "verify" and code == 1:
        assert any(line.startswith("problem: ") for line in printed.splitlines()), printed
        return
    errors = [line for line in err.splitlines() if line.startswith("tokenshards: error: ")]
    assert code == 2 and len(errors) == 1 and "\n" not in errors[0], f"{name}: exit {code}: {err}"


def judge(bench: Bench, mutation: tuple, results: dict) -> None:
    data_only = manifest_only(mutation)
    for name, (code, got, err) in results.items():
        event(f"{mutation[0]}: {name} exit {code}")
        want = bench.results[name]
        if code != 0:
            refusal(name, code, got, err)
            if name == "export":
                assert not [k for k, v in got.items() if v != ("dir",)], f"export refused yet wrote {sorted(got)}"
            continue
        if data_only and name in ("verify", "inspect"):
            continue  # metadata only the manifest records: its report may say so
        if data_only and name == "export":
            got = {k: v for k, v in got.items() if not k.endswith("_export.json")}
            want = (0, {k: v for k, v in want[1].items() if not k.endswith("_export.json")})
        assert got == want[1], f"{name}: exit 0 with other bytes than the pristine run's ({mutation})"


@pytest.fixture(scope="module")
def bench(cluster, tmp_path_factory) -> Bench:
    root = tmp_path_factory.mktemp("fuzz")
    inputs = root / "in"
    write_parquet(inputs / "a.parquet", {"text": TEXTS[:6], "language": ["en", "de"] * 3}, row_group_size=2)
    write_parquet(inputs / "b.parquet", {"text": TEXTS[6:]}, row_group_size=3)
    return Bench(root, inputs, cluster.scheduler_address)


def test_the_pristine_run_reads_and_resumes_as_itself(bench):
    """The oracle's baseline: every reader answers, and a rerun of a finished run (or of it without its
    manifest) leaves it byte-identical."""
    assert all(code == 0 for code, _, _ in bench.results.values()), bench.results
    for finished in (True, False):
        bench.reset(finished=finished)
        code, _, err = cli(*bench.tokenize)
        assert code == 0 and snapshot(bench.out) == bench.files, err


@budget(short=14)
@given(mutation=MUTATIONS)
@example(mutation=("npy", 0, ">u2", "same", True))  # the issue's: big-endian, its sha256 rewritten
@example(mutation=("docs", 1, "start", 1, -3, True))  # overlapping documents, re-signed
@example(mutation=("bytes", "tokens", 2, "flip", 200))  # bytes that are not their sha256
@example(mutation=("kind", "manifest.json", 0, "link-outside"))
@example(mutation=("json-raw", "manifest.json", 0, "deep", 100_000))
@example(mutation=("docs", 0, "null:length", 1, 0, True))
@example(mutation=("json", "manifest.json", 0, ("job",), DELETE))  # found: a manifest without its job was read
@example(mutation=("docs", 0, "int32:length", 0, 0, True))  # found: an int32 column, re-signed, was kept
@example(mutation=("json", "done", 0, ("docs_bytes",), DELETE))  # found: a rerun kept a record without its sizes
@example(mutation=("npy", 3, "<u2", "column", True))
@example(mutation=("npy", 3, "<u4", "same", True))
def test_a_damaged_finished_run(bench, mutation):
    bench.reset()
    if not apply(mutation, bench.out, bench.outside):
        event("does not apply")
        return
    judge(bench, mutation, bench.read())
    assert snapshot(bench.pristine) == bench.files
    if LONG:  # make fuzz: a rerun of the damaged finished run too (~1 s an example: not in make test)
        resume(bench, mutation)


@budget(short=5)
@given(mutation=MUTATIONS)
@example(mutation=("kind", v1.JOB_FILE, 0, "fifo"))  # the hangs
@example(mutation=("kind", "done", 1, "fifo"))
@example(mutation=("kind", LEASE, 0, "fifo"))
@example(mutation=("json-raw", v1.JOB_FILE, 0, "null", 0))  # the TypeError
@example(mutation=("kind", "parts", 0, "link-outside"))
@example(mutation=("kind", v1.JOB_FILE, 0, "link-inside-same"))  # found: a job file linked inside OUT is read as itself
@example(mutation=("json", v1.JOB_FILE, 0, ("partitions",), DELETE))  # found: a change that changes nothing
@example(mutation=("json", "done", 0, (0,), DELETE))  # found: a done record without its backend is kept
@example(mutation=("docs", 0, "int32:length", 0, 0, True))  # found: an int32 column, re-signed, was kept
@example(mutation=("json", "done", 0, ("docs_bytes",), DELETE))  # found: a rerun kept a record without its sizes
@example(mutation=("json", "done", 0, ("docs_sha256",), DELETE))
def test_a_damaged_unfinished_run_resumes_or_refuses(bench, mutation):
    """tokenize's rerun finishes the run byte-identical to the pristine one, or refuses in one line."""
    bench.reset(finished=False)
    if not apply(mutation, bench.out, bench.outside):
        return
    resume(bench, mutation)


def resume(bench: Bench, mutation: tuple) -> None:
    """tokenize run again in the damaged OUT: exit 0 with OUT byte-identical to the pristine run, or
    a refusal in one line."""
    code, printed, err = cli(*bench.tokenize)
    event(f"{mutation[0]}: tokenize exit {code}")
    if code != 0:
        refusal("tokenize", code, printed, err)
        return
    got = snapshot(bench.out, through_links=mutation[-1] == "link-inside-same")
    want = bench.files
    if mutation[0] == "json" and mutation[1] == "done" and KEYS[:1] == ["backend"]:
        # a done record's backend (a note of which library wrote it; older runs have none) is vouched for
        # by no other file: the rerun keeps the record, and the manifest repeats it
        skip = ("manifest.json", v1.done_file(mutation[2]))
        got, want = ({k: v for k, v in s.items() if k not in skip} for s in (got, want))
    assert got == want, f"tokenize exit 0 with other bytes than the pristine run's ({mutation}): " \
                        f"{sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))}"
