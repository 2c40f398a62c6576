"""train-bpe: count pre-tokens on the cluster, merge on the client, check, write.

The two halves have opposite shapes: counting is a Dask job over the same partitions that
``tokenize`` plans; merging runs on the client: for the GPT-2 pattern, gigatoken's Rust trainer on
the counts (``gigamerge``, all cores) when it is installed and splits the pre-tokens as counted;
otherwise one sequential Python loop (``merge.train_merges``) made fast by its data structures.
The result is checked (``ranks.problems``, round trips) before it is written.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable

import tiktoken

from .. import limits
from ..cluster import runner
from ..cluster import machines
from ..cluster.options import RunOptions
from ..cluster.progress import Progress
from ..errors import UserError
from ..storage.hubspec import HubDataset
from ..format.run import check_destination
from ..storage.location import Location
from ..corpus.gather import find_inputs, gather, open_inputs
from ..corpus.plan import Piece, check_on_bad_file
from ..encoding import ranks as ranks_io
from ..encoding import tojson
from ..encoding.records import TiktokenParams
from ..storage.store import filesystem, is_local, write_atomic
from ..wording import counted as counted_as, human
from . import gigamerge
from .count import Counted, count_on_cluster, resolve_pattern
from .merge import MergeResult, train_merges

MERGERS = ("auto", "gigatoken", "python")

@dataclass(frozen=True, kw_only=True)
class TrainBpeConfig(RunOptions):
    """Everything that decides the trained vocabulary (and, below the line, how the run goes)."""

    inputs: tuple[str, ...]
    out: str
    """Where the ranks go; must end in ``.tiktoken`` (the sidecar is OUT + ``.json``; the Hugging
    Face folder is ``hf_folder(OUT)``)."""
    vocab_size: int = 32768
    """n_vocab of the result: mergeable ranks plus special tokens (32,768 fits uint16 output)."""
    specials: tuple[str, ...] = ()
    """Special tokens besides ``<|endoftext|>``, which is always first: tokenize needs it."""
    pattern: str = "gpt2"
    sample_bytes: int | None = None
    """Count only about this many bytes of text: whole partitions, spread evenly over the plan."""
    min_count: int = 1
    text_column: str = "text"
    partition_bytes: int | None = None
    """Text per partition; None: the size ``tokenize`` would choose for this corpus."""
    holdout_every: int = 100
    """Every N-th row of each file is held back from counting; 0 holds back nothing."""
    heldout_bytes: int = 2_000_000
    """At most this much held-back text reaches the client to measure compression."""
    hub: HubDataset | None = None
    """``--dataset/--size``: a Hub sample, downloaded like ``tokenize`` does (added to ``inputs``)."""
    on_bad_file: str = "fail"
    """An unreadable file or partition, or text that is not UTF-8, fails the run, or (``skip``) is
    left out of the count, said, and recorded in the sidecar, as in ``tokenize``."""
    merger: str = "auto"
    """``auto``: gigatoken for ``--pattern gpt2`` when installed (and when it splits the counted
    pre-tokens as they were counted), else the Python loop; ``gigatoken`` or ``python`` to insist.
    The two break ties differently, so they may give different files from the same text."""

    def __post_init__(self):
        super().__post_init__()
        if not self.inputs and self.hub is None:
            raise UserError("no input given: pass --input PATH_OR_GLOB or --dataset REPO --size SIZE")
        if not self.out.endswith(ranks_io.SUFFIX):
            raise UserError(f"--out {self.out!r} must end in {ranks_io.SUFFIX}: that is how "
                            "`tokenshards tokenize --encoding FILE.tiktoken` tells a trained file from a built-in name")
        # Bounded before any counting: format v1 holds ids below 2**32 (a larger vocabulary has none to give).
        object.__setattr__(self, "vocab_size", limits.whole("--vocab-size", self.vocab_size, high=limits.MAX_VOCAB,
                                                            what="a vocabulary size (format v1 holds ids below 2**32)"))
        object.__setattr__(self, "min_count", limits.whole("--min-count", self.min_count, high=limits.MAX_COUNT,
                                                           what="a count"))
        if self.sample_bytes is not None:
            object.__setattr__(self, "sample_bytes", limits.whole("--sample-bytes", self.sample_bytes,
                                                                  high=limits.MAX_COUNT,
                                                                  what="a byte count"))
        if self.vocab_size < 256 + len(self.special_tokens):
            raise UserError(f"--vocab-size {self.vocab_size} is too small: it counts the 256 single bytes and the "
                            f"{len(self.special_tokens)} special tokens; pass at least {256 + len(self.special_tokens)}")
        check_on_bad_file(self.on_bad_file)
        if self.merger not in MERGERS:
            raise UserError(f"--merger {self.merger!r} not supported, expected one of {', '.join(MERGERS)}")
        if self.merger == "gigatoken" and self.pattern != "gpt2":
            raise UserError(f"--merger gigatoken needs --pattern gpt2 (gigatoken splits with its own GPT-2 "
                            f"pre-tokenizer), not {self.pattern!r}; use --merger auto or python")
        if self.min_count < 1:
            raise UserError(f"--min-count {self.min_count} must be at least 1")
        if self.sample_bytes is not None and self.sample_bytes < 1:
            raise UserError(f"--sample-bytes {self.sample_bytes} must be positive")
        if self.holdout_every < 0 or self.holdout_every == 1:
            raise UserError(f"holdout_every={self.holdout_every}: hold back every N-th row with N >= 2, or 0 for none")
        if self.partition_bytes is not None and self.partition_bytes < 1:
            raise UserError(f"--partition-mb {self.partition_bytes / 1e6:g} must be positive")
        for token in self.specials:
            if not token:
                raise UserError("--special '': a special token needs at least one character")

    @property
    def special_tokens(self) -> list[str]:
        return list(dict.fromkeys((ranks_io.ENDOFTEXT, *self.specials)))

    def replace(self, **changes) -> "TrainBpeConfig":
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True, kw_only=True)
class TrainSummary:
    out: str
    n_vocab: int
    corpus_bytes: int
    docs: int
    partitions: int
    unique_pretokens: int
    merges: int
    duplicates: int
    exhausted: bool
    count_seconds: float
    merge_seconds: float
    check_seconds: float
    seconds: float
    heldout_bytes: int
    heldout_tokens: int
    merger: str = "python"
    """What merged: ``gigatoken X.Y.Z`` or ``python``."""
    hf_folder: str | None = None
    """Where tokenizer.json + tokenizer_config.json went; None when they could not be made."""
    hf_problem: str | None = None
    """Why not (the .tiktoken pair is written all the same: it is what tokenize reads)."""

    @property
    def bytes_per_token(self) -> float | None:
        return self.heldout_bytes / self.heldout_tokens if self.heldout_tokens else None

    def lines(self) -> list[str]:
        compression = (f"{self.bytes_per_token:.3f} bytes/token on {human(self.heldout_bytes)}B of held-back text"
                       if self.bytes_per_token else "not measured (no held-back text: the corpus has under 100 rows per file)")
        lines = [
            f"done: {self.out}, n_vocab {self.n_vocab:,} ({self.merges:,} merges"
            + (f", {self.duplicates} repeating an existing token" if self.duplicates else "") + ")",
            f"      corpus {human(self.corpus_bytes)}B in {self.docs:,} documents, {self.partitions} partitions, "
            f"{self.unique_pretokens:,} unique pre-tokens",
            f"      time: counting {self.count_seconds:.1f} s, merging {self.merge_seconds:.1f} s ({self.merger}), "
            f"checking+writing {self.check_seconds:.1f} s, total {self.seconds:.1f} s",
            f"      compression: {compression}",
            (f"      Hugging Face: {self.hf_folder}/ (tokenizer.json + tokenizer_config.json; "
             f"AutoTokenizer.from_pretrained({self.hf_folder!r}) gives the same ids)" if self.hf_folder
             else f"      Hugging Face: no tokenizer.json written: {self.hf_problem}"),
        ]
        if self.exhausted:
            lines.append("      note: the corpus ran out of pairs before --vocab-size; the vocabulary is smaller than asked")
        return lines


def hf_folder(out: str) -> str:
    """``.../my.tiktoken`` → ``.../my.hf``: a folder, because that is what
    ``AutoTokenizer.from_pretrained`` loads (tokenizer.json and tokenizer_config.json by those names)."""
    return out[: -len(ranks_io.SUFFIX)] + ".hf"


def write_hf_folder(out: str, params: TiktokenParams, storage_options: dict | None = None) -> str:
    """tokenizer.json + tokenizer_config.json for the trained ranks, each written atomically into
    ``hf_folder(out)``; returns the folder. Raises ``UserError`` if they cannot be made or written."""
    folder = hf_folder(out)
    files = {
        "tokenizer.json": tojson.tokenizer_json(params.mergeable_ranks, params.pat_str, params.special_tokens),
        # <|endoftext|> is always the first special (see TrainBpeConfig.special_tokens): the document
        # separator tokenize writes, so the end-of-sequence token for a model trained on the output.
        "tokenizer_config.json": tojson.tokenizer_config_json(params.special_tokens, eos=ranks_io.ENDOFTEXT),
    }
    fs, path = filesystem(folder, storage_options)
    try:
        if is_local(fs):
            fs.makedirs(path, exist_ok=True)
        for name, text in files.items():
            write_atomic(fs, f"{path}/{name}", text.encode())
    except OSError as e:
        raise UserError(f"cannot write {folder!r}: {type(e).__name__}: {e}; choose another --out or fix its permissions") from e
    return folder


def _remove_stale_hf(out: str, storage_options: dict | None) -> str:
    """An earlier run's Hugging Face files no longer match the ranks: remove them, or say so."""
    fs, path = filesystem(hf_folder(out), storage_options)
    try:
        stale = [f"{path}/{name}" for name in ("tokenizer.json", "tokenizer_config.json") if fs.exists(f"{path}/{name}")]
        if stale:
            fs.rm(stale)
    except OSError as e:
        return f" (and the earlier run's {hf_folder(out)}/ could not be removed ({e}): it does not match the new ranks)"
    return ""


