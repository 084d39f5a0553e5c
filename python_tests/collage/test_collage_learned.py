"""The learned estimator: close to the fully measured answer with a fraction of the measurements."""
from __future__ import annotations

import math

import pytest

from tvm_tcutils.collage import partition
from tvm_tcutils.collage.cost.learned import XGBoostCostEstimator, node_flops
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator
from tvm_tcutils.collage.cost.mock import MockCostEstimator

from tvm_tcutils.bench.collage import mock_toolchains, synthetic_costs
from tvm_tcutils.bench.models import encoder


class SyntheticMeasured(MeasuredCostEstimator):
    """A MeasuredCostEstimator whose 'measurement' is a deterministic formula (no worker processes)."""

    def __init__(self, truth: MockCostEstimator):
        super().__init__(cache_dir="", progress=False)
        self.truth = truth
        self.measured_keys = set()
        self.requests = []
        self.batches = []
        self.batch_requests = []

    def lookup(self, request):
        self.requests.append(request)
        return super().lookup(request)

    def _measure(self, requests):
        self.batches.append(len(requests))
        self.batch_requests.append(list(requests))
        for req, cost in zip(requests, self.truth.estimate(requests)):
            self.measured_keys.add(req.key)
            self._memory[req.key] = {"ms": cost}


def test_learned_is_close_with_fewer_measurements():
    mod = encoder(2, hidden=64, heads=2, seq=16)
    toolchains = mock_toolchains()
    truth = synthetic_costs()
    full = partition(mod, None, toolchains, truth)
    fake = SyntheticMeasured(truth)
    learned_est = XGBoostCostEstimator(fake, sample=0.05, min_sample=8)
    learned = partition(mod, None, toolchains, learned_est, validate_rounds=0)
    # Every chosen candidate was measured: its estimate is the truth.
    assert learned.estimated_ms == pytest.approx(sum(p.estimated_ms for p in learned.partitions))
    assert learned.estimated_ms <= full.estimated_ms * 1.05
    assert learned.estimated_ms >= full.estimated_ms - 1e-9
    assert learned_est.stats["predicted"] > 0
    distinct = len({r.key for r in fake.requests})
    assert len(fake.measured_keys) < 0.3 * distinct


@pytest.mark.parametrize("sample,max_sample", [(0.5, 256), (0.5, 5), (1.0, 1000)])
def test_initial_sample_is_capped(sample, max_sample):
    # The up-front sample is a fraction of the distinct candidates, but never more than max_sample.
    fake = SyntheticMeasured(synthetic_costs())
    est = XGBoostCostEstimator(fake, sample=sample, min_sample=2, max_sample=max_sample)
    partition(encoder(1, hidden=32, heads=2, seq=8), None, mock_toolchains(), est, validate_rounds=0)
    distinct = len({r.key for r in fake.requests})
    assert fake.batches[0] == min(distinct, max_sample, max(2, math.ceil(sample * distinct)))
    assert (fake.batches[0] == max_sample) == (max_sample == 5)


def test_sample_bounds_are_checked():
    with pytest.raises(ValueError, match="min_sample <= max_sample"):
        XGBoostCostEstimator(SyntheticMeasured(MockCostEstimator({"tvm": 1.0})), min_sample=9, max_sample=8)


def test_flops_and_arguments():
    from tvm import relay
    import tvm

    x = relay.var("x", shape=(2, 3, 8, 8))
    w = relay.var("w", shape=(4, 3, 3, 3))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(
        relay.Function([x, w], relay.nn.conv2d(x, w, padding=(1, 1)))))
    from tvm_tcutils.collage.subgraph import IndexedGraph

    graph = IndexedGraph(mod["main"])
    assert node_flops(graph, 2) == 2.0 * (2 * 4 * 8 * 8) * (3 * 3 * 3)
    with pytest.raises(TypeError, match="measured must be a MeasuredCostEstimator"):
        XGBoostCostEstimator(MockCostEstimator({"tvm": 1.0}))
    with pytest.raises(ValueError, match="sample must be in"):
        XGBoostCostEstimator(SyntheticMeasured(MockCostEstimator({"tvm": 1.0})), sample=0)


