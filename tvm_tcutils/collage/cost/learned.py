"""A learned cost model: measure some candidates, predict the rest, measure where it matters.

:class:`XGBoostCostEstimator` describes every candidate by cheap features
(its toolchain, how many of each operator kind it holds, FLOPs, bytes read
and written, depth), measures a seeded sample of them with a
:class:`~.measured.MeasuredCostEstimator` (cached ones are free), fits an
XGBoost regressor of log-latency on what has been measured, and predicts the
others. It then alternates search and measuring: the candidates of the
current best partitioning that were only predicted are measured, the model is
refitted, and the search runs again, until the best partitioning is made of
measured candidates only. Candidates never on a best path are never measured.
"""
from __future__ import annotations

import logging
import math
import random
import time
import weakref
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..._tvm import tvm
from tvm import relay

from ..candidates import Candidate
from ..search import SearchResult, search_valid
from ..subgraph import IndexedGraph, bits
from .base import CostEstimator, CostRequest, cost_requests
from .measured import MeasuredCostEstimator

logger = logging.getLogger("tvm_tcutils.collage")


def _elements(ttype) -> int:
    if isinstance(ttype, relay.TupleType):
        return sum(_elements(f) for f in ttype.fields)
    return int(np.prod([int(d) for d in ttype.shape])) if ttype.shape else 1


def _bits_of(ttype) -> int:
    if isinstance(ttype, relay.TupleType):
        return sum(_bits_of(f) for f in ttype.fields)
    return _elements(ttype) * tvm.DataType(ttype.dtype).bits


def node_flops(graph: IndexedGraph, index: int) -> float:
    """Multiply-adds x 2 of an operator call (one op per output element for the others).

    Examples
    --------
    >>> x = relay.var("x", shape=(4, 8)); w = relay.var("w", shape=(16, 8))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.dense(x, w))))
    >>> node_flops(IndexedGraph(mod["main"]), 2)
    1024.0
    """
    node = graph.nodes[index]
    if node.kind != "call":
        return 0.0
    out = _elements(node.expr.checked_type)
    name = node.op_name
    args = node.expr.args
    if name in ("nn.dense", "nn.matmul"):
        return 2.0 * out * int(args[0].checked_type.shape[-1])
    if name == "nn.batch_matmul":
        return 2.0 * out * int(args[0].checked_type.shape[-1])
    if name.startswith("nn.conv") and len(args) > 1:
        weight = [int(d) for d in args[1].checked_type.shape]
        return 2.0 * out * float(np.prod(weight[1:]))
    return float(out)


class _NodeSizes:
    """FLOPs and bits of every node of one graph, computed once.

    Features and additive terms of tens of thousands of candidates (Inception-v3:
    about 44,000) sum these over their nodes; reading shapes through TVM's FFI for
    each candidate again took minutes per search.
    """

    _by_graph: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, graph: IndexedGraph):
        self.flops = [node_flops(graph, i) for i in range(len(graph.nodes))]
        self.bits = [_bits_of(node.expr.checked_type) for node in graph.nodes]

    @classmethod
    def of(cls, graph: IndexedGraph) -> "_NodeSizes":
        sizes = cls._by_graph.get(graph)
        if sizes is None:
            sizes = cls._by_graph[graph] = cls(graph)
        return sizes


def features(req: CostRequest, toolchains: Sequence[str], vocabulary: Sequence[str]) -> List[float]:
    """The feature vector of a request: toolchain one-hot, op-kind counts, log FLOPs/bytes, size, depth.

    Examples
    --------
    >>> features  # doctest: +ELLIPSIS
    <function features at ...>
    """
    graph, mask = req.graph, req.candidate.mask
    sizes = _NodeSizes.of(graph)
    counts = dict.fromkeys(vocabulary, 0)
    flops = 0.0
    for i in bits(mask):
        name = graph.nodes[i].op_name
        if name in counts:
            counts[name] += 1
        flops += sizes.flops[i]
    moved = sum(sizes.bits[i] for i in graph.inputs_of(mask))
    moved += sum(sizes.bits[i] for i in graph.outputs_of(mask))
    onehot = [1.0 if req.toolchain.name == t else 0.0 for t in toolchains]
    return onehot + [float(counts[v]) for v in vocabulary] + [
        math.log1p(flops), math.log1p(moved / 8.0), float(bin(mask).count("1")), float(graph.depth(mask)),
    ]


