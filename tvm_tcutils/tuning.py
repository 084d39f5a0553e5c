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
import json
import logging
import os
import shutil
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ._tvm import settle_thread_count, tvm
from tvm import autotvm
from tvm.autotvm.env import AutotvmGlobalScope, reset_global_scope
from tvm.contrib.popen_pool import PopenPoolExecutor

from . import prebuild, processes
from .progress import Reporter
from .models import Params

logger = logging.getLogger("tvm_tcutils.tuning")


def extract_tasks(mod: tvm.IRModule, params: Params, target: str) -> List[autotvm.task.Task]:
    """AutoTVM tasks of ``mod`` for ``target`` (the package's dot-product templates included).

    The module first goes through :func:`tvm_tcutils.prebuild.prepare`, as
    ``measure.build`` does, so that a QDQ model's tasks are those of the
    integer convolutions that will be built, not of the float ones in its file.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.dotprod.quantize import quantize_int8
    >>> qmod = quantize_int8(*load_model("mlp"))
    >>> [task.name for task in extract_tasks(qmod, {}, "llvm -mcpu=znver4")]
    ['tcutils.dense_dot', 'tcutils.dense_dot', 'tcutils.dense_dot']
    """
    mod, params = prebuild.prepare(mod, params, target)
    return autotvm.task.extract_from_program(mod["main"], target=target, params=params)


Record = Tuple[autotvm.measure.MeasureInput, autotvm.measure.MeasureResult]

#: What a damaged AutoTVM log line raises while it is decoded (cut JSON, wrong
#: field types, an unknown knob kind (RuntimeError), a target string TVM rejects).
_DECODE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError, RuntimeError)


def read_log(path: str) -> List[Record]:
    """The records of an AutoTVM log, skipping lines that cannot be read, with one warning.

    A tuning session killed while writing leaves a cut last line; a disk error
    or an editor can leave worse. AutoTVM's own reader stops at the first such
    line; this one keeps every readable record and names the file and lines it
    skipped, so tuning resumes and builds use what was measured.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "cut.log")
    >>> with open(path, "w") as f:
    ...     _ = f.write('{"input": ["llvm", "x"')   # a line cut by a kill
    >>> read_log(path)
    []
    """
    records, bad = [], []
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(number)
                continue
            if not line.strip() or line.startswith("#"):
                continue
            try:
                record = autotvm.record.decode(line)
            except _DECODE_ERRORS:
                bad.append(number)
                continue
            if record is not None:
                records.append(record)
                if CONFIRMED_KEY in line:
                    _mark_confirmed(record, line)
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (", ..." if len(bad) > 5 else "")
        logger.warning("%s: skipped %d unreadable line(s) (line %s); the other %d records are used",
                       path, len(bad), shown, len(records))
    return records


#: The key a confirmation record (:func:`confirm_best`) carries on its log line, beside AutoTVM's own
#: (AutoTVM's reader ignores it): ``{"chosen": bool, "rounds": int}``.
CONFIRMED_KEY = "tcutils_confirmed"


def _mark_confirmed(record: Record, line: str) -> None:
    try:
        mark = json.loads(line).get(CONFIRMED_KEY)
    except (ValueError, AttributeError):
        return
    if isinstance(mark, dict):
        record[1].tcutils_chosen = bool(mark.get("chosen"))


def _chosen(record: Record) -> Optional[bool]:
    """True / False for a confirmation record (chosen or not), None for a tuner's trial."""
    return getattr(record[1], "tcutils_chosen", None)


def applied_records(path: str) -> List[Record]:
    """The records a build should apply: :func:`checked_records`, and for a task whose candidates were
    confirmed in turns (:func:`confirm_best`) only the configuration chosen there.

    AutoTVM's ``apply_history_best`` takes, per task, the record of least mean time; a single trial's
    time can be far off on a shared machine (``scripts/probe_tuning_noise.py``), so a trial measured
    fast by chance would win over the confirmed choice. Pass these records to ``apply_history_best``
    (``tvm_tcutils.measure`` and the CLI do).

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "empty.log")
    >>> open(path, "w").close()
    >>> applied_records(path)
    []
    """
    records = checked_records(path)
    chosen = {}
    for record in records:
        if _chosen(record):
            chosen[_task_key(record)] = record  # the last confirmation of a task wins
    return [r for r in records if _task_key(r) not in chosen] + list(chosen.values())


