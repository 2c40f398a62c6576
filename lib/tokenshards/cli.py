"""Command line: argument parsing only; each subcommand fills a config and calls one function.

Each command imports its job inside its own function: ``tokenshards --help`` or a mistyped flag
answers without importing Dask or huggingface_hub, and a local run starts its workers' forkserver
(``_prestart_local_workers``) before this process imports the rest. ``export``'s ``--format``
choices come from ``export.formats``, whose modules import numpy and pyarrow: its parser is built
whole only when the command line may be an export (``build_parser``), so another command starts
its forkserver before those imports (~0.3 s earlier here), not after them."""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Sequence

from .cluster import interrupt
from .encoding import names
from .encoding.boundaries import BOUNDARY_CHOICES
from . import limits
from .errors import UserError
from .wording import scrub_exception
from .storage.hubspec import HubDataset, is_hub_url


def _storage_option(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--storage-option {text!r}: expected key=value")
    return key, value


def _storage_options(pairs) -> dict:
    """key=value pairs for fsspec/s3fs; ``endpoint_url`` goes where s3fs expects it, a value that
    starts with ``{`` or ``[`` is JSON. ``AWS_ENDPOINT_URL`` is read here so that remote workers
    get the same endpoint. Every command's options go through this and ``RunOptions``."""
    options: dict = {}
    for key, value in pairs or []:
        if key in ("endpoint_url", "region_name"):
            options.setdefault("client_kwargs", {})[key] = value
        elif value.lstrip().startswith(("{", "[")):
            options[key] = _json_option(key, value)
        else:
            options[key] = {"true": True, "false": False}.get(value.lower(), value)
    from .storage.store import with_env_endpoint  # fsspec: not before a local run's forkserver starts

    return with_env_endpoint(options, os.environ)


def _json_option(key: str, value: str):
    try:
        return json.loads(value)
    except ValueError as e:  # the value is not shown: it may hold a secret
        raise UserError(f"--storage-option {key}: its value starts like JSON but is not valid JSON ({e.msg} at "
                        f"character {e.pos}); quote it for the shell, e.g. {key}='{{\"region_name\": \"eu-west-1\"}}'") from e


def _add_input_argument(p, what: str) -> None:
    """``--input a.parquet b.parquet`` (what an unquoted glob becomes in the shell) and repeated
    ``--input`` both add to one list."""
    p.add_argument("--input", nargs="+", action="extend", default=[], metavar="PATH_OR_GLOB",
                   help=f"{what}; several after one --input (an unquoted glob the shell expanded), or repeat --input")


def _add_cluster_arguments(p, *, command: str) -> None:
    """Where a command runs: the same options for every command that starts Dask work. ``command``:
    the module that runs it, imported early where a local cluster will start
    (``_prestart_local_workers``)."""
    p.set_defaults(command_module=command)
    p.add_argument("--workers", type=_whole, help="LocalCluster process workers (default: the machine's cores; at most 4 "
                   "per core and one per 0.5 GiB of its memory)")
    p.add_argument("--scheduler", help="address of an existing `dask scheduler`, e.g. tcp://HOST:8786")
    p.add_argument("--cluster", metavar="CONFIG.yaml",
                   help="cluster config: cluster_configs/{local,scheduler,slurm,kubernetes,ssh}.yaml or your own")
    dashboard = p.add_mutually_exclusive_group()
    dashboard.add_argument("--dashboard-address", default="127.0.0.1:8787",
                           help="LocalCluster dashboard address (default 127.0.0.1:8787, this machine only; :PORT is "
                                "loopback too; 0.0.0.0:8787 opens it to the network, where anyone can see the task stream)")
    dashboard.add_argument("--no-dashboard", action="store_true",
                           help="start a LocalCluster without its dashboard (a batch run nobody watches: no port "
                                "taken, and ~0.7 s less CPU at start-up, bokeh's)")
    p.add_argument("--progress", default="auto", choices=["auto", "bar", "log", "none"],
                   help="a live line on a terminal (bar), a line every 10%% (log), or none (default auto: bar on a terminal)")


def _run_options(args) -> dict:
    """Storage and cluster settings, as every config that runs Dask work names them."""
    return {"storage_options": _storage_options(args.storage_option), "workers": args.workers,
            "scheduler": args.scheduler, "cluster_config": args.cluster,
            "dashboard_address": None if args.no_dashboard else args.dashboard_address, "progress": args.progress}


def _corpus_options(args) -> dict:
    """The corpus, how it is cut and how progress shows, as tokenize and train-bpe both take them."""
    return {"inputs": tuple(args.input), "text_column": args.text_column,
            "partition_bytes": _partition_bytes(args.partition_mb),
            "hub": _hub_dataset(args, download_dir=args.download_dir, fetch=args.fetch)}


MAX_PARTITION_MB = 1e6
"""A terabyte of text: a worker holds one partition's text at a time."""


def _partition_bytes(megabytes: float | None) -> int | None:
    """``--partition-mb`` in bytes: a finite size from one byte to ``MAX_PARTITION_MB`` (nan, inf,
    1e-9, 1e400 are refused)."""
    if megabytes is None:
        return None
    if not (math.isfinite(megabytes) and megabytes * 1e6 >= 1):
        raise UserError(f"--partition-mb {megabytes:g} must be a finite number of megabytes of at least "
                        "0.000001 (one byte); the default sizes partitions from the corpus")
    if megabytes > MAX_PARTITION_MB:
        raise UserError(f"--partition-mb {megabytes:g}: out of range; a partition holds at most {MAX_PARTITION_MB:,.0f} MB "
                        "of text (a worker holds one partition's text at a time); the default sizes partitions from the corpus")
    return int(megabytes * 1e6)


def _whole(text: str) -> int | float:
    """A whole number as typed (``100``, ``1e9``, ``10_000``); a float it is not whole or finite
    (``inf``, ``1e400``, ``1.5``) is kept as a float, for the option's bounds to refuse in one line
    (``limits.whole``) with the rest of its checks."""
    try:
        return int(text)
    except ValueError:
        pass
    value = float(text)  # not a number at all: argparse's own "invalid int value: 'abc'"
    return int(value) if math.isfinite(value) and value.is_integer() else value


_whole.__name__ = "int"  # what argparse names the type in its message for text that is no number


def _print_lines(result) -> int:
    """A finished job's summary on stdout; exit status 0."""
    for line in result.lines():
        print(line)
    return 0


def _add_tokenize(sub) -> None:
    p = sub.add_parser("tokenize", help="tokenize parquet text into format v1 token arrays")
    _add_input_argument(p, "parquet file, folder, glob or URL (s3://, hf://)")
    p.add_argument("--out", required=True, action="append",
                   help="output folder or s3://bucket/prefix; repeated, one per --encoding, in the same order")
    _add_cluster_arguments(p, command="tokenshards.tokenize.command")
    p.add_argument("--encoding", action="append",
                   help=f"the tokenizer: {'; '.join(names.FORMS)} (default: gpt2); repeat it, with an --out "
                        "for each, to write several encodings from one read of the corpus")
    p.add_argument("--backend", default="auto", choices=names.BACKENDS,
                   help="tokenizer implementation; ids always equal the tokenizer's own library's (default auto: the "
                        "fastest installed one that reproduces it at start-up: gigatoken, splintr, then riptoken, else "
                        "the reference library: tiktoken, tokenizers or sentencepiece)")
    p.add_argument("--boundary", default="auto", choices=BOUNDARY_CHOICES,
                   help="control tokens around each document: the tokenizer's own (auto: Llama's <|begin_of_text|>, "
                        "Mistral's <s>, Gemma's <bos> first; Qwen's <|endoftext|> last; <|endoftext|> first for "
                        "tiktoken's encodings), its BOS first, EOS last, both, or none")
    p.add_argument("--eot", default=None, choices=["prefix", "suffix", "none"],
                   help="where each document's <|endoftext|> goes, for tiktoken's encodings (default: prefix); "
                        "--boundary bos|eos|none says the same for every tokenizer")
    p.add_argument("--text-column", default="text")
    p.add_argument("--chat-column", metavar="COLUMN",
                   help="rows are conversations: a column of lists of {role, content} (or that list as JSON text), "
                        "rendered through the tokenizer's chat template, with a mask of the assistant's tokens "
                        "(Hugging Face tokenizers with a chat_template; docs/chat.md)")
    p.add_argument("--chat-template", metavar="FILE",
                   help="with --chat-column: render with the Jinja chat template in FILE instead of the tokenizer's own "
                        "(e.g. a training template that marks {%% generation %%}, such as TRL's *_training.jinja)")
    p.add_argument("--tools-column", metavar="COLUMN", default="auto",
                   help="with --chat-column: a column of each row's tools (a list of JSON-schema function "
                        "definitions, or that list as JSON text), passed to the chat template as "
                        "apply_chat_template(messages, tools=...) (default: a column named tools where an input has "
                        "one, as TRL's SFTTrainer reads it; none: no tools)")
    p.add_argument("--on-bad-row", default="fail", choices=["fail", "skip"],
                   help="with --chat-column: a row whose messages or tools are malformed (not a list, an unknown "
                        "role, content that is not a string) fails the job (default) or is skipped, said and counted "
                        "per reason in the manifest")
    p.add_argument("--id-column", help="column of document ids (default: `id` when present, else FILE:ROW)")
    p.add_argument("--partition-mb", type=float, default=None,
                   help="text per partition in MB (default: 8.4, more for corpora over ~137 GB of text)")
    _add_on_bad_file_argument(p, "recorded in the manifest")
    p.add_argument("--overwrite", action="store_true", help="replace a different earlier run in --out")
    p.add_argument("--add", action="store_true",
                   help="grow the finished run in --out with the inputs it lacks; its partitions stay as they are")
    p.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                   help="passed to fsspec/s3fs (e.g. endpoint_url=http://127.0.0.1:9000); repeatable")
    p.add_argument("--report", metavar="FILE.html", help="save Dask's performance report of the run to FILE.html")
    _add_hub_arguments(p)
    p.add_argument("--download-dir", metavar="DIR",
                   help="with --dataset: download into DIR/sample/... (e.g. a shared filesystem) instead of the HF cache")
    p.add_argument("--fetch", default="auto", choices=["auto", "client", "workers"],
                   help="with --dataset: this process downloads every file once and workers read them (client); "
                        "or each file goes to one worker machine, which downloads it into its own cache (workers); "
                        "default auto: client on a local cluster or when every worker sees this machine's download "
                        "folder, else workers (one line says which and why)")
    p.set_defaults(run=_run_tokenize)