def _searched(tolerance, patience, max_rounds=30):
    """Run the learned estimator's search loop on a small encoder; return (estimator, fake, answer)."""
    from tvm_tcutils.collage.candidates import enumerate_candidates
    from tvm_tcutils.collage.driver import prepare
    from tvm_tcutils.collage.subgraph import IndexedGraph
    from tvm_tcutils.collage.toolchains import resolve

    toolchains = resolve(mock_toolchains())
    graph = IndexedGraph(prepare(encoder(2, hidden=64, heads=2, seq=16))["main"])
    cands = enumerate_candidates(graph, toolchains)
    fake = SyntheticMeasured(synthetic_costs())
    est = XGBoostCostEstimator(fake, sample=0.05, min_sample=8, tolerance=tolerance, patience=patience,
                               max_rounds=max_rounds)
    by_name = {tc.name: tc for tc in toolchains}
    answer, costs = est.search(graph, cands, by_name)

    def measured(cand):
        """The measured cost of ``cand``, None when it was never measured."""
        from tvm_tcutils.collage.cost.base import CostRequest

        entry = fake._memory.get(CostRequest(graph, cand, by_name[cand.toolchain]).key)
        return None if entry is None else entry["ms"]

    fake.lookup_cost = measured
    return est, fake, answer, costs


@pytest.mark.parametrize("tolerance,patience,max_rounds,stop", [
    (0.0, 30, 30, "measured"), (0.0, 1, 30, "patience"), (0.5, 30, 30, "tolerance"), (0.0, 30, 2, "max_rounds"),
])
def test_search_returns_a_fully_measured_answer(tolerance, patience, max_rounds, stop):
    # Whatever ends the rounds, the answer is priced entirely by measurements (the truth here).
    est, fake, answer, costs = _searched(tolerance, patience, max_rounds)
    chosen = [c for c in answer.chosen if not c.host]
    assert all(fake.lookup_cost(c) is not None for c in chosen)
    assert answer.cost == pytest.approx(sum(x for c, x in zip(answer.chosen, answer.costs) if not c.host))
    assert [x for c, x in zip(answer.chosen, answer.costs) if not c.host] == pytest.approx(
        [fake.lookup_cost(c) for c in chosen])
    assert est.stats["stop"] == stop
    assert est.stats["rounds"] <= max_rounds
    if est.stats["stop"] == "patience":
        assert est.stats["rounds"] >= patience + 1


def test_looser_tolerance_measures_no_more():
    strict, strict_fake, strict_answer, _ = _searched(0.0, 30)
    loose, loose_fake, loose_answer, _ = _searched(0.5, 30)
    assert len(loose_fake.measured_keys) <= len(strict_fake.measured_keys)
    assert loose.stats["rounds"] <= strict.stats["rounds"]
    # Stopping early can only cost answer quality, never make the reported cost a prediction.
    assert loose_answer.cost >= strict_answer.cost - 1e-9


def test_round_bounds_are_checked():
    fake = SyntheticMeasured(MockCostEstimator({"tvm": 1.0}))
    with pytest.raises(ValueError, match="tolerance must be in"):
        XGBoostCostEstimator(fake, tolerance=1.0)
    with pytest.raises(ValueError, match="patience must be >= 1"):
        XGBoostCostEstimator(fake, patience=0)


def test_initial_sample_prices_every_op_kind_of_every_toolchain():
    # A random draw can miss an op kind of a toolchain (then never tried); the first batch covers each.
    fake = SyntheticMeasured(synthetic_costs())
    est = XGBoostCostEstimator(fake, sample=0.01, min_sample=1, max_sample=256)
    partition(encoder(1, hidden=32, heads=2, seq=8), None, mock_toolchains(), est, validate_rounds=0)
    kinds = {(r.toolchain.name, op) for r in fake.requests for op in r.ops}
    first = fake.batch_requests[0]
    assert kinds == {(r.toolchain.name, op) for r in first for op in r.ops}
    # ... with small candidates (the smallest per kind), so not the largest ones.
    assert max(len(r.ops) for r in first) < max(len(r.ops) for r in fake.requests)
