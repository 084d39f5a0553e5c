"""The Collage driver: prepare, enumerate candidates, estimate, search, outline.

:class:`CollagePartitioner` is a Relay module pass (usable in
``tvm.transform.Sequential``); :func:`partition` and :func:`build` wrap it.
The result is an ordinary IRModule in which every partition chosen for a
BYOC-style toolchain is a global function carrying ``Compiler``,
``Primitive`` and ``global_symbol`` (as ``PartitionGraph`` leaves them), and
everything chosen for TVM stays in ``main``. ``relay.build`` /
``relay.vm.compile`` build it as is, also after ``models.save_model`` and
``models.load_model``, with no new search.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .._compat import fold_constant_numpy_first, numpy_folds_after_alter_layout
from .._tvm import host_target, tvm
from ..measure import error_line, tuning_log_scope
from ..progress import ProgressArg, ProgressUpdate, Reporter, check_progress  # noqa: F401 (ProgressUpdate: API)
from tvm import relay

from . import arguments
from .candidates import Candidate, enumerate_candidates
from .outline import outline_annotated
from .cost.base import CostEstimator, cost_requests
from .search import NoCoverError, SearchResult, border_kb, crossing_costs, search, search_valid
from .subgraph import IndexedGraph
from .toolchains import TVM, Toolchain, resolve, tvm_toolchain
from .precision import ErrorCheck, check_sample_inputs, check_singles, fit_budget
from .validate import (
    EQUIVALENCE, FinalAnswer, Validation, final_comparison, greedy_answers, outline_chosen, whole_model_sampler,
)

logger = logging.getLogger("tvm_tcutils.collage")

ToolchainSpec = Union[None, str, Sequence[Union[str, Toolchain]]]


@dataclasses.dataclass
class Partition:
    """One chosen partition, as reported in tables."""

    toolchain: str
    ops: List[str]
    estimated_ms: float
    function: Optional[str]
    label: str
    #: Kilobytes of tensors crossing the partition's border (inputs from other partitions or the
    #: model's inputs, and outputs), constants left out: what a crossing to another toolchain moves.
    border_kb: float = math.nan
    #: What it computes in: ``int8`` where it holds quantized operators, else its toolchain's
    #: precision (``f32``, ``bf16``, ``f32 fast math``).
    precision: str = "f32"


@dataclasses.dataclass
class CollageResult:
    """What a Collage run produced.

    Attributes
    ----------
    mod : IRModule
        The partitioned module.
    params : dict
        Parameters still free in ``mod`` (the ones given were bound as constants).
    partitions : list of Partition
        The chosen partitions (host glue left out), in dataflow order.
    estimated_ms : float
        Sum of the chosen partitions' estimated latencies.
    single_toolchain_ms : dict
        Estimated latency when only TVM, or TVM plus one other toolchain, may be used.
    candidates, states : int
        How many candidates were enumerated and how many search states expanded.
    seconds : dict
        Time spent enumerating, estimating and searching.
    graph : IndexedGraph
        The prepared ``main`` the partitions refer to.
    chosen : list of Candidate
        The chosen candidates, host glue included.
    prepared : IRModule
        The module as partitioned (parameters bound, constants folded).
    measured_ms : float or None
        End-to-end latency of ``mod`` when the estimator measures whole models.
    trials : list of (str, float, float)
        Partitionings built and timed whole during validation: label,
        estimated ms, measured ms, one after the other.
    side_by_side : list of (str, float, float)
        The distinct partitionings of ``trials`` timed again round-robin in
        one process (label, estimated ms, measured ms); the fastest of these
        is Collage's mix.
    answer : str
        What ``mod`` is: ``"collage"`` (the mix) or a single toolchain's
        whole-model build (``"tvm alone"``, ``"ort alone"``, ...), see ``final``.
    final : FinalAnswer or None
        The final comparison of the mix with every single toolchain, timed in
        interleaved rounds (None: not run, see ``compare_single``).
    counts : dict
        ``candidates`` enumerated, ``host`` glue among them (free),
        ``costed`` (the rest: the total of the progress bar's estimate phase),
        and the estimator's own counts for this run (``cached``, ``measured``,
        ``failed``, ``predicted`` where it keeps them).
    partial : bool
        The time budget ended first: ``mod`` is the best valid partitioning
        found by then (see ``partial_reason``).
    partial_reason : str
        What the budget cut short.
    not_compared : str
        Why the final comparison did not run ("" when it did).
    mix_partitions : list of Partition
        The search's mix (with estimates), whatever the answer.
    mix_measured_ms : float or None
        The mix timed whole by validation.
    error_budget : float or None
        The largest relative error of the outputs allowed (see :mod:`.precision`).
    errors : dict of str to float
        Relative error of the outputs against the exact model on the sample
        inputs, of each competitor checked (``"collage"``: the mix; lossy
        toolchains alone); nan: not checked.
    budget_steps : list of BudgetStep
        The mixes checked against the error budget, in order.
    """

    mod: tvm.IRModule
    params: Dict
    partitions: List[Partition]
    estimated_ms: float
    single_toolchain_ms: Dict[str, float]
    candidates: int
    states: int
    seconds: Dict[str, float]
    graph: IndexedGraph
    chosen: List[Candidate]
    prepared: tvm.IRModule
    measured_ms: Optional[float] = None
    trials: List = dataclasses.field(default_factory=list)
    side_by_side: List = dataclasses.field(default_factory=list)
    answer: str = "collage"
    final: Optional[FinalAnswer] = None
    counts: Dict[str, int] = dataclasses.field(default_factory=dict)
    partial: bool = False
    partial_reason: str = ""
    not_compared: str = ""
    #: The search's mix, partition by partition with its estimates, also when the answer is a toolchain
    #: alone (then ``partitions`` are that toolchain's): what the report explains a lost mix with.
    mix_partitions: List[Partition] = dataclasses.field(default_factory=list)
    #: The mix timed whole by validation (None: not timed).
    mix_measured_ms: Optional[float] = None
    error_budget: Optional[float] = None
    errors: Dict[str, float] = dataclasses.field(default_factory=dict)
    budget_steps: List = dataclasses.field(default_factory=list)
    #: Per toolchain other than TVM: operator name -> how many of the model's calls of it no candidate of
    #: that toolchain contains (what kept it from a region: an operator its rules or export do not take).
    unreachable: Dict[str, Dict[str, int]] = dataclasses.field(default_factory=dict)
    #: Re-searched mixes validation did not build, a rival the comparison builds anyway having measured
    #: faster than their estimates: (label, estimated ms, the rival, its ms).
    not_built: List = dataclasses.field(default_factory=list)
    #: What the search added per kilobyte crossing between TVM and a partition outside it (ms; TVM's
    #: layout transforms at its candidates' borders, measured with them); 0: crossings not priced.
    crossing_ms_per_kb: float = 0.0
    #: Rivals the final comparison did not time: name -> why (a toolchain alone that is the same runtime on
    #: every operator as that runtime on the user's file, see :func:`file_twins`).
    left_out: Dict[str, str] = dataclasses.field(default_factory=dict)


def unreachable_ops(graph: IndexedGraph, cands: Sequence[Candidate],
                    toolchains: Sequence[Toolchain]) -> Dict[str, Dict[str, int]]:
    """Per toolchain other than TVM, the operators of ``graph`` none of its candidates takes, with counts.

    Examples
    --------
    >>> from tvm_tcutils.collage.toolchains import known
    >>> x = relay.var("x", shape=(1, 8, 4, 4))
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(
    ...     [x], relay.nn.relu(relay.take(x, relay.const(0), axis=1)))))["main"])
    >>> chains = [known()["tvm"], known()["ort"]]
    >>> unreachable_ops(graph, enumerate_candidates(graph, chains), chains)
    {'ort': {'take': 1}}
    """
    covered = {tc.name: 0 for tc in toolchains if not tc.is_tvm}
    for cand in cands:
        if cand.toolchain in covered:
            covered[cand.toolchain] |= cand.mask
    out: Dict[str, Dict[str, int]] = {}
    for name, mask in covered.items():
        counts: Dict[str, int] = {}
        for i, node in enumerate(graph.nodes):
            if node.kind == "call" and not mask >> i & 1:
                counts[node.op_name] = counts.get(node.op_name, 0) + 1
        if counts:
            out[name] = dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))
    return out


def partition_precision(toolchain: Optional[Toolchain], ops: Sequence[str]) -> str:
    """What a partition computes in: ``int8`` with quantized operators, else its toolchain's precision.

    Examples
    --------
    >>> from tvm_tcutils.collage.toolchains import TVM_FASTMATH
    >>> partition_precision(TVM_FASTMATH, ["nn.dense", "nn.softmax"]), partition_precision(None, ["qnn.conv2d"])
    ('f32 fast math', 'int8')
    """
    if any(op.startswith("qnn.") for op in ops):
        return "int8"
    return toolchain.precision if toolchain is not None else "f32"


def prepare(mod: tvm.IRModule, params: Optional[Dict] = None) -> tvm.IRModule:
    """The module as Collage partitions it: parameters bound, inference simplified, constants folded.

    These are passes ``relay.build`` runs first anyway (scales folded into
    the weights and adjacent constant steps merged too, in numpy, so that
    each TVM build of a part or of the whole model has no constants left to
    fold by compiling them); ``mod`` is not changed. A module that does not
    type-check, or ``params`` that are not arrays of ``main``'s parameters
    (names, shapes, dtypes), raise ``TypeError`` / ``ValueError`` naming the
    argument (see :mod:`.arguments`).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> len(prepare(mod, params)["main"].params)
    1
    """
    main = arguments.typed_main(mod)
    params = arguments.params_for(main, params)
    if params:
        main = relay.build_module.bind_params_by_name(main, params)
    new = tvm.IRModule({gv: mod[gv] for gv in mod.get_global_vars() if gv.name_hint != "main"})
    new["main"] = main
    with tvm.transform.PassContext(opt_level=3):
        new = tvm.transform.Sequential([relay.transform.InferType(), relay.transform.SimplifyInference()])(new)
        # TVM folds each call on constants by compiling it: a batch norm's scale and shift are a handful
        # (DenseNet-121: 56 s). The float elementwise ones fold exactly in numpy first.
        new = _fold_numpy_first(new)
        # The scales folded into the weights here, in numpy, to a fixed point: relay.build folds them
        # too, compiling each product and merged bias (every TVM build of DenseNet-121 whole: 50 s of 110),
        # and then finds nothing left to fold. Fewer ops for the search as well.
        for _ in range(_SCALE_FOLD_ROUNDS):
            scaled = tvm.transform.Sequential([
                relay.transform.BackwardFoldScaleAxis(), relay.transform.InferType(),
                relay.transform.ForwardFoldScaleAxis(), relay.transform.InferType()])(new)
            folded = _fold_numpy_first(scaled)
            if tvm.ir.structural_equal(folded, new):
                break
            new = folded
        return tvm.transform.Sequential([relay.transform.InferType(), relay.transform.FoldConstant()])(new)


#: Rounds of scale folding in :func:`prepare` (DenseNet-121 reaches its fixed point in 2; each is < 1 s).
_SCALE_FOLD_ROUNDS = 4


def _fold_numpy_first(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with ``main``'s constants folded and adjacent constant steps merged in numpy first (see
    :func:`~tvm_tcutils._compat.fold_constant_numpy_first`), typed."""
    main = mod["main"]
    mod = tvm.IRModule({gv: mod[gv] for gv in mod.get_global_vars() if gv.name_hint != "main"})
    mod["main"] = relay.Function(main.params, fold_constant_numpy_first(main.body, whole=True, merge_steps=True),
                                 main.ret_type, main.type_params, main.attrs)
    return relay.transform.InferType()(mod)


