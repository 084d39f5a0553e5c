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

import dataclasses
import logging
import math
import time
from typing import Dict, List, Mapping, Optional, Sequence, Union

from .._tvm import host_target, tvm
from ..measure import tuning_log_scope
from tvm import relay

from . import arguments
from .candidates import Candidate, enumerate_candidates
from .cost.base import CostEstimator, cost_requests
from .search import NoCoverError, search, search_valid
from .subgraph import IndexedGraph
from .toolchains import TVM, Toolchain, resolve, tvm_toolchain
from .validate import Validation, greedy_answers, outline_chosen

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
        is the result.
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


def prepare(mod: tvm.IRModule, params: Optional[Dict] = None) -> tvm.IRModule:
    """The module as Collage partitions it: parameters bound, inference simplified, constants folded.

    These are passes ``relay.build`` runs first anyway (``FoldScaleAxis`` is
    left to it: it doubles the time and TVM's fusion absorbs the scales);
    ``mod`` is not changed. A module that does not type-check, or ``params``
    that are not arrays of ``main``'s parameters (names, shapes, dtypes),
    raise ``TypeError`` / ``ValueError`` naming the argument (see
    :mod:`.arguments`).

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
    seq = tvm.transform.Sequential([
        relay.transform.InferType(),
        relay.transform.SimplifyInference(),
        relay.transform.FoldConstant(),
    ])
    with tvm.transform.PassContext(opt_level=3):
        return seq(new)


def _estimate(graph: IndexedGraph, cands: Sequence[Candidate], toolchains: Dict[str, Toolchain],
              estimator: CostEstimator) -> List[float]:
    costs = [0.0] * len(cands)
    todo = [k for k, c in enumerate(cands) if not c.host]
    requests = cost_requests(graph, cands, todo, toolchains)
    for k, cost in zip(todo, estimator.estimate(requests)):
        costs[k] = float(cost)
    return costs


class _Partitioner:
    """The module pass behind :class:`CollagePartitioner` (see there)."""

    def __init__(self, toolchains: ToolchainSpec = None, cost_estimator: Optional[CostEstimator] = None,
                 params: Optional[Dict] = None, compare_single: bool = True, validate_rounds: int = 2):
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
        self.last_result: Optional[CollageResult] = None

    def run(self, mod: tvm.IRModule) -> CollageResult:
        seconds: Dict[str, float] = {}
        start = time.perf_counter()
        prepared = prepare(mod, self.params)
        graph = IndexedGraph(prepared["main"])
        by_name = {tc.name: tc for tc in self.toolchains}
        cands = enumerate_candidates(graph, self.toolchains)
        seconds["enumerate"] = time.perf_counter() - start

        estimator = self.cost_estimator
        if estimator is None:
            from .cost.measured import MeasuredCostEstimator

            estimator = MeasuredCostEstimator()
            try:
                return self._run(mod, prepared, graph, by_name, cands, estimator, seconds)
            finally:
                estimator.close()  # its worker processes; a given estimator stays the caller's
        return self._run(mod, prepared, graph, by_name, cands, estimator, seconds)

    def _run(self, mod, prepared, graph, by_name, cands, estimator, seconds) -> CollageResult:
        start = time.perf_counter()
        interleaved = estimator.search(graph, cands, by_name)
        if interleaved is not None:
            result, costs = interleaved
        else:
            costs = _estimate(graph, cands, by_name, estimator)
            result = None
        seconds["estimate"] = time.perf_counter() - start
        start = time.perf_counter()
        if result is None:
            result = search_valid(graph, cands, costs, by_name)
        seconds["search"] = time.perf_counter() - start

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

        start = time.perf_counter()
        timer = estimator.whole_model_timer() if self.validate_rounds else None
        validation = Validation(graph, cands, costs, by_name, prepared, timer)
        result = validation.run(result, self.validate_rounds, single_results, greedy)
        if validation.trials:
            seconds["validate"] = time.perf_counter() - start
        out, symbols = outline_chosen(graph, result.chosen, by_name, prepared)
        partitions = [
            Partition(cand.toolchain, graph.op_names(cand.mask), cost, symbols.get(cand.mask), cand.label)
            for cand, cost in result.non_host()
        ]
        self.last_result = CollageResult(
            out, {}, partitions, result.cost, single, len(cands), result.states, seconds, graph,
            result.chosen, prepared, validation.measured_of(result), validation.trials, validation.side_by_side)
        logger.info("Collage: %d candidates, %d partitions, estimated %.3f ms (%s)", len(cands),
                    len(partitions), result.cost, ", ".join(f"{k} {v:.2f}s" for k, v in seconds.items()))
        return self.last_result

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
    Also compute each single toolchain's estimated latency (for reports).
validate_rounds : int
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
              validate_rounds: int = 2) -> CollageResult:
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
        Also estimate each single toolchain's latency.
    validate_rounds : int
        With an estimator that times whole models (measured, learned): how
        many times to re-search with the measured cost of crossing between
        toolchains (0: trust the sum of candidate costs). The fastest
        partitioning timed whole, single-toolchain answers included, is kept.

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
    >>> result = partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}))
    >>> result.mod["main"].checked_type.ret_type.shape[1]
    10
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    return _Partitioner(toolchains, cost_estimator, params, compare_single, validate_rounds).run(mod)


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
    with tuning_log_scope(tuning_log), tvm.transform.PassContext(opt_level=3):
        if executor == "graph":
            return relay.build(mod, target=target, params=params)
        return relay.vm.compile(mod, target=target, params=params)


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
    entries = list(tc.patterns or ()) + list(
        (relay.op.contrib.get_pattern_table(tc.pattern_table) or []) if tc.pattern_table else [])
    seq = [relay.transform.MergeComposite(entries)] if entries else []
    seq += [relay.transform.AnnotateTarget(tc.compiler), relay.transform.MergeCompilerRegions(),
            relay.transform.PartitionGraph(), relay.transform.InferType()]
    with tvm.transform.PassContext(opt_level=3):
        return tvm_lowering.rewrite(tvm.transform.Sequential(seq)(prepare(mod, params)))
