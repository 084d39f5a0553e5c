"""Measured costs: build each candidate alone with its toolchain and time it.

Every candidate is built into a stand-alone module
(:func:`~tvm_tcutils.collage.outline.candidate_module`), run on random
inputs of its shapes and timed (:class:`tvm_tcutils.measure.Timer`) in
worker processes (:mod:`.workers`), one task at a time each, with a timeout
per candidate: a toolchain that aborts the process or hangs costs that
candidate (``inf``, logged) and the search goes on.

Memory is bounded by the model, not by the number of candidates: a
candidate is built and serialised only when a worker is free to measure it,
its module is dropped once sent, and the model's large constants are written
once per search (:mod:`.shared`) instead of travelling with every candidate.

Results go to the persistent cost store (:mod:`.store`, ``costs.jsonl`` in
the cache directory) keyed by the candidate's structure (constants by shape
only), input shapes, toolchain version, target and tuning log, so re-runs, and
other models holding the same sub-graphs, measure nothing twice.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sys
import time
import weakref
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..._tvm import host_target, pool_size, tvm
from ...measure import WHOLE_MODEL_MIN_REPEAT_MS, Backend, Timer, error_line, interleave
from ...tuning import tuning_log_digest
from ..arguments import existing_file, flag, positive_number, whole_number
from ..arguments import target as check_target
from .base import CostEstimator, CostRequest
from .shared import SharedConstants
from .store import DEFAULT_CACHE, FAILURE_TTL, CostStore, cost_ms, default_cache_dir  # noqa: F401
from .workers import PooledWholeModelTimer, WorkerPool

logger = logging.getLogger("tvm_tcutils.collage")

#: The cost store's former name.
CostCache = CostStore


class Progress:
    """A one-line progress bar on stderr (only when enabled).

    Examples
    --------
    >>> bar = Progress(2, enabled=False); bar.step(); bar.step(failed=True)
    >>> bar.done, bar.failed
    (2, 1)
    """

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


#: Most workers :func:`auto_workers` gives (each holds a TVM, about 0.25 GB, and builds one candidate at a time).
AUTO_WORKERS_MAX = 4


def auto_workers() -> Tuple[int, int]:
    """``(workers, CPUs each)`` of the default measuring pool: as many workers as the timing's threads
    (the largest of TVM's, onnxruntime's and OpenVINO's budget) fit disjointly in the CPUs this process
    tree was given, at most :data:`AUTO_WORKERS_MAX`; each pinned to its own CPUs (0: one worker, on all).

    A candidate's measurement is mostly its build (0.1-0.3 s of compiling, against 25 ms of timing), which
    one worker did on one core while the others idled; side by side on disjoint cores the timings agree
    with one worker's (``docs/benchmarks/collage.md``).

    Examples
    --------
    >>> workers, each = auto_workers()
    >>> workers >= 1 and (each == 0 if workers == 1 else each >= 1)
    True
    """
    from ...processes import given_cpus
    from ..toolchains.base import thread_budget

    threads = max(pool_size(), thread_budget("TVM_TCUTILS_ORT_THREADS"), thread_budget("TVM_TCUTILS_OPENVINO_THREADS"))
    workers = max(1, min(AUTO_WORKERS_MAX, len(given_cpus()) // threads))
    return workers, (threads if workers > 1 else 0)


#: What the worker pool answers when a worker died or hung: with a remote backend, its server did.
_POOL_LOSSES = ("timed out after", "worker killed", "worker exited")


def _server_lost(result: dict) -> bool:
    """Whether a remote measurement failed because its server went away (worth a retry elsewhere).

    Examples
    --------
    >>> _server_lost({"ms": float("inf"), "lost": True}), _server_lost({"ms": 1.0})
    (True, False)
    >>> _server_lost({"ms": float("inf"), "error": "timed out after 120 s"})
    True
    """
    return bool(result.get("lost")) or str(result.get("error") or "").startswith(_POOL_LOSSES)


def runtime_functions(toolchain) -> List[str]:
    """Global functions a device needs to run ``toolchain``'s partitions: the package's packed calls.

    The package's graph-style toolchains (compiler ``tcutils_<name>``) call
    ``tvm_tcutils.<name>.load`` and ``.run``; where this process builds their
    partitions as the native plugin's modules (:func:`~..toolchains.packed_call.native_module_maker`),
    the server also needs that plugin's loader (``TVM_TCUTILS_PACKED_CALL=llvm`` builds compiled
    wrappers instead). TVM and other BYOC toolchains need nothing beyond TVM's runtime.

    Examples
    --------
    >>> from tvm_tcutils.collage.toolchains import known
    >>> runtime_functions(known()["ort"])[:2], runtime_functions(known()["tvm"])
    (['tvm_tcutils.ort.load', 'tvm_tcutils.ort.run'], [])
    """
    from ..toolchains.packed_call import NATIVE_LOADER, native_module_maker

    compiler = toolchain.compiler or ""
    if not compiler.startswith("tcutils_"):
        return []
    name = compiler[len("tcutils_"):]
    loader = [NATIVE_LOADER] if native_module_maker() is not None else []
    return [f"tvm_tcutils.{name}.load", f"tvm_tcutils.{name}.run"] + loader


class MeasuredCostEstimator(CostEstimator):
    """Measure candidates in worker processes; cache results on disk.

    Parameters
    ----------
    cache_dir : str, optional
        Directory of the persistent cache (default :func:`default_cache_dir`);
        ``None`` keeps that default, ``""`` disables the disk cache.
    workers : int, optional
        Worker processes measuring in parallel. None (the default): :func:`auto_workers`, one per
        disjoint set of the timing's threads among this process tree's CPUs (at most
        :data:`AUTO_WORKERS_MAX`), each pinned to its own; 1: one worker on every CPU. Several
        workers build and time side by side, each on its own cores.
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
    retry_failed : bool
        Measure again the candidates the cache holds as failed (by default only
        failures older than ``failure_ttl`` seconds are).
    failure_ttl : float
        Seconds a cached failure counts (default one day).
    remote : tvm_tcutils.measure.Backend, optional
        Measure on another device, e.g. a :class:`tvm_tcutils.rpc.RemoteBackend`
        (the servers of an RPC tracker's key): the workers build here, one per
        free server, and each candidate is timed on a server, one candidate
        per server at a time. A server that dies, hangs or drops the
        connection costs a retry on another one (up to :attr:`RETRIES`), not an
        infinite cost; servers that register during the search are used.
        Costs are cached under the device key too, so devices never share
        them. Whole-model validation is left out (the sum of measured costs is
        trusted), and toolchains whose runtime functions the servers lack are
        left out with a warning (serve with ``python -m tvm_tcutils.rpc_server``).

    Examples
    --------
    >>> est = MeasuredCostEstimator(cache_dir="", repeat=3)
    >>> est.stats
    {'cached': 0, 'measured': 0, 'failed': 0}
    """

    def __init__(self, cache_dir: Optional[str] = None, workers: Optional[int] = None, timeout: float = 120.0,
                 repeat: int = 5, warmup: int = 2, min_repeat_ms: int = 5, target: Optional[str] = None,
                 progress: Optional[bool] = None, log_file: Optional[str] = None,
                 worker_imports: Sequence[str] = (), tuning_log: Optional[str] = None,
                 retry_failed: bool = False, failure_ttl: float = FAILURE_TTL, remote: Optional[Backend] = None):
        # All checked before a worker starts; messages name the argument (see ..arguments).
        if workers is not None:
            whole_number("workers", workers, least=1)
        positive_number("timeout", timeout)
        whole_number("repeat", repeat, least=1)
        whole_number("warmup", warmup)
        whole_number("min_repeat_ms", min_repeat_ms)
        positive_number("failure_ttl", failure_ttl, zero=True)
        check_target(target)
        flag("retry_failed", retry_failed)
        if progress is not None:
            flag("progress", progress)
        if cache_dir is not None and not isinstance(cache_dir, (str, os.PathLike)):
            raise TypeError(f"cache_dir must be a directory path, '' or None, got {type(cache_dir).__name__}")
        if isinstance(worker_imports, str) or not all(isinstance(m, str) for m in worker_imports):
            raise TypeError(f"worker_imports must be a list of module names, got {worker_imports!r}")
        existing_file("tuning_log", tuning_log)
        if remote is not None and not isinstance(remote, Backend):
            raise TypeError(f"remote must be a tvm_tcutils.measure.Backend (e.g. tvm_tcutils.rpc.RemoteBackend) "
                            f"or None, got {type(remote).__name__}")
        self.remote = remote
        if remote is not None:
            # Before any worker starts: an unreachable tracker or a key without servers fails here.
            workers = max(self._servers(), 1)
        directory = default_cache_dir() if cache_dir is None else cache_dir
        self.cache = CostStore(directory, failure_ttl, retry_failed) if directory else None
        cpus_each = 0
        if workers is None:
            workers, cpus_each = auto_workers()
        self.pool = WorkerPool(workers, timeout, worker_imports, cpus_each=cpus_each)
        self.settings = (target or host_target(), repeat, warmup, min_repeat_ms)
        self.tuning_log = os.path.abspath(tuning_log) if tuning_log else None
        self._log_digest = tuning_log_digest(tuning_log)
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.log_file = log_file
        self.stats = {"cached": 0, "measured": 0, "failed": 0}
        self._memory: Dict[str, dict] = {}
        # request key -> (ms, KB) of the layout transforms left out of a TVM candidate's time.
        self._boundaries: Dict[str, Tuple[float, float]] = {}
        self._unbuildable: set = set()
        self._shared: Optional[SharedConstants] = None
        self._shared_graph = None  # a weak reference to the graph whose constants _shared holds
        self._remote_missing: Dict[str, List[str]] = {}  # toolchain -> runtime functions the servers lack

    #: Times a candidate is measured again after its server was lost.
    RETRIES = 3

    #: Seconds between two looks at the tracker for servers that registered during a search.
    REFRESH_SECONDS = 5.0

    def _servers(self, count: str = "free") -> int:
        """The remote key's ``free`` or ``total`` servers now (raises when the tracker cannot be reached)."""
        self._refreshed = time.monotonic()
        return getattr(self.remote.servers(), count)

    def _grow(self) -> None:
        """One worker per server of the key, servers that registered since the last look included."""
        if self.remote is None or time.monotonic() - self._refreshed < self.REFRESH_SECONDS:
            return
        try:
            total = self._servers("total")
        except RuntimeError as err:  # the tracker is gone for a moment: keep the workers there are
            logger.warning("RPC tracker: %s", err)
            return
        if total > self.pool.size:
            logger.info("RPC key %s: %d servers now, measuring on %d workers", self.remote, total, total)
            self.pool.size = total

    def _share(self, graph) -> SharedConstants:
        """The shared constants of ``graph`` (the current search's model): a new set for a new graph."""
        if self._shared is None or self._shared_graph() is not graph:
            if self._shared is not None:
                self._shared.close()
            self._shared = SharedConstants(node.expr for node in graph.nodes if node.kind == "const")
            self._shared_graph = weakref.ref(graph)
        return self._shared

    def _disk_key(self, key: str) -> str:
        # One cache directory serves every target and device: a cost measured for another CPU, or on
        # another RPC device key, is not this one's (local costs keep the keys they always had).
        device = f"{self.remote.cache_key}|" if self.remote is not None and self.remote.cache_key else ""
        return hashlib.sha256(f"{self.settings[0]}|{self._log_digest}|{device}{key}".encode()).hexdigest()

    def lookup(self, request: CostRequest) -> Optional[float]:
        """The cached cost of ``request``, or None when it was never measured."""
        entry = self._memory.get(request.key) or (self.cache.get(self._disk_key(request.key)) if self.cache else None)
        if entry is None:
            return None
        self._note_boundary(request.key, entry)
        return cost_ms(entry)

    def _note_boundary(self, key: str, entry: dict) -> None:
        ms, kb = entry.get("boundary_ms"), entry.get("boundary_kb")
        if isinstance(ms, (int, float)) and isinstance(kb, (int, float)) and kb > 0 and math.isfinite(ms):
            self._boundaries[key] = (float(ms), float(kb))

    def crossing_ms_per_kb(self, keys: Optional[Iterable[str]] = None) -> float:
        """The layout transforms at TVM candidates' borders (left out of their costs) per kilobyte, over
        every candidate measured or looked up so far: what TVM pays for each kilobyte passed to or from
        another toolchain (a weighted mean, so large tensors, which the transforms' time is, count most).

        Examples
        --------
        >>> est = MeasuredCostEstimator(cache_dir="", workers=1)
        >>> est._note_boundary("a", {"ms": 1.0, "boundary_ms": 0.1, "boundary_kb": 1000.0})
        >>> est._note_boundary("b", {"ms": 1.0, "boundary_ms": 0.3, "boundary_kb": 1000.0})
        >>> round(est.crossing_ms_per_kb() * 1e3, 3), round(est.crossing_ms_per_kb(["b"]) * 1e3, 3)  # us per KB
        (0.2, 0.3)
        >>> est.close()
        """
        seen = self._boundaries if keys is None else {k: self._boundaries[k] for k in keys if k in self._boundaries}
        if not seen:
            return 0.0
        ms, kb = (sum(values) for values in zip(*seen.values()))
        return ms / kb

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        if requests and requests[0].graph is not None:
            self._share(requests[0].graph)  # also for validation, when every cost is cached
        todo: Dict[str, CostRequest] = {}
        for req in requests:
            if self.lookup(req) is None and req.key not in todo:
                todo[req.key] = req
        self.stats["cached"] += sum(1 for r in requests if r.key not in todo)
        if todo:
            self._measure(list(todo.values()))
        return [self.lookup(r) for r in requests]

    def _measure(self, requests: List[CostRequest]) -> None:
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
        requests = self._runnable_remotely(buildable)
        for attempt in range(self.RETRIES + 1):
            requests = self._measure_once(requests, last_try=attempt == self.RETRIES)
            if not requests:
                break
            logger.warning("retrying %d measurement(s) on other servers of %s (attempt %d of %d)",
                           len(requests), self.remote, attempt + 2, self.RETRIES + 1)

    def _runnable_remotely(self, requests: List[CostRequest]) -> List[CostRequest]:
        """Leave out (cost inf, one warning each) toolchains whose runtime functions the remote servers lack."""
        if self.remote is None:
            return requests
        kept = []
        for req in requests:
            name = req.toolchain.name
            if name not in self._remote_missing:
                needed = runtime_functions(req.toolchain)
                self._remote_missing[name] = self.remote.missing(needed) if needed else []
                if self._remote_missing[name]:
                    logger.warning("the servers of %s cannot run toolchain %s (no %s): it is left out; serve with "
                                   "'python -m tvm_tcutils.rpc_server' (with the native plugin built, or "
                                   "TVM_TCUTILS_PACKED_CALL=llvm here) to measure it", self.remote, name,
                                   ", ".join(self._remote_missing[name]))
            if self._remote_missing[name]:
                self._memory[req.key] = {"ms": None, "error": f"not runnable on {self.remote}"}
            else:
                kept.append(req)
        return kept

    def _measure_once(self, requests: List[CostRequest], last_try: bool = True) -> List[CostRequest]:
        """Measure ``requests``; returns those to measure again (their server was lost), unless ``last_try``."""
        target, repeat, warmup, min_repeat_ms = self.settings
        # A TVM candidate's layout transforms at its boundary cancel between neighbours in a TVM
        # region; a crossing to another toolchain pays them, which validation's crossing penalty learns.
        bar = Progress(len(requests), self.progress)

        def tasks() -> Iterator[tuple]:
            # Pulled by the pool when a worker is free: one candidate serialised at a time per worker.
            for req in requests:
                self._grow()
                shared = self._share(req.graph)
                text = shared.dumps(req.module)
                req.release()  # the text has it; the module would otherwise live as long as the request
                extra = {"backend": self.remote} if self.remote is not None else {}
                yield ("candidate", dict(mod_json=text, target=target, repeat=repeat, warmup=warmup,
                                         min_repeat_ms=min_repeat_ms, tuning_log=self.tuning_log,
                                         boundary_layout=not req.toolchain.is_tvm, constants=shared.directory,
                                         **extra))

        again: List[CostRequest] = []

        def record(k: int, result: dict) -> None:
            req = requests[k]
            if self.remote is not None and not last_try and _server_lost(result):
                again.append(req)
                logger.warning("measurement of %s %s lost its server (%s): retried on another server",
                               req.toolchain.name, "+".join(req.ops)[:80], result.get("error"))
                if self.log_file:
                    with open(self.log_file, "a") as handle:
                        handle.write(f"RETRIED {req.toolchain.name:<8} {'+'.join(req.ops)[:80]} "
                                     f"({result.get('error')})\n")
                return
            entry = {
                "ms": result.get("ms"), "toolchain": req.toolchain.name, "ops": req.ops,
                "error": result.get("error"), "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
            }
            if "boundary_kb" in result:
                entry.update(boundary_ms=result.get("boundary_ms"), boundary_kb=result["boundary_kb"])
                self._note_boundary(req.key, entry)
            failed = not math.isfinite(cost_ms(entry))
            self.stats["failed" if failed else "measured"] += 1
            self._memory[req.key] = entry
            if self.cache:
                self.cache.put(self._disk_key(req.key), entry)
            where = f" on {result['where']}" if result.get("where") not in (None, "local") else ""
            line = f"{req.toolchain.name:<8} {'+'.join(req.ops)[:80]:<80} " + (
                f"FAILED {entry['error']}" if failed else f"{cost_ms(entry):.4f} ms{where}")
            (logger.warning if failed else logger.info)("measured %s", line)
            if self.log_file:
                with open(self.log_file, "a") as handle:
                    handle.write(line + "\n")
            bar.step(failed)

        self.pool.run(tasks(), record)
        return again

    def whole_model_timer(self):
        """Times whole modules with this estimator's target, repeats and tuning log: in its workers
        (:class:`~.workers.PooledWholeModelTimer`), or with a remote backend on one of its servers
        (:class:`RemoteWholeModelTimer`), so that validation and the final comparison time where
        the candidates were measured."""
        target, repeat, warmup, _ = self.settings
        if self.remote is not None:
            return RemoteWholeModelTimer(self.remote, target, repeat, warmup, self.tuning_log)
        return PooledWholeModelTimer(self.pool, target, repeat, warmup, self.tuning_log, self._shared)

    def close(self) -> None:
        self.pool.close()
        if self._shared is not None:
            self._shared.close()
            self._shared = None

    def __del__(self):
        try:
            self.close()
        except (OSError, AttributeError):  # at interpreter exit, or after a failed __init__
            pass


class RemoteWholeModelTimer:
    """Times whole modules on a server of an RPC key: built here, loaded there, timed in turns.

    Every timing holds one server for its length (``RemoteBackend.one_server``):
    modules compared side by side run on the same device, and a key with one
    server cannot deadlock on a second request. The final comparison's
    ``sampler`` works inside :meth:`session`, which holds the server across
    its rounds and lets every loaded module go at its end.

    Parameters
    ----------
    remote : tvm_tcutils.rpc.RemoteBackend
        The tracker and key.
    target : str
        Target of the builds (the device's).
    repeat, warmup : int
        Timed runs per sample (at least 10) and runs before timing.
    tuning_log : str, optional
        AutoTVM log applied to every build.
    """

    def __init__(self, remote: Backend, target: str, repeat: int = 10, warmup: int = 2,
                 tuning_log: Optional[str] = None):
        self.remote, self.target, self.tuning_log = remote, target, tuning_log
        self.repeat, self.warmup = max(repeat, 10), warmup
        self._open: List[Timer] = []  # the timers a session's sampler loaded

    def _timer(self, mod) -> Timer:
        return Timer(mod, None, self.target, repeat=self.repeat, warmup=self.warmup,
                     min_repeat_ms=WHOLE_MODEL_MIN_REPEAT_MS, tuning_log=self.tuning_log, backend=self.remote)

    def time(self, mod) -> Optional[float]:
        """Latency (ms) of one whole module, ``inf`` if it fails; None if the server could not be used."""
        times = self.time_side_by_side([mod], rounds=1)
        return None if times is None else times[0]

    def time_side_by_side(self, mods: Sequence, rounds: int = 5) -> Optional[List[float]]:
        """Latencies (ms) of modules timed in turns on one server (``inf`` for a module that fails to
        build or run); None if no server could be had."""
        try:
            with self.remote.one_server():
                timers = {}
                for k, mod in enumerate(mods):
                    try:
                        timers[str(k)] = self._timer(mod)
                    except (tvm.TVMError, RuntimeError, ValueError, OSError) as err:
                        logger.warning("whole-model measurement: module %d failed: %s", k, error_line(err))
                try:
                    timed = interleave({k: t.sample for k, t in timers.items()}, rounds)
                finally:
                    for timer in timers.values():
                        timer.close()
        except (tvm.TVMError, RuntimeError, OSError) as err:
            logger.warning("whole-model measurement on %s failed: %s", self.remote, error_line(err))
            return None
        return [timed[str(k)].median_ms if str(k) in timed else math.inf for k in range(len(mods))]

    @contextlib.contextmanager
    def session(self) -> Iterator["RemoteWholeModelTimer"]:
        """Hold one server for a final comparison: its :meth:`sampler` calls load there; at the end of
        the block every loaded module is let go, then the server."""
        with self.remote.one_server():
            try:
                yield self
            finally:
                while self._open:
                    self._open.pop().close()

    def sampler(self, mod):
        """Build ``mod`` here, load it on the held server; its sample function (inside :meth:`session`)."""
        timer = self._timer(mod)
        self._open.append(timer)
        return timer.sample
