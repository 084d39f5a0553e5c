"""The search: a minimum-cost cover of the graph by candidate partitions.

As in the Collage paper and RFC, a search state is the set of covered nodes
(a bitset). From a state, the transitions are the candidates whose first
node is the state's lowest uncovered node (in post-order) and that do not
overlap what is covered; the cost of a transition is the candidate's
estimated latency. The cheapest path from "nothing covered" to "everything
covered" is the partitioning. The shortest path is found with A*: the
heuristic is the sum of the uncovered nodes' shares, where the shares are
chosen so that no candidate costs less than its nodes' shares (the dual of
the cover's linear relaxation, see :func:`_node_shares`). Such a heuristic
never over-estimates and is consistent, so the answer is exactly that of
Dijkstra's algorithm; the tighter the shares, the fewer states are visited.

Ties are broken deterministically: lower cost, then fewer partitions, then
the order in which states were reached (candidates are sorted, see
:func:`~.candidates.enumerate_candidates`).

Two candidates that are each convex can still depend on each other through
other partitions (a cycle between partitions). :func:`partition_order`
detects that in a result; :func:`search` with ``check_cycles=True`` then
rejects transitions that would close such a cycle given the partitions on
the path to the state.
"""
from __future__ import annotations

import dataclasses
import heapq
import logging
import math
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from tvm import relay

from .candidates import Candidate
from .subgraph import IndexedGraph, bits

logger = logging.getLogger("tvm_tcutils.collage")


@dataclasses.dataclass
class SearchResult:
    """The chosen candidates (in dataflow order), their costs and the total.

    ``states`` counts the states the search expanded and ``bound`` is its lower
    bound on the total before it started (0 where unknown).
    """

    chosen: List[Candidate]
    costs: List[float]
    cost: float
    states: int
    bound: float = 0.0

    def non_host(self) -> List[Tuple[Candidate, float]]:
        """Chosen partitions other than free host glue, with their costs."""
        return [(c, x) for c, x in zip(self.chosen, self.costs) if not c.host]


class NoCoverError(RuntimeError):
    """No combination of finite-cost candidates covers the graph."""


def search(
    graph: IndexedGraph,
    candidates: Sequence[Candidate],
    costs: Sequence[float],
    check_cycles: bool = False,
) -> SearchResult:
    """Find the cheapest cover of ``graph`` by non-overlapping ``candidates``.

    Parameters
    ----------
    graph : IndexedGraph
        The graph to cover (every call, tuple and projection node).
    candidates : sequence of Candidate
        Candidate partitions (from :func:`~.candidates.enumerate_candidates`).
    costs : sequence of float
        Estimated cost of each candidate (same order); ``inf`` means unusable.
    check_cycles : bool
        Reject transitions that would make partitions depend on each other
        cyclically (slower; see the module docstring).

    Returns
    -------
    SearchResult

    Raises
    ------
    NoCoverError
        When some node is not covered by any finite-cost candidate.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    >>> a = Candidate("tvm", 0b010, "exp"); b = Candidate("tvm", 0b100, "relu"); ab = Candidate("tvm", 0b110, "f")
    >>> search(g, [a, b, ab], [1.0, 1.0, 1.5]).cost
    1.5
    """
    if len(candidates) != len(costs):
        raise ValueError(f"costs: expected {len(candidates)} values (one per candidate), got {len(costs)}")
    full = (1 << len(graph)) - 1
    start = full & ~graph.covered_mask
    masks = [c.mask for c in candidates]
    by_first: Dict[int, List[Tuple[float, int]]] = {}
    single = _single_node_costs(len(graph), masks, costs)
    usable: List[int] = []
    for idx, (cand, cost) in enumerate(zip(candidates, costs)):
        cost = float(cost)
        if math.isnan(cost) or cost < 0:
            raise ValueError(f"costs: candidate {idx} ({cand.label}) has an invalid cost {cost}")
        if math.isinf(cost):
            continue
        if cand.mask & (cand.mask - 1) and sum(single[i] for i in bits(cand.mask)) < cost:
            # Its nodes one by one cost strictly less: no cheapest cover uses it (exact pruning;
            # single-node partitions never close a cycle). On Inception-v3 this removes most
            # of the branching that made the search take minutes.
            continue
        by_first.setdefault(cand.first, []).append((cost, idx))
        usable.append(idx)
    members = [list(bits(masks[idx])) for idx in usable]
    share = _node_shares(len(graph), members, [float(costs[i]) for i in usable])
    missing = [i for i in bits(graph.covered_mask) if math.isinf(share[i])]
    if missing:
        node = graph.nodes[missing[0]]
        raise NoCoverError(
            f"no finite-cost candidate covers node {node.index} ({node.op_name}) "
            f"and {len(missing) - 1} other node(s)"
        )
    gain = [0.0] * len(masks)
    for idx, nodes in zip(usable, members):
        gain[idx] = sum(share[i] for i in nodes)
    h0 = sum(share[i] for i in bits(graph.covered_mask))

    # best[state] = (cost, partitions); parent[state] = (previous state, candidate index)
    best: Dict[int, Tuple[float, int]] = {start: (0.0, 0)}
    parent: Dict[int, Tuple[int, int]] = {}
    chains: Dict[int, Optional[tuple]] = {start: None}
    heap = [(h0, 0.0, 0, 0, start)]
    seq = 0
    popped = 0
    h_of = {start: h0}
    while heap:
        _, cost, parts, _, state = heapq.heappop(heap)
        if best[state] != (cost, parts):
            continue
        popped += 1
        if state == full:
            break
        lowest = ((state + 1) & ~state).bit_length() - 1
        h_state = h_of[state]
        for c_cost, idx in by_first.get(lowest, ()):
            mask = masks[idx]
            if mask & state:
                continue
            new = state | mask
            key = (cost + c_cost, parts + 1)
            old = best.get(new)
            if old is not None and old <= key:
                continue
            if check_cycles and mask & (mask - 1) and _closes_cycle(graph, mask, chains[state]):
                continue
            best[new] = key
            parent[new] = (state, idx)
            if check_cycles:
                chains[new] = (mask, chains[state]) if mask & (mask - 1) else chains[state]
            h_new = max(h_state - gain[idx], 0.0)
            h_of[new] = h_new
            seq += 1
            heapq.heappush(heap, (key[0] + h_new, key[0], key[1], seq, new))
    if full not in best:
        raise NoCoverError("no cover of the graph by the candidates (their partitions depend on each other)")
    chosen: List[int] = []
    state = full
    while state != start:
        state, idx = parent[state]
        chosen.append(idx)
    chosen.reverse()
    return SearchResult(
        [candidates[i] for i in chosen], [float(costs[i]) for i in chosen], best[full][0], popped, h0
    )


