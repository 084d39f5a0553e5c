"""Precision as a choice: lossy toolchains (fast math, bf16) placed per partition under an error budget."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage import MockCostEstimator, partition, resolve
from tvm_tcutils.collage.candidates import Candidate, enumerate_candidates
from tvm_tcutils.collage.precision import ErrorCheck, fit_budget, relative_error
from tvm_tcutils.collage.report import partition_table, precision_lines, report_lines
from tvm_tcutils.collage.search import search_valid
from tvm_tcutils.collage.subgraph import IndexedGraph
from tvm_tcutils.collage.toolchains import known

from conftest import build_and_run, op_names as _op_names


def two_branches(rows: int = 8, width: int = 64):
    """Two independent fast-math places, two outputs: dense -> softmax, and dense -> exp(-x)."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(rows, width))
    w1 = relay.const((rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32"))
    w2 = relay.const((rng.standard_normal((width, width)) / np.sqrt(width)).astype("float32"))
    soft = relay.nn.softmax(relay.nn.dense(x, w1), axis=-1)
    decay = relay.exp(relay.negative(relay.nn.dense(x, w2)))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.Tuple([soft, decay]))))


#: Fast math saves 2 ms on the softmax and 0.5 ms on exp (mock costs per operator).
COSTS = {"tvm": {"nn.softmax": 3.0, "exp": 2.0, "*": 1.0}, "tvm-fastmath": {"nn.softmax": 1.0, "exp": 1.5, "*": 1.0}}
FAST = {"nn.fast_softmax", "fast_exp"}


def _run(mod, budget=None, **kwargs):
    return partition(mod, None, "tvm,tvm-fastmath", MockCostEstimator(COSTS), validate_rounds=0, progress=False,
                     error_budget=budget, **kwargs)


def test_fast_math_candidates_only_where_they_change_something():
    graph = IndexedGraph(two_branches()["main"])
    both = enumerate_candidates(graph, resolve("tvm,tvm-fastmath"))
    plain = enumerate_candidates(graph, resolve("tvm"))
    assert [c for c in both if c.toolchain == "tvm"] == plain
    fast = [c for c in both if c.toolchain == "tvm-fastmath"]
    assert fast and all(not c.host for c in fast)
    assert all({"nn.softmax", "exp"} & set(graph.op_names(c.mask)) for c in fast)


