"""Worker processes that build and time modules, one task at a time each, with a timeout.

A toolchain that aborts the process (an LLVM assertion, a segfault in a
library) or hangs costs one task (``inf``, with the reason), the worker is
replaced and the caller goes on. Each worker is a fresh interpreter (no fork of
a process holding TVM's thread pool) that times through
:mod:`tvm_tcutils.measure`, like everything else in the package.

A task is ``(kind, arguments)``; :data:`TASKS` says what each kind runs:

=============  ==============================================================
``candidate``  one module timed alone: ``{"ms": median}``
``wholes``     several whole modules timed in turns: ``{"ms_list": [...]}``
=============  ==============================================================

Tasks are pulled from an iterable only when a worker is free to take one
(:meth:`WorkerPool.run`), so a search over thousands of candidates holds at
most one serialised candidate per worker. A module may name constants that
were shared once per search (``constants``: a directory, see :mod:`.shared`).

Builds leave memory behind in a worker (loaded libraries, TVM's and the
toolchains' caches): a worker grown past :data:`RECYCLE_BYTES` is replaced
between two tasks, so a long search does not grow with the number of
candidates. Each worker runs in its own process group (killed whole on a timeout, so a
toolchain's own child processes go with it) and dies with its parent
(:func:`tvm_tcutils.processes.die_with_parent`); its stdout and stderr are read
all the time by threads that keep the last :data:`TAIL_BYTES` for error
messages, so a chatty toolchain never blocks on a full pipe.

A build or run that fails (:data:`EXPECTED_FAILURES`) answers
``{"ms": inf, "error": ...}``; any other exception in a worker is a bug (an
``ImportError`` in the package, a ``TypeError``) and is raised in the caller
as a :class:`WorkerError`, so that it stops the run instead of pricing every
candidate at ``inf``.
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import fcntl
import logging
import math
import os
import re
import subprocess
import sys
import threading
import time
import traceback
import weakref
from multiprocessing.connection import Connection, wait
from typing import Callable, Deque, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple

from ..._tvm import tvm
from ...measure import WHOLE_MODEL_MIN_REPEAT_MS
from ...processes import WORKER_POPEN_OPTIONS, die_with_parent, given_cpus, hold, kill_group, paused, release, unpin
from ..toolchains import packed_call
from ..toolchains.packed_call import forget_sessions
from .shared import PREFIX, SharedConstants, load_modules

#: What a failed build or run of a module raises (``tvm.TVMError`` is a ``RuntimeError``).
EXPECTED_FAILURES: Tuple[type, ...] = (tvm.TVMError, RuntimeError, ValueError, OSError, ArithmeticError,
                                       MemoryError)

Task = Tuple[str, dict]

logger = logging.getLogger("tvm_tcutils.collage")


class WorkerError(Exception):
    """A worker raised something other than a build or run failure: a bug, reported with its traceback."""


#: Seconds a whole model's build and timing may take in a worker (validation, the final comparison), at
#: least: the per-candidate timeout (``--timeout``, 120 s by default) is for operators and small
#: subgraphs; a quantized BERT-base built whole took over 120 s on a 2-vCPU VM with a second build beside
#: it, and a whole model that times out is left out of the comparison (the answer then a slower one).
WHOLE_MODEL_TIMEOUT_S = 600.0

#: Bytes of a worker's stdout and stderr kept (the last ones) for error messages.
TAIL_BYTES = 64 * 1024

#: Environment variable naming the CPUs a measuring worker pins itself to (a pool of several that measure
#: side by side: :attr:`WorkerPool.cpus_each`).
WORKER_CPUS_ENV = "TCUTILS_WORKER_CPUS"

#: A worker resident above this many bytes after a task is replaced before its next one.
RECYCLE_BYTES = 640 << 20  # a fresh worker is about 0.25 GB; starting one costs a few seconds

#: Environment variable giving a worker its pool's :attr:`WorkerPool.recycle_bytes`: above it after a task, the
#: worker first collects its garbage and gives freed memory back (:func:`_give_back_memory`).
RECYCLE_ENV = "TCUTILS_WORKER_RECYCLE_BYTES"

#: Tasks holding this many bytes (shared constants and computed tensors, :func:`task_bytes`) or more take turns.
HEAVY_BYTES = 64 << 20

#: Seconds between two messages of a worker waiting for its heavy task's turn (each restarts its clock).
WAIT_BEAT = 1.0

def _nothing() -> None:
    """Outside a worker there is no pool to tell."""


#: How a worker tells the pool it is waiting for, or has got, its turn (set by :func:`worker_entry`).
_alive: Callable[[], None] = _nothing

#: Whether this process is a measuring worker (set by :func:`worker_entry`).
_in_worker = False
_recycle_bytes = 0  # this worker's pool's RECYCLE_ENV (0: never trimmed)


def resident_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` in bytes (0 when unknown: not Linux, or the process is gone).

    Examples
    --------
    >>> resident_bytes(os.getpid()) > 0 or not sys.platform.startswith("linux")
    True
    """
    try:
        with open(f"/proc/{pid}/statm") as handle:
            return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, IndexError, ValueError):
        return 0


def shared_bytes(mod_jsons: Sequence[str], directory: Optional[str]) -> int:
    """Bytes of the shared constants (files in ``directory``) that the serialised modules name.

    Examples
    --------
    >>> shared_bytes(['{"name_hint": "x"}'], None)
    0
    """
    if directory is None:
        return 0
    numbers = set()
    for text in mod_jsons:
        numbers.update(re.findall(re.escape(PREFIX) + r"(\d+)", text))
    return sum(os.path.getsize(os.path.join(directory, f"c{n}.npy")) for n in numbers)


