"""AVX2 reduce-range step (``vpmaddubsw``): taken per layer only where it cannot saturate, bit-exact.

The choice is made where the package sees each layer's constant kernel (legalize / alter-layout):
every value in [-64, 64] (2 * 255 * 64 = 32640 fits int16) on an AVX2 target without VNNI. Every
other kernel keeps the exact step, which the saturation witness shows to be necessary.
"""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay, te

from conftest import dot_target
from tvm_tcutils import measure
from tvm_tcutils.dotprod.isa import X86_AVX2_U8S7, for_layer, range_isa
from tvm_tcutils.dotprod.topi import packing
from tvm_tcutils.dotprod.topi.conv2d_nchwc import conv2d_nchwc_dot, schedule_conv2d_nchwc_dot

RNG = np.random.default_rng(11)
#: The 8-bit multiply-add; the exact AVX2 step never emits it.
PAIR_STEP = "vpmaddubsw"


def _weights(shape, low=-64, high=64, extreme=None):
    w = RNG.integers(low, high + 1, shape).astype("int8")
    w.flat[:2] = (low, high)  # both ends of the range occur
    if extreme is not None:
        w.flat[len(w.flat) // 2] = extreme
    return w


def _data(shape, dtype="uint8"):
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    x.flat[:4] = info.max if dtype == "uint8" else info.min  # the largest |products| occur
    return x


def _conv_ref(x, w):
    """int64 3x3 conv, padding 1 (tiny shapes)."""
    padded = np.pad(x.astype("int64"), ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    return sum(np.einsum("nchw,oc->nohw", padded[:, :, i:i + h, j:j + wd], w[:, :, i, j].astype("int64"))
               for i in range(3) for j in range(3))


#: op -> (Relay builder (data var, weight expr, weight shape) -> expr, data shape, weight shape, numpy reference).
OPS = {
    "conv2d": (lambda x, w, shape: relay.nn.conv2d(x, w, padding=(1, 1), channels=shape[0], kernel_size=(3, 3),
                                                   out_dtype="int32"),
               (1, 16, 6, 6), (24, 16, 3, 3), _conv_ref),
    "dense": (lambda x, w, shape: relay.nn.dense(x, w, out_dtype="int32"), (3, 60), (20, 60),
              lambda x, w: x.astype("int64") @ w.astype("int64").T),
}


def _build_run(op, x, w, constant=True):
    """Build ``op`` for core-avx2 with the weight as a constant (or an input: unknown values); run it."""
    make, *_ = OPS[op]
    xv = relay.var("x", shape=x.shape, dtype=x.dtype.name)
    wv = relay.var("w", shape=w.shape, dtype="int8")
    body = make(xv, relay.const(w) if constant else wv, w.shape)
    mod = tvm.IRModule.from_expr(relay.Function([xv] if constant else [xv, wv], body))
    lib = measure.build(mod, target=dot_target("avx2"))
    runner = measure.graph_module(lib, {"x": x} if constant else {"x": x, "w": w})
    runner.run()
    return measure.outputs(runner)[0], lib.get_lib().get_source("asm")


def test_the_choice_is_per_layer_and_per_target():
    fits, over = np.full((8, 4), -64, "int8"), np.full((8, 4), 65, "int8")
    assert for_layer("llvm -mcpu=core-avx2", fits) is X86_AVX2_U8S7
    assert for_layer("llvm -mcpu=skylake-avx512", fits) is X86_AVX2_U8S7  # AVX-512BW, no VNNI
    assert for_layer("llvm -mcpu=core-avx2", over).name == "x86_avx2"
    assert for_layer("llvm -mcpu=core-avx2", fits.astype("uint8")).name == "x86_avx2"  # s8 kernels only
    assert for_layer("llvm -mcpu=znver4", fits).name == "x86_vnni"  # vpdpbusd: exact and faster
    assert for_layer("llvm -mcpu=nehalem", fits).name == "x86_sse"
    assert range_isa("llvm") is None and for_layer("llvm", fits) is None
    assert X86_AVX2_U8S7.kernel_range == (-64, 64) and 2 * 255 * 64 <= np.iinfo("int16").max


@pytest.mark.parametrize("op", sorted(OPS))
@pytest.mark.parametrize("data_dtype", ["uint8", "int8"])
def test_reduce_range_weights_take_the_8bit_step_bit_exactly(op, data_dtype):
    # int8 data is shifted to u8 by legalization (compensated by 128 * sum(w)), as for VNNI.
    _, x_shape, w_shape, reference = OPS[op]
    x, w = _data(x_shape, data_dtype), _weights(w_shape)
    out, asm = _build_run(op, x, w)
    assert PAIR_STEP in asm
    np.testing.assert_array_equal(out, reference(x, w))
    exact, exact_asm = _build_run(op, x, w, constant=False)  # values unknown: the exact step
    assert PAIR_STEP not in exact_asm
    np.testing.assert_array_equal(out, exact)


@pytest.mark.parametrize("op,extreme", [("conv2d", -65), ("conv2d", 65), ("dense", -65), ("dense", 65)])
def test_one_weight_out_of_range_keeps_the_exact_step(op, extreme):
    _, x_shape, w_shape, reference = OPS[op]
    x, w = _data(x_shape), _weights(w_shape, extreme=extreme)
    out, asm = _build_run(op, x, w)
    assert PAIR_STEP not in asm
    np.testing.assert_array_equal(out, reference(x, w))


def _marked_conv(data, kernel):
    """The reduce-range conv2d kernel itself on a marked kernel, with no check of its values."""
    target = dot_target("avx2")
    kernel_p = packing.pack_kernel_for(X86_AVX2_U8S7, kernel, 8)
    assert packing.conv_kernel_marked(kernel_p.shape)
    data_p = packing.pack_data_nchwc(data, 8)
    d = te.placeholder(data_p.shape, "uint8", name="d")
    k = te.placeholder(kernel_p.shape, "int8", name="k")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, k, 1, 1, 1, "NCHW8c", "NCHW8c")
        func = tvm.build(schedule_conv2d_nchwc_dot(cfg, [out]), [d, k, out], target=target)
    assert PAIR_STEP in func.get_source("asm")
    result = tvm.nd.empty([int(s) for s in out.shape], "int32")
    func(tvm.nd.array(data_p), tvm.nd.array(kernel_p), result)
    return packing.unpack_nchwc(result.numpy(), kernel.shape[0])


def test_saturation_witness_stays_exact():
    # Weights 127 on data 255: each int16 pair sum would be 64,770. The unchecked 8-bit step
    # clips it to 32,767 (wrong); the package sees the kernel's values and keeps the exact step.
    x = np.full((1, 8, 4, 4), 255, "uint8")
    w = np.full((8, 8, 3, 3), 127, "int8")
    np.testing.assert_array_equal(_marked_conv(x, np.clip(w, -64, 64)), _conv_ref(x, np.clip(w, -64, 64)))
    unchecked = _marked_conv(x, w)
    assert (unchecked != _conv_ref(x, w)).any() and unchecked.max() == 32767 * 2 * 9 * 2
    out, asm = _build_run("conv2d", x, w)
    assert PAIR_STEP not in asm
    np.testing.assert_array_equal(out, _conv_ref(x, w))


def test_a_hand_packed_8bit_kernel_is_not_taken_for_reduce_range():
    # Only the mark selects the saturating step: a plain OIHW2i8o4i int8 kernel keeps the exact one.
    target = dot_target("avx2")
    x, w = _data((1, 8, 4, 4)), np.full((8, 8, 3, 3), 127, "int8")
    data = relay.var("x", shape=(1, 2, 4, 4, 4), dtype="uint8")
    kernel = relay.const(packing.pack_kernel_oihw(w, 4, 8))
    conv = relay.nn.contrib_conv2d_nchwc(data, kernel, padding=(1, 1), channels=8, kernel_size=(3, 3),
                                         data_layout="NCHW4c", kernel_layout="OIHW1i8o4i", out_layout="NCHW8c",
                                         out_dtype="int32")
    lib = measure.build(tvm.IRModule.from_expr(relay.Function([data], conv)), target=target)
    assert PAIR_STEP not in lib.get_lib().get_source("asm")
    runner = measure.graph_module(lib, {"x": packing.pack_data_nchwc(x, 4)})
    runner.run()
    np.testing.assert_array_equal(packing.unpack_nchwc(measure.outputs(runner)[0], 8), _conv_ref(x, w))


def test_onnxruntime_reduce_range_model_takes_the_8bit_step_and_equals_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    onnx = pytest.importorskip("onnx")
    from tvm_tcutils.dotprod.quantize import ort_quantize
    from tvm_tcutils.onnx_writer import OnnxGraph

    target = dot_target("avx2")
    g = OnnxGraph("rr_cnn")
    g.input("x", "float32", [1, 8, 8, 8])
    conv = g.node("Conv", ["x", g.const(RNG.normal(0, 0.2, (16, 8, 3, 3)).astype("float32"), "w")],
                  kernel_shape=[3, 3], pads=[1] * 4)
    conv = g.node("Conv", [g.node("Relu", [conv]), g.const(RNG.normal(0, 0.1, (16, 16, 3, 3)).astype("float32"), "w")],
                  kernel_shape=[3, 3], pads=[1] * 4)
    g.output(g.node("Relu", [conv]), "float32", [1, 16, 8, 8])
    samples = [{"x": RNG.normal(0, 1, (1, 8, 8, 8)).astype("float32")} for _ in range(2)]
    path = ort_quantize(g.model(), str(tmp_path / "rr.onnx"), samples, "qdq", per_channel=True, reduce_range=True)
    weights = [onnx.numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer if t.data_type == 3]
    assert weights and all(-64 <= v.min() and v.max() <= 64 for v in weights)  # what reduce_range writes

    mod = relay.frontend.from_onnx(onnx.load(path), freeze_params=True)[0]
    lib = measure.build(mod, target=target)
    assert lib.get_lib().get_source("asm").count(PAIR_STEP) >= 2  # both convs
    x = RNG.normal(0, 1, (1, 8, 8, 8)).astype("float32")
    runner = measure.graph_module(lib, {"x": x})
    runner.run()
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    expected = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(measure.outputs(runner)[0], expected)
