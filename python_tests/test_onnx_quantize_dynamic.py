"""onnxruntime's dynamic quantization imports: ``MatMulInteger``, ``ConvInteger``, ``DynamicQuantizeLinear``.

Each integer op, for every pair of ``uint8``/``int8`` inputs and zero-point form
(none, constant scalar, per column / per output channel, computed at run time),
built by TVM after ``import tvm_tcutils`` for plain ``llvm`` and for this CPU
(:func:`tvm_tcutils.host_target`, where the int8 dot-product kernels take the
ops), must equal onnxruntime's int32 results and numpy's int64 product exactly.

The weights of the graphs that onnxruntime also runs stay within [-64, 63]
(int8) or [64, 191] (uint8): onnxruntime's AVX2 kernel without VNNI adds u8 x s8
byte pairs in a saturating int16 (docs/dotprod.md), so on such CPUs it is exact
only there. :func:`test_full_range_integer_ops_equal_numpy` covers the full
range against numpy alone.

Whole models quantized by ``onnxruntime.quantization.quantize_dynamic`` (a small
BERT-like encoder and a small CNN; int8 and uint8 weights) load with
:func:`tvm_tcutils.load_model` and agree with onnxruntime within the float
tolerance of the dequantization: see :func:`test_quantize_dynamic_models_match_onnxruntime`.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

import tvm_tcutils
from tvm_tcutils.models import ModelError

from conftest import build_and_run

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.timeout(600)

PAIRS = [("uint8", "int8"), ("uint8", "uint8"), ("int8", "int8"), ("int8", "uint8")]
TARGETS = ["llvm", "host"]
ONNX_TYPES = {"uint8": TensorProto.UINT8, "int8": TensorProto.INT8, "int16": TensorProto.INT16,
              "float32": TensorProto.FLOAT}


def _target(name: str) -> str:
    return tvm_tcutils.host_target() if name == "host" else name


def _model(nodes, inputs: dict, outputs: dict, initializers: dict):
    """A checked opset-17 model: ``inputs`` name -> array (graph inputs), ``outputs`` name -> int32 shape,
    ``initializers`` name -> array."""
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(name, ONNX_TYPES[str(v.dtype)], v.shape) for name, v in inputs.items()],
        [helper.make_tensor_value_info(name, TensorProto.INT32, shape) for name, shape in outputs.items()],
        initializer=[numpy_helper.from_array(np.asarray(v), name) for name, v in initializers.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _ort(model, feeds: dict) -> list:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _tvm(model, feeds: dict, target: str) -> list:
    mod, params = relay.frontend.from_onnx(model, freeze_params=True)
    return build_and_run(mod, params, feeds, target=_target(target))


def _ints(rng, dtype: str, shape, low=None, high=None) -> np.ndarray:
    info = np.iinfo(dtype)
    low = info.min if low is None else low
    high = info.max if high is None else high
    return rng.integers(low, high + 1, size=shape).astype(dtype)


def _weights(rng, dtype: str, shape, full: bool) -> np.ndarray:
    """Weights onnxruntime multiplies exactly on any x86 CPU, or (``full``) over the whole range."""
    if full:
        return _ints(rng, dtype, shape)
    return _ints(rng, dtype, shape, -64, 63) if dtype == "int8" else _ints(rng, dtype, shape, 64, 191)


def _scalar(value: int, dtype: str) -> np.ndarray:
    return np.array(value, dtype=dtype)


def _mm(a, b, za=0, zb=0) -> np.ndarray:
    """``MatMulInteger`` in int64 numpy (zero points broadcast as ONNX's per-row / per-column ones)."""
    out = np.matmul(a.astype(np.int64) - np.asarray(za, np.int64), b.astype(np.int64) - np.asarray(zb, np.int64))
    assert np.abs(out).max() < 2 ** 31
    return out.astype(np.int32)


def _conv(x, w, zx=0, zw=0, pads=None, strides=None, dilations=None, group=1) -> np.ndarray:
    """``ConvInteger`` in int64 numpy, 1-D or 2-D (the padding holds ``zx``, as onnxruntime's)."""
    rank = x.ndim - 2
    pads = pads or [0] * (2 * rank)
    strides, dilations = strides or [1] * rank, dilations or [1] * rank
    x = np.pad(x.astype(np.int64), [(0, 0), (0, 0)] + [(pads[i], pads[i + rank]) for i in range(rank)],
               constant_values=int(zx)) - int(zx)
    w = w.astype(np.int64) - np.asarray(zw, np.int64).reshape((-1,) + (1,) * (rank + 1))
    span = [(k - 1) * d + 1 for k, d in zip(w.shape[2:], dilations)]
    windows = np.lib.stride_tricks.sliding_window_view(x, span, axis=tuple(range(2, 2 + rank)))
    windows = windows[(Ellipsis,) + tuple(slice(None, None, d) for d in dilations)]  # dilation
    windows = windows[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)]  # stride
    cin, cout = w.shape[1], w.shape[0]
    outs = []
    for g in range(group):
        part = windows[:, g * cin:(g + 1) * cin]  # (N, cin, *out, *kernel)
        kernel = w[g * cout // group:(g + 1) * cout // group]  # (cout/g, cin, *kernel)
        o, k = "hw"[-rank:], "pq"[:rank]
        out = np.einsum(f"nc{o}{k},oc{k}->no{o}", part, kernel)
        outs.append(out)
    return np.concatenate(outs, axis=1).astype(np.int32)


# --------------------------------------------------------------------------
# MatMulInteger and ConvInteger
# --------------------------------------------------------------------------
class _Graph:
    """Integer-op nodes and their numpy references, for one model (and one without the nodes onnxruntime refuses)."""

    def __init__(self):
        self.nodes, self.feeds, self.consts, self.refs, self.ort_refuses = [], {}, {}, {}, set()

    def add(self, op: str, output: str, inputs, ref: np.ndarray, ort: bool = True, **attrs) -> None:
        self.nodes.append(helper.make_node(op, inputs, [output], **attrs))
        self.refs[output] = ref
        if not ort:
            self.ort_refuses.add(output)

    def only(self, outputs) -> None:
        """Keep the nodes of ``outputs`` alone."""
        self.nodes = [node for node in self.nodes if node.output[0] in outputs]
        self.refs = {name: ref for name, ref in self.refs.items() if name in outputs}

    def model(self, for_ort: bool = False):
        keep = [node for node in self.nodes if not (for_ort and node.output[0] in self.ort_refuses)]
        used = {name for node in keep for name in node.input}
        return _model(keep, {k: v for k, v in self.feeds.items() if k in used},
                      {node.output[0]: self.refs[node.output[0]].shape for node in keep},
                      {k: v for k, v in self.consts.items() if k in used})


def _add_matmuls(g: _Graph, a_dtype: str, b_dtype: str, rng, full: bool) -> None:
    """A MatMulInteger per shape and zero-point form."""
    k, n = 40, 24
    g.feeds.update({"a2": _ints(rng, a_dtype, (6, k)), "a3": _ints(rng, a_dtype, (2, 5, k)),
                    "b3_in": _weights(rng, b_dtype, (2, k, n), full), "vec": _ints(rng, a_dtype, (k,)),
                    "a4": _ints(rng, a_dtype, (2, 1, 3, k)),
                    "az_in": _ints(rng, a_dtype, ()), "bz_in": _ints(rng, b_dtype, ())})
    g.consts.update({"b": _weights(rng, b_dtype, (k, n), full), "b3": _weights(rng, b_dtype, (2, k, n), full),
                     "az": _scalar(7 if a_dtype == "uint8" else -5, a_dtype),
                     "bz": _scalar(3 if b_dtype == "uint8" else -2, b_dtype),
                     "bz_col": _ints(rng, b_dtype, (n,), 0, 100), "bz_col3": _ints(rng, b_dtype, (2, 1, n), 0, 100),
                     "az_row": _ints(rng, a_dtype, (6,), 0, 100)})
    v = {**g.feeds, **g.consts}
    for output, inputs in {
        "none_2d": ["a2", "b"],
        "scalar_2d": ["a2", "b", "az", "bz"],
        "column_2d": ["a2", "b", "az", "bz_col"],
        "column_3d": ["a3", "b", "az", "bz_col"],
        "runtime_zp_3d": ["a3", "b", "az_in", "bz_col"],  # a_zero_point as DynamicQuantizeLinear gives it
        "batched": ["a3", "b3", "az", "bz"],
        "batched_column": ["a3", "b3", "az", "bz_col3"],
        "batched_runtime": ["a3", "b3_in", "az_in", "bz_in"],  # both operands at run time (attention)
        "broadcast_4d": ["a4", "b3", "az", "bz"],  # batch axes (2, 1) and (2,) broadcast to (2, 2)
    }.items():
        g.add("MatMulInteger", output, inputs, _mm(*[v[name] for name in inputs]))
    # ONNX allows a per-row a_zero_point, onnxruntime does not: numpy is the reference. 1-D A: numpy's rule.
    g.add("MatMulInteger", "row_2d", ["a2", "b", "az_row", "bz_col"],
          _mm(v["a2"], v["b"], v["az_row"][:, None], v["bz_col"]), ort=False)
    g.add("MatMulInteger", "vector", ["vec", "b", "az", "bz"], _mm(v["vec"], v["b"], v["az"], v["bz"]))


def _add_convs(g: _Graph, x_dtype: str, w_dtype: str, rng, full: bool) -> None:
    """A ConvInteger per padding, stride, grouping and zero-point form."""
    g.feeds.update({"x": _ints(rng, x_dtype, (1, 8, 9, 9)), "x1d": _ints(rng, x_dtype, (2, 8, 10)),
                    "xz_in": _ints(rng, x_dtype, ())})
    g.consts.update({"w": _weights(rng, w_dtype, (16, 8, 3, 3), full),
                     "w2": _weights(rng, w_dtype, (16, 8, 2, 2), full),
                     "wg": _weights(rng, w_dtype, (16, 4, 3, 3), full),
                     "wdw": _weights(rng, w_dtype, (8, 1, 3, 3), full), "w1d": _weights(rng, w_dtype, (4, 8, 3), full),
                     "xz": _scalar(9 if x_dtype == "uint8" else -3, x_dtype),
                     "wz": _scalar(4 if w_dtype == "uint8" else -1, w_dtype),
                     "wz16": _ints(rng, w_dtype, (16,), 0, 100), "wz8": _ints(rng, w_dtype, (8,), 0, 100)})
    v = {**g.feeds, **g.consts}

    def conv(output, inputs, ort=True, **attrs):
        ref = _conv(*[v[name] for name in inputs], **attrs)
        g.add("ConvInteger", output, inputs, ref, ort, **attrs)

    conv("none", ["x", "w"])
    conv("padded_stride", ["x", "w", "xz", "wz"], pads=[1, 1, 1, 1], strides=[2, 2])
    # auto_pad: the pads the reference uses are what SAME_UPPER / SAME_LOWER make of these shapes.
    same = _conv(v["x"], v["w"], v["xz"], v["wz"], pads=[1, 1, 1, 1], strides=[2, 2])
    g.add("ConvInteger", "same_upper", ["x", "w", "xz", "wz"], same, auto_pad="SAME_UPPER", strides=[2, 2])
    lower = _conv(v["x"], v["w2"], v["xz"], v["wz"], pads=[1, 1, 0, 0])
    g.add("ConvInteger", "same_lower", ["x", "w2", "xz", "wz"], lower, auto_pad="SAME_LOWER")
    conv("grouped", ["x", "wg", "xz", "wz"], pads=[1, 1, 1, 1], group=2)
    conv("depthwise", ["x", "wdw", "xz", "wz"], pads=[1, 1, 1, 1], group=8)
    conv("runtime_zp_dilated", ["x", "w", "xz_in", "wz"], pads=[1, 2, 1, 0], dilations=[2, 2])
    conv("conv1d", ["x1d", "w1d", "xz", "wz"], pads=[1, 1], strides=[2])
    # Per-output-channel w_zero_point: valid ONNX that onnxruntime refuses; numpy is the reference.
    conv("channel_padded", ["x", "w", "xz", "wz16"], ort=False, pads=[1, 1, 1, 1], strides=[2, 2])
    conv("channel_grouped_runtime", ["x", "wg", "xz_in", "wz16"], ort=False, pads=[0, 1, 1, 0], group=2)
    conv("channel_depthwise", ["x", "wdw", "xz", "wz8"], ort=False, pads=[1, 1, 1, 1], group=8)


def _integer_graph(a_dtype: str, b_dtype: str, full: bool = False, seed: int = 0) -> _Graph:
    rng = np.random.default_rng(seed)
    g = _Graph()
    _add_matmuls(g, a_dtype, b_dtype, rng, full)
    _add_convs(g, a_dtype, b_dtype, rng, full)
    return g


#: The nodes every signedness pair runs (what legalization and zero points change with the pair);
#: u8 x s8, quantize_dynamic's default, runs every node (shapes, paddings, 1-D, per row).
EVERY_PAIR = {"scalar_2d", "column_3d", "runtime_zp_3d", "batched_runtime", "padded_stride", "grouped", "depthwise",
              "runtime_zp_dilated", "channel_padded"}


# s8 x u8 (the least used pair; its legalization is u8 x s8's mirror) under -m slow, as TVM's own path;
# s8 x s8 too (int8 activations: quantize_dynamic's DynamicQuantizeLinear makes uint8 ones): by default the
# int8-data kernels are checked by dotprod/test_int8_op_sweep.py (every */i8xi8 case on VNNI, exact against
# numpy) and the ONNX import of int8 activations by test_onnx_import.py (QLinearMatMul int8); u8 x u8
# (quantize_dynamic's QUInt8 weights) too: by default test_quantize_dynamic_models_match_onnxruntime
# [cnn-QUInt8-False] runs its ConvInteger and MatMulInteger against onnxruntime on this CPU.
@pytest.mark.parametrize("a_dtype, b_dtype, target", [
    # u8 x i8 on this CPU too under -m slow since session 43 (20 s on a slow VM; the CI budget): by default
    # test_quantize_dynamic_models_match_onnxruntime and test_full_range_integer_ops_equal_numpy build
    # MatMulInteger / ConvInteger for this CPU against onnxruntime and numpy.
    pytest.param(*pair, "host", marks=pytest.mark.slow) for pair in PAIRS] + [
    # TVM's own int8 path, for quantize_dynamic's default (QInt8) weights (30 s: under -m slow)
    pytest.param("uint8", "int8", "llvm", marks=pytest.mark.slow),
])
def test_integer_ops_equal_onnxruntime(a_dtype, b_dtype, target):
    g = _integer_graph(a_dtype, b_dtype)
    if (a_dtype, b_dtype) != ("uint8", "int8"):
        g.only(EVERY_PAIR)
    got = dict(zip(g.refs, _tvm(g.model(), g.feeds, target)))
    ort_model = g.model(for_ort=True)
    used = {name for node in ort_model.graph.node for name in node.input}
    expected = dict(zip([o.name for o in ort_model.graph.output],
                        _ort(ort_model, {k: v for k, v in g.feeds.items() if k in used})))
    for name, ref in g.refs.items():
        assert got[name].dtype == np.int32, name
        if name in expected:
            np.testing.assert_array_equal(expected[name], ref, err_msg=f"onnxruntime vs numpy: {name}")
        np.testing.assert_array_equal(got[name], ref, err_msg=f"TVM: {name} ({a_dtype} x {b_dtype}, {target})")


def test_full_range_integer_ops_equal_numpy():
    # u8 x s8 over the whole int8 range (where onnxruntime's AVX2 kernel may saturate, and where the
    # package's AVX2 kernels take the exact step instead of the 8-bit one): numpy is the reference.
    g = _integer_graph("uint8", "int8", full=True, seed=5)
    g.only({"scalar_2d", "column_3d", "batched", "padded_stride", "channel_grouped_runtime"})
    for (name, ref), out in zip(g.refs.items(), _tvm(g.model(), g.feeds, "host")):
        np.testing.assert_array_equal(out, ref, err_msg=name)


# --------------------------------------------------------------------------
# DynamicQuantizeLinear
# --------------------------------------------------------------------------
def _dql_model(shape) -> onnx.ModelProto:
    """One ``DynamicQuantizeLinear`` of a float input ``x`` of ``shape``."""
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zp"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)], [
        helper.make_tensor_value_info("y", TensorProto.UINT8, shape),
        helper.make_tensor_value_info("scale", TensorProto.FLOAT, []),
        helper.make_tensor_value_info("zp", TensorProto.UINT8, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_dynamic_quantize_linear_equals_onnxruntime():
    # Ties (x / scale = k + 0.5) round to even as in onnxruntime; an all-zero tensor gets scale 1.
    rng = np.random.default_rng(2)
    cases = {
        "normal": rng.standard_normal((4, 33)).astype("float32"),
        "positive": rng.uniform(0.5, 3.0, (4, 33)).astype("float32"),
        "negative": -rng.uniform(0.5, 3.0, (4, 33)).astype("float32"),
        "ties": np.concatenate([np.arange(-20, 235, dtype="float32") + 0.5, [-20.0, 235.0]]).astype("float32"),
        "zeros": np.zeros((3, 5), "float32"),
        # Rows of a multiple of 32 columns are halved elementwise before the reduction, min and max side by
        # side (_min_max): 256 -> 32, 96 -> 48, 768 and 3072 -> 48 (BERT-base's widths).
        "wide": rng.standard_normal((2, 8, 256)).astype("float32"),
        "wide-positive": rng.uniform(0.5, 3.0, (3, 96)).astype("float32"),
        "wide-negative": -rng.uniform(0.5, 3.0, (1, 1024)).astype("float32"),
        "wide-768": rng.standard_normal((5, 768)).astype("float32"),
        "wide-3072-positive": rng.uniform(0.5, 3.0, (2, 3072)).astype("float32"),
        "not-halved-48": rng.standard_normal((3, 48)).astype("float32"),
        # ... and rows halved down to 8 (128 tokens -> 8), the extremes anywhere.
        "tokens": rng.standard_normal((1, 128, 256)).astype("float32") * np.float32(3.0),
    }
    for name, x in cases.items():
        model = _dql_model(x.shape)
        expected = _ort(model, {"x": x})
        got = _tvm(model, {"x": x}, "host")
        for what, out, ref in zip(("y", "scale", "zp"), got, expected):
            np.testing.assert_array_equal(out, ref, err_msg=f"{name}: {what}")


@pytest.mark.parametrize("cols", [256, 768])
def test_dynamic_quantize_linear_takes_min_and_max_in_one_kernel(cols):
    # The min and max halving trees run side by side in one kernel, kept apart from the final reduction:
    # fused into it, TVM copied the first slices (and the reshape) out in kernels of their own.
    from tvm_tcutils._tvm import host_target
    from tvm_tcutils.onnx_quantize_dynamic import dynamic_quantize_linear

    x = relay.var("x", shape=(128, cols))
    out = dynamic_quantize_linear([x], {}, {})
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], out.astuple())), target=host_target())
    names = [n for n in lib.function_metadata.keys() if n.startswith("tvmgen_")]
    trees = [n for n in names if "maximum" in n and "strided_slice" in n]
    assert len(trees) == 1, names
    assert not any(n.endswith(("_fused_strided_slice", "_fused_reshape")) or "_fused_strided_slice_" in n
                   and "maximum" not in n for n in names), names


