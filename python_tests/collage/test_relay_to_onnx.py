"""Relay-to-ONNX converter: every claimed operator against TVM's own numerics."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from conftest import runtime_exact_weight_bound
from tvm_tcutils.collage.toolchains import relay_to_onnx

ort = pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

RNG = np.random.default_rng(7)


def _data(shape, low=None):
    value = RNG.standard_normal(shape).astype("float32")
    return np.abs(value) + low if low is not None else value


def _const(shape, low=None):
    return relay.const(_data(shape, low))


def _unary(fn, shape=(2, 3, 8, 8), low=None):
    def build():
        x = relay.var("x", shape=shape)
        return relay.Function([x], fn(x)), [_data(shape, low)]
    return build


def _binary(fn, a_shape=(2, 3, 8, 8), b_shape=(3, 1, 8), low=None):
    def build():
        a, b = relay.var("a", shape=a_shape), relay.var("b", shape=b_shape)
        return relay.Function([a, b], fn(a, b)), [_data(a_shape, low), _data(b_shape, low)]
    return build


def _conv(groups=1, strides=(1, 1), padding=(0, 0), dilation=(1, 1), cin=8, cout=8):
    def build():
        x = relay.var("x", shape=(1, cin, 15, 15))
        w = _const((cout, cin // groups, 3, 3))
        y = relay.nn.conv2d(x, w, strides=strides, padding=padding, dilation=dilation, groups=groups, channels=cout,
                            kernel_size=(3, 3))
        return relay.Function([x], y), [_data((1, cin, 15, 15))]
    return build


def _shared_product(product, add_bias):
    """``add_bias(product)`` beside another use of ``product``: its bias cannot be folded into it."""
    return relay.subtract(add_bias(product), relay.nn.relu(product))


def _layer_norm_decomposed(x):
    mean = relay.mean(x, axis=-1, keepdims=True)
    centered = relay.subtract(x, mean)
    var = relay.mean(relay.power(centered, relay.const(2.0)), axis=-1, keepdims=True)
    return relay.divide(centered, relay.sqrt(relay.add(var, relay.const(1e-5))))


def _batch_norm(center=True, scale=True):
    def fn(x):
        c = int(x.type_annotation.shape[1])
        out = relay.nn.batch_norm(
            x, _const((c,), 0.5), _const((c,)), _const((c,)), _const((c,), 0.5), center=center, scale=scale
        )
        return out[0]
    return fn


def _pool(kind, **kwargs):
    op = relay.nn.max_pool2d if kind == "max" else relay.nn.avg_pool2d
    return _unary(lambda x: op(x, **kwargs), shape=(1, 4, 11, 11))


CASES = {
    "conv2d": _conv(),
    "conv2d_groups_stride_pad": _conv(groups=2, strides=(2, 2), padding=(1, 1)),
    "conv2d_depthwise_dilation": _conv(groups=8, padding=(2, 2, 1, 1), dilation=(2, 2)),
    "dense": _unary(lambda x: relay.nn.dense(x, _const((24, 32))), shape=(5, 32)),
    "dense_weight_input": _binary(lambda a, b: relay.nn.dense(a, b), (5, 32), (24, 32)),
    "batch_matmul": _binary(lambda a, b: relay.nn.batch_matmul(a, b), (3, 5, 16), (3, 7, 16)),
    "batch_matmul_nn": _binary(
        lambda a, b: relay.nn.batch_matmul(a, b, transpose_b=False), (3, 5, 16), (3, 16, 7)),
    "batch_matmul_ta_broadcast": _binary(
        lambda a, b: relay.nn.batch_matmul(a, b, transpose_a=True, transpose_b=False), (3, 16, 5), (1, 16, 7)),
    "matmul": _binary(lambda a, b: relay.nn.matmul(a, b), (5, 16), (16, 7)),
    "matmul_tb": _binary(lambda a, b: relay.nn.matmul(a, b, transpose_b=True), (5, 16), (7, 16)),
    "bias_add": _unary(lambda x: relay.nn.bias_add(x, _const((3,)))),
    "bias_add_last_axis": _unary(lambda x: relay.nn.bias_add(x, _const((8,)), axis=-1)),
    "add": _binary(relay.add),
    "subtract": _binary(relay.subtract),
    "multiply": _binary(relay.multiply),
    "divide": _binary(relay.divide, low=0.5),
    "power": _binary(relay.power, low=0.5),
    "maximum": _binary(relay.maximum),
    "minimum": _binary(relay.minimum),
    "relu": _unary(relay.nn.relu),
    "leaky_relu": _unary(lambda x: relay.nn.leaky_relu(x, alpha=0.2)),
    "sigmoid": _unary(relay.sigmoid),
    "tanh": _unary(relay.tanh),
    "erf": _unary(relay.erf),
    "exp": _unary(relay.exp),
    "log": _unary(relay.log, low=0.1),
    "sqrt": _unary(relay.sqrt, low=0.1),
    "rsqrt": _unary(relay.rsqrt, low=0.1),
    "negative": _unary(relay.negative),
    "abs": _unary(relay.abs),
    "copy": _unary(relay.copy),
    "dropout": _unary(lambda x: relay.nn.relu(relay.nn.dropout(x, rate=0.3))),
    "softmax": _unary(relay.nn.softmax),
    "softmax_axis1": _unary(lambda x: relay.nn.softmax(x, axis=1)),
    "layer_norm": _unary(lambda x: relay.nn.layer_norm(x, _const((8,), 0.5), _const((8,))), shape=(2, 6, 8)),
    "layer_norm_no_affine": _unary(
        lambda x: relay.nn.layer_norm(x, _const((8,)), _const((8,)), center=False, scale=False), shape=(2, 6, 8)),
    "layer_norm_decomposed": _unary(_layer_norm_decomposed, shape=(2, 6, 32)),
    "variance": _unary(lambda x: relay.variance(x, axis=[1, 2], keepdims=True)),
    "variance_unbiased": _unary(lambda x: relay.variance(x, axis=-1, unbiased=True)),
    "batch_norm": _unary(_batch_norm()),
    "batch_norm_no_affine": _unary(_batch_norm(center=False, scale=False)),
    "max_pool": _pool("max", pool_size=(3, 3), strides=(2, 2), padding=(1, 1)),
    "max_pool_dilated_ceil": _pool("max", pool_size=(2, 2), strides=(2, 2), dilation=(2, 2), ceil_mode=True),
    "avg_pool_include_pad": _pool("avg", pool_size=(3, 3), strides=(2, 2), padding=(1, 1), count_include_pad=True),
    "avg_pool_exclude_pad": _pool("avg", pool_size=(3, 3), strides=(2, 2), padding=(1, 1), count_include_pad=False),
    "avg_pool_ceil": _pool("avg", pool_size=(2, 2), strides=(2, 2), ceil_mode=True),
    "global_avg_pool": _unary(relay.nn.global_avg_pool2d),
    "global_max_pool": _unary(relay.nn.global_max_pool2d),
    "reshape": _unary(lambda x: relay.reshape(x, (0, -1, 4))),
    "transpose": _unary(lambda x: relay.transpose(x, (0, 2, -1, 1))),
    "transpose_default": _unary(relay.transpose),
    "concatenate": _binary(lambda a, b: relay.concatenate([a, relay.nn.relu(a), a], axis=-3), b_shape=(1,)),
    "clip": _unary(lambda x: relay.clip(x, -0.5, 0.75)),
    "mean": _unary(lambda x: relay.mean(x, axis=[2, 3], keepdims=True)),
    "mean_exclude": _unary(lambda x: relay.mean(x, axis=[1], exclude=True)),
    "sum": _unary(lambda x: relay.sum(x, axis=-1)),
    "sum_all": _unary(relay.sum),
    "max": _unary(lambda x: relay.max(x, axis=1)),
    "min": _unary(lambda x: relay.min(x, axis=(1, 2), keepdims=True)),
    "strided_slice": _unary(lambda x: relay.strided_slice(x, begin=[0, 1, 2], end=[2, 3, 100], strides=[1, 1, 3])),
    "strided_slice_axes_negative": _unary(
        lambda x: relay.strided_slice(x, begin=[-3], end=[-1], axes=[3])),
    "strided_slice_size": _unary(
        lambda x: relay.strided_slice(x, begin=[0, 1], end=[1, -1], slice_mode="size")),
    "squeeze": _unary(lambda x: relay.squeeze(x, axis=[1]), shape=(2, 1, 4, 1)),
    "squeeze_all": _unary(relay.squeeze, shape=(2, 1, 4, 1)),
    "expand_dims": _unary(lambda x: relay.expand_dims(x, axis=-2, num_newaxis=2), shape=(2, 5)),
    "batch_flatten": _unary(relay.nn.batch_flatten),
    "pad_constant": _unary(lambda x: relay.nn.pad(x, ((0, 0), (0, 1), (2, 1), (1, 0)), pad_value=1.5)),
    "pad_edge": _unary(lambda x: relay.nn.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), pad_mode="edge")),
    "pad_reflect": _unary(lambda x: relay.nn.pad(x, ((0, 0), (0, 0), (1, 1), (2, 2)), pad_mode="reflect")),
    "cast": _unary(lambda x: relay.cast(relay.multiply(x, relay.const(10.0)), "int32")),
    # Inception-v1's and AlexNet's LRN: a 5-channel window over 7 channels (windows cut at both ends).
    "lrn": _unary(lambda x: relay.nn.lrn(x, size=5, axis=1, alpha=1e-2, beta=0.75, bias=2.0), (1, 7, 6, 6)),
    # Biases become the Conv's / Gemm's own input (folded), unless the product is used elsewhere too.
    "conv2d_bias_add": _unary(lambda x: relay.nn.bias_add(
        relay.nn.conv2d(x, _const((4, 3, 3, 3)), padding=(1, 1), channels=4, kernel_size=(3, 3)), _const((4,)))),
    "conv2d_bias_add_shared": _unary(lambda x: _shared_product(
        relay.nn.conv2d(x, _const((4, 3, 3, 3)), channels=4, kernel_size=(3, 3)),
        lambda y: relay.nn.bias_add(y, _const((4,))))),
    "dense_weight_input_bias": _binary(lambda a, b: relay.add(relay.nn.dense(a, b), _const((24,))), (5, 32), (24, 32)),
    "dense_weight_input_bias_first": _binary(
        lambda a, b: relay.add(_const((5, 24)), relay.nn.dense(a, b)), (5, 32), (24, 32)),
    "dense_weight_input_bias_shared": _binary(
        lambda a, b: _shared_product(relay.nn.dense(a, b), lambda y: relay.add(y, _const((24,)))), (5, 32), (24, 32)),
}


#: Ops that only move values: claimed on int8 and uint8 tensors too (exact there).
MOVING = {
    "copy": lambda x: relay.copy(x),
    "reshape": lambda x: relay.reshape(x, (0, -1, 4)),
    "transpose": lambda x: relay.transpose(x, (0, 2, -1, 1)),
    "squeeze": lambda x: relay.squeeze(relay.reshape(x, (2, 1, 3, 64)), axis=[1]),
    "expand_dims": lambda x: relay.expand_dims(x, axis=1, num_newaxis=2),
    "batch_flatten": relay.nn.batch_flatten,
    "concatenate": lambda x: relay.concatenate([x, relay.copy(x)], axis=1),
    "strided_slice": lambda x: relay.strided_slice(x, begin=[0, 1, 2], end=[2, 3, 100], strides=[1, 1, 3]),
    "max_pool": lambda x: relay.nn.max_pool2d(x, pool_size=(3, 3), strides=(2, 2), padding=(1, 1)),
    "max_pool_dilated_ceil": lambda x: relay.nn.max_pool2d(x, pool_size=(2, 2), strides=(2, 2), dilation=(2, 2),
                                                           ceil_mode=True),
}


def _integers(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max, shape, endpoint=True).astype(dtype)


def _moving(fn, dtype, shape=(2, 3, 8, 8)):
    def build():
        x = relay.var("x", shape=shape, dtype=dtype)
        return relay.Function([x], fn(x)), [_integers(shape, dtype)]
    return build


CASES.update({f"{name}_{dtype}": _moving(fn, dtype) for name, fn in MOVING.items() for dtype in ("int8", "uint8")})


def _tvm_reference(func, inputs):
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3):
        run = relay.create_executor("graph", mod=mod, target="llvm").evaluate()
    return run(*inputs).numpy()


def _ort_run(model, inputs):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, {f"in{i}": value for i, value in enumerate(inputs)})[0]


@pytest.mark.parametrize("case", sorted(CASES))
def test_onnx_conversion_matches_tvm(case):
    func, inputs = CASES[case]()
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]
    model = relay_to_onnx.to_onnx(typed)
    # Constants are initializers and never graph inputs (onnxruntime folds and fuses them).
    assert [value.name for value in model.graph.input] == [f"in{i}" for i in range(len(inputs))]
    expected = _tvm_reference(func, inputs)
    got = _ort_run(model, inputs)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected)
    else:
        np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def _ops_of(func):
    ops = set()
    relay.analysis.post_order_visit(
        func, lambda node: ops.add(node.op.name) if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) else None
    )
    return ops


def test_every_claimed_op_has_a_numerics_case():
    covered = set()
    for build in [*CASES.values(), *QNN_CASES.values()]:
        func, _ = build()
        covered |= _ops_of(func)
    assert set(relay_to_onnx.CONVERTERS) <= covered, set(relay_to_onnx.CONVERTERS) - covered


def _typed_call(expr):
    return relay.transform.InferType()(tvm.IRModule.from_expr(expr))["main"].body


@pytest.mark.parametrize(
    "make",
    [
        lambda: relay.nn.conv2d(relay.var("x", shape=(1, 8, 8, 4)), _const((3, 3, 4, 4)), data_layout="NHWC",
                                kernel_layout="HWIO"),
        lambda: relay.nn.layer_norm(relay.var("x", shape=(2, 4, 8)), _const((4,)), _const((4,)), axis=1),
        lambda: relay.add(relay.var("x", shape=(4,), dtype="int32"), relay.var("y", shape=(4,), dtype="int32")),
        lambda: relay.nn.avg_pool2d(relay.var("x", shape=(1, 4, 8, 8)), pool_size=(2, 2), dilation=(2, 2)),
        lambda: relay.nn.max_pool2d(relay.var("x", shape=(1, 8, 8, 4)), pool_size=(2, 2), layout="NHWC"),
        lambda: relay.nn.dense(relay.var("x", shape=(2, 4), dtype="float16"), relay.var("w", shape=(3, 4), dtype="float16")),
        lambda: relay.take(relay.var("x", shape=(4, 4)), relay.const(np.array([0, 1], "int32")), axis=0),
        # Arithmetic is claimed on float32 only, moving values on 8-bit types too, but not on int32.
        lambda: relay.add(relay.var("x", shape=(4,), dtype="int8"), relay.var("y", shape=(4,), dtype="int8")),
        lambda: relay.nn.avg_pool2d(relay.var("x", shape=(1, 4, 8, 8), dtype="uint8"), pool_size=(2, 2)),
        lambda: relay.reshape(relay.var("x", shape=(4, 4), dtype="int32"), (16,)),
        lambda: relay.nn.lrn(relay.var("x", shape=(1, 6, 6, 8)), size=3, axis=3),  # ONNX windows axis 1 only
        # Quantization ONNX cannot express as Relay computes it.
        lambda: relay.qnn.op.quantize(relay.var("x", shape=(2, 4)), relay.var("scale", shape=()), relay.const(0),
                                      out_dtype="int8"),
        lambda: relay.qnn.op.quantize(relay.var("x", shape=(2, 4)), relay.const(0.5),
                                      relay.var("zero_point", shape=(), dtype="int32"), out_dtype="int8"),
        lambda: relay.qnn.op.dequantize(relay.var("x", shape=(2, 4), dtype="int8"), relay.var("scale", shape=()),
                                        relay.const(0)),
        lambda: relay.qnn.op.quantize(relay.var("x", shape=(2, 4)), relay.const(0.0), relay.const(0), out_dtype="int8"),
        lambda: relay.qnn.op.quantize(relay.var("x", shape=(2, 4)), relay.const(0.5), relay.const(-1),
                                      out_dtype="uint8"),
        lambda: relay.qnn.op.quantize(relay.var("x", shape=(2, 4)), relay.const(0.5), relay.const(0),
                                      out_dtype="int32"),
        lambda: relay.qnn.op.dequantize(relay.var("x", shape=(2, 4), dtype="int32"), relay.const(0.5),
                                        relay.const(3)),
    ],
    ids=["conv2d_nhwc", "layer_norm_axis1", "int32_add", "avg_pool_dilated", "max_pool_nhwc", "dense_fp16", "take",
         "int8_add", "uint8_avg_pool", "int32_reshape", "lrn_nhwc", "quantize_scale_input", "quantize_zero_point_input",
         "dequantize_scale_input", "quantize_zero_scale", "quantize_zero_point_out_of_range", "quantize_int32",
         "dequantize_int32_zero_point"],
)
def test_unsupported_calls_are_not_claimed(make):
    call = _typed_call(make())
    assert not relay_to_onnx.supported(call)
    free = relay.analysis.free_vars(call)
    with pytest.raises(NotImplementedError, match=call.op.name):
        relay_to_onnx.to_onnx(relay.Function(free, call))


def test_composite_functions_are_inlined():
    x = relay.var("x", shape=(4, 16))
    a, b = relay.var("a"), relay.var("b")
    inner = relay.Function([a, b], relay.nn.relu(relay.nn.dense(a, b))).with_attr("Composite", "tcutils_ort.dense_relu")
    w = _data((8, 16))
    func = relay.Function([x], relay.tanh(relay.Call(inner, [x, relay.const(w)])))
    model = relay_to_onnx.to_onnx(func)
    data = _data((4, 16))
    np.testing.assert_allclose(_ort_run(model, [data]), np.tanh(np.maximum(data @ w.T, 0)), rtol=1e-5, atol=1e-5)
    # The dense weight is folded into one transposed initializer; the original is not kept.
    assert len(model.graph.initializer) == 1 and list(model.graph.initializer[0].dims) == [16, 8]


def test_tuple_results_become_outputs():
    x = relay.var("x", shape=(2, 3))
    func = relay.Function([x], relay.Tuple([relay.exp(x), x, relay.exp(x)]))
    model = relay_to_onnx.to_onnx(func)
    assert [value.name for value in model.graph.output] == ["out0", "out1", "out2"]
    data = _data((2, 3))
    options = ort.SessionOptions()
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    outs = session.run(None, {"in0": data})
    np.testing.assert_allclose(outs[0], np.exp(data), rtol=1e-6)
    np.testing.assert_array_equal(outs[1], data)


def test_multi_result_operator_returned_whole_is_rejected():
    x = relay.var("x", shape=(2, 3))
    dropout = relay.nn.dropout(x).tuple_value
    with pytest.raises(NotImplementedError, match="2 results, of which only 1 convert"):
        relay_to_onnx.to_onnx(relay.Function([x], dropout))


def test_bad_argument_type():
    with pytest.raises(TypeError, match="relay.Function"):
        relay_to_onnx.to_onnx(tvm.IRModule())


def _op_types(model):
    return [node.op_type for node in model.graph.node]


@pytest.mark.parametrize("case", ["layer_norm_decomposed", "variance"])
def test_decomposed_layer_norm_becomes_one_node(case):
    func, inputs = CASES[case]()
    model = relay_to_onnx.to_onnx(func)
    fused = "LayerNormalization" in _op_types(model)
    # Only the real layer norm is fused; a variance alone stays a variance.
    assert fused == (case == "layer_norm_decomposed")


def test_imported_onnx_layer_norm_is_fused_back(small_bert_onnx):
    original, mod, _ = small_bert_onnx
    model = relay_to_onnx.to_onnx(mod["main"])
    assert _op_types(model).count("LayerNormalization") == 2
    assert "ReduceMean" not in _op_types(model)
    data = _data((1, 16, 32))
    # Round trip: ONNX -> Relay (TVM's importer) -> ONNX computes what the original graph does.
    session = ort.InferenceSession(original.SerializeToString(), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"input": data})[0]
    np.testing.assert_allclose(_ort_run(model, [data]), expected, rtol=1e-4, atol=1e-4)


def _node_inputs(model, op_type):
    return [len(node.input) for node in model.graph.node if node.op_type == op_type]


@pytest.mark.parametrize("case, op_type, inputs, adds", [
    ("conv2d_bias_add", "Conv", [3], 0),
    ("conv2d_bias_add_shared", "Conv", [2], 1),
    ("dense_weight_input_bias", "Gemm", [3], 0),
    ("dense_weight_input_bias_first", "Gemm", [3], 0),
    ("dense_weight_input_bias_shared", "Gemm", [2], 1),
])
def test_bias_is_the_conv_or_gemm_input_where_nothing_else_reads_the_product(case, op_type, inputs, adds):
    # onnxruntime fuses DequantizeLinear -> Conv / Gemm -> QuantizeLinear with a bias only in this form;
    # the numbers are checked by test_onnx_conversion_matches_tvm.
    model = relay_to_onnx.to_onnx(CASES[case]()[0])
    assert _node_inputs(model, op_type) == inputs
    assert _op_types(model).count("Add") == adds


# --------------------------------------------------------------------------
# Quantization: qnn.quantize / qnn.dequantize
# --------------------------------------------------------------------------
#: (shape, axis): the channel axis of per-channel scales, positive and negative.
QNN_SHAPES = {"nchw": ((2, 4, 5, 5), 1), "rows": ((6, 10), -1), "cols": ((3, 7), 0)}


def _scale_zero(dtype, channels, per_channel):
    """A constant scale and zero point near the middle of ``dtype`` (0 for int8, 128 for uint8)."""
    info = np.iinfo(dtype)
    middle = (int(info.min) + int(info.max) + 1) // 2
    if per_channel:
        return RNG.uniform(0.01, 0.1, channels).astype("float32"), (middle + RNG.integers(-20, 20, channels)).astype(
            "int32")
    return np.float32(0.05), np.int32(middle + 3)


def _broadcastable(scale, ndim, axis):
    return np.reshape(scale, [-1 if i == axis % ndim else 1 for i in range(ndim)]) if np.ndim(scale) else scale


def _off_ties(data, scale, axis):
    """``data`` with none of ``data / scale`` at a rounding tie (a half integer): TVM's generic lowering rounds
    ties away from zero, ONNX to even (see test_quantize_ties_round_to_even_as_onnx_does)."""
    ratio = data / _broadcastable(scale, data.ndim, axis)  # float32 / float32: IEEE, as both runtimes divide
    ties = np.abs(ratio - np.trunc(ratio)) == 0.5
    return np.where(ties, np.nextafter(data, np.float32(np.inf)), data)


def _quantize_case(dtype, per_channel, shape_name):
    def build():
        shape, axis = QNN_SHAPES[shape_name]
        scale, zero = _scale_zero(dtype, shape[axis], per_channel)
        x = relay.var("x", shape=shape)
        q = relay.qnn.op.quantize(x, relay.const(scale), relay.const(zero), axis=axis, out_dtype=dtype)
        # Wide enough that both ends saturate.
        data = (RNG.standard_normal(shape) * 8).astype("float32")
        return relay.Function([x], q), [_off_ties(data, scale, axis)]
    return build


def _dequantize_case(dtype, per_channel, shape_name):
    def build():
        shape, axis = QNN_SHAPES[shape_name]
        scale, zero = _scale_zero(dtype, shape[axis], per_channel)
        x = relay.var("x", shape=shape, dtype=dtype)
        return relay.Function([x], relay.qnn.op.dequantize(x, relay.const(scale), relay.const(zero), axis=axis)), [
            _integers(shape, dtype)]
    return build


def _dequantize_bias():
    # A quantizer's bias: int32 with per-channel scales and zero points of 0.
    x = relay.var("x", shape=(2, 8), dtype="int32")
    scale = RNG.uniform(1e-5, 1e-3, 8).astype("float32")
    d = relay.qnn.op.dequantize(x, relay.const(scale), relay.const(np.zeros(8, "int32")), axis=1)
    data = RNG.integers(-2**31, 2**31 - 1, (2, 8)).astype("int32")
    return relay.Function([x], d), [data]


QNN_CASES = {
    f"{op}_{dtype}_{'per_channel' if per_channel else 'per_tensor'}_{shape}": make(dtype, per_channel, shape)
    for op, make in (("quantize", _quantize_case), ("dequantize", _dequantize_case))
    for dtype in ("int8", "uint8") for per_channel in (False, True) for shape in QNN_SHAPES
}
QNN_CASES["dequantize_int32_bias"] = _dequantize_bias


@pytest.mark.parametrize("case", sorted(QNN_CASES))
def test_quantize_and_dequantize_match_tvm_element_for_element(case):
    func, inputs = QNN_CASES[case]()
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]
    assert relay_to_onnx.supported(typed.body)
    model = relay_to_onnx.to_onnx(typed)
    assert _op_types(model)[0] == ("QuantizeLinear" if case.startswith("quantize") else "DequantizeLinear")
    # Scale and zero point are initializers, not inputs.
    assert [value.name for value in model.graph.input] == ["in0"]
    expected = _tvm_reference(func, inputs)
    got = _ort_run(model, inputs)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_quantize_ties_round_to_even_as_onnx_does(dtype):
    # The one difference from TVM's generic lowering of qnn.quantize, which rounds ties away from zero:
    # claimed anyway, see the converter's docstring. Everywhere else the two agree (the test above).
    zero = 0 if dtype == "int8" else 128
    x = relay.var("x", shape=(8,))
    func = relay.Function([x], relay.qnn.op.quantize(x, relay.const(0.5), relay.const(zero), out_dtype=dtype))
    data = np.array([0.25, 0.75, 1.25, -0.25, -0.75, -1.25, 0.3, 1.0], "float32")  # six ties, then two others
    got = _ort_run(relay_to_onnx.to_onnx(func), [data])
    tvm_out = _tvm_reference(func, [data])
    np.testing.assert_array_equal(got.astype(int) - zero, np.round(data / 0.5))  # half to even
    np.testing.assert_array_equal(tvm_out.astype(int) - zero, np.sign(data) * np.floor(np.abs(data / 0.5) + 0.5))
    assert np.count_nonzero(got != tvm_out) == 4  # 0.5 -> 0 vs 1, 2.5 -> 2 vs 3, and their negatives


def _qdq_region(kind):
    """uint8 in, uint8 out: ``quantize(op(dequantize(x), dequantize(w)) + dequantize(bias))``, as a quantizer
    writes a layer, with per-channel int8 weights and an int32 bias. ``conv_large``: a 72 KiB weight, which
    partitions take as a parameter (``packed_call.lift_constants``). Weights within what the runtimes
    multiply exactly here (:func:`conftest.runtime_exact_weight_bound`)."""
    x_scale, y_scale = 0.02, 0.05
    bound = runtime_exact_weight_bound()
    if kind.startswith("conv"):
        cin, channels = (128, 64) if kind == "conv_large" else (4, 8)
        shape = (1, cin, 9, 9)
        w = RNG.integers(-bound, bound, (channels, cin, 3, 3), endpoint=True).astype("int8")
        x_scale /= np.sqrt(cin / 4)  # the sum's spread, so that the output does not saturate
    else:
        shape, channels = (3, 16), 8
        w = RNG.integers(-bound, bound, (channels, 16), endpoint=True).astype("int8")
    w_scale = RNG.uniform(0.002, 0.01, channels).astype("float32")
    bias = RNG.integers(-500, 500, channels).astype("int32")
    x = relay.var("x", shape=shape, dtype="uint8")
    data = relay.qnn.op.dequantize(x, relay.const(np.float32(x_scale)), relay.const(128))
    weight = relay.qnn.op.dequantize(relay.const(w), relay.const(w_scale), relay.const(np.zeros(channels, "int32")),
                                     axis=0)
    b = relay.qnn.op.dequantize(relay.const(bias), relay.const((w_scale * np.float32(x_scale)).astype("float32")),
                                relay.const(np.zeros(channels, "int32")), axis=0)
    if kind.startswith("conv"):
        y = relay.nn.bias_add(relay.nn.conv2d(data, weight, padding=(1, 1), channels=channels, kernel_size=(3, 3)), b)
    else:
        y = relay.add(relay.nn.dense(data, weight), b)
    out = relay.qnn.op.quantize(y, relay.const(np.float32(y_scale)), relay.const(100), out_dtype="uint8")
    return relay.Function([x], out), [_integers(shape, "uint8")]


@pytest.mark.parametrize("kind, fused", [("conv", "QLinearConv"), ("dense", "QGemm")])
def test_quantized_layer_runs_as_one_integer_kernel_in_onnxruntime(kind, fused, tmp_path):
    func, inputs = _qdq_region(kind)
    typed = relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]
    model = relay_to_onnx.to_onnx(typed)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    onnx = pytest.importorskip("onnx")
    optimized = [node.op_type for node in onnx.load(str(tmp_path / "optimized.onnx")).graph.node]
    assert fused in optimized and "Conv" not in optimized and "Gemm" not in optimized, optimized
    got = session.run(None, {"in0": inputs[0]})[0]
    expected = _tvm_reference(func, inputs)
    assert got.dtype == expected.dtype == np.uint8
    # The integer kernel requantizes its int32 sum; TVM quantizes a float32 sum: one step apart at most,
    # where the two sums fall on either side of a rounding boundary.
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 1
