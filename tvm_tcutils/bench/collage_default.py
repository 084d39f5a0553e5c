"""Collage's default search on real models: how long it takes from an empty cache, and how good it is.

Used by ``scripts/bench_collage_default.py``. Three measurements per model:

* :func:`search_row`: ``collage.partition`` with its defaults (the staged estimator, validation,
  the final comparison) and an empty cost cache: seconds per phase, candidates measured and
  estimated, the answer and its ratio to the fastest toolchain alone.
* :func:`priced_against_full`: with a cache in which *every* candidate was measured (a
  measure-everything search), the staged answer priced by those measurements against the
  measure-everything search's optimum (the search's own metric: sums of candidates measured alone).
* :func:`estimate_error`: the staged estimator's estimates of joint candidates made from the parts
  alone (what it knows before its first search) against their measurements in that cache.

Example
-------
>>> from tvm_tcutils.bench.collage_default import original_file
>>> original_file("light_squeezenet").endswith(".onnx")
True
"""
from __future__ import annotations

import math
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .models import light_model

#: Suffix of a model name that asks for onnxruntime's ``quantize_static`` QDQ per-channel file of it.
QDQ_SUFFIX = "-qdq"


def load(name: str):
    """``(mod, params)`` of a benchmark model: ``light_<name>`` from the onnx package; ``<zoo name>-qdq``,
    onnxruntime's QDQ per-channel quantization of that built-in ONNX model (as a user has it: the file,
    imported); else :func:`tvm_tcutils.bench.models.load`.

    Examples
    --------
    >>> load("mlp")[0]["main"].params[0].name_hint
    'data'
    """
    return _loaded(name)[:2]


def _loaded(name: str):
    """``(mod, params, the user's file or None)`` of :func:`load`: the file is found once (a ``-qdq`` model's
    lookup reads the float file)."""
    from ..models import load_model
    from .models import load as load_named

    path = original_file(name)
    return (*(load_model(path) if path else load_named(name)), path)


def original_file(name: str) -> Optional[str]:
    """The ONNX file a user of the benchmark model ``name`` has (what :func:`load` imports): a light model's
    or a ``-qdq`` file, which the final comparison also times each ONNX runtime on, as the CLI does with a
    file; None for a model the zoo builds in Relay.

    Examples
    --------
    >>> original_file("mlp") is None, original_file("light_squeezenet").endswith(".onnx")
    (True, True)
    """
    if name.startswith("light_"):
        return light_model(name[len("light_"):])
    if name.endswith(QDQ_SUFFIX):
        from .int8 import ort_quantized

        return ort_quantized(name[:-len(QDQ_SUFFIX)])["qdq"]
    return None


