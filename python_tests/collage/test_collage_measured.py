"""Measured costs: worker processes, crashes and hangs, the on-disk cache, the log."""
from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.contrib import graph_executor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collage_test_codegen as test_codegen  # noqa: E402

from tvm_tcutils.collage import partition  # noqa: E402
from tvm_tcutils import measure, processes  # noqa: E402
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator  # noqa: E402
from tvm_tcutils.collage.cost.store import CostStore  # noqa: E402
from tvm_tcutils.collage.cost.workers import WorkerPool  # noqa: E402

from test_collage_driver import elementwise_net  # noqa: E402


def two_layer_net(seed: int = 0):
    x = relay.var("x", shape=(8, 16))
    w = relay.const(np.random.default_rng(seed).standard_normal((16, 16)).astype("float32"))
    y = relay.nn.relu(relay.nn.dense(x, w))
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(y))))


@pytest.fixture
def quick_whole_samples(monkeypatch):
    """Whole-model samples of 10 runs of at least 1 ms each instead of 20 ms: a sample of these tiny modules
    takes a few ms instead of 0.2 s. For the tests of which process builds, keeps and times a module (and how
    failures end): what they check does not depend on how long a sample times, only that it gives a time."""
    from tvm_tcutils.collage.cost import workers

    monkeypatch.setattr(workers, "WHOLE_MODEL_MIN_REPEAT_MS", 1)


class _Measured(NamedTuple):
    cache: str       # the cache folder (read-only: a test that measures into it copies it first)
    log: str         # the estimator's measurement log
    stats: dict      # the estimator's counts after the search
    settings: tuple  # its settings (the target first)
    result: object   # the search's result


@pytest.fixture(scope="module")
def measured_two_layer(tmp_path_factory) -> _Measured:
    """One measured search of ``two_layer_net(0)`` with TVM alone into an empty cache (a worker's start and
    every candidate measured): the first search of the cache tests below, done once for them. Not validated
    (``validate_rounds=0``, as the cached searches that follow): these tests check the candidates' costs and
    their cache, and a validation would build and time the answer whole in a process of its own each time
    (the validation of measured searches is checked in test_collage_original.py, test_collage_memory.py,
    the tests below on IsolatedSampler and the CLI's)."""
    folder = tmp_path_factory.mktemp("measured")
    log = folder / "measure.log"
    est = MeasuredCostEstimator(cache_dir=str(folder), repeat=3, log_file=str(log), progress=False)
    try:
        first = partition(two_layer_net(0), None, "tvm", est, validate_rounds=0)
    finally:
        est.close()
    return _Measured(str(folder), str(log), dict(est.stats), tuple(est.settings), first)


def _cache_copy(measured: _Measured, tmp_path) -> str:
    folder = tmp_path / "cache"
    shutil.copytree(measured.cache, folder, ignore=shutil.ignore_patterns("measure.log"))
    return str(folder)


def test_measures_once_then_reuses_the_cache(measured_two_layer, tmp_path):
    tmp_path = Path(_cache_copy(measured_two_layer, tmp_path))
    log = Path(measured_two_layer.log)
    first, stats = measured_two_layer.result, measured_two_layer.stats
    assert stats["measured"] > 0 and stats["failed"] == 0
    assert math.isfinite(first.estimated_ms) and first.estimated_ms > 0
    lines = log.read_text().splitlines()
    assert len(lines) == stats["measured"] and any("nn.dense" in line for line in lines)
    entries = [json.loads(line) for line in (tmp_path / "costs.jsonl").read_text().splitlines()]
    assert all(e["toolchain"] == "tvm" and e["ms"] > 0 for e in entries)

    # Another model with the same structure but other weights: everything comes from the cache.
    again = MeasuredCostEstimator(cache_dir=str(tmp_path), progress=False)
    second = partition(two_layer_net(1), None, "tvm", again, validate_rounds=0)  # as the first search
    assert again.stats == {"cached": again.stats["cached"], "measured": 0, "failed": 0}
    assert again.stats["cached"] > 0
    assert second.estimated_ms == pytest.approx(first.estimated_ms)


