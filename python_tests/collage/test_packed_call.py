"""The packed-function bridge of the library-style toolchains (collage/toolchains/packed_call.py)."""
from __future__ import annotations

import base64

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.collage.toolchains import blas
from tvm_tcutils.collage.toolchains.packed_call import (
    PackedToolchain, _address, function_of, tensor_data, tensor_view,
)


def _product_function(m=3, k=5, n=4):
    a, b = relay.var("a", shape=(m, k)), relay.var("b", shape=(n, k))
    return function_of(relay.Function([a, b], relay.nn.dense(a, b)).with_attr("global_symbol", "mm"))


@pytest.mark.parametrize("dtype,shape", [("float32", (2, 3)), ("int8", (7,)), ("int64", (1, 2, 2)), ("float32", (0, 4))])
def test_tensor_view_shares_memory(dtype, shape):
    array = tvm.nd.array(np.arange(int(np.prod(shape))).astype(dtype).reshape(shape))
    view = tensor_view(_address(array))
    assert view.dtype == np.dtype(dtype) and view.shape == shape
    np.testing.assert_array_equal(view, array.numpy())
    if view.size:
        view.flat[-1] = 1
        assert array.numpy().flat[-1] == 1  # the same buffer, not a copy
        assert tensor_data(_address(array)) == view.ctypes.data


def test_registered_run_is_the_c_callback_and_reports_unknown_keys():
    run = tvm.get_global_func(blas.TOOLCHAIN.run_name)
    assert blas.TOOLCHAIN.run_function() is not blas.TOOLCHAIN.run  # ctypes FFI here: the raw callback
    a, out = tvm.nd.array(np.ones((2, 2), "float32")), tvm.nd.empty((2, 2))
    assert run("blas-never-loaded", a, out) == 1


def test_run_computes_after_load_from_python_and_compiled_code():
    blas.TOOLCHAIN.forget()  # payloads that earlier tests loaded in this process: the key below is this one's
    assert blas.TOOLCHAIN.cached() == 0
    func = _product_function()
    module = blas.TOOLCHAIN.build_module(func, blas._plan(func).to_bytes())
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")
    out = tvm.nd.empty((3, 4))
    module["mm"](tvm.nd.array(a), tvm.nd.array(b), out)  # compiled code: load, then run
    np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=1e-5, atol=1e-5)
    assert blas.TOOLCHAIN.cached() == 1
    key = next(k for k in blas.TOOLCHAIN._states if k.startswith("blas-"))
    again = tvm.nd.empty((3, 4))
    assert tvm.get_global_func(blas.TOOLCHAIN.run_name)(key, tvm.nd.array(a), tvm.nd.array(b), again) == 0
    np.testing.assert_allclose(again.numpy(), a @ b.T, rtol=1e-5, atol=1e-5)


def test_bad_arguments_are_errors_naming_them():
    run = tvm.get_global_func(blas.TOOLCHAIN.run_name)
    a = tvm.nd.array(np.ones((2, 2), "float32"))
    with pytest.raises(TypeError, match="argument 2 must be a tensor"):
        run("blas-key", a, 3)
    with pytest.raises(TypeError, match="first argument must be the payload key"):
        run(a, a)


def test_execute_errors_reach_the_caller_with_their_type():
    def failing(state, inputs, outputs):
        raise ValueError("toolchain failed on purpose")

    chain = PackedToolchain("tcutils_test_failing", lambda payload: type("S", (), {"num_inputs": 1})(), failing)
    chain.load("k", "")
    run = chain.run_function()
    x = tvm.nd.array(np.zeros(2, "float32"))
    with pytest.raises(ValueError, match="failed on purpose"):
        run("k", x, x)
    with pytest.raises(ValueError, match="0 tensors for a payload with 1 inputs"):
        run("k")
    assert chain.run("unknown", x) == 1  # the plain Python entry behaves the same


def test_callback_outlives_its_toolchain_object():
    # A compiled module keeps the function it looked up; the C thunk behind it must stay valid
    # when the toolchain object that made it is gone (importlib.reload makes new ones).
    import gc

    chain = PackedToolchain("tcutils_test_gone", lambda payload: None, lambda state, ins, outs: None)
    run = chain.run_function()
    del chain
    gc.collect()
    assert run("never-loaded", tvm.nd.array(np.zeros(1, "float32"))) == 1


# --- parking TVM's pool workers during long toolchain calls (cmake/src/park.cc) ---------------


@pytest.fixture
def park_pool():
    from tvm_tcutils import native

    wrap = native.get("tvm_tcutils.native.park_pool")
    if wrap is None:
        pytest.skip("the native helpers are not built (scripts/build_native.sh)")
    return wrap, native.get("tvm_tcutils.native.parked_calls")


