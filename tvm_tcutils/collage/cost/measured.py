"""Measured costs: build each candidate alone with its toolchain and time it.

Every candidate is built into a stand-alone module
(:func:`~tvm_tcutils.collage.outline.candidate_module`), run on random
inputs of its shapes and timed (warm-up, repeats, median). Builds and runs
happen in worker processes, one task at a time each, with a timeout per
candidate: a toolchain that aborts the process (an LLVM assertion, a
segfault in a library) or hangs costs that candidate (``inf``, logged), the
worker is replaced and the search goes on.

Results go to a persistent cache (``costs.jsonl`` in the cache directory)
keyed by the candidate's structure (constants by shape only), input shapes
and toolchain version, so re-runs, and other models holding the same
sub-graphs, measure nothing twice.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import struct
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Dict, List, Optional, Sequence

from ..._tvm import host_target
from ...tuning import tuning_log_digest
from .base import CostEstimator, CostRequest

logger = logging.getLogger("tvm_tcutils.collage")

#: Default place of the cost cache (``$TVM_TCUTILS_CACHE`` overrides the parent directory).
DEFAULT_CACHE = os.path.join(
    os.environ.get("TVM_TCUTILS_CACHE", os.path.join(os.path.expanduser("~"), ".cache", "tvm-tcutils")), "collage"
)


def default_cache_dir() -> str:
    """The cache directory used when none is given.

    Examples
    --------
    >>> default_cache_dir().endswith("collage")
    True
    """
    return DEFAULT_CACHE


# ---------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------
def _timer(mod_json: str, target: str, repeat: int, warmup: int, min_repeat_ms: int, tuning_log: Optional[str],
           boundary_layout: bool = True):
    """Build a saved module, warm it up on random inputs; a function returning one median in ms."""
    import tvm
    from tvm import relay

    mod = relay.transform.InferType()(tvm.ir.load_json(mod_json))
    return module_timer(mod, target, repeat, warmup, min_repeat_ms, tuning_log, boundary_layout)


#: Fused kernels that only change a tensor's layout (``FuseOps`` names them after their one op).
_LAYOUT_KERNEL = re.compile(r"_fused_layout_transform(_\d+)?$")


def boundary_layout_nodes(graph_json: str, input_names: Sequence[str]) -> List[int]:
    """Graph-executor nodes that only change the layout of a graph input or of a graph output.

    ``AlterOpLayout`` wraps an operator built alone in a transform into its
    blocked layout (NCHW -> NCHWc) and one back; between operators of one TVM
    region those transforms cancel, so they are not part of the operator's
    cost in a whole model.

    Examples
    --------
    >>> import json
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


def _has_layout_transform(mod) -> bool:
    from tvm import relay

    found = []

    def visit(expr) -> None:
        if isinstance(expr, relay.Call) and getattr(expr.op, "name", "") == "layout_transform":
            found.append(expr)

    relay.analysis.post_order_visit(mod["main"], visit)
    return bool(found)


def module_timer(mod, target, repeat: int, warmup: int = 3, min_repeat_ms: int = 50,
                 tuning_log: Optional[str] = None, boundary_layout: bool = True):
    """Build ``mod`` once (graph executor), warm it up on random inputs; return a timer of one run.

    The timer returns the median of ``repeat`` runs in ms each time it is called, so
    callers can time several builds round-robin. With ``boundary_layout=False``
    the time of kernels that only change the layout of an input or an output
    (:func:`boundary_layout_nodes`) is left out, each timed alone with TVM's
    debug executor: how a TVM Collage candidate costs inside a TVM region.
    A module that itself holds ``layout_transform`` operators is timed whole.

    Examples
    --------
    >>> import tvm
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> timer = module_timer(tvm.IRModule.from_expr(relay.Function([x], x + x)), "llvm", repeat=3)
    >>> timer() > 0
    True
    """
    import numpy as np
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    from ...measure import tuning_log_scope
    from ...models import random_inputs

    with tuning_log_scope(tuning_log), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    dev = tvm.cpu()
    inputs = random_inputs(mod)
    skipped: List[int] = []
    if not boundary_layout and not _has_layout_transform(mod):
        skipped = boundary_layout_nodes(lib.get_graph_json(), list(inputs))
    executor = None
    if skipped:
        try:  # the debug executor runs the same kernels and can also time one node alone
            executor = lib["debug_create"]("default", dev)
        except Exception:  # a TVM built without the profiler: time the candidate whole
            skipped = []
    executor = executor or lib["default"](dev)
    runner = graph_executor.GraphModule(executor)
    runner.set_input(**inputs)
    for _ in range(max(warmup, 0)):
        runner.run()
    timer = runner.module.time_evaluator("run", dev, number=1, repeat=repeat, min_repeat_ms=min_repeat_ms)

    def node_ms(index: int) -> float:
        raw = executor["run_individual_node"](index, 1, repeat, min_repeat_ms, 100, 0, 1)
        return float(np.median(struct.unpack("@" + "d" * repeat, bytes(raw)))) * 1e3

    def run() -> float:
        total = float(np.median(timer().results) * 1e3)
        if not skipped:
            return total
        # Each kernel is part of the total, so this stays positive up to timing noise; the floor keeps
        # noise from pricing a candidate at nothing.
        return max(total - sum(node_ms(k) for k in skipped), 0.1 * total)

    return run