def _add_on_bad_file_argument(p, recorded: str) -> None:
    p.add_argument("--on-bad-file", default="fail", choices=["fail", "skip"],
                   help=f"an unreadable input, or text that is not UTF-8, fails the job (default) or is skipped, "
                        f"said and {recorded}")


def _add_hub_arguments(p) -> None:
    p.add_argument("--dataset", metavar="REPO", help="Hub dataset repo, e.g. HuggingFaceFW/fineweb or HuggingFaceFW/fineweb-edu")
    p.add_argument("--size", metavar="SIZE", help="sample to fetch: 10B, 100B or 350B (the repo's sample/10BT ...)")
    p.add_argument("--revision", default="main", help="branch, tag or commit of the dataset repo (default main)")
    p.add_argument("--keep-free-gb", type=float, default=1.0,
                   help="refuse to download when less than this much disk would stay free (default 1)")


def _hub_dataset(args, *, download_dir: str | None, fetch: str = "auto"):
    """The ``--dataset/--size`` part of the command line, or None when not given."""
    if args.dataset is None and args.size is None:
        return None
    if args.size is None:
        raise UserError(f"--dataset {args.dataset} needs --size (10B, 100B or 350B)")
    keep_free = limits.number("--keep-free-gb", args.keep_free_gb, high=1e6, what="gigabytes")
    if download_dir is not None:  # a folder downloads go to: not under a file, nor inside a run
        from .format.run import check_destination
        from .storage.location import Location

        check_destination(Location.at(download_dir), "--to" if args.command == "download" else "--download-dir")
    return HubDataset(repo=args.dataset or "HuggingFaceFW/fineweb", size=args.size, revision=args.revision,
                      fetch=fetch, download_dir=download_dir, keep_free=int(keep_free * 2**30))


