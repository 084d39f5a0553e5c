"""Quantize, tune and build models for the int8 dot-product schedules (AutoTVM + XGBTuner).

:func:`tune` extracts the AutoTVM tasks of a model for a target (the package's
templates register themselves, see :mod:`tvm_tcutils.dotprod.strategy`),
tunes each with ``XGBTuner`` and appends every measurement to a log file. It
resumes from that log: trials already recorded for a task count toward
``trials`` and seed the tuner's cost model. :func:`build` compiles under
``apply_history_best`` of the log, so ``relay.build`` picks the tuned configs
up, including for the packed ops the alter-layout hook creates.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ._tvm import tvm
from tvm import autotvm, relay
from tvm.contrib import graph_executor

from .models import Params, random_inputs

DTYPES = ("float32", "int8")

logger = logging.getLogger("tvm_tcutils.tuning")


def quantize_int8(mod: tvm.IRModule, params: Params) -> tvm.IRModule:
    """An int8 version of a float model (``relay.quantize``, weights bound as constants).

    Convolutions become int8; relay.quantize may leave some dense layers in fp32 (it does so
    for ResNet-50's final one).

    Uses a global activation scale and per-tensor max weight scales (TVM 0.19's
    default power-of-two weight calibration calls ``np.math``, gone in NumPy 2).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> qmod = quantize_int8(*load_model("mlp"))  # doctest: +SKIP
    """
    with relay.quantize.qconfig(
        calibrate_mode="global_scale", global_scale=8.0, weight_scale="max", skip_conv_layers=[],
        skip_dense_layer=False,
    ):
        return relay.quantize.quantize(mod, params)


def prepare(mod: tvm.IRModule, params: Params, dtype: str) -> Tuple[tvm.IRModule, Params]:
    """The model to compile for ``dtype`` (``"float32"`` as is, ``"int8"`` quantized).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = prepare(*load_model("mlp"), "float32")
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype == "int8":
        return quantize_int8(mod, params), {}
    return mod, params


def extract_tasks(mod: tvm.IRModule, params: Params, target: str) -> List[autotvm.task.Task]:
    """AutoTVM tasks of ``mod`` for ``target`` (the package's dot-product templates included).

    Examples
    --------
    >>> tasks = extract_tasks(qmod, {}, "llvm -mcpu=znver4")  # doctest: +SKIP
    """
    return autotvm.task.extract_from_program(mod["main"], target=target, params=params)


def _recorded(log: str) -> Dict[Tuple, List]:
    """Valid records in ``log`` by (target string, workload)."""
    done: Dict[Tuple, List] = {}
    if not os.path.exists(log):
        return done
    for inp, res in autotvm.record.load_from_file(log):
        done.setdefault((str(inp.target), inp.task.workload), []).append((inp, res))
    return done


def tune(
    mod: tvm.IRModule,
    params: Params,
    target: str,
    trials: int,
    log: str,
    progress: bool = True,
    measure_number: int = 5,
    early_stopping: Optional[int] = None,
    on_task: Optional[Callable[[int, int, autotvm.task.Task, int], None]] = None,
) -> List[Tuple[str, int]]:
    """Tune every task of ``mod`` with ``XGBTuner`` for ``trials`` measurements each, resumably.

    Parameters
    ----------
    trials : int
        Measurements per task, counting those already in ``log``.
    log : str
        AutoTVM log; appended to, and read to resume.
    progress : bool
        Show AutoTVM's progress bar per task.
    on_task : callable, optional
        ``on_task(index, total, task, new_trials)`` before each task.

    Returns
    -------
    list of (task name, new trials run)

    Examples
    --------
    >>> tune(qmod, {}, "llvm -mcpu=znver4", 16, "int8.log")  # doctest: +SKIP
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    tasks = extract_tasks(mod, params, target)
    done = _recorded(log)
    measure = autotvm.measure_option(
        builder=autotvm.LocalBuilder(),
        runner=autotvm.LocalRunner(number=measure_number, repeat=1, min_repeat_ms=0, timeout=20),
    )
    summary = []
    for index, task in enumerate(tasks):
        history = done.get((str(task.target), task.workload), [])
        todo = min(trials, len(task.config_space)) - len(history)
        if on_task is not None:
            on_task(index, len(tasks), task, max(todo, 0))
        if todo <= 0:
            summary.append((task.name, 0))
            continue
        tuner = autotvm.tuner.XGBTuner(task, loss_type="reg")
        if history:
            tuner.load_history(history, min_seed_records=1)
        callbacks = [autotvm.callback.log_to_file(log)]
        if progress:
            callbacks.insert(0, autotvm.callback.progress_bar(todo, prefix=f"[{index + 1}/{len(tasks)}] {task.name}"))
        tuner.tune(n_trial=todo, early_stopping=early_stopping, measure_option=measure, callbacks=callbacks)
        summary.append((task.name, todo))
    return summary


def tuning_log_scope(log: Optional[str]):
    """``autotvm.apply_history_best(log)``, or a scope that changes nothing when ``log`` is empty.

    Examples
    --------
    >>> with tuning_log_scope(None):
    ...     pass
    """
    if not log:
        return contextlib.nullcontext()
    if not os.path.isfile(log):
        raise FileNotFoundError(f"tuning log not found: {log}")
    return autotvm.apply_history_best(log)


def tuning_log_digest(log: Optional[str]) -> str:
    """A short digest of a tuning log's content (``""`` without one), for cache keys.

    Examples
    --------
    >>> tuning_log_digest(None)
    ''
    """
    if not log:
        return ""
    with open(log, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()[:16]


def build(mod: tvm.IRModule, params: Params, target: str, log: Optional[str] = None):
    """``relay.build`` at opt_level 3, under ``apply_history_best(log)`` when a log is given.

    Examples
    --------
    >>> lib = build(qmod, {}, "llvm -mcpu=znver4", "int8.log")  # doctest: +SKIP
    """
    with tuning_log_scope(log), tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target, params=params)


def latency_ms(lib, mod: tvm.IRModule, params: Params, repeat: int = 10) -> Tuple[float, np.ndarray]:
    """Median latency (ms) of a built model on random inputs, and its first output.

    Examples
    --------
    >>> ms, out = latency_ms(lib, qmod, {})  # doctest: +SKIP
    """
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**random_inputs(mod, params))
    runner.run()
    timer = runner.module.time_evaluator("run", tvm.cpu(), number=1, repeat=repeat, min_repeat_ms=0)
    return float(np.median(timer().results) * 1e3), runner.get_output(0).numpy()