def _task_key(record: Record) -> Tuple[str, Tuple]:
    return str(record[0].target), record[0].task.workload


def _space_of(record: Record):
    """The config space of a record's task, or None when its template is not registered here."""
    inp = record[0]
    try:
        return autotvm.task.create(inp.task.name, inp.task.args, inp.target).config_space
    except (KeyError, ValueError, TypeError, IndexError, tvm.TVMError) as err:
        logger.debug("no config space for %s: %s", inp.task.name, err)
        return None


def valid_indexes(space) -> List[int]:
    """The indexes of ``space``'s points, ascending: where a template filters its space (the dot-product
    tiles that fit in registers, :func:`~tvm_tcutils.dotprod.topi.common.limit_tile_space`), not
    ``range(len(space))``, as ``len`` counts the points and indexes run over every knob combination.

    Examples
    --------
    >>> from tvm import autotvm
    >>> space = autotvm.task.space.ConfigSpace()
    >>> _ = space.define_knob("tile", [1, 2, 4, 8])
    >>> space.multi_filter(filter=lambda e: e["tile"].val != 2)
    >>> valid_indexes(space), len(space)
    ([0, 2, 3], 3)
    """
    return [index for index in range(space.range_length) if space.is_index_valid(index)]


def _fits_space(config, space) -> bool:
    """Whether a recorded config is one of its space's points (same index, same knob values)."""
    if not (0 <= config.index < space.range_length and space.is_index_valid(config.index)):
        return False
    expected = space.get(config.index).to_json_dict()["entity"]
    return json.dumps(config.to_json_dict()["entity"]) == json.dumps(expected)


def checked_records(path: str) -> List[Record]:
    """The readable records of a log whose knob values belong to their task's config space.

    A record with knob values outside the space (a log from another version of
    a template, or edited by hand) can make a build run for ever; it is left
    out with a warning naming the file. Records of templates not registered in
    this process are kept as they are (nothing to check them against).

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "empty.log")
    >>> open(path, "w").close()
    >>> checked_records(path)
    []
    """
    spaces: Dict[Tuple, object] = {}
    kept, dropped = [], 0
    for record in read_log(path):
        inp = record[0]
        key = (inp.task.name, inp.task.args, str(inp.target))
        if key not in spaces:
            spaces[key] = _space_of(record)
        space = spaces[key]
        if space is not None and not _fits_space(inp.config, space):
            dropped += 1
            continue
        kept.append(record)
    if dropped:
        logger.warning("%s: left out %d record(s) whose knob values are not in their task's config space",
                       path, dropped)
    return kept


def _close_last_line(log: str) -> None:
    """End a log cut in the middle of a line with a newline, so the next record starts a line of its own."""
    try:
        with open(log, "rb+") as handle:
            handle.seek(0, os.SEEK_END)
            if handle.tell() == 0:
                return
            handle.seek(-1, os.SEEK_END)
            if handle.read(1) != b"\n":
                handle.write(b"\n")
    except FileNotFoundError:
        return


def _recorded(log: str) -> Dict[Tuple, List]:
    """Valid records in ``log`` by (target string, workload)."""
    done: Dict[Tuple, List] = {}
    if not os.path.exists(log):
        return done
    for inp, res in checked_records(log):
        done.setdefault((str(inp.target), inp.task.workload), []).append((inp, res))
    return done


def _measure_worker_init(scope: AutotvmGlobalScope, parent: int) -> None:
    """Set-up of an AutoTVM measuring worker: TVM's own, then die with the tuning process, and run on every
    CPU (not only on the core TVM pinned the tuning process's thread to: :func:`.processes.unpin`)."""
    reset_global_scope(scope)
    processes.die_with_parent(parent)
    processes.unpin()


