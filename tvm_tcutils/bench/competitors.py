"""A uniform way to time a contender, whatever runs it; contenders are compared in turns.

A *timer* is a function of no arguments that runs its contender and returns one
sample in ms (the median of a few runs), as :func:`tvm_tcutils.measure.interleave`
expects. The constructors here build one for each kind of contender a
benchmark compares:

=====================  ====================================================  =====================================
contender              constructor                                           timed by
=====================  ====================================================  =====================================
Relay module (TVM)     :func:`relay_module` (or ``lib=`` an already built)   :class:`tvm_tcutils.measure.Timer`
compiled TE function   :func:`te_function`                                   :func:`tvm_tcutils.measure.time_function`
onnxruntime session    :func:`onnx_session` (of :func:`ort_session`)          :func:`tvm_tcutils.measure.time_callable`
OpenVINO on a file     :func:`openvino_file`                                 :func:`tvm_tcutils.measure.time_callable`
any Python callable    :func:`python_call`                                   :func:`tvm_tcutils.measure.time_callable`
=====================  ====================================================  =====================================

:func:`compare` times a dict of them in turns and :func:`ratios` divides each
by a baseline, with intervals.

Examples
--------
>>> from tvm_tcutils.models import load_model
>>> mod, params = load_model("mlp")
>>> timings = compare({"a": relay_module(mod, params, repeat=2), "b": relay_module(mod, params, repeat=2)}, rounds=3)
>>> r = ratios(timings, "b")["a"]
>>> 0.3 < r.value < 3 and r.low <= r.value <= r.high
True
"""
from __future__ import annotations

import argparse
import contextlib
import contextvars
import dataclasses
import math
import time
from typing import Callable, Dict, Iterator, Mapping, Optional, Sequence

from ..measure import Ratio, Timer, Timing, interleave, ratio, time_callable, time_function
from ..progress import ProgressArg, check_progress

SampleTimer = Callable[[], float]


def relay_module(mod, params=None, target: Optional[str] = None, repeat: int = 5, warmup: int = 2,
                 min_repeat_ms: int = 0, tuning_log: Optional[str] = None, lib=None,
                 inputs=None) -> SampleTimer:
    """A Relay module built once by TVM (or ``lib``, already built), timed by :class:`~tvm_tcutils.measure.Timer`.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> relay_module(*load_model("mlp"), repeat=2)() > 0
    True
    """
    return Timer(mod, params, target, repeat=repeat, warmup=warmup, min_repeat_ms=min_repeat_ms,
                 tuning_log=tuning_log, lib=lib, inputs=inputs).sample


def te_function(func, args: Sequence, repeat: int = 3, min_repeat_ms: int = 100) -> SampleTimer:
    """A compiled TVM function (``tvm.build``) on ``args``.

    Examples
    --------
    >>> import numpy as np, tvm
    >>> from tvm import te
    >>> x = te.placeholder((64,), name="x"); y = te.compute((64,), lambda i: x[i] + 1, name="y")
    >>> f = tvm.build(te.create_schedule(y.op), [x, y], "llvm")
    >>> te_function(f, [tvm.nd.array(np.ones(64, "float32")), tvm.nd.empty((64,))], min_repeat_ms=1)() > 0
    True
    """
    return lambda: time_function(func, args, repeat=repeat, min_repeat_ms=min_repeat_ms).median_ms


def python_call(func: Callable[[], object], repeat: int = 3, number: int = 1, min_ms: float = 0.0) -> SampleTimer:
    """Any Python callable; with ``min_ms``, each sample averages enough calls to last that long.

    ``number`` is then set once, from a first timed call, so that short calls are not
    dominated by the clock.

    Examples
    --------
    >>> python_call(lambda: sum(range(1000)), min_ms=1.0)() > 0
    True
    """
    if min_ms > 0:
        start = time.perf_counter()
        func()
        once_ms = max((time.perf_counter() - start) * 1e3, 1e-3)
        number = max(number, int(min_ms / once_ms) + 1)
    return lambda: time_callable(func, repeat=repeat, number=number, warmup=1).median_ms


