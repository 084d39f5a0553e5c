"""A local RPC tracker with servers, and the benchmark of measuring through it.

:class:`LocalCluster` starts what a user starts on real machines, here on
localhost: a tracker (``python -m tvm.exec.rpc_tracker``) and servers
(``python -m tvm_tcutils.rpc_server``, each pinned to a core of its own where
there are enough), on free ports. The tests, ``docs/rpc.md``'s demo and
``scripts/bench_rpc.py`` use it. Every process gets its own process group and
dies with its launcher; :meth:`LocalCluster.close` (or leaving the ``with``
block) kills them all.

:func:`scaling` is the benchmark: for 1, 2 (and 4) servers it runs a measured
Collage search (empty cost cache each time) and a short tuning session through
the tracker, and reports the wall times and how the remote costs agree with
local measurement.

Examples
--------
>>> with LocalCluster("demo", servers=1) as cluster:   # doctest: +SKIP
...     print(cluster.tracker, cluster.free())
127.0.0.1:41023 1
"""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from .. import processes
from ..rpc import RPCError, Tracker, check_reachable, queue

#: Seconds a local tracker or server may take to come up.
START_TIMEOUT = 60.0


def free_port() -> int:
    """A TCP port nobody listens on now (the OS's choice).

    Examples
    --------
    >>> 0 < free_port() < 65536
    True
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _child_setup(core: Optional[int]):
    parent = os.getpid()

    def setup() -> None:  # runs in the child between fork and exec
        processes.die_with_parent(parent)
        if core is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(0, {core})

    return setup


class LocalCluster:
    """A tracker and ``servers`` RPC servers of one key on localhost, for tests, demos and benchmarks.

    Parameters
    ----------
    key : str
        The device key the servers register with.
    servers : int
        Servers to start.
    pin : bool
        Pin each server to a core of its own (when the machine has that many).
    server_module : str
        ``tvm_tcutils.rpc_server`` (the package's runtime functions) or
        ``tvm.exec.rpc_server`` (a stock TVM server).
    log_dir : str, optional
        Where the processes' logs go (default a new temporary directory).
    """

    def __init__(self, key: str, servers: int = 2, pin: bool = False,
                 server_module: str = "tvm_tcutils.rpc_server", log_dir: Optional[str] = None):
        if servers < 0:
            raise ValueError(f"servers must be >= 0, got {servers}")
        self.key, self.pin, self.server_module = key, pin, server_module
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="tcutils-rpc-cluster-")
        self.tracker_process: Optional[subprocess.Popen] = None
        self.servers: List[subprocess.Popen] = []
        self.logs: List[str] = []
        port = free_port()
        self.tracker = Tracker("127.0.0.1", port)
        try:
            self.tracker_process = self._spawn(
                ["tvm.exec.rpc_tracker", "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 1)],
                os.path.join(self.log_dir, "tracker.log"), None)
            self._wait(lambda: self._reachable(), "the tracker to answer")
            # Started together, then one wait: each server spends its first seconds importing TVM.
            for _ in range(servers):
                self._start_server()
            self._wait_registered(f"{servers} servers to register")
            # The tracker lists a server (its info) a moment before the server joins the free queue: a
            # client that counts free servers right after start-up would see one missing.
            self._wait(lambda: self.free() >= servers, f"{servers} servers to be free")
        except BaseException:
            self.close()
            raise

    def _spawn(self, args: Sequence[str], log: str, core: Optional[int]) -> subprocess.Popen:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
        with open(log, "w") as handle:
            return subprocess.Popen([sys.executable, "-m", *args], stdout=handle, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=env, preexec_fn=_child_setup(core),
                                    **processes.WORKER_POPEN_OPTIONS)

    def _reachable(self) -> bool:
        try:
            check_reachable(self.tracker, timeout=1.0)
        except RPCError:
            return False
        return True

    @staticmethod
    def _wait(condition, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(f"local RPC cluster: timed out waiting for {what}")
            time.sleep(0.1)

    def add_server(self) -> int:
        """Start one more server and wait until the tracker lists it; returns its index."""
        index = self._start_server()
        self._wait_registered(f"server {index} to register")
        return index

    def _start_server(self) -> int:
        index = len(self.servers)
        cores = os.cpu_count() or 1
        core = index % cores if self.pin and cores > index else None
        port = free_port()
        log = os.path.join(self.log_dir, f"server{index}.log")
        self.servers.append(self._spawn(
            [self.server_module, "--host", "127.0.0.1", "--port", str(port), "--port-end", str(port + 100),
             "--tracker", str(self.tracker), "--key", self.key], log, core))
        self.logs.append(log)
        return index

    def _wait_registered(self, what: str) -> None:
        """Wait until the tracker lists every server of this cluster that is still running."""
        alive = sum(process.poll() is None for process in self.servers)
        self._wait(lambda: self.total() >= alive, what)

    def total(self) -> int:
        """Servers of the key the tracker lists."""
        row = queue(self.tracker).get(self.key)
        return row.total if row else 0

    def free(self) -> int:
        """Free servers of the key."""
        row = queue(self.tracker).get(self.key)
        return row.free if row else 0

    def kill_server(self, index: int) -> None:
        """Kill server ``index`` and the sessions it forked (SIGKILL: no goodbye to the tracker)."""
        processes.kill_group(self.servers[index], signal.SIGKILL)
        self.servers[index].wait()

    def loaded(self, index: int) -> int:
        """How many modules server ``index`` loaded (its log's ``load_module`` lines)."""
        with open(self.logs[index], errors="replace") as handle:
            return sum("load_module" in line for line in handle)

    def close(self) -> None:
        """Kill every process of the cluster."""
        for process in [*self.servers, self.tracker_process]:
            if process is not None and process.poll() is None:
                processes.kill_group(process, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=10)
        self.servers, self.tracker_process = [], None

    def __enter__(self) -> "LocalCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LocalCluster({self.key!r} at {self.tracker}, {len(self.servers)} servers)"


def environment(cluster: LocalCluster) -> Dict[str, str]:
    """The ``--rpc-tracker``/``--rpc-key`` arguments of a cluster, as a dict of option -> value.

    Examples
    --------
    >>> class Fake: tracker, key = Tracker("127.0.0.1", 9190), "k"
    >>> environment(Fake())
    {'--rpc-tracker': '127.0.0.1:9190', '--rpc-key': 'k'}
    """
    return {"--rpc-tracker": str(cluster.tracker), "--rpc-key": cluster.key}


# ---------------------------------------------------------------------------
# The scaling benchmark (scripts/bench_rpc.py)
# ---------------------------------------------------------------------------
def _stored_costs(directory: str) -> Dict[str, float]:
    """Candidate cost per (toolchain, ops) label of a cost cache (``costs.jsonl``)."""
    import json

    costs = {}
    path = os.path.join(directory, "costs.jsonl")
    if os.path.exists(path):
        with open(path) as handle:
            for line in handle:
                entry = json.loads(line)
                if entry.get("ms"):
                    costs[f"{entry['toolchain']}:{'+'.join(entry['ops'])}"] = float(entry["ms"])
    return costs


def collage_search_seconds(mod, toolchains: Sequence[str], cache_dir: str, repeat: int,
                           cluster: Optional[LocalCluster] = None) -> float:
    """Wall seconds of one measured Collage search (empty cache) on ``cluster``'s servers, or here."""
    from ..collage import partition
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..rpc import RemoteBackend

    remote = RemoteBackend(cluster.tracker, cluster.key) if cluster else None
    start = time.perf_counter()
    estimator = MeasuredCostEstimator(cache_dir=cache_dir, repeat=repeat, progress=False, remote=remote)
    try:
        partition(mod, None, list(toolchains), estimator, compare_single=False, validate_rounds=0)
    finally:
        estimator.close()
    return time.perf_counter() - start


def tuning_seconds(mod, params, target: str, trials: int, log: str, cluster: LocalCluster) -> float:
    """Wall seconds of a short AutoTVM session (``trials`` per task) on ``cluster``'s servers."""
    from ..rpc import RemoteBackend
    from ..tuning import tune

    start = time.perf_counter()
    tune(mod, params, target, trials, log, progress=False, remote=RemoteBackend(cluster.tracker, cluster.key))
    return time.perf_counter() - start


def scaling(server_counts: Sequence[int], mod, params, toolchains: Sequence[str], target: str,
            rounds: int = 2, repeat: int = 5, trials: int = 4) -> List[dict]:
    """Wall time of a measured Collage search and a short tuning per server count, and the costs' agreement.

    One cluster per count is started first (servers pinned to their own cores
    where there are enough); then, for ``rounds`` rounds, every count runs in
    turns (1, 2, 4, 1, 2, 4, ...: a drift of the machine's load hits them
    alike), each search with an empty cost cache, and a local search gives
    the reference costs. Rows: ``servers``, ``collage`` and ``tune``
    (:class:`~tvm_tcutils.measure.Timing` of wall seconds, in ms),
    ``collage_speedup``/``tune_speedup`` (a :class:`~tvm_tcutils.measure.Ratio`
    against the first count) and ``cost_agreement`` (the median and range of
    remote / local candidate costs).
    """
    import numpy as np

    from ..measure import Timing, ratio

    samples: Dict[int, Dict[str, List[float]]] = {n: {"collage": [], "tune": []} for n in server_counts}
    agreement: Dict[int, List[float]] = {n: [] for n in server_counts}
    with contextlib.ExitStack() as stack:
        clusters = {n: stack.enter_context(LocalCluster(f"scale{n}", servers=n, pin=True)) for n in server_counts}
        work = stack.enter_context(tempfile.TemporaryDirectory(prefix="tcutils-bench-rpc-"))
        for round_ in range(rounds):
            here = os.path.join(work, f"local{round_}")
            collage_search_seconds(mod, toolchains, here, repeat)
            reference = _stored_costs(here)
            for n, cluster in clusters.items():
                there = os.path.join(work, f"remote{round_}-{n}")
                samples[n]["collage"].append(1e3 * collage_search_seconds(mod, toolchains, there, repeat, cluster))
                costs = _stored_costs(there)
                agreement[n] += [costs[k] / reference[k] for k in costs if k in reference]
                log = os.path.join(work, f"tune{round_}-{n}.log")
                samples[n]["tune"].append(1e3 * tuning_seconds(mod, params, target, trials, log, cluster))
    first = server_counts[0]
    rows = []
    for n in server_counts:
        collage, tune = Timing(tuple(samples[n]["collage"])), Timing(tuple(samples[n]["tune"]))
        spread = agreement[n] or [float("nan")]
        rows.append({
            "servers": n, "collage": collage, "tune": tune,
            "collage_speedup": ratio(Timing(tuple(samples[first]["collage"])), collage),
            "tune_speedup": ratio(Timing(tuple(samples[first]["tune"])), tune),
            "cost_agreement": {"median": float(np.median(spread)), "min": float(min(spread)),
                               "max": float(max(spread)), "candidates": len(agreement[n])},
        })
    return rows
