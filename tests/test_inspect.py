"""`tokenshards inspect`: the totals the manifest holds, exact percentiles and per-language
counts against an independent computation, a valid PNG, s3:// outputs, and what it says when
an input is gone or has no language column; on the cluster (tasks over batches of partitions,
summaries combined in a tree on the workers), the same report as in this process."""
from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest

from conftest import write_parquet
from readback import expected_tokens, read_documents
from tokenshards.cli import main
from tokenshards.errors import UserError
from tokenshards.inspect.stats import (BIN_WIDTH, LENGTH_EDGES, PartitionStats, RunStats, inspect_output, plot_lengths,
                                       report_lines as report_lines_of)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
WORDS = {"en": "the cat sat on the mat and looked around ", "de": "die Katze sitzt auf der Matte und schaut ",
         "zh": "猫坐在垫子上看着四周。"}


def _corpus(folder, *, name="a.parquet", n=240, language=True, seed=0):
    """Documents of varied length (3..~250 tokens) in three languages, plus a null and an empty row."""
    rng = np.random.default_rng(seed)
    langs = [("en", "de", "zh")[i % 3] for i in range(n)]
    texts = [WORDS[lang] * int(rng.integers(1, 10)) + f" #{i}" for i, lang in enumerate(langs)]
    texts[5], texts[6] = None, ""
    columns = {"text": texts, "id": [f"doc-{i}" for i in range(n)]}
    if language:
        columns["language"] = langs
    return write_parquet(folder / name, columns, row_group_size=40), texts, langs


@pytest.fixture
def run(tokenize, tmp_path):
    path, texts, langs = _corpus(tmp_path / "in")
    _, out = tokenize([path], partition_bytes=3000)
    return {"out": out, "input": path, "texts": texts, "langs": langs}


def _printed(capsys, argv) -> str:
    assert main(argv) == 0
    return capsys.readouterr().out


def _on_cluster(cluster, *args) -> list[str]:
    """A command's arguments, run on the session's cluster."""
    return [*args, "--scheduler", cluster.scheduler_address, "--progress", "none"]


def test_inspect_prints_the_manifest_totals_and_exact_numbers(run, gpt2, tmp_path, capsys):
    png = tmp_path / "lengths.png"
    text = _printed(capsys, ["inspect", str(run["out"]), "--plot", str(png)])
    manifest = json.loads((run["out"] / "manifest.json").read_text())
    totals = manifest["totals"]
    assert len(manifest["partitions"]) > 2  # the numbers below are summed over several partitions
    assert f"documents   {totals['docs']:,} (skipped {totals['skipped_null']} null and {totals['skipped_empty']} empty rows)" in text
    assert f"tokens      {totals['tokens']:,} (" in text
    assert f"inputs      1 file, {totals['rows']:,} rows" in text
    assert f"partitions  {len(manifest['partitions'])}\n" in text
    assert "encoding    gpt2: n_vocab 50,257, eot 50256, stored as uint16; eot prefix; text column 'text'" in text

    # Percentiles: every length here is below 301 tokens, where the histogram is exact.
    lengths = np.array([len(tokens) for _, tokens in read_documents(run["out"]).values()])
    assert lengths.max() < 301
    for q in (1, 5, 10, 25, 50, 75, 90, 95, 99):
        assert re.search(rf"\bp{q} {np.percentile(lengths, q):,.0f}\b", text), q
    assert f"mean {lengths.mean():,.1f}  min {lengths.min()}" in text and f"max {lengths.max()}" in text

    # Per language, recomputed from the texts with tiktoken itself.
    expected: dict[str, list[int]] = {}
    for t, lang in zip(run["texts"], run["langs"]):
        if t:
            entry = expected.setdefault(lang, [0, 0])
            entry[0] += len(expected_tokens(gpt2, t))
            entry[1] += 1
    assert "per language (the inputs' 'language' column; 3 languages)" in text
    for lang, (tokens, docs) in expected.items():
        assert re.search(rf"\n +{lang}  +{tokens:,} tokens +[\d.]+%  +{docs:,} docs\n", text), lang
    assert sum(t for t, _ in expected.values()) == totals["tokens"]

    assert text.rstrip().endswith(f"plot: {png}")
    raw = png.read_bytes()
    assert raw.startswith(PNG_MAGIC)
    import matplotlib.image

    image = matplotlib.image.imread(str(png))
    assert image.shape[0] >= 600 and image.shape[1] >= 1000  # 10 x 5.6 in at 120 dpi
    assert image[..., :3].std() > 0.05  # something is drawn