def test_costs_are_taken_for_the_host_cpu_and_cached_per_target(measured_two_layer, tmp_path):
    import tvm_tcutils

    tmp_path = _cache_copy(measured_two_layer, tmp_path)
    est = measured_two_layer  # the first search, into an empty cache
    # Plain "llvm" is baseline SSE2 code, several times slower than what ORT/BLAS get on this CPU.
    cpu = tvm.target.codegen.llvm_get_system_cpu()
    assert est.settings[0] == tvm_tcutils.host_target()
    assert est.settings[0].startswith(f"llvm -mcpu={cpu}")
    assert est.stats["measured"] > 0

    same = MeasuredCostEstimator(cache_dir=str(tmp_path), progress=False)
    # One worker: what is checked is the cache key per target (a worker's start less than the default pool).
    other = MeasuredCostEstimator(cache_dir=str(tmp_path), progress=False, target="llvm", workers=1)
    try:
        # Not validated (the costs and their cache key are checked, not a whole-model timing).
        partition(two_layer_net(0), None, "tvm", same, validate_rounds=0)
        partition(two_layer_net(0), None, "tvm", other, validate_rounds=0)
    finally:
        same.close()
        other.close()
    assert same.stats["measured"] == 0
    # A cost measured for another target is not reused.
    assert other.stats["measured"] == est.stats["measured"] and other.stats["cached"] == 0


def test_crashing_and_hanging_toolchains_cost_infinity(tmp_path, caplog):
    crash = test_codegen.toolchain("tcutils_test_abort", combine=False, ops=["tanh"])
    hang = test_codegen.toolchain("tcutils_test_hang", combine=False, ops=["exp"])
    # Each hung candidate costs the whole timeout: 3 s is still ten times what building and timing one of
    # these elementwise candidates takes (a normal one timing out would show up in the failed set below).
    est = MeasuredCostEstimator(cache_dir=str(tmp_path), repeat=2, timeout=3, progress=False,
                                worker_imports=["collage_test_codegen"])
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.collage"):
        try:
            # validate_rounds=0: the costs are the point here, not timing the finalists whole.
            result = partition(elementwise_net(), None, ["tvm", crash, hang, test_codegen.toolchain()], est,
                               validate_rounds=0)
        finally:
            est.close()
    assert {p.toolchain for p in result.partitions} <= {"tvm", "tcutils_test"}
    assert math.isfinite(result.estimated_ms)
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "killed by signal 6" in messages  # SIGABRT: the worker died, not the search
    assert "timed out" in messages
    cache = CostStore(str(tmp_path))
    failed = [e for e in cache.entries.values() if e["ms"] is None]
    assert {e["toolchain"] for e in failed} == {"tcutils_test_abort", "tcutils_test_hang"}
    assert all(e["error"] for e in failed)


def test_worker_pool_and_estimator_arguments():
    with pytest.raises(ValueError, match="workers must be at least 1"):
        WorkerPool(0)
    with pytest.raises(ValueError, match="timeout must be positive"):
        WorkerPool(1, 0)
    with pytest.raises(ValueError, match="repeat must be an int >= 1"):
        MeasuredCostEstimator(cache_dir="", repeat=0)
    bad = [(TypeError, "workers", dict(workers=1.5)), (ValueError, "timeout", dict(timeout=-1)),
           (TypeError, "warmup", dict(warmup="2")), (ValueError, "target", dict(target="no-such-target")),
           (TypeError, "worker_imports", dict(worker_imports="collage_test_codegen")),
           (FileNotFoundError, "tuning_log", dict(tuning_log="/no/such.log"))]
    for error, name, kwargs in bad:
        with pytest.raises(error, match=name):
            MeasuredCostEstimator(cache_dir="", **kwargs)
    with pytest.raises(ValueError, match="cpus_each must be 0 .* got 1000"):
        WorkerPool(1, 60.0, cpus_each=1000)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to pin two workers apart")