class XGBoostCostEstimator(CostEstimator):
    """Learn candidate latency from a few measurements; measure only what can change the answer.

    Parameters
    ----------
    measured : MeasuredCostEstimator
        Does the measuring (and caching).
    sample : float
        Fraction of the not-yet-cached candidates measured up front (at least
        ``min_sample``, raised to cover each (toolchain, op kind) once with its
        smallest candidate), then a random draw (with ``seed``) for the rest.
    min_sample : int
        Smallest initial sample.
    max_sample : int
        Largest initial sample, the covering part included. The sample only
        seeds the model (each round then measures what the current answer
        uses); without a cap a model with tens of thousands of distinct
        candidates (Inception-v3: about 32,000) would measure 1,600 up front.
    max_rounds : int
        Search / measure rounds at most.
    tolerance : float
        Stop once the model's best answer (measured and predicted costs) is
        within this fraction of the best fully measured answer so far: more
        rounds could gain at most that much by the model's own account.
    patience : int
        Also stop after this many rounds in a row that measured a new answer
        without improving the best fully measured one by ``tolerance``; a model
        that stays optimistic about unmeasured candidates (tens of thousands on
        Inception-v3) would otherwise measure round after round for nothing.
        Either way the best fully measured answer is returned.

    Examples
    --------
    >>> est = XGBoostCostEstimator(MeasuredCostEstimator(cache_dir=""), sample=0.05)
    """

    def __init__(self, measured: MeasuredCostEstimator, sample: float = 0.05, min_sample: int = 8,
                 max_rounds: int = 30, seed: int = 0, max_sample: int = 256,
                 tolerance: float = 0.01, patience: int = 3):
        if not isinstance(measured, MeasuredCostEstimator):
            raise TypeError(f"measured must be a MeasuredCostEstimator, got {type(measured).__name__}")
        if not 0 < sample <= 1:
            raise ValueError(f"sample must be in (0, 1], got {sample}")
        if not 1 <= min_sample <= max_sample:
            raise ValueError(f"need 1 <= min_sample <= max_sample, got min_sample={min_sample}, "
                             f"max_sample={max_sample}")
        if not 0 <= tolerance < 1:
            raise ValueError(f"tolerance must be in [0, 1), got {tolerance}")
        if max_rounds < 1 or patience < 1:
            raise ValueError(f"max_rounds and patience must be >= 1, got max_rounds={max_rounds}, "
                             f"patience={patience}")
        self.measured = measured
        self.tolerance = tolerance
        self.patience = patience
        self.sample = sample
        self.min_sample = min_sample
        self.max_sample = max_sample
        self.max_rounds = max_rounds
        self.seed = seed
        self.stats = {"candidates": 0, "measured": 0, "predicted": 0, "rounds": 0, "stop": ""}
        self._rows = None  # features of the last request list (the search loop reuses it)

    def whole_model_timer(self):
        """Whole models are timed by the measuring estimator."""
        return self.measured.whole_model_timer()

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        """Costs of ``requests``: measured where cached or sampled, predicted elsewhere."""
        known = self._initial(list(requests))
        return self._predict(list(requests), known)

    def search(self, graph: IndexedGraph, cands: Sequence[Candidate],
               toolchains: Dict, deadline: Optional[float] = None) -> Tuple[SearchResult, List[float]]:
        """Alternate search and measuring; return the best fully measured answer.

        Each round searches with measured costs where known and predictions
        elsewhere, then measures the answer's predicted candidates, which makes
        that answer fully measured. Rounds end when an answer needs no new
        measurement, when the model cannot promise ``tolerance`` more, after
        ``patience`` rounds without such a gain, after ``max_rounds``, or at
        ``deadline`` (a ``time.perf_counter()`` value) once an answer is measured.
        """
        index = [k for k, c in enumerate(cands) if not c.host]
        requests = cost_requests(graph, cands, index, toolchains)
        position = {cands[k]: n for n, k in enumerate(index)}
        known = self._initial(requests)
        best: Optional[SearchResult] = None
        stale, stop = 0, "max_rounds"
        for round_ in range(self.max_rounds):
            self.stats["rounds"] = round_ + 1
            costs = self._costs(cands, index, self._predict(requests, known))
            result = search_valid(graph, cands, costs, toolchains)
            todo = [requests[position[c]] for c in result.chosen if not c.host]
            todo = [r for r in todo if r.key not in known]
            if not todo:
                best, stop = self._better(best, result), "measured"
                break
            if best is not None and result.cost >= best.cost * (1 - self.tolerance):
                stop = "tolerance"
                break
            if deadline is not None and best is not None and time.perf_counter() >= deadline:
                stop = "deadline"
                break
            self._measure(todo, known)
            # The answer is fully measured now: its true (estimated-alone) cost.
            measured = self._priced(result, [known[requests[position[c]].key] if not c.host else x
                                             for c, x in zip(result.chosen, result.costs)])
            previous = best
            best = self._better(best, measured)
            gained = previous is None or best.cost < previous.cost * (1 - self.tolerance)
            stale = 0 if gained else stale + 1
            if stale >= self.patience:
                stop = "patience"
                break
        self.stats["stop"] = stop
        # Candidates never measured keep their last predictions (the report shows them).
        costs = self._costs(cands, index, self._predict(requests, known))
        measured_count = sum(1 for r in requests if r.key in known)
        self.stats["measured"] = measured_count
        self.stats["predicted"] = len(requests) - measured_count
        logger.info("learned costs: %d of %d candidates measured or cached in %d rounds (stopped: %s)",
                    measured_count, len(requests), self.stats["rounds"], stop)
        return best, costs

    @staticmethod
    def _costs(cands, index, values) -> List[float]:
        costs = [0.0] * len(cands)
        for k, cost in zip(index, values):
            costs[k] = cost
        return costs

    @staticmethod
    def _priced(result: SearchResult, costs: List[float]) -> SearchResult:
        return SearchResult(list(result.chosen), list(costs), float(sum(costs)), result.states)

    @staticmethod
    def _better(best: Optional[SearchResult], other: SearchResult) -> SearchResult:
        return other if best is None or other.cost < best.cost else best

    # -- internals ---------------------------------------------------------
    def _measure(self, requests: List[CostRequest], known: Dict[str, float]) -> None:
        for req, cost in zip(requests, self.measured.estimate(requests)):
            known[req.key] = cost

    def _initial(self, requests: List[CostRequest]) -> Dict[str, float]:
        self.stats["candidates"] = len(requests)
        known: Dict[str, float] = {}
        fresh = []
        for req in requests:
            cost = self.measured.lookup(req)
            if cost is None:
                fresh.append(req)
            else:
                known[req.key] = cost
        # One sample per distinct structure: candidates repeated across layers share a key.
        by_key: Dict[str, CostRequest] = {}
        for req in fresh:
            by_key.setdefault(req.key, req)
        distinct = sorted(by_key.values(), key=lambda r: (r.toolchain.name, r.key))
        rng = random.Random(self.seed)
        covering = _covering_sample(distinct)
        drawn = int(math.ceil(self.sample * len(distinct)))
        wanted = min(self.max_sample, max(self.min_sample, drawn, len(covering)))
        covering = covering[:wanted]
        taken = {c.key for c in covering}
        rest = [r for r in distinct if r.key not in taken]
        chosen = covering + rng.sample(rest, max(0, min(len(rest), wanted - len(covering))))
        if chosen:
            self.measured.estimate(chosen)
        for req in fresh:
            cost = self.measured.lookup(req)
            if cost is not None:
                known[req.key] = cost
        return known

    def _predict(self, requests: List[CostRequest], known: Dict[str, float]) -> List[float]:
        cache_key = id(requests[0]) if requests else None
        if self._rows is None or self._rows[0] != cache_key:
            toolchains = sorted({r.toolchain.name for r in requests})
            vocabulary = sorted({n for r in requests for n in r.ops})
            rows = np.array([features(r, toolchains, vocabulary) for r in requests], dtype="float64")
            design = np.array([additive_terms(r, vocabulary) for r in requests], dtype="float64")
            self._rows = (cache_key, rows, design)
        _, rows, design = self._rows
        train = [n for n, r in enumerate(requests) if r.key in known and math.isfinite(known[r.key])]
        baseline = _additive_baseline(requests, design, train, [known.get(r.key) for r in requests])
        guesses = baseline
        if len(train) >= 4:
            import xgboost

            # Boost on top of the additive baseline (its log is the margin): trees learn the
            # corrections (fusion, shapes, caches) from few samples. The core API: the
            # scikit-learn wrapper would need scikit-learn installed.
            target = np.log(np.array([max(known[requests[n].key], 1e-6) for n in train]))
            margin = np.log(baseline)
            train_set = xgboost.DMatrix(rows[train], label=target, base_margin=margin[train])
            model = xgboost.train(
                {"max_depth": 3, "eta": 0.1, "seed": self.seed, "nthread": 1, "objective": "reg:squarederror"},
                train_set, num_boost_round=100,
            )
            guesses = np.exp(model.predict(xgboost.DMatrix(rows, base_margin=margin)))
        return [known[r.key] if r.key in known else float(guesses[n]) for n, r in enumerate(requests)]