def _add_download(sub) -> None:
    p = sub.add_parser("download", help="fetch a Hub dataset sample (e.g. FineWeb sample/10BT) without tokenizing")
    _add_hub_arguments(p)
    p.add_argument("--to", metavar="DIR", help="folder for sample/.../*.parquet (default: the HF cache, HF_HUB_CACHE)")
    p.set_defaults(run=_run_download)


def _run_download(args) -> int:
    from .storage import hub  # heavy: huggingface_hub and distributed, for this command only

    if args.dataset is None and args.size is None:
        raise UserError("download needs --dataset REPO --size SIZE, e.g. --dataset HuggingFaceFW/fineweb --size 10B")
    ds = _hub_dataset(args, download_dir=args.to)
    sources = hub.download(ds, hub.list_files(ds), announce=_say)
    print(f"downloaded: {len(sources)} parquet files in {sources[0].url.rsplit('/', 1)[0]}")
    return 0


def _run_tokenize(args) -> int:
    # heavy: Dask, pandas and pyarrow, imported once the local workers' forkserver is starting
    from .tokenize.config import Output, TokenizeConfig
    from .tokenize.command import run_tokenize_each

    [first, *more] = _paired_outputs(args.encoding, args.out)
    config = TokenizeConfig(
        out=first[1], encoding=first[0], more_outputs=tuple(Output(*pair) for pair in more), eot_position=args.eot,
        boundary=args.boundary,
        id_column=args.id_column, on_bad_file=args.on_bad_file, backend=args.backend, overwrite=args.overwrite,
        add=args.add, report=args.report, chat_column=args.chat_column, on_bad_row=args.on_bad_row,
        tools_column=args.tools_column, chat_template=args.chat_template,
        **_corpus_options(args), **_run_options(args),
    )
    return _print_lines(run_tokenize_each(config, announce=_say, started=_process_started()))


