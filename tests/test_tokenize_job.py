"""The whole job on a real LocalCluster; outputs read back with plain numpy/pyarrow."""
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from distributed import LocalCluster

from conftest import write_parquet
from readback import expected_tokens, read_documents
from test_tokenize_pure import AWKWARD
from tokenshards.cluster.connect import dashboard_arguments
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.demo import build_demo_corpus
from tokenshards.tokenize.command import run_tokenize

TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Real text (CPython's docs) in FineWeb columns, plus files shaped to be awkward."""
    root = tmp_path_factory.mktemp("corpus")
    build_demo_corpus(root / "demo", files=2, row_group_rows=50)
    write_parquet(root / "awkward" / "rg1.parquet", {"text": AWKWARD, "id": [f"a{i}" for i in range(len(AWKWARD))]},
                  row_group_size=1)
    many = [f"row {i}: {'word ' * (i % 17)}" if i % 101 else None for i in range(20_000)]
    write_parquet(root / "awkward" / "rg10k.parquet", {"text": many, "id": [f"m{i}" for i in range(20_000)]},
                  row_group_size=10_000)
    write_parquet(root / "awkward" / "noid_extra.parquet",
                  {"lang": ["en", "zh", "he"], "text": ["hello", "你好", "שלום"], "score": [0.1, 0.2, 0.3]})
    return root


def _texts_by_key(paths, text_column="text"):
    import pyarrow.parquet as pq

    out = {}
    for p in paths:
        table = pq.read_table(p)
        ids = table.column("id").to_pylist() if "id" in table.column_names else None
        for row, text in enumerate(table.column(text_column).to_pylist()):
            out[(str(p), row)] = (text, ids[row] if ids else f"{Path(p).name}:{row}")
    return out


def _check_every_document(out, inputs, enc, eot_position="prefix"):
    docs = read_documents(out)
    source = _texts_by_key(inputs)
    want_keys = {k for k, (text, _) in source.items() if text}
    assert set(docs) == want_keys
    for key, (doc_id, tokens) in docs.items():
        text, want_id = source[key]
        assert doc_id == want_id
        assert tokens == expected_tokens(enc, text, eot_position), key
    return docs


def test_every_document_matches_tiktoken(tokenize, corpus, gpt2):
    inputs = sorted(corpus.rglob("*.parquet"))
    summary, out = tokenize([corpus / "demo" / "*.parquet", corpus / "awkward"], partition_bytes=60_000)
    _check_every_document(out, inputs, gpt2)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "tokenshards/1"
    assert manifest["encoding"] == {"name": "gpt2", "n_vocab": 50257, "eot": 50256, "dtype": "uint16"}
    assert manifest["eot_position"] == "prefix" and manifest["text_column"] == "text"
    assert manifest["backend"].startswith("gigatoken ")  # auto: the fastest installed backend that verified
    assert [i["path"] for i in manifest["inputs"]] == [str(p) for p in inputs]
    assert summary.partitions == len(manifest["partitions"]) > len(inputs)
    assert manifest["totals"]["skipped_null"] == 1 + 199 and manifest["totals"]["skipped_empty"] == 1
    assert summary.docs == manifest["totals"]["docs"] and summary.tokens == manifest["totals"]["tokens"]
    for part in manifest["partitions"]:
        assert not Path(part["tokens_file"]).is_absolute()
        assert (out / part["tokens_file"].replace(".tokens.npy", ".done.json")).exists()
    assert not list(out.rglob("*.tmp"))


@pytest.mark.parametrize("backend", ["tiktoken", "splintr", "riptoken"])
def test_every_backend_writes_the_same_bytes(tokenize, corpus, tmp_path, backend):
    inputs = [corpus / "demo" / "*.parquet", corpus / "awkward"]
    _, fast_out = tokenize(inputs, out=tmp_path / "auto", partition_bytes=60_000)
    _, out = tokenize(inputs, out=tmp_path / backend, partition_bytes=60_000, backend=backend)
    fast, other = (json.loads((o / "manifest.json").read_text()) for o in (fast_out, out))
    assert other["backend"].startswith(f"{backend} ") and fast["backend"].startswith("gigatoken ")
    assert [p["sha256"] for p in other["partitions"]] == [p["sha256"] for p in fast["partitions"]]
    assert other["totals"] == fast["totals"]


@pytest.mark.parametrize("eot_position", ["suffix", "none"])
def test_eot_position(tokenize, corpus, gpt2, eot_position):
    inputs = [corpus / "awkward" / "rg1.parquet"]
    _, out = tokenize(inputs, eot_position=eot_position)
    _check_every_document(out, inputs, gpt2, eot_position)
    assert json.loads((out / "manifest.json").read_text())["eot_position"] == eot_position


def test_cl100k_writes_uint32(tokenize, corpus, cl100k):
    inputs = [corpus / "awkward" / "rg1.parquet"]
    _, out = tokenize(inputs, encoding="cl100k_base")
    _check_every_document(out, inputs, cl100k)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["encoding"] == {"name": "cl100k_base", "n_vocab": cl100k.n_vocab, "eot": 100257, "dtype": "uint32"}


def test_other_text_and_id_columns(tokenize, tmp_path, gpt2):
    path = write_parquet(tmp_path / "in.parquet", {"body": ["x y", None, "z"], "key": [7, 8, 9], "text": [1, 2, 3]})
    _, out = tokenize([path], text_column="body", id_column="key")
    docs = read_documents(out)
    assert [(k[1], v[0]) for k, v in sorted(docs.items())] == [(0, "7"), (2, "9")]
    assert docs[(str(path), 2)][1] == expected_tokens(gpt2, "z")


def test_same_bytes_for_one_worker_and_eight(corpus, tmp_path, cluster):
    inputs = (str(corpus / "demo" / "*.parquet"), str(corpus / "awkward"))
    outs = []
    # No dashboards: not what this compares (bokeh's start-up, ~0.7 s of CPU per cluster).
    with LocalCluster(n_workers=8, threads_per_worker=1, processes=True, silence_logs=logging.CRITICAL,
                      **dashboard_arguments(None)) as eight:
        for name, address in (("one", None), ("eight", eight.scheduler_address)):
            config = TokenizeConfig(inputs=inputs, out=str(tmp_path / name), partition_bytes=40_000, progress="none",
                                    workers=1 if address is None else None, scheduler=address, dashboard_address=None)
            run_tokenize(config, announce=lambda m: None)
            outs.append(tmp_path / name)
    files = sorted(p.relative_to(outs[0]) for p in outs[0].rglob("*") if p.is_file())
    assert len(files) > 20
    assert files == sorted(p.relative_to(outs[1]) for p in outs[1].rglob("*") if p.is_file())
    for rel in files:
        assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


def test_cli_runs_and_prints_summary(corpus, tmp_path):
    out = tmp_path / "cli-out"
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--input", str(corpus / "awkward" / "rg1.parquet"), "--out", str(out),
                           "--workers", "1", "--dashboard-address", ":0", "--progress", "log"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "dashboard: http://" in proc.stderr
    assert "partitions 1/1" in proc.stderr
    assert "10 documents" in proc.stdout and f"output: {out}" in proc.stdout
    assert (out / "manifest.json").exists()


def test_cli_unknown_encoding_is_one_line(corpus, tmp_path):
    proc = subprocess.run([TOKENSHARDS, "tokenize", "--input", str(corpus / "awkward" / "rg1.parquet"),
                           "--out", str(tmp_path / "o"), "--encoding", "gpt5"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.startswith("tokenshards: error: unknown encoding 'gpt5': expected one of")
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


# -- the worker task as a plain function, and the Dask graph that runs it --

def _pieces_and_settings(corpus, out, gpt2_loaded):
    from tokenshards.encoding.plugin import EncoderPlugin
    from tokenshards.corpus.plan import plan_pieces, read_input_metadata
    from tokenshards.tokenize.task import TaskSettings

    paths = sorted((corpus / "demo").glob("*.parquet"))
    files = [read_input_metadata(str(p), p.name, text_column="text", id_column=None) for p in paths]
    pieces = plan_pieces(files, target_bytes=200_000)
    settings = TaskSettings(out=str(out), storage_options={}, encoder=EncoderPlugin(gpt2_loaded).ref, dtype="uint16",
                            eot_position="prefix", job="test-job")
    return pieces, settings


def test_a_partition_is_a_plain_function_without_a_cluster(corpus, tmp_path, gpt2):
    """(piece, settings, backend) → its files and manifest entry; no Dask involved."""
    import numpy as np

    from tokenshards.encoding.backends import TiktokenBackend
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.tokenize.task import tokenize_partition

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    result = tokenize_partition(pieces[1], settings=settings, backend=TiktokenBackend(gpt2))
    assert result.unreadable is None and result.entry.index == pieces[1].index
    tokens = np.load(tmp_path / result.entry.tokens_file)
    assert len(tokens) == result.entry.tokens == result.tokens > 0
    assert json.loads((tmp_path / f"parts/part-{pieces[1].index:05d}.done.json").read_text())["job"] == "test-job"


def test_a_task_starts_when_its_read_starts(corpus, tmp_path, gpt2):
    """The run's tokenizing phase (first start to last end) counts the first partition's read."""
    import time

    from tokenshards.encoding.backends import TiktokenBackend
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.corpus.read import read_piece
    from tokenshards.tokenize.task import write_partition

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    before = time.time()
    frame = read_piece(pieces[0], text_column="text", storage_options={})
    time.sleep(0.05)
    result = write_partition(frame, pieces[0], settings=settings, backend=TiktokenBackend(gpt2))
    assert before <= result.started < before + 0.05 <= result.finished


def test_one_task_per_planned_partition(corpus, tmp_path):
    """Dask may not merge or split planned partitions: each task writes one partition's files."""
    import dask

    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.tokenize.command import DASK_SETTINGS, partition_tasks

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    assert len(pieces) > 3
    with dask.config.set(DASK_SETTINGS):
        tasks = partition_tasks(pieces, settings).optimize()
        graph = dict(tasks.__dask_graph__())
    assert tasks.npartitions == len(pieces)
    assert len(graph) == len(pieces)
    # What the job submits (and Dask does not optimize again): to_delayed's graph, fused as well.
    with dask.config.set(DASK_SETTINGS):
        submitted = partition_tasks(pieces, settings).to_delayed()
    assert len(submitted) == len(pieces)
    assert {len(dict(d.__dask_graph__())) for d in submitted} == {len(pieces)}


def test_a_partition_task_names_only_modules_the_workers_start_with(corpus, tmp_path):
    """Local workers are forked with ``tokenize.workers.forkserver_preload``'s modules imported. A module a task names beyond
    those would be imported in each worker's first task; one the preload holds that no task names
    (dask.dataframe was: ~0.2 s of the forkserver's CPU through start-up) costs every run for nothing."""
    import io
    import pickle

    import dask
    from distributed.protocol.pickle import dumps

    from tokenshards.tokenize.workers import forkserver_preload
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.tokenize.command import DASK_SETTINGS, partition_tasks

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    with dask.config.set(DASK_SETTINGS):
        [task] = partition_tasks(pieces[:1], settings).to_delayed()
    named = set()

    class Naming(pickle.Unpickler):
        def find_class(self, module, name):
            named.add(module)
            return super().find_class(module, name)

    for spec in dict(task.__dask_graph__()).values():
        Naming(io.BytesIO(dumps(spec))).load()
    assert "tokenshards.tokenize.task" in named
    probe = ("import importlib, json, sys\n"
             f"for m in {forkserver_preload().imports()!r}:\n"
             "    try: importlib.import_module(m)\n"
             "    except ImportError: pass\n"
             f"print(json.dumps([sorted(set({sorted(named)!r}) - set(sys.modules)), 'dask.dataframe' in sys.modules]))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [[], False], sorted(named)


def test_partitions_run_in_the_order_submitted_across_chunks(corpus, tmp_path, monkeypatch):
    """The job submits its partitions in growing chunks (``runner.growing_chunks``: the first runs
    while the client builds the rest); each chunk runs after those before it, so the planned order
    (``submission_order``: a file at a time, small pieces last) holds on the cluster. (A task per
    partition here: these are small enough to go several to a task otherwise, ``tokenize.groups``.)"""
    from distributed.diagnostics.plugin import SchedulerPlugin

    from tokenshards.tokenize import groups

    monkeypatch.setattr(groups, "GROUP_BYTES", 0)

    class Order(SchedulerPlugin):
        name = "test-order"

        def __init__(self):
            self.submitted, self.finished = [], []

        def update_graph(self, scheduler, *, keys, **kwargs):
            self.submitted.append(sorted((k for k in keys if "write_frame" in k[0]), key=lambda k: k[1]))

        def transition(self, key, start, finish, *args, **kwargs):
            if finish == "memory" and "write_frame" in key[0]:
                self.finished.append(key)

    # One worker thread: the order tasks finish in is the order the scheduler ran them in.
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as one:
        order = Order()
        one.scheduler.add_plugin(order)
        for f in range(3):  # 60 one-row partitions, some small
            write_parquet(tmp_path / "in" / f"f{f}.parquet", {"text": [f"file {f} row {i} " * (1 + i % 7) for i in range(20)]},
                          row_group_size=1)
        config = TokenizeConfig(inputs=(str(tmp_path / "in"),), out=str(tmp_path / "out"),
                                scheduler=one.scheduler_address, progress="none", partition_bytes=1)
        summary = run_tokenize(config, announce=lambda msg: None)
    chunks = [keys for keys in order.submitted if keys]
    assert [len(keys) for keys in chunks[:2]] == [8, 32] and summary.partitions == sum(map(len, chunks))
    assert order.finished == [key for keys in chunks for key in keys]


def test_small_partitions_go_several_to_a_task_and_write_the_same_bytes(corpus, tmp_path, cluster, monkeypatch):
    """Small planned partitions of one input go several to a Dask task (``tokenize.groups``, while
    their text stays under ``GROUP_BYTES``): each still writes and commits its own files, the same
    bytes as with a task per partition, and the manifest is the same."""
    from tokenshards.corpus.plan import plan_pieces, read_input_metadata, submission_order
    from tokenshards.tokenize import groups

    inputs = (str(corpus / "demo" / "*.parquet"), str(corpus / "awkward"))
    paths = sorted((corpus / "demo").glob("*.parquet")) + sorted((corpus / "awkward").glob("*.parquet"))
    pieces = plan_pieces([read_input_metadata(str(p), p.name, text_column="text", id_column=None) for p in paths],
                         target_bytes=20_000)
    grouped = groups.group_pieces(submission_order(pieces))
    assert len(pieces) > 2 * len(grouped) and [p for g in grouped for p in g] == submission_order(pieces)
    assert all(len({p.input for p in g}) == 1 and (len(g) == 1 or sum(p.text_bytes for p in g) <= groups.GROUP_BYTES)
               for g in grouped)
    outs = {}
    for name, limit in (("grouped", groups.GROUP_BYTES), ("one-each", 0)):
        monkeypatch.setattr(groups, "GROUP_BYTES", limit)
        config = TokenizeConfig(inputs=inputs, out=str(tmp_path / name), partition_bytes=20_000, progress="none",
                                scheduler=cluster.scheduler_address)
        summary = run_tokenize(config, announce=lambda m: None)
        assert summary.partitions == len(pieces)
        outs[name] = tmp_path / name
    files = sorted(p.relative_to(outs["grouped"]) for p in outs["grouped"].rglob("parts/*") if p.is_file())
    assert len(files) == 3 * len(pieces)
    assert files == sorted(p.relative_to(outs["one-each"]) for p in outs["one-each"].rglob("parts/*") if p.is_file())
    for rel in files:
        assert (outs["grouped"] / rel).read_bytes() == (outs["one-each"] / rel).read_bytes(), rel
    manifests = [json.loads((outs[n] / "manifest.json").read_text()) for n in ("grouped", "one-each")]
    assert manifests[0]["partitions"] == manifests[1]["partitions"] and manifests[0]["totals"] == manifests[1]["totals"]


def test_a_failed_group_names_its_partitions():
    from tokenshards.corpus.plan import Piece
    from tokenshards.tokenize.groups import describe

    piece = lambda i, rg: Piece(index=i, input="f.parquet", name="f.parquet", row_groups=rg, first_row=0,  # noqa: E731
                                rows=1, text_bytes=10, id_column=None)
    assert describe((piece(3, (4, 5)),)) == "partition 3 (f.parquet, row groups 4..4)"
    assert describe((piece(3, (4, 5)), piece(4, (5, 7)))) == "partitions 3..4 (f.parquet, row groups 4..6)"


def test_a_task_reads_the_same_columns_kept_or_looked_up(corpus, tmp_path, gpt2):
    """The frames a task gets keep their columns beside pandas' (``KEPT_COLUMNS``); a frame
    without them (a copy, a pickled one) is read through pandas, to the same values and files."""
    import pyarrow as pa

    from tokenshards.encoding.backends import TiktokenBackend
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.corpus.read import KEPT_COLUMNS, piece_columns, read_piece
    from tokenshards.tokenize.task import piece_and_outputs, piece_frame, write_outputs

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    frame = read_piece(pieces[1], text_column="text", storage_options={})
    copied = frame.copy()
    assert KEPT_COLUMNS in frame.__dict__ and KEPT_COLUMNS not in copied.__dict__
    kept, looked_up = piece_columns(frame), piece_columns(copied)
    assert kept[0].tolist() == looked_up[0].tolist()
    assert [pa.chunked_array([c]) if isinstance(c, pa.Array) else c for c in kept[1:]] == \
        [pa.chunked_array([c]) if isinstance(c, pa.Array) else c for c in looked_up[1:]]
    backend = TiktokenBackend(gpt2)
    [a] = write_outputs(frame, pieces[1], settings=[settings], backends=[backend])
    [b] = write_outputs(copied, pieces[1], settings=[settings], backends=[backend])
    pieces_frame = piece_frame(pieces[1], (0,))
    assert pieces_frame.__dict__[KEPT_COLUMNS] == (pieces_frame["piece"][0], pieces_frame["outputs"][0]) == (pieces[1], (0,))
    assert piece_and_outputs(pieces_frame) == piece_and_outputs(pieces_frame.copy()) == (pieces[1], (0,))
    assert a.entry == b.entry and a.entry.tokens > 0


def test_frames_from_arrays_are_what_the_public_constructor_makes():
    """``frame_of`` builds the task's frames through pandas' private ``_from_arrays``; they must be
    what the public constructor makes of the same columns, or the job's frames would drift from
    their meta with a pandas upgrade."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    from types import SimpleNamespace

    from tokenshards.corpus.read import FRAME_META, frame_of
    from tokenshards.tokenize.task import PIECE_META, RESULT_META, ResultFrame

    def objects(*values):
        column = np.empty(len(values), dtype=object)
        for i, value in enumerate(values):
            column[i] = value
        return column

    piece, result = SimpleNamespace(index=1), SimpleNamespace(tokens=2)  # objects, as pieces and results are
    cases = [
        (FRAME_META, [np.arange(3, 6, dtype=np.int64), pd.arrays.ArrowExtensionArray(pa.array(["a", None, "c"])),
                      pd.arrays.ArrowExtensionArray(pa.chunked_array([pa.array(["x"]), pa.array(["", None])]))], pd.DataFrame),
        (PIECE_META, [objects(piece), objects((0, 2))], pd.DataFrame),
        (RESULT_META, [objects(result, result)], ResultFrame),
    ]
    for meta, columns, cls in cases:
        made = frame_of(meta, columns, cls=cls)
        public = cls(dict(zip(meta.columns, columns)), copy=False)
        assert type(made) is cls
        pd.testing.assert_frame_equal(made, public)
        assert made.dtypes.tolist() == meta.dtypes.tolist()
        assert made.columns.equals(meta.columns)


def test_results_travel_as_their_dataclasses(corpus, tmp_path, gpt2):
    """A task's result frame is sized and shipped by Dask as the TaskResults it holds (not by
    sampling a pandas object column), and arrives as the same results in a frame of its type."""
    from dask.sizeof import sizeof
    from distributed.protocol import deserialize, serialize

    from tokenshards.encoding.backends import TiktokenBackend
    from tokenshards.encoding.encoders import load_encoding
    from tokenshards.tokenize.task import RESULT_BYTES, ResultFrame, TaskResult, tokenize_partition

    pieces, settings = _pieces_and_settings(corpus, tmp_path, load_encoding("gpt2"))
    results = [tokenize_partition(p, settings=settings, backend=TiktokenBackend(gpt2)) for p in pieces[:2]]
    frame = TaskResult.as_frame(results)
    assert isinstance(frame, ResultFrame) and frame["result"].tolist() == results
    assert sizeof(frame) == 2 * RESULT_BYTES
    header, frames = serialize(frame)
    back = deserialize(header, frames)
    assert header["serializer"] == "dask" and isinstance(back, ResultFrame)
    assert TaskResult.all_from_frame(back) == results and back["result"].tolist() == results
    # A frame made from it by pandas is read from its column, never from the results it was made of.
    assert TaskResult.all_from_frame(frame.iloc[1:]) == results[1:]


def test_a_document_without_an_id_is_named_by_its_input_and_row():
    """Ids come from the input where it has them, row by row; the rest are ``NAME:ROW``."""
    import numpy as np
    import pyarrow as pa

    from tokenshards.tokenize.task import document_ids

    rows = np.array([7, 8, 9], dtype=np.int64)
    some = pa.chunked_array([pa.array(["doc-a", None]), pa.array(["doc-c"])])
    assert document_ids(some, rows, "x.parquet").to_pylist() == ["doc-a", "x.parquet:8", "doc-c"]
    assert document_ids(pa.nulls(3, pa.string()), rows, "y.parquet").to_pylist() == ["y.parquet:7", "y.parquet:8", "y.parquet:9"]
    assert document_ids(pa.array([], pa.string()), rows[:0], "z.parquet").to_pylist() == []