#: Candidates a measuring estimator is given at a time: the budget and the progress are checked between.
_CHUNK = 8


def _estimate(graph: IndexedGraph, cands: Sequence[Candidate], toolchains: Dict[str, Toolchain],
              estimator: CostEstimator, report: Reporter,
              deadline: Optional[float] = None) -> Tuple[List[float], float]:
    """Every non-host candidate's cost, crossings into toolchains outside TVM priced as the estimator's
    measurements price them, and that price (ms per KB); past ``deadline`` the rest cost ``inf`` (unknown,
    so unusable)."""
    from .cost.measured import MeasuredCostEstimator

    costs = [0.0] * len(cands)
    todo = [k for k, c in enumerate(cands) if not c.host]
    requests = cost_requests(graph, cands, todo, toolchains)
    # Only a measuring estimator is given chunks: it costs each request alone, while other estimators
    # may learn from the whole batch (XGBoost samples it).
    step = _CHUNK if isinstance(estimator, MeasuredCostEstimator) else max(len(todo), 1)
    report("estimate", 0, len(todo))
    for lo in range(0, len(todo), step):
        if deadline is not None and time.perf_counter() >= deadline:
            for k in todo[lo:]:
                costs[k] = math.inf
            break
        for k, cost in zip(todo[lo:lo + step], estimator.estimate(requests[lo:lo + step])):
            costs[k] = float(cost)
        report("estimate", min(lo + step, len(todo)), len(todo))
    crossing = estimator.crossing_ms_per_kb([r.key for r in requests]) if hasattr(estimator, "crossing_ms_per_kb") \
        else 0.0
    return [x + e for x, e in zip(costs, crossing_costs(graph, cands, toolchains, crossing))], crossing


