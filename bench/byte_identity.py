#!/usr/bin/env python3
"""Same run, same bytes: today's code against another commit's (issue 46, item 5).

    python bench/byte_identity.py [--base 4a5969f] [--encoding gpt2] [--formats llmc,npy,...]

Checks out ``--base`` into a temporary worktree and runs both versions of ``tokenshards`` (the
same venv, each version's own ``lib/`` first on ``PYTHONPATH``) on the demo corpus: ``tokenize``,
then ``export`` in every format both versions know, plain and shuffled. Every file both write is
compared byte for byte, except the few fields that say when or how long (listed in
``VOLATILE``: masked in the JSON files that carry them); any other difference is printed and the
exit status is 1. Not run by the tests (two whole runs per format: a few minutes).
"""
from __future__ import annotations

import argparse
import filecmp
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORMATS = ("llmc", "npy", "nanogpt", "megatron", "olmo", "datatrove", "litdata", "mds")
VOLATILE = {"created", "created_at", "finished_at", "started_at", "seconds", "elapsed", "elapsed_seconds", "wall_seconds",
            "timings", "tool_version", "version", "host", "hostname", "pid", "written_at", "when"}
"""Keys whose values say when, how long, or which build wrote a file: masked before comparing JSON."""


def tokenshards(lib: Path, *args: str, cwd: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(lib))
    done = subprocess.run([sys.executable, "-m", "tokenshards", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{lib}: tokenshards {' '.join(args)} failed:\n{done.stderr[-3000:]}")


def masked(path: Path):
    """A JSON file's content with ``VOLATILE`` keys dropped at any depth, or None if not JSON."""
    def drop(value):
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if k not in VOLATILE}
        if isinstance(value, list):
            return [drop(v) for v in value]
        return value

    try:
        return drop(json.loads(path.read_bytes()))
    except (ValueError, UnicodeDecodeError):
        return None


def compare(a: Path, b: Path) -> list[str]:
    """What differs between two trees: missing files, and files whose bytes (JSON: masked content) differ."""
    found = []
    files_a = {p.relative_to(a) for p in a.rglob("*") if p.is_file()}
    files_b = {p.relative_to(b) for p in b.rglob("*") if p.is_file()}
    found += [f"only in base: {p}" for p in sorted(files_a - files_b)]
    found += [f"only now: {p}" for p in sorted(files_b - files_a)]
    for rel in sorted(files_a & files_b):
        if filecmp.cmp(a / rel, b / rel, shallow=False):
            continue
        ja, jb = masked(a / rel), masked(b / rel)
        if ja is None or ja != jb:
            found.append(f"differs: {rel}")
    return found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="4a5969f", help="the commit to compare with (default: main before issue 46's moves)")
    ap.add_argument("--encoding", default="gpt2")
    ap.add_argument("--formats", type=lambda s: s.split(","), default=list(FORMATS))
    args = ap.parse_args()
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base = tmp / "checkout"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(base), args.base], check=True)
        try:
            corpus = tmp / "demo"
            tokenshards(ROOT / "lib", "demo-corpus", "--to", str(corpus), cwd=tmp)
            versions = {"then": base / "lib", "now": ROOT / "lib"}
            work = tmp / "work"  # each version writes here, then is moved aside: the same paths in both
            for name, lib in versions.items():
                tokenshards(lib, "tokenize", "--input", f"{corpus}/*.parquet", "--out", str(work / "run"),
                            "--encoding", args.encoding, "--workers", "2", "--progress", "none", cwd=tmp)
                for fmt in args.formats:
                    for shuffled in (False, True):
                        dest = work / f"{fmt}{'-shuffled' if shuffled else ''}"
                        tokenshards(lib, "export", str(work / "run"), "--format", fmt, "--to", str(dest),
                                    "--val-tokens", "50000", "--workers", "2", "--progress", "none", *(["--shuffle", "--seed", "7"] if shuffled else []),
                                    cwd=tmp)
                work.rename(tmp / name)
            for sub in sorted(p.name for p in (tmp / "then").iterdir()):
                differs = compare(tmp / "then" / sub, tmp / "now" / sub)
                print(f"{sub:24} {'identical' if not differs else f'{len(differs)} difference(s)'}")
                problems += [f"{sub}: {d}" for d in differs]
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], check=False)
    for line in problems:
        print(line)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
