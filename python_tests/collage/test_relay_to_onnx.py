"""Relay-to-ONNX converter: every claimed operator against TVM's own numerics."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

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
}


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
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)


def _ops_of(func):
    ops = set()
    relay.analysis.post_order_visit(
        func, lambda node: ops.add(node.op.name) if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) else None
    )
    return ops


def test_every_claimed_op_has_a_numerics_case():
    covered = set()
    for build in CASES.values():
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
    ],
    ids=["conv2d_nhwc", "layer_norm_axis1", "int32_add", "avg_pool_dilated", "max_pool_nhwc", "dense_fp16", "take"],
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
