"""Fast forms of float ops whose results are quantized to 8 bits right after (``tvm_tcutils.fast_forms``)."""
from __future__ import annotations

import json

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.fast_forms import (DENSE_BATCHES_MAX, dense_pack_block, dense_per_batch, fast_chain, fast_lrn,
                                    fast_region, legalize_mean, legalize_variance, split_softmax)

from conftest import build_and_run, each_value_once, op_names


def _attention(heads: int = 2, seq: int = 16, dim: int = 8):
    """scores -> softmax -> probabilities x V -> transpose -> reshape: what an encoder's context is."""
    q = relay.var("q", shape=(heads, seq, dim))
    k = relay.var("k", shape=(heads, seq, dim))
    v = relay.var("v", shape=(heads, dim, seq))
    scores = relay.multiply(relay.nn.batch_matmul(q, k), relay.const(1 / np.sqrt(dim), "float32"))
    context = relay.nn.batch_matmul(relay.nn.softmax(scores, axis=-1), v)
    return [q, k, v], relay.reshape(relay.transpose(context, (1, 0, 2)), (seq, heads * dim))


def test_chain_reaches_the_softmax_behind_attention_product():
    params, context = _attention()
    fast = fast_chain(context)
    assert "nn.fast_softmax" in op_names(fast) and "nn.softmax" not in op_names(fast)
    # Both products (scores and context) stay: the build's legalization (knowing the target) splits them.
    assert op_names(fast).count("nn.batch_matmul") == 2
    assert "nn.softmax" in op_names(context)  # the input expression is not changed
    rng = np.random.default_rng(0)
    inputs = {p.name_hint: rng.standard_normal([int(d) for d in p.type_annotation.shape]).astype("float32")
              for p in params}
    exact, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, context)), inputs=inputs)
    approx, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, fast)), inputs=inputs)
    # Far below an 8-bit step of the context's range.
    assert np.abs(approx - exact).max() < 1e-5 * np.abs(exact).max()


@pytest.mark.parametrize("stop", ["nn.dense", "mean"])
def test_chain_stops_at_otherop_names(stop):
    x = relay.var("x", shape=(4, 8))
    soft = relay.nn.softmax(x, axis=-1)
    after = relay.nn.dense(soft, relay.var("w", shape=(8, 8))) if stop == "nn.dense" else relay.mean(soft, axis=-1)
    assert fast_chain(after).same_as(after)


def _product_inputs(shape_x, shape_y, dtype="float32"):
    rng = np.random.default_rng(1)
    return {"x": rng.standard_normal(shape_x).astype(dtype), "y": rng.standard_normal(shape_y).astype(dtype)}


@pytest.mark.parametrize("transposes, batches, packed", each_value_once(
    [(False, True), (False, False), (True, True), (True, False)], [(3, 3), (1, 3), (3, 1), (1, 1)], [False, True]))
def test_dense_per_batch_computes_the_batch_matmul(transposes, batches, packed):
    from tvm_tcutils._tvm import host_target

    transpose_a, transpose_b = transposes

    m, n, k = 5, 16, 6
    shape_x = (batches[0],) + ((k, m) if transpose_a else (m, k))
    shape_y = (batches[1],) + ((n, k) if transpose_b else (k, n))
    x, y = relay.var("x", shape=shape_x), relay.var("y", shape=shape_y)
    call = relay.nn.batch_matmul(x, y, transpose_a=transpose_a, transpose_b=transpose_b)
    target = host_target()
    with tvm.target.Target(target):
        block = dense_pack_block(m, n, k) if packed else None
    assert (block is not None) == packed
    dense = dense_per_batch(call, block)
    names = op_names(dense)
    assert dense is not None and "nn.batch_matmul" not in names
    assert names.count("nn.contrib_dense_pack" if packed else "nn.dense") == max(batches)
    inputs = _product_inputs(shape_x, shape_y)
    xs = inputs["x"].transpose(0, 2, 1) if transpose_a else inputs["x"]
    ys = inputs["y"].transpose(0, 2, 1) if transpose_b else inputs["y"]
    got, = build_and_run(tvm.IRModule.from_expr(relay.Function([x, y], dense)), inputs=inputs, target=target)
    np.testing.assert_allclose(got, np.matmul(xs, ys), rtol=1e-5, atol=1e-5)


