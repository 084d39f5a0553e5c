"""The one place that builds a Relay module for a target and times it.

Everything in the package that reports a latency goes through here: Collage's
measured costs and its validation, ``tvm-tcutils bench`` and ``tune``, the demo
and every benchmark script. One set of rules therefore holds everywhere:

* builds are ``relay.build`` at ``opt_level=3`` for :func:`~tvm_tcutils.host_target`
  unless a target is given (plain ``llvm`` is baseline SSE2 code, several times
  slower than what onnxruntime or OpenBLAS run on the same CPU), under an AutoTVM
  log when one is given;
* a module is warmed up on random inputs of its own types
  (:func:`tvm_tcutils.models.random_inputs`) before it is timed;
* times are milliseconds; a :class:`Timing` keeps every sample and reports the
  median and a spread;
* competitors are timed in turns (:func:`interleave`: A B A B ..., never
  A A A B B B), so that a drift of the machine's load affects them alike, and
  compared by :func:`ratio`, a ratio of medians with a bootstrap interval.

Examples
--------
>>> from tvm_tcutils.models import load_model
>>> mod, params = load_model("mlp")
>>> timer = Timer(mod, params, repeat=3)
>>> timer().median_ms > 0
True
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import math
import os
import platform
import re
import struct
import sys
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._tvm import host_target, pool_size, settle_thread_count, tvm
from tvm import autotvm, relay
from tvm.contrib import graph_executor

from . import prebuild
from ._compat import numpy_folds_after_alter_layout
from .progress import ProgressArg, Reporter
from .tuning import applied_records

Params = Dict[str, object]

logger = logging.getLogger("tvm_tcutils.measure")

#: Shortest run (ms) behind one timed repetition of a whole model: a microsecond-scale model is run
#: many times per repetition, so the timer's own overhead stays out of it, without making a
#: side-by-side comparison of a handful of small modules take tens of seconds.
WHOLE_MODEL_MIN_REPEAT_MS = 20


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Timing:
    """Timed runs of one thing, in milliseconds.

    Examples
    --------
    >>> t = Timing((1.0, 2.0, 3.0, 4.0, 100.0))
    >>> t.median_ms, t.min_ms
    (3.0, 1.0)
    >>> round(t.spread, 3)  # interquartile range relative to the median
    0.667
    >>> str(Timing((2.0, 2.0)))
    '2.000 ms (+-0.0 %, n=2)'
    """

    samples_ms: Tuple[float, ...]

    @property
    def median_ms(self) -> float:
        """The median sample (``inf`` when there is none)."""
        return float(np.median(self.samples_ms)) if self.samples_ms else math.inf

    @property
    def min_ms(self) -> float:
        """The fastest sample."""
        return float(min(self.samples_ms)) if self.samples_ms else math.inf

    @property
    def mean_ms(self) -> float:
        """The mean sample."""
        return float(np.mean(self.samples_ms)) if self.samples_ms else math.inf

    @property
    def spread(self) -> float:
        """Interquartile range over the median: 0.05 means the middle half lies within 5 %."""
        if len(self.samples_ms) < 2:
            return 0.0
        q25, q50, q75 = np.percentile(self.samples_ms, [25, 50, 75])
        return float((q75 - q25) / q50) if q50 > 0 else 0.0

    def as_dict(self) -> dict:
        """A JSON-ready summary with every sample."""
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "spread": self.spread,
                "samples_ms": list(self.samples_ms)}

    def __str__(self) -> str:
        return f"{self.median_ms:.3f} ms (+-{50 * self.spread:.1f} %, n={len(self.samples_ms)})"


@dataclasses.dataclass(frozen=True)
class Ratio:
    """``a / b`` of two timings' medians, with a bootstrap confidence interval.

    ``value < 1`` means ``a`` is faster. :attr:`separated` tells whether the
    interval excludes 1.

    Examples
    --------
    >>> r = Ratio(0.8, 0.75, 0.85, 0.95)
    >>> r.separated, str(r)
    (True, 'x0.800 [0.750, 0.850]')
    """

    value: float
    low: float
    high: float
    confidence: float

    @property
    def separated(self) -> bool:
        """Whether the interval lies wholly on one side of 1."""
        return self.high < 1.0 or self.low > 1.0

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        return f"x{self.value:.3f} [{self.low:.3f}, {self.high:.3f}]"


def ratio(a: Timing, b: Timing, confidence: float = 0.95, resamples: int = 2000, seed: int = 0) -> Ratio:
    """Ratio of medians ``a / b`` with a percentile-bootstrap interval.

    Examples
    --------
    >>> fast, slow = Timing((1.0, 1.1, 0.9, 1.0)), Timing((2.0, 2.1, 1.9, 2.0))
    >>> r = ratio(fast, slow)
    >>> r.value, r.separated
    (0.5, True)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if not a.samples_ms or not b.samples_ms:
        return Ratio(math.nan, math.nan, math.nan, confidence)
    value = a.median_ms / b.median_ms
    rng = np.random.default_rng(seed)
    xa, xb = np.asarray(a.samples_ms), np.asarray(b.samples_ms)
    boot_a = np.median(rng.choice(xa, (resamples, len(xa))), axis=1)
    boot_b = np.median(rng.choice(xb, (resamples, len(xb))), axis=1)
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(boot_a / boot_b, [tail, 100 - tail])
    return Ratio(float(value), float(low), float(high), confidence)