def computed_bytes(mod_jsons: Sequence[str]) -> int:
    """Bytes of the tensors the serialised modules compute (:func:`.packed_call.activation_bytes`).

    Typed without their weights: each shared constant is stood in for by a
    ``zeros`` call of its type (nothing is read), whose bytes are then taken off
    again, once per module.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(1, 1024))
    >>> computed_bytes([tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))])
    4096
    """
    from tvm import relay

    total = 0
    for text in mod_jsons:
        stood_in = [0]

        def stand_in(var: relay.Var) -> relay.Expr:
            stood_in[0] += packed_call.type_bytes(var.type_annotation)
            return relay.zeros(var.type_annotation.shape, var.type_annotation.dtype)

        [mod] = load_modules([text], stand_in=stand_in)
        mod = relay.transform.InferType()(mod)
        computed = sum(packed_call.activation_bytes(func) for func in mod.functions.values()
                       if isinstance(func, relay.Function))
        total += max(computed - stood_in[0], 0)
    return total


def task_bytes(mod_jsons: Sequence[str], directory: Optional[str]) -> int:
    """What a task's modules hold, about: their shared constants and the tensors they compute.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(1, 1024))
    >>> task_bytes([tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))], None)
    4096
    >>> task_bytes(["{"], None)  # does not load: its task fails alone
    0
    """
    weights = shared_bytes(mod_jsons, directory)
    try:
        return weights + computed_bytes(mod_jsons)
    # Text that does not load (TVM's JSON upgrader raises TypeError / KeyError on some) or does not
    # type-check fails in the task itself, where the error is reported: here it only counts as light.
    except EXPECTED_FAILURES + (TypeError, KeyError):
        return weights


@contextlib.contextmanager
def heavy_turn(mod_jsons: Sequence[str], directory: Optional[str], limit: int = HEAVY_BYTES):
    """Runs the block alone among the search's heavy tasks (``limit`` bytes of :func:`task_bytes` or more).

    Building and timing a large layer holds its weights several times over (TVM's
    parameters and the executor's copy, a toolchain's session and its packed
    copy: about 3 GB in one worker for VGG-16's 0.4 GB ``fc6``), and a candidate
    of many large layers holds their activations (and a toolchain its
    workspaces) besides, so heavy tasks
    in several workers at once would multiply the peak by the number of workers;
    lighter tasks run alongside. Tasks without shared constants (no search
    directory) never wait. The turn is an exclusive ``flock`` on a file in
    the search's constants directory: a worker killed while holding it (a
    timeout) releases it with its death. While a worker waits it tells the pool
    every :data:`WAIT_BEAT` seconds, which restarts the task's timeout, and once
    more when its turn comes. :func:`run_task` drops the toolchain sessions the
    task made before the turn passes on.

    Examples
    --------
    >>> with heavy_turn(["{}"], None):
    ...     print("ran")
    ran
    """
    if directory is None or task_bytes(mod_jsons, directory) < limit:
        yield
        return
    with open(os.path.join(directory, "heavy.lock"), "a") as handle:
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                _alive()
                time.sleep(WAIT_BEAT)
        _alive()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _load(mod_jsons: Sequence[str], constants: Optional[str] = None, lift: bool = True) -> List[tvm.IRModule]:
    from tvm import relay

    from ..toolchains.packed_call import lift_constants

    # Lifted, the large weights of ONNX Runtime / OpenVINO partitions stay out of their compiled payloads.
    typed = [relay.transform.InferType()(mod) for mod in load_modules(mod_jsons, constants)]
    return [lift_constants(mod) for mod in typed] if lift else typed


def time_candidate(mod_json: str, target: str, repeat: int, warmup: int, min_repeat_ms: int,
                   tuning_log: Optional[str] = None, boundary_layout: bool = True,
                   constants: Optional[str] = None, backend=None) -> dict:
    """Build a saved module, warm it up on random inputs, time it: ``{"ms": median}`` (with
    ``boundary_ms`` and ``boundary_kb`` where boundary transforms were left out: their time and size).

    ``backend`` (a :class:`tvm_tcutils.measure.Backend`) times it elsewhere, for
    example on an RPC server; the answer then names the server (``where``), and
    a server lost in the middle answers ``{"ms": inf, "lost": True, ...}`` so
    that the caller measures the candidate again on another one.

    ``boundary_layout=False`` leaves out the layout transforms at its inputs and
    outputs (see :class:`tvm_tcutils.measure.Timer`); ``constants`` is the
    directory of the search's shared constants (:mod:`.shared`).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> time_candidate(text, "llvm", repeat=3, warmup=1, min_repeat_ms=1)["ms"] > 0
    True
    """
    from ...measure import Timer, error_line

    mods = _load([mod_json], constants)
    try:
        timer = Timer(mods[0], None, target, repeat=repeat, warmup=0, min_repeat_ms=min_repeat_ms,
                      tuning_log=tuning_log, boundary_layout=boundary_layout, backend=backend)
        # The executor has its own copy of the weights: the loaded ones go before the first run, where
        # a toolchain makes its session (and its own packed copy of them).
        mods.clear()
        for _ in range(max(warmup, 0)):
            timer.runner.run()
        ms = timer.sample()
    except EXPECTED_FAILURES as err:
        if backend is None or not backend.lost(err):
            raise
        return {"ms": math.inf, "lost": True, "error": f"{type(err).__name__}: {error_line(err)}"}
    answer = {"ms": ms, "where": timer.where}
    if timer.boundary_kb > 0:
        answer.update(boundary_ms=timer.boundary_ms, boundary_kb=timer.boundary_kb)
    timer.close()  # a remote backend's file and session go now, not when the worker collects the timer
    return answer