def test_dense_per_batch_refuses_a_block_that_does_not_divide_the_columns():
    x, y = relay.var("x", shape=(2, 4, 8)), relay.var("y", shape=(2, 12, 8))
    with pytest.raises(ValueError, match="block must divide the 12 columns"):
        dense_per_batch(relay.nn.batch_matmul(x, y), block=8)


@pytest.mark.parametrize("target", ["host", "llvm -mcpu=x86-64"])
def test_quantized_models_attention_products_without_copy_kernels(target):
    # A quantized model's float products of activations (quantize_dynamic leaves attention's in float):
    # plain relay.build gives one kernel per product parallel over the heads where the target has vectors
    # for it (tvm_tcutils.float_batch_matmul), else one packed dense per head, each operand a field of
    # one kernel's split.
    from tvm_tcutils._tvm import host_target
    from tvm_tcutils.float_batch_matmul import lanes

    target = host_target() if target == "host" else target
    heads, seq, dim = 4, 32, 16
    qs = [relay.var(name, shape=(heads, seq, dim), dtype="int8") for name in "qkv"]
    # As quantize_dynamic's: integer products, rescaled in float (a static QDQ region's dequantized operands
    # are left to its quantize's integer rewrite).
    q, k, v = [relay.add(relay.qnn.op.dequantize(x, relay.const(0.05), relay.const(0)), relay.const(0.5))
               for x in qs]
    scores = relay.nn.softmax(relay.nn.batch_matmul(q, k), axis=-1)
    context = relay.nn.batch_matmul(scores, v, transpose_b=False)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function(qs, context)), target=target)
    kernels = [node["attrs"]["func_name"] for node in json.loads(lib.get_graph_json())["nodes"]
               if node["op"] == "tvm_op"]
    assert not [name for name in kernels if "nn_batch_matmul" in name], kernels
    one_kernel = lanes(tvm.target.Target(target)) is not None
    assert len([name for name in kernels if "tcutils_float_batch_matmul" in name]) == (2 if one_kernel else 0)
    assert len([name for name in kernels if "dense_pack" in name]) == (0 if one_kernel else 2 * heads), kernels
    # No kernel per head that only copies (squeeze, reshape or layout_transform of one field).
    assert not [name for name in kernels if name.endswith(("_squeeze", "_reshape", "_layout_transform"))
                or "_squeeze_" in name or "_fused_layout_transform" in name], kernels
    rng = np.random.default_rng(3)
    data = {name: rng.integers(-100, 100, (heads, seq, dim)).astype("int8") for name in "qkv"}
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**data)
    runner.run()
    fq, fk, fv = [data[name].astype("float64") * 0.05 + 0.5 for name in "qkv"]
    s = fq @ fk.transpose(0, 2, 1)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(runner.get_output(0).numpy(), p @ fv, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("transposed", ["x", "y", "both"])
def test_batch_matmul_legalization_takes_transposes_into_the_op(transposed):
    # An ONNX Transpose before MatMul: the op reads the operand as it is (no transpose kernel).
    from tvm_tcutils.fast_forms import legalize_batch_matmul
    from tvm_tcutils.float_batch_matmul import OP_NAME

    after = [relay.add(relay.qnn.op.dequantize(relay.var(name, shape=(2, 32, 16), dtype="int8"),
                                               relay.const(0.1), relay.const(0)), relay.const(0.5))
             for name in "ab"]
    # [batch, rows, K] both; each transposed operand given with the flag that undoes its transpose.
    x = relay.transpose(after[0], (0, 2, 1)) if transposed in ("x", "both") else after[0]
    y = relay.transpose(after[1], (0, 2, 1)) if transposed in ("y", "both") else after[1]
    call = relay.nn.batch_matmul(x, y, transpose_a=transposed in ("x", "both"),
                                 transpose_b=transposed == "x")
    types = [relay.transform.InferTypeLocal(x), relay.transform.InferTypeLocal(y)]
    with tvm.target.Target("llvm -mcpu=skylake-avx512"):
        out = legalize_batch_matmul(call.attrs, [x, y], types)
    assert out.op.name == OP_NAME
    assert out.args[0].same_as(after[0]) and out.args[1].same_as(after[1])
    assert not out.attrs.transpose_a and out.attrs.transpose_b
    args = {name: np.random.default_rng(5).integers(-9, 9, (2, 32, 16)).astype("int8") for name in "ab"}
    params = relay.analysis.free_vars(call)
    want, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, call)), inputs=args)
    got, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, out)), inputs=args,
                         target="llvm -mcpu=nehalem")
    np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("case", ["float_model", "qdq_region", "int8"])