def interleave(timers: Mapping[str, Callable[[], float]], rounds: int = 5, *, progress: ProgressArg = False,
               time_budget_s: Optional[float] = None,
               clock: Callable[[], float] = time.perf_counter) -> Dict[str, Timing]:
    """Call every timer once per round, in turns (A B A B ...); one :class:`Timing` per name.

    Each timer returns one sample in ms (for example a :class:`Timer`'s
    :meth:`Timer.sample`). A timer that raises is left out of later rounds and
    gets an empty timing.

    Parameters
    ----------
    timers : mapping
        Name -> a function returning one sample (ms).
    rounds : int
        Rounds to run (each gives every timer one sample).
    progress : callable, bool or None
        ``progress(update)`` after each round (a
        :class:`~tvm_tcutils.progress.ProgressUpdate` of phase ``"time"``);
        None: a bar when stderr is a terminal; False (default): nothing.
    time_budget_s : float, optional
        Seconds for the whole comparison, checked between rounds: a round
        that has started is finished, at least one round always runs, and
        the timings hold the rounds done (fewer samples, same turn-taking).
    clock : callable
        Seconds, for the budget.

    Examples
    --------
    >>> calls = []
    >>> out = interleave({"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}, 2)
    >>> calls, out["b"].median_ms
    (['a', 'b', 'a', 'b'], 2.0)
    >>> ticks = iter(range(100))
    >>> out = interleave({"a": lambda: 1.0}, 10, time_budget_s=2.5, clock=lambda: float(next(ticks)),
    ...                  progress=lambda update: print(update.phase, update.done, update.total))
    time 1 10
    time 2 10
    time 3 10
    >>> len(out["a"].samples_ms)
    3
    """
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 1:
        raise ValueError(f"rounds must be an int >= 1, got {rounds!r}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s >= 0):
        raise ValueError(f"time_budget_s must be a number of seconds >= 0 or None, got {time_budget_s!r}")
    report = Reporter(progress)
    start = clock()
    samples: Dict[str, List[float]] = {name: [] for name in timers}
    broken = set()
    try:
        for done in range(1, rounds + 1):
            for name, timer in timers.items():
                if name in broken:
                    continue
                try:
                    samples[name].append(float(timer()))
                except (tvm.TVMError, RuntimeError, OSError) as err:
                    broken.add(name)
                    samples[name] = []
                    logger.warning("timing %s failed: %s", name, error_line(err))
            report("time", done, rounds)
            if time_budget_s is not None and done < rounds and clock() - start >= time_budget_s:
                logger.info("timing stopped by its %.0f s budget after %d of %d rounds", time_budget_s, done, rounds)
                break
    finally:
        report.close()
    return {name: Timing(tuple(values)) for name, values in samples.items()}


@dataclasses.dataclass(frozen=True)
class Interleaved:
    """What :func:`interleave_until` timed, and why it stopped.

    ``stopped`` is ``"decided"`` (the caller's test passed), ``"budget"`` (the
    time budget ended) or ``"rounds"`` (the round cap was reached).
    """

    timings: Dict[str, Timing]
    rounds: int
    seconds: float
    stopped: str


def interleave_until(timers: Mapping[str, Callable[[], float]], decided: Callable[[Dict[str, Timing]], bool],
                     min_rounds: int = 5, max_rounds: int = 50, budget_s: Optional[float] = None,
                     clock: Callable[[], float] = time.perf_counter,
                     on_round: Optional[Callable[[int], None]] = None) -> Interleaved:
    """:func:`interleave` one round at a time until ``decided(timings)``, the budget or ``max_rounds`` ends it.

    The sequential form of :func:`interleave`: every round times each
    competitor once, in turns, and from ``min_rounds`` on ``decided`` sees
    the timings so far (for example "the interval of a :func:`ratio`
    excludes 1"). ``budget_s`` is checked between rounds, so a round that
    has started is finished; at least one round is always run.
    ``on_round(rounds_done)`` is called after each round (progress).

    Examples
    --------
    >>> ticks = iter(range(100))
    >>> out = interleave_until({"a": lambda: 1.0, "b": lambda: 2.0},
    ...                        lambda t: ratio(t["a"], t["b"]).separated, min_rounds=3)
    >>> out.rounds, out.stopped
    (3, 'decided')
    >>> interleave_until({"a": lambda: 1.0}, lambda t: False, 1, 9, budget_s=2.5,
    ...                  clock=lambda: float(next(ticks))).stopped
    'budget'
    """
    if not 1 <= min_rounds <= max_rounds:
        raise ValueError(f"need 1 <= min_rounds <= max_rounds, got min_rounds={min_rounds}, max_rounds={max_rounds}")
    if budget_s is not None and not budget_s >= 0:
        raise ValueError(f"budget_s must be a number of seconds >= 0 or None, got {budget_s}")
    start = clock()
    samples: Dict[str, List[float]] = {name: [] for name in timers}
    rounds, stopped = 0, "rounds"
    while rounds < max_rounds:
        # interleave's turn-taking and failure rules, one round at a time (a failed timer stays empty).
        live = {name: timer for name, timer in timers.items() if rounds == 0 or samples[name]}
        for name, timing in interleave(live, 1).items():
            samples[name] = samples[name] + list(timing.samples_ms) if timing.samples_ms else []
        rounds += 1
        if on_round is not None:
            on_round(rounds)
        timings = {name: Timing(tuple(values)) for name, values in samples.items()}
        if rounds >= min_rounds and decided(timings):
            stopped = "decided"
            break
        if budget_s is not None and clock() - start >= budget_s:
            stopped = "budget"
            break
    return Interleaved({name: Timing(tuple(values)) for name, values in samples.items()}, rounds,
                       clock() - start, stopped)


# ---------------------------------------------------------------------------
# Building and running
# ---------------------------------------------------------------------------
def tuning_log_scope(log: Optional[str]):
    """``autotvm.apply_history_best(log)``, or a scope that changes nothing when ``log`` is empty.

    Examples
    --------
    >>> with tuning_log_scope(None):
    ...     pass
    >>> tuning_log_scope("/no/such.log")
    Traceback (most recent call last):
    ...
    FileNotFoundError: tuning log not found: /no/such.log
    """
    if not log:
        return contextlib.nullcontext()
    if not os.path.isfile(log):
        raise FileNotFoundError(f"tuning log not found: {log}")
    # Damaged lines and out-of-space knobs are left out (with a warning), not fatal.
    return autotvm.apply_history_best(applied_records(log))


def build(mod: tvm.IRModule, params: Optional[Params] = None, target: Optional[str] = None,
          tuning_log: Optional[str] = None, opt_level: int = 3):
    """``relay.build`` for ``target`` (default this CPU), under ``apply_history_best(tuning_log)``.

    A module with ``qnn.quantize`` first goes through the packed function ``tcutils.prebuild`` when
    one is registered (``import tvm_tcutils`` registers the int8 capability's: QDQ regions become
    integer ops on targets with a dot-product instruction); other modules are built as they are.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> lib = build(*load_model("mlp"))
    >>> lib.get_graph_json().startswith("{")
    True
    """
    target = target or host_target()
    # A capability's rewrite before the build (the int8 capability's: QDQ models as integer ops on
    # dot-product targets), looked up by name so that this core module imports no capability.
    mod, params = prebuild.prepare(mod, params, target)
    # The weights' and biases' packings that AlterOpLayout adds are folded in numpy, not compiled one by one
    # (the same module: DenseNet-121 whole 53 -> 28 s).
    with tuning_log_scope(tuning_log), tvm.transform.PassContext(
            opt_level=opt_level, instruments=[numpy_folds_after_alter_layout()]):
        return relay.build(mod, target=target, params=params)


def graph_module(lib, inputs: Mapping[str, np.ndarray], debug: bool = False,
                 device=None) -> graph_executor.GraphModule:
    """A graph executor of a built library with ``inputs`` set (``debug``: TVM's debug executor).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model, random_inputs
    >>> mod, params = load_model("mlp")
    >>> runner = graph_module(build(mod, params), random_inputs(mod, params))
    >>> runner.run(); runner.get_output(0).shape
    (1, 10)
    """
    device = device or tvm.cpu()
    executor = lib["debug_create"]("default", device) if debug else lib["default"](device)
    runner = graph_executor.GraphModule(executor)
    runner.set_input(**inputs)
    return runner


def outputs(runner: graph_executor.GraphModule) -> List[np.ndarray]:
    """Every output of a graph executor after its last run, as numpy arrays.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model, random_inputs
    >>> mod, params = load_model("mlp")
    >>> runner = graph_module(build(mod, params), random_inputs(mod, params))
    >>> runner.run(); [out.shape for out in outputs(runner)]
    [(1, 10)]
    """
    return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]


