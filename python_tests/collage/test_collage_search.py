"""The Collage search: optimal against brute force, deterministic, valid partitions."""
from __future__ import annotations

import math
import random

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage.candidates import Candidate
from tvm_tcutils.collage import search as search_module
from tvm_tcutils.collage.search import NoCoverError, is_valid, partition_order, search, search_valid
from tvm_tcutils.collage.subgraph import IndexedGraph, bits, mask_of, popcount


def random_graph(seed: int, ops: int = 7) -> IndexedGraph:
    """A random DAG of unary/binary elementwise ops (some nodes feed several others)."""
    rng = random.Random(seed)
    x = relay.var("x", shape=(4,))
    values = [x]
    for _ in range(ops):
        if len(values) > 1 and rng.random() < 0.5:
            a, b = rng.sample(values, 2)
            values.append(relay.add(a, b))
        else:
            values.append(relay.exp(rng.choice(values[-3:])))
    used = set()
    relay.analysis.post_order_visit(values[-1], lambda e: used.add(e))
    dangling = [v for v in values[1:] if v not in used]
    body = relay.Tuple([values[-1], *dangling]) if dangling else values[-1]
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))
    return IndexedGraph(mod["main"])


def random_candidates(graph: IndexedGraph, seed: int):
    """Every singleton (toolchain a) plus random convex connected sets of up to 3 nodes (a or b)."""
    rng = random.Random(seed)
    covered = list(bits(graph.covered_mask))
    cands, costs = [], []
    for i in covered:
        cands.append(Candidate("a", 1 << i, "single"))
        costs.append(round(rng.uniform(1, 3), 3))
    seen = set()
    for _ in range(40):
        mask = 1 << rng.choice(covered)
        for _ in range(rng.randint(1, 2)):
            near = list(bits(graph.neighbours(mask)))
            if near:
                mask |= 1 << rng.choice(near)
        if mask in seen or not graph.is_convex(mask) or mask & (mask - 1) == 0:
            continue
        seen.add(mask)
        cands.append(Candidate(rng.choice("ab"), mask, "group"))
        costs.append(round(rng.uniform(0.5, 4), 3))
    order = sorted(range(len(cands)), key=lambda k: cands[k].sort_key())
    return [cands[k] for k in order], [costs[k] for k in order]


def brute_force(graph: IndexedGraph, cands, costs) -> float:
    """Minimum cost over every exact cover, enumerated exhaustively."""
    best = [math.inf]
    full = graph.covered_mask

    def covers(covered, chosen_cost, start):
        if chosen_cost >= best[0]:
            return
        if covered == full:
            best[0] = chosen_cost
            return
        lowest = next(i for i in bits(full & ~covered))
        for k, cand in enumerate(cands):
            if (cand.mask >> lowest) & 1 and not cand.mask & covered:
                covers(covered | cand.mask, chosen_cost + costs[k], 0)

    covers(0, 0.0, 0)
    return best[0]


@pytest.fixture(params=["relaxation", "ascent only"])
def bound(request, monkeypatch):
    """Both ways of computing the A* bound: the linear relaxation (scipy) and the fallback without it."""
    if request.param == "ascent only":
        monkeypatch.setattr(search_module, "_relaxation_shares", lambda *args: None)
    return request.param


def _shares(graph: IndexedGraph, cands, costs):
    return search_module._node_shares(len(graph), [list(bits(c.mask)) for c in cands], costs)


@pytest.mark.parametrize("seed", range(12))
def test_search_matches_brute_force(seed, bound):
    graph = random_graph(seed)
    cands, costs = random_candidates(graph, seed)
    result = search(graph, cands, costs)
    assert result.cost == pytest.approx(brute_force(graph, cands, costs), abs=1e-9)
    assert 0 < result.bound <= result.cost
    # The chosen candidates are an exact cover and their costs add up.
    union = 0
    for cand in result.chosen:
        assert not union & cand.mask
        union |= cand.mask
    assert union == graph.covered_mask
    assert sum(result.costs) == pytest.approx(result.cost)


