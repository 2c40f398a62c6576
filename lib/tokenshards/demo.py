"""A small FineWeb-shaped demo corpus from text that ships with CPython itself.

Documents are pydoc's help topics and the standard library's docstrings (read with ``ast``,
never imported), written with FineWeb's columns so the demo runs exactly like the real thing.
"""
from __future__ import annotations

import ast
import sysconfig
import uuid
from pathlib import Path
from typing import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import UserError

FINEWEB_SCHEMA = pa.schema([
    ("text", pa.string()), ("id", pa.string()), ("dump", pa.string()), ("url", pa.string()),
    ("date", pa.string()), ("file_path", pa.string()), ("language", pa.string()),
    ("language_score", pa.float64()), ("token_count", pa.int64()),
])
NAMESPACE = uuid.UUID("6f1c8d2e-3b1a-4c55-9a51-0d6a3e1f7b42")


def help_topics() -> Iterator[tuple[str, str]]:
    from pydoc_data.topics import topics

    for name in sorted(topics):
        yield f"https://docs.python.org/3/reference/{name}", topics[name]


def stdlib_docstrings() -> Iterator[tuple[str, str]]:
    """One document per stdlib module: its docstring and those of its classes and functions."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in ("site-packages", "test", "idlelib", "lib2to3") or "tests" in rel.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        docs = [ast.get_docstring(tree) or ""]
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc:
                    docs.append(f"{node.name}\n\n{doc}")
        text = "\n\n".join(d for d in docs if d)
        if text:
            yield f"https://docs.python.org/3/library/{rel.as_posix()}", text


def build_demo_corpus(out_dir: str | Path, *, files: int = 4, row_group_rows: int = 64) -> list[Path]:
    """Write ``files`` parquet shards (FineWeb schema) to ``out_dir``; returns their paths.
    Deterministic: the same Python gives the same bytes."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--to {out_dir}: is an existing file, not a folder; choose a folder (it is made if missing)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--to {out_dir}: cannot make the folder ({type(e).__name__}: {e.strerror or e}); "
                        "choose another folder or fix its permissions") from e
    docs = list(help_topics()) + list(stdlib_docstrings())
    paths = []
    for shard in range(files):
        rows = docs[shard::files]
        table = pa.table({
            "text": [text for _, text in rows],
            "id": [f"<urn:uuid:{uuid.uuid5(NAMESPACE, url)}>" for url, _ in rows],
            "dump": ["CPython-docs"] * len(rows),
            "url": [url for url, _ in rows],
            "date": ["2026-01-01T00:00:00Z"] * len(rows),
            "file_path": [f"demo/000_{shard:05d}.parquet"] * len(rows),
            "language": ["en"] * len(rows),
            "language_score": [1.0] * len(rows),
            "token_count": [-1] * len(rows),
        }, schema=FINEWEB_SCHEMA)
        path = out / f"000_{shard:05d}.parquet"
        tmp = path.with_suffix(".parquet.tmp")
        try:
            pq.write_table(table, tmp, row_group_size=row_group_rows)
            tmp.replace(path)
        except (OSError, pa.ArrowException) as e:
            tmp.unlink(missing_ok=True)
            raise UserError(f"--to {out_dir}: cannot write {path.name} ({type(e).__name__}: {e}); "
                            "free some space or choose another folder") from e
        paths.append(path)
    return paths