def test_dynamic_quantize_linear_of_a_wide_input_splits_its_tree_for_the_build():
    # BERT-base's FF-down input [128, 3072]: 6 column and 4 row halvings, 1024 reads per output in one kernel,
    # took TVM's TIR common-subexpression pass 38 s. The halvings past FUSED_HALVINGS go to a second kernel.
    from tvm.contrib import graph_executor

    from tvm_tcutils._tvm import host_target
    from tvm_tcutils.fast_forms import FUSED_HALVINGS
    from tvm_tcutils.onnx_quantize_dynamic import dynamic_quantize_linear

    x = relay.var("x", shape=(128, 3072))
    out = dynamic_quantize_linear([x], {}, {})
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], out.astuple())), target=host_target())
    trees = [n for n in lib.function_metadata.keys() if n.startswith("tvmgen_") and "maximum" in n
             and "strided_slice" in n]
    assert FUSED_HALVINGS < 10 and len(trees) == 2, trees
    m = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    data = np.random.default_rng(4).standard_normal((128, 3072)).astype("float32")
    data[77, 1234], data[3, 3071] = 9.5, -7.25  # the extremes anywhere
    m.set_input("x", data)
    m.run()
    expected = _ort(_dql_model(data.shape), {"x": data})
    for what, k, ref in zip(("y", "scale", "zp"), range(3), expected):
        np.testing.assert_array_equal(m.get_output(k).numpy(), ref, err_msg=what)