def time_wholes(mod_jsons: Sequence[str], target: str, repeat: int, warmup: int, min_repeat_ms: int,
                tuning_log: Optional[str] = None, rounds: int = 5, constants: Optional[str] = None) -> dict:
    """Build saved whole modules and time them in turns: ``{"ms_list": [median, ...]}`` (``inf``: failed).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> all(ms > 0 for ms in time_wholes([text, text], "llvm", 2, 1, 1, rounds=2)["ms_list"])
    True
    """
    from ...measure import measure_modules

    timings = measure_modules(_load(mod_jsons, constants), target, repeat, warmup, min_repeat_ms,
                              tuning_log, rounds)
    return {"ms_list": [t.median_ms for t in timings]}


#: The module a resident worker built (:func:`build_resident`), kept between its tasks.
_resident: Dict[str, object] = {}


def build_resident(mod_json: str, target: str, repeat: int, warmup: int, min_repeat_ms: int,
                   tuning_log: Optional[str] = None, constants: Optional[str] = None) -> dict:
    """Build a saved module, run it ``warmup`` times and keep it in this worker for ``sample`` tasks
    (:class:`IsolatedModule`): ``{"ms": 0.0}``.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> build_resident(text, "llvm", 2, 1, 1)["ms"], sample_resident()["ms"] > 0
    (0.0, True)
    """
    from ...measure import Timer

    _resident.clear()  # one module a worker: the previous one's executor and sessions go first
    # Not lifted: a runtime on the user's file takes no weights from the module.
    mods = _load([mod_json], constants, lift=False)
    timer = Timer(mods[0], None, target, repeat=repeat, warmup=0, min_repeat_ms=min_repeat_ms,
                  tuning_log=tuning_log)
    mods.clear()
    for _ in range(max(warmup, 0)):
        timer.runner.run()
    _resident["timer"] = timer
    return {"ms": 0.0}


def sample_resident() -> dict:
    """One sample of the module :func:`build_resident` built in this worker: ``{"ms": median}``."""
    timer = _resident.get("timer")
    if timer is None:
        raise RuntimeError("no module was built in this worker")
    return {"ms": timer.sample()}


#: Task kinds a worker runs.
TASKS: Dict[str, Callable[..., dict]] = {"candidate": time_candidate, "wholes": time_wholes,
                                         "resident": build_resident, "sample": sample_resident}

#: Task kinds whose toolchain states must outlive the task (the resident module's sessions).
KEEP_STATES = frozenset({"resident", "sample"})


def run_task(task: Task) -> dict:
    """What a worker answers to one task (build or run failures become ``inf`` with the error).

    Examples
    --------
    >>> run_task(("candidate", {"mod_json": "{", "target": "llvm", "repeat": 1, "warmup": 0,
    ...                         "min_repeat_ms": 0}))["ms"]
    inf
    """
    from ...measure import error_line

    kind, arguments = task
    start = time.perf_counter()
    texts = arguments.get("mod_jsons") or [arguments.get("mod_json", "")]
    # A candidate task builds one executor, alive until the task ends, and every toolchain state goes
    # then: states may keep its buffers of lifted weights. Whole-model tasks time several executors
    # side by side, and a state made from one could outlive it: they copy.
    packed_call.BORROW_LIFTED = _in_worker and kind == "candidate"
    try:
        # A resident build holds its module until the comparison ends, and the comparison bounds how many
        # build at once (build_workers): no turns, which would serialize them.
        turn = heavy_turn(texts, arguments.get("constants")) if kind not in KEEP_STATES else contextlib.nullcontext()
        with turn:
            try:
                result = TASKS[kind](**arguments)  # what it built is released when it returns, before the turn ends
            finally:
                if kind not in KEEP_STATES:
                    forget_sessions()
    except EXPECTED_FAILURES as err:  # a failed build or run costs this task only
        return {"ms": math.inf, "error": f"{type(err).__name__}: {error_line(err)}"}
    finally:
        if _in_worker and _recycle_bytes and resident_bytes(os.getpid()) > _recycle_bytes:
            _give_back_memory()
    return dict(result, seconds=time.perf_counter() - start)


def _give_back_memory() -> None:
    """Collect reference cycles and return the heap's free pages to the system.

    A large model's candidate (ZFNet-512's 151 MB classifier weight) leaves its buffers in cycles of TVM
    objects until the collector runs, and glibc keeps freed heap pages: the worker then looked 290 MB
    bigger than it was and was replaced (a new interpreter: seconds of a core; 8 times in one ZFNet-512
    search). A full collection costs about 60 ms, so only a worker over its pool's limit pays it.
    """
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)  # glibc only