def search_row(model: str, toolchains: str, cache_dir: str, estimator: str = "staged",
               time_budget_s: Optional[float] = None, error_budget: Optional[float] = None,
               answer_path: Optional[str] = None) -> dict:
    """Run ``collage.partition`` on ``model`` as a user would (defaults, ``estimator``), from ``cache_dir``;
    the final comparison also times each ONNX runtime on the user's file where there is one
    (:func:`original_file`).

    ``estimator``: ``"staged"`` (the default one) or ``"measured"`` (measure every candidate);
    ``error_budget``: passed on (lossy toolchains placed under it; the row then has the checks);
    ``answer_path``: where to save the answer's module (``result.mod``, constants inside), for
    :func:`answers_side_by_side`.
    """
    from ..collage import partition
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..collage.cost.staged import StagedCostEstimator

    start = time.perf_counter()
    mod, params, original = _loaded(model)
    # The command line imports the file first: its time is part of what a user waits for.
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    measured = MeasuredCostEstimator(cache_dir=cache_dir, progress=False)
    est = StagedCostEstimator(measured) if estimator == "staged" else measured
    try:
        result = partition(mod, params, toolchains, est, progress=False, time_budget_s=time_budget_s,
                           error_budget=error_budget, original=original)
        seconds = time.perf_counter() - start
        layers = layer_costs(result.graph, toolchains, measured)  # after the clock: not part of the search
        if answer_path:
            from ..models import save_model

            save_model(answer_path, result.mod)
    finally:
        measured.close()
    final = result.final
    row = {
        "model": model, "estimator": estimator, "toolchains": toolchains, "seconds": round(seconds, 1),
        "load_s": round(load_s, 1), "phases": {k: round(v, 1) for k, v in result.seconds.items()},
        "counts": dict(result.counts),
        "answer": result.answer, "partial": result.partial, "partial_reason": result.partial_reason,
        "estimated_ms": result.estimated_ms, "mix_measured_ms": result.mix_measured_ms,
        "chosen": _chosen_of(result), "stats": {k: v for k, v in getattr(est, "stats", {}).items()
                                                 if isinstance(v, (int, float, str, dict))},
    }
    row["layers"] = layers
    row["error_budget"] = error_budget
    row["errors"] = dict(result.errors)
    row["budget_steps"] = [str(step) for step in result.budget_steps]
    row["precisions"] = _precisions(result.partitions)
    row["mix_precisions"] = _precisions(result.mix_partitions)
    row["unreachable"] = {name: dict(ops) for name, ops in result.unreachable.items()}
    row["left_out"] = dict(result.left_out)
    if final is not None:
        row["timings_ms"] = {name: t.median_ms for name, t in final.timings.items() if t.samples_ms}
        row["best_single"] = final.best_single
        row["compare_rounds"], row["compare_timing_s"] = final.rounds, round(final.seconds, 1)
        row["compare_stopped"] = final.stopped
        if final.ratio is not None:
            row["answer_vs_best_single"] = [final.ratio.value, final.ratio.low, final.ratio.high]
            # The ratio's other side: the best single against the mix, else the runner-up (no mix timed).
            row["ratio_of"] = final.best_single if final.mix is not None else min(
                (name for name, t in final.timings.items() if t.samples_ms and name != final.best_single),
                key=lambda name: final.timings[name].median_ms, default=None)
            row["confidence"] = final.ratio.confidence
    return row


def _answer_cells(row: dict) -> Tuple[str, Optional[list]]:
    """The answer's median ms (``-`` when not timed) and the ``[ratio, low, high]`` to the best single."""
    answer_ms = row.get("timings_ms", {}).get("collage" if row["answer"] == "collage" else row["answer"])
    return ("-" if answer_ms is None else f"{answer_ms:.3f}"), row.get("answer_vs_best_single")