def test_fast_math_per_partition_without_budget():
    mod = two_branches()
    result = _run(mod)
    names = set(_op_names(result.mod["main"]))
    assert FAST <= names and not {"nn.softmax", "exp"} & names
    assert {p.precision for p in result.partitions if p.toolchain == "tvm-fastmath"} == {"f32 fast math"}
    assert result.errors == {} and result.error_budget is None
    data = {"x": np.random.default_rng(3).standard_normal((8, 64)).astype("float32")}
    for got, want in zip(build_and_run(result.mod, inputs=data), build_and_run(mod, inputs=data)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert tvm.ir.structural_equal(mod, two_branches())  # the input is not mutated


def test_only_the_chosen_partition_is_fast():
    mod = two_branches()
    costs = {"tvm": COSTS["tvm"], "tvm-fastmath": {"nn.softmax": 1.0, "exp": 5.0, "*": 1.0}}
    result = partition(mod, None, "tvm,tvm-fastmath", MockCostEstimator(costs), validate_rounds=0, progress=False)
    names = _op_names(result.mod["main"])
    assert "nn.fast_softmax" in names and "exp" in names and "fast_exp" not in names


def test_zero_budget_gives_up_cheapest_loss_first_until_exact():
    mod = two_branches()
    result = _run(mod, budget=0.0)
    names = set(_op_names(result.mod["main"]))
    assert not FAST & names, names
    assert result.errors["collage"] == 0.0  # the exact mix builds as the model does
    steps = result.budget_steps
    assert [s.lossy_partitions for s in steps] == [2, 1, 0]
    assert steps[0].error > 0 and steps[1].error > 0
    # Giving up exp loses 0.5 ms, the softmax 2 ms: exp goes first.
    assert "exp" in steps[1].given_up[0] and "softmax" in steps[2].given_up[1]
    assert steps[0].estimated_ms < steps[1].estimated_ms < steps[2].estimated_ms
    assert {p.precision for p in result.partitions} == {"f32"}


def test_loose_budget_keeps_fast_math_and_says_its_error():
    result = _run(two_branches(), budget=1e-3)
    assert FAST <= set(_op_names(result.mod["main"]))
    assert len(result.budget_steps) == 1 and 0 < result.errors["collage"] <= 1e-3
    lines = precision_lines(result)
    assert lines[0].startswith("error budget 0.001") and "2 lossy partition(s)" in lines[1]
    assert "runs in" in partition_table(result)[0]
    assert any("f32 fast math" in line for line in report_lines(result))


def test_sample_inputs_are_used_and_checked_before_the_search():
    estimator = MockCostEstimator(COSTS)
    with pytest.raises(ValueError, match=r"sample_inputs: \['y'\] are not parameters of main"):
        partition(two_branches(), None, "tvm,tvm-fastmath", estimator, error_budget=0.1,
                  sample_inputs={"y": np.zeros((8, 64), "float32")})
    with pytest.raises(ValueError, match=r"sample_inputs: 'x' has shape \(2, 64\)"):
        partition(two_branches(), None, "tvm,tvm-fastmath", estimator, error_budget=0.1,
                  sample_inputs={"x": np.zeros((2, 64), "float32")})
    with pytest.raises(ValueError, match="error_budget must be a number >= 0"):
        partition(two_branches(), None, "tvm,tvm-fastmath", estimator, error_budget=-1)
    with pytest.raises(TypeError, match="error_budget must be a number"):
        partition(two_branches(), None, "tvm,tvm-fastmath", estimator, error_budget="1%")
    with pytest.raises(TypeError, match="sample_inputs must be a dict"):
        partition(two_branches(), None, "tvm,tvm-fastmath", estimator, error_budget=0.1, sample_inputs=[1])
    assert estimator.calls == 0
    # All-zero inputs: softmax of zeros is exact in fast math too, exp(-0) = 1: no error at all.
    result = _run(two_branches(), budget=0.0, sample_inputs={"x": np.zeros((8, 64), "float32")})
    assert result.errors["collage"] == 0.0 and len(result.budget_steps) == 1


def test_error_check_and_relative_error():
    exact = two_branches()
    check = ErrorCheck(exact, {"x": np.ones((8, 64), "float32")})
    assert check(exact) == 0.0
    fast = relay.transform.FastMath()(exact)
    assert 0 < check(fast) < 1e-5 and check.builds == 2
    assert relative_error([np.array([1.0, 0.0])], [np.array([0.0, 0.0])]) == 1.0
    with pytest.raises(ValueError, match="2 outputs against 1"):
        relative_error([np.zeros(1), np.zeros(1)], [np.zeros(1)])


@pytest.mark.parametrize("errors, kept", [
    ({"a": 0.001, "b": 0.5}, {"a"}),   # giving up b (the cheaper loss) is enough
    ({"a": 0.5, "b": 0.001}, set()),   # b first, not enough; then a: exact
])
def test_fit_budget_order(errors, kept):
    x = relay.var("x", shape=(4,))
    graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
        relay.Function([x], relay.add(relay.exp(x), relay.tanh(x)))))["main"])
    tcs = {tc.name: tc for tc in resolve("tvm,tvm-fastmath")}
    exp, tanh, add = 0b10, 0b100, 0b1000
    cands = [Candidate("tvm", exp, "exp"), Candidate("tvm-fastmath", exp, "a"),
             Candidate("tvm", tanh, "tanh"), Candidate("tvm-fastmath", tanh, "b"), Candidate("tvm", add, "add")]
    costs = [3.0, 1.0, 2.0, 1.5, 0.1]  # fast exp saves 2, fast tanh 0.5

    def error_of(result):
        return sum(errors[c.label] for c in result.chosen if c.toolchain == "tvm-fastmath")

    first = search_valid(graph, cands, costs, tcs)
    answer, error, steps = fit_budget(graph, cands, costs, tcs, first, 0.01, error_of)
    assert {c.label for c in answer.chosen if c.toolchain == "tvm-fastmath"} == kept
    assert error <= 0.01 and steps[0].lossy_partitions == 2 and "tanh" in steps[1].given_up[0]