@pytest.mark.parametrize("recycle", [False, True], ids=["kept", "recycled"])
def test_workers_measuring_side_by_side_are_pinned_to_disjoint_cores(recycle, caplog):
    from tvm_tcutils.collage.cost.workers import WORKER_CPUS_ENV

    x = relay.var("x", shape=(64,))
    text = tvm.ir.save_json(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    task = ("candidate", dict(mod_json=text, target="llvm", repeat=1, warmup=0, min_repeat_ms=1))
    # recycled: every worker is replaced after each task (as one grown past RECYCLE_BYTES by large
    # models' builds is); its successor must take its core, not share the other worker's.
    pool = WorkerPool(2, 120.0, cpus_each=1, **({"recycle_bytes": 1} if recycle else {}))
    try:
        # One task each: whichever worker ends first, one of the two successors got no core of its own before.
        results = pool.run([task, task])
        assert all(r["ms"] > 0 for r in results)
        assert pool.recycled == (2 if recycle else 0)
        # Each worker pinned itself to the one CPU it was given; TVM's binding is off in both (otherwise
        # each TVM pins its thread to the same first core, and the two time on one core).
        pinned = [os.sched_getaffinity(worker.process.pid) for worker in pool._workers]
        assert all(len(cpus) == 1 for cpus in pinned) and pinned[0] != pinned[1], pinned
        assert all(worker.cpus and set(worker.cpus) == cpus for worker, cpus in zip(pool._workers, pinned))
        # A worker past the CPUs there are (a pool grown beyond them) is told, not silently left on shared cores.
        with caplog.at_level(logging.WARNING, logger="tvm_tcutils.collage"):
            extra = pool._spawn()
        extra.stop(kill=True)
        assert "only 0 free CPU(s)" in caplog.text and not extra.cpus
    finally:
        pool.close()
    assert WORKER_CPUS_ENV not in os.environ


def test_the_default_pool_fits_the_timing_threads_in_the_cpus(monkeypatch):
    from tvm_tcutils.collage.cost import measured as measured_module
    from tvm_tcutils.processes import given_cpus

    cpus = len(given_cpus())
    monkeypatch.setenv("TVM_TCUTILS_ORT_THREADS", str(cpus))  # one runtime takes every CPU: one worker
    assert measured_module.auto_workers() == (1, 0)
    monkeypatch.setenv("TVM_TCUTILS_ORT_THREADS", "1")
    monkeypatch.setenv("TVM_TCUTILS_OPENVINO_THREADS", "1")
    monkeypatch.setattr(measured_module, "pool_size", lambda: 1)
    workers, each = measured_module.auto_workers()
    assert workers == max(1, min(measured_module.AUTO_WORKERS_MAX, cpus)) and each == (1 if workers > 1 else 0)
    est = MeasuredCostEstimator(cache_dir="")
    try:
        assert est.pool.size == workers and est.pool.cpus_each == each
        assert MeasuredCostEstimator(cache_dir="", workers=1).pool.cpus_each == 0
    finally:
        est.close()


def concat_net():
    """Two branches concatenated: the enumerated candidates include a lone
    ``concatenate`` whose tuple input is built outside it (a tuple-typed parameter)."""
    x = relay.var("x", shape=(1, 4, 6, 6))
    left, right = relay.nn.relu(x), relay.exp(x)
    y = relay.concatenate([left, right], axis=1)
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.sigmoid(y))))


@pytest.mark.parametrize("model", ["squeezenet", "encoder", "concat"])
def test_keys_are_equal_exactly_for_equal_stand_alone_functions(model):
    # Keys come from local signatures, without extracting: they must never merge two candidates
    # whose stand-alone functions differ, nor split two that are equal.
    from tvm_tcutils.collage.candidates import enumerate_candidates
    from tvm_tcutils.collage.cost.base import CostRequest
    from tvm_tcutils.collage.driver import prepare
    from tvm_tcutils.collage.outline import extract
    from tvm_tcutils.collage.subgraph import IndexedGraph
    from tvm_tcutils.collage.toolchains import resolve
    from tvm_tcutils.models import load_model

    from tvm_tcutils.bench.collage import mock_toolchains
    from tvm_tcutils.bench.models import encoder

    if model == "squeezenet":
        mod = prepare(*load_model("squeezenet1.0"))
    else:
        mod = prepare(encoder(1, hidden=32, heads=2, seq=8) if model == "encoder" else concat_net())
    toolchains = resolve(mock_toolchains())
    graph = IndexedGraph(mod["main"])
    by_name = {tc.name: tc for tc in toolchains}
    requests = [CostRequest(graph, c, by_name[c.toolchain]) for c in enumerate_candidates(graph, toolchains)
                if not c.host]
    keys = [r.key for r in requests]
    functions = [extract(graph, r.candidate.mask, r.candidate.composites, constants_as_params=True)[0]
                 for r in requests]
    first = {}
    for key, req, func in zip(keys, requests, functions):
        # Equal keys: the same toolchain and structurally equal stand-alone functions.
        toolchain, seen = first.setdefault(key, (req.toolchain.name, func))
        assert toolchain == req.toolchain.name and tvm.ir.structural_equal(seen, func, map_free_vars=True)
    # Different keys: different toolchains or functions (no split of what could share a measurement).
    groups = {}
    for toolchain, func in first.values():
        groups.setdefault((toolchain, int(tvm.ir.structural_hash(func, map_free_vars=True))), []).append(func)
    assert all(len(group) == 1 for group in groups.values())
    if model != "concat":  # the concat net has no repeated subgraph
        assert len(first) < len(requests)


