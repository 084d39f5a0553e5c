"""Faults while measuring through TVM's RPC tracker: a server killed in the middle of a Collage search.

Stock TVM servers (``python -m tvm.exec.rpc_server``) serve here, so the
search also shows that toolchains those servers cannot run (``ort`` needs the
package's runtime functions) are left out with a warning, not measured as
failures.
"""
from __future__ import annotations

import logging
import math
import threading
import time

import numpy as np
import tvm
from tvm import relay

from tvm_tcutils import rpc
from tvm_tcutils.bench.rpc import LocalCluster
from tvm_tcutils.collage import partition
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator


def op_chain():
    """Three operators, six candidates: the first two go one to each server, and the kill lands in server 0's
    second while server 1 times another. After the kill every remaining candidate (and the retry) is timed on
    server 1 alone, half a second each: a fourth operator's four more candidates only added seconds there."""
    x = relay.var("x", shape=(8, 32))
    w = relay.const(np.random.default_rng(0).standard_normal((32, 32)).astype("float32"))
    y = relay.nn.relu(relay.nn.dense(x, w))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(y))))


def test_a_server_killed_mid_search_costs_a_retry_not_an_infinite_cost(tmp_path, caplog):
    log = tmp_path / "measure.log"
    with LocalCluster("tcutils-faults", servers=2, server_module="tvm.exec.rpc_server") as cluster:
        backend = rpc.RemoteBackend(cluster.tracker, cluster.key)
        # Each measurement lasts half a second or so (warm-up, 3 x 150 ms): the kill lands inside one.
        est = MeasuredCostEstimator(cache_dir=str(tmp_path), repeat=3, warmup=1, min_repeat_ms=150, progress=False,
                                    remote=backend, log_file=str(log), timeout=60)
        killed = threading.Event()

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 120
            while cluster.loaded(0) < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            cluster.kill_server(0)  # SIGKILL while it times its second candidate
            killed.set()

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        with caplog.at_level(logging.WARNING, logger="tvm_tcutils.collage"):
            try:
                result = partition(op_chain(), None, ["tvm", "ort"], est, compare_single=False, validate_rounds=0)
            finally:
                est.close()
        killer.join(timeout=5)
        assert killed.is_set()
        assert cluster.servers[0].poll() is not None and cluster.servers[1].poll() is None

    assert est.stats["failed"] == 0 and est.stats["measured"] > 3
    assert math.isfinite(result.estimated_ms)
    assert all(p.toolchain == "tvm" and math.isfinite(p.estimated_ms) for p in result.partitions)
    lines = log.read_text().splitlines()
    retried = [line for line in lines if line.startswith("RETRIED")]
    # Each retry names why: the session's lost connection, or the worker's timeout (a hung server).
    reasons = (*rpc.LOST_SESSION_SIGNS, "RPC", "timed out")
    assert retried and all(any(word in line for word in reasons) for line in retried), lines
    measured = [line for line in lines if not line.startswith("RETRIED")]
    assert len(measured) == est.stats["measured"] and all("FAILED" not in line for line in measured)
    messages = [r.getMessage() for r in caplog.records]
    assert any("lost its server" in m and "retried on another server" in m for m in messages)
    assert any("cannot run toolchain ort (no tvm_tcutils.ort.load, tvm_tcutils.ort.run" in m for m in messages)