def test_deadline_gives_up_every_lossy_partition_unchecked():
    graph = IndexedGraph(two_branches()["main"])
    tcs = {tc.name: tc for tc in resolve("tvm,tvm-fastmath")}
    cands = enumerate_candidates(graph, list(tcs.values()))
    est = MockCostEstimator(COSTS)
    costs = [0.0 if c.host else est.cost_of(c.toolchain, graph.op_names(c.mask)) for c in cands]
    first = search_valid(graph, cands, costs, tcs)
    assert any(c.toolchain == "tvm-fastmath" for c in first.chosen)
    calls = []
    answer, error, steps = fit_budget(graph, cands, costs, tcs, first, 0.0, calls.append, deadline=0.0)
    assert not calls and math.isnan(error) and not any(c.toolchain == "tvm-fastmath" for c in answer.chosen)


class _FakeTimer:
    """Whole models 'timed' by what they hold: fast-math operators make a module faster."""

    def __init__(self):
        self.noise = itertools.cycle([0.0, 0.01, -0.01])

    def _ms(self, mod) -> float:
        names = _op_names(mod["main"])
        return 10.0 - 3.0 * sum(1 for n in names if n in FAST)

    def time(self, mod):
        return self._ms(mod)

    def time_side_by_side(self, mods, rounds=5):
        return [self._ms(m) for m in mods]

    def sampler(self, mod):
        ms = self._ms(mod)
        return lambda: ms + next(self.noise)


class _TimedMock(MockCostEstimator):
    def whole_model_timer(self):
        return _FakeTimer()


def test_lossy_toolchain_alone_over_budget_does_not_compete():
    result = partition(two_branches(), None, "tvm,tvm-fastmath", _TimedMock(COSTS), progress=False,
                       error_budget=0.0, compare_budget_s=5)
    assert result.errors["tvm-fastmath alone"] > 0
    assert "tvm-fastmath alone" not in result.final.timings and "tvm alone" in result.final.timings
    assert result.answer == "tvm alone" or not FAST & set(_op_names(result.mod["main"]))
    assert any("tvm-fastmath alone: error" in line and "left out" in line for line in precision_lines(result))
    loose = partition(two_branches(), None, "tvm,tvm-fastmath", _TimedMock(COSTS), progress=False,
                      error_budget=1e-3, compare_budget_s=5)
    assert "tvm-fastmath alone" in loose.final.timings
    assert FAST <= set(_op_names(loose.mod["main"]))


def test_a_mix_in_tvm_alone_is_validated_only_under_an_error_budget():
    # Fast math on the softmax only: the mix has no partition outside TVM. Without a budget the final
    # comparison times it anyway and validation builds nothing; under one, validation's learned crossing
    # cost steers the budget's re-searches, so it runs as before.
    costs = {"tvm": COSTS["tvm"], "tvm-fastmath": {"nn.softmax": 1.0, "exp": 5.0, "*": 1.0}}
    free = partition(two_branches(), None, "tvm,tvm-fastmath", _TimedMock(costs), progress=False, compare_budget_s=5)
    budgeted = partition(two_branches(), None, "tvm,tvm-fastmath", _TimedMock(costs), progress=False,
                         error_budget=1e-3, compare_budget_s=5)
    assert free.trials == [] and free.final is not None
    assert budgeted.trials and budgeted.trials[0][0] == "collage"


def test_openvino_bf16_per_partition_under_budget():
    ov = known().get("openvino-bf16")
    ok, reason = ov.availability() if ov is not None else (False, "unknown")
    if not ok or not ov.buildable():
        pytest.skip(f"openvino-bf16 not usable here: {reason}")
    mod = two_branches(rows=16, width=128)
    costs = {"tvm": 1.0, "openvino-bf16": {"nn.dense": 0.1, "*": 5.0}}
    free = partition(mod, None, "tvm,openvino-bf16", MockCostEstimator(costs), validate_rounds=0, progress=False)
    assert any(p.toolchain == "openvino-bf16" and p.precision == "bf16" for p in free.partitions)
    strict = partition(mod, None, "tvm,openvino-bf16", MockCostEstimator(costs), validate_rounds=0,
                       progress=False, error_budget=1e-6)
    assert not any(p.toolchain == "openvino-bf16" for p in strict.partitions)
    assert strict.budget_steps[0].error > 1e-6 and strict.errors["collage"] <= 1e-6