#: Fused kernels that only change a tensor's layout (``FuseOps`` names them after their one op).
_LAYOUT_KERNEL = re.compile(r"_fused_layout_transform(_\d+)?$")


@contextlib.contextmanager
def quiet_stderr():
    """File descriptor 2 to /dev/null: TVM's debug executor logs every kernel of ``run_individual`` there.

    Examples
    --------
    >>> with quiet_stderr():
    ...     os.write(2, b"not shown")
    9
    """
    sys.stderr.flush()
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def hot_kernel_seconds(debug_module, graph_json: str, number: int) -> List[float]:
    """Seconds of each fused kernel of a debug-executor module (graph order), each run ``number`` times in a row.

    TVM's ``run_individual`` answers for every graph node (inputs and weights too); this keeps the kernels,
    its log kept off stderr.
    """
    kernels = [i for i, node in enumerate(json.loads(graph_json)["nodes"]) if node["op"] == "tvm_op"]
    with quiet_stderr():
        per_node = debug_module.run_individual(number=number, repeat=1)
    return [float(per_node[i][0]) for i in kernels]


def boundary_layout_nodes(graph_json: str, input_names: Sequence[str]) -> List[int]:
    """Graph-executor nodes that only change the layout of a graph input or of a graph output.

    ``AlterOpLayout`` wraps an operator built alone in a transform into its
    blocked layout (NCHW -> NCHWc) and one back; between operators of one TVM
    region those transforms cancel, so they are not part of the operator's
    cost in a whole model.

    Examples
    --------
    >>> nodes = [{"op": "null", "name": "x"},
    ...          {"op": "tvm_op", "name": "a", "inputs": [[0, 0, 0]],
    ...           "attrs": {"func_name": "tvmgen_default_fused_layout_transform"}},
    ...          {"op": "tvm_op", "name": "b", "inputs": [[1, 0, 0]],
    ...           "attrs": {"func_name": "tvmgen_default_fused_nn_contrib_conv2d_NCHWc"}}]
    >>> boundary_layout_nodes(json.dumps({"nodes": nodes, "heads": [[2, 0, 0]]}), ["x"])
    [1]
    """
    graph = json.loads(graph_json)
    nodes = graph["nodes"]
    heads = {head[0] for head in graph["heads"]}
    names = set(input_names)
    inputs = {k for k, node in enumerate(nodes) if node["op"] == "null" and node["name"] in names}
    found = []
    for k, node in enumerate(nodes):
        if node["op"] != "tvm_op" or not _LAYOUT_KERNEL.search(node.get("attrs", {}).get("func_name", "")):
            continue
        if k in heads or all(edge[0] in inputs for edge in node["inputs"]):
            found.append(k)
    return found


