"""The partition picture: legend swatches, cost labels, left-to-right layout, repeated blocks drawn once."""
from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage import MockCostEstimator, partition
from tvm_tcutils.collage.picture import repeats, to_dot, write_picture
from tvm_tcutils.models import load_model

#: ort runs dense only, cheaper than TVM even with its crossing price: the mix alternates.
COSTS = MockCostEstimator({"tvm": 1.0, "ort": {"nn.dense": 0.3}}, overhead={"ort": 0.5})

GRAPHVIZ = shutil.which("dot")


def dense_chain(blocks: int, width: int = 8):
    """``blocks`` identical blocks relu(dense(x) + b), one after the other."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, width))
    y = x
    for _ in range(blocks):
        w = relay.const(rng.standard_normal((width, width)).astype("float32"))
        b = relay.const(rng.standard_normal(width).astype("float32"))
        y = relay.nn.relu(relay.add(relay.nn.dense(y, w), b))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y))), {}


@pytest.fixture(scope="module")
def mlp_result():
    mod, params = load_model("mlp")
    return partition(mod, params, "tvm,ort", COSTS, progress=False)


@pytest.fixture(scope="module")
def chain_result():
    mod, params = dense_chain(12)
    return partition(mod, params, "tvm,ort", COSTS, progress=False)


def _declared(text: str) -> set:
    return set(re.findall(r"^\s*(\w+) \[", text, flags=re.M))


def _check_structure(text: str) -> None:
    """Balanced braces, and every edge between declared nodes."""
    assert text.startswith("digraph collage {") and text.rstrip().endswith("}")
    assert text.count("{") - text.count("{rank=same") == text.count("}") - text.count("{rank=same")
    declared = _declared(text)
    for a, b in re.findall(r"^\s*(\w+) -> (\w+)", text, flags=re.M):
        assert a in declared and b in declared, (a, b)


def test_legend_costs_and_layout(mlp_result):
    text = to_dot(mlp_result)
    _check_structure(text)
    assert "  rankdir=LR;" in text.splitlines()
    used = sorted({p.toolchain for p in mlp_result.partitions})
    assert used == ["ort", "tvm"]
    legend = text[text.index("subgraph cluster_legend"):].split("  }", 1)[0]
    swatches = re.findall(r"legend_(\w+) \[label=\"([^\"]+)\", fillcolor=\"(#[0-9a-f]{6})\"", legend)
    assert [name for name, _, _ in swatches] == used
    assert len({colour for _, _, colour in swatches}) == len(used)
    words = dict((name, label) for name, label, _ in swatches)
    count = {tc: sum(p.toolchain == tc for p in mlp_result.partitions) for tc in used}
    total = {tc: sum(p.estimated_ms for p in mlp_result.partitions if p.toolchain == tc) for tc in used}
    assert words["ort"].startswith(f"onnxruntime (ort): {count['ort']} partition")
    assert f"{total['tvm']:.3f} ms estimated" in words["tvm"]
    boxes = re.findall(r"<b>(\w+)</b> ([0-9.]+) ms(?: each x(\d+))?", text)
    drawn = sorted(ms for _, ms, n in boxes for _ in range(int(n or 1)))
    assert drawn == sorted(f"{p.estimated_ms:.3f}" for p in mlp_result.partitions)
    assert f"estimated {sum(p.estimated_ms for p in mlp_result.partitions):.3f} ms in total" in text
    assert "measured whole" not in text  # the mock measures nothing


def test_title_has_the_measured_whole(mlp_result):
    text = to_dot(dataclasses.replace(mlp_result, measured_ms=1.2345))
    assert "measured whole 1.234 ms" in text.split("\n  node [", 1)[0]


def test_deterministic(mlp_result):
    assert to_dot(mlp_result) == to_dot(mlp_result)


def test_repeated_blocks_are_drawn_once(chain_result):
    text = to_dot(chain_result)
    _check_structure(text)
    partitions = len(chain_result.partitions)
    boxes = [key for key in _declared(text) if key.startswith("p")]
    assert partitions >= 24 and len(boxes) <= 4, (partitions, boxes)
    blocks = re.findall(r'label="block of (\d+) partitions? x(\d+)', text)
    assert blocks and max(int(n) for _, n in blocks) >= 11
    assert "{rank=same;" not in text  # few boxes: one row, no columns


def test_more_boxes_than_a_column_wrap(mlp_result):
    text = to_dot(mlp_result, column=2)
    _check_structure(text)
    boxes = {key for key in _declared(text) if key.startswith("p")}
    columns = [re.findall(r"\w+", c) for c in re.findall(r"\{rank=same; ([^}]*)\}", text)]
    assert len(boxes) > 2 and all(1 <= len(c) <= 2 for c in columns)
    assert sorted(key for c in columns for key in c) == sorted(boxes)
    with pytest.raises(ValueError, match="column must be"):
        to_dot(mlp_result, column=0)


def test_repeats_cover_the_sequence():
    seq = list("abcabcabcxyzz")
    runs = repeats(seq)
    assert runs == [(0, 3, 3), (9, 1, 1), (10, 1, 1), (11, 1, 2)]
    assert sum(p * n for _, p, n in runs) == len(seq)
    assert repeats([]) == [] and repeats("abc") == [(0, 1, 1), (1, 1, 1), (2, 1, 1)]


@pytest.mark.skipif(GRAPHVIZ is None, reason="Graphviz's dot is not installed")
def test_svg_renders_and_fits_a_screen(chain_result, tmp_path):
    path = write_picture(chain_result, str(tmp_path / "chain.svg"))
    svg = open(path).read()
    width, height = (float(v) for v in re.search(r'<svg width="([0-9.]+)pt" height="([0-9.]+)pt"', svg).groups())
    assert max(width, height) <= 1440 + 1  # 20 inches: 1920 px at 96 dpi
    assert "onnxruntime" in svg and re.search(r"x1[12]\b", svg)
    check = subprocess.run([GRAPHVIZ, "-Tsvg"], input=to_dot(chain_result), text=True, capture_output=True)
    assert check.returncode == 0 and "Warning" not in check.stderr and "Error" not in check.stderr, check.stderr


def test_dot_text_without_graphviz(mlp_result, tmp_path):
    path = write_picture(mlp_result, str(tmp_path / "m.dot"))
    assert open(path).read() == to_dot(mlp_result)