def test_batch_matmul_legalization_leaves_what_it_does_not_handle(case):
    from tvm_tcutils.fast_forms import legalize_batch_matmul

    dtype = "int8" if case == "int8" else "float32"
    x, y = relay.var("x", shape=(2, 8, 16), dtype=dtype), relay.var("y", shape=(2, 32, 16), dtype=dtype)
    if case == "qdq_region":  # dequantized operands: the region's quantize makes the product integer
        x = relay.transpose(relay.qnn.op.dequantize(relay.var("q", shape=(2, 16, 8), dtype="int8"),
                                                    relay.const(0.1), relay.const(0)), (0, 2, 1))
    elif case == "int8":  # after a qnn op, but 8-bit
        x = relay.qnn.op.quantize(relay.var("f", shape=(2, 8, 16)), relay.const(0.1), relay.const(0))
    call = relay.nn.batch_matmul(x, y, out_dtype="int32" if case == "int8" else "")
    types = [relay.transform.InferTypeLocal(x), relay.transform.InferTypeLocal(y)]
    with tvm.target.Target("llvm -mcpu=skylake-avx512"):
        assert legalize_batch_matmul(call.attrs, [x, y], types) is None


@pytest.mark.parametrize("case", ["int8", "out_dtype", "too_many_batches", "dynamic"])
def test_dense_per_batch_keeps_what_it_does_not_handle(case):
    shape_x, shape_y, dtype, out_dtype = (2, 3, 4), (2, 5, 4), "float32", ""
    if case == "int8":
        dtype, out_dtype = "int8", "int32"
    elif case == "out_dtype":
        out_dtype = "float16"
    elif case == "too_many_batches":
        shape_x, shape_y = (DENSE_BATCHES_MAX + 1, 3, 4), (DENSE_BATCHES_MAX + 1, 5, 4)
    elif case == "dynamic":
        shape_x = (2, relay.Any(), 4)
    x, y = relay.var("x", shape=shape_x, dtype=dtype), relay.var("y", shape=shape_y, dtype=dtype)
    assert dense_per_batch(relay.nn.batch_matmul(x, y, out_dtype=out_dtype)) is None


@pytest.mark.parametrize("shape", [(2, 8, 32), (3, 128), (2, 4, 128, 128)])
def test_split_softmax_computes_the_softmax(shape):
    x = relay.var("x", shape=shape)
    split = split_softmax(relay.nn.softmax(x, axis=-1))
    assert split is not None and not {"nn.softmax", "nn.fast_softmax"} & set(op_names(split))
    data = (np.random.default_rng(4).standard_normal(shape) * 4).astype("float32")
    got, = build_and_run(tvm.IRModule.from_expr(relay.Function([x], split)), inputs={"x": data})
    shifted = np.exp(data - data.max(axis=-1, keepdims=True))
    # fast_exp's relative error (about 1e-7) and another order of the additions.
    np.testing.assert_allclose(got, shifted / shifted.sum(axis=-1, keepdims=True), rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["width", "axis", "dtype", "dynamic"])