def _process_started() -> float:
    """When this process began (the summary's overall time counts start-up too)."""
    import psutil  # here: ~15 ms of --help otherwise; tokenize has imported it by now (distributed does)

    try:
        return psutil.Process().create_time()
    except psutil.Error:
        return time.time()


def _paired_outputs(encodings: list[str] | None, outs: list[str]) -> list[tuple[str, str]]:
    """(encoding, OUT) pairs: the n-th --encoding writes to the n-th --out; no --encoding is gpt2."""
    encodings = encodings or ["gpt2"]
    if len(encodings) != len(outs):
        raise UserError(f"--encoding and --out pair up in order, one --out for each --encoding: got "
                        f"{len(encodings)} --encoding ({', '.join(encodings)}) and {len(outs)} --out "
                        f"({', '.join(outs)})")
    return list(zip(encodings, outs))


def _add_demo(sub) -> None:
    p = sub.add_parser("demo-corpus", help="write the small demo corpus (CPython's own docs, FineWeb columns)")
    p.add_argument("--to", required=True, help="folder for the parquet files")
    p.set_defaults(run=_run_demo)


def _run_demo(args) -> int:
    from .demo import build_demo_corpus  # here: sysconfig and the schema (~3 ms) only this command needs

    paths = build_demo_corpus(args.to)
    print(f"demo corpus: {len(paths)} parquet files in {args.to}")
    return 0


def _byte_count(text: str) -> int:
    """``1000000``, ``500M``, ``2G`` (decimal units, like the progress lines)."""
    return _scaled(text.upper().rstrip("B"), {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12},
                   given=text, expected="a byte count such as 200000000, 500M or 2G")


def _token_count(text: str) -> int:
    """``50000000``, ``500M``, ``10B`` (billions, as dataset sizes are named: FineWeb's sample-10BT)."""
    upper = text.upper()
    return _scaled(upper.removesuffix("T") if upper.endswith("BT") else upper,
                   {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12},
                   given=text, expected="a token count such as 50000000, 500M or 10B")


def _scaled(number: str, units: dict[str, int], *, given: str, expected: str) -> int:
    """A number with an optional unit letter at its end (``units``), as a whole count."""
    scale = 1
    if number and number[-1] in units:
        number, scale = number[:-1], units[number[-1]]
    try:
        value = float(number) * scale
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{given!r}: expected {expected}") from e
    # inf, 1e400, nan: kept as they are for the option's bounds to refuse in one line (limits.whole)
    return int(value) if math.isfinite(value) else value