def test_a_removed_input_is_named_and_counts_still_print(run, capsys):
    run["input"].unlink()
    text = _printed(capsys, ["inspect", str(run["out"])])
    assert re.search(rf"per language: not available \(input {re.escape(str(run['input']))} is unreachable \(FileNotFoundError", text)
    assert "tokens per document" in text


def test_partial_language_coverage_says_how_much(tokenize, tmp_path, capsys):
    a, *_ = _corpus(tmp_path / "in", name="a.parquet", n=60)
    b, *_ = _corpus(tmp_path / "in", name="b.parquet", n=60, seed=1)
    _, out = tokenize([a, b])
    b.unlink()
    text = _printed(capsys, ["inspect", str(out)])
    assert "per language (the inputs' 'language' column, covering 1 of 2 partitions; 3 languages)" in text
    assert re.search(rf"note: input {re.escape(str(b))} is unreachable", text)


def test_input_without_language_column(tokenize, tmp_path, capsys):
    path, *_ = _corpus(tmp_path / "in", language=False, n=30)
    _, out = tokenize([path])
    text = _printed(capsys, ["inspect", str(out)])
    assert f"per language: not available (input {path} has no 'language' column)" in text


def test_not_a_finished_run(tmp_path, capsys):
    (tmp_path / "half").mkdir()
    assert main(["inspect", str(tmp_path / "half")]) == 2
    assert re.fullmatch(r"tokenshards: error: .*half: no manifest.json; not a finished tokenshards run .*\n",
                        capsys.readouterr().err)


def test_a_missing_docs_file_is_named(run):
    manifest = json.loads((run["out"] / "manifest.json").read_text())
    (run["out"] / manifest["partitions"][1]["docs_file"]).unlink()
    with pytest.raises(UserError, match=r"part-00001\.docs\.parquet: listed in the manifest but missing; run `tokenshards verify`"):
        inspect_output(str(run["out"]))


def test_inspects_an_s3_output_and_writes_the_plot_there(run, s3, cluster, capsys):
    bucket = s3.make_bucket()
    fs = s3.fs()
    fs.put(str(run["out"]) + "/", f"{bucket}/runs/one/", recursive=True)
    local = _printed(capsys, ["inspect", str(run["out"])])
    options = [f"--storage-option={k}={v}" for k, v in (("key", s3.key), ("secret", s3.secret),
                                                        ("endpoint_url", s3.endpoint_url), ("region_name", "us-east-1"))]
    remote = _printed(capsys, ["inspect", f"s3://{bucket}/runs/one", "--plot", f"s3://{bucket}/plots/lengths.png", *options])
    # Same numbers whichever storage holds the run (the first line names the run itself).
    assert remote.splitlines()[1:-1] == local.splitlines()[1:]
    assert s3.fs().cat(f"{bucket}/plots/lengths.png").startswith(PNG_MAGIC)
    # And whichever machine reads it: the workers get the storage options with their tasks.
    workers = _printed(capsys, _on_cluster(cluster, "inspect", f"s3://{bucket}/runs/one", *options))
    assert workers == remote.rsplit("plot: ", 1)[0]


def test_percentiles_of_long_documents_stay_within_a_bin():
    """Above 300 tokens the histogram's bins are under 0.7% wide: so is the error."""
    lengths = (np.exp(np.random.default_rng(3).normal(6.5, 1.6, 50_000)) + 1).astype(np.int64)
    stats = RunStats(out="x", manifest={})
    stats.add(PartitionStats(counts=np.bincount(np.searchsorted(LENGTH_EDGES, lengths, side="right") - 1,
                                                minlength=len(LENGTH_EDGES)),
                             docs=len(lengths), tokens=int(lengths.sum()), min=int(lengths.min()), max=int(lengths.max())))
    for q in (1, 10, 50, 90, 99, 99.9):
        exact = np.percentile(lengths, q)
        assert abs(stats.percentile(q) - exact) <= max(1.0, BIN_WIDTH * exact), q