def measure_module(mod_json: str, target: str, repeat: int, warmup: int, min_repeat_ms: int,
                   tuning_log: Optional[str] = None, boundary_layout: bool = True) -> float:
    """Build a saved module with ``relay.build``, run it on random inputs, return the median ms.

    With ``tuning_log`` the build picks AutoTVM's best configs from it; with
    ``boundary_layout=False`` the layout transforms at its inputs and outputs
    are left out (see :func:`module_timer`).

    Runs in a worker process (it may crash there).

    Examples
    --------
    >>> import tvm
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> measure_module(text, "llvm", repeat=3, warmup=1, min_repeat_ms=1) > 0
    True
    """
    return _timer(mod_json, target, repeat, warmup, min_repeat_ms, tuning_log, boundary_layout)()


def measure_modules(mod_jsons: Sequence[str], target: str, repeat: int, warmup: int, min_repeat_ms: int,
                    tuning_log: Optional[str] = None, rounds: int = 5) -> List[float]:
    """Build several saved modules, then time them in turns for ``rounds`` rounds; median ms of each.

    A module that fails to build or run costs ``inf``; the others are still timed.

    Examples
    --------
    >>> import tvm
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(4,))
    >>> text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> all(ms > 0 for ms in measure_modules([text, text], "llvm", 2, 1, 1, rounds=2))
    True
    """
    import numpy as np

    timers = []
    for text in mod_jsons:
        try:
            timers.append(_timer(text, target, repeat, warmup, min_repeat_ms, tuning_log))
        except Exception as err:  # one broken variant must not hide the others' timings
            logger.warning("whole-model build failed: %s", _error_line(err))
            timers.append(None)
    times: List[List[float]] = [[] for _ in timers]
    for _ in range(max(rounds, 1)):
        for k, timer in enumerate(timers):
            if timer is not None:
                times[k].append(timer())
    return [float(np.median(t)) if t else math.inf for t in times]


def worker_entry(read_fd: int, write_fd: int, imports: Sequence[str]) -> None:
    """Main loop of a measuring worker process (started by :class:`WorkerPool`).

    Reads ``(task_id, payload)`` messages, answers ``(task_id, result)``;
    ``None`` ends it.

    Examples
    --------
    >>> worker_entry  # doctest: +ELLIPSIS
    <function worker_entry at ...>
    """
    import importlib

    import tvm_tcutils  # noqa: F401  (registers the package's toolchains)

    inbox = Connection(read_fd, writable=False)
    outbox = Connection(write_fd, readable=False)
    for name in imports:
        importlib.import_module(name)
    outbox.send(("ready", None))
    while True:
        try:
            task = inbox.recv()
        except EOFError:
            return
        if task is None:
            return
        task_id, payload = task
        start = time.perf_counter()
        try:
            if isinstance(payload, dict):  # several whole modules, timed round-robin
                outbox.send((task_id, {"ms_list": measure_modules(**payload),
                                       "seconds": time.perf_counter() - start}))
                continue
            ms = measure_module(*payload)
            outbox.send((task_id, {"ms": ms, "seconds": time.perf_counter() - start}))
        except Exception as err:  # a failed build or run costs this candidate only
            message = _error_line(err)
            outbox.send((task_id, {"ms": math.inf, "error": f"{type(err).__name__}: {message}"}))