def worker_entry(read_fd: int, write_fd: int, imports: Sequence[str], parent: Optional[int] = None) -> None:
    """Main loop of a measuring worker process (started by :class:`WorkerPool`).

    Reads ``(task_id, task)`` messages, answers ``(task_id, result)``; ``None``
    ends it. An unexpected exception is answered as ``{"bug": traceback}``.
    First of all it asks to be killed when ``parent`` (its parent's pid) dies.

    Examples
    --------
    >>> worker_entry  # doctest: +ELLIPSIS
    <function worker_entry at ...>
    """
    import importlib

    die_with_parent(parent)  # before the slow imports: a parent killed meanwhile takes the worker along
    # One of several workers measuring side by side keeps the cores its parent pinned it to at start
    # (:class:`_Worker`; TVM's binding is off in its environment, or every worker's TVM would pin its thread
    # to the same first core). Any other worker runs on every CPU the search was given: the parent's TVM
    # may have pinned the parent, and so this process, to one core.
    if not os.environ.get(WORKER_CPUS_ENV):
        unpin()
    import tvm_tcutils  # noqa: F401  (registers the package's toolchains)

    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    global _alive
    _alive = lambda: outbox.send(("alive", None))  # noqa: E731  (see heavy_turn)
    global _in_worker, _recycle_bytes
    _in_worker = True
    with contextlib.suppress(ValueError):
        _recycle_bytes = int(os.environ.get(RECYCLE_ENV, "0"))
    for name in imports:
        importlib.import_module(name)
    outbox.send(("ready", None))
    while True:
        try:
            message = inbox.recv()
        except EOFError:
            return
        if message is None:
            return
        task_id, task = message
        try:
            outbox.send((task_id, run_task(task)))
        except Exception:  # noqa: BLE001  (a bug, not a failed build: sent to the caller, which raises it)
            outbox.send((task_id, {"ms": math.inf, "bug": traceback.format_exc()[-4000:]}))


class _Tail:
    """Reads a pipe until it closes (in a daemon thread), keeping its last ``size`` bytes."""

    def __init__(self, pipe, size: int = TAIL_BYTES):
        self.size = size
        self.chunks: Deque[bytes] = collections.deque()
        self.held = 0
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._drain, args=(pipe,), daemon=True)
        self.thread.start()

    def _drain(self, pipe) -> None:
        with pipe:
            for chunk in iter(lambda: pipe.read1(65536), b""):
                with self.lock:
                    self.chunks.append(chunk)
                    self.held += len(chunk)
                    while self.held - len(self.chunks[0]) >= self.size:
                        self.held -= len(self.chunks.popleft())

    def text(self, limit: Optional[int] = None) -> str:
        """The last ``limit`` (default all kept) bytes read, decoded."""
        with self.lock:
            data = b"".join(self.chunks)[-(limit or self.size):]
        return data.decode(errors="replace")


class _Worker:
    """One worker: a fresh interpreter (no fork of a process holding TVM's threads) in its own process group."""

    def __init__(self, imports: Sequence[str], cpus: Sequence[int] = (), recycle_bytes: int = 0):
        self.cpus = tuple(cpus)
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        code = (
            f"from {__name__} import worker_entry; "
            f"worker_entry({to_child_r}, {from_child_w}, {tuple(imports)!r}, {os.getpid()})"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        env[RECYCLE_ENV] = str(int(recycle_bytes))
        if self.cpus:
            env[WORKER_CPUS_ENV] = ",".join(str(cpu) for cpu in self.cpus)
            env["TVM_BIND_THREADS"] = "0"
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w), env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **WORKER_POPEN_OPTIONS,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        if self.cpus and hasattr(os, "sched_setaffinity"):
            # Pinned from here at once: the interpreter's imports take seconds before worker_entry runs,
            # and they should not share the other workers' cores meanwhile either.
            with contextlib.suppress(OSError):
                os.sched_setaffinity(self.process.pid, set(self.cpus))
        # Read all the time: a worker writing more than a pipe holds (64 KiB) would block for ever.
        self.stdout, self.stderr = _Tail(self.process.stdout), _Tail(self.process.stderr)
        self.outbox = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.task: Optional[int] = None
        self.deadline = math.inf
        self.ready = False
        self.error = ""

    def send(self, message) -> None:
        self.outbox.send(message)

    def output(self, limit: int = 2000) -> str:
        """The end of what the worker wrote to stderr (or stdout when stderr is empty)."""
        return (self.stderr.text(limit) or self.stdout.text(limit)).strip()

    def stop(self, kill: bool = False) -> None:
        if not kill and self.ready:
            try:
                self.outbox.send(None)
            except OSError:
                kill = True
        if kill or not self.ready:
            kill_group(self.process)  # the worker and whatever its toolchain started
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            kill_group(self.process)
            self.process.wait()
        for conn in (self.outbox, self.conn):
            conn.close()
        for tail in (self.stdout, self.stderr):
            tail.thread.join(timeout=1)  # the pipe closes with the last process holding it


