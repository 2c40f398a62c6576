"""Growing a finished run with more inputs (``tokenize --add``): the inputs already in OUT keep
their partitions byte for byte, the new ones are numbered after them, and every step equals a
from-scratch run of the same inputs (same --partition-mb; new files sort after the old, so even
the partition numbers agree)."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from readback import expected_tokens, read_documents
from test_export import WORDS, expected_split, flat
from conftest import download
from test_s3 import upload

from tokenshards.errors import InputChanged, OutputConflict
from tokenshards.export import ExportConfig, run_export
from tokenshards.format.reader import TokenDataset
from tokenshards.format.v1 import Encoding, Manifest, Totals
from tokenshards.inspect.stats import inspect_output, report_lines
from tokenshards.tokenize.config import TokenizeConfig
from tokenshards.tokenize.grow import inputs_to_add
from tokenshards.tokenize.command import run_tokenize
from tokenshards.verify.command import VerifyConfig, run_verify

PARTITION_BYTES = 6000
STEPS = (("a0", "a1"), ("b0",), ("c0",))
"""The inputs each step adds (the first step is the first run)."""
TOKENSHARDS = str(Path(sys.executable).with_name("tokenshards"))


def write_file(path: Path, seed: int, n: int = 90) -> list[str | None]:
    rng = random.Random(seed)
    texts = [None if i % 17 == 5 else "" if i % 23 == 7 else
             " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 120))) for i in range(n)]
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": [f"{path.stem}-{i}" for i in range(n)], "text": pa.array(texts, pa.string())}),
                   path, row_group_size=15)
    return texts


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grow") / "in"
    texts = {f"{name}.parquet": write_file(folder / f"{name}.parquet", seed)
             for seed, name in enumerate(n for step in STEPS for n in step)}
    return {"folder": folder, "texts": texts}


def files_of(corpus, *steps) -> list[str]:
    return [str(corpus["folder"] / f"{n}.parquet") for step in steps for n in step]


def tokenize(cluster, inputs, out, notes: list | None = None, **options):
    config = TokenizeConfig(inputs=tuple(map(str, inputs)), out=str(out), scheduler=cluster.scheduler_address,
                            progress="none", **{"partition_bytes": PARTITION_BYTES, **options})
    return run_tokenize(config, announce=(notes.append if notes is not None else lambda m: None))


@pytest.fixture(scope="module")
def scratch(corpus, cluster, tmp_path_factory):
    """From-scratch runs of the inputs of steps 1, 1-2 and 1-3."""
    root = tmp_path_factory.mktemp("scratch")
    outs = []
    for n in range(1, len(STEPS) + 1):
        out = root / f"steps{n}"
        tokenize(cluster, files_of(corpus, *STEPS[:n]), out)
        outs.append(out)
    return outs


@pytest.fixture(scope="module")
def grown(corpus, cluster, tmp_path_factory):
    """One OUT grown in three steps: a snapshot of its files after each, and what each step said."""
    out = tmp_path_factory.mktemp("grown") / "out"
    snapshots, notes = [], []
    tokenize(cluster, files_of(corpus, STEPS[0]), out)
    snapshots.append(snapshot(out))
    said: list[str] = []
    tokenize(cluster, files_of(corpus, STEPS[1]), out, said, add=True)  # the new file alone
    notes.append(said)
    snapshots.append(snapshot(out))
    said = []
    tokenize(cluster, files_of(corpus, *STEPS), out, said, add=True)  # every file, old ones too
    notes.append(said)
    snapshots.append(snapshot(out))
    return {"out": out, "snapshots": snapshots, "notes": notes}


def snapshot(out: Path) -> dict[str, bytes]:
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def data_files(files: dict[str, bytes]) -> dict[str, bytes]:
    return {k: v for k, v in files.items() if k.endswith((".tokens.npy", ".docs.parquet"))}


def check_exact(out: Path, corpus, gpt2, inputs: list[str]) -> None:
    docs = read_documents(out)
    for (path, row), (doc_id, tokens) in docs.items():
        name = Path(path).name
        assert tokens == expected_tokens(gpt2, corpus["texts"][name][row]), (path, row)
        assert doc_id == f"{Path(path).stem}-{row}"
    assert len(docs) == sum(1 for i in inputs for t in corpus["texts"][Path(i).name] if t)


def test_each_step_equals_a_run_from_scratch(grown, scratch, corpus, cluster, gpt2):
    for n, (files, fresh) in enumerate(zip(grown["snapshots"], scratch), start=1):
        # Tokens and docs files byte for byte; the manifest's partitions too.
        assert data_files(files) == data_files(snapshot(fresh)), n
        manifest, want = json.loads(files["manifest.json"]), json.loads((fresh / "manifest.json").read_text())
        assert manifest["format"] == "tokenshards/1"
        assert manifest["partitions"] == want["partitions"]
        assert manifest["totals"] == want["totals"] and manifest["planned_partitions"] == want["planned_partitions"]
        assert [i["path"] for i in manifest["inputs"]] == [i["path"] for i in want["inputs"]]
        if n > 1:
            assert [i["generation"] for i in manifest["inputs"]] == [0, 0, 1, 2][:len(manifest["inputs"])]
            assert manifest["partition_bytes"] == PARTITION_BYTES and manifest["job"] != manifest["parts_job"]
        # What an earlier step committed is still there, every byte (done records included).
        if n > 1:
            earlier = grown["snapshots"][n - 2]
            assert {k: files[k] for k in earlier if k.startswith("parts/")} == \
                   {k: v for k, v in earlier.items() if k.startswith("parts/")}
    check_exact(grown["out"], corpus, gpt2, files_of(corpus, *STEPS))
    assert any("keeps its 2 inputs" in m and "generation 1" in m for m in grown["notes"][0])
    report = run_verify(VerifyConfig(out=str(grown["out"]), scheduler=cluster.scheduler_address, deep=50),
                        announce=lambda m: None)
    assert not report.problems


def test_readers_see_one_run(grown, scratch):
    grown_set, fresh = TokenDataset(str(grown["out"])), TokenDataset(str(scratch[-1]))
    assert (len(grown_set), grown_set.n_tokens) == (len(fresh), fresh.n_tokens)
    assert all((a == b).all() for a, b in zip(grown_set, fresh))
    stats, want = inspect_output(str(grown["out"])), inspect_output(str(scratch[-1]))
    assert (stats.docs, stats.tokens, stats.min, stats.max) == (want.docs, want.tokens, want.min, want.max)
    assert (stats.counts == want.counts).all()
    # inspect says how the grown run was put together; a run never grown says nothing of it.
    [grown_line] = [line for line in report_lines(stats) if line.startswith("inputs")]
    assert grown_line.endswith("; added in 3 steps (tokenize --add): generation 0: 2 files, generation 1: 1 file, "
                               "generation 2: 1 file"), grown_line
    assert not any("generation" in line for line in report_lines(want))


def test_export_before_growth_stays_and_after_it_is_exact(grown, scratch, corpus, cluster, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(scratch[0], out)
    run_export(ExportConfig(out=str(out), to=str(tmp_path / "before"), format="npy", val_tokens=800,
                            scheduler=cluster.scheduler_address), announce=lambda m: None)
    before = snapshot(tmp_path / "before")
    tokenize(cluster, files_of(corpus, STEPS[1], STEPS[2]), out, add=True)  # two files, one generation
    manifest = json.loads((out / "manifest.json").read_text())
    assert [i["generation"] for i in manifest["inputs"]] == [0, 0, 1, 1]
    assert snapshot(tmp_path / "before") == before  # the earlier export is untouched, and names its run's job
    record = json.loads(before["fineweb_export.json"]) if "fineweb_export.json" in before else \
        json.loads(next(v for k, v in before.items() if k.endswith("_export.json")))
    assert record["source_job"] == json.loads((scratch[0] / "manifest.json").read_text())["job"] != manifest["job"]
    assert read_npy_stream(tmp_path / "before", "val") == flat(expected_split(scratch[0], 800)[0])
    assert read_npy_stream(tmp_path / "before", "train") == flat(expected_split(scratch[0], 800)[1])

    run_export(ExportConfig(out=str(out), to=str(tmp_path / "after"), format="npy", val_tokens=800,
                            scheduler=cluster.scheduler_address), announce=lambda m: None)
    run_export(ExportConfig(out=str(scratch[2]), to=str(tmp_path / "fresh"), format="npy", val_tokens=800,
                            scheduler=cluster.scheduler_address), announce=lambda m: None)
    after, fresh = snapshot(tmp_path / "after"), snapshot(tmp_path / "fresh")
    assert {k: v for k, v in after.items() if k.endswith(".npy")} == {k: v for k, v in fresh.items() if k.endswith(".npy")}
    assert read_npy_stream(tmp_path / "after", "val") == flat(expected_split(out, 800)[0])
    assert read_npy_stream(tmp_path / "after", "train") == flat(expected_split(out, 800)[1])


def read_npy_stream(folder: Path, split: str) -> list[int]:
    import numpy as np

    shards = sorted(folder.glob(f"fineweb_{split}_*.npy"))
    return [int(t) for p in shards for t in np.load(p)]


def test_adding_the_same_inputs_again_changes_nothing(grown, corpus, cluster, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(grown["out"], out)
    before = snapshot(out)
    notes: list[str] = []
    summary = tokenize(cluster, files_of(corpus, *STEPS), out, notes, add=True)
    assert any("nothing to add" in n and "left unchanged" in n for n in notes), notes
    assert snapshot(out) == before and summary.tokens == json.loads(before["manifest.json"])["totals"]["tokens"]
    notes = []
    tokenize(cluster, files_of(corpus, *STEPS), out, notes)  # the same inputs without --add: nothing to do either
    assert any("nothing to do" in n for n in notes) and snapshot(out) == before


def test_more_inputs_without_add_are_refused_with_a_hint(scratch, corpus, cluster, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(scratch[0], out)
    with pytest.raises(OutputConflict, match=r"already holds a different run .*1 added.*\); "
                                             r"to add the 1 new input to it, keeping its partitions, pass --add \(or"):
        tokenize(cluster, files_of(corpus, STEPS[0], STEPS[1]), out, partition_bytes=None)  # auto: another size
    with pytest.raises(OutputConflict, match="differs from the 0.006 MB the run .* was cut with; a growth reuses it"):
        tokenize(cluster, files_of(corpus, STEPS[1]), out, add=True, partition_bytes=9000)
    with pytest.raises(OutputConflict, match="holds a run with other options .*eot_position 'prefix' → 'suffix'"):
        tokenize(cluster, files_of(corpus, STEPS[1]), out, add=True, eot_position="suffix")
    assert snapshot(out) == snapshot(scratch[0])


def test_a_changed_old_input_is_refused_in_one_line(corpus, cluster, tmp_path):
    folder = tmp_path / "in"
    shutil.copytree(corpus["folder"], folder)
    out = tmp_path / "out"
    tokenize(cluster, [folder / "a0.parquet", folder / "a1.parquet"], out)
    before = snapshot(out)
    write_file(folder / "a1.parquet", seed=99, n=91)  # rewritten since it was tokenized
    with pytest.raises(InputChanged, match=r"a1.parquet changed since it was added to .*\(mtime_ns \d+ → \d+, size "
                                           r"\d+ → \d+\); its partitions there are of the earlier version: "
                                           r"restore it, add it under another name, or pass --overwrite"):
        tokenize(cluster, [folder / "a1.parquet", folder / "b0.parquet"], out, add=True)
    assert snapshot(out) == before


def test_a_growth_killed_midway_resumes_with_the_same_command(corpus, scratch, cluster, tmp_path):
    """The client dies after some of the new partitions committed; the manifest is still the old
    one (readers see the run before the growth); the same command finishes it exactly."""
    out = tmp_path / "out"
    shutil.copytree(scratch[0], out)
    big = tmp_path / "in" / "b0.parquet"
    big.parent.mkdir()
    from tokenshards.demo import help_topics

    topics = [text for _, text in help_topics()]
    texts = [f"copy {i}\n{topics[i % len(topics)]}" for i in range(12 * len(topics))]  # ~5.6 MB: time to kill
    pq.write_table(pa.table({"id": [f"b0-{i}" for i in range(len(texts))], "text": texts}), big, row_group_size=20)
    cmd = [TOKENSHARDS, "tokenize", "--add", "--input", str(big), "--out", str(out), "--progress", "none",
           "--scheduler", cluster.scheduler_address]
    first = len(json.loads((out / "manifest.json").read_text())["partitions"])
    client = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ})
    deadline = time.monotonic() + 120
    while len([p for p in (out / "parts").glob("*.done.json") if int(p.name[5:10]) >= first]) < 2:
        assert time.monotonic() < deadline and client.poll() is None, "the growth ended before it could be killed"
        time.sleep(0.02)
    os.killpg(client.pid, 9)
    client.wait()
    assert json.loads((out / "manifest.json").read_text())["partitions"] == \
        json.loads((scratch[0] / "manifest.json").read_text())["partitions"]
    report = run_verify(VerifyConfig(out=str(out), scheduler=cluster.scheduler_address), announce=lambda m: None)
    assert not report.problems and any("unfinished `tokenize --add`" in w for w in report.warnings)
    with pytest.raises(OutputConflict, match=r"holds an unfinished --add of 1 input \(first: .*b0.parquet\); rerun that"):
        tokenize(cluster, files_of(corpus, STEPS[2]), out, add=True)
    time.sleep(1)  # the scheduler drops the dead client's tasks
    rerun = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert rerun.returncode == 0, rerun.stderr
    assert "finishing 1 input as generation 1" in rerun.stderr and "already committed, skipping them" in rerun.stderr

    fresh = tmp_path / "fresh"
    tokenize(cluster, [*files_of(corpus, STEPS[0]), big], fresh)
    assert data_files(snapshot(out)) == data_files(snapshot(fresh))
    assert json.loads((out / "manifest.json").read_text())["partitions"] == \
        json.loads((fresh / "manifest.json").read_text())["partitions"]


def test_growth_on_s3(s3, corpus, scratch, cluster, tmp_path):  # noqa: F811
    bucket = s3.make_bucket()
    upload(s3, corpus["folder"], bucket, "in")
    out = f"s3://{bucket}/run"

    def run(names, **options):
        config = TokenizeConfig(inputs=tuple(f"s3://{bucket}/in/{n}.parquet" for n in names), out=out,
                                scheduler=cluster.scheduler_address, progress="none",
                                storage_options=s3.storage_options, partition_bytes=PARTITION_BYTES, **options)
        return run_tokenize(config, announce=lambda m: None)

    run(STEPS[0], add=True)  # --add on an empty OUT: its first run, so one command serves every step
    download(s3.fs(), f"{bucket}/run", tmp_path / "one")
    assert data_files(snapshot(tmp_path / "one")) == data_files(snapshot(scratch[0]))
    run(STEPS[1], add=True)
    download(s3.fs(), f"{bucket}/run", tmp_path / "two")
    one, two = snapshot(tmp_path / "one"), snapshot(tmp_path / "two")
    assert {k: two[k] for k in one if k.startswith("parts/")} == {k: v for k, v in one.items() if k.startswith("parts/")}
    assert data_files(two) == data_files(snapshot(scratch[1]))
    manifest = json.loads(two["manifest.json"])
    assert [i["generation"] for i in manifest["inputs"]] == [0, 0, 1]
    assert [e["sha256"] for e in manifest["partitions"]] == \
           [e["sha256"] for e in json.loads((scratch[1] / "manifest.json").read_text())["partitions"]]
    # A growth that died midway (the old manifest, some new partitions never committed): the same command finishes it.
    fs, new = s3.fs(), [e["index"] for e in manifest["partitions"]][len(json.loads(one["manifest.json"])["partitions"]):]
    fs.pipe_file(f"{bucket}/run/manifest.json", one["manifest.json"])
    fs.rm([f"{bucket}/run/parts/part-{i:05d}.done.json" for i in new[::2]])
    run(STEPS[1], add=True)
    download(s3.fs(), f"{bucket}/run", tmp_path / "again")
    assert snapshot(tmp_path / "again") == two
    # An input changed in the bucket since it was added: refused, nothing written.
    s3.fs().pipe_file(f"{bucket}/in/a0.parquet", (corpus["folder"] / "a1.parquet").read_bytes())
    with pytest.raises(InputChanged, match=r"s3://.*/in/a0.parquet changed since it was added"):
        run(("a0", "c0"), add=True)
    download(s3.fs(), f"{bucket}/run", tmp_path / "three")
    assert snapshot(tmp_path / "three") == two


# -- the pure decision: what a command adds to the run in OUT -------------------------------------
def _run(paths_by_generation: dict[int, list[str]], *, finished: int) -> tuple[dict, Manifest]:
    """A job file and a manifest whose generations up to ``finished`` are done."""
    inputs = [{"path": p, "generation": g} for g, paths in paths_by_generation.items() for p in paths]
    manifest = Manifest(encoding=Encoding(name="gpt2", n_vocab=50257, eot=50256, dtype="uint16"), eot_position="prefix",
                        text_column="text", inputs=tuple(i for i in inputs if i["generation"] <= finished),
                        partitions=(), totals=Totals(rows=0, docs=0, tokens=0, skipped_null=0, skipped_empty=0))
    return {"inputs": inputs}, manifest


def test_inputs_to_add_numbers_generations_and_guards_unfinished_growths():
    recorded, kept = _run({0: ["a", "b"]}, finished=0)
    assert inputs_to_add(recorded, kept, ["a", "c"], add=True, url="OUT") == ({"c"}, 1, False)
    assert inputs_to_add(recorded, kept, ["c"], add=True, url="OUT") == ({"c"}, 1, False)
    assert inputs_to_add(recorded, kept, ["a", "b"], add=True, url="OUT") == (set(), 1, False)
    recorded, kept = _run({0: ["a"], 1: ["b"], 2: ["c", "d"]}, finished=1)  # generation 2 was interrupted
    assert inputs_to_add(recorded, kept, ["d", "c"], add=True, url="OUT") == ({"c", "d"}, 2, True)
    assert inputs_to_add(recorded, kept, ["a", "b", "c", "d"], add=False, url="OUT") == ({"c", "d"}, 2, True)
    with pytest.raises(OutputConflict, match=r"^OUT holds an unfinished --add of 2 inputs \(first: c\); rerun that"):
        inputs_to_add(recorded, kept, ["c", "e"], add=True, url="OUT")
    recorded, kept = _run({0: ["a"], 1: ["b"]}, finished=1)
    with pytest.raises(OutputConflict, match=r"grown run of other inputs \(1 added, 0 removed\); to add the 1 new input, pass --add$"):
        inputs_to_add(recorded, kept, ["a", "b", "c"], add=False, url="OUT")
    with pytest.raises(OutputConflict, match=r"\(0 added, 1 removed\); use another --out, or pass --overwrite"):
        inputs_to_add(recorded, kept, ["a"], add=False, url="OUT")