def _loaded_product(m=3, k=5, n=4):
    func = _product_function(m, k, n)
    payload = blas._plan(func).to_bytes()
    key = "blas-park-test"
    blas.TOOLCHAIN._states.pop(key, None)
    blas.TOOLCHAIN.load(key, base64.b64encode(payload).decode())
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((m, k)).astype("float32"), rng.standard_normal((n, k)).astype("float32")
    return key, a, b


@pytest.mark.parametrize("min_us,parked", [(0.0, 2), (1e12, 0)])
def test_parked_calls_compute_the_same_and_only_long_calls_park(park_pool, min_us, parked):
    wrap, parked_calls = park_pool
    key, a, b = _loaded_product()
    run = wrap(blas.TOOLCHAIN.run_function(park=False), min_us)
    before = parked_calls()
    for _ in range(3):  # the first call of a key is timed, never parked
        out = tvm.nd.empty((3, 4))
        assert run(key, tvm.nd.array(a), tvm.nd.array(b), out) == 0
        np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=1e-5, atol=1e-5)
    assert parked_calls() - before == parked


def test_errors_inside_a_parked_call_reach_the_caller_with_their_type(park_pool):
    wrap, parked_calls = park_pool
    calls = []

    def fails_second_time(state, inputs, outputs):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError("toolchain failed on purpose")

    chain = PackedToolchain("tcutils_test_park_failing", lambda payload: type("S", (), {"num_inputs": 1})(),
                            fails_second_time)
    chain.load("k", "")
    run = wrap(chain.run_function(park=False), 0.0)
    x = tvm.nd.array(np.zeros(2, "float32"))
    assert run("k", x, x) == 0
    before = parked_calls()
    with pytest.raises(ValueError, match="failed on purpose"):
        run("k", x, x)
    assert parked_calls() - before == 1
    assert run("k", x, x) == 0  # the pool is usable again after the error


_MIXED_MODEL = """
import numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
import tvm_tcutils
from tvm_tcutils import native
from tvm_tcutils.collage.toolchains import blas
x = relay.var("x", shape=(64, 256))
rng = np.random.default_rng(0)
y = x
for i in range(3):  # dense on BLAS, tanh and add on TVM: three crossings
    w = relay.const(rng.standard_normal((256, 256)).astype("float32") / 16)
    y = relay.tanh(relay.nn.dense(y, w)) + relay.const(0.5)
mod = blas.partition_for(tvm.IRModule.from_expr(relay.Function([x], y)))
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(mod, target="llvm")
run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
run.set_input("x", rng.standard_normal((64, 256)).astype("float32"))
counter = native.get("tvm_tcutils.native.parked_calls")
outs = []
for _ in range(4):
    run.run()
    outs.append(run.get_output(0).numpy())
np.save({path!r}, outs[-1])
print(counter() if counter else -1, all(np.array_equal(o, outs[0]) for o in outs))
"""


def test_compiled_mixed_model_gives_the_same_results_with_and_without_parking(park_pool, tmp_path):
    from conftest import run_python

    results = {}
    for setting in ("0", "off"):
        path = str(tmp_path / f"out_{setting}.npy")
        done = run_python(_MIXED_MODEL.format(path=path),
                          env={"TVM_TCUTILS_PARK_MIN_US": setting, "TVM_NUM_THREADS": "2"})
        assert done.returncode == 0, done.stderr[-2000:]
        count, stable = done.stdout.split()[-2:]
        assert stable == "True"
        results[setting] = (int(count), np.load(path))
    # Three BLAS calls in each of 4 runs, all parked: only each key's first call, which finds the
    # payload not loaded yet (it is loaded, then called again), runs unparked.
    assert results["0"][0] == 4 * 3
    assert results["off"][0] == 0
    np.testing.assert_array_equal(results["0"][1], results["off"][1])


def test_park_setting_is_checked_and_named_in_cache_keys(monkeypatch):
    from tvm_tcutils.collage.toolchains import packed_call

    monkeypatch.setenv("TVM_TCUTILS_PARK_MIN_US", "off")
    assert packed_call.park_min_us() is None and packed_call.parking() == "nopark"
    monkeypatch.setenv("TVM_TCUTILS_PARK_MIN_US", "150")
    assert packed_call.park_min_us() == 150.0
    from tvm_tcutils.collage import toolchains

    assert toolchains.known()["blas"].cache_tag().endswith("," + packed_call.parking())
    for bad in ("abc", "-1", "inf"):
        monkeypatch.setenv("TVM_TCUTILS_PARK_MIN_US", bad)
        with pytest.raises(ValueError, match="TVM_TCUTILS_PARK_MIN_US must be a number of microseconds"):
            packed_call.park_min_us()


# --------------------------------------------------------------------------
# The native plugin's partition module (cmake/src/packed_call.cc)
# --------------------------------------------------------------------------
def _native_maker():
    from tvm_tcutils.collage.toolchains.packed_call import native_module_maker

    maker = native_module_maker()
    if maker is None:
        pytest.skip("the native plugin is not built (scripts/build_native.sh)")
    return maker