def node_output_kb(graph_json: str, nodes: Sequence[int]) -> float:
    """Kilobytes of the first outputs of graph-executor ``nodes`` (what a layout kernel writes).

    Examples
    --------
    >>> graph = {"nodes": [{"op": "null"}, {"op": "tvm_op"}], "node_row_ptr": [0, 1, 2],
    ...          "attrs": {"shape": ["list_shape", [[1, 256], [1, 16, 16]]],
    ...                    "dltype": ["list_str", ["float32", "int8"]]}}
    >>> node_output_kb(json.dumps(graph), [1])
    0.25
    """
    graph = json.loads(graph_json)
    shapes, dtypes = graph["attrs"]["shape"][1], graph["attrs"]["dltype"][1]
    total = 0.0
    for k in nodes:
        entry = graph["node_row_ptr"][k]
        total += float(np.prod(shapes[entry], dtype=np.float64)) * tvm.DataType(dtypes[entry]).bits / 8 / 1024
    return total


#: Where a walk goes next from each kind of Relay node (other kinds are leaves).
def _has_layout_transform(mod: tvm.IRModule) -> bool:
    return prebuild.calls_op(mod, "layout_transform")


# ---------------------------------------------------------------------------
# Where a built module runs: this machine, or a device behind TVM's RPC tracker
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Loaded:
    """A built library loaded where it will be timed: its executor, that device, and how to let it go.

    ``release`` ends what the backend holds for it (a remote file and session); it is
    called once, by :meth:`Timer.close` or when the timer is collected.
    """

    runner: graph_executor.GraphModule
    device: object
    release: Callable[[], None] = lambda: None
    #: Where it runs, for logs: ``"local"`` or the RPC server's ``host:port``.
    where: str = "local"


