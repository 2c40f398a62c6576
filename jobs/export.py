"""Job entry point: `.venv/bin/python jobs/export.py OUT --format llmc --to DEST` (same as `tokenshards export`)."""
import sys

from tokenshards.cli import console_main

if __name__ == "__main__":
    console_main(["export", *sys.argv[1:]])
