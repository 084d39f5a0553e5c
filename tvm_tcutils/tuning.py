"""Resumable AutoTVM tuning of a whole model (XGBTuner), for any of the package's templates.

:func:`tune` extracts the AutoTVM tasks of a model for a target (the package's
templates register themselves, see :mod:`tvm_tcutils.dotprod.strategy`),
tunes each with ``XGBTuner`` and appends every measurement to a log file. It
resumes from that log: trials already recorded for a task count toward
``trials`` and seed the tuner's cost model. :func:`tvm_tcutils.measure.build`
compiles under ``apply_history_best`` of the log, so ``relay.build`` picks the
tuned configs up, including for the packed ops the alter-layout hooks create.
"""
from __future__ import annotations

import hashlib
import logging
import os
from typing import Callable, Dict, List, Optional, Tuple

from ._tvm import tvm
from tvm import autotvm, relay

from .measure import Params

logger = logging.getLogger("tvm_tcutils.tuning")


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