class WorkerPool:
    """Worker processes running one task each at a time, with a timeout per task.

    Parameters
    ----------
    workers : int
        Number of processes.
    timeout : float
        Seconds one task may take (build and run) before its worker is killed.
    imports : tuple of str
        Modules each worker imports first (for example test-only codegens).
    recycle_bytes : int
        A worker whose resident memory exceeds this after a task is replaced
        (0: never).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> pool = WorkerPool(1, 60.0)
    >>> task = ("candidate", dict(mod_json=text, target="llvm", repeat=2, warmup=1, min_repeat_ms=1))
    >>> [result] = pool.run(iter([task])); pool.close()
    >>> result["ms"] > 0
    True

    ``run`` takes any iterable and pulls the next task only when a worker is
    free, so a generator's tasks are made one at a time as workers need them.
    """

    #: Seconds a new worker may take to import TVM and the package.
    START_TIMEOUT = 120.0

    def __init__(self, workers: int = 1, timeout: float = 120.0, imports: Sequence[str] = (),
                 recycle_bytes: int = RECYCLE_BYTES, cpus_each: int = 0):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        if cpus_each < 0 or (cpus_each and workers * cpus_each > len(given_cpus())):
            raise ValueError(f"cpus_each must be 0 (workers share every CPU) or at most "
                             f"{len(given_cpus()) // workers} for {workers} workers on {len(given_cpus())} CPUs, "
                             f"got {cpus_each}")
        self.size = workers
        #: CPUs each worker is pinned to, disjoint between the live workers (0: all share every CPU).
        self.cpus_each = cpus_each
        self.timeout = timeout
        self.imports = tuple(imports)
        self.recycle_bytes = recycle_bytes
        self.recycled = 0
        self._workers: List[_Worker] = []
        #: Set by :meth:`close`: a :meth:`run` in another thread then stops instead of replacing the
        #: workers it lost (an :class:`IsolatedModule` closed while a background thread builds it).
        self._closed = False

    def start(self) -> None:
        """Start the workers now, in the calling thread (they die with the thread that started them:
        :func:`tvm_tcutils.processes.die_with_parent`), so that :meth:`run` may then be called from
        another thread."""
        self._closed = False
        while len(self._workers) < self.size:
            self._workers.append(self._spawn())

    def _spawn(self, replacing: Optional[_Worker] = None) -> _Worker:
        """A new worker, on CPUs no other live worker has; ``replacing``: the worker it takes the place of
        (its CPUs are free again)."""
        cpus: List[int] = []
        if self.cpus_each:
            # The replaced worker is still in the list when its successor spawns: counting its CPUs as taken
            # left the successor none, so it ran unpinned, its TVM bound it to the first core, and two
            # workers timed on one core (every recycled worker's costs x2 on ZFNet-512).
            taken = {cpu for other in self._workers if other is not replacing for cpu in other.cpus}
            cpus = [cpu for cpu in sorted(given_cpus()) if cpu not in taken][:self.cpus_each]
            if len(cpus) < self.cpus_each:
                # Timings on shared cores are not what the pool promises: say so rather than measure wrong.
                logger.warning("measuring worker pool: only %d free CPU(s) for a worker that needs %d (others "
                               "hold %s); it shares cores and its costs may read high", len(cpus),
                               self.cpus_each, sorted(taken))
        worker = _Worker(self.imports, cpus, self.recycle_bytes)
        worker.deadline = time.monotonic() + self.START_TIMEOUT
        return worker

    def run(self, tasks: Iterable[Task], on_result: Optional[Callable[[int, dict], None]] = None,
            timeout: Optional[float] = None) -> List[dict]:
        """Run every task; returns one result dict per task, in order (``ms`` or ``ms_list``, maybe ``error``).

        ``tasks`` may be a generator: a task is taken from it only when a
        worker is free to run it and dropped once sent, so at most one task per
        worker is held. ``on_result(index, result)`` is called as each ends;
        ``timeout`` overrides the pool's seconds per task for this call.

        Raises
        ------
        WorkerError
            A worker raised something other than a build or run failure.
        """
        timeout = self.timeout if timeout is None else timeout
        self._closed = False  # a pool closed before may run again; closed during this run, it stops
        limit = len(tasks) if hasattr(tasks, "__len__") else math.inf
        wanted = min(self.size, limit)
        source: Iterator[Task] = iter(tasks)
        results: Dict[int, dict] = {}
        taken = 0
        exhausted = False
        while len(self._workers) < max(wanted, 1):
            self._workers.append(self._spawn())

        def finish(index: int, result: dict) -> None:
            results[index] = result
            if on_result:
                on_result(index, result)

        while True:
            if self._closed:
                raise RuntimeError("the worker pool was closed while it ran a task")
            if not exhausted and len(self._workers) < min(self.size, limit):  # the size grew (new RPC servers)
                self._workers.append(self._spawn())
            for worker in self._workers:
                if worker.ready and worker.task is None and not exhausted:
                    task = next(source, None)
                    if task is None:
                        exhausted = True
                        break
                    worker.task, taken = taken, taken + 1
                    worker.deadline = time.monotonic() + timeout
                    worker.send((worker.task, task))
                    del task  # the pipe has it: only the worker holds the payload now
            if exhausted and all(w.task is None for w in self._workers):
                break
            soonest = min(w.deadline for w in self._workers)
            ready = wait([w.conn for w in self._workers], timeout=max(0.0, min(soonest - time.monotonic(), 1.0)))
            for k, worker in enumerate(list(self._workers)):
                failure = None
                if worker.conn in ready:
                    try:
                        task_id, result = worker.conn.recv()
                    except (EOFError, OSError):
                        failure = self._death(worker)
                    else:
                        if task_id == "ready":
                            worker.ready = True
                            worker.deadline = math.inf
                            continue
                        if task_id == "alive":  # waiting for, or just given, a heavy task's turn (heavy_turn)
                            worker.deadline = time.monotonic() + timeout
                            continue
                        if "bug" in result:
                            self.close()
                            raise WorkerError(f"the measuring worker failed on task {task_id}:\n{result['bug']}")
                        worker.task = None
                        worker.deadline = math.inf
                        finish(task_id, result)
                        if self.recycle_bytes and resident_bytes(worker.process.pid) > self.recycle_bytes:
                            worker.stop()  # what its builds left behind goes with it
                            self._workers[k] = self._spawn(replacing=worker)
                            self.recycled += 1
                elif time.monotonic() > worker.deadline:
                    failure = (
                        f"timed out after {timeout:.0f} s" if worker.ready else "worker failed to start"
                    )
                if failure is None:
                    continue
                task = worker.task
                worker.stop(kill=True)
                output = worker.output(500)
                if self._closed:
                    raise RuntimeError("the worker pool was closed while it ran a task")
                self._workers[k] = self._spawn(replacing=worker)
                if task is not None:
                    tail = f"; its output ends: {output}" if output else ""
                    finish(task, {"ms": math.inf, "error": failure + tail})
                elif not worker.ready:
                    self.close()
                    raise RuntimeError(f"Collage measuring worker could not start: {failure}: {worker.error or output}")
        return [results[k] for k in range(taken)]

    @staticmethod
    def _death(worker: _Worker) -> str:
        try:
            code = worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if not worker.ready:
            worker.stderr.thread.join(timeout=5)  # the rest of what it wrote before dying
            worker.error = worker.output(500)
        if code is not None and code < 0:
            return f"worker killed by signal {-code} (crash in the toolchain)"
        return f"worker exited with status {code}"

    def close(self) -> None:
        """Stop every worker."""
        self._closed = True
        workers, self._workers = self._workers, []
        for worker in workers:
            worker.stop(kill=worker.task is not None)