def _check_local_device(target: str) -> None:
    """A ``ValueError`` when measuring for ``target`` needs a GPU that this machine cannot run kernels on."""
    if tvm.target.Target(target).kind.name != "cuda":
        return
    from . import cuda

    info = cuda.status()
    if not info["device"]:
        why = info["reason"] or info["driver"] or "no CUDA GPU"
        raise ValueError(f"target {target!r}: this machine cannot run CUDA kernels to measure them ({why}); "
                         "tune where the GPU is, or pass remote= (an RPC tracker key whose servers have one)")


class PackageLocalRunner(autotvm.LocalRunner):
    """AutoTVM's ``LocalRunner`` whose RPC server imports :mod:`tvm_tcutils` before it serves.

    TVM's own starts a stock server process, which knows nothing of the package:
    on a TVM built without CUDA (the PyPI wheels) it has no ``cuda`` device,
    since the device API comes from the package's CUDA plugin, so every CUDA
    measurement (and the device query before the first build) fails; kernels
    calling the toolchains' packed functions fail the same way. The tracker
    and the server listen on 127.0.0.1 only (TVM's bind every interface): they
    run whatever is uploaded, and nothing but this process uploads. Same
    arguments as ``LocalRunner``; with ``enable_cpu_cache_flush`` the flush
    before each repeat leaves the data in cache (:class:`_TuningServerInit`).

    Examples
    --------
    >>> runner = PackageLocalRunner(number=5, repeat=1)
    >>> runner.number, runner.host is None
    (5, True)
    """

    def set_task(self, task):
        from tvm.rpc.server import Server
        from tvm.rpc.tracker import Tracker

        init = _TuningServerInit if self.enable_cpu_cache_flush else processes.PackageServerInit
        self.task = task
        tracker = Tracker(host=_LOOPBACK, port=9000, port_end=10000, silent=True)
        key = f"$local$device${tracker.port}"
        server = Server(host=_LOOPBACK, port=9000, port_end=10000, key=key, silent=True,
                        tracker_addr=(_LOOPBACK, tracker.port),
                        server_init_callback=init(os.getpid()))
        self.key, self.host, self.port = key, _LOOPBACK, tracker.port
        autotvm.RPCRunner.set_task(self, task)
        return server, tracker


_LOOPBACK = "127.0.0.1"

#: The function AutoTVM's runner names (``f_preproc``) before each timed repeat when it flushes caches.
_CACHE_FLUSH = "cache_flush_cpu_non_first_arg"


def weights_of(args: Sequence) -> list:
    """The operands of a measured kernel (``args``: output first) that a network streams from memory: the
    packed weights, the inputs with the most dimensions (a conv's 7-D kernel, a dense's 4-D weight); the
    data, which the network's previous layer has just written, stays out.

    Examples
    --------
    >>> import numpy as np
    >>> out, bias, data, kernel = (np.zeros((1,) * rank) for rank in (5, 2, 5, 7))
    >>> [a.ndim for a in weights_of([out, bias, data, kernel])]
    [7]
    """
    inputs = list(args[1:])
    if not inputs:
        return []
    widest = max(len(a.shape) for a in inputs)
    return [a for a in inputs if len(a.shape) == widest]


class _TuningServerInit(processes.PackageServerInit):
    """:class:`~.processes.PackageServerInit`, and in that server's process (the package's local runner's,
    which only this process uploads to) AutoTVM's cache flush flushes the weights alone (:func:`weights_of`),
    through TVM's own flush. Flushing every input (TVM's) made ResNet-18's 56x56 convs, whose data is the
    large operand, tune for cold data and run 9 % slower in the network."""

    def __call__(self) -> None:
        super().__call__()
        from . import registry

        flush = tvm.get_global_func(_CACHE_FLUSH)
        registry.override_for_process(_CACHE_FLUSH, lambda *args: flush(args[0], *weights_of(args)))


