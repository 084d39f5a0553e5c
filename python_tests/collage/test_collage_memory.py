"""Bounded memory and robust workers of the measured search, and early argument errors (issue 20)."""
from __future__ import annotations

import json
import math
import os
import sys
import time

import numpy as np
import pytest
import tvm
from tvm import relay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collage_test_codegen as test_codegen  # noqa: E402

from tvm_tcutils import collage  # noqa: E402
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator  # noqa: E402
from tvm_tcutils.collage.cost.shared import PREFIX, SharedConstants, load_module  # noqa: E402
from tvm_tcutils.collage.cost.workers import WorkerPool  # noqa: E402

from test_collage_driver import elementwise_net  # noqa: E402


def exp_task(n: int = 4):
    x = relay.var("x", shape=(n,))
    text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    return ("candidate", dict(mod_json=text, target="llvm", repeat=1, warmup=0, min_repeat_ms=0))


def weighted_net(size: int = 64):
    """A dense and an add, each reading a constant large enough to be shared (16 and 4 KiB)."""
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(16, size))
    w = relay.const(rng.standard_normal((size, size)).astype("float32"))
    b = relay.const(rng.standard_normal((16, size)).astype("float32"))
    y = relay.add(relay.nn.dense(x, w), b)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.tanh(y))))


def test_the_pool_pulls_a_task_only_when_a_worker_is_free():
    made, done = [], []

    def tasks():
        for k in range(7):
            made.append(k)
            assert len(made) - len(done) <= pool.size, "more tasks materialised than workers"
            yield exp_task(4 + k)

    pool = WorkerPool(2, 120.0)
    try:
        results = pool.run(tasks(), lambda k, r: done.append(k))
    finally:
        pool.close()
    assert len(results) == 7 and all(r["ms"] > 0 for r in results)
    assert sorted(done) == list(range(7))


def test_a_worker_grown_past_the_limit_is_replaced_between_tasks():
    pool = WorkerPool(1, 120.0, recycle_bytes=1)  # every worker is "too big" after its task
    try:
        results = pool.run(iter([exp_task(4), exp_task(5)]))
    finally:
        pool.close()
    assert [r["ms"] > 0 for r in results] == [True, True]
    assert pool.recycled == 2


def test_a_worker_over_the_limit_gives_back_its_garbage_before_it_is_replaced():
    from tvm_tcutils.collage.cost.workers import resident_bytes

    imports = ("collage_test_codegen",)
    probe = WorkerPool(1, 120.0, imports, recycle_bytes=0)
    try:
        probe.run([exp_task(4)])
        base = resident_bytes(probe._workers[0].process.pid)
    finally:
        probe.close()
    # 256 MiB left in a cycle puts the worker over its limit until its garbage is collected: collected (and
    # the heap trimmed) after the task, it stays; before, it was replaced (a new interpreter, seconds).
    pool = WorkerPool(1, 120.0, imports, recycle_bytes=base + (128 << 20))
    try:
        results = pool.run([("leave_cycle", {"mb": 256}), exp_task(5)])
        assert [r["ms"] > 0 for r in results] == [True, True]
        assert pool.recycled == 0
        assert resident_bytes(pool._workers[0].process.pid) < base + (128 << 20)
    finally:
        pool.close()


def test_payloads_carry_no_weights_and_shared_constants_are_written_once(tmp_path):
    """Every candidate, TVM's and a BYOC toolchain's (constant inside a composite), is sent without its weights."""
    # One worker: every task's payload goes through the one pool.run either way.
    est = MeasuredCostEstimator(cache_dir="", repeat=2, timeout=60, progress=False,
                                worker_imports=["collage_test_codegen"], workers=1)
    sizes = []
    run = est.pool.run

    def recording(tasks, *args, **kwargs):
        def sized():
            for task in tasks:
                for text in task[1].get("mod_jsons", [task[1].get("mod_json", "")]):
                    # The arrays written into the text (base64): the graph's own size depends on what won.
                    sizes.extend(len(array) for array in json.loads(text)["b64ndarrays"])
                yield task
        return run(sized(), *args, **kwargs)

    est.pool.run = recording
    try:
        # Validated and compared whole (those tasks' payloads are checked too), with a 1 s comparison budget:
        # at least one round always runs, and this tiny model's near-ties would spend the default 60 s budget
        # on rounds that send the same payloads again.
        result = collage.partition(weighted_net(), None, ["tvm", test_codegen.toolchain(ops=["add", "tanh"])],
                                   est, validate_rounds=1, compare_budget_s=1.0)
        shared = sorted(os.listdir(est._shared.directory))
    finally:
        est.close()
    assert math.isfinite(result.estimated_ms) and result.measured_ms and math.isfinite(result.measured_ms)
    assert est.stats["failed"] == 0 and est.stats["measured"] > 3
    assert shared == ["c0.npy", "c1.npy"]  # the weight and the bias, once each
    # Constants under 4 KiB stay inline (5.5 KiB in base64 with its header): the 16 KiB weight and the
    # 4 KiB bias never are.
    assert est.stats["measured"] > 3 and max(sizes, default=0) < 4096 * 4 // 3