def test_matmul_integer_of_rows_leaves_its_epilogue_to_the_dense_kernel():
    # quantize_dynamic's MatMulInteger of a 2-D A, then Cast and Mul by the scales: TVM fuses those into
    # the dense's kernel only when no reshape (even to the same shape) comes between.
    from conftest import host_dot_target
    from tvm_tcutils.onnx_quantize_dynamic import matmul_integer

    rng = np.random.default_rng(9)
    weight = rng.integers(-128, 128, (64, 32)).astype("int8")
    a, za = relay.var("a", shape=(16, 64), dtype="uint8"), relay.var("za", shape=(), dtype="uint8")
    y = matmul_integer([a, relay.const(weight), za], {}, {})
    out = relay.multiply(relay.cast(y, "float32"), relay.const(0.5, "float32"))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([a, za], out)), target=host_dot_target())
    names = [n for n in lib.function_metadata.keys() if n.startswith("tvmgen_")]
    dense = [n for n in names if "dense" in n]
    assert len(dense) == 1 and "cast" in dense[0] and "multiply" in dense[0], names
    data, zero = rng.integers(0, 256, (16, 64)).astype("uint8"), np.array(7, "uint8")
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(a=data, za=zero)
    runner.run()
    want = (data.astype("int64") - 7) @ weight.astype("int64") * 0.5
    np.testing.assert_array_equal(runner.get_output(0).numpy(), want.astype("float32"))