def select_sample(pieces: list[Piece], sample_bytes: int | None) -> list[Piece]:
    """Whole pieces spread evenly over the plan, about ``sample_bytes`` of text in all (deterministic)."""
    total = sum(p.text_bytes for p in pieces)
    if sample_bytes is None or sample_bytes >= total or not pieces:
        return pieces
    k = min(len(pieces), max(1, round(len(pieces) * sample_bytes / total)))
    return [pieces[i * len(pieces) // k] for i in range(k)]


def _announce_skipped(counted: Counted, *, announce: Callable[[str], None]) -> None:
    """What ``--on-bad-file skip`` left out of the count (files unreadable at planning are said then)."""
    for reason in counted.unreadable_reasons:
        announce(f"skipped an unreadable partition: {reason}")
    if counted.unreadable > len(counted.unreadable_reasons):
        announce(f"skipped {counted_as(counted.unreadable - len(counted.unreadable_reasons), 'more unreadable partition')}")
    if counted.skipped_invalid:
        announce(f"skipped {counted_as(counted.skipped_invalid, 'row')} whose text is not valid UTF-8")


def _merge(table, *, n_ranks: int, pattern_name: str, config: TrainBpeConfig,
           announce: Callable[[str], None]) -> tuple[MergeResult, dict]:
    """(the merges, the sidecar's ``training.merger`` record): gigatoken when it may, else the Python loop."""
    if config.merger != "python" and pattern_name == "gpt2":
        if gigamerge.version() is not None:
            announce(f"merging with {gigamerge.version()} (Rust, all cores; no progress until it is done)")
        outcome = gigamerge.merge_counted(table, n_ranks=n_ranks)
        if outcome.result is not None:
            record = {"name": "gigatoken", "version": gigamerge.version().split()[-1], "ties": "huggingface"}
            if outcome.resplit:
                announce(f"merging: gigatoken cut {outcome.resplit:,} pre-tokens differently from the count "
                         f"({outcome.resplit_occurrences:,} occurrences), counted its way")
                record |= {"resplit_pretokens": outcome.resplit, "resplit_occurrences": outcome.resplit_occurrences}
            return outcome.result, record
        if config.merger == "gigatoken":
            raise UserError(f"--merger gigatoken: {outcome.why_not}; use --merger auto to merge in Python instead")
        announce(f"merging in Python, on one core: {outcome.why_not}")

    merging = Progress(n_ranks - 256, mode=config.progress, unit="merges", amount=None, label="merging: ")

    def on_merge(size: int, target: int) -> None:
        merging.update(items=size - 256 - merging.done)

    words = zip(table.column("pretoken").to_pylist(), table.column("count").to_pylist())
    try:
        result = train_merges(words, n_ranks=n_ranks, on_progress=on_merge)
    finally:
        merging.close()
    return result, {"name": "python", "ties": "greatest byte pair"}


def run_train_bpe(config: TrainBpeConfig, *, announce: Callable[[str], None] = print) -> TrainSummary:
    """Train, check and write a vocabulary; raises ``UserError`` for anything the user can fix."""
    t0 = time.perf_counter()
    pattern_name, pat_str = resolve_pattern(config.pattern)
    specials = config.special_tokens
    n_ranks = config.vocab_size - len(specials)
    name = ranks_io.encoding_name(config.out)
    try:  # tiktoken's regex engine (fancy-regex) must accept the pattern too: fail before counting
        tiktoken.Encoding(name=name, pat_str=pat_str, mergeable_ranks={bytes([b]): b for b in range(256)}, special_tokens={})
    except ValueError as e:
        raise UserError(f"--pattern: tiktoken cannot compile {pat_str!r} ({e}); use gpt2, cl100k or a regex it accepts") from e
    if config.merger == "gigatoken" and gigamerge.version() is None:
        raise UserError("--merger gigatoken: gigatoken is not installed; pip install 'tokenshards[fast]', "
                        "or use --merger auto")
    # Its folder: not under a file, nor inside a tokenshards run (its files would mix with the run's).
    check_destination(Location.at(config.out.rsplit("/", 1)[0] if "/" in config.out else ".", config.storage_options),
                      "--out")
    sources = find_inputs(config.inputs, storage_options=config.storage_options, announce=announce)
    ranks_io.check_writable(config.out, config.storage_options)  # before the work, not after it
    # Downloads first (no overlap): nothing of it runs in the background for ``close`` to stop.
    inputs = open_inputs(sources, hub=config.hub, options=config, announce=announce)

    with runner.connect_to(config, announce=announce,
                           local_paths=machines.reading_inputs(config.inputs, [s.url for s in sources])) as client:
        corpus = gather(client, inputs, text_column=config.text_column, id_column=None,
                        storage_options=config.storage_options, partition_bytes=config.partition_bytes,
                        on_bad_file=config.on_bad_file, announce=announce)
        files, pieces, sources = corpus.files, corpus.pieces, corpus.sources
        chosen = select_sample(pieces, config.sample_bytes)
        if not chosen:
            raise UserError(f"the inputs ({', '.join(s.url for s in sources[:3])}{' ...' if len(sources) > 3 else ''}) "
                            "hold no rows: nothing to train on")
        plan_bytes = sum(p.text_bytes for p in chosen)
        announce(f"{len(sources)} input files; counting {pattern_name} pre-tokens in {len(chosen)} of {len(pieces)} "
                 f"partitions (~{human(plan_bytes)}B of text)")

        t_count = time.perf_counter()
        counted = count_on_cluster(client, chosen, pat_str=pat_str, text_column=config.text_column,
                                   storage_options=config.storage_options, min_count=config.min_count,
                                   holdout_every=config.holdout_every, heldout_bytes=config.heldout_bytes,
                                   on_bad_file=config.on_bad_file, lane_of=lambda piece: inputs.lane_of(piece.input),
                                   progress=Progress(len(chosen), mode=config.progress, label="counting: ", amount="B"))
        count_seconds = time.perf_counter() - t_count
    _announce_skipped(counted, announce=announce)
    if not counted.docs:
        raise UserError(f"no text to train on: every row of the {len(chosen)} partitions counted was null, empty or held back; "
                        f"check --text-column ({config.text_column!r}) and the inputs")
    unique = counted.table.num_rows
    announce(f"counted {human(counted.text_bytes)}B in {counted.docs:,} documents: {unique:,} unique pre-tokens"
             + (f" seen at least {config.min_count} times" if config.min_count > 1 else "") + f" ({count_seconds:.1f} s)")

    result, merger = _merge(counted.table, n_ranks=n_ranks, pattern_name=pattern_name, config=config, announce=announce)
    if result.exhausted:
        announce(f"merging: stopped at {len(result.ranks):,} ranks: no pair left")

    t_check = time.perf_counter()
    params = ranks_io.encoding_params(name=name, pat_str=pat_str, ranks=result.ranks, specials=specials)
    found = ranks_io.problems(result.ranks)
    if found:  # a bug in the merge loop, never the user's doing
        raise AssertionError(f"trained ranks are inconsistent: {found}")
    encoding = params.encoding()
    heldout = list(counted.heldout)
    bad = ranks_io.round_trip_failures(encoding, [ranks_io.ROUND_TRIP_PROBE, *heldout])
    if bad:
        raise AssertionError(f"trained encoding does not round-trip: {bad[:3]}")
    heldout_bytes = sum(len(t.encode()) for t in heldout)
    heldout_tokens = sum(len(encoding.encode_ordinary(t)) for t in heldout)
    summary = TrainSummary(
        out=config.out, n_vocab=encoding.n_vocab, corpus_bytes=counted.text_bytes, docs=counted.docs,
        partitions=len(chosen), unique_pretokens=unique, merges=len(result.merges), duplicates=result.duplicates,
        exhausted=result.exhausted, count_seconds=count_seconds, merge_seconds=result.seconds,
        check_seconds=0.0, seconds=0.0, heldout_bytes=heldout_bytes, heldout_tokens=heldout_tokens,
        merger=merger["name"] if merger["name"] == "python" else f"{merger['name']} {merger['version']}",
    )
    stats = {"corpus_bytes": summary.corpus_bytes, "docs": summary.docs, "partitions": summary.partitions,
             "unique_pretokens": unique, "min_count": config.min_count, "merges": summary.merges,
             "heldout_bytes": heldout_bytes, "heldout_tokens": heldout_tokens, "merger": merger,
             "inputs": [f.url for f in files]}
    if corpus.unreadable or counted.unreadable or counted.skipped_invalid:  # only under --on-bad-file skip
        stats["skipped"] = {"inputs": [{"url": b.url, "reason": b.reason} for b in corpus.unreadable],
                            "partitions": counted.unreadable, "invalid_rows": counted.skipped_invalid}
    ranks_io.write_trained(config.out, params=params, pattern_name=pattern_name, stats=stats,
                           storage_options=config.storage_options)
    try:  # after the ranks: a failure here must not throw away the training
        summary = dataclasses.replace(summary, hf_folder=write_hf_folder(config.out, params, config.storage_options))
    except UserError as e:
        announce(f"not writing {hf_folder(config.out)}/: {e}")
        summary = dataclasses.replace(summary, hf_problem=str(e) + _remove_stale_hf(config.out, config.storage_options))
    now = time.perf_counter()
    return dataclasses.replace(summary, check_seconds=now - t_check, seconds=now - t0)
