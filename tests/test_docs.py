"""The documentation site (docs/, mkdocs.yml): it builds with ``--strict`` (a broken link or anchor,
or a page left out of the nav, fails), and its shell examples work.

Every ```sh block in docs/ either runs here, in order, in one scratch folder that holds the
project's ``.venv`` and ``cluster_configs`` (so ``.venv/bin/tokenshards`` works as written), or is
marked just before its fence with ``<!-- not run: WHY -->`` (a cloud, a GPU, a cluster, the Hub, or
a run of its own too slow for this test). A block that is not run is still checked: each
``tokenshards`` line parses with the command's own argument parser, each ``make`` line is a target
``make -n`` accepts, and Python blocks compile. Nothing here reads the prose.
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tokenshards.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
VENV_BIN = Path(sys.executable).parent
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->\s*\n$")
# The pages whose runnable examples build on each other come first (getting started makes the demo
# run that later pages may use); the others follow in name order.
FIRST = ["getting-started.md"]


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    code: str
    not_run: str | None  # why it cannot run here, or None

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def _blocks(path: Path, page: str) -> list[Block]:
    text = path.read_text()
    found = []
    for m in FENCE.finditer(text):
        before = text[:m.start()]
        marker = NOT_RUN.search(before)
        found.append(Block(page=page, line=before.count("\n") + 1, lang=m.group(1), code=m.group(2),
                           not_run=marker.group(1) if marker else None))
    return found


def _pages() -> list[str]:
    names = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    return FIRST + [n for n in names if n not in FIRST]


BLOCKS = [b for page in _pages() for b in _blocks(DOCS / page, page)]
SHELL = [b for b in BLOCKS if b.lang == "sh"]
RUN = [b for b in SHELL if b.not_run is None]
# The README's examples are the docs' own (getting started runs them); here they are only parsed.
README_SHELL = [Block(page=b.page, line=b.line, lang=b.lang, code=b.code, not_run="the README's: the docs run them")
                for b in _blocks(ROOT / "README.md", "README.md") if b.lang == "sh"]


def _commands(code: str) -> list[list[str]]:
    """The block's commands as argument lists: continuation lines joined, comments dropped."""
    joined = code.replace("\\\n", " ")
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


def test_site_builds_strict(tmp_path):
    """`make docs` builds with --strict: broken links, missing anchors and pages outside the nav fail."""
    proc = subprocess.run([str(VENV_BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stderr, proc.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "troubleshooting" / "index.html").is_file()
    # A pipe in a table's code is written \| for GitHub; the site shows it plain (mkdocs_hooks.py).
    escaped = {str(page.relative_to(tmp_path / "site")): found
               for page in (tmp_path / "site").rglob("*.html")
               if (found := [cell for table in re.findall(r"<table>.*?</table>", page.read_text(), re.S)
                             for cell in re.findall(r"<code>[^<]*\\\|[^<]*</code>", table)])}
    assert not escaped, escaped


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_docs_builds_strict_and_serves():
    def recipe(target: str) -> str:
        proc = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.splitlines()[-1]
    assert recipe("docs").endswith(".venv/bin/mkdocs build --strict")
    assert recipe("docs-serve").endswith(".venv/bin/mkdocs serve")


def test_every_shell_example_runs_or_says_why_not():
    assert RUN and len(SHELL) > len(RUN)
    for block in SHELL:
        assert block.not_run is None or len(block.not_run) > 10, f"{block}: say why it cannot run here"
    # A marker belongs to the block right after it: none is left dangling before prose or another language.
    for page in _pages():
        text = (DOCS / page).read_text()
        for m in re.finditer(r"<!--\s*not run:.*?-->\n", text):
            assert text[m.end():].startswith("```sh\n"), f"{page}: a 'not run' marker must sit just before a ```sh fence"


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A scratch folder laid out like the project's root, for the examples' relative paths."""
    folder = tmp_path_factory.mktemp("docs-examples")
    (folder / ".venv").symlink_to(VENV_BIN.parent)
    (folder / "cluster_configs").symlink_to(ROOT / "cluster_configs")
    return folder


@pytest.mark.timeout(240)
@pytest.mark.parametrize("block", RUN, ids=str)
def test_shell_example_runs(block, workdir):
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.code], cwd=workdir, capture_output=True,
                          text=True, timeout=200, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert proc.returncode == 0, f"{block}:\n{block.code}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("block", [b for b in SHELL if b.not_run] + README_SHELL, ids=str)
def test_shell_example_not_run_still_parses(block):
    parser = build_parser()
    for words in _commands(block.code):
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):  # VAR=value before a command
            words = words[1:]
        if not words:
            continue
        if Path(words[0]).name == "tokenshards":
            try:
                parser.parse_args(words[1:])
            except SystemExit as e:
                pytest.fail(f"{block}: `{shlex.join(words)}` does not parse ({e})")
        elif words[0] == "make" and shutil.which("make"):
            proc = subprocess.run(["make", "-n", "--no-print-directory", *words[1:]], cwd=ROOT, capture_output=True,
                                  text=True, timeout=60)
            assert proc.returncode == 0, f"{block}: `{shlex.join(words)}`: {proc.stderr}"


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=str)
def test_python_example_compiles(block):
    compile(block.code, str(block), "exec")


def test_readme_links_point_at_pages_and_headings():
    """The README links into docs/ as plain Markdown files: each file exists, each anchor is a heading of it."""
    from markdown.extensions.toc import slugify

    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text())
    assert links
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), path
        if anchor:
            headings = {slugify(h.strip("# ").strip(), "-") for h in page.read_text().splitlines() if h.startswith("#")}
            assert anchor in headings, f"{path}#{anchor}"
