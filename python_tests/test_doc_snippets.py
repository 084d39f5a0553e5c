"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs alone (its own imports, its own model) in a process of its own
(forked from the tests' fork server, which has TVM and the package imported: a
block must still import what it uses, its globals start empty) whose working
directory is an empty temporary folder, so files a snippet
writes land there and nothing leaks from one block into the next. A test is
named by file and block index (``README.md-1``: the README's second python
block), and a failure shows the block's first line in the file and the
interpreter's error.

Blocks that are not Python to run (shell commands, printed output, layouts)
must be fenced as something else (plain ```, ```sh, ```text).
"""
from __future__ import annotations

import glob
import os
import re
from typing import List, NamedTuple

import pytest

from conftest import ROOT, run_python

#: Files whose python blocks are checked, relative to the checkout.
DOC_FILES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]

#: A fenced block: the fence's info string, then everything up to the closing fence.
_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.S | re.M)

#: Seconds one snippet may take (a fresh interpreter, a small model, a build).
SNIPPET_TIMEOUT = 240


class Snippet(NamedTuple):
    path: str
    index: int
    line: int
    code: str


def python_blocks(path: str) -> List[Snippet]:
    """The ```python blocks of ``path`` (relative to the checkout), in order."""
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        text = handle.read()
    blocks = [m for m in _FENCE.finditer(text) if m.group(1).strip().lower() in ("python", "py")]
    return [
        Snippet(path, index, text.count("\n", 0, match.start()) + 1, match.group(2))
        for index, match in enumerate(blocks)
    ]


SNIPPETS = [snippet for path in DOC_FILES for snippet in python_blocks(path)]


@pytest.fixture(scope="module")
def collage_cache(tmp_path_factory) -> str:
    """One Collage cost cache for all snippets, empty at first: the README's search measures the
    MLP's candidates, and the docs' search of the same model finds them cached, as it would for a user."""
    return str(tmp_path_factory.mktemp("collage_cache"))


def test_the_docs_have_python_snippets():
    # Guards the extraction itself: a changed fence style would otherwise check nothing.
    assert {s.path for s in SNIPPETS} >= {"README.md", "docs/passes.md", "docs/collage-search.md"}


@pytest.mark.timeout(SNIPPET_TIMEOUT + 30)
@pytest.mark.parametrize("snippet", SNIPPETS, ids=[f"{s.path}-{s.index}" for s in SNIPPETS])
def test_snippet_runs(snippet: Snippet, tmp_path, collage_cache):
    # exec with the file's name and line, so a traceback points into the Markdown file.
    program = (
        "import os, sys\n"
        f"source = {snippet.code!r}\n"
        f"code = compile('\\n' * {snippet.line} + source, {os.path.join(ROOT, snippet.path)!r}, 'exec')\n"
        "exec(code, {'__name__': '__main__'})\n"
    )
    env = {"TVM_TCUTILS_CACHE": collage_cache}
    result = run_python(program, env=env, timeout=SNIPPET_TIMEOUT, cwd=str(tmp_path), fresh=False)
    assert result.returncode == 0, (
        f"{snippet.path}, python block {snippet.index} (line {snippet.line}) failed:\n{result.stderr[-3000:]}"
    )
