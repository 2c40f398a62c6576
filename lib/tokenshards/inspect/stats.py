"""``tokenshards inspect OUT``: what a finished run holds, read from its manifest and docs files.

The reading is one function, ``summarize_partitions``: a batch of partitions in, a small
mergeable ``Summary`` out (a fixed log-spaced histogram of document lengths, exact below 301
tokens and bins under 0.7% wide above, from which the percentiles and the plot come; totals; a
Counter per language). ``inspect.command`` runs it as cluster tasks and combines the summaries in a
tree on the workers; a small run is read by the same function in this process
(``inspect_output``). Either way a batch streams a few partitions at a time (a few threads for I/O
latency, a bounded window of them), so memory stays flat however large the run. Per-language
counts need the inputs' ``language`` column, which format v1's docs files do not carry: it is
read from the inputs the manifest lists (the partition's row groups, matched by the docs' ``row``)
when they are still reachable; a ``--fetch workers`` run's Hub references from the reading
machine's copy, else by range from the Hub.
"""
from __future__ import annotations

import io
import posixpath
import threading
from collections import Counter, OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import NamedTuple, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..format import run as run_files
from ..format import v1
from ..format.paths import UnsafeFile, open_input
from ..format.v1 import Manifest, PartitionEntry
from ..errors import UserError
from ..wording import human
from ..wording import counted
from ..cluster.machines import is_local_path
from ..storage.hubreaders import reading_plugins_for_run
from ..storage.location import Location
from ..storage.store import filesystem, write_atomic

PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99)
LENGTH_EDGES = np.unique(np.floor(np.geomspace(1, 2**40, 8192)).astype(np.int64))
"""Integer bin edges: every integer up to 300 (exact), then bins under 0.7% wide up to 2**40."""
EXACT_BELOW = int(LENGTH_EDGES[np.argmax(np.diff(LENGTH_EDGES) > 1)])
BIN_WIDTH = float(np.max((np.diff(LENGTH_EDGES) / LENGTH_EDGES[:-1])[LENGTH_EDGES[:-1] >= EXACT_BELOW]))
"""Largest relative width of an inexact bin."""
WINDOW = 32
"""Partitions read at once (threads * a little): bounds memory and open connections."""
MAX_PROBLEMS = 5
"""Distinct reasons kept for missing per-language counts, the first in the run's order: the report
shows at most five, and a summary must not grow with the inputs."""


@dataclass(kw_only=True)
class PartitionStats:
    counts: np.ndarray
    docs: int
    tokens: int
    min: int
    max: int
    languages: Counter | None = None
    """tokens and docs per language (keys ``(lang, "tokens")`` / ``(lang, "docs")``), or None."""
    language_problem: str | None = None


class PartRef(NamedTuple):
    """What reading one partition needs from its manifest entry (all a task is sent): its docs
    file and what checks it (``format.run.check_docs``), its input's row groups."""

    index: int
    docs_file: str
    input: str
    row_groups: tuple[int, int]
    docs: int
    tokens: int
    rows: int
    docs_sha256: str | None

    @classmethod
    def of(cls, entry: PartitionEntry) -> PartRef:
        return cls(entry.index, entry.docs_file, entry.input, tuple(entry.row_groups), entry.docs, entry.tokens,
                   entry.rows, entry.docs_sha256)


