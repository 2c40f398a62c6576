"""Several encodings from one read (issue 25, part 2): ``--encoding A --encoding B --out OUT_A
--out OUT_B`` writes in each OUT exactly what a run of its encoding alone writes there, byte for
byte, and each OUT resumes on its own (real LocalCluster, real tiktoken, a train-bpe vocabulary)."""
from __future__ import annotations

import random
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import write_parquet
from readback import expected_tokens, read_documents
from tokenshards.bpe.train import TrainBpeConfig, run_train_bpe
from tokenshards.cli import main
from tokenshards.encoding.encoders import load_encoding
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.command import run_tokenize

PARTITION_MB = "0.004"  # ~5 partitions of the corpus below
WORDS = ["the", "river", "data", "Straße", "über", "мир", "данные", "数据", "データ", "🙂", "naïve", "x=1;", "2026",
         "<|endoftext|>", "\t", "  ", "\n\n"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """Two files, small row groups; nulls, empty rows and special-token text included."""
    root = tmp_path_factory.mktemp("multi-corpus")
    rng = random.Random(25)
    for n in range(2):
        texts = [" ".join(rng.choices(WORDS, k=rng.randint(1, 60))) for _ in range(120)]
        texts[3], texts[4] = None, ""
        write_parquet(root / f"{n:03d}.parquet", {"text": texts, "id": [f"{n}-{i}" for i in range(len(texts))]},
                      row_group_size=15)
    return root


@pytest.fixture(scope="module")
def trained(cluster, corpus, tmp_path_factory) -> str:
    """A train-bpe vocabulary of this corpus, as a third encoding."""
    out = tmp_path_factory.mktemp("multi-bpe") / "small.tiktoken"
    run_train_bpe(TrainBpeConfig(inputs=(str(corpus),), out=str(out), vocab_size=400,
                                 scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
    return str(out)


@pytest.fixture(scope="module")
def alone(cluster, corpus, trained, tmp_path_factory) -> dict[str, Path]:
    """Each encoding's run on its own: what every OUT of a combined run must equal."""
    root = tmp_path_factory.mktemp("multi-alone")
    runs = {}
    for n, encoding in enumerate(("gpt2", "cl100k_base", trained)):
        out = root / f"alone-{n}"
        run_tokenize(TokenizeConfig(inputs=(str(corpus),), out=str(out), encoding=encoding,
                                    partition_bytes=int(float(PARTITION_MB) * 1e6),
                                    scheduler=cluster.scheduler_address, progress="none"), announce=lambda m: None)
        runs[encoding] = out
    return runs


def _files(out: Path) -> dict[str, bytes]:
    """Every file of a finished OUT (part files, done records, manifest, job file)."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def _cli(capsys, argv: list) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _together(capsys, cluster, corpus, pairs: list[tuple[str, Path]], *extra) -> str:
    argv = ["tokenize", "--input", corpus, "--scheduler", cluster.scheduler_address, "--progress", "none",
            "--partition-mb", PARTITION_MB, *extra]
    for encoding, _ in pairs:
        argv += ["--encoding", encoding]
    for _, out in pairs:
        argv += ["--out", out]
    code, said, err = _cli(capsys, argv)
    assert code == 0, err
    return said


def _check_tokens(out: Path, encoding: str, corpus: Path) -> None:
    """Every document is [eot] + tiktoken's encode_ordinary of its text (the trained vocabulary's too)."""
    enc = load_encoding(encoding).encoding
    texts = {(str(path), row): text for path in sorted(corpus.glob("*.parquet"))
             for row, text in enumerate(pq.read_table(path).column("text").to_pylist()) if text}
    docs = read_documents(out)
    assert docs.keys() == texts.keys()
    for key, (_, tokens) in docs.items():
        assert tokens == expected_tokens(enc, texts[key])


def test_two_encodings_at_once_equal_separate_runs(cluster, corpus, alone, tmp_path, capsys):
    pairs = [("gpt2", tmp_path / "a"), ("cl100k_base", tmp_path / "b")]
    said = _together(capsys, cluster, corpus, pairs)
    for encoding, out in pairs:
        assert _files(out) == _files(alone[encoding])
        assert len([p for p in (out / "parts").glob("*.done.json")]) > 3
        _check_tokens(out, encoding, corpus)
    assert "done (gpt2): " in said and "done (cl100k_base): " in said
    assert f"output: {tmp_path / 'b'}" in said


def test_three_encodings_with_a_trained_vocabulary(cluster, corpus, trained, alone, tmp_path, capsys):
    pairs = [("cl100k_base", tmp_path / "b"), (trained, tmp_path / "t"), ("gpt2", tmp_path / "a")]
    _together(capsys, cluster, corpus, pairs)
    for encoding, out in pairs:
        assert _files(out) == _files(alone[encoding])
        _check_tokens(out, encoding, corpus)


def test_one_out_on_s3_and_one_on_disk(cluster, corpus, alone, s3, tmp_path):
    """Each OUT is reached through its own filesystem: an S3 prefix (moto's server) holds the same
    objects as the local folder of gpt2's separate run."""
    from tokenshards.tokenize.config import Output
    from tokenshards.tokenize.command import run_tokenize_each

    bucket = s3.make_bucket()
    config = TokenizeConfig(inputs=(str(corpus),), out=f"s3://{bucket}/gpt2", encoding="gpt2",
                            more_outputs=(Output("cl100k_base", str(tmp_path / "b")),),
                            partition_bytes=int(float(PARTITION_MB) * 1e6), storage_options=s3.storage_options,
                            scheduler=cluster.scheduler_address, progress="none")
    summaries = run_tokenize_each(config, announce=lambda m: None)
    assert [s.out for s in summaries.each] == [config.out, str(tmp_path / "b")]
    fs = s3.fs()
    prefix = f"{bucket}/gpt2/"
    on_s3 = {path[len(prefix):]: fs.cat_file(path) for path in sorted(fs.find(prefix))}
    assert on_s3 == _files(alone["gpt2"])
    assert _files(tmp_path / "b") == _files(alone["cl100k_base"])


def _stamps(out: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in (out / "parts").iterdir()}


def test_each_out_resumes_on_its_own(cluster, corpus, alone, tmp_path, capsys):
    """OUT_A finished, OUT_B killed part way (no manifest, some partitions uncommitted): the rerun
    writes only B's missing partitions and rewrites none of A's files."""
    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(alone["gpt2"], a)
    shutil.copytree(alone["cl100k_base"], b)
    (b / "manifest.json").unlink()
    dropped = sorted((b / "parts").glob("*.done.json"))[1::2]
    for done in dropped:
        done.unlink()
    (b / "parts" / "part-00000.tokens.npy").write_bytes(b"cut off")  # a committed partition whose file is damaged
    before_a, before_b = _stamps(a), _stamps(b)
    said = _together(capsys, cluster, corpus, [("gpt2", a), ("cl100k_base", b)])
    assert _stamps(a) == before_a  # nothing of the finished OUT rewritten
    rewritten = {name for name, stamp in _stamps(b).items() if before_b.get(name) != stamp}
    assert {d.name for d in dropped} | {"part-00000.done.json"} <= rewritten
    assert "part-00002.tokens.npy" not in rewritten  # a committed partition stays
    for encoding, out in (("gpt2", a), ("cl100k_base", b)):
        assert _files(out) == _files(alone[encoding])
    partitions = len(list((a / "parts").glob("*.done.json")))
    assert f"{partitions} partitions ({partitions} already committed)" in said
    assert f"({partitions - len(dropped) - 1} already committed)" in said


def test_outputs_missing_different_partitions(cluster, corpus, alone, tmp_path, capsys):
    """A partition one OUT lacks is written there only (its task writes one output); one both lack, in both."""
    a, b = tmp_path / "a", tmp_path / "b"
    for encoding, out, drop in (("gpt2", a, (0, 2)), ("cl100k_base", b, (1, 2))):
        shutil.copytree(alone[encoding], out)
        (out / "manifest.json").unlink()
        for index in drop:
            (out / "parts" / f"part-{index:05d}.done.json").unlink()
    before = {out: _stamps(out) for out in (a, b)}
    _together(capsys, cluster, corpus, [("gpt2", a), ("cl100k_base", b)])
    for out, drop in ((a, (0, 2)), (b, (1, 2))):
        rewritten = {name.split(".")[0] for name, stamp in _stamps(out).items() if before[out].get(name) != stamp}
        assert rewritten == {f"part-{index:05d}" for index in drop}
    for encoding, out in (("gpt2", a), ("cl100k_base", b)):
        assert _files(out) == _files(alone[encoding])


def _one_error(err: str) -> str:
    assert err.startswith("tokenshards: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err[len("tokenshards: error: "):-1]


@pytest.mark.parametrize("flags, message", [
    (["--encoding", "gpt2", "--encoding", "cl100k_base", "--out", "{tmp}/a"],
     "--encoding and --out pair up in order, one --out for each --encoding: got 2 --encoding (gpt2, cl100k_base) "
     "and 1 --out ({tmp}/a)"),
    (["--out", "{tmp}/a", "--out", "{tmp}/b"],
     "--encoding and --out pair up in order, one --out for each --encoding: got 1 --encoding (gpt2) "
     "and 2 --out ({tmp}/a, {tmp}/b)"),
    (["--encoding", "gpt2", "--encoding", "cl100k_base", "--out", "{tmp}/a", "--out", "{tmp}/x/../a/"],
     "--out {tmp}/x/../a/ is given twice (for --encoding gpt2 and --encoding cl100k_base); each --encoding "
     "needs a folder of its own"),
])
def test_outputs_that_do_not_pair_are_one_line(flags, message, corpus, tmp_path, capsys):
    flags = [f.format(tmp=tmp_path) for f in flags]
    code, _, err = _cli(capsys, ["tokenize", "--input", corpus, "--scheduler", "tcp://127.0.0.1:1", *flags])
    assert code == 2
    assert _one_error(err) == message.format(tmp=tmp_path)
    assert not (tmp_path / "a").exists()


def test_a_live_run_in_one_out_stops_all_before_anything_is_written(corpus, tmp_path, capsys):
    """Each OUT has its own lease: a live writer in OUT_B stops the run in one line, and OUT_A,
    whose lease was taken first, is left with no file (its lease given back)."""
    from tokenshards.storage.lease import Lease
    from tokenshards.storage.location import Location

    a, b = tmp_path / "a", tmp_path / "b"
    b.mkdir()
    with Lease(Location.at(str(b)), command="tokenize"):
        code, _, err = _cli(capsys, ["tokenize", "--input", corpus, "--scheduler", "tcp://127.0.0.1:1",
                                     "--encoding", "gpt2", "--encoding", "cl100k_base", "--out", a, "--out", b])
    assert code == 2
    assert _one_error(err).startswith(f"{b} is being written by ")
    assert not [p for p in a.rglob("*") if p.is_file()]  # the folders ensure_writable made, empty


def test_one_task_per_planned_partition_with_several_outputs(corpus, tmp_path):
    """Dask may not merge or split planned partitions when several outputs ride on each task."""
    import dask

    from tokenshards.encoding.plugin import EncoderPlugin
    from tokenshards.tokenize.command import DASK_SETTINGS, partition_tasks
    from tokenshards.corpus.plan import plan_pieces, read_input_metadata
    from tokenshards.tokenize.task import TaskSettings

    paths = sorted(corpus.glob("*.parquet"))
    files = [read_input_metadata(str(p), p.name, text_column="text", id_column=None) for p in paths]
    pieces = plan_pieces(files, target_bytes=4000)
    settings = tuple(TaskSettings(out=str(tmp_path / name), storage_options={}, dtype="uint16", eot_position="prefix",
                                  encoder=EncoderPlugin(load_encoding(name)).ref, job="test-job")
                     for name in ("gpt2", "cl100k_base"))
    wanted = {p.index: (0, 1) if p.index % 2 else (1,) for p in pieces}
    with dask.config.set(DASK_SETTINGS):
        tasks = partition_tasks(pieces, settings, wanted).optimize()
        graph = dict(tasks.__dask_graph__())
    assert tasks.npartitions == len(pieces) == len(graph) > 3


PREBUILT_PROBE = r"""
from tokenshards.cluster.prestart import start_forkserver
from tokenshards.cluster.connect import connect
from tokenshards.encoding import prebuilt
from tokenshards.encoding.encoders import load_encoding
from tokenshards.encoding.plugin import EncoderPlugin
from tokenshards.tokenize.workers import forkserver_preload

if __name__ == "__main__":
    loaded = [load_encoding(name) for name in ("gpt2", "cl100k_base")]  # kept parsed: the server loads offline
    preload = forkserver_preload(["gpt2", "cl100k_base"], "auto")
    assert start_forkserver(preload)
    prebuilt.started(preload)
    with connect(workers=2, dashboard_address=":0", announce=lambda m: None) as client:
        choices = [prebuilt.ask(l.fingerprint, "auto") for l in loaded]
        plugins = [EncoderPlugin(l, backend=c.name) for l, c in zip(loaded, choices)]
        for plugin in plugins:
            client.register_plugin(plugin)
        text = "<|endoftext|> prebuilt 🙂 中文 " * 50
        def probe(dask_worker):
            built = [dask_worker.plugins[p.name].backend for p in plugins]
            return [(b is found.backend, b.encode_many([text])[0].tolist()) for b, found in zip(built, prebuilt._prebuilt)]
        want = [(True, l.encoding.encode_ordinary(text)) for l in loaded]
        print(all(choice is not None for choice in choices), list(client.run(probe).values()) == [want] * 2)
"""


def test_local_workers_start_with_every_encoder_prebuilt(tmp_path):
    """The forkserver verifies and builds each encoding of the command line once: the client
    takes each verdict, every worker uses the very objects (no encoder built per worker or task)."""
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(PREBUILT_PROBE)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "True True"


def test_add_takes_one_output_at_a_time(corpus, tmp_path, capsys):
    """A growth is one run's (its inputs and partition numbers are that OUT's): with several
    encodings ``--add`` is one line, before any cluster starts or any file is written."""
    a, b = tmp_path / "a", tmp_path / "b"
    code, _, err = _cli(capsys, ["tokenize", "--input", corpus, "--scheduler", "tcp://127.0.0.1:1", "--add",
                                 "--encoding", "gpt2", "--encoding", "cl100k_base", "--out", a, "--out", b])
    assert code == 2
    assert _one_error(err) == "--add takes one --encoding and one --out at a time; run it once per output"
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix != ".parquet"]
