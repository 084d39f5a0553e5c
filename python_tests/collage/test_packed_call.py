"""The packed-function bridge of the library-style toolchains (collage/toolchains/packed_call.py)."""
from __future__ import annotations

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
    func = _product_function()
    module = blas.TOOLCHAIN.build_module(func, blas._plan(func).to_bytes())
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((3, 5)).astype("float32"), rng.standard_normal((4, 5)).astype("float32")
    out = tvm.nd.empty((3, 4))
    module["mm"](tvm.nd.array(a), tvm.nd.array(b), out)  # compiled code: load, then run
    np.testing.assert_allclose(out.numpy(), a @ b.T, rtol=1e-5, atol=1e-5)
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