def _tvm_only(graph: IndexedGraph, cands: Sequence[Candidate], costs: Sequence[float],
              toolchains: Dict[str, Toolchain]) -> SearchResult:
    """A cover by host glue and TVM's candidates, uncosted ones at 0: whatever the cover, everything
    stays in TVM's ``main``, so this is TVM alone (the answer when the budget ends before a search)."""
    tvm_costs = [(0.0 if math.isinf(x) else x) if c.host or toolchains[c.toolchain].is_tvm else math.inf
                 for c, x in zip(cands, costs)]
    return search_valid(graph, cands, tvm_costs, toolchains)


def simpler_answer(result: SearchResult, rivals: Sequence[SearchResult]) -> SearchResult:
    """``result``, or the cheapest of ``rivals`` (TVM alone, each toolchain's greedy partitioning) that is one
    partition (a toolchain running the whole model: its maximal region, measured) where ``result`` has
    several, or one other, and costs less by at most :data:`~.validate.EQUIVALENCE`: a mix estimated to win
    by less than that does not pay for its crossings, which the candidates' costs do not see and only
    validation's whole-model build of the mix measures (DenseNet-121: a mix 0.2 % under OpenVINO's region
    took validation 357 s, and lost); a region a little smaller than a toolchain's maximal one is timed
    beside that toolchain alone until the comparison's budget ends, since the two cannot be told apart
    (DenseNet-121 on Zen 4: 24 rounds, 60 s, x0.992 [0.983, 1.005]).

    Examples
    --------
    >>> from tvm_tcutils.collage.candidates import Candidate
    >>> mix = SearchResult([Candidate("ort", 1, "a"), Candidate("tvm", 2, "b")], [5.0, 4.96], 9.96, 0)
    >>> alone = SearchResult([Candidate("ort", 3, "maximal_region")], [10.0], 10.0, 0)
    >>> slower = SearchResult([Candidate("ort", 3, "maximal_region")], [10.2], 10.2, 0)
    >>> simpler_answer(mix, [alone]) is alone, simpler_answer(mix, [slower]) is mix
    (True, True)
    >>> region = SearchResult([Candidate("ort", 1, "a")], [9.95], 9.95, 0)
    >>> simpler_answer(region, [alone]) is alone, simpler_answer(region, [region]) is region
    (True, True)
    """
    def partitions(answer: SearchResult) -> int:
        return len(answer.non_host())

    def simpler(rival: SearchResult) -> bool:
        if partitions(rival) != 1 or partitions(result) < 1:
            return False
        return partitions(result) > 1 or not _same_partitions(rival, result)

    fewer = [r for r in rivals if math.isfinite(r.cost) and simpler(r)]
    if not fewer:
        return result
    rival = min(fewer, key=lambda r: r.cost)
    if rival.cost > result.cost * (1 + EQUIVALENCE):
        return result
    logger.info("the search's answer (%.3f ms, %d partitions) is within %g %% of one with %d (%.3f ms): the "
                "simpler one goes on", result.cost, partitions(result), 100 * EQUIVALENCE, partitions(rival),
                rival.cost)
    return rival


def _same_partitions(a: SearchResult, b: SearchResult) -> bool:
    """Whether two answers place the same operators on the same toolchains (host glue aside).

    Examples
    --------
    >>> from tvm_tcutils.collage.candidates import Candidate
    >>> one = SearchResult([Candidate("ort", 3, "maximal_region")], [10.0], 10.0, 0)
    >>> two = SearchResult([Candidate("ort", 3, "maximal_region")], [9.0], 9.0, 0)
    >>> _same_partitions(one, two), _same_partitions(one, SearchResult([Candidate("ort", 1, "a")], [5.0], 5.0, 0))
    (True, False)
    """
    def placed(answer: SearchResult):
        return sorted((c.toolchain, c.mask) for c, _ in answer.non_host())

    return placed(a) == placed(b)


def _interleaved_search(estimator: CostEstimator, graph: IndexedGraph, cands: Sequence[Candidate],
                        toolchains: Dict[str, Toolchain], deadline: Optional[float]):
    """``estimator.search(...)``, given the deadline where it takes one (estimators written before it did not)."""
    import inspect

    try:
        takes_deadline = "deadline" in inspect.signature(estimator.search).parameters
    except (TypeError, ValueError):
        takes_deadline = False
    if takes_deadline:
        return estimator.search(graph, cands, toolchains, deadline=deadline)
    return estimator.search(graph, cands, toolchains)


#: The counts of an estimator's ``stats`` that the result reports (measuring and learned estimators keep them).
_STATS = ("cached", "measured", "predicted", "failed")


def _stats(estimator: CostEstimator) -> Dict[str, int]:
    """The counts of :data:`_STATS` an estimator keeps (``MeasuredCostEstimator.stats`` and the like)."""
    stats = getattr(estimator, "stats", None)
    if not isinstance(stats, dict):
        return {}
    return {k: stats[k] for k in _STATS if isinstance(stats.get(k), int)}


