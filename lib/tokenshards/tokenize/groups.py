"""Tasks of several small planned partitions: one Dask task reads, tokenizes, writes and commits
each of them in turn, as its own partition.

A Dask task costs the same whatever it holds: on 1 GB cut into 1,976 partitions of ~0.5 MB, the
workers' event loops, the client and the scheduler spent ~8 ms of CPU per task beside the task's
own work (``bench/where_time_goes.py --whole``). Partitions stay as planned (their files, records,
ids and bytes do not change with the grouping, and each commits on its own: a group that fails
half-way leaves its first partitions committed, for a rerun to keep); only how many a task carries
does. Consecutive pieces of one input, in the order tasks are submitted, go together while their
text stays under ``GROUP_BYTES``: a default 8 MiB partition is a group of its own.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd

from ..corpus.plan import DEFAULT_PARTITION_BYTES, Piece
from ..corpus.read import read_piece
from .task import TaskResult, TaskSettings, piece_frame, write_frame

GROUP_BYTES = DEFAULT_PARTITION_BYTES
"""A group's text at most (a piece this large or larger is a group of one): a task as long as a
default partition's, so the cores are as evenly loaded at the end of a run as with default partitions."""

Group = tuple[Piece, ...]


def group_pieces(pieces: Sequence[Piece], *, limit: int | None = None) -> list[Group]:
    """``pieces`` in their order, consecutive ones of the same input together while their text
    stays under ``limit`` (default ``GROUP_BYTES``)."""
    limit = GROUP_BYTES if limit is None else limit
    groups: list[list[Piece]] = []
    size = 0
    for piece in pieces:
        if groups and groups[-1][-1].input == piece.input and size + piece.text_bytes <= limit:
            groups[-1].append(piece)
            size += piece.text_bytes
        else:
            groups.append([piece])
            size = piece.text_bytes
    return [tuple(g) for g in groups]


def tokenize_group(group: Group, outputs: tuple[tuple[int, ...] | None, ...], *,
                   settings: TaskSettings | Sequence[TaskSettings]) -> pd.DataFrame:
    """``dd.from_map``'s function for a group: each piece read (``read_piece``) and written for its
    ``outputs`` (``write_frame``), one after another; a result row per partition and output."""
    read = settings if isinstance(settings, TaskSettings) else settings[0]
    results: list[TaskResult] = []
    for piece, wanted in zip(group, outputs):
        frame = read_piece(piece, text_column=read.text_column, storage_options=read.storage_options,
                           on_bad_file=read.on_bad_file, tools=read.chat.tools if read.chat else None)
        results += TaskResult.all_from_frame(write_frame(frame, piece_frame(piece, wanted), settings=settings))
    return TaskResult.as_frame(results)


def describe(group: Group) -> str:
    """What a failed group names: its partitions and where they come from."""
    first, last = group[0], group[-1]
    if len(group) == 1:
        return f"partition {first.index} ({first.input}, row groups {first.row_groups[0]}..{first.row_groups[1] - 1})"
    return (f"partitions {first.index}..{last.index} ({first.input}, row groups "
            f"{first.row_groups[0]}..{last.row_groups[1] - 1})")