def _node_shares(size: int, members: Sequence[Sequence[int]], costs: Sequence[float]) -> List[float]:
    """Per node, a share of the cost of covering it such that no candidate costs less than its nodes' shares.

    With such shares, the shares of the uncovered nodes never exceed what covering them
    costs, and a transition never removes more share than it costs: the A* heuristic is
    admissible and consistent, so the answer stays exact. The tighter the shares, the
    fewer states the search visits. The best shares are the dual of the cover's linear
    relaxation (maximize the sum of shares subject to every candidate's constraint),
    solved with scipy's HiGHS; where that is unavailable, each node's cheapest even split
    (cost / nodes) of a candidate holding it. Either is then made exactly feasible and
    raised by one pass of coordinate ascent (each node takes the slack every candidate
    holding it has left). On Inception-v3 with learned costs the bound at the start is
    24 % of the optimum with even splits alone, 98.5 % after the ascent, 99.6 % from the
    linear relaxation; the search visits 1.8 M, 390 k and 29 k states. Nodes no candidate
    holds get ``inf``.
    """
    share = np.full(size, np.inf)
    if not members:
        return share.tolist()
    lengths = np.fromiter((len(m) for m in members), dtype=np.int64, count=len(members))
    holder = np.repeat(np.arange(len(members)), lengths)
    node = np.fromiter((i for m in members for i in m), dtype=np.int64, count=int(lengths.sum()))
    cost = np.asarray(costs, dtype=np.float64)
    np.minimum.at(share, node, (cost / lengths)[holder])
    held = np.isfinite(share)
    relaxed = _relaxation_shares(size, holder, node, cost, held)
    share = relaxed if relaxed is not None else np.where(held, share, 0.0)
    # The solver's answer may break constraints by its tolerance: scale each node down by
    # the worst ratio among the candidates holding it, which restores every constraint.
    load = np.bincount(holder, weights=share[node], minlength=len(members))
    over = load > cost
    if over.any():
        ratio = np.ones(len(members))
        ratio[over] = cost[over] / load[over]
        scale = np.ones(size)
        np.minimum.at(scale, node, ratio[holder])
        share *= scale
    order = np.argsort(node, kind="stable")
    bounds = np.searchsorted(node[order], np.arange(size + 1))
    slack = cost - np.bincount(holder, weights=share[node], minlength=len(members))
    for i in np.flatnonzero(held):
        mine = holder[order[bounds[i]:bounds[i + 1]]]
        rise = slack[mine].min()
        if rise > 0:
            share[i] += rise
            slack[mine] -= rise
    # Rounding in the sums above may leave a candidate a few ulps under its shares;
    # shrinking them by far more than that keeps the bound a bound.
    share *= 1.0 - 1e-9
    return np.where(held, np.maximum(share, 0.0), np.inf).tolist()