# --------------------------------------------------------------------------
# Whole models through quantize_dynamic
# --------------------------------------------------------------------------
def _small_cnn():
    from tvm_tcutils.onnx_writer import OnnxGraph

    rng = np.random.default_rng(4)
    g = OnnxGraph("cnn")
    g.input("input", "float32", [1, 3, 16, 16])
    w1 = g.const(rng.normal(0, 0.3, (16, 3, 3, 3)).astype("float32"), "w")
    w2 = g.const(rng.normal(0, 0.1, (16, 16, 3, 3)).astype("float32"), "w")
    y = g.node("Relu", [g.node("Conv", ["input", w1, g.const(np.zeros(16, "float32"), "b")],
                                kernel_shape=[3, 3], pads=[1] * 4, strides=[2, 2])])
    y = g.node("Relu", [g.node("Conv", [y, w2], kernel_shape=[3, 3], pads=[1] * 4)])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y])], axis=1)
    y = g.node("Gemm", [y, g.const(rng.normal(0, 0.3, (10, 16)).astype("float32"), "fc"),
                        g.const(rng.normal(0, 0.1, 10).astype("float32"), "fcb")], transB=1)
    g.output(y, "float32", [1, 10])
    return g.model()


def _small_encoder():
    from tvm_tcutils.models import bert_onnx

    return bert_onnx(layers=1, seq=8, hidden=32, heads=2, seed=1)