class IsolatedModule:
    """A whole module built, warmed up and timed sample by sample in a fresh worker process of its own.

    How the final comparison times each contender (:class:`IsolatedSampler`): as users run them, every
    runtime alone in its process, so that no contender is timed in a process that a search, or another
    contender, has loaded (onnxruntime measured 40-60 % slower inside a whole Collage run than in a
    process of its own: docs/benchmarks/collage.md). The worker starts in the constructor's thread (it
    dies with that thread); :meth:`build` may run in another. It ends with :meth:`close`, when the object
    is collected, or with its parent.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> isolated = IsolatedModule(tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))),
    ...                           "llvm", repeat=2, warmup=1, min_repeat_ms=1)
    >>> isolated.build().sample() > 0, isolated.pid != os.getpid()
    (True, True)
    >>> isolated.close()
    """

    def __init__(self, mod_json: str, target: str, repeat: int = 10, warmup: int = 2,
                 min_repeat_ms: int = WHOLE_MODEL_MIN_REPEAT_MS, tuning_log: Optional[str] = None,
                 constants: Optional[str] = None, imports: Sequence[str] = (), timeout: float = 600.0):
        # Never recycled: its memory is the module it keeps.
        self.pool = WorkerPool(1, timeout, imports, recycle_bytes=0)
        self.pool.start()
        self._process = self.pool._workers[0].process
        self._finalizer = weakref.finalize(self, _end_isolated, self.pool, self._process)
        self.pid = self._process.pid
        self._task = ("resident", dict(mod_json=mod_json, target=target, repeat=repeat, warmup=warmup,
                                       min_repeat_ms=min_repeat_ms, tuning_log=tuning_log, constants=constants))

    def build(self) -> "IsolatedModule":
        """Build the module in the worker (once), then stop the worker until its first sample; raises
        ``RuntimeError`` (the worker ended) if it fails."""
        if self._task is not None:
            task, self._task = self._task, None
            [result] = self.pool.run([task])
            if result.get("error"):
                self.close()
                raise RuntimeError(f"could not be built in its own process: {result['error']}")
            self._hold()
        return self

    def _hold(self) -> None:
        # Between its turns the worker is stopped: the threads of the runtime it holds (onnxruntime's and
        # OpenVINO's spin after a run) take no core from the contender being timed.
        try:
            hold(self._process)
        except RuntimeError:
            pass  # ended: the next sample says so

    def sample(self) -> float:
        """One sample (ms): the median of the worker's timed runs, the worker running alone and stopped
        again after it; raises ``RuntimeError`` if it failed."""
        self.build()
        release(self._process)
        try:
            [result] = self.pool.run([("sample", {})])
        finally:
            if self._process.poll() is None:
                self._hold()
        if result.get("error"):
            raise RuntimeError(f"failed in its own process: {result['error']}")
        return float(result["ms"])

    def close(self) -> None:
        """Stop the worker (and free the module it holds)."""
        self._finalizer()


def _end_isolated(pool: "WorkerPool", process: subprocess.Popen) -> None:
    """An :class:`IsolatedModule`'s end: its stopped worker let run, so that it can end as asked."""
    release(process)
    pool.close()


def _timed_build(isolated: IsolatedModule, name: str) -> IsolatedModule:
    """``isolated.build()``, its seconds logged (where a search's whole-model time goes)."""
    if isolated._task is None:  # built already
        return isolated.build()
    start = time.perf_counter()
    try:
        return isolated.build()
    finally:
        logger.info("whole model %s: built in %.1f s", name, time.perf_counter() - start)