def test_split_softmax_keeps_what_it_does_not_handle(case):
    shape, dtype, axis = (4, 64), "float32", -1
    if case == "width":
        shape = (4, 40)  # not 16-wide parts
    elif case == "axis":
        axis = 0
    elif case == "dtype":
        dtype = "float16"
    elif case == "dynamic":
        shape = (relay.Any(), 64)
    call = relay.nn.softmax(relay.var("x", shape=shape, dtype=dtype), axis=axis)
    assert split_softmax(call) is None


def test_chain_splits_a_wide_softmax():
    params, context = _attention(seq=64)
    fast = fast_chain(context)
    assert not {"nn.softmax", "nn.fast_softmax"} & set(op_names(fast))
    assert "fast_exp" in op_names(fast)


def _layer_norm(x: relay.Expr, eps: float = 1e-5) -> relay.Expr:
    """What TVM's ONNX importer writes for ``LayerNormalization`` over the last axis (no scale, no bias)."""
    mean = relay.mean(x, axis=-1, keepdims=True)
    variance = relay.variance(x, axis=-1, keepdims=True, with_mean=mean)
    return relay.divide(relay.subtract(x, mean), relay.sqrt(relay.add(variance, relay.const(eps))))


@pytest.mark.parametrize("width,offset", [(64, 0.5), (256, 0.5), (768, 40.0)])
def test_quantized_models_layer_norm_takes_one_pass_and_computes_the_same(width, offset):
    # offset 40: a mean ten times the deviation, where the mean of squares less the squared mean cancels.
    q = relay.var("q", shape=(8, width), dtype="int8")
    x = relay.qnn.op.dequantize(q, relay.const(0.05), relay.const(3))
    func = relay.Function([q], _layer_norm(relay.add(x, relay.const(offset))))
    data = np.random.default_rng(5).integers(-128, 128, (8, width)).astype("int8")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(func), target="llvm")
    # No mean or variance kernel is left, and the mean and the variance share one sum of the row moments.
    kernels = [node["attrs"]["func_name"] for node in json.loads(lib.get_graph_json())["nodes"]
               if node["op"] == "tvm_op"]
    assert not [k for k in kernels if "mean" in k or "variance" in k], kernels
    assert len([k for k in kernels if "_sum" in k]) == 1, kernels
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input("q", data)
    runner.run()
    v = (data.astype("float64") - 3) * 0.05 + offset
    want = (v - v.mean(-1, keepdims=True)) / np.sqrt(v.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(runner.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)


def test_legalized_variance_is_about_the_given_mean():
    # variance(x, with_mean=m) is mean((x - m)^2) for any m, not only x's own mean.
    q = relay.var("q", shape=(4, 64), dtype="int8")
    x = relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(0))
    given = relay.add(relay.mean(x, axis=-1, keepdims=True), relay.const(1.5))
    call = relay.variance(x, axis=-1, keepdims=False, with_mean=given)
    types = [relay.transform.InferTypeLocal(x), relay.transform.InferTypeLocal(given)]
    out = legalize_variance(call.attrs, [x, given], types)
    assert out is not None
    data = np.random.default_rng(6).integers(-128, 128, (4, 64)).astype("int8")
    got = relay.create_executor("graph", mod=tvm.IRModule.from_expr(relay.Function([q], out)),
                                target="llvm").evaluate()(data).numpy()
    v = data.astype("float64") * 0.1
    np.testing.assert_allclose(got, ((v - (v.mean(-1, keepdims=True) + 1.5)) ** 2).mean(-1), rtol=1e-5)