def _add_train_bpe(sub) -> None:
    p = sub.add_parser("train-bpe", help="train a byte-level BPE vocabulary on parquet text (.tiktoken, .json, Hugging Face .hf/)")
    _add_input_argument(p, "parquet file, folder, glob or URL (s3://)")
    _add_hub_arguments(p)
    p.add_argument("--download-dir", metavar="DIR", help="with --dataset: download into DIR/sample/...")
    p.add_argument("--fetch", default="auto", choices=["auto", "client", "workers"],
                   help="with --dataset: this process downloads every file, or each worker machine its own files, "
                        "or (auto, default) what fits the cluster, as in tokenize")
    p.add_argument("--out", required=True, metavar="FILE.tiktoken",
                   help="ranks file to write; its sidecar FILE.tiktoken.json is written beside it, and FILE.hf/ "
                        "(tokenizer.json + tokenizer_config.json, for transformers' AutoTokenizer)")
    p.add_argument("--vocab-size", type=_whole, default=32768,
                   help="n_vocab of the result, special tokens included (default 32768: ids fit uint16)")
    p.add_argument("--special", action="append", default=[], metavar="TOKEN",
                   help="extra special token, repeatable; <|endoftext|> is always included (tokenize needs it)")
    p.add_argument("--pattern", default="gpt2", metavar="gpt2|cl100k|REGEX",
                   help="pre-tokenizer split pattern (default gpt2)")
    p.add_argument("--sample-bytes", type=_byte_count, metavar="N",
                   help="count only about N bytes of text: whole partitions spread evenly over the corpus (e.g. 2G)")
    p.add_argument("--min-count", type=_whole, default=1, help="drop pre-tokens seen fewer times (default 1: keep all)")
    p.add_argument("--merger", default="auto", choices=["auto", "gigatoken", "python"],
                   help="what merges the counts on the client: gigatoken (Rust, all cores; --pattern gpt2 only) or "
                        "the Python loop (one core); auto (default): gigatoken when it applies and is installed. "
                        "They break ties differently (BpeTrainer's rule vs the greater byte pair)")
    p.add_argument("--text-column", default="text")
    _add_on_bad_file_argument(p, "recorded in the sidecar FILE.tiktoken.json")
    _add_cluster_arguments(p, command="tokenshards.bpe.train")
    p.add_argument("--partition-mb", type=float, default=None,
                   help="text per partition in MB (default: as tokenize chooses, 8 MiB or more for huge corpora)")
    p.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                   help="passed to fsspec/s3fs (e.g. endpoint_url=http://127.0.0.1:9000); repeatable")
    p.set_defaults(run=_run_train_bpe)


def _run_train_bpe(args) -> int:
    from .bpe.train import TrainBpeConfig, run_train_bpe  # heavy: Dask, as tokenize

    config = TrainBpeConfig(
        out=args.out, vocab_size=args.vocab_size, specials=tuple(args.special), pattern=args.pattern,
        sample_bytes=args.sample_bytes, min_count=args.min_count, on_bad_file=args.on_bad_file, merger=args.merger,
        **_corpus_options(args), **_run_options(args),
    )
    return _print_lines(run_train_bpe(config, announce=_say))


EXPORT_HELP = "write a finished run as the files training code reads"