def test_models_with_concatenate_are_measured(tmp_path):
    est = MeasuredCostEstimator(cache_dir=str(tmp_path), repeat=2, progress=False, workers=1)
    try:
        result = partition(concat_net(), None, "tvm", est, validate_rounds=0)
    finally:
        est.close()
    # The lone concatenate (tuple built outside it) is built and timed too, nothing fails.
    assert math.isfinite(result.estimated_ms) and est.stats["measured"] > 0 and est.stats["failed"] == 0


def _dense_tuning_log(mod, path, target):
    """A one-record AutoTVM log for the model's dense task (no measurement: config 0 of its space)."""
    import time

    from tvm import autotvm

    [task] = [t for t in autotvm.task.extract_from_program(mod["main"], target=target, params={})
              if "dense" in t.name][:1]
    record = autotvm.record.encode(
        autotvm.MeasureInput(task.target, task, task.config_space.get(0)),
        autotvm.MeasureResult((1e-4,), 0, 0.1, time.time()))
    path.write_text(record + "\n")
    return str(path)


def test_tuning_log_reaches_every_tvm_build_and_the_cache_key(measured_two_layer, tmp_path):
    import tvm_tcutils
    from tvm_tcutils.collage.driver import build_partitioned

    target = tvm_tcutils.host_target()
    mod = two_layer_net(0)
    log = _dense_tuning_log(mod, tmp_path / "tuned.log", target)
    # The cache holds the untuned costs of this model (the shared first search, with TVM alone).
    plain = measured_two_layer
    tuned = MeasuredCostEstimator(cache_dir=_cache_copy(plain, tmp_path), repeat=2, progress=False, tuning_log=log,
                                  workers=1)  # one worker: the log's way into the builds is checked, not the pool
    try:
        # Not validated, as the shared first search: the whole-model timer's use of the log is checked below
        # (a log gone missing fails it), the candidates' here.
        result = partition(mod, None, "tvm", tuned, validate_rounds=0)
    finally:
        tuned.close()
    # Costs taken under a tuning log are not those of untuned TVM.
    assert tuned.stats["measured"] == plain.stats["measured"] > 0 and tuned.stats["cached"] == 0
    assert math.isfinite(result.estimated_ms)

    x = np.random.default_rng(0).standard_normal((8, 16)).astype("float32")
    outputs = []
    for tuning_log in (None, log):
        runner = graph_executor.GraphModule(
            build_partitioned(result.mod, tuning_log=tuning_log)["default"](tvm.cpu()))
        runner.set_input(x=x)
        runner.run()
        outputs.append(runner.get_output(0).numpy())
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=1e-5)

    # The log really is read by the measuring workers and by the build: one gone missing fails both.
    gone = tmp_path / "gone.log"
    gone.write_text((tmp_path / "tuned.log").read_text())
    broken = MeasuredCostEstimator(cache_dir="", repeat=2, progress=False, tuning_log=str(gone))
    gone.unlink()
    try:
        assert not math.isfinite(broken.whole_model_timer().time(mod))
    finally:
        broken.close()
    with pytest.raises(FileNotFoundError):
        build_partitioned(result.mod, tuning_log=str(gone))
    with pytest.raises(FileNotFoundError, match="tuning_log"):
        MeasuredCostEstimator(cache_dir="", tuning_log=str(tmp_path / "missing.log"))


def test_whole_models_are_timed_side_by_side_and_build_failures_isolated(quick_whole_samples):
    good = two_layer_net(0)
    # A dynamically shaped module: the graph executor cannot build it (an error, not a crash).
    x = relay.var("x", shape=(relay.Any(), 16))
    bad = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    est = MeasuredCostEstimator(cache_dir="", repeat=2, progress=False)
    try:
        times = est.whole_model_timer().time_side_by_side([good, bad, good], rounds=2)
    finally:
        est.close()
    assert len(times) == 3 and math.isfinite(times[0]) and math.isfinite(times[2]) and times[1] == math.inf


def _conv_module(kernel: int = 1, channels: int = 64, size: int = 56, explicit_transform: bool = False):
    x = relay.var("x", shape=(1, channels, size, size))
    w = relay.const(np.random.default_rng(0).standard_normal((channels, channels, kernel, kernel)).astype("float32"))
    y = relay.nn.relu(relay.nn.conv2d(x, w, padding=(kernel // 2,) * 2, channels=channels,
                                      kernel_size=(kernel, kernel)))
    if explicit_transform:
        y = relay.layout_transform(y, "NCHW", "NCHW16c")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))