@pytest.mark.parametrize("case", ["float_model", "width", "axis", "unbiased"])
def test_layer_norm_reductions_left_to_tvm(case):
    shape, axis, unbiased = (8, 64), -1, False
    x = relay.var("x", shape=shape)
    if case != "float_model":  # the other cases are quantized models' reductions
        x = relay.qnn.op.dequantize(relay.var("q", shape=shape, dtype="int8"), relay.const(0.1), relay.const(0))
    if case == "width":
        x = relay.reshape(x, (16, 32))
        x = relay.strided_slice(x, [0, 0], [16, 24])  # 24: not 16-wide parts
    elif case == "axis":
        axis = 0
    elif case == "unbiased":
        unbiased = True
    x_type = relay.transform.InferTypeLocal(x)
    mean = relay.mean(x, axis=axis, keepdims=True)
    variance = relay.variance(x, axis=axis, keepdims=True, with_mean=mean, unbiased=unbiased)
    types = [x_type, relay.transform.InferTypeLocal(mean)]
    if case != "unbiased":
        assert legalize_mean(mean.attrs, [x], types[:1]) is None
    assert legalize_variance(variance.attrs, [x, mean], types) is None


@pytest.mark.parametrize("shape, size, beta, bias", [
    ((1, 16, 7, 9), 5, 0.75, 1.0),   # GoogLeNet's and AlexNet's LRN
    ((2, 3, 5, 5), 5, 0.75, 2.0),    # fewer channels than the window
    ((1, 24, 6, 4), 3, 0.5, 1.0),
    ((1, 8, 3, 3), 7, 1.0, 0.5),
])
def test_fast_lrn_computes_tvms_lrn(shape, size, beta, bias):
    x = relay.var("x", shape=shape)
    exact = relay.nn.lrn(x, size=size, axis=1, bias=bias, alpha=1e-2, beta=beta)
    fast = fast_lrn(exact)
    assert fast is not None and "nn.lrn" not in op_names(fast)
    # Large inputs, so that the window's term is not lost beside the bias.
    data = (np.random.default_rng(5).standard_normal(shape) * 8).astype("float32")
    got, = build_and_run(tvm.IRModule.from_expr(relay.Function([x], fast)), inputs={"x": data})
    want, = build_and_run(tvm.IRModule.from_expr(relay.Function([x], exact)), inputs={"x": data})
    # The power in square roots and another order of the products: a few float32 ulp.
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("case", ["beta", "dtype", "axis", "dynamic"])
def test_fast_lrn_keeps_what_it_does_not_handle(case):
    shape, dtype, axis, beta = (1, 8, 4, 4), "float32", 1, 0.75
    if case == "beta":
        beta = 0.6
    elif case == "dtype":
        dtype = "float16"
    elif case == "axis":
        axis = 3  # NHWC
    elif case == "dynamic":
        shape = (relay.Any(), 8, 4, 4)
    call = relay.nn.lrn(relay.var("x", shape=shape, dtype=dtype), size=5, axis=axis, beta=beta)
    assert fast_lrn(call) is None


def test_quantized_regions_lrn_takes_the_fast_form_and_rounds_the_same():
    x = relay.var("x", shape=(1, 32, 9, 9), dtype="uint8")
    scale, zero = relay.const(0.05), relay.const(128)
    lrn = relay.nn.lrn(relay.qnn.op.dequantize(x, scale, zero), size=5, axis=1, bias=1.0, alpha=1e-2, beta=0.75)
    quantize = relay.qnn.op.quantize(lrn, relay.const(0.02), relay.const(128), out_dtype="uint8")
    fast = fast_region(quantize)
    assert fast is not None and "nn.lrn" not in op_names(fast) and "nn.avg_pool2d" in op_names(fast)
    data = np.random.default_rng(6).integers(0, 256, (1, 32, 9, 9)).astype("uint8")
    got, = build_and_run(tvm.IRModule.from_expr(relay.Function([x], fast)), inputs={"x": data})
    want, = build_and_run(tvm.IRModule.from_expr(relay.Function([x], quantize)), inputs={"x": data})
    # A few ulp before the rounding: a value on a rounding boundary may move by one step.
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
    assert (got == want).mean() > 0.99