def _workers_die_with_us(part, timeout: float) -> None:
    """Replace an AutoTVM builder's or runner's worker pool by one whose workers die with this process.

    The pool is TVM's public ``PopenPoolExecutor`` with the same per-call time
    limit; only its initializer differs. No worker has started yet: pools start
    them on first use.
    """
    part.executor = PopenPoolExecutor(timeout=timeout, initializer=_measure_worker_init,
                                      initargs=(AutotvmGlobalScope.current, os.getpid()))


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
    remote=None,
    time_budget_s: Optional[float] = None,
    templates: Optional[Sequence[str]] = None,
    confirm_rounds: int = 7,
) -> List[Tuple[str, int]]:
    """Tune every task of ``mod`` with ``XGBTuner`` for ``trials`` measurements each, resumably.

    Parameters
    ----------
    trials : int
        Measurements per task, counting those already in ``log``.
    log : str
        AutoTVM log; appended to, and read to resume.
    progress : bool or callable
        Show AutoTVM's progress bar per task; a callable instead gets a
        :class:`~tvm_tcutils.progress.ProgressUpdate` (phase ``tune <task>``,
        trials done and to do in that task) after each measured batch.
    time_budget_s : float, optional
        Seconds for the whole tuning: when they end, the task being tuned stops
        after its current batch (already in the log) and later tasks are not
        tuned (0 new trials in the summary). Resuming later goes on from the log.
    templates : sequence of str, optional
        Tune only the tasks of these AutoTVM templates (say, the tensor-core
        ``"tcutils.conv2d_hwnc_tensorcore.cuda"`` and not the float layers
        around it); the others get 0 new trials and build with what the log
        or their fallback gives them. A name no task of the model has is a
        ``ValueError`` that lists the model's templates.
    on_task : callable, optional
        ``on_task(index, total, task, new_trials)`` before each task.
    confirm_rounds : int
        After a task's trials, its untuned configuration and the tuner's fastest are measured again
        in turns, this many rounds (:func:`confirm_best`), and the configuration chosen there is the
        one :func:`applied_records` gives a build; 0 leaves the choice to the least single trial
        (AutoTVM's). Tasks of an older log are confirmed when it is resumed.
    remote : tvm_tcutils.rpc.RemoteBackend, optional
        Measure on the servers of an RPC tracker's key with AutoTVM's
        ``RPCRunner`` (as many in parallel as the key has free servers)
        instead of this machine's ``LocalRunner``; same trials, same log.

    Returns
    -------
    list of (task name, new trials run)

    Examples
    --------
    Skipped by the doctest run: it measures on this CPU for about 20 s even
    with 2 trials per task (``python_tests/test_tuning_cli.py`` runs it).

    >>> from tvm_tcutils import host_target
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.dotprod.quantize import quantize_int8
    >>> qmod = quantize_int8(*load_model("mlp"))
    >>> tune(qmod, {}, host_target(), 2, "int8.log")  # doctest: +SKIP
    [('tcutils.dense_dot', 2), ('tcutils.dense_dot', 2), ('tcutils.dense_dot', 2)]
    """
    if trials < 1:
        raise ValueError(f"trials must be at least 1, got {trials}")
    if isinstance(confirm_rounds, bool) or not isinstance(confirm_rounds, int) or confirm_rounds < 0:
        raise ValueError(f"confirm_rounds must be an int >= 0 (0: no confirmation), got {confirm_rounds!r}")
    if time_budget_s is not None and not (isinstance(time_budget_s, (int, float)) and time_budget_s >= 0):
        raise ValueError(f"time_budget_s must be a number of seconds >= 0 or None, got {time_budget_s!r}")
    report = Reporter(progress if callable(progress) and not isinstance(progress, bool) else False)
    deadline = None if time_budget_s is None else time.perf_counter() + time_budget_s
    if remote is None:
        _check_local_device(target)
    if templates is not None and (isinstance(templates, str)
                                  or not all(isinstance(name, str) for name in templates)):
        raise TypeError(f"templates must be a list of AutoTVM template names, got {templates!r}")
    tasks = extract_tasks(mod, params, target)
    if templates is not None:
        present = sorted({task.name for task in tasks})
        unknown = sorted(set(templates) - set(present))
        if unknown:
            raise ValueError(f"templates: no task of the model uses {', '.join(unknown)}; "
                             f"its templates: {', '.join(present) or 'none'}")
    done = _recorded(log)
    _close_last_line(log)
    builder = autotvm.LocalBuilder()
    if remote is not None:
        runner = remote.autotvm_runner(number=measure_number, repeat=1, min_repeat_ms=0, timeout=20)
    else:
        # The runner's server process inherits the environment: it times kernels as measure does.
        settle_thread_count()
        if tvm.target.Target(target).kind.name == "llvm":
            # Each run with the weights' caches flushed (one run a sample, measure_number samples): in a
            # network a layer's weights come from memory, and a tiling that wins on cached weights lost
            # 15 % in ResNet-18's 7x7 stage (docs/benchmarks/dotprod.md).
            runner = PackageLocalRunner(number=1, repeat=measure_number, min_repeat_ms=0, timeout=20,
                                        enable_cpu_cache_flush=True)
        else:
            runner = PackageLocalRunner(number=measure_number, repeat=1, min_repeat_ms=0, timeout=20)
    # The limits TVM gives its own pools (a runner's call covers n_parallel runs and a set-up).
    _workers_die_with_us(builder, builder.timeout)
    _workers_die_with_us(runner, runner.timeout * (runner.n_parallel + 1))
    measure = autotvm.measure_option(builder=builder, runner=runner)
    summary = []
    # The runner's RPC tracker and server (and the server's per-measurement forks) cannot be
    # configured: the reaper kills them if this process is killed.
    with processes.reaper():
        for index, task in enumerate(tasks):
            history = done.get((str(task.target), task.workload), [])
            todo = min(trials, len(task.config_space)) - len(history)
            if templates is not None and task.name not in templates:
                todo = 0
            if on_task is not None:
                on_task(index, len(tasks), task, max(todo, 0))
            if todo <= 0 or (deadline is not None and time.perf_counter() >= deadline):
                if todo <= 0 and (templates is None or task.name in templates):
                    _confirm_task(task, log, history, measure, confirm_rounds, deadline, fresh=False)
                summary.append((task.name, 0))
                continue
            measured = {inp.config.index for inp, _ in history}
            default = default_config_index(task)
            tuner = _DefaultFirst(task, None if default in measured else default, loss_type="reg")
            if history:
                try:
                    tuner.load_history(history, min_seed_records=1)
                except ValueError as err:  # xgboost's XGBoostError: feature widths of a few seed records differ
                    logger.warning("%s: the log's %d trials of %s could not seed the tuner's model (%s); they still "
                                   "count toward trials", log, len(history), task.name, str(err).splitlines()[0][:160])
            # After log_to_file: a batch is in the log before the budget can stop the task.
            counted = _TrialCounter(f"tune {task.name}", todo, report, deadline)
            # The trials as the log gets them, for the confirmation (no second read of the log).
            trials_run: List[Record] = []
            callbacks = [autotvm.callback.log_to_file(log), counted,
                         lambda _tuner, inputs, results: trials_run.extend(zip(inputs, results))]
            if progress and not callable(progress):
                prefix = f"[{index + 1}/{len(tasks)}] {task.name}"
                callbacks.insert(0, autotvm.callback.progress_bar(todo, prefix=prefix))
            try:
                tuner.tune(n_trial=todo, early_stopping=early_stopping, measure_option=measure, callbacks=callbacks)
            except _BudgetEnded:
                autotvm.env.GLOBAL_SCOPE.in_tuning = False  # what tuner.tune does last, skipped by the exception
                logger.info("tuning: the time budget of %g s ended in %s after %d trials", time_budget_s,
                            task.name, counted.trials)
            _confirm_task(task, log, history + trials_run, measure, confirm_rounds, deadline,
                          fresh=counted.trials > 0)
            summary.append((task.name, counted.trials))
    return summary