def test_boundary_layout_nodes_are_the_transforms_around_a_conv_built_alone():
    import tvm_tcutils
    from tvm_tcutils.measure import boundary_layout_nodes

    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_conv_module(), target=tvm_tcutils.host_target())
    graph = json.loads(lib.get_graph_json())
    found = boundary_layout_nodes(lib.get_graph_json(), ["x"])
    names = [graph["nodes"][k]["attrs"]["func_name"] for k in found]
    assert len(found) == 2 and all("layout_transform" in n for n in names)
    convs = [n for n in graph["nodes"] if "conv2d" in n.get("attrs", {}).get("func_name", "")]
    assert len(convs) == 1
    # Without the input's name, only the output's transform is at the boundary.
    assert boundary_layout_nodes(lib.get_graph_json(), []) == [k for k in found if [k, 0, 0] in graph["heads"]]


def test_tvm_candidates_are_timed_without_their_boundary_transforms():
    import tvm_tcutils
    from tvm_tcutils.collage.cost.workers import time_candidate

    target = tvm_tcutils.host_target()
    # A 1x1 conv with few channels does little work next to the two transforms around it (a quarter to
    # two thirds of its time, by CPU: less where float convs are slow, as on AVX2); alternate the two
    # timings so drift hits both, and compare the fastest of each: the other test worker's processes, on
    # either CPU, slow some turns down (inner medians above whole ones seen, 20 ms samples at 32
    # channels on a Zen 3 were 0.27-0.39 ms whole and 0.19-0.41 inner).
    text = tvm.ir.save_json(_conv_module(channels=16))
    whole, inner = [], []
    for _ in range(4):
        whole.append(time_candidate(text, target, 5, 1, 20, None, True))
        inner.append(time_candidate(text, target, 5, 1, 20, None, False))
    # What was left out is reported: two transforms' bytes, the same each turn, and their time.
    assert all("boundary_ms" not in w for w in whole)
    assert len({i["boundary_kb"] for i in inner}) == 1 and inner[0]["boundary_kb"] > 0
    assert all(i["boundary_ms"] > 0 for i in inner)
    whole, inner = [w["ms"] for w in whole], [i["ms"] for i in inner]
    # The floor only says the conv was timed at all: a CI run (the other worker idle in that turn only) had
    # the fastest inner turn at 0.093x the fastest whole one (17 against 184 us).
    assert 0.03 * min(whole) <= min(inner) < 0.9 * min(whole), (whole, inner)


def test_modules_with_their_own_layout_transforms_are_timed_whole(monkeypatch):
    import tvm_tcutils

    # Its kernels include boundary transforms, but the model itself asked for one: nothing is discounted,
    # so the debug executor is never created.
    own = _conv_module(explicit_transform=True)
    assert measure._has_layout_transform(own) and not measure._has_layout_transform(_conv_module())
    looked_up = []
    original = measure.boundary_layout_nodes
    monkeypatch.setattr(measure, "boundary_layout_nodes", lambda *a: looked_up.append(1) or original(*a))
    target = tvm_tcutils.host_target()
    assert measure.Timer(own, None, target, 2, 1, 1, boundary_layout=False).sample() > 0
    assert not looked_up
    assert measure.Timer(_conv_module(), None, target, 2, 1, 1, boundary_layout=False).sample() > 0
    assert looked_up


def test_only_tvm_candidates_are_discounted(monkeypatch):
    est = MeasuredCostEstimator(cache_dir="", repeat=2, progress=False)
    flags = {}

    def fake_run(tasks, on_result=None, timeout=None):
        for k, (kind, task) in enumerate(tasks):
            module = tvm.ir.load_json(task["mod_json"])
            external = any("Compiler" in (f.attrs or {}) for f in module.functions.values())
            flags.setdefault(external, set()).add(task["boundary_layout"])
            on_result(k, {"ms": 1.0})

    monkeypatch.setattr(est.pool, "run", fake_run)
    partition(elementwise_net(), None, ["tvm", test_codegen.toolchain()], est, validate_rounds=0)
    # TVM candidates keep boundary_layout False (discounted), external ones True (timed whole).
    assert flags == {False: {False}, True: {True}}