class Backend:
    """Where :class:`Timer` runs what it built: the measurement backend interface.

    Builds always happen here (cross-compiling for the backend's device when
    its target says so); :meth:`load` puts the built library where it runs
    and returns its executor. :attr:`cache_key` names the device in cost
    caches, so costs measured on different devices never mix. The local
    backend (:data:`LOCAL`) is the default; :class:`tvm_tcutils.rpc.RemoteBackend`
    measures on a server of TVM's RPC tracker.

    Examples
    --------
    >>> LOCAL.cache_key, LOCAL.name
    ('', 'local')
    """

    name = "abstract"
    #: ``""`` for this machine (keeps the cache keys of local costs as they were).
    cache_key = ""

    def load(self, lib, inputs: Mapping[str, np.ndarray], debug: bool = False) -> Loaded:
        """Load ``lib`` where it runs, with ``inputs`` set (``debug``: TVM's debug executor)."""
        raise NotImplementedError

    def lost(self, err: BaseException) -> bool:
        """Whether ``err`` says the device went away (a retry on another may succeed), not that the module failed."""
        return False

    def missing(self, functions: Sequence[str]) -> List[str]:
        """Which of the global ``functions`` the device lacks (a toolchain's runtime functions)."""
        return [name for name in functions if tvm.get_global_func(name, allow_missing=True) is None]