def _add_export(sub, *, whole: bool = True) -> None:
    """``whole=False``: a parser that only holds export's place among the commands (its name and
    its help's first words), for a command line that names another command."""
    if not whole:
        sub.add_parser("export", help=EXPORT_HELP)
        return
    from .export import formats  # heavy: numpy and pyarrow, in every format's module

    readers = ", ".join(dict.fromkeys(r.strip() for f in formats.REGISTRY.values() for r in f.reader.split(",")))
    p = sub.add_parser("export", help=f"{EXPORT_HELP} ({readers})")
    p.add_argument("out", metavar="OUT", nargs="+",
                   help="output folder or s3://bucket/prefix of a finished run; several: a shuffled mixture of them")
    p.add_argument("--format", required=True, choices=list(formats.FORMATS),
                   help="; ".join(f"{f.name}: {f.help}" for f in formats.REGISTRY.values()))
    sharded = " and ".join(f.name for f in formats.REGISTRY.values() if f.sharded)
    p.add_argument("--to", required=True, metavar="DEST",
                   help="folder, s3://bucket/prefix, or hf://datasets/ORG/NAME[/DIR] (a Hub dataset repo: exported into "
                        "--staging, then uploaded with a dataset card; HF_TOKEN or `hf auth login`)")
    p.add_argument("--staging", metavar="DIR", help="with hf://: local folder the export is written to before upload "
                   "(default HF_HOME/tokenshards/publish/...; on several machines, one every worker sees)")
    p.add_argument("--create-repo", action="store_true", help="with hf://: create the dataset repo when it does not exist")
    p.add_argument("--private", action="store_true", help="with --create-repo: make the new repo private")
    p.add_argument("--shard-tokens", type=_whole, metavar="N", help=f"tokens per shard, {sharded} (default 100,000,000)")
    p.add_argument("--min-shard-tokens", type=_whole, metavar="N",
                   help=f"{sharded}: a last shard under N tokens joins the one before it (default 1%% of --shard-tokens; "
                        f"0: never). llm.c needs processes x B x T + 1 tokens in every shard")
    p.add_argument("--val-tokens", type=_whole, metavar="N",
                   help="validation tokens, whole documents chosen by a hash of their id; 0 for none (default 10,485,760)")
    p.add_argument("--prefix", metavar="NAME", help="file name prefix (default fineweb; not for " + ", ".join(f.name for f in formats.REGISTRY.values() if f.fixed_names) + ")")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export of this format in DEST")
    p.add_argument("--shuffle", action="store_true",
                   help="documents in a seeded pseudo-random order over the whole corpus (mixtures always are)")
    p.add_argument("--seed", type=_whole, metavar="S", help="the shuffled order (default 0); the same seed gives the same files")
    p.add_argument("--weights", type=float, nargs="+", metavar="W",
                   help="one per OUT: its share of the mixture's train tokens (default: each run's size)")
    p.add_argument("--tokens", type=_token_count, metavar="N",
                   help="train tokens of the mixture, e.g. 10B (default: the most that repeats no run)")
    p.add_argument("--seq-len", type=_whole, metavar="N",
                   help=f"{' and '.join(formats.PACKED)}: rows of N tokens with each row's segment lengths (seq_lengths: its "
                        f"documents, then its padding) and position ids that restart at each segment; {' and '.join(formats.PACKED_IN_TRAINER_FILES)}: "
                        "rows of N tokens in the trainer's own files, its reader finding the documents")
    p.add_argument("--pack", choices=["concat", "best-fit"],
                   help="with --seq-len: concat cuts the stream into N-token windows (default; only the tail is left "
                        "over); best-fit places whole documents (longer ones split at N) and pads")
    p.add_argument("--bos-align", action="store_true",
                   help="with --seq-len: every row starts at a document's first token (what a cut document loses is counted)")
    p.add_argument("--columns", type=lambda s: tuple(c for c in s.split(",") if c), metavar="A,B",
                   help="with --seq-len: optional columns, of position_ids,attention_mask,labels (labels: hf only; "
                        "default position_ids)")
    _add_cluster_arguments(p, command="tokenshards.export.command")
    p.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                   help="passed to fsspec/s3fs, for OUT and DEST; repeatable")
    p.set_defaults(run=_run_export)


def _run_export(args) -> int:
    from .export import ExportConfig, run_export  # heavy: Dask (and for hf://, huggingface_hub), as tokenize

    given = {"val_tokens": args.val_tokens} if args.val_tokens is not None else {}  # else ExportConfig's default
    config = ExportConfig(out=args.out[0], mix_with=tuple(args.out[1:]), format=args.format, to=args.to,
                          shard_tokens=args.shard_tokens, min_shard_tokens=args.min_shard_tokens, prefix=args.prefix,
                          overwrite=args.overwrite, shuffle=args.shuffle, seed=args.seed,
                          weights=tuple(args.weights) if args.weights is not None else None, tokens=args.tokens,
                          seq_len=args.seq_len, pack=args.pack, bos_align=args.bos_align, columns=args.columns,
                          **given, **_run_options(args))
    if is_hub_url(args.to):
        from .export.publish import PublishConfig, run_publish

        return _print_lines(run_publish(PublishConfig(export=config, staging=args.staging, create_repo=args.create_repo,
                                                      private=args.private), announce=_say))
    if args.staging or args.create_repo or args.private:
        raise UserError("--staging, --create-repo and --private apply to --to hf://datasets/ORG/NAME[/DIR] only")
    return _print_lines(run_export(config, announce=_say))


def _add_verify(sub) -> None:
    p = sub.add_parser("verify", help="check every partition of a finished run; exit 1 on any problem")
    p.add_argument("out", metavar="OUT", help="output folder or s3://bucket/prefix of a finished run")
    p.add_argument("--deep", type=_whole, default=0, metavar="N",
                   help="also re-tokenize N random documents from the inputs and compare with the tokenizer's own "
                        "library (tiktoken, tokenizers, sentencepiece)")
    p.add_argument("--seed", type=_whole, default=0, help="which documents --deep picks (default 0)")
    p.add_argument("--encoding", metavar="TOKENIZER",
                   help="with --deep: where the run's tokenizer is now, named as tokenize's --encoding takes it "
                        "(default: the name or source the manifest records); its files must be the run's")
    p.add_argument("--download-dir", metavar="DIR",
                   help="with --deep, for a --fetch workers run: where each machine keeps its copies of the Hub files "
                        "(default: the run's --download-dir, else the HF cache); files not there are read from the Hub")
    _add_cluster_arguments(p, command="tokenshards.verify.command")
    p.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                   help="passed to fsspec/s3fs, for OUT and (with --deep) the inputs; repeatable")
    p.set_defaults(run=_run_verify)