class IsolatedSampler:
    """The final comparison's sampler for a measuring estimator: each module in an :class:`IsolatedModule`.

    ``sampler(mod)`` builds one and returns its sample function; :meth:`build_all` (what
    :func:`~tvm_tcutils.collage.validate.final_comparison` calls) starts every worker in this thread and
    builds :attr:`build_workers` modules at once (nothing is timed while they build).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))
    >>> sampler = IsolatedSampler("llvm", repeat=2, warmup=1)
    >>> built = sampler.build_all({"a": mod, "b": mod})
    >>> sorted(built), built["a"]() > 0
    (['a', 'b'], True)

    :meth:`time` (validation's whole-model timings) keeps each module it built for :meth:`build_all`, so
    that the final comparison does not build validation's mix again (BERT-base: a minute or more a build):

    >>> sampler.time(mod) > 0, len(sampler.kept)
    (True, 1)
    >>> built = sampler.build_all({"a": mod}); len(sampler.kept)
    0

    :meth:`prebuild` starts the comparison's builds early, in background threads, while validation builds
    and times its mixes; :meth:`build_all` then waits for them instead of building:

    >>> sampler.prebuild({"b": tvm.IRModule.from_expr(relay.Function([x], relay.sqrt(x)))}); len(sampler.building)
    1
    >>> sorted(sampler.build_all({"b": tvm.IRModule.from_expr(relay.Function([x], relay.sqrt(x)))})), sampler.building
    (['b'], {})
    """

    #: Modules built at once, each in its own worker: two halve the building time on 2 cores, and each
    #: more adds a build's memory to the peak.
    build_workers = min(2, len(os.sched_getaffinity(0)))

    def __init__(self, target: str, repeat: int = 10, warmup: int = 2, tuning_log: Optional[str] = None,
                 constants: Optional[SharedConstants] = None, imports: Sequence[str] = (),
                 timeout: float = WHOLE_MODEL_TIMEOUT_S):
        self.target, self.repeat, self.warmup, self.tuning_log = target, repeat, warmup, tuning_log
        self.constants, self.imports, self.timeout = constants, tuple(imports), timeout
        #: Modules :meth:`time` built, by :meth:`_key`: stopped workers until :meth:`build_all` takes them
        #: or :meth:`close` ends them.
        self.kept: Dict[str, IsolatedModule] = {}
        #: Modules :meth:`prebuild` started, by :meth:`_key`: (worker, its build's future).
        self.building: Dict[str, Tuple[IsolatedModule, concurrent.futures.Future]] = {}
        self._prebuilder: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _text(self, mod: tvm.IRModule) -> str:
        return self.constants.dumps(mod) if self.constants else tvm.ir.save_json(mod)

    @staticmethod
    def _key(mod: tvm.IRModule) -> str:
        """What :attr:`kept` and :attr:`building` file a module under: its structural hash. Not its JSON:
        two outlines of one partitioning serialize their shared nodes in different orders (validation's
        mix and the comparison's had different JSON, so the comparison built BERT-base's mix again)."""
        return f"{tvm.ir.structural_hash(mod, map_free_vars=True):x}"

    def _isolated(self, text: str) -> IsolatedModule:
        return IsolatedModule(text, self.target, max(self.repeat, 10), self.warmup, WHOLE_MODEL_MIN_REPEAT_MS,
                              self.tuning_log, self.constants.directory if self.constants else None,
                              self.imports, self.timeout)

    def __call__(self, mod: tvm.IRModule) -> Callable[[], float]:
        return self._isolated(self._text(mod)).build().sample

    def prebuild(self, modules: Mapping[str, tvm.IRModule]) -> None:
        """Start building ``modules`` (those not kept or building already) in the background,
        :attr:`build_workers` at a time in order, while the caller goes on; :meth:`time` and
        :meth:`build_all` take them when built, and :meth:`close` ends those none took. The workers start
        here, in the caller's thread."""
        for name, mod in modules.items():
            key = self._key(mod)
            if key in self.kept or key in self.building:
                continue
            if self._prebuilder is None:
                # As many builders as build_all has: with one, BERT-base's rivals built one after the
                # other behind TVM alone, and the comparison waited for the last (344 s against 292).
                self._prebuilder = concurrent.futures.ThreadPoolExecutor(
                    max(1, self.build_workers), thread_name_prefix="tcutils-prebuild")
            isolated = self._isolated(self._text(mod))
            self.building[key] = (isolated, self._prebuilder.submit(_timed_build, isolated, name))

    def _built_early(self, key: str) -> Optional[IsolatedModule]:
        """The module :meth:`prebuild` started under ``key``, once built (raises its ``RuntimeError``), or
        None when none was started."""
        started = self.building.pop(key, None)
        if started is None:
            return None
        isolated, future = started
        future.result()
        return isolated

    def _end_prebuilder(self) -> None:
        if self._prebuilder is not None and not self.building:
            self._prebuilder.shutdown(wait=True)
            self._prebuilder = None

    def time(self, mod: tvm.IRModule) -> float:
        """One sample (ms) of ``mod`` built in a process of its own, ``inf`` where it could not be built or
        run; the built module stays (stopped) for :meth:`build_all`."""
        key = self._key(mod)
        isolated = self.kept.get(key)
        try:
            isolated = isolated or self._built_early(key) or self._isolated(self._text(mod))
            _timed_build(isolated, "timed by validation")
            with self._builds_paused():
                ms = isolated.sample()
        except RuntimeError as err:
            logger.warning("whole-model measurement failed: %s", err)
            self.kept.pop(key, None)
            if isolated is not None:
                isolated.close()
            return math.inf
        self.kept[key] = isolated
        return ms

    def _builds_paused(self):
        """:meth:`prebuild`'s builds in flight stopped while the block times a module: built beside
        it, they took BERT-base's timings from 63 to 120-143 ms on 2 vCPUs (and validation read that as
        the cost of crossing between toolchains). Each goes on after it, unless it ended meanwhile (its
        worker is then held until its first sample)."""
        running = {isolated._process: future for isolated, future in self.building.values() if not future.done()}
        return paused(list(running), still=lambda process: not running[process].done())

    def close(self) -> None:
        """End the workers of the modules :meth:`time` kept and :meth:`prebuild` started (a build still
        running ends with its worker)."""
        kept, self.kept = self.kept, {}
        building, self.building = self.building, {}
        for _, future in building.values():
            future.cancel()  # not started yet: never starts
        for isolated in list(kept.values()) + [isolated for isolated, _ in building.values()]:
            isolated.close()
        self._end_prebuilder()

    def build_all(self, modules: Mapping[str, tvm.IRModule]) -> Dict[str, object]:
        """``{name: sample function, or the RuntimeError its build raised}`` for every module: those
        :meth:`time` built already as they are, the others built :attr:`build_workers` at once. Kept
        modules none of ``modules`` is end here (their memory goes before the builds)."""
        keys = {name: self._key(mod) for name, mod in modules.items()}
        kept, self.kept = self.kept, {}
        for key in set(kept) - set(keys.values()):
            kept.pop(key).close()
        for key in set(self.building) - set(keys.values()):
            isolated, future = self.building.pop(key)
            future.cancel()
            isolated.close()
        isolated, early = {}, {}
        for name, mod in modules.items():  # new workers start here, in this thread
            started = self.building.pop(keys[name], None)
            if started is not None and not started[1].cancel():
                early[name] = started  # building: waited for
            elif started is not None:
                isolated[name] = started[0]  # still queued: built here, beside the others
            else:
                isolated[name] = kept.pop(keys[name], None) or self._isolated(self._text(mod))

        def build(name: str):
            try:
                if name in early:  # built (or being built) by prebuild: wait for it
                    early[name][1].result()
                    return name, early[name][0].sample
                return name, _timed_build(isolated[name], name).sample
            except RuntimeError as err:
                return name, err

        order = list(isolated) + list(early)  # builds first: a builder waiting takes no core
        try:
            with concurrent.futures.ThreadPoolExecutor(max(1, min(self.build_workers, len(order)))) as builders:
                built = dict(builders.map(build, order))
        finally:
            self._end_prebuilder()
        return {name: built[name] for name in modules}


