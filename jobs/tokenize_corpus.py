"""Job entry point: `python jobs/tokenize_corpus.py --input ... --out ...` (same as `tokenshards tokenize`)."""
import sys

from tokenshards.cli import main

if __name__ == "__main__":
    sys.exit(main(["tokenize", *sys.argv[1:]]))