@dataclass(kw_only=True)
class Summary:
    """What the partitions of a run, or of a part of it, hold: small, and merged in any grouping
    (``merge``, in the run's order) to the same numbers as adding the partitions one by one."""

    counts: np.ndarray = field(default_factory=lambda: np.zeros(len(LENGTH_EDGES), np.int64))
    docs: int = 0
    tokens: int = 0
    min: int = 0
    max: int = 0
    languages: Counter = field(default_factory=Counter)
    language_partitions: int = 0
    language_problems: list[str] = field(default_factory=list)

    def add(self, part: PartitionStats) -> None:
        self._take(counts=part.counts, docs=part.docs, tokens=part.tokens, low=part.min, high=part.max)
        if part.languages is not None:
            self.languages.update(part.languages)
            self.language_partitions += 1
        self._note([part.language_problem] if part.language_problem else [])

    def merge(self, other: Summary) -> None:
        """``other``'s partitions come after this one's."""
        self._take(counts=other.counts, docs=other.docs, tokens=other.tokens, low=other.min, high=other.max)
        self.languages.update(other.languages)
        self.language_partitions += other.language_partitions
        self._note(other.language_problems)

    def _take(self, *, counts: np.ndarray, docs: int, tokens: int, low: int, high: int) -> None:
        if docs:
            self.min = low if not self.docs else min(self.min, low)
            self.max = max(self.max, high)
        self.counts += counts
        self.docs += docs
        self.tokens += tokens

    def _note(self, problems: list[str]) -> None:
        for problem in problems:
            if len(self.language_problems) < MAX_PROBLEMS and problem not in self.language_problems:
                self.language_problems.append(problem)

    def percentile(self, q: float) -> float:
        """numpy's default (linear) percentile, read off the histogram: exact where bins are
        one integer wide, spread evenly inside a wider bin."""
        if not self.docs:
            return float("nan")
        rank = q / 100 * (self.docs - 1)
        low = int(np.floor(rank))
        cumulative = np.cumsum(self.counts)
        a, b = self._sorted_value(cumulative, low), self._sorted_value(cumulative, min(low + 1, self.docs - 1))
        return a + (rank - low) * (b - a)

    def _sorted_value(self, cumulative: np.ndarray, k: int) -> float:
        """The k-th smallest length (0-based), as the histogram knows it."""
        i = int(np.searchsorted(cumulative, k, side="right"))
        lo = int(LENGTH_EDGES[i])
        width = int(LENGTH_EDGES[i + 1]) - lo if i + 1 < len(LENGTH_EDGES) else 1
        if width == 1:
            return float(lo)
        below = int(cumulative[i] - self.counts[i])
        return lo + (k - below + 0.5) / int(self.counts[i]) * width

    def language_rows(self) -> list[tuple[str, int, int]]:
        """(language, tokens, docs), most tokens first."""
        langs = {lang for lang, _ in self.languages}
        rows = [(lang, self.languages[(lang, "tokens")], self.languages[(lang, "docs")]) for lang in langs]
        return sorted(rows, key=lambda r: (-r[1], r[0]))


def combine_summaries(*parts: Summary) -> Summary:
    """One node of the tree the workers combine summaries in: ``parts`` in the run's order."""
    total = Summary()
    for part in parts:
        total.merge(part)
    return total


@dataclass(kw_only=True)
class RunStats(Summary):
    """A whole run's summary, with the manifest and what the report names."""

    out: str
    manifest: Manifest
    language_column: str = "language"

    @classmethod
    def of(cls, summary: Summary, *, out: str, manifest: Manifest, language_column: str) -> RunStats:
        return cls(out=out, manifest=manifest, language_column=language_column, counts=summary.counts,
                   docs=summary.docs, tokens=summary.tokens, min=summary.min, max=summary.max,
                   languages=summary.languages, language_partitions=summary.language_partitions,
                   language_problems=summary.language_problems)


def inspect_output(out: str, *, storage_options: dict | None = None, language_column: str = "language",
                   threads: int = 8) -> RunStats:
    """Read OUT's manifest, then every partition's docs file (and its input's language column), in
    this process: ``inspect.command.run_inspect`` does this for small runs, the cluster for the rest."""
    run, manifest = v1.open_finished(out, storage_options)
    return inspect_here(run, manifest, language_column=language_column, threads=threads)


def inspect_here(run: Location, manifest: Manifest, *, language_column: str, threads: int = 8) -> RunStats:
    """An opened run's partitions read in this process, by the function the cluster's tasks run."""
    for hub in reading_plugins_for_run(manifest.input_identities(), manifest.extra):  # a --fetch workers run's inputs:
        hub.setup(worker=None)  # read in this process, from its copy here, else by range from the Hub
    summary = summarize_partitions([PartRef.of(e) for e in manifest.partitions], out=run.task_url,
                                   storage_options=run.storage_options, language_column=language_column, threads=threads)
    return RunStats.of(summary, out=run.url, manifest=manifest, language_column=language_column)


def summarize_partitions(parts: Sequence[PartRef], *, out: str, storage_options: dict | None,
                         language_column: str = "language", threads: int = 4,
                         unseen_local_inputs: str | None = None) -> Summary:
    """The summary of ``parts`` (a cluster task's batch, or a small run's every partition), read a
    window at a time in ``threads`` threads. ``unseen_local_inputs``: why local inputs are not read
    here (the workers' machine does not see the client's files there), as each one's language problem."""
    run = Location.at(out, storage_options)
    summary = Summary()
    inputs = _InputCache(storage_options, language_column, unseen_local=unseen_local_inputs)
    with ThreadPoolExecutor(max_workers=max(min(threads, len(parts)), 1)) as pool:
        for start in range(0, len(parts), WINDOW):
            window = parts[start:start + WINDOW]
            for part in pool.map(lambda p: _partition_stats(run, p, inputs), window):
                summary.add(part)
    return summary