def _table(columns: Sequence[str], rows: Sequence[dict], first: Callable[[dict], str],
           cells: Callable[[dict], List[str]]) -> str:
    """A markdown table: a row's ``cells``, or for a search that failed its model, ``first(row)`` and the error."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        if "error" in row:
            lines.append(f"| {row['model']} | {first(row)} | failed: {row['error']} |" + " |" * (len(columns) - 3))
        else:
            lines.append("| " + " | ".join(cells(row)) + " |")
    return "\n".join(lines)


def _precisions(partitions) -> Dict[str, Dict[str, int]]:
    """Partitions by toolchain and what they compute in: ``{"openvino-bf16": {"bf16": 3}, ...}``."""
    out: Dict[str, Dict[str, int]] = {}
    for p in partitions:
        out.setdefault(p.toolchain, {}).setdefault(p.precision, 0)
        out[p.toolchain][p.precision] += 1
    return out


def precision_markdown(rows: Sequence[dict]) -> str:
    """The docs' table of searches under error budgets (:func:`search_row` rows with ``error_budget``).

    Examples
    --------
    >>> row = {"model": "m", "error_budget": 0.01, "answer": "collage", "seconds": 30.0,
    ...        "timings_ms": {"collage": 1.0, "tvm alone": 2.0}, "best_single": "tvm alone",
    ...        "answer_vs_best_single": [0.5, 0.4, 0.6], "errors": {"collage": 0.002},
    ...        "precisions": {"tvm": {"f32": 2}, "tvm-fastmath": {"f32 fast math": 1}}, "budget_steps": ["a", "b"]}
    >>> precision_markdown([row]).splitlines()[2]  # doctest: +ELLIPSIS
    '| m | 0.01 | 30 | collage | 1.000 | x0.500 [0.400, 0.600] of tvm alone | 0.002 | tvm: 2 f32; ...'
    """
    def cells(row: dict) -> List[str]:
        budget = "none" if row.get("error_budget") is None else f"{row['error_budget']:g}"
        answer_ms, ratio = _answer_cells(row)
        versus = (f"x{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] of {row.get('ratio_of', row.get('best_single'))}"
                  if ratio else "-")
        error = row.get("errors", {}).get("collage" if row["answer"] == "collage" else row["answer"])
        kinds = "; ".join(f"{tc}: " + ", ".join(f"{n} {prec}" for prec, n in precs.items())
                          for tc, precs in row.get("precisions", {}).items())
        return [row["model"], budget, f"{row['seconds']:.0f}", row["answer"], answer_ms, versus,
                "-" if error is None else f"{error:.3g}", kinds, str(len(row.get("budget_steps", [])))]

    return _table(("model", "error budget", "search s", "answer", "answer ms", "vs best single [95 %]",
                   "error of the answer", "partitions (toolchain: count, runs in)", "mixes checked"),
                  rows, lambda row: str(row.get("error_budget")), cells)


#: Operators a per-layer table has a row for.
LAYER_OPS = ("nn.conv2d", "nn.dense", "nn.batch_matmul", "nn.matmul")


def layer_costs(graph, toolchains: str, measured) -> List[dict]:
    """Per heavy layer (:data:`LAYER_OPS`), what each toolchain costs for that layer alone (crossings not
    counted), measured now where the search did not.

    A layer's candidate on a toolchain is its quantized region when the model has one (the layer with
    all its ``qnn.dequantize`` inputs, its epilogue and its ``qnn.quantize``, as
    :class:`~tvm_tcutils.collage.rules.QuantizedRegionRule` finds it: in a QDQ model only such a region
    runs in 8 bits), else the layer alone.
    """
    from ..collage.rules import QUANTIZED

    from ..collage.candidates import enumerate_candidates
    from ..collage.cost.base import cost_requests
    from ..collage.subgraph import bits
    from ..collage.toolchains import resolve

    tcs = {tc.name: tc for tc in resolve(toolchains)}
    cands = enumerate_candidates(graph, list(tcs.values()))
    index = [k for k, c in enumerate(cands) if not c.host]
    heavy = {i for i, node in enumerate(graph.nodes) if node.kind == "call" and node.op_name in LAYER_OPS}
    regions = {c.mask for c in cands if c.label == QUANTIZED}
    chosen: Dict[Tuple[int, str], object] = {}
    for req in cost_requests(graph, cands, index, tcs):
        layers = [i for i in bits(req.candidate.mask) if i in heavy]
        if len(layers) != 1 or not (req.candidate.mask in regions or len(req.ops) == 1):
            continue
        rank = (req.candidate.mask not in regions,)  # the region first, else the layer alone
        slot = (layers[0], req.toolchain.name)
        held = chosen.get(slot)
        if held is None or rank < held[0]:
            chosen[slot] = (rank, req)
    requests = [req for _, req in chosen.values()]
    costs = measured.estimate(requests) if requests else []
    by_layer: Dict[int, Dict[str, Tuple[float, int, bool]]] = {}
    for ((layer, name), (rank, req)), cost in zip(chosen.items(), costs):
        if cost is not None and math.isfinite(cost):
            by_layer.setdefault(layer, {})[name] = (cost, len(req.ops), not rank[0])
    rows = []
    for i in sorted(by_layer):
        node = graph.nodes[i]
        entries = by_layer[i]
        rows.append({"node": i, "op": node.op_name, "shape": [int(d) for d in node.expr.checked_type.shape],
                     "ms": {name: round(v[0], 5) for name, v in sorted(entries.items())},
                     "ops_in_candidate": {name: v[1] for name, v in sorted(entries.items())},
                     "quantized_region": {name: v[2] for name, v in sorted(entries.items())}})
    return rows


def layer_summary(layers: Sequence[dict]) -> Dict[str, dict]:
    """Per toolchain: the layers it is fastest on, its sum over the layers every toolchain has, and the
    sum of the per-layer minima (what a mix with free crossings would get on those layers).

    Examples
    --------
    >>> layer_summary([{"ms": {"a": 1.0, "b": 2.0}}, {"ms": {"a": 3.0, "b": 1.0}}])["b"]
    {'fastest_on': 1, 'sum_ms': 3.0, 'layers': 2, 'best_per_layer_ms': 2.0}
    """
    names = sorted({name for row in layers for name in row["ms"]})
    common = [row for row in layers if all(name in row["ms"] for name in names)]
    minima = sum(min(row["ms"].values()) for row in common)
    out = {}
    for name in names:
        out[name] = {"fastest_on": sum(1 for row in common if min(row["ms"], key=row["ms"].get) == name),
                     "sum_ms": round(sum(row["ms"][name] for row in common), 4), "layers": len(common),
                     "best_per_layer_ms": round(minima, 4)}
    return out


def _chosen_of(result) -> list:
    """The search's chosen candidates (host glue included), JSON-ready."""
    return [(c.toolchain, hex(c.mask), c.label, [[n, hex(m)] for n, m in c.composites], c.host)
            for c in result.chosen]


