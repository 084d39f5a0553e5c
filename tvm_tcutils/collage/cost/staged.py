"""Collage's default costs: measure every operator alone, estimate bigger candidates from their parts,
measure what the search picks.

A measure-everything search builds and times every candidate: tens of thousands on an
Inception-style CNN (about 38,000 for Inception-v1 with TVM, onnxruntime and OpenVINO; 18,000
distinct per runtime), hours of measuring for an answer a user can get in a minute by trying
each runtime whole. Most of those candidates are never close to the answer.
:class:`StagedCostEstimator` measures in stages instead:

1. **Parts**: every distinct one-operator candidate of every toolchain (a few hundred; repeated
   layers share one measurement through the cost store's structural key), and each toolchain's
   maximal regions (what BYOC's greedy partitioning would give it: a handful), a QDQ model's 8-bit
   layers (``dequantize -> conv -> quantize`` regions, on every toolchain), and a small seeded
   sample of each toolchain's joint candidates (``calibration``) to fit ``fusion(T)`` from the start.
2. **Wholes, estimated**: a candidate of ``n`` operators on toolchain ``T`` is estimated from its
   parts: ``overhead(T) + fusion(T) * sum(part - overhead(T))``. ``overhead(T)`` is what one call
   of ``T`` costs however small the work (its cheapest part); ``fusion(T)`` is how much of the
   parts' own work a joint candidate keeps, fitted from the joint candidates measured so far
   (a low quantile: optimistic, so a joint candidate that might win is tried rather than
   dismissed), :data:`PRIOR_FUSION` before any.
3. **What can change the answer, measured**: the search runs on measured costs where known and
   estimates elsewhere; the estimated candidates it picks are measured, and it runs again,
   until its answer is made of measured candidates only, or the estimates cannot promise more than
   ``tolerance`` over the best fully measured answer (the first one: the cheapest cover of what stage 1
   measured), or the deadline comes (then the best fully measured answer so far). The estimates are
   optimistic on purpose, so each round searches them read with their measured optimism: per toolchain,
   the median of measured / estimated cost over the joint candidates earlier searches picked and measured
   (:data:`OPTIMISM_MIN_SAMPLES` of them at least), which says what the next picks will likely
   measure. Without it every round measured a whole answer of picks that came out dearer than
   estimated (DenseNet-121: four rounds of about 200 candidates, 85-90 s each, for OpenVINO alone);
   reading only one answer's picks with it (not searching again) stopped rounds whose other answers
   could still win.

Example
-------
>>> from tvm_tcutils.collage.cost.staged import fused_estimate
>>> round(fused_estimate([0.5, 0.1, 0.1], overhead=0.05, fusion=0.8), 6)  # one call, 80 % of the work
0.49
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ..candidates import Candidate
from ..rules import MAXIMAL, QUANTIZED
from ..search import NoCoverError, SearchResult, crossing_costs, search_valid
from ..subgraph import IndexedGraph, bits
from .base import CostEstimator, CostRequest, cost_requests
from .measured import MeasuredCostEstimator

logger = logging.getLogger("tvm_tcutils.collage")

#: ``fusion(T)`` before any joint candidate of ``T`` is measured: joint runs usually save some work.
PRIOR_FUSION = 0.7

#: Quantile of the measured joint candidates' fusion ratios used as ``fusion(T)`` (optimistic).
FUSION_QUANTILE = 0.25

#: ``fusion(T)`` is kept within these bounds (a few noisy measurements must not make it absurd).
FUSION_BOUNDS = (0.2, 1.5)

#: A toolchain's optimism (the median of measured / estimated cost over the joint candidates earlier
#: searches picked) needs this many of them; until then its estimates are taken as they are.
OPTIMISM_MIN_SAMPLES = 8

#: Bounds of a toolchain's optimism.
OPTIMISM_BOUNDS = (0.5, 4.0)


def fused_estimate(parts: Sequence[float], overhead: float, fusion: float) -> float:
    """A joint candidate's cost from its parts' costs: one call's ``overhead`` plus ``fusion`` of the work.

    Examples
    --------
    >>> fused_estimate([1.0], overhead=0.1, fusion=0.5)  # one part: itself, whatever the fusion
    1.0
    >>> fused_estimate([0.05, 0.05], overhead=0.1, fusion=1.0)  # parts cheaper than one call: one call
    0.1
    """
    if len(parts) == 1:
        return float(parts[0])
    return float(overhead + fusion * sum(max(p - overhead, 0.0) for p in parts))


def fusion_ratio(measured: float, parts: Sequence[float], overhead: float) -> Optional[float]:
    """What share of its parts' work a measured joint candidate kept (None when the parts are all overhead).

    Examples
    --------
    >>> round(fusion_ratio(0.9, [0.5, 0.6], overhead=0.1), 6)
    0.888889
    """
    work = sum(max(p - overhead, 0.0) for p in parts)
    if work <= 0 or not math.isfinite(measured):
        return None
    return max(measured - overhead, 0.0) / work


class StagedCostEstimator(CostEstimator):
    """Measure operators alone, estimate joint candidates from them, measure what the search picks.

    See the module's description for the stages.

    Parameters
    ----------
    measured : MeasuredCostEstimator
        Does the measuring (and the caching: a second search of the same model measures nothing).
    max_rounds : int
        Search / measure rounds at most.
    tolerance : float
        Stop once the search's best answer (measured and estimated costs) is within this fraction
        of the best fully measured answer: more rounds could gain at most that much by the estimates'
        own account.
    calibration : int
        Joint candidates per toolchain measured up front (a seeded sample) to fit ``fusion(T)``.
    seed : int
        Of that sample.
    deadline : float, optional
        ``time.perf_counter()`` value after which no new round starts (the driver sets it from its
        time budget); the best fully measured answer so far is returned, ``stats["stop"]`` says so.

    Examples
    --------
    >>> est = StagedCostEstimator(MeasuredCostEstimator(cache_dir=""))
    >>> est.stats["stop"]
    ''
    >>> est.close()
    """

    def __init__(self, measured: MeasuredCostEstimator, max_rounds: int = 40, tolerance: float = 0.01,
                 deadline: Optional[float] = None, calibration: int = 8, seed: int = 0):
        if not isinstance(measured, MeasuredCostEstimator):
            raise TypeError(f"measured must be a MeasuredCostEstimator, got {type(measured).__name__}")
        if not isinstance(max_rounds, int) or isinstance(max_rounds, bool) or max_rounds < 1:
            raise ValueError(f"max_rounds must be an int >= 1, got {max_rounds!r}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        if not isinstance(calibration, int) or isinstance(calibration, bool) or calibration < 0:
            raise ValueError(f"calibration must be an int >= 0, got {calibration!r}")
        self.measured = measured
        self.calibration = calibration
        self.seed = seed
        self.max_rounds = max_rounds
        self.tolerance = tolerance
        self.deadline = deadline
        self.stats = {"candidates": 0, "parts": 0, "measured": 0, "predicted": 0, "cached": 0, "failed": 0,
                      "rounds": 0, "stop": ""}
        self.fusion: Dict[str, float] = {}
        self.overhead: Dict[str, float] = {}
        self.optimism: Dict[str, float] = {}
        #: The crossing price (ms per KB, :meth:`crossing_ms_per_kb`) the last :meth:`search` added to
        #: the candidates outside TVM.
        self.crossing = 0.0

    # -- CostEstimator -----------------------------------------------------
    def whole_model_timer(self):
        """Whole models are timed by the measuring estimator."""
        return self.measured.whole_model_timer()

    def crossing_ms_per_kb(self, keys: Optional[Iterable[str]] = None) -> float:
        """As the measuring estimator learned it."""
        return self.measured.crossing_ms_per_kb(keys)

    def close(self) -> None:
        self.measured.close()

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        """Costs of ``requests``: measured where cached or a part, estimated from parts elsewhere."""
        requests = list(requests)
        if not requests:
            return []
        model = _PartsModel(requests[0].graph, requests, self)
        model.measure_parts()
        return model.costs()

    def search(self, graph: IndexedGraph, cands: Sequence[Candidate], toolchains: Dict,
               deadline: Optional[float] = None) -> Tuple[SearchResult, List[float]]:
        """Measure the parts, then alternate search and measuring the estimated candidates it picks."""
        deadline = self.deadline if deadline is None else deadline
        index = [k for k, c in enumerate(cands) if not c.host]
        requests = cost_requests(graph, cands, index, toolchains)
        model = _PartsModel(graph, requests, self)
        model.measure_parts()
        position = {cands[k]: n for n, k in enumerate(index)}
        # Crossings priced from the parts' boundary transforms: measured before any round, so a second
        # search of the model (every cost cached) prices them the same.
        self.crossing = self.crossing_ms_per_kb([r.key for r, p in zip(model.requests, model.parts) if len(p) <= 1])
        extra = crossing_costs(graph, cands, toolchains, self.crossing)

        def priced(values: Sequence[float]) -> List[float]:
            return [x + e for x, e in zip(_spread(len(cands), index, values), extra)]

        # The best answer of measured candidates alone (each toolchain's maximal regions and every part
        # are measured by now): what a round's estimated answer has to beat.
        best: Optional[SearchResult] = _measured_only(graph, cands, model, toolchains, priced)
        stop = "max_rounds"
        for round_ in range(self.max_rounds):
            self.stats["rounds"] = round_ + 1
            estimates = model.costs()
            # The estimates are optimistic on purpose (a joint candidate that might win gets tried); the
            # candidates earlier rounds picked and measured say by how much, per toolchain. The search reads
            # the estimates corrected by that: an answer whose picks would likely come out dearer than the
            # best measured one is not measured, and an answer of other picks that still could win is found
            # (correcting only the first answer's picks stopped ZFNet-512's rounds before its mix: its
            # OpenVINO picks read x2.3 dearer, its TVM ones x1.4, and the other answer was not looked for;
            # much of OpenVINO's x2.3 was measuring on a shared core, fixed since, but a toolchain whose
            # joint runs do cost more than their parts still needs it).
            read = model.corrected(estimates)
            result = search_valid(graph, cands, priced(read), toolchains)
            todo = [requests[position[c]] for c in result.chosen if not c.host]
            todo = [r for r in todo if r.key not in model.known]
            if not todo:
                best, stop = _better(best, result), "measured"
                break
            self.stats["corrected_ms"] = round(result.cost, 6)
            as_estimated = result.cost - sum(read[position[r.candidate]] - estimates[position[r.candidate]]
                                             for r in todo)
            # What decided the round, kept for the report: a run that stops early is otherwise unexplained.
            self.stats["optimism"] = {name: round(value, 4) for name, value in sorted(self.optimism.items())}
            logger.info("staged round %d: answer %.3f ms read with the optimism %s (%.3f ms as estimated); best "
                        "measured %s ms", round_ + 1, result.cost, self.stats["optimism"],
                        as_estimated,
                        "-" if best is None else f"{best.cost:.3f}")
            if best is not None and result.cost >= best.cost * (1 - self.tolerance):
                stop = "tolerance"
                break
            if deadline is not None and time.perf_counter() >= deadline and best is not None:
                stop = "deadline"
                break
            model.measure(todo, picked=True)
            known = [model.known[requests[position[c]].key] + extra[index[position[c]]] if not c.host else x
                     for c, x in zip(result.chosen, result.costs)]
            best = _better(best, SearchResult(list(result.chosen), known, float(sum(known)), result.states))
        self.stats["stop"] = stop
        costs = priced(model.costs())
        if best is None:  # every round's answer held estimates and the rounds ran out: the last one
            best = search_valid(graph, cands, costs, toolchains)
        measured = sum(1 for r in requests if r.key in model.known)
        self.stats.update(candidates=len(requests), measured=measured, predicted=len(requests) - measured)
        logger.info("staged costs: %d of %d candidates measured or cached (%d parts) in %d rounds (stopped: %s); "
                    "fusion %s", measured, len(requests), self.stats["parts"], self.stats["rounds"], stop,
                    {k: round(v, 3) for k, v in sorted(self.fusion.items())})
        return best, costs


def _measured_only(graph: IndexedGraph, cands: Sequence[Candidate], model: "_PartsModel", toolchains: Dict,
                   priced: Callable[[Sequence[float]], List[float]]) -> Optional[SearchResult]:
    """The cheapest valid answer of measured candidates only (None where they do not cover the graph);
    ``priced`` makes the requests' costs the candidates' (crossings added)."""
    known = [model.known.get(r.key, math.inf) for r in model.requests]
    try:
        result = search_valid(graph, cands, priced(known), toolchains)
    except NoCoverError:
        return None
    return result if math.isfinite(result.cost) else None


def _spread(size: int, index: Sequence[int], values: Sequence[float]) -> List[float]:
    costs = [0.0] * size
    for k, cost in zip(index, values):
        costs[k] = cost
    return costs


def _better(best: Optional[SearchResult], other: SearchResult) -> SearchResult:
    return other if best is None or other.cost < best.cost else best


class _PartsModel:
    """The parts of one search's requests, their measured costs and the estimates made from them."""

    def __init__(self, graph: IndexedGraph, requests: Sequence[CostRequest], owner: StagedCostEstimator):
        self.graph, self.requests, self.owner = graph, list(requests), owner
        self.known: Dict[str, float] = {}
        self.picked: set = set()
        calls = [i for i, node in enumerate(graph.nodes) if node.kind == "call"] if graph is not None else []
        self.is_call = set(calls)
        # Each request's call nodes (its parts); a request with one call is a part itself.
        self.parts: List[List[int]] = [[i for i in bits(r.candidate.mask) if i in self.is_call] for r in requests]
        # Quantized regions run in 8 bits, their parts in float: no measure of joint runs of float parts.
        self.quantized = {r.candidate.mask for r in self.requests if r.candidate.label == QUANTIZED}
        for req in self.requests:
            cost = owner.measured.lookup(req)
            if cost is not None:
                self.known[req.key] = cost
        self.owner.stats["cached"] += len(self.known)

    def measure(self, requests: Sequence[CostRequest], picked: bool = False) -> None:
        """Measure what is not known yet; ``picked``: candidates a search picked on their estimates (their
        measured costs against those estimates are the estimator's optimism)."""
        if picked:
            self.picked.update(r.key for r in requests)
        fresh: Dict[str, CostRequest] = {}
        for req in requests:
            if req.key not in self.known:
                fresh.setdefault(req.key, req)
        if not fresh:
            return
        todo = list(fresh.values())
        for req, cost in zip(todo, self.owner.measured.estimate(todo)):
            self.known[req.key] = cost
            self.owner.stats["failed"] += 0 if math.isfinite(cost) else 1

    def measure_parts(self) -> None:
        """Measure the parts, and each toolchain's maximal regions (what it would run alone, greedily):
        estimated from parts that each pay a call and their own copies, a region of dozens of operators
        would look far dearer than it is and never be picked, so never measured."""
        parts = [r for r, p in zip(self.requests, self.parts) if len(p) <= 1]
        self.owner.stats["parts"] = len({r.key for r in parts})
        maximal = [r for r in self.requests if r.candidate.label == MAXIMAL]
        # A QDQ model's 8-bit layers, on every toolchain that has them: estimated from their float
        # parts they would look several times dearer than they run, and never be picked.
        regions = [r for r in self.requests if r.candidate.mask in self.quantized]
        self.measure(parts + maximal + regions + self._calibration_sample())

    def _calibration_sample(self) -> List[CostRequest]:
        """A seeded sample of each toolchain's joint candidates, to fit ``fusion(T)`` before the first
        search: a prior that is too pessimistic for a toolchain would otherwise keep its joint candidates
        out of every answer, so none would be measured and the prior never corrected."""
        import random

        count = self.owner.calibration
        by_toolchain: Dict[str, Dict[str, CostRequest]] = {}
        for req, parts in zip(self.requests, self.parts):
            if len(parts) > 1 and req.candidate.label != MAXIMAL:
                by_toolchain.setdefault(req.toolchain.name, {}).setdefault(req.key, req)
        rng = random.Random(self.owner.seed)
        sample: List[CostRequest] = []
        for name in sorted(by_toolchain):
            distinct = [by_toolchain[name][key] for key in sorted(by_toolchain[name])]
            sample += rng.sample(distinct, min(count, len(distinct)))
        return sample

    def _part_costs(self) -> Dict[str, Dict[int, float]]:
        """toolchain -> call node -> the cheapest finite cost of that node alone on it."""
        out: Dict[str, Dict[int, float]] = {}
        for req, parts in zip(self.requests, self.parts):
            if len(parts) != 1:
                continue
            cost = self.known.get(req.key)
            if cost is None or not math.isfinite(cost):
                continue
            table = out.setdefault(req.toolchain.name, {})
            table[parts[0]] = min(cost, table.get(parts[0], math.inf))
        return out

    def costs(self) -> List[float]:
        """Measured costs where known, else estimates from the parts (see the module)."""
        singles = self._part_costs()
        owner = self.owner
        overhead = {name: min(table.values()) for name, table in singles.items() if table}
        reference = _reference_toolchain(singles)
        ratio = {name: _median_ratio(table, singles.get(reference, {})) for name, table in singles.items()}

        def part_cost(name: str, node: int) -> float:
            table = singles.get(name, {})
            if node in table:
                return table[node]
            # Not measured alone on this toolchain (it cannot run it alone, or it failed): the
            # reference toolchain's cost scaled by this toolchain's typical ratio to it.
            other = singles.get(reference, {}).get(node)
            if other is not None and name in ratio:
                return other * ratio[name]
            values = list(table.values()) or [v for t in singles.values() for v in t.values()] or [1.0]
            return float(np.median(values))

        # fusion(T): a low quantile of the measured joint candidates' ratios.
        observed: Dict[str, List[float]] = {}
        for req, parts in zip(self.requests, self.parts):
            name = req.toolchain.name
            # Maximal regions are left out: dozens of operators save far more per part than the
            # few-operator candidates the estimates are for.
            if (len(parts) > 1 and req.key in self.known and name in overhead
                    and req.candidate.label != MAXIMAL and req.candidate.mask not in self.quantized):
                r = fusion_ratio(self.known[req.key], [part_cost(name, i) for i in parts], overhead[name])
                if r is not None:
                    observed.setdefault(name, []).append(r)
        low, high = FUSION_BOUNDS
        owner.fusion = {name: float(np.clip(np.quantile(v, FUSION_QUANTILE), low, high)) if v else PRIOR_FUSION
                        for name, v in ((n, observed.get(n, [])) for n in set(overhead) | set(observed))}
        owner.overhead = overhead
        out = []
        ratios: Dict[str, List[float]] = {}
        for req, parts in zip(self.requests, self.parts):
            name = req.toolchain.name
            part_values = [part_cost(name, i) for i in parts] or [overhead.get(name, 0.0)]
            estimate = fused_estimate(part_values, overhead.get(name, 0.0), owner.fusion.get(name, PRIOR_FUSION))
            if req.key in self.known:
                cost = self.known[req.key]
                if req.key in self.picked and len(parts) > 1 and estimate > 0 and math.isfinite(cost):
                    ratios.setdefault(name, []).append(cost / estimate)
                out.append(cost)
            else:
                out.append(estimate)
        owner.optimism = {name: float(np.clip(np.median(v), *OPTIMISM_BOUNDS))
                          for name, v in ratios.items() if len(v) >= OPTIMISM_MIN_SAMPLES}
        return out

    def corrected(self, costs: Sequence[float]) -> List[float]:
        """``costs`` (from :meth:`costs`) with each estimated joint candidate read with its toolchain's
        optimism (measured costs and parts as they are)."""
        optimism = self.owner.optimism
        return [cost if req.key in self.known or len(parts) <= 1 else cost * optimism.get(req.toolchain.name, 1.0)
                for req, parts, cost in zip(self.requests, self.parts, costs)]


def _reference_toolchain(singles: Dict[str, Dict[int, float]]) -> Optional[str]:
    """The toolchain with the most operators measured alone (TVM, usually: it runs every operator)."""
    if not singles:
        return None
    return max(sorted(singles), key=lambda name: len(singles[name]))


def _median_ratio(table: Dict[int, float], reference: Dict[int, float]) -> float:
    """Median of ``table[node] / reference[node]`` over the nodes both measured (1.0 with none)."""
    shared = [table[i] / reference[i] for i in table if i in reference and reference[i] > 0]
    return float(np.median(shared)) if shared else 1.0
