"""``datatrove``: datatrove's tokenized files, read by ``DatatroveFolderDataset`` (and so by
nanotron's ``Nanoset``): per split a folder (``train/``, ``val/``: the dataset takes one folder)
holding ``PREFIX.ds`` (the tokens, raw little-endian uint16, or uint32 for vocabularies over
65,536 ids: its ``token_size`` 2 or 4), ``PREFIX.ds.index`` (uint64 end of every document, in
tokens from the file's start, as datatrove's ``TokenizedFile`` writes it; read for
``return_positions``) and ``PREFIX.ds.metadata`` (``TOKENIZER|TOKEN_SIZE``, the token count and
that count for people, as its ``write_final_metadata``).
"""
from __future__ import annotations

import numpy as np

from ..layout import DocOffsets, Literal, MaskRun, OutFile, Streams, TokenRun
from .base import Format, Plan, wide


def metadata(*, tokenizer: str, token_size: int, tokens: int) -> bytes:
    return "\n".join([f"{tokenizer}|{token_size}", str(tokens), _metric(tokens)]).encode()


def _metric(n: int) -> str:
    """``humanize.metric(n, unit="T")``'s look (``1.50 kT``): for people only, nothing parses it."""
    value, prefix = float(n), ""
    for p in ("k", "M", "G", "T", "P"):
        if value < 999.5:
            break
        value, prefix = value / 1000, p
    return f"{value:.{max(0, 3 - len(str(int(value))))}f} {prefix}T"


class Datatrove(Format):
    name = "datatrove"
    reader = "datatrove, nanotron"
    help = "datatrove .ds/.ds.index/.ds.metadata in train/ and val/ (DatatroveFolderDataset, nanotron)"

    def files(self, streams: Streams, plan: Plan) -> list[OutFile]:
        token_size = np.dtype(plan.dtype).itemsize
        files = []
        for split in ("train", "val"):
            tokens, docs = streams.tokens(split), streams.docs(split)
            if not tokens:
                continue
            stem = f"{split}/{plan.prefix}.ds"
            files.append(OutFile(name=stem, split=split, tokens=tokens, regions=(TokenRun(split, 0, tokens, plan.dtype),)))
            files.append(OutFile(name=f"{stem}.index", split=split, tokens=0,
                                 regions=(DocOffsets(split, docs, end=True, dtype="<u8"),)))
            files.append(OutFile(name=f"{stem}.metadata", split=split, tokens=0, regions=(
                Literal(metadata(tokenizer=plan.encoding or "unknown", token_size=token_size, tokens=tokens)),)))
            if plan.mask:  # a chat run's: one bool byte per token, 1 = take the loss (DocumentTokenizer's .loss)
                files.append(OutFile(name=f"{stem}.loss", split=split, tokens=0, regions=(MaskRun(split, 0, tokens),)))
        return files

    def patterns(self, prefix: str) -> list[str]:
        return [f"{split}/{prefix}.ds{suffix}" for split in ("train", "val")
                for suffix in ("", ".index", ".metadata", ".loss")]

    def notes(self, files: list[OutFile], plan: Plan) -> list[str]:
        size = np.dtype(plan.dtype).itemsize
        note = (f"datatrove: DatatroveFolderDataset(DEST/train, seq_len, token_size={size}) (nanotron: the train/ folder, "
                f"token size {size}); val/ likewise")
        if wide(plan.dtype):
            note += f"; this {plan.n_vocab:,}-token vocabulary needs token_size=4 (uint32), the readers' default is 2"
        return [note]


FORMAT = Datatrove()