def _partition_stats(run: Location, part: PartRef, inputs: _InputCache) -> PartitionStats:
    """One partition's docs table, read and checked whole (``format.run.read_docs``) before any
    length or row of it is counted."""
    try:
        table = run_files.read_docs(run, part)
    except FileNotFoundError as e:
        raise UserError(f"{run.shown(part.docs_file)}: listed in the manifest but missing; run `tokenshards verify` "
                        "on this output") from e
    lengths = table.column("length").to_numpy().astype(np.int64, copy=False)
    counts = np.bincount(np.searchsorted(LENGTH_EDGES, lengths, side="right") - 1, minlength=len(LENGTH_EDGES))
    stats = PartitionStats(counts=counts.astype(np.int64), docs=len(lengths), tokens=int(lengths.sum()),
                           min=int(lengths.min()) if len(lengths) else 0, max=int(lengths.max()) if len(lengths) else 0)
    languages, problem = inputs.languages(part, table.column("row").to_numpy().astype(np.int64, copy=False))
    if languages is not None:
        counter: Counter = Counter()
        for lang, n, tokens in _group(languages, lengths):
            counter[(lang, "docs")] += n
            counter[(lang, "tokens")] += tokens
        stats.languages = counter
    stats.language_problem = problem
    return stats


def _group(languages: np.ndarray, lengths: np.ndarray):
    """(language, docs, tokens) per distinct language of one partition."""
    keys, inverse = np.unique(languages, return_inverse=True)
    docs = np.bincount(inverse, minlength=len(keys))
    tokens = np.bincount(inverse, weights=lengths, minlength=len(keys))
    return [(str(k), int(d), int(t)) for k, d, t in zip(keys, docs, tokens)]


class _InputCache:
    """Row-group offsets per input (one footer read each), and why an input gave no languages."""

    FOOTERS = 8
    """Parsed footers kept, the most recently used: partitions come in input order, a few at a time,
    so each footer is parsed about once; an input's footer grows with its row groups, and parsing it
    again for every partition made inspect's time per partition grow with them (docs/scaling.md)."""

    def __init__(self, storage_options: dict | None, column: str, *, unseen_local: str | None = None):
        self.storage_options = storage_options
        self.column = column
        self.unseen_local = unseen_local
        self._lock = threading.Lock()
        self._meta: dict[str, tuple[list[int], bool] | str] = {}
        self._opening: dict[str, threading.Lock] = {}
        self._footers: OrderedDict[str, pq.FileMetaData] = OrderedDict()

    def _footer(self, url: str, f) -> pq.FileMetaData:
        with self._lock:
            if url in self._footers:
                self._footers.move_to_end(url)
                return self._footers[url]
        meta = pq.ParquetFile(f).metadata
        with self._lock:
            self._footers[url] = meta
            while len(self._footers) > self.FOOTERS:
                self._footers.popitem(last=False)
        return meta

    def _metadata(self, url: str) -> tuple[list[int], bool] | str:
        with self._lock:
            if url in self._meta:
                return self._meta[url]
            first = self._opening.setdefault(url, threading.Lock())
        with first:  # the threads that start on an input together wait for one read of its footer
            with self._lock:
                if url in self._meta:
                    return self._meta[url]
            try:
                fs, path = filesystem(url, self.storage_options)
                with open_input(fs, path) as f:
                    meta = self._footer(url, f)
                offsets = [0]
                for i in range(meta.num_row_groups):
                    offsets.append(offsets[-1] + meta.row_group(i).num_rows)
                result: tuple[list[int], bool] | str = (offsets, self.column in meta.schema.to_arrow_schema().names)
            except (UserError, OSError, pa.ArrowException) as e:
                result = f"input {url} is unreachable ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''})"
            except UnsafeFile as e:  # a FIFO, a folder, a device: never opened
                result = f"input {url} {e}"
            with self._lock:
                self._meta[url] = result
                del self._opening[url]
        return result

    def languages(self, part: PartRef, rows: np.ndarray) -> tuple[np.ndarray | None, str | None]:
        """The language of each document of ``part`` (by source row), or (None, why not)."""
        url = part.input
        if self.unseen_local and is_local_path(url):
            return None, self.unseen_local
        meta = self._metadata(url)
        if isinstance(meta, str):
            return None, meta
        offsets, has_column = meta
        if not has_column:
            return None, f"input {url} has no {self.column!r} column"
        first, stop = part.row_groups
        if not 0 <= first <= stop < len(offsets):
            return None, f"input {url} changed since the run (it has {len(offsets) - 1} row groups)"
        try:
            fs, path = filesystem(url, self.storage_options)
            with open_input(fs, path) as f:
                column = pq.ParquetFile(f, metadata=self._footer(url, f)).read_row_groups(
                    list(range(first, stop)), columns=[self.column]).column(0)
        except (UserError, OSError, pa.ArrowException, UnsafeFile) as e:
            return None, f"input {url} is unreadable ({type(e).__name__})"
        at = rows - offsets[first]
        if len(column) != offsets[stop] - offsets[first] or (at.size and (at.min() < 0 or at.max() >= len(column))):
            return None, f"input {url} changed since the run (row counts differ)"
        values = column.cast(pa.string()).fill_null("(none)").to_numpy(zero_copy_only=False)
        return values[at], None


