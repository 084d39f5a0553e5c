"""Whole int8 models on emulated Hexagon (run_model): bit-exact against the x86 build, and its errors."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

import tvm
from tvm import relay

from tvm_tcutils import models
from tvm_tcutils.dotprod import hexagon_model
from tvm_tcutils.dotprod.hexagon_model import bit_equal
from tvm_tcutils.dotprod.isa import HEXAGON_HVX, for_target
from tvm_tcutils.dotprod.quantize import quantize_int8
from tvm_tcutils.dotprod.topi.intrinsics import dot_product_intrin, target_mode
from test_hexagon import _require_emulator

def _x86(mod, inputs, params=None):
    return hexagon_model.x86_reference(mod, params, inputs)


def _assert_bit_exact(mod, params, inputs, timeout: float = 300):
    """The model on emulated Hexagon against the x86 build of its graph; where they differ, the failure
    names the first node that does (the per-node differential run)."""
    out = hexagon_model.run_model(mod, params, inputs, timeout=timeout)
    ref = _x86(mod, inputs, params)
    if not bit_equal(out, ref):
        pytest.fail(hexagon_model.differential_run(mod, params, inputs, timeout=timeout).summary())
    return out, ref


def _qdq_import(model, tmp_path, samples: int = 2):
    """``model`` (ONNX, float input "input") quantized by onnxruntime's quantize_static (QDQ, u8 activations,
    s8 per-channel weights), imported into Relay as a user loads it; and one input."""
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm_tcutils.dotprod.quantize import ort_quantize

    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    rng = np.random.default_rng(7)
    path = ort_quantize(model, str(tmp_path / "model-qdq.onnx"),
                        [{"input": rng.standard_normal(shape).astype("float32")} for _ in range(samples)])
    mod, params = relay.frontend.from_onnx(onnx.load(path), {"input": shape})
    return mod, params, {"input": rng.standard_normal(shape).astype("float32")}


def _out_of_range_cast():
    """int8 -> float -> int32 by a cast out of int32's range: x86 gives INT_MIN, Hexagon saturates."""
    x = relay.var("x", shape=(2, 8), dtype="int8")
    shifted = relay.cast(relay.add(relay.cast(x, "int32"), relay.const(1)), "int8")
    huge = relay.cast(relay.multiply(relay.cast(shifted, "float32"), relay.const(3e9, "float32")), "int32")
    out = relay.cast(relay.clip(relay.right_shift(huge, relay.const(24)), -128, 127), "int8")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.add(out, relay.const(1, "int8"))))
    return mod, {"x": np.arange(-8, 8, dtype="int8").reshape(2, 8)}


def _float_cnn(seed: int = 0):
    """3 convs (3 input channels, a stride-2 one, a residual add), max pool, dense: float, weights as params."""
    rng = np.random.default_rng(seed)
    x = relay.var("data", shape=(1, 3, 16, 16))
    weights = {"w1": (32, 3, 3, 3), "w2": (32, 32, 3, 3), "w3": (64, 32, 3, 3), "fc": (10, 64 * 4 * 4)}
    v = {name: relay.var(name, shape=shape) for name, shape in weights.items()}
    y = relay.nn.relu(relay.nn.conv2d(x, v["w1"], padding=(1, 1), channels=32, kernel_size=(3, 3)))
    z = relay.nn.relu(relay.add(relay.nn.conv2d(y, v["w2"], padding=(1, 1), channels=32, kernel_size=(3, 3)), y))
    z = relay.nn.relu(relay.nn.conv2d(z, v["w3"], padding=(1, 1), strides=(2, 2), channels=64, kernel_size=(3, 3)))
    z = relay.nn.max_pool2d(z, pool_size=(2, 2), strides=(2, 2))
    out = relay.nn.dense(relay.nn.batch_flatten(z), v["fc"])
    mod = tvm.IRModule.from_expr(relay.Function([x, *v.values()], out))
    params = {name: (rng.standard_normal(shape) * (2.0 / np.prod(shape[1:])) ** 0.5).astype("float32")
              for name, shape in weights.items()}
    return mod, params