class LocalBackend(Backend):
    """This machine's CPU: today's code path, nothing to start.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model, random_inputs
    >>> mod, params = load_model("mlp")
    >>> loaded = LocalBackend().load(build(mod, params), random_inputs(mod, params))
    >>> loaded.where, loaded.device == tvm.cpu()
    ('local', True)
    """

    name = "local"

    def load(self, lib, inputs: Mapping[str, np.ndarray], debug: bool = False) -> Loaded:
        # TVM is timed as deployed with its thread count set (see settle_thread_count).
        settle_thread_count()
        return Loaded(graph_module(lib, inputs, debug), tvm.cpu())


#: The default backend.
LOCAL = LocalBackend()


class Timer:
    """A module built once and warmed up; each call times it again.

    Parameters
    ----------
    mod, params :
        The Relay module and its parameters (inputs not in ``params`` get
        random values of their types).
    target : str, optional
        Default :func:`~tvm_tcutils.host_target`.
    repeat : int
        Timed runs per call (one :class:`Timing` sample each).
    warmup : int
        Untimed runs after the build.
    min_repeat_ms : int
        Least duration of one timed run: short kernels are run several times
        per sample (TVM's ``time_evaluator`` convention).
    tuning_log : str, optional
        AutoTVM log applied to the build.
    boundary_layout : bool
        ``False`` leaves out the time of kernels that only change the layout of
        an input or an output (:func:`boundary_layout_nodes`), each timed alone
        with TVM's debug executor: how a TVM operator costs inside a TVM
        region. A module that itself holds ``layout_transform`` operators, or a
        TVM without the debug executor, is timed whole.
    lib : optional
        An already built library of ``mod`` (skips the build).
    backend : Backend, optional
        Where the module runs (default :data:`LOCAL`, this CPU; a
        :class:`tvm_tcutils.rpc.RemoteBackend` runs it on an RPC server; the
        build is for ``target`` either way).

    Attributes
    ----------
    build_seconds : float
        How long the build took.
    runner : GraphModule
        The executor (its outputs are those of the last run).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> timer = Timer(*load_model("mlp"), repeat=2, warmup=1)
    >>> len(timer().samples_ms), timer.sample() > 0
    (2, True)
    """

    def __init__(self, mod: tvm.IRModule, params: Optional[Params] = None, target: Optional[str] = None,
                 repeat: int = 10, warmup: int = 2, min_repeat_ms: int = 0, tuning_log: Optional[str] = None,
                 boundary_layout: bool = True, lib=None, inputs: Optional[Mapping[str, np.ndarray]] = None,
                 backend: Optional[Backend] = None):
        from .models import random_inputs

        if repeat < 1:
            raise ValueError(f"repeat must be at least 1, got {repeat}")
        start = time.perf_counter()
        lib = lib if lib is not None else build(mod, params, target, tuning_log)
        self.build_seconds = time.perf_counter() - start
        self.repeat, self.min_repeat_ms = repeat, min_repeat_ms
        self.inputs = dict(inputs) if inputs is not None else random_inputs(mod, params)
        self._skipped: List[int] = []
        if not boundary_layout and not _has_layout_transform(mod):
            self._skipped = boundary_layout_nodes(lib.get_graph_json(), list(self.inputs))
        if not _has_debug_executor():  # a TVM built without the profiler: time the module whole
            self._skipped = []
        #: Kilobytes the left-out boundary kernels write, and their time in the last call (ms): what a
        #: crossing between TVM and another toolchain pays per kilobyte on this machine.
        self.boundary_kb = node_output_kb(lib.get_graph_json(), self._skipped) if self._skipped else 0.0
        self.boundary_ms = 0.0
        self._loaded = (backend or LOCAL).load(lib, self.inputs, debug=bool(self._skipped))
        # The executor holds its own copy of the weights: the built library (whose factory keeps a
        # copy of its parameters, as NDArrays of its own) is not kept, so one copy stays alive.
        del lib
        self.runner, self.where = self._loaded.runner, self._loaded.where
        for _ in range(max(warmup, 0)):
            self.runner.run()
        self._evaluator = self.runner.module.time_evaluator(
            "run", self._loaded.device, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def _node_ms(self, index: int) -> float:
        raw = self.runner.module["run_individual_node"](index, 1, self.repeat, self.min_repeat_ms, 100, 0, 1)
        return float(np.median(struct.unpack("@" + "d" * self.repeat, bytes(raw)))) * 1e3

    def __call__(self) -> Timing:
        """Time ``repeat`` runs (the boundary kernels' median subtracted from each, if asked)."""
        samples = [s * 1e3 for s in self._evaluator().results]
        if self._skipped:
            boundary = self.boundary_ms = sum(self._node_ms(k) for k in self._skipped)
            # Each kernel is part of the total, so this stays positive up to noise; the floor keeps
            # noise from pricing a candidate at nothing.
            samples = [max(s - boundary, 0.1 * s) for s in samples]
        return Timing(tuple(samples))

    def sample(self) -> float:
        """One median of ``repeat`` runs, in ms: a sample for :func:`interleave`."""
        return self().median_ms

    def outputs(self) -> List[np.ndarray]:
        """The outputs of the last run."""
        return outputs(self.runner)

    def close(self) -> None:
        """Let the loaded module go (on a remote backend: its file and session); the timer is then done."""
        loaded, self._loaded = getattr(self, "_loaded", None), None
        self._evaluator = self.runner = None
        if loaded is not None:
            loaded.release()

    def __del__(self):
        self.close()


def _has_debug_executor() -> bool:
    return tvm.get_global_func("tvm.graph_executor_debug.create", allow_missing=True) is not None


def build_and_time(mod: tvm.IRModule, params: Optional[Params] = None, target: Optional[str] = None,
                   repeat: int = 5, tuning_log: Optional[str] = None):
    """Build, run once on random inputs, and time: ``(outputs, build_seconds, median_ms)``.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> outs, build_s, ms = build_and_time(*load_model("mlp"))
    >>> outs[0].shape, ms > 0
    ((1, 10), True)
    """
    timer = Timer(mod, params, target, repeat=repeat, warmup=1, tuning_log=tuning_log)
    outs = timer.outputs()
    return outs, timer.build_seconds, timer().median_ms


def time_function(func, args: Sequence, repeat: int = 10, number: int = 1, min_repeat_ms: int = 0,
                  device=None, settle_threads: bool = True) -> Timing:
    """Time a compiled TVM function (``tvm.build`` of a schedule) on ``args``.

    ``settle_threads=False`` leaves TVM's thread pool and ``TVM_NUM_THREADS`` as they are
    (:func:`~tvm_tcutils._tvm.settle_thread_count` starts the pool): for a single-threaded probe
    that runs while a user's model compiles.

    Examples
    --------
    >>> from tvm import te
    >>> x = te.placeholder((64,), name="x"); y = te.compute((64,), lambda i: x[i] * 2, name="y")
    >>> f = tvm.build(te.create_schedule(y.op), [x, y], "llvm")
    >>> a = tvm.nd.array(np.ones(64, "float32")); b = tvm.nd.empty((64,), "float32")
    >>> time_function(f, [a, b], repeat=3).median_ms > 0
    True
    """
    if settle_threads:
        settle_thread_count()
    evaluator = func.time_evaluator(func.entry_name, device or tvm.cpu(), number=number, repeat=repeat,
                                    min_repeat_ms=min_repeat_ms)
    return Timing(tuple(s * 1e3 for s in evaluator(*args).results))


def time_callable(func: Callable[[], object], repeat: int = 10, number: int = 1, warmup: int = 1) -> Timing:
    """Time a Python callable (another runtime's session, for example) the same way.

    Each sample is the mean of ``number`` calls, in ms.

    Examples
    --------
    >>> time_callable(lambda: sum(range(100)), repeat=3).median_ms >= 0
    True
    """
    for _ in range(max(warmup, 0)):
        func()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(number):
            func()
        samples.append((time.perf_counter() - start) * 1e3 / number)
    return Timing(tuple(samples))


def measure_modules(mods: Sequence[tvm.IRModule], target: Optional[str] = None, repeat: int = 10,
                    warmup: int = 2, min_repeat_ms: int = WHOLE_MODEL_MIN_REPEAT_MS,
                    tuning_log: Optional[str] = None, rounds: int = 5) -> List[Timing]:
    """Build several whole modules, then time them in turns for ``rounds`` rounds.

    A module that fails to build or run gets an empty :class:`Timing`
    (median ``inf``); the others are still timed.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> m = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))
    >>> [t.median_ms > 0 for t in measure_modules([m, m], "llvm", 2, 1, 1, rounds=2)]
    [True, True]
    """
    timers: Dict[str, Callable[[], float]] = {}
    for k, mod in enumerate(mods):
        try:
            timers[str(k)] = Timer(mod, None, target, repeat, warmup, min_repeat_ms, tuning_log).sample
        except (tvm.TVMError, RuntimeError, ValueError) as err:
            logger.warning("whole-model build failed: %s", error_line(err))
    timed = interleave(timers, rounds) if timers else {}
    return [timed.get(str(k), Timing(())) for k in range(len(mods))]


def latency_ms(lib, mod: tvm.IRModule, params: Optional[Params] = None, repeat: int = 10) -> Tuple[float, np.ndarray]:
    """Median latency (ms) of a built model on random inputs, and its first output.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> ms, out = latency_ms(build(mod, params), mod, params, repeat=3)
    >>> out.shape
    (1, 10)
    """
    timer = Timer(mod, params, repeat=repeat, warmup=1, lib=lib)
    return timer().median_ms, timer.outputs()[0]


def error_line(err: BaseException) -> str:
    """The informative line of a TVM error (the last one naming an error or a failed check).

    Examples
    --------
    >>> error_line(RuntimeError("Traceback:\\n  0: foo\\nCheck failed: x == y\\n"))
    'Check failed: x == y'
    """
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "rror" in line or "Check failed" in line]
    return (useful[-1] if useful else (lines[-1] if lines else ""))[:300]