def _run_verify(args) -> int:
    from .verify.command import VerifyConfig, run_verify  # heavy: Dask, as tokenize

    config = VerifyConfig(out=args.out, deep=args.deep, seed=args.seed, download_dir=args.download_dir,
                          encoding=args.encoding, **_run_options(args))
    report = run_verify(config, announce=_say)
    for line in report.lines():
        print(line)
    return 0 if report.ok else 1


def _add_inspect(sub) -> None:
    p = sub.add_parser("inspect", help="totals, tokens-per-document percentiles, per-language counts; --plot draws "
                                       "lengths; a run of more than a few dozen partitions is read on the cluster")
    p.add_argument("out", metavar="OUT", help="output folder or s3://bucket/prefix of a finished run")
    p.add_argument("--plot", metavar="FILE.png", help="write a histogram of document lengths in tokens (log x)")
    p.add_argument("--language-column", default="language",
                   help="input column counted per language (default: language, as in FineWeb)")
    _add_cluster_arguments(p, command="tokenshards.inspect.command")
    p.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                   help="passed to fsspec/s3fs, for OUT, the inputs and --plot; repeatable")
    p.set_defaults(run=_run_inspect)


def _run_inspect(args) -> int:
    # heavy: Dask (and matplotlib for --plot), as tokenize
    from .inspect.command import InspectConfig, run_inspect
    from .inspect.stats import plot_format, plot_lengths, report_lines
    from .format.run import check_destination
    from .storage.location import Location

    config = InspectConfig(out=args.out, language_column=args.language_column, **_run_options(args))
    if args.plot:
        plot_format(args.plot)  # a wrong name is said before the run is read
        # Its folder: not under a file, nor inside a run's parts/ (OUT itself is fine: `make inspect`'s default).
        folder = args.plot.rsplit("/", 1)[0] if "/" in args.plot else "."
        check_destination(Location.at(folder, config.storage_options), "--plot", may_be_a_run=True)
    stats = run_inspect(config, announce=_say)
    for line in report_lines(stats):
        print(line)
    if args.plot:
        plot_lengths(stats, args.plot, storage_options=config.storage_options)
        print(f"plot: {args.plot}")
    return 0


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line's parser. ``argv``, the command line it will parse, if known: when
    that names another command, export's parser is left a placeholder (``_add_export``)."""
    parser = _Parser(prog="tokenshards", description="Parquet text → exact token arrays, on Dask.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for user errors too")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_tokenize(sub)
    _add_download(sub)
    _add_demo(sub)
    _add_export(sub, whole=argv is None or _command_named(argv) not in OTHER_COMMANDS)
    _add_verify(sub)
    _add_inspect(sub)
    _add_train_bpe(sub)
    return parser


OTHER_COMMANDS = ("tokenize", "download", "demo-corpus", "verify", "inspect", "train-bpe")
"""Every command but export (``build_parser``; a test holds this list to the parser's)."""