@pytest.mark.parametrize("seed", range(8))
def test_node_shares_bound_every_cover(seed, bound):
    # The heuristic is exact only if no candidate costs less than its nodes' shares; then the
    # shares of all nodes are a lower bound on the cheapest cover.
    graph = random_graph(seed, ops=9)
    cands, costs = random_candidates(graph, seed)
    share = _shares(graph, cands, costs)
    for cand, cost in zip(cands, costs):
        assert sum(share[i] for i in bits(cand.mask)) <= cost
    total = sum(share[i] for i in bits(graph.covered_mask))
    assert 0 < total <= brute_force(graph, cands, costs)
    # Never weaker than every node's cheapest even split of a candidate.
    even = [min(x / popcount(c.mask) for c, x in zip(cands, costs) if c.mask >> i & 1)
            for i in bits(graph.covered_mask)]
    assert total >= sum(even) * (1 - 1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_relaxation_beats_ascent_and_solver_slack_is_repaired(seed, monkeypatch):
    graph = random_graph(seed, ops=9)
    cands, costs = random_candidates(graph, seed)
    relaxed = sum(_shares(graph, cands, costs))
    real = search_module._relaxation_shares
    with monkeypatch.context() as patch:
        patch.setattr(search_module, "_relaxation_shares", lambda *args: None)
        assert sum(_shares(graph, cands, costs)) <= relaxed * (1 + 1e-9)
    # A solver answer that breaks constraints (by far more than a tolerance) is scaled back into
    # a bound, and the search stays exact.
    monkeypatch.setattr(search_module, "_relaxation_shares", lambda *args: None if real(*args) is None
                        else real(*args) * 3.0)
    share = _shares(graph, cands, costs)
    for cand, cost in zip(cands, costs):
        assert sum(share[i] for i in bits(cand.mask)) <= cost
    assert search(graph, cands, costs).cost == pytest.approx(brute_force(graph, cands, costs), abs=1e-9)


@pytest.mark.parametrize("seed", range(6))
def test_groups_dearer_than_their_nodes_alone_never_change_the_answer(seed):
    # The search drops a group whose nodes one by one cost strictly less; groups costing exactly
    # as much stay (ties prefer fewer partitions). Brute force over all candidates decides.
    graph = random_graph(seed, ops=10)
    cands, costs = random_candidates(graph, seed)
    single = {c.mask: x for c, x in zip(cands, costs) if not c.mask & (c.mask - 1)}
    dearer = [sum(single[1 << i] for i in bits(c.mask)) + 0.25 for c in cands]
    equal = [sum(single[1 << i] for i in bits(c.mask)) for c in cands]
    for adjusted in (dearer, equal):
        mixed = [x if not c.mask & (c.mask - 1) else (a if k % 2 else x)
                 for k, (c, x, a) in enumerate(zip(cands, costs, adjusted))]
        result = search(graph, cands, mixed)
        assert result.cost == pytest.approx(brute_force(graph, cands, mixed), abs=1e-9)
    # All groups exactly as dear as their nodes: the answer takes groups (fewer partitions).
    tied = search(graph, cands, [x if not c.mask & (c.mask - 1) else e for c, x, e in zip(cands, costs, equal)])
    assert len(tied.chosen) < popcount(graph.covered_mask) or all(
        not c.mask & (c.mask - 1) for c in cands)


@pytest.mark.parametrize("seed", range(4))
def test_search_is_deterministic_and_order_independent(seed):
    graph = random_graph(seed, ops=9)
    cands, costs = random_candidates(graph, seed)
    first = search(graph, cands, costs)
    again = search(graph, cands, costs)
    assert [c.mask for c in first.chosen] == [c.mask for c in again.chosen]
    shuffled = list(range(len(cands)))
    random.Random(seed).shuffle(shuffled)
    other = search(graph, [cands[k] for k in shuffled], [costs[k] for k in shuffled])
    assert other.cost == pytest.approx(first.cost)


def test_ties_prefer_fewer_partitions():
    x = relay.var("x", shape=(2,))
    graph = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    cands = [Candidate("a", 0b010, "exp"), Candidate("a", 0b100, "relu"), Candidate("b", 0b110, "both")]
    result = search(graph, cands, [1.0, 1.0, 2.0])
    assert [c.label for c in result.chosen] == ["both"]


def _cycle_graph():
    """a1 -> a2, a1 -> b1, b2 -> b1, b2 -> a2: {a1, a2} and {b1, b2} are convex but depend on each other."""
    x = relay.var("x", shape=(2,))
    a1 = relay.exp(x)
    b2 = relay.negative(x)
    a2 = relay.add(a1, b2)
    b1 = relay.subtract(b2, a1)
    graph = IndexedGraph(relay.Function([x], relay.Tuple([a2, b1])))
    idx = {name: graph.index_of(e) for name, e in [("a1", a1), ("a2", a2), ("b1", b1), ("b2", b2)]}
    return graph, idx


def test_cycle_between_partitions_is_detected_and_avoided():
    graph, idx = _cycle_graph()
    a = mask_of([idx["a1"], idx["a2"]])
    b = mask_of([idx["b1"], idx["b2"]])
    assert graph.is_convex(a) and graph.is_convex(b)
    assert partition_order(graph, [a, b]) is None
    cands = [Candidate("t", 1 << i, "single") for i in bits(graph.covered_mask)]
    cands += [Candidate("t", a, "A"), Candidate("t", b, "B")]
    cands.sort(key=Candidate.sort_key)
    costs = [0.5 if c.label in ("A", "B") else 1.0 for c in cands]
    unchecked = search(graph, cands, costs)
    assert {c.label for c in unchecked.chosen} >= {"A", "B"}  # cheapest, but cyclic
    checked = search(graph, cands, costs, check_cycles=True)
    masks = [c.mask for c in checked.chosen if c.mask & (c.mask - 1)]
    assert partition_order(graph, masks) is not None
    assert checked.cost == pytest.approx(0.5 + 3 * 1.0)  # one of A, B plus three singletons


class _Kind:
    def __init__(self, is_tvm):
        self.is_tvm = is_tvm


def test_search_valid_searches_again_only_when_external_partitions_form_a_cycle():
    graph, idx = _cycle_graph()
    a = mask_of([idx["a1"], idx["a2"]])
    b = mask_of([idx["b1"], idx["b2"]])
    cands = [Candidate("tvm", 1 << i, "single") for i in bits(graph.covered_mask)]
    cands += [Candidate("ext", a, "A"), Candidate("ext", b, "B")]
    cands.sort(key=Candidate.sort_key)
    costs = [0.5 if c.label in ("A", "B") else 1.0 for c in cands]
    external = {"tvm": _Kind(True), "ext": _Kind(False)}
    plain = search(graph, cands, costs)
    assert not is_valid(graph, plain.chosen, external)
    valid = search_valid(graph, cands, costs, external)
    assert is_valid(graph, valid.chosen, external) and valid.cost == pytest.approx(3.5)
    # Both partitions in TVM: nothing is outlined, so the cheapest cover stands.
    inside = {"tvm": _Kind(True), "ext": _Kind(True)}
    assert search_valid(graph, cands, costs, inside).cost == pytest.approx(plain.cost) == pytest.approx(2.0)


def test_the_learned_estimator_uses_the_search_validity_check():
    from tvm_tcutils.collage.cost import learned

    assert learned.search_valid is search_valid


def test_no_cover_and_bad_costs():
    x = relay.var("x", shape=(2,))
    graph = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    cands = [Candidate("a", 0b010, "exp"), Candidate("a", 0b100, "relu")]
    with pytest.raises(NoCoverError, match="nn.relu"):
        search(graph, cands, [1.0, math.inf])
    with pytest.raises(ValueError, match="costs: expected 2"):
        search(graph, cands, [1.0])
    with pytest.raises(ValueError, match="invalid cost"):
        search(graph, cands, [1.0, float("nan")])


def test_graph_indexing_and_convexity():
    x = relay.var("x", shape=(2,))
    a = relay.exp(x)
    b = relay.negative(a)
    c = relay.add(a, b)
    graph = IndexedGraph(relay.Function([x], c))
    assert [n.op_name for n in graph.nodes] == ["var", "exp", "negative", "add"]
    assert not graph.is_convex(mask_of([1, 3]))
    assert graph.is_convex(mask_of([1, 2, 3])) and graph.is_convex(mask_of([2, 3]))
    assert graph.depth(mask_of([1, 2, 3])) == 3
    assert graph.inputs_of(mask_of([2, 3])) == [1]
    assert graph.outputs_of(mask_of([1, 2])) == [1, 2]


def test_deep_graph_needs_no_recursion():
    x = relay.var("x", shape=(2,))
    y = x
    for _ in range(5000):
        y = relay.negative(y)
    graph = IndexedGraph(relay.Function([x], y))
    cands = [Candidate("a", 1 << i, "n") for i in bits(graph.covered_mask)]
    assert search(graph, cands, [1.0] * len(cands)).cost == pytest.approx(5000.0)


def test_rejects_non_dataflow():
    x = relay.var("x", shape=(2,))
    f = relay.Function([x], relay.exp(x))
    with pytest.raises(ValueError, match="dataflow"):
        IndexedGraph(relay.Function([x], relay.Call(f, [x])))
    with pytest.raises(TypeError, match="relay.Function"):
        IndexedGraph(np.zeros(2))