def test_cache_tags_are_computed_once_per_toolchain_and_keys_do_not_change(monkeypatch):
    from tvm_tcutils.collage.cost.base import CostRequest, cost_requests
    from tvm_tcutils.collage.cost.custom import CustomCostEstimator
    from tvm_tcutils.collage.toolchains.base import Toolchain

    seen, calls = [], []
    original = Toolchain.cache_tag
    monkeypatch.setattr(Toolchain, "cache_tag", lambda self: calls.append(self.name) or original(self))

    class Keys(CustomCostEstimator):
        def estimate(self, requests):
            seen.extend(requests)
            return [1.0] * len(requests)

    partition(elementwise_net(), None, ["tvm", test_codegen.toolchain()], Keys(lambda m, t: 1.0),
              validate_rounds=0, compare_single=False)
    assert len(seen) > 4 and sorted(set(calls)) == ["tcutils_test", "tvm"] and len(calls) == 2
    keys = [r.key for r in seen]
    assert keys == [CostRequest(r.graph, r.candidate, r.toolchain).key for r in seen]  # untagged: same keys
    assert cost_requests(None, [], [], {}) == []


def test_tvm_costs_measured_with_tiles_off_are_not_reused_with_them_on(monkeypatch):
    from tvm_tcutils.collage import toolchains
    from tvm_tcutils.collage.toolchains.base import TILES_ENV
    from tvm_tcutils.dotprod import amx

    assert TILES_ENV == amx.ENV  # named twice (capabilities do not import each other): the same variable

    tvm_chain, ort_chain = toolchains.known()["tvm"], toolchains.known()["ort"]
    monkeypatch.delenv(amx.ENV, raising=False)
    on = tvm_chain.cache_tag(), ort_chain.cache_tag()
    monkeypatch.setenv(amx.ENV, "0")
    off = tvm_chain.cache_tag(), ort_chain.cache_tag()
    assert on[0] != off[0] and f"{amx.ENV}=0" in off[0]
    assert on[1] == off[1]  # onnxruntime runs what it runs, whatever the package's kernels


def test_a_bug_in_the_worker_stops_the_run_instead_of_costing_inf():
    from tvm_tcutils.collage.cost.workers import WorkerError

    pool = WorkerPool(1, 60.0)
    try:
        # A TypeError (a wrong argument) is a bug, not a failed build: it must not become an infinite cost.
        with pytest.raises(WorkerError, match="TypeError"):
            pool.run([("candidate", {"no_such_argument": 1})])
        [failed] = pool.run([("candidate", dict(mod_json="{", target="llvm", repeat=1, warmup=0,
                                                min_repeat_ms=0))])
    finally:
        pool.close()
    assert failed["ms"] == math.inf and failed["error"]


def test_an_isolated_module_that_fails_to_build_or_dies_raises_runtime_error():
    from tvm_tcutils.collage.cost.workers import IsolatedModule

    x = relay.var("x", shape=(relay.Any(), 16))  # the graph executor cannot build it (an error, not a crash)
    dynamic = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    with pytest.raises(RuntimeError, match="could not be built in its own process"):
        IsolatedModule(tvm.ir.save_json(dynamic), "llvm", repeat=2, warmup=0, min_repeat_ms=1).build()
    good = IsolatedModule(tvm.ir.save_json(two_layer_net(0)), "llvm", repeat=2, warmup=0, min_repeat_ms=1).build()
    try:
        assert good.sample() > 0
        os.kill(good.pid, 9)
        with pytest.raises(RuntimeError, match="failed in its own process"):
            good.sample()
    finally:
        good.close()


