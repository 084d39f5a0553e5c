"""The tcutils_blas toolchain: matrix products through numpy's BLAS, against TVM."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import run_graph_and_vm
from tvm_tcutils.collage.toolchains import blas

RNG = np.random.default_rng(11)


def _arr(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


def _weight(*shape, dtype="float32"):
    return relay.const(_arr(*shape, dtype=dtype), dtype=dtype)


# name -> (builder of (inputs, output expr), input shapes)
CASES = {
    "dense_const": (lambda a: relay.nn.dense(a, _weight(48, 64)), [(20, 64)]),
    "dense_bias_add": (lambda a: relay.nn.bias_add(relay.nn.dense(a, _weight(48, 64)), _weight(48)), [(20, 64)]),
    "dense_add_row": (lambda a: relay.add(relay.nn.dense(a, _weight(48, 64)), _weight(1, 48)), [(20, 64)]),
    "dense_bias_first": (lambda a: relay.add(_weight(48), relay.nn.dense(a, _weight(48, 64))), [(20, 64)]),
    "dense_inputs": (lambda a, b: relay.nn.dense(a, b), [(9, 32), (17, 32)]),
    "dense_float64": (lambda a: relay.nn.dense(a, _weight(8, 16, dtype="float64")), [(3, 16, "float64")]),
    "batch_matmul": (lambda a, b: relay.nn.batch_matmul(a, b), [(4, 12, 32), (4, 10, 32)]),
    "batch_matmul_nn_bias": (
        lambda a, b: relay.add(relay.nn.batch_matmul(a, b, transpose_b=False), _weight(10)),
        [(4, 12, 32), (4, 32, 10)]),
    "batch_matmul_ta_const": (
        lambda a: relay.nn.batch_matmul(a, _weight(1, 12, 7), transpose_a=True, transpose_b=False), [(3, 12, 5)]),
    "matmul": (lambda a, b: relay.nn.matmul(a, b), [(6, 32), (32, 9)]),
    "matmul_tt_bias_input": (
        lambda a, b, c: relay.nn.bias_add(relay.nn.matmul(a, b, transpose_a=True, transpose_b=True), c),
        [(32, 6), (9, 32), (9,)]),
}


def _module(case):
    build, shapes = CASES[case]
    params = [relay.var(f"p{i}", shape=s[:-1] if isinstance(s[-1], str) else s,
                        dtype=s[-1] if isinstance(s[-1], str) else "float32") for i, s in enumerate(shapes)]
    body = relay.nn.relu(build(*params))  # a TVM op after the product keeps main non-trivial
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, body)))


def _compilers(mod):
    return [str(f.attrs["Compiler"]) for _, f in mod.functions.items() if f.attrs is not None and "Compiler" in f.attrs]


@pytest.mark.parametrize("case", sorted(CASES))
def test_blas_partition_matches_tvm(case):
    mod = _module(case)
    inputs = {
        v.name_hint: RNG.standard_normal([int(d) for d in v.checked_type.shape]).astype(str(v.checked_type.dtype))
        for v in mod["main"].params
    }
    parted = blas.partition_for(mod)
    assert _compilers(parted) == ["tcutils_blas"]
    with tvm.transform.PassContext(opt_level=3):
        expected = relay.create_executor("graph", mod=mod, target="llvm").evaluate()(**inputs).numpy()
    graph_out, vm_out = run_graph_and_vm(parted, inputs)
    tol = 1e-4 if expected.dtype == np.float32 else 1e-10
    np.testing.assert_allclose(graph_out, expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(vm_out, expected, rtol=tol, atol=tol)


def test_each_product_is_its_own_partition():
    x = relay.var("x", shape=(4, 16))
    y = relay.nn.dense(relay.nn.dense(x, _weight(16, 16)), _weight(8, 16))
    parted = blas.partition_for(relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y))))
    assert _compilers(parted) == ["tcutils_blas", "tcutils_blas"]


def test_int8_and_mixed_precision_products_are_not_claimed():
    a = relay.var("a", shape=(4, 16), dtype="int8")
    w = relay.const(np.ones((8, 16), "int8"))
    mod = tvm.IRModule.from_expr(relay.Function([a], relay.nn.dense(a, w, out_dtype="int32")))
    assert _compilers(blas.partition_for(relay.transform.InferType()(mod))) == []


def test_codegen_rejects_functions_it_cannot_run():
    x = relay.var("x", shape=(4, 16))
    two = relay.nn.dense(relay.nn.dense(x, _weight(16, 16)), _weight(8, 16))
    with pytest.raises(ValueError, match="must compute one of"):
        blas.compile_function(relay.Function([x], relay.tanh(two)).with_attr("global_symbol", "f"))
    with pytest.raises(ValueError, match="operand"):
        blas.compile_function(relay.Function([x], two).with_attr("global_symbol", "g"))


def test_an_add_that_is_no_bias_is_not_claimed_and_not_built():
    # Issue 23: add(relu(x), dense(x, w)) was claimed (relu taken for the product) and then failed to build.
    x = relay.var("x", shape=(4, 16))
    residual = relay.add(relay.nn.relu(x), relay.nn.dense(x, _weight(16, 16)))
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], residual)))
    parted = blas.partition_for(mod)
    (only,) = [f for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs]
    assert "add" not in str(only), "the residual add went to BLAS with the dense"
    assert np.allclose(*[relay.create_executor("graph", mod=m, target="llvm").evaluate()(np.ones((4, 16), "float32"))
                         .numpy() for m in (mod, parted)], rtol=1e-4)
    with pytest.raises(ValueError, match="not what the toolchain claims"):
        blas.compile_function(relay.Function([x], residual).with_attr("global_symbol", "h"))


def test_available_reports_the_blas():
    ok, reason = blas.available()
    assert ok and "numpy" in reason