def onnx_session(session, feeds: Mapping[str, object], repeat: int = 3, min_ms: float = 100.0) -> SampleTimer:
    """An onnxruntime ``InferenceSession`` run on ``feeds`` (``session.run``), or a bound one.

    ``feeds`` may be an ``IOBinding`` instead of a dict: then ``run_with_iobinding``
    runs it, without Python-side copies.

    Examples
    --------
    >>> from tvm_tcutils.models import onnx_model
    >>> import numpy as np, onnxruntime
    >>> model = onnx_model("mobilenet-v2-onnx")
    >>> sess = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    >>> x = np.zeros([d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim], "float32")
    >>> onnx_session(sess, {model.graph.input[0].name: x}, repeat=1, min_ms=1)() > 0
    True
    """
    if hasattr(feeds, "bind_input") or hasattr(feeds, "bind_cpu_input"):
        return python_call(lambda: session.run_with_iobinding(feeds), repeat=repeat, min_ms=min_ms)
    feeds = dict(feeds)
    return python_call(lambda: session.run(None, feeds), repeat=repeat, min_ms=min_ms)


def ort_session(model, threads: int, pinned: bool = False):
    """An onnxruntime CPU session of an ONNX model (``ModelProto`` or file) at ``threads`` intra-op threads.

    ``pinned``: one thread per CPU, as TVM's pool and OpenVINO pin theirs (the calling thread, which runs
    a share of each op, to the first CPU this process may use; the pool's threads to the next ones). For a
    process of its own (:mod:`.isolated`): unpinned, onnxruntime's two threads at times shared one core for
    whole runs there, at half its speed.

    Examples
    --------
    >>> from tvm_tcutils.models import onnx_model
    >>> ort_session(onnx_model("mobilenet-v2-onnx"), 1).get_inputs()[0].name
    'input'
    """
    import onnx
    import onnxruntime as ort

    model = onnx.load(model) if isinstance(model, str) else model
    model.ir_version = min(model.ir_version, 8)  # onnx 1.23 writes IR 14, newer than this ORT reads
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if pinned and threads > 1:
        import os

        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < threads:
            raise ValueError(f"threads={threads} pinned needs as many CPUs; this process may use {len(cpus)}")
        os.sched_setaffinity(0, {cpus[0]})
        # onnxruntime numbers processors from 1; one entry per pool thread (threads - 1 of them).
        opts.add_session_config_entry("session.intra_op_thread_affinities",
                                      ";".join(str(cpu + 1) for cpu in cpus[1:threads]))
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def openvino_file(path: str, feeds: Mapping[str, object], threads: int, repeat: int = 3,
                  min_ms: float = 100.0, pinned: bool = False) -> SampleTimer:
    """OpenVINO's CPU plugin on an ONNX file, compiled for latency at ``threads`` threads (QDQ files run in
    int8; float parts in OpenVINO's default inference precision, bf16 on CPUs that have it).

    ``pinned``: OpenVINO's default CPU pinning (on Linux), for a process of its own; off (the default here),
    for timing in turns with other runtimes in one process.

    Raises
    ------
    ImportError
        OpenVINO is not installed.
    """
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {
        "INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
        "ENABLE_CPU_PINNING": pinned})
    request = compiled.create_infer_request()
    feeds = dict(feeds)
    return python_call(lambda: request.infer(feeds), repeat=repeat, min_ms=min_ms)


def settled(timer: SampleTimer, pause_s: float = 0.02) -> SampleTimer:
    """``timer`` after a pause and one untimed call: the previous contender's threads stop spinning first.

    TVM's pool and OpenBLAS spin a while after their last task; timed right
    after them, a contender pays for their spinning.

    Examples
    --------
    >>> calls = []
    >>> settled(lambda: calls.append(1) or 1.0, pause_s=0)(), len(calls)
    (1.0, 2)
    """
    def sample() -> float:
        time.sleep(pause_s)
        timer()
        return timer()

    return sample


@dataclasses.dataclass(frozen=True)
class TimingSettings:
    """How :func:`compare` runs when its caller does not say: progress and a time budget per comparison."""

    progress: ProgressArg = False
    time_budget_s: Optional[float] = None