def _qnn_cnn(seed: int = 1):
    """A hand-written qnn model: u8 data, i8 weights (HVX vrmpybusv), requantized between layers."""
    rng = np.random.default_rng(seed)
    c = relay.const
    x = relay.var("x", shape=(1, 16, 12, 12), dtype="uint8")
    w1 = rng.integers(-127, 128, (32, 16, 3, 3)).astype("int8")
    w2 = rng.integers(-127, 128, (40, 32, 3, 3)).astype("int8")
    w3 = rng.integers(-127, 128, (10, 40 * 6 * 6)).astype("int8")
    y = relay.qnn.op.conv2d(x, c(w1), c(128), c(0), c(0.05), c(0.01), kernel_size=(3, 3), channels=32, padding=(1, 1))
    y = relay.qnn.op.requantize(y, c(0.0005), c(0), c(0.8), c(128), out_dtype="uint8")
    y = relay.qnn.op.conv2d(y, c(w2), c(128), c(0), c(0.8), c(0.01), kernel_size=(3, 3), channels=40,
                            padding=(1, 1), strides=(2, 2))
    y = relay.qnn.op.requantize(y, c(0.008), c(0), c(10.0), c(128), out_dtype="uint8")
    y = relay.qnn.op.dense(relay.reshape(y, (1, -1)), c(w3), c(128), c(0), c(10.0), c(0.01), units=10)
    y = relay.qnn.op.requantize(y, c(0.1), c(0), c(300.0), c(0), out_dtype="int8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


# ---------------------------------------------------------------- no emulator needed
def test_c_target_gets_hvx_isa_and_extern_tiles():
    target = tvm.target.Target(hexagon_model.DEFAULT_TARGET)
    assert for_target(target) is HEXAGON_HVX and for_target("c") is None
    assert target_mode("llvm", target) == "extern" and target_mode("llvm", "hexagon") == "llvm"
    with target:  # the schedules' default mode, under a C target: the C-helper tile
        c_tile = dot_product_intrin(HEXAGON_HVX, "uint8", "int8")
    with tvm.target.hexagon("v66"):
        llvm_tile = dot_product_intrin(HEXAGON_HVX, "uint8", "int8")
    assert c_tile is dot_product_intrin(HEXAGON_HVX, "uint8", "int8", "extern")
    assert "tcu_vrmpy_ub_b" in str(c_tile.body) and "tcu_vrmpy" not in str(llvm_tile.body)


def test_c_build_applies_the_package_hooks():
    mod = quantize_int8(*_float_cnn())
    graph, source, params = hexagon_model.build_c(mod)
    funcs = [n["attrs"]["func_name"] for n in json.loads(graph)["nodes"] if n["op"] == "tvm_op"]
    # Legalize + alter-layout (packed layouts) and the strategy rows (tiles calling the HVX helpers).
    assert any("conv2d_NCHWc" in f for f in funcs) and any("dense_pack" in f for f in funcs)
    assert set(re.findall(r"\btcu_vrmpy_\w+(?=\()", source)) == {"tcu_vrmpy_b_b"}
    assert "llvm." not in source
    # Every float constant is printed exactly (hex), not rounded to 7 digits.
    assert "0x1." in source and not re.search(r"\d\.\d{6}e[+-]\d+f", source)
    assert {p.dtype for p in params.values()} == {np.dtype("int8")}  # packed weights: parameters, not C literals


@pytest.mark.parametrize("kwargs,error,message", [
    ({"target": "llvm"}, ValueError, "C-source Hexagon target.*got 'llvm'"),
    ({"target": "c -keys=hexagon,cpu -mcpu=hexagonv68"}, ValueError, r"-mcpu one of \('hexagonv66', 'hexagonv67'\)"),
    ({"target": "c -keys=cpu"}, ValueError, "key 'hexagon'"),
    ({"target": 66}, TypeError, "target must be a str or tvm.target.Target"),
    ({"inputs": {"image": "X"}}, ValueError,
     r"exactly main's inputs \['data'\]; missing \['data'\], unknown \['image'\]"),
    ({"inputs": {"data": np.zeros((1, 3, 16, 16), "float64")}}, ValueError,
     r"input 'data' must have shape \(1, 3, 16, 16\) and dtype float32, got \(1, 3, 16, 16\) and float64"),
    ({"inputs": {"data": [[0.0]]}}, TypeError, r"inputs\['data'\] must be a numpy array or tvm.nd.NDArray, got list"),
    ({"inputs": "data"}, TypeError, "inputs must be a dict of name -> array or a list"),
    ({"inputs": []}, ValueError, r"inputs must hold 1 arrays, for \['data'\]; got 0"),
    ({"params": {"w9": np.zeros(1)}}, ValueError, "'w9', which is no parameter of main; choose from"),
    ({"timeout": 0}, ValueError, "timeout must be a positive number"),
    ({"mod": "main"}, TypeError, "mod must be a tvm.IRModule with a 'main' function, got str"),
])
def test_bad_arguments_fail_before_building(kwargs, error, message, monkeypatch):
    mod, params = _float_cnn()
    call = {"mod": mod, "params": params, "inputs": {"data": np.zeros((1, 3, 16, 16), "float32")}, **kwargs}
    # Reaching the build would be a failure of its own: the checks come first.
    monkeypatch.setattr(hexagon_model, "_build_c", lambda *a: pytest.fail("built before checking the arguments"))
    with pytest.raises(error, match=message):
        hexagon_model.run_model(**call)


# ---------------------------------------------------------------- under qemu-hexagon
def test_quantized_cnn_bit_exact_against_x86():
    _require_emulator()
    qmod = quantize_int8(*_float_cnn())
    before = tvm.ir.save_json(qmod)
    data = np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype("float32")
    out = hexagon_model.run_model(qmod, inputs={"data": data}, timeout=120)
    assert tvm.ir.save_json(qmod) == before  # the input module is not modified
    ref = _x86(qmod, {"data": data})
    assert len(out) == len(ref) == 1
    assert out[0].dtype == ref[0].dtype and np.unique(out[0]).size > 5
    # Element for element, the float edges (input quantization, output scale) included.
    np.testing.assert_array_equal(out[0].view("int32"), ref[0].view("int32"))


# Under -m slow: by default test_hexagon_profile.py's ``profiles`` fixture runs this same u8 x i8 QNN CNN
# in the emulator (profile_model: run_model counting instructions, with and without the package's
# schedules) and checks both outputs bit-exact against this x86 build; run_model itself runs by default
# in test_quantized_cnn_bit_exact_against_x86.
@pytest.mark.slow
def test_qnn_u8_i8_cnn_bit_exact_against_x86():
    _require_emulator()
    mod = _qnn_cnn()
    data = np.random.default_rng(3).integers(0, 256, (1, 16, 12, 12)).astype("uint8")
    out = hexagon_model.run_model(mod, inputs=[data], timeout=120)
    ref = _x86(mod, {"x": data})
    assert np.abs(ref[0].astype(int)).max() < 127  # not saturated: a real check
    np.testing.assert_array_equal(out[0], ref[0])


def test_params_tuple_outputs_rounding_and_division():
    """Weights given as params, a tuple of outputs, the runner's own float rounding, square root (NaNs as
    x86 makes them) and integer division."""
    _require_emulator()
    rng = np.random.default_rng(4)
    x = relay.var("x", shape=(2, 8), dtype="int8")
    w = relay.var("w", shape=(40, 8), dtype="int8")
    f = relay.var("f", shape=(12,), dtype="float32")
    r = relay.var("r", shape=(64,), dtype="float32")
    d = relay.var("d", shape=(2, 8), dtype="int32")
    wide = relay.cast(x, "int32")
    compared = [relay.nn.dense(x, w, out_dtype="int32"), relay.round(f), relay.floor(f), relay.ceil(f),
                relay.sqrt(f), relay.sqrt(r),
                # Float division (the runner's, correctly rounded): overflow, subnormal results, NaN.
                relay.divide(r, relay.reverse(r, axis=0)), relay.divide(f, relay.const(7.0, "float32")),
                relay.divide(f, relay.reverse(f, axis=0))]
    # Divisions by tensors: Hexagon has no divide instruction, these call the runner's helpers.
    divisions = [relay.floor_divide(wide * relay.const(1000), d), relay.floor_mod(wide, d),
                 relay.divide(relay.left_shift(relay.cast(wide, "int64"), relay.const(33, "int64")),
                              relay.cast(d, "int64"))]
    mod = tvm.IRModule.from_expr(relay.Function([x, w, f, r, d], relay.Tuple(compared + divisions)))
    params = {"w": rng.integers(-128, 128, (40, 8)).astype("int8")}
    halves = np.array([0.5, 1.5, 2.5, -0.5, -2.5, 0.49999997, -0.49999997, 8388607.5, -8388607.5, 3e9, -0.0, 7.25],
                      "float32")
    # Square roots of any float: subnormals, both ends of the range, ties of no kind (sqrtf rounds exactly).
    roots = np.concatenate([rng.integers(1, 0x7F800000, 56, dtype=np.uint32),
                            [1, 0x7FFFFF, 0x800000, 0x7F7FFFFF, 0x3F800000, 0x3F800001, 0x40000000, 0x80000000]])
    inputs = {"x": rng.integers(-128, 128, (2, 8)).astype("int8"), "f": halves, "r": roots.astype(np.uint32).view("float32"),
              "d": rng.choice([-7, -3, 5, 9, 1000003], (2, 8)).astype("int32")}
    out = hexagon_model.run_model(mod, params, inputs, timeout=120)
    assert len(out) == len(compared + divisions)
    x86 = tvm.IRModule.from_expr(relay.Function([x, w, f, r], relay.Tuple(compared)))
    ref = _x86(x86, {"x": inputs["x"], "f": halves, "r": inputs["r"]}, params)
    for got, want in zip(out, ref):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got.view(f"u{got.dtype.itemsize}"), want.view(f"u{want.dtype.itemsize}"))
    # TVM's x86 build of vectorized integer division fails LLVM's verifier here: numpy is the reference.
    xi, di = inputs["x"].astype("int64"), inputs["d"].astype("int64")
    shifted = xi << 33
    truncated = np.sign(shifted) * np.sign(di) * (np.abs(shifted) // np.abs(di))
    for got, want in zip(out[len(compared):], [(xi * 1000) // di, xi % di, truncated]):
        np.testing.assert_array_equal(got, want.astype(got.dtype))


def test_operator_without_c_form_fails_before_compiling():
    _require_emulator()
    x = relay.var("x", shape=(4,), dtype="float32")
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.exp(x)))
    with pytest.raises(RuntimeError, match=r"for operator exp \(expf, called by tvmgen_default_fused_exp\)"):
        hexagon_model.run_model(mod, inputs={"x": np.zeros(4, "float32")})
    # One TVM's C backend cannot print at all.
    mod = tvm.IRModule.from_expr(relay.Function([x], relay.trunc(x)))
    with pytest.raises(RuntimeError, match=r"relay.build for c .* failed .*Unresolved call Op\(tir.trunc\)"):
        hexagon_model.run_model(mod, inputs={"x": np.zeros(4, "float32")})


# ---------------------------------------------------------------- the per-node differential run
@pytest.mark.parametrize("kwargs, error, message", [
    ({"nodes": "layers"}, ValueError, r"nodes must be one of \('auto', 'boundaries', 'all'\), got 'layers'"),
    ({"timeout": 0}, ValueError, "timeout must be a positive number"),
    ({"target": "llvm"}, ValueError, "target must be a C-source Hexagon target"),
])
def test_differential_run_bad_arguments_fail_before_building(kwargs, error, message, monkeypatch):
    monkeypatch.setattr(hexagon_model, "_build_c", lambda *a, **k: pytest.fail("built before checking"))
    mod, inputs = _out_of_range_cast()
    with pytest.raises(error, match=message):
        hexagon_model.differential_run(mod, None, inputs, **kwargs)
    with pytest.raises(TypeError, match="per_node must be a bool, got str"):
        hexagon_model.run_model(mod, None, inputs, per_node="yes")


def test_differential_run_names_the_first_node_that_differs():
    _require_emulator()
    mod, inputs = _out_of_range_cast()
    before = tvm.ir.save_json(mod)
    outputs, report = hexagon_model.run_model(mod, None, inputs, per_node=True, timeout=120)
    assert tvm.ir.save_json(mod) == before
    np.testing.assert_array_equal(outputs[0], hexagon_model.run_model(mod, None, inputs, timeout=120)[0])
    assert not report.outputs_equal and report.calls == 10
    # The boundaries (8-bit tensors) say the fifth call's region; every call there is then recorded.
    first = report.first
    assert (first.index, first.op, first.dtype, first.shape, first.count, first.size) == (5, "cast", "int32", (2, 8), 8, 16)
    assert first.largest == 2.0 ** 32 - 1  # INT_MIN against INT_MAX
    assert [d.index for d in report.differences] == [5, 6, 7, 8, 9]
    summary = report.summary()
    assert "\n" not in summary and summary.startswith("first node that differs between Hexagon and x86: node #5 cast")
    # Boundaries only: the first 8-bit tensor that differs, not its cause.
    boundaries = hexagon_model.differential_run(mod, None, inputs, timeout=120, nodes="boundaries")
    assert boundaries.first.index == 8 and boundaries.first.dtype == "int8" and boundaries.recorded == 3


# ---------------------------------------------------------------- the families users put on a DSP
@pytest.mark.slow  # 33 s of emulation; the QDQ-file-as-loaded path stays in the default run (the two below)
def test_qdq_resnet18_file_as_loaded_bit_exact(tmp_path):
    """Issue 63's case, narrower: a ResNet-18 (basic blocks, global average pool, Gemm) on 224 x 224 images
    quantized by onnxruntime, run as loaded. The x86 reference once built TVM's float lowering of the QDQ
    ops (the Hexagon build their integer form): 55 of these 1000 logits came out a quantization step apart."""
    _require_emulator()
    mod, params, inputs = _qdq_import(models.resnet18_onnx(size=224, width=8), tmp_path)
    out, _ = _assert_bit_exact(mod, params, inputs)
    assert np.unique(out[0]).size > 20


@pytest.mark.slow  # 17 s of emulation (the CI budget)
def test_qdq_mobilenet_v2_depthwise_bit_exact(tmp_path):
    """Depthwise convs (groups = channels, 8 and 48 of them, not multiples of 32), ReLU6 clips and a residual
    add from a QDQ file: TVM's Hexagon legalization once padded the depthwise convs' output channels into an
    invalid grouped conv ("Unsupported group_conv2d layout NCHW"). MobileNet-v2's first two stages."""
    _require_emulator()
    mod, params, inputs = _qdq_import(models.mobilenet_v2_onnx(size=32, width=0.35, stages=2), tmp_path)
    out, _ = _assert_bit_exact(mod, params, inputs)
    assert np.unique(out[0]).size > 20


@pytest.mark.slow  # 18 s of emulation (the CI budget); whole quantized models stay in the default run (the CNN above)
def test_qdq_encoder_layer_bit_exact(tmp_path, small_bert_onnx):
    """A quantized encoder layer: dense, batch_matmul of activations, softmax, layer norm (its sqrt and float
    division are the runner's, correctly rounded) and GELU, from onnxruntime's QDQ file."""
    _require_emulator()
    model, _, _ = small_bert_onnx
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from tvm_tcutils.dotprod.quantize import ort_quantize

    rng = np.random.default_rng(8)
    shape = (1, 16, 32)
    path = ort_quantize(model, str(tmp_path / "encoder-qdq.onnx"),
                        [{"input": rng.standard_normal(shape).astype("float32")} for _ in range(2)])
    mod, params = relay.frontend.from_onnx(onnx.load(path), {"input": shape})
    out, _ = _assert_bit_exact(mod, params, {"input": rng.standard_normal(shape).astype("float32")})
    assert np.unique(out[0]).size > 100


@pytest.mark.slow
@pytest.mark.parametrize("build", [
    lambda: models.resnet18_onnx(),                       # the size: 224 x 224, 64-512 channels
    lambda: models.mobilenet_v2_onnx(size=96),
    lambda: models.inception_onnx(size=64, width=16),      # concat of four branches, max pools
], ids=["resnet18-224", "mobilenet-v2-96", "inception-64"])
def test_qdq_families_full_size_bit_exact(tmp_path, build):
    _require_emulator()
    mod, params, inputs = _qdq_import(build(), tmp_path)
    _assert_bit_exact(mod, params, inputs, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("build", [
    lambda: models.resnet18_onnx(size=64, width=16),
    lambda: models.mobilenet_v2_onnx(size=64, width=0.5),
    lambda: models.inception_onnx(size=64, width=16),
], ids=["resnet18", "mobilenet-v2", "inception"])
def test_relay_quantize_families_bit_exact(build):
    """The same families through relay.quantize (weights He-initialised, batch norm folded as exporters do)."""
    _require_emulator()
    model = build()
    shape = tuple(d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim)
    mod, params = relay.frontend.from_onnx(model, {"input": shape})
    data = np.random.default_rng(9).standard_normal(shape).astype("float32")
    _assert_bit_exact(quantize_int8(mod, params), None, {"input": data}, timeout=900)


def test_relay_quantize_encoder_names_the_operators_without_c_form(small_bert_onnx):
    """relay.quantize leaves an encoder's softmax and GELU in float: exp and erf, which no exact C form here
    has, are named in one line before anything is compiled."""
    _require_emulator()
    _, mod, params = small_bert_onnx
    with pytest.raises(RuntimeError) as err:
        hexagon_model.run_model(quantize_int8(mod, params), None,
                                {"input": np.zeros((1, 16, 32), "float32")}, timeout=120)
    message = str(err.value)
    assert "\n" not in message and message.startswith("no C form on emulated Hexagon for operator erf (erff")
    assert "operator exp (expf, called by tvmgen_default_fused_nn_softmax" in message

