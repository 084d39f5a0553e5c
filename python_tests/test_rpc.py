"""Measuring through TVM's RPC tracker: a real tracker and two real servers on localhost.

The address checks, the queue listing, a module timed on a server, a short
``tune`` through AutoTVM's ``RPCRunner``, and an unreachable tracker failing
fast with its address named.
"""
from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from tvm import autotvm, relay

from conftest import run_cli
from tvm_tcutils import rpc
from tvm_tcutils.bench.rpc import free_port
from tvm_tcutils.measure import Timer
from tvm_tcutils.models import save_model


def tiny_dense(units: int = 16):
    x = relay.var("x", shape=(1, 32), dtype="float32")
    weight = relay.const(np.random.default_rng(0).standard_normal((units, 32)).astype("float32"))
    return relay.transform.InferType()(tvm_module(relay.Function([x], relay.nn.dense(x, weight))))


def tvm_module(func):
    import tvm

    return tvm.IRModule.from_expr(func)


@pytest.mark.parametrize("text, message", [
    ("localhost", "expected HOST:PORT"), ("host:0", "1..65535"), (":9190", "expected HOST:PORT"),
])
def test_parse_tracker_refuses_bad_addresses(text, message):
    with pytest.raises(ValueError, match=message):
        rpc.parse_tracker(text)


def test_tracker_from_env():
    assert rpc.tracker_from_env({"TVM_TRACKER_HOST": "h", "TVM_TRACKER_PORT": "9000"}) == rpc.Tracker("h", 9000)
    with pytest.raises(ValueError, match="TVM_TRACKER_HOST/TVM_TRACKER_PORT"):
        rpc.tracker_from_env({"TVM_TRACKER_HOST": "h", "TVM_TRACKER_PORT": "x"})


def test_unreachable_tracker_fails_fast_naming_the_address(tmp_path):
    # A listener that never answers (a hung tracker): only the timeout ends the wait.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        address = "127.0.0.1:%d" % silent.getsockname()[1]
        start = time.monotonic()
        with pytest.raises(rpc.RPCError, match=f"{address} is not reachable .no answer within 2 s"):
            rpc.check_reachable(rpc.parse_tracker(address), timeout=2)
        assert time.monotonic() - start < 10
    closed = "127.0.0.1:%d" % free_port()  # nobody listens: refused at once
    start = time.monotonic()
    proc = run_cli("tune", "mlp", "--log", str(tmp_path / "t.log"), "--rpc-tracker", closed, "--rpc-key", "k")
    assert proc.returncode == 2 and f"RPC tracker {closed} is not reachable" in proc.stderr
    assert time.monotonic() - start < 30  # includes the interpreter's start and TVM's import
    assert not (tmp_path / "t.log").exists()


def test_server_needs_an_explicit_address():
    from tvm_tcutils import rpc_server

    with pytest.raises(SystemExit):
        rpc_server.parser().parse_args(["--tracker", "127.0.0.1:9190", "--key", "k"])
    assert rpc_server.parser().parse_args(["--host", "10.0.0.5"]).host == "10.0.0.5"


def test_servers_say_at_start_that_they_belong_on_trusted_networks(rpc_cluster):
    with open(rpc_cluster.logs[0]) as log:
        first = log.readline()
    assert "serving on 127.0.0.1" in first and "trusted network only" in first


def test_queue_lists_the_key_and_cli_info(rpc_cluster):
    rows = rpc.queue(rpc_cluster.tracker)
    assert rows["tcutils-test"].total == 2 and rows["tcutils-test"].free == 2
    with pytest.raises(rpc.RPCError, match="no server for key 'nokey'.*tcutils-test"):
        rpc.servers(rpc_cluster.tracker, "nokey")
    proc = run_cli("info", "--rpc-tracker", str(rpc_cluster.tracker))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[2].split() == ["tcutils-test", "2", "2", "0"]


def test_remote_timer_matches_local_outputs_and_removes_its_file(rpc_cluster):
    mod = tiny_dense()
    before = [rpc_cluster.loaded(k) for k in range(2)]
    backend = rpc.RemoteBackend(rpc_cluster.tracker, rpc_cluster.key)
    remote = Timer(mod, None, "llvm", repeat=3, warmup=1, backend=backend)
    local = Timer(mod, None, "llvm", repeat=3, warmup=1, inputs=remote.inputs)
    assert remote.where.startswith("127.0.0.1:") and remote.where != "local"
    assert remote().median_ms > 0
    np.testing.assert_allclose(remote.outputs()[0], local.outputs()[0], rtol=1e-5)
    assert sum(rpc_cluster.loaded(k) for k in range(2)) == sum(before) + 1
    assert rpc_cluster.free() == 1  # the session holds its server
    remote.close()
    deadline = time.monotonic() + 10
    while rpc_cluster.free() < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert rpc_cluster.free() == 2  # back in the queue once the session ended


# Under -m slow (the CI budget, 10 s): the tracker path stays covered by test_rpc_collage.py
# (test_collage_command_through_the_tracker, test_measured_search_on_two_servers_matches_a_local_search) and
# test_remote_timer_matches_local_outputs_and_removes_its_file above; tuning by test_tuning_runner.py.
@pytest.mark.slow
def test_tune_command_through_the_tracker(rpc_cluster, tmp_path):
    model, log = str(tmp_path / "dense.json"), str(tmp_path / "dense.log")
    save_model(model, tiny_dense(64))
    before = [rpc_cluster.loaded(k) for k in range(2)]
    proc = run_cli("tune", model, "--dtype", "float32", "--trials", "2", "--log", log, "--no-progress",
                   "--target", "llvm", "--rpc-tracker", str(rpc_cluster.tracker), "--rpc-key", rpc_cluster.key)
    assert proc.returncode == 0, proc.stderr[-2000:]
    # Two tasks (dense_nopack, dense_pack), two trials each.
    assert "tuned 2 tasks on RPC key tcutils-test at 127.0.0.1:" in proc.stdout
    records = list(autotvm.record.load_from_file(log))
    assert len(records) == 4 and all(res.error_no == 0 for _, res in records)
    loaded = [rpc_cluster.loaded(k) - before[k] for k in range(2)]
    assert sum(loaded) == 4 and all(n > 0 for n in loaded), loaded  # both servers measured