def _relaxation_shares(size: int, holder: np.ndarray, node: np.ndarray, cost: np.ndarray,
                       held: np.ndarray) -> Optional[np.ndarray]:
    """The linear relaxation's optimal shares, or None without scipy or when the solver fails."""
    try:
        from scipy.optimize import linprog
        from scipy.sparse import csr_matrix
    except ImportError:
        return None
    matrix = csr_matrix((np.ones(len(node)), (holder, node)), shape=(len(cost), size))
    answer = linprog(-held.astype(np.float64), A_ub=matrix, b_ub=cost, bounds=(0, None), method="highs")
    if answer.status != 0 or answer.x is None:
        return None
    return np.where(held, np.maximum(answer.x, 0.0), 0.0)


def _single_node_costs(size: int, masks: Sequence[int], costs: Sequence[float]) -> List[float]:
    """Per node, the cheapest candidate made of that node alone (``inf`` where there is none)."""
    single = [math.inf] * size
    for mask, cost in zip(masks, costs):
        if mask and not mask & (mask - 1):
            i = mask.bit_length() - 1
            cost = float(cost)
            if cost < single[i]:  # NaN never compares smaller: it is reported by the caller
                single[i] = cost
    return single


def _closes_cycle(graph: IndexedGraph, mask: int, chain: Optional[tuple]) -> bool:
    """Whether adding partition ``mask`` to the partitions in ``chain`` makes a cycle.

    Follows what is reachable from ``mask`` in the graph where every chosen
    partition is one node: reaching part of a partition reaches all of it.
    """
    parts = []
    while chain is not None:
        parts.append(chain[0])
        chain = chain[1]
    reach, _ = graph.reach(mask)
    changed = True
    while changed:
        changed = False
        for part in parts:
            if part & reach and part & ~reach:
                down, _ = graph.reach(part)
                reach |= part | down
                changed = True
        if reach & mask:
            return True
    return False


def partition_order(graph: IndexedGraph, masks: Sequence[int]) -> Optional[List[int]]:
    """All units (the partitions ``masks`` and every other node alone) in a dataflow order.

    Returns the units as bitsets, each after the units it reads from, or None
    when the partitions depend on each other cyclically.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    >>> partition_order(g, [0b110])
    [1, 6]
    """
    owner: Dict[int, int] = {}
    units: List[int] = []
    for mask in masks:
        for i in bits(mask):
            owner[i] = len(units)
        units.append(mask)
    for node in graph.nodes:
        if node.index not in owner:
            owner[node.index] = len(units)
            units.append(1 << node.index)
    preds: List[set] = [set() for _ in units]
    for node in graph.nodes:
        me = owner[node.index]
        preds[me].update(owner[i] for i in node.inputs if owner[i] != me)
    succs: List[List[int]] = [[] for _ in units]
    for unit, ps in enumerate(preds):
        for p in ps:
            succs[p].append(unit)
    indeg = [len(ps) for ps in preds]
    # Order ready units by their first node, so the order follows the model's.
    ready = [((m & -m).bit_length(), u) for u, m in enumerate(units) if indeg[u] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, unit = heapq.heappop(ready)
        order.append(units[unit])
        for s in succs[unit]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, ((units[s] & -units[s]).bit_length(), s))
    return order if len(order) == len(units) else None


def external_masks(chosen: Sequence[Candidate], toolchains: Mapping[str, object]) -> List[int]:
    """The node sets of the chosen partitions that leave TVM (``toolchains``: name -> toolchain).

    Examples
    --------
    >>> class TC:
    ...     def __init__(self, is_tvm): self.is_tvm = is_tvm
    >>> external_masks([Candidate("tvm", 0b01, "a"), Candidate("ort", 0b10, "b")],
    ...                {"tvm": TC(True), "ort": TC(False)})
    [2]
    """
    return [c.mask for c in chosen if not c.host and not toolchains[c.toolchain].is_tvm]


def is_valid(graph: IndexedGraph, chosen: Sequence[Candidate], toolchains: Mapping[str, object]) -> bool:
    """Whether the partitions leaving TVM can be outlined: none depends on another cyclically.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    >>> is_valid(g, [], {})
    True
    """
    return partition_order(graph, external_masks(chosen, toolchains)) is not None