class _Partitioner:
    """The module pass behind :class:`CollagePartitioner` (see there)."""

    def __init__(self, toolchains: ToolchainSpec = None, cost_estimator: Optional[CostEstimator] = None,
                 params: Optional[Dict] = None, compare_single: bool = True, validate_rounds: int = 2,
                 progress: ProgressArg = None, time_budget_s: Optional[float] = None,
                 confidence: float = 0.95, compare_budget_s: float = 60.0, error_budget: Optional[float] = None,
                 sample_inputs: Optional[Mapping] = None, original: Optional[str] = None):
        # Every argument is checked here, before the search starts (the module in run, first thing).
        self.toolchains = resolve(toolchains)
        if cost_estimator is not None and not isinstance(cost_estimator, CostEstimator):
            raise TypeError(
                f"cost_estimator must be a CostEstimator, got {type(cost_estimator).__name__}"
            )
        self.cost_estimator = cost_estimator
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"params must be a dict of parameter name -> array, got {type(params).__name__}")
        self.params = dict(params or {})
        self.compare_single = arguments.flag("compare_single", compare_single)
        self.validate_rounds = arguments.whole_number("validate_rounds", validate_rounds)
        self.progress = check_progress(progress)
        self.time_budget_s = None if time_budget_s is None else arguments.positive_number(
            "time_budget_s", time_budget_s)
        self.confidence = arguments.positive_number("confidence", confidence)
        if not self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
        self.compare_budget_s = arguments.positive_number("compare_budget_s", compare_budget_s)
        self.error_budget = None if error_budget is None else arguments.positive_number(
            "error_budget", error_budget, zero=True)
        if sample_inputs is not None and not isinstance(sample_inputs, Mapping):
            raise TypeError(f"sample_inputs must be a dict of input name -> array, got {type(sample_inputs).__name__}")
        self.sample_inputs = sample_inputs
        self.original = None if original is None else arguments.onnx_file("original", original)
        self.last_result: Optional[CollageResult] = None
        #: Rivals the last final comparison left out: name -> why (see :func:`file_twins`).
        self.left_out: Dict[str, str] = {}

    def run(self, mod: tvm.IRModule) -> CollageResult:
        report = Reporter(self.progress)
        try:
            return self._run_reported(mod, report)
        finally:
            report.close()

    def _run_reported(self, mod: tvm.IRModule, report: Reporter) -> CollageResult:
        seconds: Dict[str, float] = {}
        start = time.perf_counter()
        deadline = None if self.time_budget_s is None else start + self.time_budget_s
        report("enumerate", 0, 1)
        prepared = prepare(mod, self.params)
        # Checked against the model's inputs (parameters bound) before the search starts.
        self._inputs = None if self.sample_inputs is None else check_sample_inputs(prepared["main"], self.sample_inputs)
        graph = IndexedGraph(prepared["main"])
        by_name = {tc.name: tc for tc in self.toolchains}
        cands = enumerate_candidates(graph, self.toolchains)
        seconds["enumerate"] = time.perf_counter() - start
        report("enumerate", 1, 1)

        estimator = self.cost_estimator
        if estimator is None:
            from .cost.measured import MeasuredCostEstimator
            from .cost.staged import StagedCostEstimator

            # The driver's progress counts every candidate, cached ones too: the estimator's own bar is off.
            estimator = StagedCostEstimator(MeasuredCostEstimator(progress=False))
            try:
                return self._run(mod, prepared, graph, by_name, cands, estimator, seconds, report, deadline)
            finally:
                estimator.close()  # its worker processes; a given estimator stays the caller's
        return self._run(mod, prepared, graph, by_name, cands, estimator, seconds, report, deadline)

    def _run(self, mod, prepared, graph, by_name, cands, estimator, seconds, report: Reporter,
             deadline: Optional[float]) -> CollageResult:
        start = time.perf_counter()
        before = _stats(estimator)
        partial = []
        self.left_out = {}
        unreachable = unreachable_ops(graph, cands, self.toolchains)
        costed = sum(1 for c in cands if not c.host)
        report("estimate", 0, costed)
        interleaved = _interleaved_search(estimator, graph, cands, by_name, deadline)
        if interleaved is not None:  # it estimates and searches in one
            result, costs = interleaved
            crossing = float(getattr(estimator, "crossing", 0.0))
            report("estimate", costed, costed)
            if getattr(estimator, "stats", {}).get("stop") == "deadline":
                partial.append(f"the time budget of {self.time_budget_s:g} s ended while measuring what the "
                               "search picked: the best fully measured partitioning so far")
        else:
            costs, crossing = _estimate(graph, cands, by_name, estimator, report, deadline)
            result = None
        seconds["estimate"] = time.perf_counter() - start
        counts = {"candidates": len(cands), "host": len(cands) - costed, "costed": costed}
        counts.update({k: v - before.get(k, 0) for k, v in _stats(estimator).items()})
        start = time.perf_counter()
        report("search", 0, 1)
        unknown = sum(1 for c, x in zip(cands, costs) if not c.host and math.isinf(x))
        if result is None and deadline is not None and time.perf_counter() >= deadline:
            partial.append(f"the time budget of {self.time_budget_s:g} s ended while estimating "
                           f"({costed - unknown} of {costed} candidates costed)")
            try:
                result = search_valid(graph, cands, costs, by_name)
            except NoCoverError:  # what was costed does not cover the model: TVM alone is always valid
                result = _tvm_only(graph, cands, costs, by_name)
                partial[-1] += "; not enough to cover the model, so TVM alone"
        elif result is None:
            result = search_valid(graph, cands, costs, by_name)
        seconds["search"] = time.perf_counter() - start
        report("search", 1, 1)

        single, single_results, greedy = {}, {}, {}
        if self.compare_single:
            greedy = greedy_answers(graph, cands, costs, by_name)
            tvm_name = tvm_toolchain(by_name).name
            for tc in self.toolchains:
                allowed = {tvm_name, tc.name}
                sub = [k for k, c in enumerate(cands) if c.toolchain in allowed]
                try:
                    single_results[tc.name] = search(graph, [cands[k] for k in sub], [costs[k] for k in sub])
                    single[tc.name] = single_results[tc.name].cost
                except NoCoverError:
                    single[tc.name] = math.inf
            tvm_alone = single_results.get(tvm_name)
            if self.error_budget is None:  # under a budget, a lossy toolchain's greedy answer may break it
                result = simpler_answer(result, ([tvm_alone] if tvm_alone is not None else []) + list(greedy.values()))

        start = time.perf_counter()
        timer = estimator.whole_model_timer() if self.validate_rounds and not partial else None
        validation = Validation(graph, cands, costs, by_name, prepared, timer)
        validation.deadline = deadline
        if timer is not None:
            report("validate", 0, 1)
        # With the final comparison to come, each toolchain alone (TVM whole, the others' greedy
        # partitionings) is timed there, side by side with the mix: timing those answers here as
        # well would build every whole model twice (and so would timing validation's mixes again
        # side by side: Inception-v1's mixes take 10-20 s each to build).
        sampler = whole_model_sampler(timer)  # validate_rounds=0 (or a budget spent estimating): None
        comparing = not self._not_compared(timer, sampler, partial, math.inf)
        # A toolchain none of whose candidates could be measured (it crashed or hung each time) is not
        # built whole for the final comparison.
        runnable = [tc for tc in self.toolchains if tc.is_tvm or any(
            c.toolchain == tc.name and math.isfinite(x) for c, x in zip(cands, costs))]
        prebuild = getattr(sampler, "prebuild", None)
        budgeted = self.error_budget is not None and any(tc.lossy for tc in self.toolchains)
        once = comparing and not budgeted and validation.crossings(result) <= 1
        singles = {}
        if comparing and callable(prebuild) and self.error_budget is None:
            # The comparison's whole models build in the background while validation builds its mixes
            # (BERT-base: 2-4 minutes of builds less in all). What is ready at once starts first: the mix
            # validation times, TVM alone (its rival) and the runtimes on the user's file; the toolchains'
            # greedy partitionings are made meanwhile (BERT-base: 30 s each in this process, which left a
            # core idle when they came first) and start after.
            if self.validate_rounds and not once:
                prebuild({"collage": validation.module_of(result)})
            singles = self._singles(prepared, runnable, unreachable, greedy=False)
            prebuild(singles)
            singles = self._singles(prepared, runnable, unreachable, ready=singles)
            prebuild(singles)
            alone = f"{tvm_toolchain(by_name).name} alone"
            if alone in singles and hasattr(timer, "time"):
                # Built anyway: a re-searched mix estimated slower than it is not built (BERT-base: a minute).
                validation.rival = (alone, lambda: timer.time(singles[alone]))
        elif comparing:
            singles = self._singles(prepared, runnable, unreachable)
        rivals = ({}, {}) if comparing else (single_results, greedy)
        # Re-searched with a learned crossing cost, a mix with one partition outside TVM comes back as it is
        # or as TVM alone (any other answer crosses at least as often and was estimated slower): the final
        # comparison times both, so validation would only build and time the mix once more (DenseNet-121,
        # OpenVINO's maximal region: 83 s). Under an error budget its learned crossing cost still steers the
        # budget's re-searches (see below): validated as before.
        result = validation.run(result, 0 if once else self.validate_rounds, *rivals, retime=not comparing)
        if timer is not None:
            report("validate", 1, 1)
        if validation.trials:
            seconds["validate"] = time.perf_counter() - start
        if validation.cut_short:
            partial.append(f"the time budget of {self.time_budget_s:g} s ended while validating "
                           f"({len(validation.trials)} partitionings timed whole)")
        errors: Dict[str, float] = {}
        steps: List = []
        check = None
        if budgeted:
            start = time.perf_counter()
            report("precision", 0, 1)
            check = ErrorCheck(prepared, self._inputs)
            # Re-searches price crossings as validation learned them: without, giving up a lossy region
            # splits it into many small exact ones that looked cheap alone.
            result, errors["collage"], steps = fit_budget(
                graph, cands, validation.with_crossings(), by_name, result, self.error_budget,
                lambda r: check(outline_chosen(graph, r.chosen, by_name, prepared)[0]), deadline)
            report("precision", 1, 1)
            seconds["precision"] = time.perf_counter() - start
        out, symbols = outline_chosen(graph, result.chosen, by_name, prepared)
        partitions = [
            Partition(cand.toolchain, ops, cost, symbols.get(cand.mask), cand.label, border_kb(graph, cand.mask),
                      partition_precision(by_name.get(cand.toolchain), ops))
            for cand, cost in result.non_host() for ops in [graph.op_names(cand.mask)]
        ]
        mix_partitions = list(partitions)
        measured_ms = validation.measured_of(result)
        final, answer, twin = None, "collage", None
        remaining = math.inf if deadline is None else deadline - time.perf_counter()
        not_compared = self._not_compared(timer, sampler, partial, remaining)
        if not not_compared:
            if remaining <= 0:
                not_compared = "the time budget ended"
                partial.append(f"the time budget of {self.time_budget_s:g} s ended before the final comparison")
            else:
                start = time.perf_counter()
                # A remote timer holds one server for the whole comparison (its modules side by side).
                session = getattr(timer, "session", None)
                singles = singles or self._singles(prepared, runnable, unreachable)
                # The answer is a toolchain's maximal region: its BYOC module (or, where that was left out as
                # the same runtime on every operator, the runtime on the user's file) is the same partitioning
                # built another way, which the comparison times anyway. Timed twice, the two cannot be told
                # apart and run the rounds to the budget's end (DenseNet-121 on Zen 4: 24 rounds).
                for name, answer in greedy.items():
                    kept = f"{name}{ON_THE_FILE}" if f"{name} alone" in self.left_out else f"{name} alone"
                    if kept in singles and _same_partitions(answer, result):
                        twin = kept
                        break
                if twin is not None:
                    out = singles[twin]
                with session() if callable(session) else contextlib.nullcontext():
                    final, singles, same = self._compare(out, singles, runnable, sampler,
                                                         min(self.compare_budget_s, remaining), report, check,
                                                         errors)
                seconds["compare"] = time.perf_counter() - start
        # Validation's whole models that the comparison did not take (or all, without one) end here.
        close_kept = getattr(timer, "close", None)
        if callable(close_kept):
            close_kept()
        if final is not None:
            answer = final.answer
            measured_ms = final.timings[final.answer].median_ms
            # The mix itself keeps its estimated table; a twin built another way has its own partitions.
            if not final.is_mix and (final.answer not in same or twin is not None):
                out = singles[final.answer]
                partitions = module_partitions(out, by_name, final.answer.removesuffix(" alone")
                                               .removesuffix(ON_THE_FILE))
        self.last_result = CollageResult(
            out, {}, partitions, result.cost, single, len(cands), result.states, seconds, graph,
            result.chosen, prepared, measured_ms, validation.trials, validation.side_by_side,
            answer, final, counts, bool(partial), "; ".join(partial), not_compared, mix_partitions,
            validation.measured_of(result), self.error_budget, errors, steps,
            unreachable, list(validation.skipped), crossing,
            dict(self.left_out) if final is not None else {})
        logger.info("Collage: %d candidates, %d partitions, estimated %.3f ms (%s)", len(cands),
                    len(partitions), result.cost, ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items()))
        return self.last_result

    def _not_compared(self, timer, sampler, partial: List[str], remaining: float) -> str:
        """Why the final comparison does not run ("" when it does)."""
        reasons = (
            (not self.compare_single, "compare_single=False"),
            (len(self.toolchains) < 2, "only one toolchain: nothing to compare"),
            (bool(partial), "the time budget ended"),
            (not self.validate_rounds, "validate_rounds=0: nothing is timed whole"),
            (timer is None or sampler is None, "the cost estimator does not time whole models"),
        )
        return next((reason for failed, reason in reasons if failed), "")

    def _singles(self, prepared: tvm.IRModule, toolchains: Sequence[Toolchain],
                 unreachable: Mapping[str, Mapping[str, int]], greedy: bool = True,
                 ready: Optional[Mapping[str, tvm.IRModule]] = None) -> Dict[str, tvm.IRModule]:
        """The final comparison's rivals of the mix: each of ``toolchains`` alone and, given the user's
        file, each runtime on it; a toolchain alone that is its runtime on the file by another name
        (:func:`file_twins` of ``unreachable``) is left out, why in :attr:`left_out`.

        ``greedy=False``: only those that are quick to make (TVM alone, the runtimes on the file), not the
        BYOC toolchains' greedy partitionings; ``ready``: those made already (by such a call), not again."""
        on_file = {name: mod for name, mod in (ready or {}).items() if name.endswith(ON_THE_FILE)}
        if ready is None and self.original is not None:
            on_file = original_modules(prepared, self.original, toolchains)
        made = dict(ready or {})
        self.left_out = {alone: f"the same runtime on every operator as {twin}"
                         for alone, twin in file_twins(toolchains, on_file, unreachable).items()}
        # Not even built: BYOC's greedy partitioning matches 50 patterns over the model (DenseNet-121: 5-6 s each).
        wanted = [tc for tc in toolchains if f"{tc.name} alone" not in self.left_out and (greedy or tc.is_tvm)]
        made.update(single_toolchain_modules(prepared, [tc for tc in wanted if f"{tc.name} alone" not in made]))
        # In the toolchains' order, then the runtimes on the file.
        singles = {f"{tc.name} alone": made[f"{tc.name} alone"] for tc in wanted if f"{tc.name} alone" in made}
        singles.update(on_file)
        return singles

    def _compare(self, mix: tvm.IRModule, singles: Dict[str, tvm.IRModule], toolchains: Sequence[Toolchain],
                 sampler, budget_s: float, report: Reporter, check: Optional[ErrorCheck] = None,
                 errors: Optional[Dict[str, float]] = None):
        """The final comparison (:func:`~.validate.final_comparison`) of the mix and its rivals ``singles``
        (:meth:`_singles` of ``toolchains``): ``(FinalAnswer or None, {single's name: module}, [singles the
        mix is structurally])``.

        A measuring estimator's sampler builds and times each module in a fresh process of its own
        (``toolchains`` are those with candidates that built and ran in a worker). With an error
        budget (``check``), a lossy toolchain alone over the budget does not compete (its error
        goes into ``errors``)."""
        singles = dict(singles)
        if check is not None:
            lossy_names = [f"{tc.name} alone" for tc in toolchains if tc.lossy]
            singles, checked = check_singles(singles, lossy_names, self.error_budget, check)
            if errors is not None:
                errors.update(checked)
        # A mix that is one of the single toolchains (everything in TVM) is not timed twice.
        same = [name for name, module in singles.items() if tvm.ir.structural_equal(module, mix)]
        modules = dict(singles) if same else {"collage": mix, **singles}
        try:
            final = final_comparison(modules, None if same else "collage", sampler, self.confidence, budget_s,
                                     on_round=lambda done, cap: report("compare", done, cap))
        except RuntimeError as err:  # no competitor could be built and timed: the mix stays, untimed
            logger.warning("final comparison: %s", err)
            return None, singles, same
        return final, singles, same

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return self.run(mod).mod