class PooledWholeModelTimer:
    """Times whole modules in a :class:`WorkerPool`'s worker: the whole-model timer of validation.

    Parameters
    ----------
    pool : WorkerPool
        Runs the builds and timings (shared with the candidates' measuring).
    target : str
        Target of the builds.
    repeat, warmup : int
        Timed runs per sample (at least 10) and runs before timing.
    tuning_log : str, optional
        AutoTVM log applied to every build.
    constants : SharedConstants, optional
        The search's shared constants (:mod:`.shared`): whole modules are sent
        without them (a model's weights are written once, not once per module).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))
    >>> timer = PooledWholeModelTimer(WorkerPool(1), "llvm", repeat=2, warmup=1)
    >>> ms = timer.time(mod); timer.pool.close()
    >>> ms > 0
    True
    """

    def __init__(self, pool: WorkerPool, target: str, repeat: int = 10, warmup: int = 2,
                 tuning_log: Optional[str] = None, constants: Optional[SharedConstants] = None):
        self.pool, self.target, self.repeat, self.warmup, self.tuning_log = pool, target, repeat, warmup, tuning_log
        self.constants = constants
        #: How the final comparison times whole modules (:func:`~tvm_tcutils.collage.validate.whole_model_sampler`
        #: takes it): each in a worker of its own.
        self.sampler = IsolatedSampler(target, repeat, warmup, tuning_log, constants, pool.imports,
                                       max(pool.timeout, WHOLE_MODEL_TIMEOUT_S))

    def time(self, mod: tvm.IRModule) -> Optional[float]:
        """Latency (ms) of one whole module, ``inf`` if it fails: built in a process of its own, which the
        final comparison then times again without building it anew (:meth:`IsolatedSampler.time`)."""
        return self.sampler.time(mod)

    def close(self) -> None:
        """End the workers of the modules :meth:`time` built that no comparison took."""
        self.sampler.close()

    def time_side_by_side(self, mods: Sequence[tvm.IRModule], rounds: int = 5) -> Optional[List[float]]:
        """Latencies (ms) of modules timed in turns in one worker (``inf`` for failures); None if the worker failed."""
        dumps = self.constants.dumps if self.constants else tvm.ir.save_json
        task = ("wholes", dict(mod_jsons=[dumps(m) for m in mods], target=self.target,
                               repeat=max(self.repeat, 10), warmup=self.warmup,
                               min_repeat_ms=WHOLE_MODEL_MIN_REPEAT_MS,
                               tuning_log=self.tuning_log, rounds=rounds,
                               constants=self.constants.directory if self.constants else None))
        [result] = self.pool.run([task], timeout=max(self.pool.timeout, WHOLE_MODEL_TIMEOUT_S) * len(mods))
        if result.get("error"):
            logger.warning("whole-model measurement failed: %s", result["error"])
            return None
        return [float(ms) for ms in result["ms_list"]]
