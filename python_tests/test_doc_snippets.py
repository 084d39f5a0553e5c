"""Every ```python block of README.md and docs/*.md runs as written.

Each block runs alone (its own imports, its own model) in a process of its own
(forked from the tests' fork server, which has TVM and the package imported: a
block must still import what it uses, its globals start empty) whose working
directory is an empty temporary folder, so files a snippet
writes land there and nothing leaks from one block into the next. A test is
named by file and block index (``README.md-1``: the README's second python
block), and a failure shows the block's first line in the file and the
interpreter's error.

A few blocks build a big model (ResNet-18 for CUDA, BERT-tiny through onnxruntime): they run
whole under ``-m slow`` (:data:`SLOW_SNIPPETS` names the default test that runs the same calls
on a small model); by default their code is compiled and their imports run.

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

#: Blocks that build a big model, run whole only under ``-m slow``; each with the default test that
#: runs the same API calls on a small model (by default such a block is compiled and its imports run).
SLOW_SNIPPETS = {
    # ResNet-18 prepared for int4 tensor cores, its implementations listed, its AutoTVM tasks extracted
    # (a full CUDA lowering, 25 s): tensorcore/test_strategy.py (test_autotvm_extracts_one_task_per_distinct_
    # hwnc_layer: prepare + extract_from_program on ResNet-18; test_implementations_reports_per_layer_after_
    # legalization_without_mutating: implementations(mod, target, ops=("nn.conv2d",))).
    "docs/tensorcore.md-0": "tensorcore/test_strategy.py",
    # ResNet-18 under pad_limit, prepared and built for CUDA (22 s): tensorcore/test_sass.py
    # (test_prepared_model_builds_saves_and_loads[resnet-10-int8]: prepare_for_tensorcore + relay.build for
    # cuda) and tensorcore/test_strategy.py (pad_limit with prepare_for_tensorcore).
    "docs/integrate-tc.md-0": "tensorcore/test_sass.py",
    # BERT-tiny greedily partitioned to onnxruntime, built, exported (25 s): collage/test_ort_toolchain.py
    # (partition_for, relay.build, export_library and load, available()) and collage/test_relay_to_onnx.py.
    "docs/collage-toolchains.md-0": "collage/test_ort_toolchain.py",
    # The MLP searched with tvm,ort,blas and validation, saved, loaded and built (15 s on a slow VM): the
    # README's block right before it (README.md-2) makes the same partition / save_model / load_model /
    # build_partitioned calls on the same model (without validation: collage/test_collage_driver.py and
    # test_collage_final.py validate), and the estimators' constructors run in their own tests.
    "docs/collage-search.md-0": "README.md-2",
}


def _snippet_id(snippet: Snippet) -> str:
    return f"{snippet.path}-{snippet.index}"


def _params(snippets):
    return [pytest.param(s, id=_snippet_id(s), marks=[pytest.mark.slow] if _snippet_id(s) in SLOW_SNIPPETS else [])
            for s in snippets]


@pytest.fixture(scope="module")
def collage_cache(tmp_path_factory) -> str:
    """One Collage cost cache for all snippets, empty at first: the README's search measures the
    MLP's candidates, and the docs' search of the same model finds them cached, as it would for a user."""
    return str(tmp_path_factory.mktemp("collage_cache"))


def test_the_docs_have_python_snippets():
    # Guards the extraction itself: a changed fence style would otherwise check nothing.
    assert {s.path for s in SNIPPETS} >= {"README.md", "docs/passes.md", "docs/collage-search.md"}


@pytest.mark.timeout(SNIPPET_TIMEOUT + 30)
@pytest.mark.parametrize("snippet", _params(SNIPPETS))
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


def test_slow_snippets_exist():
    # A renamed or renumbered block must not leave a stale entry (and its block unchecked by default).
    assert set(SLOW_SNIPPETS) <= {_snippet_id(s) for s in SNIPPETS}


@pytest.mark.parametrize("snippet", [s for s in SNIPPETS if _snippet_id(s) in SLOW_SNIPPETS], ids=_snippet_id)
def test_slow_snippet_compiles_and_its_imports_run(snippet: Snippet, tmp_path):
    # The default run's check of a block that runs whole only under -m slow: it is valid Python and
    # every name it imports exists (its import statements run, in order, in a process of its own).
    import ast

    tree = ast.parse(snippet.code, filename=snippet.path)
    compile(tree, snippet.path, "exec")
    imports = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert imports, f"{snippet.path}, python block {snippet.index}: no import to check"
    program = "\n".join(ast.unparse(node) for node in imports)
    result = run_python(program, timeout=60, cwd=str(tmp_path), fresh=False)
    assert result.returncode == 0, (
        f"{snippet.path}, python block {snippet.index} (line {snippet.line}): imports failed:\n{result.stderr[-3000:]}"
    )