# -- presenting --

def report_lines(stats: RunStats) -> list[str]:
    m = stats.manifest
    enc, totals = m.encoding, m.totals
    itemsize = np.dtype(enc.dtype).itemsize
    lines = [
        f"run         {stats.out}  ({m.format}{', job ' + m.job[:12] if m.job else ''})",
        f"encoding    {enc.name}: n_vocab {enc.n_vocab:,}, eot {enc.eot}, stored as {enc.dtype}; "
        f"eot {m.eot_position}; text column {m.text_column!r}",
        f"inputs      {counted(len(m.inputs), 'file')}, {totals.rows:,} rows"
        + (f"; {counted(len(m.skipped_inputs), 'unreadable input')} skipped" if m.skipped_inputs else "")
        + _generations(m),
        f"partitions  {len(m.partitions)}",
        f"documents   {totals.docs:,} (skipped {totals.skipped_null:,} null and {totals.skipped_empty:,} empty rows"
        + (f", {totals.skipped_invalid:,} not UTF-8" if totals.skipped_invalid else "") + ")",
        f"tokens      {totals.tokens:,} ({human(totals.tokens * itemsize)}B of token files)",
    ]
    if (stats.docs, stats.tokens) != (totals.docs, totals.tokens):
        lines.append(f"WARNING     the docs files hold {stats.docs:,} documents and {stats.tokens:,} tokens, the manifest "
                     f"says {totals.docs:,} and {totals.tokens:,}: run `tokenshards verify {stats.out}`")
    if stats.docs:
        lines.append(f"tokens per document (percentiles from a log-spaced histogram: exact below {EXACT_BELOW} tokens, "
                     f"within {100 * BIN_WIDTH:.1f}% above)")
        lines.append(f"            mean {stats.tokens / stats.docs:,.1f}  min {stats.min:,}  "
                     + "  ".join(f"p{q} {stats.percentile(q):,.0f}" for q in PERCENTILES) + f"  max {stats.max:,}")
    lines.extend(_language_lines(stats))
    return lines


def _generations(m: Manifest) -> str:
    """For a run grown with ``tokenize --add``: how many input files each growth added."""
    per = Counter(i.added_by for i in m.input_records)
    if len(per) < 2:
        return ""
    return (f"; added in {len(per)} steps (tokenize --add): "
            + ", ".join(f"generation {g}: {counted(n, 'file')}" for g, n in sorted(per.items())))


def _language_lines(stats: RunStats, *, top: int = 20) -> list[str]:
    n_parts = len(stats.manifest.partitions)
    column = stats.language_column
    if not stats.language_partitions:
        why = "; ".join(stats.language_problems[:3]) or "no partitions"
        return [f"per language: not available ({why})"]
    coverage = "" if stats.language_partitions == n_parts else \
        f", covering {stats.language_partitions} of {n_parts} partitions"
    rows = stats.language_rows()
    total = sum(r[1] for r in rows) or 1
    lines = [f"per language (the inputs' {column!r} column{coverage}; {counted(len(rows), 'language')})"]
    width = max(len(r[0]) for r in rows[:top])
    for lang, tokens, docs in rows[:top]:
        lines.append(f"            {lang:<{width}}  {tokens:>15,} tokens  {100 * tokens / total:5.1f}%  {docs:>12,} docs")
    if len(rows) > top:
        rest = rows[top:]
        lines.append(f"            {counted(len(rest), 'more language')}: {sum(r[1] for r in rest):,} tokens, {sum(r[2] for r in rest):,} docs")
    for problem in stats.language_problems[:5]:
        lines.append(f"            note: {problem}")
    return lines