def search_valid(graph: IndexedGraph, candidates: Sequence[Candidate], costs: Sequence[float],
                 toolchains: Mapping[str, object]) -> SearchResult:
    """:func:`search`, again with cycle checks when the cheapest cover is not :func:`is_valid`.

    The checks make the search slower and are rarely needed, so they are only
    paid for when the plain answer needs them.

    Examples
    --------
    >>> from tvm import relay
    >>> class TC:
    ...     is_tvm = True
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    >>> cands = [Candidate("tvm", 0b010, "exp"), Candidate("tvm", 0b100, "relu")]
    >>> search_valid(g, cands, [1.0, 1.0], {"tvm": TC()}).cost
    2.0
    """
    result = search(graph, candidates, costs)
    if not is_valid(graph, result.chosen, toolchains):
        logger.info("partitions of the best cover depend on each other; searching again with cycle checks")
        result = search(graph, candidates, costs, check_cycles=True)
    return result


def _tensor_kb(ttype, least_rank: int = 0) -> float:
    """Kilobytes of a tensor type (a tuple's fields summed), counting tensors of at least ``least_rank`` axes."""
    if isinstance(ttype, relay.TupleType):
        return sum(_tensor_kb(field, least_rank) for field in ttype.fields)
    if len(ttype.shape) < least_rank:
        return 0.0
    elements = 1
    for dim in ttype.shape:
        elements *= int(dim)
    return elements * tvm.DataType(ttype.dtype).bits / 8 / 1024


def border_kb(graph: IndexedGraph, mask: int) -> float:
    """Kilobytes of the tensors crossing the border of the nodes ``mask`` (constants left out).

    Examples
    --------
    >>> x = relay.var("x", shape=(256,))  # 1 KB of float32
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
    ...     relay.Function([x], relay.exp(relay.nn.relu(x)))))["main"])
    >>> border_kb(graph, 0b110)  # relu and exp: x comes in, exp's result goes out
    2.0
    """
    crossing = [i for i in graph.inputs_of(mask) if graph.nodes[i].kind != "const"] + graph.outputs_of(mask)
    return float(sum(_tensor_kb(graph.nodes[i].expr.checked_type) for i in crossing))


#: Tensors TVM's x86 convolutions and pools keep in a blocked layout (NCHW[x]c) have this many axes at least;
#: a toolchain outside TVM takes and gives them in NCHW, so each crossing transforms them on TVM's side.
BLOCKED_RANK = 4


def crossing_kb(graph: IndexedGraph, mask: int) -> float:
    """Kilobytes TVM transforms if the nodes ``mask`` run on another toolchain: the tensors of at least
    :data:`BLOCKED_RANK` axes that come from other operators or go to them (the model's inputs, its
    constants and what only the model returns need no transform).

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 4, 8, 8))  # 1 KB of float32
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
    ...     relay.Function([x], relay.exp(relay.nn.relu(relay.sigmoid(x))))))["main"])
    >>> crossing_kb(graph, 0b0100), crossing_kb(graph, 0b1000), crossing_kb(graph, 0b0010)
    (2.0, 1.0, 1.0)
    """
    nodes = graph.nodes

    def to_others(i: int) -> bool:
        return any(not (mask >> o) & 1 and not (o == graph.output and nodes[o].kind == "tuple")
                   for o in nodes[i].outputs)

    crossing = [i for i in graph.inputs_of(mask) if nodes[i].kind not in ("const", "var")]
    crossing += [i for i in graph.outputs_of(mask) if to_others(i)]
    return float(sum(_tensor_kb(nodes[i].expr.checked_type, BLOCKED_RANK) for i in crossing))


def crossing_costs(graph: IndexedGraph, candidates: Sequence[Candidate], toolchains: Mapping[str, object],
                   ms_per_kb: float) -> List[float]:
    """Per candidate, what crossing into it from TVM costs (ms): ``ms_per_kb`` times its :func:`crossing_kb`
    for a candidate outside TVM, 0 for TVM's and the host's (``toolchains``: name -> toolchain).

    Examples
    --------
    >>> class TC:
    ...     def __init__(self, is_tvm): self.is_tvm = is_tvm
    >>> x = relay.var("x", shape=(1, 4, 8, 8))
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
    ...     relay.Function([x], relay.exp(relay.nn.relu(x)))))["main"])
    >>> cands = [Candidate("tvm", 0b010, "relu"), Candidate("ort", 0b010, "relu")]
    >>> crossing_costs(graph, cands, {"tvm": TC(True), "ort": TC(False)}, 0.5)
    [0.0, 0.5]
    """
    if not ms_per_kb > 0:
        return [0.0] * len(candidates)
    kb: Dict[int, float] = {}
    out = []
    for cand in candidates:
        if cand.host or toolchains[cand.toolchain].is_tvm:
            out.append(0.0)
            continue
        if cand.mask not in kb:
            kb[cand.mask] = crossing_kb(graph, cand.mask)
        out.append(ms_per_kb * kb[cand.mask])
    return out