def _quantize_dynamic(tmp_path, model_name: str, weight_type: str, per_channel: bool = False):
    """The small float model quantized by onnxruntime's quantize_dynamic: (path, ONNX model)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    float_model = _small_encoder() if model_name == "encoder" else _small_cnn()
    source, path = tmp_path / "float.onnx", tmp_path / f"{model_name}-{weight_type}-dynamic.onnx"
    onnx.save(float_model, str(source))
    quantize_dynamic(str(source), str(path), weight_type=getattr(QuantType, weight_type), per_channel=per_channel)
    quantized = onnx.load(str(path))
    ops = {node.op_type for node in quantized.graph.node}
    assert "DynamicQuantizeLinear" in ops and ops & {"MatMulInteger", "ConvInteger"}, ops
    return str(path), quantized


# The default run: the CNN with uint8 weights; the others (about 70 s) under -m slow. The encoder with
# quantize_dynamic's default int8 weights is checked against onnxruntime by default in
# dotprod/test_encoder_routes.py (its "dynamic" route, built by relay.build for this CPU).
@pytest.mark.parametrize("model_name, weight_type, per_channel", [
    pytest.param("encoder", "QInt8", False, marks=pytest.mark.slow),
    pytest.param("encoder", "QUInt8", False, marks=pytest.mark.slow),
    pytest.param("encoder", "QUInt8", True, marks=pytest.mark.slow),
    pytest.param("cnn", "QInt8", False, marks=pytest.mark.slow), ("cnn", "QUInt8", False),
])
def test_quantize_dynamic_models_match_onnxruntime(tmp_path, model_name, weight_type, per_channel):
    path, quantized = _quantize_dynamic(tmp_path, model_name, weight_type, per_channel)
    mod, params = tvm_tcutils.load_model(path)
    shape = [d.dim_value for d in quantized.graph.input[0].type.tensor_type.shape.dim]
    data = np.random.default_rng(0).standard_normal(shape).astype("float32")
    expected = _ort(quantized, {"input": data})[0]
    got = build_and_run(mod, params, {"input": data}, target=tvm_tcutils.host_target())[0]
    # The integer ops are exact and DynamicQuantizeLinear rounds as onnxruntime does; the float ops
    # around them (LayerNorm, Erf, Softmax, the dequantizing Mul) differ in the last bits (observed:
    # at most 3e-7 of the output's largest magnitude). Such a difference could move one activation
    # across a rounding boundary of DynamicQuantizeLinear, one step of its scale: the bound, 1e-3 of
    # the largest magnitude, leaves room for that and is still 10x below the quantization error itself
    # (1-2 % of it against the float model).
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-3 * float(np.abs(expected).max()))


# The encoder also in python_tests/dotprod/test_encoder_routes.py (its dense on the ISA's instruction).
@pytest.mark.parametrize("model_name, weight_type, ops", [
    pytest.param("encoder", "QInt8", {"tcutils.dense_dot"}, marks=pytest.mark.slow),
    ("cnn", "QUInt8", {"tcutils.dense_dot", "tcutils.conv2d_nchw_dot"}),
])
def test_quantize_dynamic_models_reach_the_dot_product_kernels(tmp_path, model_name, weight_type, ops):
    from conftest import host_dot_target
    from tvm import autotvm

    target = host_dot_target()
    mod, params = tvm_tcutils.load_model(_quantize_dynamic(tmp_path, model_name, weight_type)[0])
    tasks = autotvm.task.extract_from_program(mod["main"], target=target, params=params)
    names = {task.name for task in tasks}
    # The integer denses and convs are the package's; what is left is the encoder's two attention
    # matmuls, which quantize_dynamic keeps in float: TVM's float dense, one per head
    # (fast_forms.dense_per_batch), not its x86 batch_matmul.
    assert {name for name in names if name.startswith("tcutils.")} == ops, names
    assert names - ops == ({"dense_pack.x86", "dense_nopack.x86"} if model_name == "encoder" else set()), names


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------
@pytest.mark.parametrize("op, inputs, out_shape, error, words", [
    ("MatMulInteger", {"a": ("int16", (2, 4)), "b": ("int8", (4, 3))}, (2, 3), TypeError,
     ["input A ('a') is int16", "A must be one of uint8, int8"]),
    ("MatMulInteger", {"a": ("uint8", (2, 4)), "b": ("int8", (4, 3)), "az": ("int8", ())}, (2, 3), TypeError,
     ["input a_zero_point is int8 but A is uint8"]),
    ("MatMulInteger", {"a": ("uint8", (2, 4)), "b": ("int8", (4, 3)), "az": ("uint8", ()), "bz": ("int8", (2,))},
     (2, 3), ValueError, ["input b_zero_point has shape [2]", "a scalar or 3 values"]),
    ("ConvInteger", {"x": ("uint8", (1, 2, 4, 4)), "w": ("float32", (3, 2, 1, 1))}, (1, 3, 4, 4), TypeError,
     ["input w ('w') is float32", "w must be one of uint8, int8"]),
    ("ConvInteger", {"x": ("uint8", (1, 2, 4, 4, 4)), "w": ("int8", (3, 2, 1, 1, 1))}, (1, 3, 4, 4, 4), ValueError,
     ["only 1-D and 2-D convolutions"]),
])
def test_unsupported_integer_ops_fail_clearly(tmp_path, op, inputs, out_shape, error, words):
    feeds = {name: np.zeros(shape, dtype) for name, (dtype, shape) in inputs.items()}
    model = _model([helper.make_node(op, list(inputs), ["y"], name="bad")], feeds, {"y": out_shape}, {})
    with pytest.raises(error) as info:
        relay.frontend.from_onnx(model, freeze_params=True)
    for word in [f"{op} node 'bad'"] + words:
        assert word in str(info.value)
    path = tmp_path / "bad.onnx"
    onnx.save(model, str(path))
    with pytest.raises(ModelError, match=f"TVM cannot import this ONNX model .*{op} node 'bad'"):
        tvm_tcutils.load_model(str(path))


def test_importer_uses_the_package_converters():
    from tvm.relay.frontend import onnx as frontend

    from tvm_tcutils import _compat
    from tvm_tcutils.onnx_quantize_dynamic import CONVERTERS

    _compat.install_onnx_converters()  # a second install keeps one wrapper over TVM's table
    table = frontend._get_convert_map(17)
    assert all(table[op] is fn for op, fn in CONVERTERS.items())
    assert frontend._get_convert_map.tcutils_original.__module__ == "tvm.relay.frontend.onnx"
    assert tvm.ir.Op.get("qnn.dense")  # what MatMulInteger becomes
