"""One frozen, validated configuration object per job; the CLI fills it, nothing else reads flags."""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from ..cluster.options import RunOptions
from ..corpus.plan import check_on_bad_file
from ..corpus.plan import TOOLS_AUTO, tools_to_read
from ..encoding.boundaries import BOUNDARY_CHOICES, EOT_TO_BOUNDARY, Boundaries, resolve
from ..errors import UserError
from ..storage.hubspec import HubDataset

EOT_POSITIONS = ("prefix", "suffix", "none")
ON_BAD_ROW = ("fail", "skip")
"""``--tools-column``: its default (a ``tools`` column where an input has one), no tools, and that column's name."""

@dataclass(frozen=True)
class Output:
    """One encoding and the folder its run goes to: a run writes one or several of these."""

    encoding: str
    out: str


@dataclass(frozen=True, kw_only=True)
class TokenizeConfig(RunOptions):
    """Everything that decides *what* a run writes (and, below the line, *how* it runs)."""

    inputs: tuple[str, ...]
    out: str
    encoding: str = "gpt2"
    """What ``--encoding`` names (``encoding.registry``): a tiktoken encoding, a file, a Hub repo."""
    eot_position: str | None = None
    """``--eot``: one ``<|endoftext|>`` before, after or nowhere (None: not given)."""
    boundary: str = "auto"
    """``--boundary``: the tokenizer's own boundaries (auto), its BOS, EOS, both or none."""
    text_column: str = "text"
    id_column: str | None = None
    """None: use the source's ``id`` column when present, else ``"<file>:<row>"``."""
    partition_bytes: int | None = None
    """Text per partition; None: ``corpus.plan.auto_partition_bytes`` of the corpus (never the cluster)."""
    on_bad_file: str = "fail"
    backend: str = "auto"
    """Tokenizer implementation: never changes the ids (a fast one is verified against tiktoken)."""
    overwrite: bool = False
    add: bool = False
    """Grow the finished run in ``out`` with the inputs it lacks (``tokenize.grow``)."""
    hub: HubDataset | None = None
    """A Hub dataset sample (``--dataset/--size``), tokenized after (or besides) ``inputs``."""
    chat_column: str | None = None
    """``--chat-column``: rows are conversations (lists of {role, content}) rendered through the
    tokenizer's chat template, with an assistant mask beside the tokens (``encoding.chat``)."""
    on_bad_row: str = "fail"
    """``--on-bad-row``: a chat row whose messages are malformed fails the run, or is skipped and counted."""
    tools_column: str = TOOLS_AUTO
    """``--tools-column``: each chat row's tools (``encoding.chat.tools_of``) come from this column:
    ``auto``, a column named ``tools`` where an input has one (as TRL's ``SFTTrainer`` reads it);
    ``none``, no tools; else the column of that name, which every input must have."""
    chat_template: str | None = None
    """``--chat-template``: a file holding the Jinja chat template conversations are rendered with,
    instead of the tokenizer's own (a training template that marks ``{% generation %}``)."""
    more_outputs: tuple[Output, ...] = ()
    """Further (encoding, OUT) pairs (``--encoding``/``--out`` repeated), written from the same
    reads: each OUT gets what a run of its encoding alone writes there."""
    # -- how it runs (and RunOptions): never changes the output bytes --
    report: str | None = None
    retries: int = 2

    def __post_init__(self):
        super().__post_init__()
        if not self.inputs and self.hub is None:
            raise UserError("no input given: pass --input PATH_OR_GLOB (or --dataset REPO --size SIZE)")
        if self.eot_position is not None and self.eot_position not in EOT_POSITIONS:
            raise UserError(f"--eot {self.eot_position!r} not supported, expected one of {EOT_POSITIONS}")
        if self.boundary not in BOUNDARY_CHOICES:
            raise UserError(f"--boundary {self.boundary!r} not supported, expected one of {', '.join(BOUNDARY_CHOICES)}")
        if self.eot_position is not None and self.boundary != "auto":
            raise UserError(f"--eot {self.eot_position} and --boundary {self.boundary} both say where the boundaries go: "
                            "give one (--eot is --boundary's older name for tiktoken's <|endoftext|>)")
        check_on_bad_file(self.on_bad_file)
        self._check_chat()
        if self.add and self.hub is not None:
            raise UserError("--add takes --input files; a --dataset sample cannot be added to a run yet: "
                            "download it first (`tokenshards download --to DIR`) and pass --input DIR")
        if self.partition_bytes is not None and self.partition_bytes < 1:
            raise UserError(f"--partition-mb {self.partition_bytes / 1e6:g} must be positive")
        _check_distinct(self.outputs)

    def _check_chat(self) -> None:
        if self.on_bad_row not in ON_BAD_ROW:
            raise UserError(f"--on-bad-row {self.on_bad_row!r} not supported, expected one of {ON_BAD_ROW}")
        if not self.tools_column:
            raise UserError("--tools-column needs a column name (or none, or auto)")
        if self.chat_column is None:
            if self.on_bad_row != "fail":
                raise UserError("--on-bad-row is about chat rows: add --chat-column COLUMN (or drop --on-bad-row)")
            if self.tools_column != TOOLS_AUTO:
                raise UserError("--tools-column is about chat rows: add --chat-column COLUMN (or drop --tools-column)")
            if self.chat_template is not None:
                raise UserError("--chat-template is about chat rows: add --chat-column COLUMN (or drop --chat-template)")
            return
        if self.tools_column == self.chat_column:
            raise UserError(f"--tools-column {self.tools_column} is also --chat-column: the tools are a column of "
                            "their own beside the messages")
        if self.text_column not in ("text", self.chat_column):
            raise UserError(f"--text-column {self.text_column} and --chat-column {self.chat_column} name two columns; "
                            "a chat run reads one: give --chat-column alone")
        object.__setattr__(self, "text_column", self.chat_column)  # the column every stage reads
        if self.eot_position is not None or self.boundary != "auto":
            given = f"--eot {self.eot_position}" if self.eot_position is not None else f"--boundary {self.boundary}"
            raise UserError(f"{given} with --chat-column: the chat template writes a conversation's own control "
                            "tokens (its BOS, its end-of-turn); drop it")
        if self.more_outputs:
            raise UserError("--chat-column takes one --encoding and one --out (each tokenizer has its own chat template); "
                            "run it once per tokenizer")

    @property
    def tools_to_read(self) -> tuple[str, bool] | None:
        return tools_to_read(self.chat_column, self.tools_column)

    @property
    def outputs(self) -> tuple[Output, ...]:
        """Every (encoding, OUT) of the run, the first being ``encoding`` and ``out``."""
        return (Output(self.encoding, self.out), *self.more_outputs)

    def for_output(self, output: Output) -> "TokenizeConfig":
        """This run as one that writes ``output`` alone: what decides that OUT's bytes."""
        return dataclasses.replace(self, encoding=output.encoding, out=output.out, more_outputs=())

    def boundaries(self, loaded) -> Boundaries:
        """The boundaries this run places around each document of ``loaded``'s tokenizer."""
        if self.chat_column is not None:
            return Boundaries(why="a chat run: the chat template writes each conversation's own control tokens")
        if self.eot_position is not None and loaded.legacy:  # tiktoken's one <|endoftext|>, as always
            eot = loaded.spec.eot
            return Boundaries(prefix=(eot,) if self.eot_position == "prefix" else (),
                              suffix=(eot,) if self.eot_position == "suffix" else (), why=f"--eot {self.eot_position}")
        request = EOT_TO_BOUNDARY[self.eot_position] if self.eot_position is not None else self.boundary
        return resolve(request, natural=loaded.natural, bos=loaded.bos, eos=loaded.eos, tokenizer=self.encoding)

    def replace(self, **changes) -> "TokenizeConfig":
        return dataclasses.replace(self, **changes)


def _check_distinct(outputs: tuple[Output, ...]) -> None:
    """Two encodings must not share an OUT: each would take the other's folder for a different run."""
    seen: dict[str, Output] = {}
    for output in outputs:
        key = _place(output.out)
        if key in seen:
            raise UserError(f"--out {output.out} is given twice (for --encoding {seen[key].encoding} and "
                            f"--encoding {output.encoding}); each --encoding needs a folder of its own")
        seen[key] = output


def _place(out: str) -> str:
    """Where an OUT is, compared as written for URLs and as an absolute path for local folders."""
    local = out.removeprefix("file://")
    if "://" in local:
        return local.rstrip("/")
    return os.path.abspath(os.path.expanduser(local))