def _plot_edges(lo: int, hi: int, *, bins: int = 70) -> np.ndarray:
    """Integer bin edges covering [lo, hi]: one bar per length when there are few, else about
    ``bins`` log-spaced bins whose widths never shrink (a width of 1 then 2 then 1 again would
    draw a comb of alternating bar heights)."""
    if hi - lo < 100:
        return np.arange(lo, hi + 2)
    ratio = ((hi + 1) / lo) ** (1 / bins)
    edges, width = [lo], 1
    while edges[-1] <= hi:
        width = max(width, int(round(edges[-1] * (ratio - 1))))
        edges.append(edges[-1] + width)
    return np.array(edges)


PLOT_FORMATS = ("png", "svg", "pdf")


def plot_format(path: str) -> str:
    """The image format ``--plot``'s file name asks for (``x.svg`` is SVG, not PNG bytes)."""
    suffix = path.rsplit(".", 1)[-1].lower() if "." in path.rsplit("/", 1)[-1] else ""
    if suffix not in PLOT_FORMATS:
        raise UserError(f"--plot {path}: name a .png, .svg or .pdf file")
    return suffix


def plot_lengths(stats: RunStats, path: str, *, storage_options: dict | None = None) -> None:
    """A histogram of document lengths (log x) with the totals and median in the title and a box."""
    if not stats.docs:
        raise UserError(f"{stats.out} holds no documents: nothing to plot")
    import matplotlib  # heavy (~0.2 s): for --plot only

    matplotlib.use("Agg")
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    m = stats.manifest
    enc = m.encoding
    median = stats.percentile(50)
    edges = _plot_edges(max(stats.min, 1), stats.max)
    present = stats.counts > 0
    fig = Figure(figsize=(10, 5.6), dpi=120, layout="constrained")
    ax = fig.add_subplot()
    counts, _ = np.histogram(LENGTH_EDGES[present], bins=edges, weights=stats.counts[present])
    one_per_length = bool(np.all(np.diff(edges) == 1))
    if not one_per_length:
        # Short lengths get whole-token bins wider (on the log axis) than the rest: scale every
        # bar to the common log width so a change of bin width draws no step.
        nominal = np.log(edges[-1] / edges[0]) / (len(edges) - 1)
        counts = counts * nominal / np.log(edges[1:] / edges[:-1])
    ax.bar(edges[:-1], counts, width=np.diff(edges), align="edge", color="#4878a8", edgecolor="white", linewidth=0.4)
    ax.set_xscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:,.0f}")
    ax.xaxis.set_major_formatter(plain)
    # Over two decades or less, the minor ticks (2, 3, 5...) carry the only labels: plain numbers too.
    ax.xaxis.set_minor_formatter(plain if stats.max < 100 * max(stats.min, 1) else NullFormatter())
    # Documents are counted whole: ticks at integers only (a few documents would get 0.2, 0.4...,
    # labelled 0, 0, 1, 1 by the formatter).
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.axvline(median, color="#d1495b", linewidth=2, label=f"median {median:,.0f}")
    for q, style in ((10, ":"), (90, ":")):
        ax.axvline(stats.percentile(q), color="#444444", linestyle=style, linewidth=1.2,
                   label=f"p{q} {stats.percentile(q):,.0f}")
    ax.set_xlabel("tokens per document (log scale)")
    ax.set_ylabel("documents" if one_per_length else "documents per bin (equal widths on this axis)")
    name = posixpath.basename(stats.out.rstrip("/")) or stats.out
    ax.set_title(f"Document lengths in tokens: {name}\n{stats.docs:,} documents, {human(stats.tokens)} tokens, "
                 f"median {median:,.0f} tokens/doc", fontsize=12)
    ax.legend(loc="upper left", frameon=True)
    box = "\n".join([
        f"documents  {stats.docs:,}",
        f"tokens     {stats.tokens:,}",
        f"mean       {stats.tokens / stats.docs:,.1f}",
        f"min / max  {stats.min:,} / {stats.max:,}",
        f"encoding   {enc.name} ({enc.dtype})",
        f"eot        {m.eot_position}",
    ])
    ax.text(0.985, 0.97, box, transform=ax.transAxes, ha="right", va="top", multialignment="left", family="monospace",
            fontsize=9,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "#999999", "alpha": 0.9})
    ax.grid(True, which="major", axis="y", alpha=0.3)
    buf = io.BytesIO()
    fig.savefig(buf, format=plot_format(path))
    fs, target = filesystem(path, storage_options)
    try:
        write_atomic(fs, target, buf.getvalue())
    except OSError as e:
        raise UserError(f"--plot {path}: cannot write ({type(e).__name__}: {e})") from e