def test_shared_constants_round_trip_a_byoc_module():
    mod = weighted_net()
    consts = [n for n in [mod["main"].body.args[0].args[0].args[1], mod["main"].body.args[0].args[1]]]
    shelf = SharedConstants(consts)
    try:
        text = shelf.dumps(mod)
        assert PREFIX in text
        back = load_module(text, shelf.directory)
    finally:
        shelf.close()
    assert tvm.ir.structural_equal(relay.transform.InferType()(back), mod, map_free_vars=True)
    assert not os.path.exists(shelf.directory)


def test_a_candidate_writing_a_mebibyte_to_stderr_is_measured(tmp_path):
    chatty = test_codegen.toolchain("tcutils_test_chatty", combine=False, ops=["tanh", "exp"])
    est = MeasuredCostEstimator(cache_dir=str(tmp_path), repeat=2, timeout=60, progress=False,
                                worker_imports=["collage_test_codegen"], workers=1)
    try:
        collage.partition(elementwise_net(), None, ["tvm", chatty], est, validate_rounds=0)
    finally:
        est.close()
    entries = [e for e in est._memory.values() if e["toolchain"] == "tcutils_test_chatty"]
    assert entries and all(e["ms"] is not None and math.isfinite(e["ms"]) for e in entries), entries


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")
def test_a_timed_out_workers_children_are_killed(tmp_path, monkeypatch):
    marker = tmp_path / "grandchild.pid"
    monkeypatch.setenv("TCUTILS_TEST_GRANDCHILD", str(marker))
    spawner = test_codegen.toolchain("tcutils_test_spawn_hang", combine=False, ops=["tanh"])
    # 3 s: the hung candidate writes its child's pid as soon as its build starts; a slow ordinary candidate
    # timing out as well would not change what is checked (the spawner's errors and its child's end).
    est = MeasuredCostEstimator(cache_dir="", repeat=1, timeout=3, progress=False,
                                worker_imports=["collage_test_codegen"])
    try:
        collage.partition(elementwise_net(), None, ["tvm", spawner], est, validate_rounds=0)
    finally:
        est.close()
    errors = [e["error"] for e in est._memory.values() if e["toolchain"] == "tcutils_test_spawn_hang"]
    assert errors and all("timed out" in e for e in errors)
    pid = int(marker.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the hung candidate's child process outlived its worker"


def snapshot(mod):
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def ill_typed():
    x, y = relay.var("x", shape=(2, 3)), relay.var("y", shape=(4,))
    return tvm.IRModule.from_expr(relay.Function([x, y], relay.add(x, y)))


BAD_PARTITION_ARGUMENTS = [
    ("params", TypeError, lambda m: dict(params=[("x", np.ones(3))])),
    ("params", TypeError, lambda m: dict(params={"x": [1.0, 2.0]})),
    ("params", ValueError, lambda m: dict(params={"no_such_input": np.ones((4, 8), "float32")})),
    ("params", ValueError, lambda m: dict(params={"x": np.ones((4, 9), "float32")})),
    ("validate_rounds", TypeError, lambda m: dict(validate_rounds=1.5)),
    ("validate_rounds", ValueError, lambda m: dict(validate_rounds=-1)),
    ("toolchains", ValueError, lambda m: dict(toolchains="tvm,no-such-toolchain")),
    ("compare_single", TypeError, lambda m: dict(compare_single="no")),
    ("cost_estimator", TypeError, lambda m: dict(cost_estimator="measured")),
]


@pytest.mark.parametrize("name,error,kwargs", BAD_PARTITION_ARGUMENTS,
                         ids=[f"{n}-{k}" for k, (n, _, _) in enumerate(BAD_PARTITION_ARGUMENTS)])
def test_bad_partition_arguments_fail_fast_naming_the_argument(name, error, kwargs):
    mod = elementwise_net()
    before = snapshot(mod)
    start = time.monotonic()
    with pytest.raises(error, match=name):
        collage.partition(mod, **kwargs(mod))  # default estimator: no worker may start before the check
    assert time.monotonic() - start < 2.0
    assert tvm.ir.structural_equal(mod, before)


def test_an_ill_typed_module_is_a_type_error_naming_mod():
    mod = ill_typed()
    before = snapshot(mod)
    start = time.monotonic()
    with pytest.raises(TypeError, match="mod does not type-check"):
        collage.partition(mod)
    with pytest.raises(TypeError, match="mod must be a tvm.IRModule"):
        collage.partition(mod["main"])
    assert time.monotonic() - start < 2.0
    assert tvm.ir.structural_equal(mod, before)


def test_build_checks_its_own_arguments_before_the_search():
    mod = elementwise_net()
    start = time.monotonic()
    for error, name, kwargs in [(ValueError, "target", dict(target="no-such-target")),
                                (ValueError, "executor", dict(executor="aot")),
                                (FileNotFoundError, "tuning_log", dict(tuning_log="/no/such.log"))]:
        with pytest.raises(error, match=name):
            collage.build(mod, None, "tvm", **kwargs)
        with pytest.raises(error, match=name):
            collage.build_partitioned(mod, **kwargs)
    with pytest.raises(TypeError, match="params"):
        collage.build_partitioned(mod, params=[1])
    assert time.monotonic() - start < 2.0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")
def test_workers_die_with_their_parent():
    import signal
    import subprocess

    code = ("import sys; from tvm_tcutils.collage.cost.workers import WorkerPool\n"
            "pool = WorkerPool(1, 60.0); pool.run([])\n"  # starts the worker, runs nothing
            "print(pool._workers[0].process.pid, flush=True); sys.stdin.read()")
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        worker = int(parent.stdout.readline())
        deadline = time.monotonic() + 60
        while "worker_entry" not in open(f"/proc/{worker}/cmdline").read() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # past die_with_parent, the first line of worker_entry
    finally:
        parent.send_signal(signal.SIGKILL)  # no cleanup runs: only the kernel can end the worker
        parent.wait()
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(worker)


def test_heavy_tasks_take_turns_and_tell_the_pool_while_they_wait(tmp_path, monkeypatch):
    import fcntl
    import threading

    from tvm_tcutils.collage.cost import workers

    np.save(tmp_path / "c0.npy", np.zeros(1024, "float32"))
    np.save(tmp_path / "c1.npy", np.zeros(8, "float32"))
    heavy, light = [f'"{PREFIX}0" "{PREFIX}1"'], [f'"{PREFIX}1"']
    assert workers.shared_bytes(heavy, str(tmp_path)) == sum(os.path.getsize(tmp_path / f"c{n}.npy") for n in (0, 1))
    beats = []
    monkeypatch.setattr(workers, "_alive", lambda: beats.append(time.monotonic()))
    monkeypatch.setattr(workers, "WAIT_BEAT", 0.05)
    events = []

    def task(texts, name):
        with workers.heavy_turn(texts, str(tmp_path), limit=2048):
            events.append(name)

    with open(tmp_path / "heavy.lock", "a") as other:  # another worker's heavy task holds the turn
        fcntl.flock(other, fcntl.LOCK_EX)
        waiting = threading.Thread(target=task, args=(heavy, "heavy"))
        waiting.start()
        task(light, "light")  # under the limit: runs at once
        time.sleep(0.3)
        assert events == ["light"] and len(beats) >= 3  # still waiting, restarting its clock
        fcntl.flock(other, fcntl.LOCK_UN)
        waiting.join(5)
    assert events == ["light", "heavy"]


def test_task_bytes_count_computed_tensors_without_reading_the_weights(tmp_path):
    from tvm_tcutils.collage.cost import workers

    mod = weighted_net()  # x (16, 64) -> dense -> add -> tanh: three (16, 64) float32 results
    consts = [mod["main"].body.args[0].args[0].args[1], mod["main"].body.args[0].args[1]]
    shelf = SharedConstants(consts, directory=str(tmp_path))
    text = shelf.dumps(mod)
    computed = 3 * 16 * 64 * 4
    assert workers.computed_bytes([text]) == computed  # typed from the placeholders: no file is read
    weights = sum(os.path.getsize(tmp_path / f"c{n}.npy") for n in (0, 1))
    assert workers.task_bytes([text], str(tmp_path)) == weights + computed
    events = []
    # Light in weights, heavy by what it computes: it waits for the turn another worker holds.
    import fcntl
    import threading
    with open(tmp_path / "heavy.lock", "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)

        def task():
            with workers.heavy_turn([text], str(tmp_path), limit=weights + 1):
                events.append("ran")

        waiting = threading.Thread(target=task)
        waiting.start()
        time.sleep(0.3)
        assert events == []
        fcntl.flock(other, fcntl.LOCK_UN)
        waiting.join(5)
    assert events == ["ran"]


def test_timer_keeps_one_copy_of_the_weights_and_a_saved_library_still_runs(tmp_path):
    import gc

    from tvm.contrib import graph_executor

    from tvm_tcutils.measure import Timer, build, outputs

    mod = weighted_net(size=256)
    data = {"x": np.random.default_rng(1).standard_normal((16, 256)).astype("float32")}
    with tvm.transform.PassContext(opt_level=3):
        expected = relay.create_executor("graph", mod=mod, target="llvm").evaluate()(**data).numpy()
    timer = Timer(mod, None, "llvm", repeat=1, warmup=1, inputs=data)
    assert not hasattr(timer, "lib")  # the factory and its copy of the parameters are gone
    gc.collect()
    timer.runner.run()
    np.testing.assert_allclose(timer.outputs()[0], expected, rtol=1e-5, atol=1e-5)
    timer.close()
    # A library given to the timer stays the caller's: it still exports, and the saved module runs.
    lib = build(mod, None, "llvm")
    Timer(mod, None, "llvm", repeat=1, warmup=1, lib=lib, inputs=data).close()
    path = str(tmp_path / "saved.so")
    lib.export_library(path)
    runner = graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))
    runner.set_input(**data)
    runner.run()
    np.testing.assert_allclose(outputs(runner)[0], expected, rtol=1e-5, atol=1e-5)