def _graph_and_requests(model: str, toolchains: str):
    from ..collage.candidates import enumerate_candidates
    from ..collage.cost.base import cost_requests
    from ..collage.driver import prepare
    from ..collage.subgraph import IndexedGraph
    from ..collage.toolchains import resolve

    mod, params = load(model)
    graph = IndexedGraph(prepare(mod, params)["main"])
    tcs = {tc.name: tc for tc in resolve(toolchains)}
    cands = enumerate_candidates(graph, list(tcs.values()))
    index = [k for k, c in enumerate(cands) if not c.host]
    return graph, tcs, cands, index, cost_requests(graph, cands, index, tcs)


def priced_against_full(model: str, toolchains: str, full_cache: str, chosen: Sequence) -> dict:
    """The staged answer (``chosen``, from :func:`search_row`) priced by a measure-everything cache,
    against that cache's optimum: ``{"staged_ms", "full_ms", "ratio"}``.
    """
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..collage.search import search_valid

    graph, tcs, cands, index, requests = _graph_and_requests(model, toolchains)
    measured = MeasuredCostEstimator(cache_dir=full_cache, progress=False)
    try:
        costs = [0.0] * len(cands)
        missing = 0
        for k, req in zip(index, requests):
            cost = measured.lookup(req)
            missing += cost is None
            costs[k] = math.inf if cost is None else cost
        full = search_valid(graph, cands, costs, tcs)
        position = {(c.toolchain, hex(c.mask), c.label): k for k, c in enumerate(cands)}
        staged = sum(costs[position[(t, m, lab)]] for t, m, lab, _, host in chosen if not host)
    finally:
        measured.close()
    return {"staged_ms": staged, "full_ms": full.cost, "ratio": staged / full.cost, "unmeasured": missing}


def answers_side_by_side(paths: Mapping[str, str], rounds: int = 9, confidence: float = 0.95) -> dict:
    """Two searches' answers (modules saved by :func:`search_row`) built here and timed in turns.

    Answers of two searches run in two processes differ by the 2-7 % a module moves between processes
    on these VMs; timed side by side they are comparable. ``paths``: two names -> saved modules.
    Returns ``{"ms": {name: median}, "ratio": [value, low, high]}`` (first / second, interval at
    ``confidence``).
    """
    from ..measure import Timer, interleave, ratio
    from ..models import load_model

    if len(paths) != 2:
        raise ValueError(f"answers_side_by_side: two answers to compare, got {sorted(paths)}")
    timers = {name: Timer(*load_model(path), repeat=5, warmup=3, min_repeat_ms=100) for name, path in paths.items()}
    try:
        timed = interleave({name: timer.sample for name, timer in timers.items()}, rounds)
    finally:
        for timer in timers.values():
            timer.close()
    first, second = (timed[name] for name in paths)
    r = ratio(first, second, confidence)
    return {"ms": {name: t.median_ms for name, t in timed.items()}, "ratio": [r.value, r.low, r.high],
            "rounds": rounds}