CollagePartitioner = tvm.transform.module_pass(opt_level=0, name="CollagePartitioner")(_Partitioner)
CollagePartitioner.__doc__ = """Collage as a Relay module pass.

Parameters
----------
toolchains : str or list, optional
    Toolchain names (``"tvm,ort,blas"``) or :class:`~.toolchains.Toolchain`
    objects; see :func:`~.toolchains.resolve`. TVM is always included.
cost_estimator : CostEstimator, optional
    How candidates are costed; default :class:`~.cost.measured.MeasuredCostEstimator`.
params : dict, optional
    Parameters to bind into ``main`` before partitioning.
compare_single : bool
    Also compute each single toolchain's estimated latency (for reports),
    and run the final comparison (see :func:`partition`).
validate_rounds, progress, time_budget_s, confidence, compare_budget_s, error_budget, sample_inputs :
    See :func:`partition`.

The pass object forwards attribute access to the partitioner, so
``pass_.last_result`` is the :class:`CollageResult` of the last run.

Examples
--------
>>> from tvm_tcutils.collage.cost import MockCostEstimator
>>> from tvm_tcutils.models import load_model
>>> mod, params = load_model("mlp")
>>> collage = CollagePartitioner("tvm", MockCostEstimator({"tvm": 1.0}), params=params)
>>> out = tvm.transform.Sequential([collage])(mod)
>>> collage.last_result.estimated_ms > 0
True
"""