def _covering_sample(requests: Sequence[CostRequest]) -> List[CostRequest]:
    """For each (toolchain, op kind), the smallest candidate with that op kind (ties by key).

    A random sample can miss an op kind of a toolchain altogether; the additive
    baseline then guesses its cost from the other kinds, and a toolchain that is
    fast at exactly that kind is never tried (an encoder's GELU/softmax/batch_matmul
    pieces on onnxruntime). Small candidates are cheap to measure and price one
    kind each.
    """
    smallest: Dict[tuple, CostRequest] = {}
    for req in requests:
        for op in set(req.ops):
            slot = (req.toolchain.name, op)
            held = smallest.get(slot)
            if held is None or (len(req.ops), req.key) < (len(held.ops), held.key):
                smallest[slot] = req
    unique: Dict[str, CostRequest] = {}
    for slot in sorted(smallest):
        unique.setdefault(smallest[slot].key, smallest[slot])
    return list(unique.values())


def additive_terms(req: CostRequest, vocabulary: Sequence[str]) -> List[float]:
    """Per op kind: how many calls and how many GFLOPs; then a constant (the per-partition overhead).

    Examples
    --------
    >>> additive_terms  # doctest: +ELLIPSIS
    <function additive_terms at ...>
    """
    graph = req.graph
    sizes = _NodeSizes.of(graph)
    counts = dict.fromkeys(vocabulary, 0.0)
    flops = dict.fromkeys(vocabulary, 0.0)
    for i in bits(req.candidate.mask):
        name = graph.nodes[i].op_name
        if name in counts:
            counts[name] += 1.0
            flops[name] += sizes.flops[i] * 1e-9
    return [counts[v] for v in vocabulary] + [flops[v] for v in vocabulary] + [1.0]


def _additive_baseline(requests, design: np.ndarray, train: List[int], known: List) -> np.ndarray:
    """Ridge fit, per toolchain, of latency as a sum of per-op-kind and per-GFLOP costs plus an overhead."""
    out = np.ones(len(requests))
    names = [r.toolchain.name for r in requests]
    for toolchain in sorted(set(names)):
        rows = [n for n, name in enumerate(names) if name == toolchain]
        fit = [n for n in train if names[n] == toolchain]
        if not fit:
            # Nothing measured for this toolchain yet: a size-proportional guess.
            out[rows] = [max(design[n][:-1].sum(), 1.0) * 0.01 for n in rows]
            continue
        a = design[fit]
        y = np.array([known[n] for n in fit])
        ridge = 1e-3 * max(float(np.trace(a.T @ a)), 1e-9) / a.shape[1]
        weights = np.linalg.solve(a.T @ a + ridge * np.eye(a.shape[1]), a.T @ y)
        floor = 0.1 * float(y.min()) if y.min() > 0 else 1e-6
        out[rows] = np.maximum(design[rows] @ weights, floor)
    return out