def estimate_error(model: str, toolchains: str, full_cache: str) -> Dict[str, dict]:
    """Per toolchain: the staged estimator's estimates of joint candidates from the parts alone against
    their measurements in ``full_cache`` (a measure-everything cache).

    Returns ``{toolchain: {"n", "median_abs_log_error", "within_25_percent", "median_ratio"}}`` where
    ratio = estimate / measurement, over candidates with 2 or more operators that are not maximal regions.
    """
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..collage.cost.staged import StagedCostEstimator, _PartsModel
    from ..collage.rules import MAXIMAL

    graph, _, _, _, requests = _graph_and_requests(model, toolchains)
    measured = MeasuredCostEstimator(cache_dir=full_cache, progress=False)
    try:
        truth = {req.key: measured.lookup(req) for req in requests}
        est = StagedCostEstimator(measured)
        parts_model = _PartsModel(graph, requests, est)
        # What the estimator knows before its first search: the parts and the maximal regions.
        parts_model.known = {r.key: truth[r.key] for r, p in zip(requests, parts_model.parts)
                             if (len(p) <= 1 or r.candidate.label == MAXIMAL) and truth[r.key] is not None}
        estimates = parts_model.costs()
    finally:
        measured.close()
    by_toolchain: Dict[str, List[float]] = {}
    seen = set()
    for req, parts, value in zip(requests, parts_model.parts, estimates):
        real = truth[req.key]
        if len(parts) < 2 or req.candidate.label == MAXIMAL or req.key in seen or real is None:
            continue
        seen.add(req.key)
        if math.isfinite(real) and real > 0 and math.isfinite(value) and value > 0:
            by_toolchain.setdefault(req.toolchain.name, []).append(value / real)
    out = {}
    for name, ratios in sorted(by_toolchain.items()):
        logs = np.abs(np.log(ratios))
        out[name] = {"n": len(ratios), "median_abs_log_error": float(np.median(logs)),
                     "within_25_percent": float(np.mean(logs <= math.log(1.25))),
                     "median_ratio": float(np.median(ratios))}
    return out


def markdown(rows: Sequence[dict]) -> str:
    """The docs' table of :func:`search_row` rows (and of the measure-everything rows, when present).

    Examples
    --------
    >>> table = markdown([{"model": "m", "estimator": "staged", "seconds": 12.0, "phases": {"estimate": 9.0},
    ...                     "counts": {"candidates": 40, "measured": 10}, "answer": "tvm alone", "partial": False,
    ...                     "best_single": "tvm alone", "timings_ms": {"tvm alone": 1.0}}])
    >>> table.splitlines()[2]
    '| m | staged | 12 | 9 / - / - | 40 | 10 | tvm alone | 1.000 | 1.000 (tvm alone) | - |'
    """
    def cells(row: dict) -> List[str]:
        phases = row.get("phases", {})
        split = " / ".join(f"{phases[k]:.0f}" if k in phases else "-" for k in ("estimate", "validate", "compare"))
        timings = row.get("timings_ms", {})
        answer_ms, ratio = _answer_cells(row)
        best = row.get("best_single")
        return [row["model"], row["estimator"], f"{row['seconds']:.0f}", split,
                str(row["counts"].get("candidates", "-")), str(row["counts"].get("measured", "-")),
                row["answer"] + (" (partial)" if row.get("partial") else ""), answer_ms,
                f"{timings[best]:.3f} ({best})" if best in timings else "-",
                f"x{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}]" if ratio else "-"]

    return _table(("model", "estimator", "search s", "estimate / validate / compare s", "candidates", "measured",
                   "answer", "answer ms", "best single ms", "vs best single [95 %]"),
                  rows, lambda row: row["estimator"], cells)