def test_empty_run_plot_is_refused(run, tmp_path):
    stats = inspect_output(str(run["out"]))
    stats.docs = 0
    with pytest.raises(UserError, match=r"holds no documents: nothing to plot"):
        plot_lengths(stats, str(tmp_path / "x.png"))


def test_each_inputs_footer_is_parsed_once_not_per_partition(run, capsys, monkeypatch):
    """An input's footer grows with its row groups; parsed again for every partition, inspect's
    time per partition grew with them (the scale rehearsal, docs/scaling.md). Kept, it is parsed
    once for the run's one input however many partitions read from it."""
    import pyarrow.parquet as pq

    from tokenshards.inspect import stats

    parsed = []

    class Counting(pq.ParquetFile):
        def __init__(self, source, *args, metadata=None, **kwargs):
            if metadata is None:
                parsed.append(source)
            super().__init__(source, *args, metadata=metadata, **kwargs)

    monkeypatch.setattr(stats.pq, "ParquetFile", Counting)
    text = _printed(capsys, ["inspect", str(run["out"])])
    partitions = len(json.loads((run["out"] / "manifest.json").read_text())["partitions"])
    assert partitions > 2 and "languages" in text
    assert len(parsed) == 1, (len(parsed), partitions)


# -- on the cluster (issue 48): the same report, the client's work flat in the partitions -------------

@pytest.fixture
def small_tasks(monkeypatch):
    """One partition a task and two summaries a tree node: a run of a few partitions then takes
    several tasks and a tree of three levels, as a large run does."""
    from tokenshards.inspect import oncluster

    monkeypatch.setattr(oncluster, "MIN_BATCH", 1)
    monkeypatch.setattr(oncluster, "MAX_BATCH", 1)
    monkeypatch.setattr(oncluster, "FAN_IN", 2)


def test_the_cluster_gives_the_report_and_plot_this_process_gives(run, cluster, small_tasks, tmp_path, capsys,
                                                                  monkeypatch):
    from tokenshards.inspect import stats

    here = _printed(capsys, ["inspect", str(run["out"]), "--plot", str(tmp_path / "here.png")])

    def never(*args, **kwargs):
        raise AssertionError("a docs file or an input was read on the client")

    monkeypatch.setattr(stats.pq, "read_table", never)  # in this process only: the workers read
    monkeypatch.setattr(stats.pq, "ParquetFile", never)
    there = _printed(capsys, _on_cluster(cluster, "inspect", str(run["out"]), "--plot", str(tmp_path / "there.png")))
    assert len(json.loads((run["out"] / "manifest.json").read_text())["partitions"]) >= 5  # >= 5 tasks, 3 levels
    assert there.replace("there.png", "here.png") == here
    assert "per language (the inputs' 'language' column; 3 languages)" in there
    assert (tmp_path / "there.png").read_bytes() == (tmp_path / "here.png").read_bytes()  # the same drawing, to the byte


def test_on_the_cluster_partial_coverage_and_its_notes_in_the_runs_order(tokenize, cluster, small_tasks, tmp_path,
                                                                          capsys):
    """Problems merge in the partitions' order whatever the tree: the same notes, the same coverage."""
    paths = [_corpus(tmp_path / "in", name=f"{c}.parquet", n=60, seed=i)[0] for i, c in enumerate("abcd")]
    _, out = tokenize(paths, partition_bytes=1500)
    for gone in (paths[1], paths[3]):
        gone.unlink()
    here = _printed(capsys, ["inspect", str(out)])
    there = _printed(capsys, _on_cluster(cluster, "inspect", str(out)))
    assert there == here
    notes = [line for line in there.splitlines() if "note: input" in line]
    assert [str(paths[1]) in notes[0], str(paths[3]) in notes[1]] == [True, True], notes


def test_a_run_past_the_bound_is_read_on_a_cluster_and_a_small_one_here(run, cluster, monkeypatch):
    """No cluster named: a small run is read in this process; a larger one starts one (here, the
    session's stands in for the local cluster it would start) and gets the same numbers."""
    from tokenshards.inspect import command, oncluster
    from tokenshards.inspect.stats import report_lines

    connected = []
    real = oncluster.runner.connect_to

    def connect_to(options, **kwargs):
        connected.append(options)
        return real(dataclasses.replace(options, scheduler=cluster.scheduler_address), **kwargs)

    monkeypatch.setattr(oncluster.runner, "connect_to", connect_to)
    config = command.InspectConfig(out=str(run["out"]), progress="none")
    here = report_lines(command.run_inspect(config, announce=lambda m: None))
    assert not connected
    monkeypatch.setattr(command, "LOCAL_PARTITIONS", 2)
    assert report_lines(command.run_inspect(config, announce=lambda m: None)) == here
    assert len(connected) == 1 and connected[0].scheduler is None  # what it would have started: a local cluster