_SETTINGS: contextvars.ContextVar[TimingSettings] = contextvars.ContextVar("timing_settings", default=TimingSettings())


@contextlib.contextmanager
def timing_settings(progress: ProgressArg = False, time_budget_s: Optional[float] = None) -> Iterator[TimingSettings]:
    """Within the block, every :func:`compare` shows ``progress`` and stops at ``time_budget_s`` seconds.

    A benchmark script sets them once (``--time-budget``, a bar on a terminal)
    instead of passing them through each table's helpers.

    Examples
    --------
    >>> with timing_settings(time_budget_s=0.0):
    ...     len(compare({"a": lambda: 1.0}, rounds=5)["a"].samples_ms)
    1
    """
    token = _SETTINGS.set(TimingSettings(check_progress(progress), time_budget_s))
    try:
        yield _SETTINGS.get()
    finally:
        _SETTINGS.reset(token)


def add_timing_arguments(parser) -> None:
    """``--time-budget SECONDS`` (per side-by-side comparison) and ``--no-progress`` on a script's parser.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser(); add_timing_arguments(p)
    >>> p.parse_args(["--time-budget", "30"]).time_budget
    30.0
    """
    parser.add_argument("--time-budget", type=_seconds, default=None, metavar="SECONDS",
                        help="per comparison: stop after the round that ends past this many seconds "
                             "(fewer samples; the JSON records the rounds done)")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar while timing (default: one on a terminal)")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return value


def use_timing_arguments(args) -> TimingSettings:
    """Apply a script's :func:`add_timing_arguments` to every later :func:`compare` of this context.

    Examples
    --------
    >>> import argparse
    >>> use_timing_arguments(argparse.Namespace(time_budget=None, no_progress=True)).progress
    False
    """
    settings = TimingSettings(False if args.no_progress else None, args.time_budget)
    _SETTINGS.set(settings)
    return settings


def compare(timers: Mapping[str, Optional[SampleTimer]], rounds: int = 5, *, progress: ProgressArg = None,
            time_budget_s: Optional[float] = None) -> Dict[str, Timing]:
    """Time the contenders in turns (:func:`~tvm_tcutils.measure.interleave`); ``None`` gets an empty timing.

    A contender that could not be built is passed as ``None`` and keeps its
    place in the result (median ``inf``), so that a table keeps its columns.
    ``progress`` and ``time_budget_s`` are :func:`~tvm_tcutils.measure.interleave`'s;
    left out (None), they come from :func:`timing_settings` (default: no
    progress, no budget).

    Examples
    --------
    >>> out = compare({"a": lambda: 1.0, "b": None}, rounds=2)
    >>> out["a"].median_ms, out["b"].samples_ms
    (1.0, ())
    """
    settings = _SETTINGS.get()
    timed = interleave({name: t for name, t in timers.items() if t is not None}, rounds,
                       progress=settings.progress if progress is None else progress,
                       time_budget_s=settings.time_budget_s if time_budget_s is None else time_budget_s)
    return {name: timed.get(name, Timing(())) for name in timers}


def ratios(timings: Mapping[str, Timing], baseline: str) -> Dict[str, Ratio]:
    """Each contender's median over the baseline's, with its bootstrap interval (< 1: faster).

    Examples
    --------
    >>> r = ratios({"fast": Timing((1.0, 1.0)), "base": Timing((2.0, 2.0))}, "base")
    >>> r["fast"].value, r["base"].value
    (0.5, 1.0)
    """
    return {name: ratio(timing, timings[baseline]) for name, timing in timings.items()}


def timed_once(func: Callable[[], object]):
    """``(func(), seconds)``: one untimed-warm-up-free run, timed by :func:`~tvm_tcutils.measure.time_callable`.

    For steps that run once (a search, an enumeration, a build) and whose result is needed.

    Examples
    --------
    >>> value, seconds = timed_once(lambda: 42)
    >>> value, seconds >= 0
    (42, True)
    """
    box = []
    timing = time_callable(lambda: box.append(func()), repeat=1, warmup=0)
    return box[0], timing.median_ms / 1e3
