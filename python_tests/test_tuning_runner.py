"""``tuning.tune``'s measuring side: the local runner's server knows the package, the GPU check, ``templates``."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay
from tvm.autotvm.measure.measure_methods import request_remote

from tvm_tcutils import cuda, host_target, load_model, registry
from tvm_tcutils.dotprod.quantize import quantize_int8
from tvm_tcutils.tuning import PackageLocalRunner, extract_tasks, tune


def _conv_then_dense():
    """A float conv net with a classifier: its int8 form has the package's conv2d task and dense tasks."""
    rng = np.random.default_rng(0)
    x = relay.var("data", shape=(1, 16, 8, 8))
    y = relay.nn.relu(relay.nn.conv2d(x, relay.const(rng.standard_normal((16, 16, 3, 3)).astype("float32") * 0.1),
                                      padding=(1, 1), channels=16, kernel_size=(3, 3)))
    y = relay.nn.batch_flatten(relay.nn.global_avg_pool2d(y))
    y = relay.nn.dense(y, relay.const(rng.standard_normal((32, 16)).astype("float32") * 0.1))
    return quantize_int8(tvm.IRModule.from_expr(relay.Function([x], y)), {})


def _package_function() -> str:
    """A packed function the package registers at import (stock TVM does not have it; a test may register
    others in this process only)."""
    from tvm_tcutils.dotprod.hooks import PREBUILD_FUNC

    assert PREBUILD_FUNC in {hook.name for hook in registry.registered() if hook.kind == "packed_func"}
    return PREBUILD_FUNC


def test_the_local_runner_server_imports_the_package(int8_mlp):
    # TVM's LocalRunner serves from a stock process: no package functions, and on a TVM built without CUDA
    # no cuda device API (the plugin's), so CUDA measurements could not even query the device.
    task = extract_tasks(int8_mlp, {}, host_target())[0]  # conftest's int8_mlp: the MLP quantized once
    runner = PackageLocalRunner(number=1)
    alive = runner.set_task(task)
    assert runner.host == "127.0.0.1" and len(alive) == 2
    remote = request_remote(runner.key, runner.host, runner.port)
    assert remote.get_function(_package_function()) is not None
    if cuda.status()["plugin"]:
        assert remote.get_function("device_api.cuda") is not None


@pytest.mark.skipif(cuda.status()["device"], reason="this machine has a GPU: the test is about having none")
def test_tuning_for_cuda_without_a_gpu_is_a_clear_error_before_any_work(tmp_path):
    log = tmp_path / "cuda.log"
    with pytest.raises(ValueError, match="cannot run CUDA kernels to measure them.*remote="):
        tune(load_model("mlp")[0], {}, "cuda -arch=sm_80", 4, str(log))
    assert not log.exists()


def test_templates_pick_the_tasks_tuned(tmp_path):
    mod = _conv_then_dense()
    names = {task.name for task in extract_tasks(mod, {}, host_target())}
    assert "tcutils.conv2d_nchw_dot" in names and len(names) >= 2, names
    seen = []
    # A spent budget measures nothing; on_task still says what each task was to get.
    tune(mod, {}, host_target(), 4, str(tmp_path / "t.log"), progress=False, time_budget_s=0,
         templates=["tcutils.conv2d_nchw_dot"], on_task=lambda index, total, task, todo: seen.append((task.name, todo)))
    assert {name for name, todo in seen if todo} == {"tcutils.conv2d_nchw_dot"}
    assert {name for name, todo in seen if not todo} == names - {"tcutils.conv2d_nchw_dot"}


@pytest.mark.parametrize("templates, error, match", [
    (["tcutils.no_such_template"], ValueError, "no task of the model uses tcutils.no_such_template.*tcutils.dense_dot"),
    ("tcutils.dense_dot", TypeError, "templates must be a list"),
    ([3], TypeError, "templates must be a list"),
])
def test_bad_templates(tmp_path, templates, error, match, int8_mlp):
    with pytest.raises(error, match=match):
        tune(int8_mlp, {}, host_target(), 4, str(tmp_path / "x.log"), templates=templates)


def test_tune_measures_with_the_package_runner(tmp_path, monkeypatch, int8_mlp):
    from tvm_tcutils import tuning

    made = []

    class Recording(PackageLocalRunner):
        def __init__(self, *args, **kwargs):
            made.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(tuning, "PackageLocalRunner", Recording)
    tune(int8_mlp, {}, host_target(), 4, str(tmp_path / "r.log"), progress=False,
         time_budget_s=0, measure_number=6)
    # On a CPU: one run a sample, its operands' caches flushed first, as a network's layer meets its weights.
    assert made == [{"number": 1, "repeat": 6, "min_repeat_ms": 0, "timeout": 20, "enable_cpu_cache_flush": True}]


def test_the_tuning_servers_cache_flush_takes_the_weights_alone(monkeypatch):
    # In the local runner's server process the flush AutoTVM names before each timed repeat goes to TVM's
    # own flush with the output and the weights only: the data stays cached, as a network's layer has it.
    import os

    from tvm_tcutils import processes, tuning

    name = "cache_flush_cpu_non_first_arg"
    original = tvm.get_global_func(name)
    calls = []
    tvm.register_func(name, lambda *args: calls.append([tuple(a.shape) for a in args]), override=True)
    monkeypatch.setattr(processes, "die_with_parent", lambda parent: None)
    try:
        tuning._TuningServerInit(os.getpid())()
        out, bias = tvm.nd.empty((1, 2, 3, 3, 16), "uint8"), tvm.nd.empty((2, 16), "int32")
        data, kernel = tvm.nd.empty((1, 2, 5, 5, 16), "uint8"), tvm.nd.empty((2, 2, 3, 3, 4, 16, 4), "int8")
        tvm.get_global_func(name)(out, bias, data, kernel)
    finally:
        tvm.register_func(name, original, override=True)
    assert calls == [[(1, 2, 3, 3, 16), (2, 2, 3, 3, 4, 16, 4)]]