def _confirm_task(task, log: str, history: List[Record], measure: dict, rounds: int,
                  deadline: Optional[float], fresh: bool) -> None:
    """:func:`confirm_best` for one task and its records (``history``), appended to ``log``, unless the log
    already confirmed them (``fresh``: trials came after any confirmation)."""
    if rounds < 2 or (deadline is not None and time.perf_counter() >= deadline):
        return
    if not fresh and any(_chosen(record) is not None for record in history):
        return
    default = default_config_index(task)
    records = confirm_best(task, history, measure, rounds, default)
    if records:
        write_confirmed(log, records, rounds)
        chosen = next(inp.config.index for inp, res in records if _chosen((inp, res)))
        logger.info("tuning: %s confirmed in %d rounds: config %d (untuned %s)", task.name, rounds, chosen, default)


#: Configurations besides the untuned one that :func:`confirm_best` measures again: the tuner's fastest.
CONFIRM_CANDIDATES = 2

#: Fewest trials of a task that :func:`confirm_best` confirms: below it the confirmation would measure
#: more than the tuner did (a quick look at a model, not a tuning).
CONFIRM_MIN_TRIALS = 8


def confirm_best(task: autotvm.task.Task, history: Sequence[Record], measure_option: dict, rounds: int,
                 default: Optional[int]) -> List[Record]:
    """Measure a task's untuned configuration and the tuner's fastest ones again, in turns; pick one.

    A trial's time can be far off on a shared machine (one configuration measured three times among a
    task's trials landed up to x2.35 apart: ``scripts/probe_tuning_noise.py``), so the least time in
    ``history`` may be chance. Here the untuned configuration (``default``, a point of the task's
    space) and the :data:`CONFIRM_CANDIDATES` fastest others are built once and measured ``rounds``
    times, each round all of them in turn (the order reversed every other round). A configuration is
    chosen over the untuned one only when it was faster in all rounds but at most one and its median is
    lower; of several such, the one of least median. Returns one record per measured configuration
    (costs: its round times; the chosen one marked), for the log; ``[]`` when there is nothing to
    confirm (no untuned point, fewer than :data:`CONFIRM_MIN_TRIALS` trials, or the untuned one already
    the fastest) or the untuned one failed a round.
    """
    measured = [(float(np.mean(res.costs)), inp.config.index) for inp, res in history if res.error_no == 0]
    if default is None or rounds < 2 or len(measured) < CONFIRM_MIN_TRIALS:
        return []
    order = [index for _, index in sorted(measured)]
    if order[0] == default:
        return []
    others = list(dict.fromkeys(i for i in order if i != default))[:CONFIRM_CANDIDATES]
    indexes = [default] + others
    inputs = [autotvm.measure.MeasureInput(task.target, task, task.config_space.get(i)) for i in indexes]
    # Sets the builder and runner up for the task; the runner's server lives as long as this object.
    attached = autotvm.measure.create_measure_batch(task, measure_option)
    builder, runner = measure_option["builder"], measure_option["runner"]
    built = builder.build(inputs)
    times: Dict[int, List[float]] = {i: [] for i in indexes}
    failed = {indexes[k] for k, result in enumerate(built) if result.error is not None}
    # The runner deletes each library after its run: keep a copy to put back before the next round.
    kept = tempfile.mkdtemp(prefix="tcutils-confirm-")
    try:
        for result in built:
            if result.error is None:
                shutil.copy(result.filename, kept)
        for round_index in range(rounds):
            turn = [k for k in range(len(inputs)) if indexes[k] not in failed]
            turn = turn if round_index % 2 == 0 else turn[::-1]
            for k in turn:
                if not os.path.exists(built[k].filename):
                    shutil.copy(os.path.join(kept, os.path.basename(built[k].filename)), built[k].filename)
            results = runner.run([inputs[k] for k in turn], [built[k] for k in turn])
            for k, res in zip(turn, results):
                if res.error_no == 0:
                    times[indexes[k]].append(float(np.mean(res.costs)))
                else:
                    failed.add(indexes[k])
    finally:
        shutil.rmtree(kept, ignore_errors=True)
        del attached
    if default in failed or len(times[default]) != rounds:
        return []  # the untuned configuration did not run every round: nothing sound to pick by
    chosen = choose_confirmed(times[default], {i: times[i] for i in others if i not in failed})
    chosen = default if chosen is None else chosen
    now = time.time()
    records = []
    for inp, index in zip(inputs, indexes):
        if index in failed:
            continue
        result = autotvm.measure.MeasureResult(tuple(times[index]), 0, float(sum(times[index])), now)
        result.tcutils_chosen = index == chosen
        records.append((inp, result))
    return records