def partition(mod: tvm.IRModule, params: Optional[Dict] = None, toolchains: ToolchainSpec = None,
              cost_estimator: Optional[CostEstimator] = None, compare_single: bool = True,
              validate_rounds: int = 2, *, progress: ProgressArg = None, time_budget_s: Optional[float] = None,
              confidence: float = 0.95, compare_budget_s: float = 60.0, error_budget: Optional[float] = None,
              sample_inputs: Optional[Mapping] = None, original: Optional[str] = None) -> CollageResult:
    """Partition ``mod`` across ``toolchains`` at minimum estimated latency.

    Parameters
    ----------
    mod : IRModule
        The model (not changed); it must type-check.
    params : dict, optional
        Its parameters (name -> NumPy or TVM array, of the shape and dtype of
        that parameter of ``main``); they are bound into the result as constants.
    toolchains : str or list, optional
        See :func:`~.toolchains.resolve`.
    cost_estimator : CostEstimator, optional
        Default: :class:`~.cost.measured.MeasuredCostEstimator`.
    compare_single : bool
        Also estimate each single toolchain's latency and, with an estimator
        that times whole models (measured, learned), run the final
        comparison: the mix and each toolchain alone (TVM's own build of the
        whole model, BYOC's greedy partitioning of each other toolchain) timed
        in interleaved rounds until the interval of their ratio at
        ``confidence`` excludes 1, or ``compare_budget_s`` ends. The mix is
        returned only when it is faster with that confidence, else the
        fastest single toolchain (``result.answer``, ``result.final``).
    validate_rounds : int
        With an estimator that times whole models: how many times to
        re-search with the measured cost of crossing between toolchains
        (0: trust the sum of candidate costs and time nothing whole, the
        final comparison included).
    progress : callable, bool or None
        ``progress(update)`` with a :class:`~tvm_tcutils.progress.ProgressUpdate`
        (phase ``enumerate``, ``estimate``, ``search``, ``validate`` or
        ``compare``; done; total; elapsed seconds) as the run goes; None: a
        bar (tqdm's if installed) when stderr is a terminal; False: nothing.
    time_budget_s : float, optional
        Seconds for the whole run. When it ends, the best valid partitioning
        found so far is returned with ``result.partial`` set (and
        ``result.partial_reason``): estimating stops (uncosted candidates are
        not used; TVM alone if what was costed cannot cover the model), and
        validation and the final comparison are cut short or skipped.
    confidence : float
        Of the final comparison's interval, in (0, 1).
    compare_budget_s : float
        Seconds of timing for the final comparison.
    error_budget : float, optional
        With lossy toolchains among ``toolchains`` (``openvino-bf16``,
        ``tvm-fastmath`` beside ``tvm``): the largest relative error of the
        outputs (``||out - exact|| / ||exact||``, the worst output) the answer
        may have on ``sample_inputs`` against the exact model. The mix gives up
        lossy partitions, cheapest loss first, until it is within; a lossy
        toolchain alone over it does not compete (:mod:`.precision`;
        ``result.errors``, ``result.budget_steps``). None: lossy toolchains are
        placed wherever they are faster.
    sample_inputs : dict, optional
        Inputs (name -> array) the error is measured on; inputs left out get
        seeded random values of their types.
    original : str, optional
        The ONNX file ``mod`` was imported from. The final comparison then also times each toolchain
        that runs ONNX files (onnxruntime, OpenVINO) on the file itself, as the user runs it
        (``"<name> on the file"``), and the answer is never slower than those either; when one of them
        wins, ``result.mod`` runs that toolchain on the file (one partition, which needs the file, by
        its SHA-256, wherever the module is built and run).

    Returns
    -------
    CollageResult
        ``result.mod`` is the partitioned module.

    Raises
    ------
    TypeError, ValueError
        Before any search, for a bad argument; the message starts with its name.

    Examples
    --------
    >>> from tvm_tcutils.collage.cost import MockCostEstimator
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> result = partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False)
    >>> result.mod["main"].checked_type.ret_type.shape[1], result.partial
    (10, False)
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    return _Partitioner(toolchains, cost_estimator, params, compare_single, validate_rounds, progress,
                        time_budget_s, confidence, compare_budget_s, error_budget, sample_inputs, original).run(mod)


def build(mod: tvm.IRModule, params: Optional[Dict] = None, toolchains: ToolchainSpec = None,
          cost_estimator: Optional[CostEstimator] = None, target: Optional[str] = None, executor: str = "graph",
          tuning_log: Optional[str] = None):
    """Partition with Collage, then build with ``relay.build`` (``"graph"``) or ``relay.vm.compile`` (``"vm"``).

    ``target`` defaults to :func:`tvm_tcutils.host_target` (this CPU's vector
    ISA), the target the measured costs are taken with; ``tuning_log`` is the
    AutoTVM log TVM's candidates were costed with, if any.

    Returns
    -------
    (built, CollageResult)
        The graph-executor factory module or VM executable, and the search result.

    Examples
    --------
    >>> from tvm_tcutils.collage.cost import MockCostEstimator
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> lib, result = build(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}))
    """
    # Checked before the search: a bad target must not cost a search first.
    arguments.choice("executor", executor, _EXECUTORS)
    arguments.target(target)
    arguments.existing_file("tuning_log", tuning_log)
    result = partition(mod, params, toolchains, cost_estimator, compare_single=False)
    return build_partitioned(result.mod, target=target, executor=executor, tuning_log=tuning_log), result


#: Executors :func:`build` and :func:`build_partitioned` build for.
_EXECUTORS = ("graph", "vm")


def build_partitioned(mod: tvm.IRModule, params: Optional[Dict] = None, target: Optional[str] = None,
                      executor: str = "graph", tuning_log: Optional[str] = None):
    """Build an already partitioned module (for example one loaded from disk); no search.

    ``target`` defaults to :func:`tvm_tcutils.host_target`; with ``tuning_log``
    TVM's parts are built with AutoTVM's best configs from it.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> lib = build_partitioned(*load_model("mlp"))
    """
    arguments.choice("executor", executor, _EXECUTORS)
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    if params is not None and not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of parameter name -> array, got {type(params).__name__}")
    arguments.existing_file("tuning_log", tuning_log)
    target = arguments.target(target) or host_target()
    # AlterOpLayout's packings of constants folded in numpy (the same module, built faster).
    with tuning_log_scope(tuning_log), tvm.transform.PassContext(
            opt_level=3, instruments=[numpy_folds_after_alter_layout()]):
        if executor == "graph":
            return relay.build(mod, target=target, params=params)
        return relay.vm.compile(mod, target=target, params=params)


def single_toolchain_modules(prepared: tvm.IRModule, toolchains: Sequence[Toolchain]) -> Dict[str, tvm.IRModule]:
    """Each toolchain alone, as a whole module: ``"<name> alone"`` -> module.

    A TVM toolchain alone is its own lowering of the whole model; any other
    buildable toolchain alone is BYOC's greedy partitioning
    (:func:`greedy_partition`: every region it supports, TVM for the rest).
    A toolchain whose greedy partitioning fails is left out, with a warning.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> sorted(single_toolchain_modules(prepare(*load_model("mlp")), resolve("tvm")))
    ['tvm alone']
    """
    tvm_tc = tvm_toolchain({tc.name: tc for tc in toolchains})
    out: Dict[str, tvm.IRModule] = {}
    for tc in toolchains:
        if tc.is_tvm:
            out[f"{tc.name} alone"] = tc.rewrite(prepared)
        elif tc.buildable():
            try:
                out[f"{tc.name} alone"] = _greedy(prepared, tc, tvm_tc)
            except (tvm.TVMError, RuntimeError, ValueError) as err:
                logger.warning("%s alone (greedy partitioning) failed: %s", tc.name, error_line(err))
    return out


#: How the final comparison names a toolchain running the user's own file.
ON_THE_FILE = " on the file"


def original_modules(prepared: tvm.IRModule, path: str, toolchains: Sequence[Toolchain]) -> Dict[str, tvm.IRModule]:
    """Each toolchain that runs ONNX files (:attr:`~.toolchains.Toolchain.runs_onnx_file`) on the user's
    own file ``path``, as a whole module of one partition: ``"<name> on the file"`` -> module.

    The partition's function is the whole model (its body types the call; the toolchain runs the file,
    not an export of the body), its parameters in the file's input order. Where the file's inputs are
    not the model's (another file, or renamed inputs), no module is made, with a warning.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> original_modules(prepare(*load_model("mlp")), "m.onnx", resolve("tvm"))
    {}
    """
    chains = [tc for tc in toolchains if tc.runs_onnx_file and tc.buildable()]
    if not chains:
        return {}
    import hashlib

    import onnx

    from ..models import onnx_graph_inputs
    from .toolchains.ort import FILE_ATTR, FILE_SHA_ATTR

    with open(path, "rb") as fh:  # read once: parsed for its inputs, hashed for the partition
        data = fh.read()
    inputs = onnx_graph_inputs(onnx.load_model_from_string(data).graph)
    names = [value.name for value in inputs]
    main = prepared["main"]
    by_name = {param.name_hint: param for param in main.params}
    if sorted(names) == sorted(by_name):
        params = [by_name[name] for name in names]
    elif len(names) == len(main.params):  # an importer may rename inputs; the order is the file's
        params = list(main.params)
    else:
        params = None
    # The file's fixed dimensions must be the model's (another --batch-size is another model).
    if params is None or any(
            len(value.type.tensor_type.shape.dim) != len(param.checked_type.shape) or any(
                dim.HasField("dim_value") and dim.dim_value != int(size)
                for dim, size in zip(value.type.tensor_type.shape.dim, param.checked_type.shape))
            for value, param in zip(inputs, params)):
        logger.warning("the file %s has inputs %s, the model %s: not timed on the file", path,
                       [(v.name, [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]) for v in inputs],
                       [(p.name_hint, [int(d) for d in p.checked_type.shape]) for p in main.params])
        return {}
    sha256 = hashlib.sha256(data).hexdigest()
    out = {}
    for tc in chains:
        symbol = f"{tc.compiler}_file"
        ext = relay.Function(params, main.body, main.ret_type)
        # As PartitionGraph marks a partition: without Inline, relay.build never calls the codegen.
        for key, value in (("Primitive", 1), ("Inline", 1), ("Compiler", tc.compiler), ("global_symbol", symbol),
                           (FILE_ATTR, os.path.abspath(path)), (FILE_SHA_ATTR, sha256)):
            ext = ext.with_attr(key, value)
        outer = [relay.var(p.name_hint, p.type_annotation) for p in main.params]
        order = [outer[list(main.params).index(p)] for p in params]
        gv = relay.GlobalVar(symbol)
        mod = tvm.IRModule({gv: ext})
        mod["main"] = relay.Function(outer, relay.Call(gv, order))
        out[f"{tc.name}{ON_THE_FILE}"] = relay.transform.InferType()(mod)
    return out


def file_twins(toolchains: Sequence[Toolchain], on_file: Iterable[str],
               unreachable: Mapping[str, Mapping[str, int]]) -> Dict[str, str]:
    """``"<name> alone"`` -> ``"<name> on the file"`` for each toolchain other than TVM that takes every
    operator of the model (none in ``unreachable``, see :func:`unreachable_ops`) while the same runtime
    runs the user's file (``on_file``: the names :func:`original_modules` gave).

    Its greedy partitioning is then one partition of the whole model: the same runtime on the same operators
    as on the file, from Collage's export of it. Timed side by side the two differ by noise and kept the
    final comparison going to its budget's end (DenseNet-121 on Zen 4: 18 rounds, 63 s, x0.991 [0.929,
    1.029]). The file is what the user runs and what the answer must not be slower than: it stays.

    Examples
    --------
    >>> chains = resolve("tvm,ort,openvino")
    >>> file_twins(chains, ["ort on the file", "openvino on the file"], {"openvino": {"nn.lrn": 2}})
    {'ort alone': 'ort on the file'}
    """
    names = set(on_file)
    return {f"{tc.name} alone": f"{tc.name}{ON_THE_FILE}" for tc in toolchains
            if not tc.is_tvm and f"{tc.name}{ON_THE_FILE}" in names and not unreachable.get(tc.name)}


def _called_ops(func: relay.Function) -> List[str]:
    """The names of the operators ``func`` calls, a name per call, in post order."""
    found: List[str] = []
    relay.analysis.post_order_visit(func, lambda e: found.append(e.op.name) if isinstance(
        e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def module_partitions(mod: tvm.IRModule, toolchains: Mapping[str, Toolchain],
                      lowering: Optional[str] = None) -> List[Partition]:
    """The partitions of a partitioned module: one per ``Compiler`` function, and TVM's ``main``.

    Estimates are ``nan``: a module built whole (a single toolchain alone)
    has no per-partition estimate. ``main`` is reported as ``lowering``'s
    when that names a TVM toolchain (``tvm-fastmath`` alone), else as the
    search's TVM toolchain's.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> [(p.toolchain, p.ops) for p in module_partitions(load_model("mlp")[0], {"tvm": TVM})][0][0]
    'tvm'
    """
    by_compiler = {tc.compiler: name for name, tc in toolchains.items() if tc.compiler}
    tvm_name = tvm_toolchain(dict(toolchains)).name if toolchains else "tvm"
    if lowering in toolchains and toolchains[lowering].is_tvm:
        tvm_name = lowering

    rows = []
    for gv in sorted(mod.get_global_vars(), key=lambda gv: gv.name_hint):
        compiler = mod[gv].attrs.get("Compiler") if mod[gv].attrs else None
        if gv.name_hint != "main" and compiler:
            name = by_compiler.get(str(compiler), str(compiler))
            found = _called_ops(mod[gv])
            rows.append(Partition(name, found, math.nan, gv.name_hint, f"{name} region",
                                  precision=partition_precision(toolchains.get(name), found)))
    main_ops = _called_ops(mod["main"])
    if main_ops:
        rows.insert(0, Partition(tvm_name, main_ops, math.nan, None, "main",
                                 precision=partition_precision(toolchains.get(tvm_name), main_ops)))
    return rows


def greedy_partition(mod: tvm.IRModule, params: Optional[Dict], toolchain: Union[str, Toolchain],
                     tvm_lowering: Toolchain = TVM) -> tvm.IRModule:
    """BYOC's usual greedy partitioning for one toolchain, for comparison with Collage.

    ``MergeComposite`` (its patterns) -> ``AnnotateTarget`` -> ``MergeCompilerRegions`` ->
    ``PartitionGraph`` on the prepared module: the largest supported regions go
    to the toolchain whatever they cost. The rest stays in ``main``, rewritten
    as ``tvm_lowering`` (a TVM toolchain, see :meth:`Toolchain.rewrite`) lowers it.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> out = greedy_partition(mod, params, "dnnl")
    """
    (tc,) = [t for t in resolve([toolchain]) if not t.is_tvm] or [None]
    if tc is None:
        raise ValueError("toolchain: greedy partitioning needs a BYOC toolchain, not tvm")
    return _greedy(prepare(mod, params), tc, tvm_lowering)


def _greedy(prepared: tvm.IRModule, tc: Toolchain, tvm_lowering: Toolchain) -> tvm.IRModule:
    """:func:`greedy_partition` of an already prepared module (its constants stay the same objects, so
    the search's shared constants still stand for them when the module is sent to a worker)."""
    entries = _matchable(list(tc.patterns or ()) + list(
        (relay.op.contrib.get_pattern_table(tc.pattern_table) or []) if tc.pattern_table else []), prepared)
    seq = [relay.transform.MergeComposite(entries)] if entries else []
    seq += [relay.transform.AnnotateTarget(tc.compiler), relay.transform.MergeCompilerRegions()]
    with tvm.transform.PassContext(opt_level=3):
        # The same partitions as TVM's PartitionGraph, outlined in linear time (outline_annotated).
        return tvm_lowering.rewrite(outline_annotated(tvm.transform.Sequential(seq)(prepared)))


def _matchable(entries: List[tuple], mod: tvm.IRModule) -> List[tuple]:
    """The pattern-table ``entries`` that can match in ``mod``: one rooted at a call of an operator the module
    does not call cannot, so ``MergeComposite`` need not try it (the package's runtimes have one pattern per
    operator they convert, 50: DenseNet-121's greedy partitioning spent 5-6 s matching them). Order kept.

    Examples
    --------
    >>> from tvm.relay.dataflow_pattern import is_op, wildcard
    >>> x = relay.var("x", shape=(2,))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))
    >>> table = [("t.add", is_op("add")(wildcard(), wildcard())), ("t.exp", is_op("exp")(wildcard())),
    ...          ("t.any", wildcard())]
    >>> [name for name, *_ in _matchable(table, mod)]
    ['t.exp', 't.any']
    """
    from tvm.relay.dataflow_pattern import CallPattern, ExprPattern

    called = {op for func in mod.functions.values() if isinstance(func, relay.Function) for op in _called_ops(func)}

    def root(pattern) -> Optional[str]:
        if isinstance(pattern, CallPattern) and isinstance(pattern.op, ExprPattern) and isinstance(
                pattern.op.expr, tvm.ir.Op):
            return pattern.op.expr.name
        return None
    return [entry for entry in entries if root(entry[1]) in (None, *called)]