def _command_named(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names: its first word that is not an option (the only option before a
    command, ``--debug``, takes no value). None before it is named, or when help is asked first
    (the command list then shows export's whole help line)."""
    for word in map(str, argv):
        if word in ("-h", "--help"):
            return None
        if not word.startswith("-"):
            return word
    return None


class _Parser(argparse.ArgumentParser):
    """argparse with ``--debug`` after a subcommand too, a suggestion for a misspelled option
    (``--inptu``: did you mean --input?), which Python before 3.14's argparse does not give, and its
    errors in one line like every other (``--seq-len abc``: not argparse's usage, then the line)."""

    def error(self, message: str):
        command = self.prog.removeprefix("tokenshards").strip()
        self.exit(2, f"tokenshards: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.prog != "tokenshards":  # a subcommand's parser
            self.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)

    def parse_known_args(self, args=None, namespace=None):
        namespace, extra = super().parse_known_args(args, namespace)
        if extra and getattr(namespace, "command", None):  # the top parser saw a subcommand's leftovers
            sub = next(a for a in self._subparsers._group_actions if isinstance(a, argparse._SubParsersAction))
            command = sub.choices[namespace.command]
            known = [o for action in command._actions for o in action.option_strings]
            for option in (e for e in extra if e.startswith("--")):
                close = difflib_close(option.split("=", 1)[0], known)
                if close:  # the subcommand's usage, not the top-level one
                    command.error(f"unrecognized arguments: {' '.join(extra)} (did you mean {close}?)")
        return namespace, extra


def difflib_close(option: str, known: list[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(option, [k for k in known if k.startswith("--")], n=1)
    return found[0] if found else None


def _prestart_local_workers(args) -> None:
    """Commands that will start a LocalCluster (no --scheduler, no --cluster of another kind)
    start its workers' forkserver now, before this process imports the rest (prestart.py)."""
    if args.scheduler:
        return
    if args.command == "inspect" and not (args.workers or args.cluster):
        return  # it may well read in this process (inspect.command: small runs); a cluster it starts starts unprimed
    if args.cluster:
        from .cluster.configfile import load_cluster_config  # heavy: dask and yaml, for --cluster only

        if load_cluster_config(args.cluster, workers=args.workers).kind != "local":
            return
    # here: what starts the forkserver (multiprocessing, ~10 ms) is no part of --help or a remote run
    from .cluster.prestart import gc_paused, start_forkserver
    from .encoding import prebuilt
    from .tokenize.workers import forkserver_preload

    with gc_paused():  # start-up makes objects that live to the end: collecting meanwhile finds none
        # tokenize names its encodings and backend: the server prebuilds them for the workers.
        backend = getattr(args, "backend", None)
        preload = forkserver_preload(args.encoding or ["gpt2"], backend) if backend else forkserver_preload()
        if start_forkserver(preload):
            prebuilt.started(preload)
        importlib.import_module(args.command_module)


def main(argv: list[str] | None = None, *, prestart_workers: bool = False) -> int:
    """``prestart_workers``: start local workers' forkserver first thing (the command line does;
    a caller in a long-lived process, such as a test, keeps Dask's own start method)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv)
    args = parser.parse_args(argv)
    interrupt.install()
    try:
        if prestart_workers and hasattr(args, "scheduler"):
            _prestart_local_workers(args)
        return args.run(args)
    except UserError as e:
        if args.debug:
            scrub_exception(e)  # and its causes: a library's own words may quote a credential
            traceback.print_exc()
        # One line, whatever a cause's text held (pyarrow's end in a line break).
        print("tokenshards: error: " + " ".join(line.strip() for line in str(e).splitlines() if line.strip()),
              file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if interrupt.terminated():
            print(f"tokenshards: terminated (SIGTERM); {_after_interrupt(args)}", file=sys.stderr)
            return 128 + signal.SIGTERM
        print(f"tokenshards: interrupted; {_after_interrupt(args)}", file=sys.stderr)
        return 130


def _after_interrupt(args) -> str:
    """What an interrupted command leaves and how to go on: only tokenize and download resume."""
    command = args.command
    if command == "tokenize":
        return "committed partitions are kept, rerun the same command to resume"
    if command == "download":
        return "files already downloaded are kept, rerun the same command to fetch the rest"
    if command == "export" and is_hub_url(args.to):
        return ("rerun the same command: the staged export is made again unless it was finished, and files already "
                "on the Hub are not sent again")
    if command == "export":
        return (f"an export does not resume: {args.to} may hold part of this one (files without their record, "
                "which no trainer should read); rerun with --overwrite to replace them")
    if command in ("verify", "inspect"):
        return "nothing was changed"
    return "rerun the same command to start again"


def console_main(argv: list[str] | None = None):
    """The ``tokenshards`` command. Once it is done, the exit handlers run and the process ends
    there: the interpreter's own teardown would free, one by one, every object Dask, pandas and
    bokeh made, for nothing (~0.15 s of a tokenize run measured here, after what the workers wait on).

    This process never does linear algebra, yet numpy's OpenBLAS starts a thread per core that
    spins for a while after loading (~0.1 s of CPU at start-up, profiled): while the local workers'
    forkserver imports on the other core. One thread, unless the environment says otherwise."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    code = main(argv, prestart_workers=True)
    atexit._run_exitfuncs()  # what sys.exit would run: logging flushes, temp-file and process finalizers
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can reach the reader
            pass
    os._exit(int(code or 0))


if __name__ == "__main__":
    console_main()
