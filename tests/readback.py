"""Read a format v1 output with plain json/numpy/pyarrow, as a user's training code would."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq


def expected_tokens(enc, text: str, eot_position: str = "prefix") -> list[int]:
    body = enc.encode_ordinary(text)
    if eot_position == "prefix":
        return [enc.eot_token] + body
    if eot_position == "suffix":
        return body + [enc.eot_token]
    return body


def read_documents(out: Path) -> dict[tuple[str, int], tuple[str, list[int]]]:
    """{(input path, row): (id, tokens)} for every document in OUT, checking the invariants
    every reader relies on (contiguity, counts, sha256) on the way."""
    out = Path(out)
    manifest = json.loads((out / "manifest.json").read_text())
    docs = {}
    totals = dict.fromkeys(("rows", "docs", "tokens", "skipped_null", "skipped_empty"), 0)
    for part in manifest["partitions"]:
        raw = (out / part["tokens_file"]).read_bytes()
        assert hashlib.sha256(raw).hexdigest() == part["sha256"]
        tokens = np.load(out / part["tokens_file"])
        assert tokens.dtype == np.dtype(manifest["encoding"]["dtype"]) and tokens.ndim == 1
        assert tokens.dtype.byteorder in ("<", "=", "|")
        table = pq.read_table(out / part["docs_file"]).to_pydict()
        assert list(table) == ["id", "row", "start", "length"]
        position = 0
        for doc_id, row, start, length in zip(table["id"], table["row"], table["start"], table["length"]):
            assert start == position
            position += length
            docs[(part["input"], row)] = (doc_id, tokens[start:start + length].tolist())
        assert position == len(tokens) == part["tokens"]
        # skipped_invalid: rows whose text was not UTF-8, present only when --on-bad-file skip skipped some
        assert part["rows"] == part["docs"] + part["skipped_null"] + part["skipped_empty"] + part.get("skipped_invalid", 0)
        assert part["docs"] == len(table["id"])
        for key in totals:
            totals[key] += part[key]
    if "skipped_invalid" in manifest["totals"]:
        totals["skipped_invalid"] = sum(part.get("skipped_invalid", 0) for part in manifest["partitions"])
    assert manifest["totals"] == totals
    return docs