def choose_confirmed(untuned: Sequence[float], others: Dict[int, Sequence[float]]) -> Optional[int]:
    """The configuration of ``others`` (index -> its time in each round) chosen over the untuned one
    (``untuned``: its times in the same rounds), or None: faster in all rounds but at most one, and a
    lower median; of several such, the least median.

    Examples
    --------
    >>> choose_confirmed([2.0, 2.1, 1.9, 2.0], {5: [1.5, 1.6, 2.0, 1.4], 7: [1.0, 2.5, 2.4, 1.0]})
    5
    >>> choose_confirmed([2.0, 2.1, 1.9, 2.0], {7: [1.0, 2.5, 2.4, 1.0]}) is None   # two rounds lost
    True
    """
    rounds, best, chosen = len(untuned), float(np.median(untuned)), None
    for index, times in others.items():
        if len(times) != rounds:
            continue  # it failed a round
        wins = sum(t < u for t, u in zip(times, untuned))
        median = float(np.median(times))
        if wins >= rounds - 1 and median < best:
            chosen, best = index, median
    return chosen


def write_confirmed(log: str, records: Sequence[Record], rounds: int) -> None:
    """Append :func:`confirm_best`'s records to ``log``, each line marked with :data:`CONFIRMED_KEY`."""
    with open(log, "a") as handle:
        for inp, res in records:
            row = json.loads(autotvm.record.encode(inp, res))
            row[CONFIRMED_KEY] = {"chosen": bool(_chosen((inp, res))), "rounds": rounds}
            handle.write(json.dumps(row) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def default_config_index(task: autotvm.task.Task) -> Optional[int]:
    """The point of ``task``'s config space that an untuned build runs (the template's fallback), or None
    where the fallback is not a point of the space.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.dotprod.quantize import quantize_int8
    >>> task = extract_tasks(quantize_int8(*load_model("mlp")), {}, "llvm -mcpu=znver4")[0]
    >>> index = default_config_index(task)
    >>> 0 <= index < len(task.config_space)
    True
    """
    fallback = autotvm.task.space.FallbackConfigEntity()
    with tvm.target.Target(task.target):
        task.instantiate(fallback)
    space = task.config_space
    knob = []
    for name, candidates in space.space_map.items():
        try:
            chosen = str(fallback[name])
        except KeyError:
            return None
        matches = [j for j, entity in enumerate(candidates.entities) if str(entity) == chosen]
        if not matches:
            return None
        knob.append(matches[0])
    index = space.knob2point(knob)
    return index if space.is_index_valid(index) else None


class _DefaultFirst(autotvm.tuner.XGBTuner):
    """``XGBTuner`` whose first measurement is the configuration an untuned build runs, so that the log
    holds it: ``apply_history_best`` then picks a tuned configuration only where one was measured faster
    than the default (the package's fallbacks were chosen by measuring the network's kernels; a random
    start of 32 trials need not even meet them)."""

    def __init__(self, task, default: Optional[int], **kwargs):
        super().__init__(task, **kwargs)
        self._default = default

    def next_batch(self, batch_size):
        default, self._default = self._default, None
        if default is None or default in self.visited or batch_size < 1:
            return super().next_batch(batch_size)
        self.visited.add(default)
        return [self.space.get(default)] + super().next_batch(batch_size - 1)


class _BudgetEnded(Exception):
    """Raised by :class:`_TrialCounter` to end a task when the tuning budget is spent."""


class _TrialCounter:
    """An AutoTVM callback: counts a task's new trials, reports progress, ends the task past ``deadline``."""

    def __init__(self, phase: str, total: int, report: Reporter, deadline: Optional[float]):
        self.phase, self.total, self.report, self.deadline = phase, total, report, deadline
        self.trials = 0

    def __call__(self, tuner, inputs, results) -> None:
        self.trials += len(results)
        self.report(self.phase, min(self.trials, self.total), self.total)
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            raise _BudgetEnded


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
