"""The dataset card (``README.md``) of a published export, made from its export record alone.

Pure: record in (``format.export_record.ExportRecord``), Markdown out, the same bytes for the same
record (a resumed publish rewrites nothing). The YAML header is the minimal metadata the Hub reads:
a pretty name, tags, and ``viewer: false`` (the dataset viewer reads parquet, CSV or JSON; pointed
at token shards through a ``configs:`` entry it would only show an error). No ``license``: it is
the source text's (FineWeb's is ODC-By) and only the publisher can state it.
"""
from __future__ import annotations

import json
import re

import numpy as np

from ..format.export_record import ExportFile, ExportRecord, ExportSource
from .formats import REGISTRY, hf

MARKER = "<!-- written by tokenshards export; rewritten by the next publish into this folder -->"

EOT = {"prefix": "before each document (`[eot] + tokens`, as llm.c, build-nanogpt and modded-nanogpt write)",
       "suffix": "after each document (`tokens + [eot]`, as Megatron's `--append-eod`)",
       "none": "none: documents follow each other with no separator"}


def _described(fmt: str) -> tuple[str, list[str]]:
    """What the format is and the Hub tags of who reads it, from the format's own module."""
    f = REGISTRY.get(fmt)
    if f is None:  # a record of a format this version does not know
        return fmt, []
    return f.card or f.help, re.findall(r"[\w.\-]+", f.reader.lower())


def dataset_card(record: ExportRecord, *, repo: str, folder: str, record_name: str, at_root: bool = False) -> str:
    """Markdown with a YAML header; says what the export holds and how a trainer downloads it.
    The card lies in ``folder`` beside the shards, or, ``at_root``, in the repo's root: the paths
    it names (``data_files``, the record's link) are relative to where it lies, as ``load_dataset``
    reads them (the repo, or a downloaded copy of the folder)."""
    fmt = record.export_format
    what, tags = _described(fmt)
    files = record.files
    where = f"{repo}/{folder}" if folder else repo
    title = f"{where}: {record.encoding.name} tokens, {fmt}"
    # hf exports are parquet the viewer and load_dataset read through `configs`; token shards are not.
    inside = folder if at_root else ""
    viewer = (hf.configs_yaml([f.split for f in files], folder=inside) if fmt == "hf" else ["viewer: false"])
    record_link = f"{inside}/{record_name}" if inside else record_name
    header = ["---", f"pretty_name: {json.dumps(title)}", "tags:",
              *(f"- {t}" for t in ["tokenshards", "tokenized", *tags]), *viewer, "---", MARKER, ""]
    body = [f"# {title}", "",
            f"Tokenized text for LLM pretraining, written by `tokenshards export --format {fmt}`"
            f"{' into `' + folder + '/`' if folder else ''}. Every fact below is also in "
            f"[`{record_name}`]({record_link}), the export record beside the shards.", "",
            "| | |", "|---|---|",
            *_rows(record, what=what), "",
            "## Files", "", "| file | split | tokens | bytes |", "|---|---|---:|---:|",
            *(f"| `{f.name}` | {f.split} | {f.tokens:,} | {f.bytes:,} |" for f in files), "",
            "## Download", "", *_download(repo, folder, files, fmt, record_name), "",
            f"Published to `hf://datasets/{where}` with huggingface_hub's upload API.", ""]
    return "\n".join(header + body)


def _rows(record: ExportRecord, *, what: str) -> list[str]:
    enc = record.encoding
    rows = [("Source runs", _sources(record)),
            ("Encoding", f"`{enc.name}`, n_vocab {enc.n_vocab:,}, eot id {enc.eot}, stored as {_dtype(record.dtype)}"),
            ("eot", EOT.get(record.eot_position, record.eot_position)),
            ("Export format", f"`{record.export_format}`: {what}")]
    if record.shard_tokens:
        rows.append(("Shards", f"{record.shard_tokens:,} tokens each (a split's last holds the rest; one under "
                               f"{record.min_shard_tokens or 0:,} tokens joins the one before it)"))
    for split in ("train", "val"):
        mine = record.files_of(split)
        s = record.splits[split]
        rows.append((f"{'Train' if split == 'train' else 'Validation'}",
                     f"{s.tokens:,} tokens, {s.docs:,} documents, {len(mine)} file{'s' if len(mine) != 1 else ''}"
                     + (f" ({_sizes(mine)})" if mine else "")))
    rows.append(("Validation set", f"{record.val_tokens_requested:,} tokens requested: {record.val_selection}"))
    order = record.order
    rows.append(("Order", f"shuffled over the whole corpus, seed {order.seed} ({order.key})" if order
                 else "source order (manifest order of the run's partitions)"))
    if len(record.sources) > 1 or record.tokens_requested:
        rows.append(("Mixture", "; ".join(_share(s) for s in record.sources)))
    return [f"| {k} | {v} |" for k, v in rows]


def _share(s: ExportSource) -> str:
    """One run's part of a mixture: of documents by weight (shuffled), or of rows (a rows export)."""
    if s.weight is None:  # every one of its sequences ``epochs`` times, then ``extra`` more (pack.Copies)
        taken = s.sequences * s.epochs + s.extra
        return f"`{s.path}`: {taken:,} train sequences ({s.epochs} x its {s.sequences:,} + {s.extra:,})"
    return f"`{s.path}` weight {s.weight:.4g}: {s.tokens:,} train tokens, {s.epochs:.3g} epochs"


def _sources(record: ExportRecord) -> str:
    if record.sources:
        return "; ".join(f"`{s.path}` (job `{s.source_job}`)" for s in record.sources)
    return f"`{record.source}` (job `{record.source_job}`)"


def _dtype(dtype: str) -> str:
    """``<u2`` → ``uint16 (little-endian)``."""
    return str(np.dtype(dtype).name) + (" (little-endian)" if np.dtype(dtype).itemsize > 1 else "")


def _sizes(files: list[ExportFile]) -> str:
    tokens = sorted({f.tokens for f in files})
    if len(files) == 1:
        return f"{tokens[0]:,} tokens"
    if len(tokens) == 1:
        return f"{tokens[0]:,} tokens each"
    return f"{files[0].tokens:,} tokens in the first, {files[-1].tokens:,} in the last"


def _download(repo: str, folder: str, files: tuple[ExportFile, ...], fmt: str, record_name: str) -> list[str]:
    """modded-nanogpt's ``data/cached_fineweb10B.py`` way: one ``hf_hub_download`` per file into a
    local folder, skipping what is there (the record lists the files); or ``snapshot_download``."""
    prefix = f"{folder}/" if folder else ""
    lines = ["```python", "import json, os", "from huggingface_hub import hf_hub_download", "",
             "local_dir = os.path.join(os.path.dirname(__file__), 'data')", "",
             "def get(fname):",
             f"    path = os.path.join(local_dir, {folder!r}, fname)" if folder else "    path = os.path.join(local_dir, fname)",
             "    if not os.path.exists(path):",
             f"        hf_hub_download(repo_id={repo!r}, filename={(repr(prefix) + ' + ') if prefix else ''}fname, repo_type='dataset', "
             "local_dir=local_dir)",
             "    return path", "",
             f"record = json.load(open(get({record_name!r})))",
             "for f in record['files']:  # validation first; or only the first N train files, as modded-nanogpt's script takes",
             "    get(f['name'])",
             "```", "", "Or all of it at once:", "", "```python", "from huggingface_hub import snapshot_download",
             f"snapshot_download(repo_id={repo!r}, repo_type='dataset', allow_patterns={(prefix + '*')!r}, local_dir='data')",
             "```"]
    return lines
