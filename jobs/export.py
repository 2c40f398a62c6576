"""Job entry point: `python jobs/export.py OUT --format llmc --to DEST` (same as `tokenshards export`)."""
import os
import sys

# Python puts this folder first on sys.path, where jobs/tokenize.py would shadow the standard
# library's `tokenize` (imported by traceback, linecache...): look for modules elsewhere.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]

from tokenshards.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["export", *sys.argv[1:]]))