def _error_line(err: BaseException) -> str:
    """The informative line of a TVM error (the last one naming an error or a failed check)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "rror" in line or "Check failed" in line]
    return (useful[-1] if useful else (lines[-1] if lines else ""))[:300]


class _Worker:
    """One worker: a fresh interpreter (no fork of a process holding TVM's threads)."""

    def __init__(self, imports: Sequence[str]):
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        code = (
            "import sys; from tvm_tcutils.collage.cost.measured import worker_entry; "
            f"worker_entry({to_child_r}, {from_child_w}, {tuple(imports)!r})"
        )
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        self.process = subprocess.Popen(
            [sys.executable, "-c", code], pass_fds=(to_child_r, from_child_w), env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        os.close(to_child_r)
        os.close(from_child_w)
        self.outbox = Connection(to_child_w, readable=False)
        self.conn = Connection(from_child_r, writable=False)
        self.task: Optional[int] = None
        self.deadline = math.inf
        self.ready = False
        self.error = ""

    def send(self, message) -> None:
        self.outbox.send(message)

    def stop(self, kill: bool = False) -> None:
        if not kill and self.ready:
            try:
                self.outbox.send(None)
            except OSError:
                kill = True
        if kill or not self.ready:
            self.process.kill()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for conn in (self.outbox, self.conn):
            conn.close()
        if self.process.stderr:
            self.process.stderr.close()


class WorkerPool:
    """Worker processes measuring one task each at a time, with a timeout per task.

    Parameters
    ----------
    workers : int
        Number of processes.
    timeout : float
        Seconds one task may take (build and run) before its worker is killed.
    imports : tuple of str
        Modules each worker imports first (for example test-only codegens).

    Examples
    --------
    >>> pool = WorkerPool(1, 60.0)  # doctest: +SKIP
    >>> pool.run([payload])  # doctest: +SKIP
    """

    #: Seconds a new worker may take to import TVM and the package.
    START_TIMEOUT = 120.0

    def __init__(self, workers: int = 1, timeout: float = 120.0, imports: Sequence[str] = ()):
        if workers < 1:
            raise ValueError(f"workers must be at least 1, got {workers}")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.size = workers
        self.timeout = timeout
        self.imports = tuple(imports)
        self._workers: List[_Worker] = []

    def _spawn(self) -> _Worker:
        worker = _Worker(self.imports)
        worker.deadline = time.monotonic() + self.START_TIMEOUT
        return worker

    def run(self, payloads: Sequence[tuple], on_result=None, timeout: Optional[float] = None) -> List[dict]:
        """Run every payload; returns one result dict per payload (``ms``, maybe ``error``).

        ``timeout`` overrides the pool's seconds per payload for this call.
        """
        timeout = self.timeout if timeout is None else timeout
        results: List[Optional[dict]] = [None] * len(payloads)
        pending = list(range(len(payloads)))[::-1]
        while len(self._workers) < min(self.size, max(len(payloads), 1)):
            self._workers.append(self._spawn())
        while any(r is None for r in results):
            for worker in self._workers:
                if worker.ready and worker.task is None and pending:
                    worker.task = pending.pop()
                    worker.deadline = time.monotonic() + timeout
                    worker.send((worker.task, payloads[worker.task]))
            waitables = [w.conn for w in self._workers]
            soonest = min(w.deadline for w in self._workers)
            ready = wait(waitables, timeout=max(0.0, min(soonest - time.monotonic(), 1.0)))
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
                        else:
                            results[task_id] = result
                            worker.task = None
                            worker.deadline = math.inf
                            if on_result:
                                on_result(task_id, result)
                elif time.monotonic() > worker.deadline:
                    failure = (
                        f"timed out after {timeout:.0f} s" if worker.ready else "worker failed to start"
                    )
                if failure is None:
                    continue
                task = worker.task
                worker.stop(kill=True)
                self._workers[k] = self._spawn()
                if task is not None:
                    results[task] = {"ms": math.inf, "error": failure}
                    if on_result:
                        on_result(task, results[task])
                elif not worker.ready:
                    self.close()
                    raise RuntimeError(f"Collage measuring worker could not start: {failure}: {worker.error}")
        return [r for r in results if r is not None]

    @staticmethod
    def _death(worker: _Worker) -> str:
        try:
            code = worker.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            code = None
        if not worker.ready and worker.process.stderr:
            worker.error = worker.process.stderr.read().decode(errors="replace").strip()[-500:]
        if code is not None and code < 0:
            return f"worker killed by signal {-code} (crash in the toolchain)"
        return f"worker exited with status {code}"

    def close(self) -> None:
        """Stop every worker."""
        for worker in self._workers:
            worker.stop(kill=worker.task is not None)
        self._workers = []


# ---------------------------------------------------------------------------
# Cache and progress
# ---------------------------------------------------------------------------
class CostCache:
    """Measured costs on disk, one JSON object a line (``key``, ``ms``, ``toolchain``, ``ops``...).

    Examples
    --------
    >>> import tempfile
    >>> cache = CostCache(tempfile.mkdtemp())
    >>> cache.put("k", {"ms": 1.5, "toolchain": "tvm", "ops": ["add"]}); cache.get("k")["ms"]
    1.5
    """

    def __init__(self, directory: str):
        self.directory = directory
        self.path = os.path.join(directory, "costs.jsonl")
        self.entries: Dict[str, dict] = {}
        if os.path.isfile(self.path):
            with open(self.path) as handle:
                for line in handle:
                    try:
                        entry = json.loads(line)
                        self.entries[entry["key"]] = entry
                    except (ValueError, KeyError):
                        continue  # a line cut by a crash while writing
        self.loaded = len(self.entries)

    def get(self, key: str) -> Optional[dict]:
        return self.entries.get(key)

    def put(self, key: str, entry: dict) -> None:
        entry = dict(entry, key=key)
        if entry.get("ms") is not None and not math.isfinite(entry["ms"]):
            entry["ms"] = None  # JSON has no infinity; None reads back as a failure
        self.entries[key] = entry
        os.makedirs(self.directory, exist_ok=True)
        with open(self.path, "a") as handle:
            handle.write(json.dumps(entry, default=str) + "\n")


class Progress:
    """A one-line progress bar on stderr (only when enabled)."""

    def __init__(self, total: int, enabled: bool, label: str = "measuring"):
        self.total, self.done, self.enabled, self.label = total, 0, enabled and total > 0, label
        self.start = time.perf_counter()
        self.failed = 0

    def step(self, failed: bool = False) -> None:
        self.done += 1
        self.failed += int(failed)
        if not self.enabled:
            return
        width = 30
        filled = int(width * self.done / self.total)
        elapsed = time.perf_counter() - self.start
        sys.stderr.write(
            f"\r{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total}"
            f" ({self.failed} failed, {elapsed:.0f} s)"
        )
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()


def _ms(entry: dict) -> float:
    value = entry.get("ms")
    return math.inf if value in (None, "inf") else float(value)


class MeasuredCostEstimator(CostEstimator):
    """Measure candidates in worker processes; cache results on disk.

    Parameters
    ----------
    cache_dir : str, optional
        Directory of the persistent cache (default :func:`default_cache_dir`);
        ``None`` keeps that default, ``""`` disables the disk cache.
    workers : int
        Worker processes measuring in parallel (1 keeps timings clean).
    timeout : float
        Seconds a candidate's build and run may take.
    repeat, warmup, min_repeat_ms : int
        Timing: runs before timing, timed repeats (the median is the cost),
        and the least duration of one repeat.
    target : str, optional
        Target of TVM builds (default :func:`tvm_tcutils.host_target`, this
        CPU's vector ISA). Part of the cache key.
    tuning_log : str, optional
        AutoTVM log (``tvm-tcutils tune MODEL --dtype float32 ...``) applied to
        every TVM build, so TVM's candidates are costed tuned. Its content is
        part of the cache key. Build the result under the same log
        (``build_partitioned(..., tuning_log=...)``).
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    log_file : str, optional
        Also append one line per measurement there.
    worker_imports : sequence of str
        Modules every worker imports first (codegens not in the package).

    Examples
    --------
    >>> est = MeasuredCostEstimator(cache_dir="", repeat=3)
    >>> est.stats
    {'cached': 0, 'measured': 0, 'failed': 0}
    """

    def __init__(self, cache_dir: Optional[str] = None, workers: int = 1, timeout: float = 120.0,
                 repeat: int = 5, warmup: int = 2, min_repeat_ms: int = 5, target: Optional[str] = None,
                 progress: Optional[bool] = None, log_file: Optional[str] = None,
                 worker_imports: Sequence[str] = (), tuning_log: Optional[str] = None):
        if repeat < 1:
            raise ValueError(f"repeat must be at least 1, got {repeat}")
        self.cache = CostCache(default_cache_dir() if cache_dir is None else cache_dir) if cache_dir != "" else None
        self.pool = WorkerPool(workers, timeout, worker_imports)
        self.settings = (target or host_target(), repeat, warmup, min_repeat_ms)
        if tuning_log and not os.path.isfile(tuning_log):
            raise FileNotFoundError(f"tuning_log: no such file {tuning_log!r}")
        self.tuning_log = os.path.abspath(tuning_log) if tuning_log else None
        self._log_digest = tuning_log_digest(tuning_log)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.log_file = log_file
        self.stats = {"cached": 0, "measured": 0, "failed": 0}
        self._memory: Dict[str, dict] = {}
        self._unbuildable: set = set()

    def _disk_key(self, key: str) -> str:
        # One cache directory serves every target: a cost measured for another CPU is not this one's.
        return hashlib.sha256(f"{self.settings[0]}|{self._log_digest}|{key}".encode()).hexdigest()

    def lookup(self, request: CostRequest) -> Optional[float]:
        """The cached cost of ``request``, or None when it was never measured."""
        entry = self._memory.get(request.key) or (self.cache.get(self._disk_key(request.key)) if self.cache else None)
        return None if entry is None else _ms(entry)

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        todo: Dict[str, CostRequest] = {}
        for req in requests:
            if self.lookup(req) is None and req.key not in todo:
                todo[req.key] = req
        self.stats["cached"] += sum(1 for r in requests if r.key not in todo)
        if todo:
            self._measure(list(todo.values()))
        return [self.lookup(r) for r in requests]

    def _measure(self, requests: List[CostRequest]) -> None:
        import tvm

        buildable = []
        for req in requests:
            if req.toolchain.buildable():
                buildable.append(req)
                continue
            if req.toolchain.name not in self._unbuildable:
                self._unbuildable.add(req.toolchain.name)
                logger.warning("toolchain %s cannot be built here (no relay.ext.%s): its candidates cost inf",
                               req.toolchain.name, req.toolchain.compiler)
            self._memory[req.key] = {"ms": None, "error": "no codegen"}
        requests = buildable
        target, repeat, warmup, min_repeat_ms = self.settings
        # A TVM candidate's layout transforms at its boundary cancel between neighbours in a TVM
        # region; a crossing to another toolchain pays them, which validation's crossing penalty learns.
        payloads = [(tvm.ir.save_json(r.module), target, repeat, warmup, min_repeat_ms, self.tuning_log,
                     not r.toolchain.is_tvm) for r in requests]
        bar = Progress(len(requests), self.progress)

        def record(k: int, result: dict) -> None:
            req = requests[k]
            entry = {
                "ms": result.get("ms"), "toolchain": req.toolchain.name, "ops": req.ops,
                "error": result.get("error"), "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            failed = not math.isfinite(_ms(entry))
            self.stats["failed" if failed else "measured"] += 1
            self._memory[req.key] = entry
            if self.cache:
                self.cache.put(self._disk_key(req.key), entry)
            line = f"{req.toolchain.name:<8} {'+'.join(req.ops)[:80]:<80} " + (
                f"FAILED {entry['error']}" if failed else f"{_ms(entry):.4f} ms")
            (logger.warning if failed else logger.info)("measured %s", line)
            if self.log_file:
                with open(self.log_file, "a") as handle:
                    handle.write(line + "\n")
            bar.step(failed)

        self.pool.run(payloads, record)

    def measure_whole(self, mod) -> Optional[float]:
        """Build and time a whole module in a worker (``inf`` if it fails): one module, one round
        of :meth:`measure_wholes`."""
        times = self.measure_wholes([mod], rounds=1)
        return math.inf if times is None else times[0]

    def measure_wholes(self, mods, rounds: int = 5) -> Optional[List[float]]:
        """Build whole modules in one worker and time them round-robin (``inf`` for failures)."""
        import tvm

        target, repeat, warmup, _ = self.settings
        payload = dict(mod_jsons=[tvm.ir.save_json(m) for m in mods], target=target, repeat=max(repeat, 10),
                       warmup=warmup, min_repeat_ms=50, tuning_log=self.tuning_log, rounds=rounds)
        [result] = self.pool.run([payload], timeout=max(self.pool.timeout, 60.0) * len(mods))
        if result.get("error"):
            logger.warning("whole-model measurement failed: %s", result["error"])
            return None
        return [float(ms) for ms in result["ms_list"]]

    def close(self) -> None:
        self.pool.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