def test_an_isolated_module_is_stopped_between_its_samples_and_ends_when_closed():
    # A contender's runtime threads spin after a run; stopped, they take no core from the one being timed.
    from tvm_tcutils.collage.cost.workers import IsolatedModule

    def state() -> str:
        with open(f"/proc/{isolated.pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0]

    isolated = IsolatedModule(tvm.ir.save_json(two_layer_net(0)), "llvm", repeat=2, warmup=0, min_repeat_ms=1)
    try:
        assert state() != "T"  # building needs it running
        isolated.build()
        assert state() == "T"
        assert isolated.sample() > 0 and state() == "T"
        assert isolated.sample() > 0 and state() == "T"
    finally:
        started = time.monotonic()
        isolated.close()
    assert time.monotonic() - started < 5  # a stopped worker is let run to end as asked, not killed at a timeout
    assert not os.path.exists(f"/proc/{isolated.pid}/stat") or state() in ("Z", "X")


def test_isolated_builds_at_once_keep_their_workers_after_the_building_threads_end(monkeypatch, quick_whole_samples):
    # A worker dies with the thread that started it (PR_SET_PDEATHSIG): build_all starts them all in the
    # caller's thread, and only waits for the builds in its threads. Started in those threads, every worker
    # died when the builds ended (BERT-base: "killed by signal 9", then broken pipes).
    from tvm_tcutils.collage.cost.workers import IsolatedSampler

    monkeypatch.setattr(IsolatedSampler, "build_workers", 2)
    modules = {name: two_layer_net(seed) for seed, name in enumerate(["a", "b", "c"])}
    built = IsolatedSampler("llvm", repeat=2, warmup=1).build_all(modules)
    assert list(built) == ["a", "b", "c"]
    assert all(sample() > 0 and sample() > 0 for sample in built.values())


def _recording_sampler(monkeypatch):
    """``(an IsolatedSampler, the list of every IsolatedModule it starts, in order)``."""
    from tvm_tcutils.collage.cost import workers

    started = []

    class Recorded(workers.IsolatedModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self)

    monkeypatch.setattr(workers, "IsolatedModule", Recorded)
    return workers.IsolatedSampler("llvm", repeat=2, warmup=1), started


def test_validations_whole_builds_are_taken_by_the_comparison_not_built_again(monkeypatch, quick_whole_samples):
    # BERT-base takes a minute or more a whole build: validation's mix, kept after its timing, is the
    # comparison's contender as it is; a kept module the comparison does not time ends before its builds.
    sampler, started = _recording_sampler(monkeypatch)
    mix, other, dropped = two_layer_net(0), two_layer_net(1), two_layer_net(2)
    assert sampler.time(mix) > 0 and sampler.time(dropped) > 0
    assert sampler.time(mix) > 0 and len(started) == 2  # timed again in the worker it was built in
    kept_mix, kept_dropped = started
    built = sampler.build_all({"collage": mix, "tvm alone": other})
    assert len(started) == 3 and sampler.kept == {}
    assert built["collage"].__self__ is kept_mix and built["tvm alone"].__self__ is started[2]
    assert not kept_dropped.pool._workers  # ended: no contender of the comparison
    assert all(sample() > 0 for sample in built.values())
    # A module that cannot be built: inf, and nothing kept.
    assert sampler.time(_dynamic_module()) == math.inf and sampler.kept == {}
    sampler.close()


def _dynamic_module() -> tvm.IRModule:
    x = relay.var("x", shape=(relay.Any(), 16))  # the graph executor cannot build it
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))


# -m slow (CI time): how early builds start and are reused; the reuse itself runs by default
# (test_validations_whole_builds_are_taken_by_the_comparison_not_built_again).
@pytest.mark.slow
def test_the_comparisons_builds_start_early_and_are_taken_not_built_again(monkeypatch, quick_whole_samples):
    # BERT-base: the comparison's whole models (each toolchain alone, each runtime on the file) build on
    # the second core while validation builds its mixes; time() and build_all() wait for them.
    sampler, started = _recording_sampler(monkeypatch)
    alone, mix, dropped = two_layer_net(0), two_layer_net(1), two_layer_net(2)
    sampler.prebuild({"tvm alone": alone, "dropped": dropped, "broken": _dynamic_module()})
    sampler.prebuild({"tvm alone": alone})  # started already: not again
    assert len(started) == 3 and len(sampler.building) == 3
    assert sampler.time(alone) > 0 and len(started) == 3  # validation times the prebuilt one
    assert sampler.time(mix) > 0 and len(started) == 4
    built = sampler.build_all({"tvm alone": alone, "collage": mix, "broken": _dynamic_module()})
    assert len(started) == 4 and sampler.building == {} and sampler.kept == {}
    assert built["tvm alone"].__self__ is started[0] and built["collage"].__self__ is started[3]
    assert isinstance(built["broken"], RuntimeError) and "could not be built" in str(built["broken"])
    assert not started[1].pool._workers  # prebuilt, but no contender of the comparison: ended
    assert all(built[name]() > 0 for name in ("tvm alone", "collage"))
    for isolated in started:
        isolated.close()


