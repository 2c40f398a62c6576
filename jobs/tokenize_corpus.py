"""Job entry point: `.venv/bin/python jobs/tokenize_corpus.py --input ... --out ...` (same as `tokenshards tokenize`)."""
import sys

from tokenshards.cli import console_main

if __name__ == "__main__":
    console_main(["tokenize", *sys.argv[1:]])