def test_native_partition_module_runs_then_loads_with_the_lifted_weights_then_runs_again():
    # run(key, ins..., outs...) answers 1 for an unknown key: load(key, payload, lifted...) gets the last
    # inputs (the lifted weights, before the outputs), and run is called again with the same tensors.
    maker, calls, loaded = _native_maker(), [], set()

    def run(key, *tensors):
        calls.append(("run", key, [t.shape for t in tensors]))
        if key not in loaded:
            return 1
        tensors[-1].copyfrom(tensors[0].numpy() + tensors[1].numpy() + tensors[2].numpy())
        return 0

    def load(key, payload, *lifted):
        calls.append(("load", key, payload, [t.shape for t in lifted]))
        loaded.add(key)
        return 0

    tvm.register_func("tcutils_test.native.run", run, override=True)
    tvm.register_func("tcutils_test.native.load", load, override=True)
    module = maker("part", "tcutils_test.native.run", "tcutils_test.native.load", "k1", "cGF5bG9hZA==", 3, 2)
    assert module.type_key == "tcutils_packed_call"
    assert module["tcutils_packed_call_fields"]().split("\n") == [
        "part", "tcutils_test.native.run", "tcutils_test.native.load", "k1", "3", "2"]
    x, w1, w2 = (tvm.nd.array(np.full((2,), v, "float32")) for v in (1, 2, 4))
    out = tvm.nd.empty((2,))
    module["part"](x, w1, w2, out)
    np.testing.assert_array_equal(out.numpy(), [7, 7])
    assert [c[0] for c in calls] == ["run", "load", "run"]
    assert calls[1] == ("load", "k1", "cGF5bG9hZA==", [(2,), (2,)])  # the two lifted weights, not the output
    module["part"](x, w1, w2, out)
    assert [c[0] for c in calls] == ["run", "load", "run", "run"]  # loaded once


def test_native_partition_module_errors_name_what_is_wrong():
    maker = _native_maker()
    tvm.register_func("tcutils_test.native.never", lambda key, *tensors: 1, override=True)
    tvm.register_func("tcutils_test.native.noop_load", lambda key, payload, *lifted: 0, override=True)
    out = tvm.nd.empty((2,))
    refusing = maker("f", "tcutils_test.native.never", "tcutils_test.native.noop_load", "k2", "", 0, 0)
    with pytest.raises(tvm.TVMError, match="refused key k2 after loading it"):
        refusing["f"](out)
    missing = maker("g", "tcutils_test.native.not_registered", "tcutils_test.native.noop_load", "k3", "", 0, 0)
    with pytest.raises(tvm.TVMError, match="'tcutils_test.native.not_registered' is not registered"):
        missing["g"](out)
    assert missing.implements_function("g") and not missing.implements_function("other")
    with pytest.raises(tvm.TVMError, match="lifted <= inputs"):
        maker("h", "a", "b", "k", "", 1, 2)


@pytest.mark.parametrize("kind", ["native", "llvm"])
def test_partition_modules_of_both_kinds_compute_the_same_and_survive_export(kind, monkeypatch, tmp_path):
    from tvm.contrib import graph_executor

    from tvm_tcutils.collage.toolchains import ort

    if kind == "native":
        _native_maker()
    monkeypatch.setenv("TVM_TCUTILS_PACKED_CALL", kind)
    rng = np.random.default_rng(8)
    weight = rng.standard_normal((128, 256)).astype("float32")  # large: lifted out of the payload
    x = relay.var("data", shape=(2, 256))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(
        relay.Function([x], relay.nn.relu(relay.nn.dense(x, relay.const(weight))))))
    parted = ort.partition_for(mod)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(parted, target="llvm")
    kinds = {m.type_key for m in lib.get_lib().imported_modules}
    assert ("tcutils_packed_call" in kinds) == (kind == "native"), kinds
    path = str(tmp_path / "lib.so")
    lib.export_library(path)
    data = rng.standard_normal((2, 256)).astype("float32")
    ort.TOOLCHAIN.forget()  # the loaded library loads its payload again
    graph = graph_executor.GraphModule(tvm.runtime.load_module(path)["default"](tvm.cpu()))
    graph.set_input("data", data)
    graph.run()
    np.testing.assert_allclose(graph.get_output(0).numpy(), np.maximum(data @ weight.T, 0), rtol=1e-4, atol=1e-4)


def test_packed_call_setting_is_checked(monkeypatch):
    from tvm_tcutils.collage.toolchains.packed_call import native_module_maker

    monkeypatch.setenv("TVM_TCUTILS_PACKED_CALL", "jit")
    with pytest.raises(ValueError, match="TVM_TCUTILS_PACKED_CALL='jit'.*'native'.*'llvm'"):
        native_module_maker()