# -m slow (CI time): how early builds start and are reused; the reuse itself runs by default
# (test_validations_whole_builds_are_taken_by_the_comparison_not_built_again).
@pytest.mark.slow
def test_a_prebuild_still_queued_is_built_beside_the_others_not_waited_for(monkeypatch, quick_whole_samples):
    # Validation may end (its re-searched mix not worth building) with rivals still queued behind those
    # prebuilding: the comparison builds those itself instead of waiting for a prebuilder to take them.
    import threading

    from tvm_tcutils.collage.cost import workers

    release, builders = threading.Event(), {}
    original = workers.IsolatedModule.build

    def build(self):
        builders.setdefault(id(self), threading.current_thread().name)
        if len(builders) <= 2:
            release.wait(30)  # the two prebuilders run until the comparison has started the others
        return original(self)

    monkeypatch.setattr(workers.IsolatedModule, "build", build)
    monkeypatch.setattr(workers.IsolatedSampler, "build_workers", 2)
    sampler = workers.IsolatedSampler("llvm", repeat=2, warmup=1)
    modules = {name: two_layer_net(seed) for seed, name in enumerate("abcd")}
    sampler.prebuild(modules)
    started = [isolated for isolated, _ in sampler.building.values()]
    threading.Timer(2.0, release.set).start()
    built = sampler.build_all(modules)
    assert [builders[id(isolated)].startswith("tcutils-prebuild") for isolated in started] == \
        [True, True, False, False]
    assert [built[name].__self__ for name in "abcd"] == started
    assert all(built[name]() > 0 for name in "abcd")
    for isolated in started:
        isolated.close()


def test_validation_times_a_module_with_the_builds_in_flight_stopped(monkeypatch, quick_whole_samples):
    # Built beside validation's timing, the comparison's rivals took BERT-base from 63 to 120-143 ms on
    # 2 vCPUs (read as the cost of crossing between toolchains): their workers stop while it times.
    import threading

    from tvm_tcutils.collage.cost import workers

    go, states = threading.Event(), []
    build, sample = workers.IsolatedModule.build, workers.IsolatedModule.sample

    def slow_build(self):
        if threading.current_thread().name.startswith("tcutils-prebuild"):
            go.wait(30)  # a build in flight until the timing below is done
        return build(self)

    def recorded_sample(self):
        states.append([processes._stat(p.pid).state for p in in_flight])
        return sample(self)

    monkeypatch.setattr(workers.IsolatedModule, "build", slow_build)
    monkeypatch.setattr(workers.IsolatedModule, "sample", recorded_sample)
    sampler = workers.IsolatedSampler("llvm", repeat=2, warmup=1)
    sampler.prebuild({"tvm alone": two_layer_net(0)})
    in_flight = [isolated._process for isolated, _ in sampler.building.values()]
    try:
        assert sampler.time(two_layer_net(1)) > 0
        assert states == [["T"]]  # stopped while the mix was timed
        assert processes._stat(in_flight[0].pid).state != "T"  # and let go on after
        go.set()
        built = sampler.build_all({"tvm alone": two_layer_net(0)})
        assert built["tvm alone"]() > 0
    finally:
        go.set()
        sampler.close()


def test_a_module_outlined_again_is_the_kept_one(quick_whole_samples):
    # Two outlines of one partitioning serialize their shared nodes in different orders: the comparison's
    # mix (BERT-base) did not match validation's by its JSON and was built a second time.
    from tvm_tcutils.collage.cost import workers

    x = relay.var("x", shape=(4,))
    w = np.ones(4, "float32")
    shared = relay.const(w)
    first = tvm.IRModule.from_expr(relay.Function([x], relay.add(relay.multiply(x, shared), shared)))
    again = tvm.IRModule.from_expr(relay.Function([x], relay.add(relay.multiply(x, relay.const(w)), relay.const(w))))
    assert tvm.ir.save_json(first) != tvm.ir.save_json(again)
    sampler = workers.IsolatedSampler("llvm", repeat=2, warmup=1)
    assert sampler.time(first) > 0
    [kept] = sampler.kept.values()
    built = sampler.build_all({"collage": again})
    assert built["collage"].__self__ is kept
    kept.close()


def test_closing_the_sampler_ends_the_builds_it_started():
    from tvm_tcutils.collage.cost import workers

    sampler = workers.IsolatedSampler("llvm", repeat=2, warmup=1)
    sampler.prebuild({"a": two_layer_net(0), "b": two_layer_net(1)})
    running = [isolated for isolated, _ in sampler.building.values()]
    sampler.close()
    assert sampler.building == {} and sampler._prebuilder is None
    assert all(not isolated.pool._workers for isolated in running)


def test_whole_models_get_a_longer_timeout_than_candidates():
    from tvm_tcutils.collage.cost.workers import WHOLE_MODEL_TIMEOUT_S, PooledWholeModelTimer, WorkerPool

    pool = WorkerPool(1, timeout=120.0)
    try:
        assert PooledWholeModelTimer(pool, "llvm").sampler.timeout == WHOLE_MODEL_TIMEOUT_S > 120.0
    finally:
        pool.close()
