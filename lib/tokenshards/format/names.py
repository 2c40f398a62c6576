"""The names of a run's files (format v1): where a reader finds each one, and which partition a
part file's name gives. Nothing here opens a file; every other ``format`` module names files
through these."""
from __future__ import annotations

FORMAT = "tokenshards/1"
MANIFEST = "manifest.json"
JOB_FILE = "tokenshards-job.json"
"""What the run in OUT was asked to do; the first file a run writes there, so a rerun with other
inputs or options can say exactly what differs (``tokenize.resume``), and a folder without it
and without ``parts/`` was never a run."""


def part_stem(index: int) -> str:
    return f"parts/part-{index:05d}"


def tokens_file(index: int) -> str:
    return f"{part_stem(index)}.tokens.npy"


def docs_file(index: int) -> str:
    return f"{part_stem(index)}.docs.parquet"


def mask_file(index: int) -> str:
    """A chat run's assistant mask (``tokenize --chat-column``): ``.npy``, uint8, one per token."""
    return f"{part_stem(index)}.mask.npy"


def done_file(index: int) -> str:
    return f"{part_stem(index)}.done.json"


def part_index(name: str) -> int | None:
    """The partition number in a part file's name (``parts/part-00042.tokens.npy`` → 42), or None."""
    base = name.rsplit("/", 1)[-1]
    number = base[len("part-"):].split(".", 1)[0]
    return int(number) if base.startswith("part-") and number.isdigit() else None