def test_local_inputs_the_workers_machines_do_not_see_are_a_note_not_wrong_counts(run, cluster, monkeypatch, capsys):
    """Workers on another machine than this one, which sees the run's local inputs otherwise (the
    run itself they see, on a shared disk): the totals and lengths as ever, per language the reason."""
    from tokenshards.cluster import machines

    worker = next(iter(cluster.workers.values())).worker_address
    monkeypatch.setattr(machines, "other_machines",
                        lambda client: [machines.Machine(name="elsewhere", view="another", worker=worker)])
    real = machines._stat  # what this machine sees; the worker's own check is not patched
    monkeypatch.setattr(machines, "_stat", lambda path: (1, 1) if path == str(run["input"]) else real(path))
    text = _printed(capsys, _on_cluster(cluster, "inspect", str(run["out"])))
    here = _printed(capsys, ["inspect", str(run["out"])])
    assert text.split("per language")[0] == here.split("per language")[0]
    assert (f"per language: not available (the workers on elsewhere do not see the input files this machine sees at "
            f"{run['input']}; put the inputs on s3:// or a filesystem every machine mounts)") in text


def test_batches_are_a_few_per_worker_thread_within_bounds():
    from tokenshards.inspect.oncluster import MAX_BATCH, MIN_BATCH, batch_size

    assert batch_size(16_384, 2) == MAX_BATCH  # a 2-core machine: a few hundred tasks, not 16,384
    assert batch_size(16_384, 1_024) == 4  # hundreds of cores: ~4 tasks a thread
    assert batch_size(10, 2) == MIN_BATCH


def test_a_missing_docs_file_on_the_cluster_is_one_line(run, cluster, capsys):
    manifest = json.loads((run["out"] / "manifest.json").read_text())
    (run["out"] / manifest["partitions"][1]["docs_file"]).unlink()
    assert main(_on_cluster(cluster, "inspect", str(run["out"]))) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("tokenshards: error:") == 1, err
    assert re.fullmatch(r"tokenshards: error: \S+part-00001\.docs\.parquet: listed in the manifest but missing; "
                        r"run `tokenshards verify` on this output", err.splitlines()[-1]), err


def test_a_hub_workers_run_is_counted_per_language_by_workers_that_never_saw_it(tokenize, tmp_path, monkeypatch):
    """A ``--fetch workers`` run's inputs are ``hfcache://`` references: the workers of a new
    cluster, which never ran it, read them through the reading plugins inspect registers there
    (the run's download folder, else the Hub by range): the report this process gives."""
    import logging

    from distributed import LocalCluster
    from huggingface_hub import constants

    from hubserver import HubServer
    from tokenshards.inspect.command import InspectConfig, run_inspect
    from tokenshards.storage.hub import HubDataset

    repo = tmp_path / "repo"
    for n in range(2):
        _corpus(repo / "sample" / "10BT", name=f"00{n}_00000.parquet", n=90, seed=n)
    with HubServer(repo, repo="HuggingFaceFW/fineweb", page_size=2) as server:
        ds = HubDataset(repo="HuggingFaceFW/fineweb", size="10B", endpoint=server.url, cache_dir=str(tmp_path / "hf"),
                        backoff=0.05, keep_free=0, fetch="workers", download_dir=str(tmp_path / "dl"))
        _, out = tokenize([], out=tmp_path / "hubrun", hub=ds, partition_bytes=3000)
        monkeypatch.setattr(constants, "ENDPOINT", server.url)  # HF_ENDPOINT, as inspect's process read it
        here = report_lines_of(inspect_output(str(out)))
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                          silence_logs=logging.CRITICAL) as fresh:
            there = report_lines_of(run_inspect(InspectConfig(out=str(out), scheduler=fresh.scheduler_address,
                                                              progress="none"), announce=lambda m: None))
    assert there == here
    assert "per language (the inputs' 'language' column; 3 languages)" in there
