"""Crossings between TVM and another toolchain priced by TVM's measured boundary layout transforms."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage import partition
from tvm_tcutils.collage.candidates import Candidate
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator
from tvm_tcutils.collage.cost.mock import MockCostEstimator
from tvm_tcutils.collage.cost.staged import StagedCostEstimator
from tvm_tcutils.collage.cost.workers import time_candidate
from tvm_tcutils.collage.report import report_lines
from tvm_tcutils.collage.search import crossing_costs, crossing_kb
from tvm_tcutils.collage.subgraph import IndexedGraph

from tvm_tcutils.bench.collage import mock_toolchains

SHAPE = (1, 8, 16, 16)  # 8 KB of float32
KB = 8.0


def _typed(body, *params) -> tvm.IRModule:
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(list(params), body)))


def _conv(x, seed: int):
    weight = relay.const(np.random.default_rng(seed).standard_normal((8, 8, 3, 3)).astype("float32"))
    return relay.nn.conv2d(x, weight, padding=(1, 1), channels=8, kernel_size=(3, 3))


def conv_add_conv() -> tvm.IRModule:
    """conv -> add (which the onnxruntime-like toolchain takes) -> conv: two 4-D tensors cross if add leaves."""
    x = relay.var("x", shape=SHAPE)
    y = _conv(x, 0)
    return _typed(_conv(relay.add(y, y), 1), x)


def _index(graph: IndexedGraph, op: str) -> int:
    return next(n.index for n in graph.nodes if n.kind == "call" and n.op_name == op)


def test_crossing_kb_counts_four_axis_tensors_between_operators_only():
    x = relay.var("x", shape=SHAPE)
    flat = relay.var("f", shape=(1, 2048))
    body = relay.Tuple([relay.nn.relu(relay.exp(x)), relay.sigmoid(flat)])
    graph = IndexedGraph(_typed(body, x, flat)["main"])
    exp, relu, sigmoid = (_index(graph, op) for op in ("exp", "nn.relu", "sigmoid"))
    # exp reads the model's input (no transform) and gives relu a 4-D tensor.
    assert crossing_kb(graph, 1 << exp) == KB
    # relu reads exp's result; its own goes only to the model's output tuple.
    assert crossing_kb(graph, 1 << relu) == KB
    assert crossing_kb(graph, (1 << exp) | (1 << relu)) == 0.0
    # A 2-D tensor keeps its layout in TVM: nothing to transform.
    assert crossing_kb(graph, 1 << sigmoid) == 0.0


def test_crossing_costs_are_the_price_times_the_tensors_and_zero_for_tvm():
    mod = conv_add_conv()
    graph = IndexedGraph(mod["main"])
    add = 1 << _index(graph, "add")
    by_name = {tc.name: tc for tc in mock_toolchains()}
    cands = [Candidate("tvm", add, "add"), Candidate("ortlike", add, "add")]
    assert crossing_costs(graph, cands, by_name, 0.01) == [0.0, pytest.approx(0.01 * 2 * KB)]
    assert crossing_costs(graph, cands, by_name, 0.0) == [0.0, 0.0]


def test_a_tvm_candidate_timed_without_its_boundary_transforms_reports_their_time_and_size():
    x = relay.var("x", shape=SHAPE)
    text = tvm.ir.save_json(_typed(_conv(x, 0), x))
    answer = time_candidate(text, "llvm", repeat=2, warmup=1, min_repeat_ms=1, boundary_layout=False)
    # NCHW -> NCHW8c at the input and back at the output: 8 KB each.
    assert answer["boundary_kb"] == pytest.approx(2 * KB)
    assert 0 < answer["boundary_ms"] < answer["ms"] + answer["boundary_ms"]
    whole = time_candidate(text, "llvm", repeat=2, warmup=1, min_repeat_ms=1, boundary_layout=True)
    assert "boundary_kb" not in whole


class PricedMeasured(MeasuredCostEstimator):
    """Measures with a formula (no workers); TVM's candidates report boundary transforms at ``ms_per_kb``."""

    def __init__(self, truth: MockCostEstimator, ms_per_kb: float):
        super().__init__(cache_dir="", progress=False, workers=1)
        self.truth, self.ms_per_kb = truth, ms_per_kb

    def _measure(self, requests):
        for req, cost in zip(requests, self.truth.estimate(requests)):
            entry = {"ms": cost}
            if req.toolchain.is_tvm and "nn.conv2d" in req.ops:
                # What a worker's answer carries (time_candidate), recorded as the measuring path does.
                entry.update(boundary_ms=self.ms_per_kb * 2 * KB, boundary_kb=2 * KB)
                self._note_boundary(req.key, entry)
            self._memory[req.key] = entry


# add on the onnxruntime-like toolchain saves 0.01 ms; its two 8 KB crossings cost 0.02 ms at 1.25 us/KB.
TRUTH = MockCostEstimator({"tvm": {"nn.conv2d": 1.0, "add": 0.04, "*": 0.04}, "ortlike": {"add": 0.03, "*": 1.0}})


@pytest.mark.parametrize("staged", [False, True], ids=["measured", "staged"])
@pytest.mark.parametrize("ms_per_kb,leaves_tvm", [(0.0, True), (1.25e-3, False)], ids=["unpriced", "priced"])
def test_a_crossing_dearer_than_what_the_other_toolchain_saves_keeps_the_operator_in_tvm(staged, ms_per_kb,
                                                                                        leaves_tvm):
    measured = PricedMeasured(TRUTH, ms_per_kb)
    estimator = StagedCostEstimator(measured) if staged else measured
    try:
        result = partition(conv_add_conv(), None, mock_toolchains()[:2], estimator, validate_rounds=0,
                           progress=False)
    finally:
        estimator.close()
    outside = [p for p in result.partitions if p.toolchain == "ortlike"]
    assert bool(outside) == leaves_tvm
    assert result.crossing_ms_per_kb == pytest.approx(ms_per_kb)
    priced = [line for line in report_lines(result) if line.startswith("crossings priced")]
    assert bool(priced) == (ms_per_kb > 0)
    if leaves_tvm:
        # The partition outside TVM is estimated with its crossing (none here: unpriced).
        assert outside[0].estimated_ms == pytest.approx(0.03)


def test_the_price_comes_back_from_the_cache_with_the_costs(tmp_path):
    x = relay.var("x", shape=SHAPE)
    mod = _typed(_conv(x, 0), x)
    first = MeasuredCostEstimator(cache_dir=str(tmp_path), workers=1, repeat=2, warmup=1, progress=False)
    try:
        partition(mod, None, ["tvm"], first, validate_rounds=0, progress=False)
        price = first.crossing_ms_per_kb()
    finally:
        first.close()
    assert price > 0
    again = MeasuredCostEstimator(cache_dir=str(tmp_path), workers=1, progress=False)
    try:
        result = partition(mod, None, ["tvm"], again, validate_rounds=0, progress=False)
    finally:
        again.close()
    assert again.stats["measured"] == 0
    assert result.crossing_ms_per_kb == pytest.approx(price)