# ---------------------------------------------------------------------------
# Where a measurement was taken
# ---------------------------------------------------------------------------
def _cpu_info() -> Tuple[str, set]:
    """``(CPU model name, flags)`` from /proc/cpuinfo (the platform's names where it cannot be read)."""
    cpu = platform.processor() or platform.machine()
    flags: set = set()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name") and cpu in ("", platform.machine()):
                    cpu = line.split(":", 1)[1].strip()
                elif line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return cpu, flags


def cpu_name() -> str:
    """This machine's CPU model name, as :func:`machine` records it (nothing started to find it).

    Examples
    --------
    >>> cpu_name() == machine()["cpu"]
    True
    """
    return _cpu_info()[0]


def machine() -> dict:
    """What a timing depends on: CPU model and dot-product features, cores, threads, TVM, date.

    Every benchmark writes this next to its numbers, since this project's
    machines change between sessions.

    Examples
    --------
    >>> info = machine()
    >>> sorted(info)[:4]
    ['cores', 'cpu', 'date', 'features']
    """
    cpu, flags = _cpu_info()
    wanted = ("avx512_vnni", "avx_vnni", "avx512f", "avx512bw", "avx2", "sse4_2", "avx512_bf16", "amx_tile",
              "amx_int8")
    return {
        "cpu": cpu,
        "features": [f for f in wanted if f in flags],
        "cores": os.cpu_count(),
        "tvm_threads": pool_size(),
        "host_target": host_target(),
        "tvm": tvm.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }
