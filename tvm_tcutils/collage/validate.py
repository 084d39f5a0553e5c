"""Validation of a chosen partitioning: build it whole, time it, learn what crossings cost.

Candidates are measured alone, so the sum of their costs misses what a
partitioning pays at each boundary between toolchains. :class:`Validation`
builds the chosen partitioning and its rivals (single toolchains, BYOC's
greedy partitioning) whole, times them with a :class:`WholeModelTimer`,
re-searches with the measured cost of a crossing, and keeps the fastest.

The timer comes from the cost estimator
(:meth:`~.cost.base.CostEstimator.whole_model_timer`): a measuring estimator
times whole models in its worker processes, with its own target and tuning
log (:class:`~.cost.workers.PooledWholeModelTimer`); estimators whose costs
are not times here have none, and nothing is validated.
"""
from __future__ import annotations

import logging
import math
from typing import Dict, List, Optional, Protocol, Sequence

from .._tvm import tvm

from .candidates import Candidate
from .outline import partitioned_module
from .search import NoCoverError, SearchResult, is_valid, search, search_valid
from .subgraph import IndexedGraph
from .toolchains import Toolchain, tvm_toolchain

logger = logging.getLogger("tvm_tcutils.collage")


class WholeModelTimer(Protocol):
    """Times whole partitioned modules (milliseconds).

    Examples
    --------
    >>> class Fixed:
    ...     def time(self, mod): return 1.0
    ...     def time_side_by_side(self, mods, rounds=5): return [1.0] * len(mods)
    >>> Fixed().time_side_by_side([None, None])
    [1.0, 1.0]
    """

    def time(self, mod: tvm.IRModule) -> Optional[float]:
        """Latency of one module (``inf``: it failed), or None when it cannot be timed at all."""

    def time_side_by_side(self, mods: Sequence[tvm.IRModule], rounds: int = 5) -> Optional[List[float]]:
        """Latencies of modules timed in turns (A B A B ...), so that a drift of load affects all alike."""


def outline_chosen(graph: IndexedGraph, chosen: Sequence[Candidate], toolchains: Dict[str, Toolchain],
                   prepared: tvm.IRModule):
    """The partitioned module of ``chosen`` (and its partitions' symbols), lowered the TVM toolchain's way.

    Examples
    --------
    >>> from tvm import relay
    >>> from tvm_tcutils.collage.toolchains import TVM
    >>> x = relay.var("x", shape=(2,))
    >>> prepared = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> graph = IndexedGraph(prepared["main"])
    >>> mod, symbols = outline_chosen(graph, [Candidate("tvm", 0b10, "exp")], {"tvm": TVM}, prepared)
    >>> symbols  # everything stays in TVM's main
    {}
    """
    compilers = {name: tc.compiler for name, tc in toolchains.items()}
    return partitioned_module(graph, chosen, compilers, prepared, rewrite=tvm_toolchain(toolchains).rewrite)


class Validation:
    """Builds and times whole-model partitionings; learns the cost of crossing between toolchains.

    Candidates are measured alone, so their sum misses what a partitioning
    pays at each boundary between toolchains (thread pools waking up, caches,
    the call itself). When the estimator can time whole models, the chosen
    partitioning is built and timed; the gap between that and its estimate,
    spread over its external partitions, becomes a per-crossing penalty, and
    the search runs again with it (``rounds`` times). Each single-toolchain
    answer is timed too, and BYOC's greedy partitioning of each BYOC
    toolchain (its largest candidates, TVM for the rest): the fastest
    partitioning measured wins, so Collage is never measured slower than
    these in its own run.

    Parameters
    ----------
    graph, cands, costs, toolchains, prepared :
        What the search ran on (``toolchains`` by name).
    timer : WholeModelTimer, optional
        Times whole modules; None validates nothing.

    Attributes
    ----------
    trials : list of (str, float, float)
        Label, estimated ms and measured ms of each partitioning timed alone.
    side_by_side : list of (str, float, float)
        The same, timed again in turns (the fastest of these is chosen).

    Examples
    --------
    >>> from tvm_tcutils.collage.candidates import enumerate_candidates
    >>> from tvm_tcutils.collage.driver import prepare
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> from tvm_tcutils.models import load_model
    >>> prepared = prepare(*load_model("mlp"))
    >>> graph, toolchains = IndexedGraph(prepared["main"]), {tc.name: tc for tc in resolve("tvm")}
    >>> cands = enumerate_candidates(graph, list(toolchains.values()))
    >>> costs = [1.0] * len(cands)
    >>> class TwoMs:
    ...     def time(self, mod): return 2.0
    ...     def time_side_by_side(self, mods, rounds=5): return [2.0] * len(mods)
    >>> check = Validation(graph, cands, costs, toolchains, prepared, TwoMs())
    >>> answer = search(graph, cands, costs)
    >>> check.run(answer, rounds=2, singles={}) is answer, check.trials[0][0], check.measured_of(answer)
    (True, 'collage', 2.0)
    """

    def __init__(self, graph: IndexedGraph, cands: Sequence[Candidate], costs: Sequence[float],
                 toolchains: Dict[str, Toolchain], prepared: tvm.IRModule, timer: Optional[WholeModelTimer]):
        self.graph, self.cands, self.costs = graph, cands, costs
        self.toolchains, self.prepared, self.timer = toolchains, prepared, timer
        self.trials: List = []
        self.side_by_side: List = []
        self._measured: Dict[frozenset, float] = {}
        self._labels: Dict[frozenset, str] = {}

    def _external(self, cand: Candidate) -> bool:
        return not cand.host and not self.toolchains[cand.toolchain].is_tvm

    @staticmethod
    def _key(result: SearchResult) -> frozenset:
        return frozenset((c.toolchain, c.mask, c.composites) for c in result.chosen if not c.host)

    def measured_of(self, result: SearchResult) -> Optional[float]:
        """The latest whole-model time of ``result`` (None if it was not timed)."""
        return self._measured.get(self._key(result))

    def _time(self, result: SearchResult, label: str) -> Optional[float]:
        key = self._key(result)
        if key not in self._measured:
            mod, _ = outline_chosen(self.graph, result.chosen, self.toolchains, self.prepared)
            ms = self.timer.time(mod)
            if ms is None:
                return None
            self._measured[key] = ms
            self._labels[key] = label
            self.trials.append((label, result.cost, ms))
            logger.info("validation: %s estimated %.3f ms, measured %.3f ms", label, result.cost, ms)
        return self._measured[key]

    def run(self, result: SearchResult, rounds: int, singles: Dict[str, SearchResult],
            greedy: Optional[Dict[str, SearchResult]] = None) -> SearchResult:
        """Time ``result`` whole, re-search ``rounds`` times with the learned crossing cost, time the
        ``singles`` and ``greedy`` answers too; the fastest measured answer (``result`` untimed when
        there is no timer or ``rounds`` is 0)."""
        if rounds == 0 or self.timer is None or self._time(result, "collage") is None:
            return result
        tried = [result]
        penalty = 0.0
        current = result
        for _ in range(rounds):
            crossings = sum(1 for c in current.chosen if self._external(c))
            if not crossings:
                break
            gap = self._measured[self._key(current)] - current.cost
            penalty = max(0.0, penalty + gap / crossings)
            costs = [x + penalty if self._external(c) else x for c, x in zip(self.cands, self.costs)]
            current = search_valid(self.graph, self.cands, costs, self.toolchains)
            if self._key(current) in self._measured:
                break
            self._time(current, f"collage, {penalty * 1e3:.0f} us per crossing")
            tried.append(current)
        for name, single in singles.items():
            self._time(single, "tvm alone" if self.toolchains[name].is_tvm else f"{name} + tvm")
            tried.append(single)
        for name, answer in (greedy or {}).items():
            self._time(answer, f"{name} greedy")
            tried.append(answer)
        self._retime_side_by_side(tried)
        return min(tried, key=lambda r: self._measured.get(self._key(r), math.inf))

    def _retime_side_by_side(self, tried: List[SearchResult]) -> None:
        """Time the distinct partitionings again, in turns, and keep those timings.

        The timings above were taken one after the other, seconds apart; on a
        machine whose load drifts that alone can flip the choice. Timed
        round-robin in one process the ratios are fair.
        """
        distinct: Dict[frozenset, SearchResult] = {}
        for result in tried:
            if math.isfinite(self._measured.get(self._key(result), math.inf)):
                distinct.setdefault(self._key(result), result)
        if len(distinct) < 2:
            return
        mods = [outline_chosen(self.graph, r.chosen, self.toolchains, self.prepared)[0] for r in distinct.values()]
        times = self.timer.time_side_by_side(mods)
        if not times:
            return
        for (key, result), ms in zip(distinct.items(), times):
            self._measured[key] = ms
            self.side_by_side.append((self._labels.get(key, "?"), result.cost, ms))
            logger.info("validation, timed side by side: %s estimated %.3f ms, measured %.3f ms",
                        self._labels.get(key, "?"), result.cost, ms)


def greedy_answers(graph: IndexedGraph, cands: List[Candidate], costs: List[float],
                   toolchains: Dict[str, Toolchain]) -> Dict[str, SearchResult]:
    """BYOC's greedy partitioning of each BYOC toolchain, as a search answer.

    The toolchain's largest candidates (those inside no other of its
    candidates: for a graph-style toolchain its maximal regions, as
    ``MergeCompilerRegions`` makes them) are forced, TVM candidates touching
    them are left out, and TVM covers the rest. Timed whole in validation: the
    isolated costs of a fine-grained mix can miss what one big region gains in
    a whole model (the toolchain's own fusion, fewer calls).

    Examples
    --------
    >>> greedy_answers(None, [], [], {})  # TVM alone has no greedy rival
    {}
    """
    out: Dict[str, SearchResult] = {}
    for name, tc in toolchains.items():
        if tc.is_tvm:
            continue
        own = sorted((k for k, c in enumerate(cands) if c.toolchain == name and not c.host and math.isfinite(costs[k])),
                     key=lambda k: (-cands[k].mask.bit_count(), k))
        largest: List[int] = []
        for k in own:
            mask = cands[k].mask
            if not any(mask & cands[j].mask == mask for j in largest):
                largest.append(k)
        if not largest:
            continue
        claimed = 0
        for k in largest:
            claimed |= cands[k].mask
        keep = set(largest)
        sub = [k for k, c in enumerate(cands)
               if k in keep or c.host or (toolchains[c.toolchain].is_tvm and not c.mask & claimed)]
        try:
            answer = search(graph, [cands[k] for k in sub], [costs[k] for k in sub])
        except NoCoverError:  # overlapping largest candidates can leave nodes without a cover
            continue
        if is_valid(graph, answer.chosen, toolchains):  # else its regions depend on each other cyclically
            out[name] = answer
    return out
