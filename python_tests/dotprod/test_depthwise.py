"""The u8 x i8 depthwise conv2d on AVX-512 VNNI (``tvm_tcutils.dotprod.topi.depthwise``): exact, on
``vpdpbusd``, and what plain ``relay.build`` picks for a depthwise conv."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tvm
from tvm import relay, te, topi

from conftest import dot_target
from tvm_tcutils.dotprod.topi.depthwise import applicable, depthwise_nchwc_dot, schedule_depthwise_nchwc_dot

RNG = np.random.default_rng(11)


def _reference(data, kernel, stride, pad):
    """numpy depthwise conv of NCHW16c u8 data and an OIHW1i16o i8 kernel, int64 sums."""
    n, blocks, h, w, lanes = data.shape
    _, _, kh, kw, _, _ = kernel.shape
    top, left, bottom, right = pad
    padded = np.zeros((n, blocks, h + top + bottom, w + left + right, lanes), "int64")
    padded[:, :, top:top + h, left:left + w] = data
    out_h, out_w = (padded.shape[2] - kh) // stride + 1, (padded.shape[3] - kw) // stride + 1
    out = np.zeros((n, blocks, out_h, out_w, lanes), "int64")
    for y in range(kh):
        for x in range(kw):
            window = padded[:, :, y:y + stride * (out_h - 1) + 1:stride, x:x + stride * (out_w - 1) + 1:stride]
            out += window * kernel[:, 0, y, x, 0, :].astype("int64")[None, :, None, None, :]
    return out


# (blocks, H, W, KH, KW, stride, padding (top, left, bottom, right)): MobileNet-v2's, and odd ones.
SHAPES = {
    "mbv2_112_s1": (2, 114, 114, 3, 3, 1, (0, 0, 0, 0)),
    "mbv2_112_s2": (6, 114, 114, 3, 3, 2, (0, 0, 0, 0)),
    "padded": (3, 14, 14, 3, 3, 1, (1, 1, 1, 1)),
    "asym_pad_s2": (2, 9, 11, 3, 3, 2, (0, 1, 2, 0)),
    "odd_width": (1, 8, 13, 3, 3, 1, (0, 0, 0, 0)),  # 11 outputs: a tile of 1
    "kw2": (1, 10, 10, 2, 2, 1, (0, 0, 0, 0)),
    "kw4_kh1": (2, 6, 12, 1, 4, 1, (0, 0, 0, 0)),
    # Rows of two quads (the second zero-padded): EfficientNet's and MobileNet-v3's 5x5, a 7x7, 8 taps.
    "k5_s1_same": (2, 14, 14, 5, 5, 1, (2, 2, 2, 2)),
    "k5_s2_same": (2, 17, 15, 5, 5, 2, (2, 2, 2, 2)),
    "k5_unpadded": (1, 9, 12, 5, 5, 1, (0, 0, 0, 0)),
    "k7_s1": (1, 12, 12, 7, 7, 1, (3, 3, 3, 3)),
    "kw8_kh2": (1, 6, 20, 2, 8, 1, (0, 1, 1, 2)),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_depthwise_is_exact_at_the_extremes_of_its_dtypes(name):
    target = dot_target("vnni")
    blocks, h, w, kh, kw, stride, pad = SHAPES[name]
    data = RNG.integers(0, 256, (1, blocks, h, w, 16)).astype("uint8")
    kernel = RNG.integers(-128, 128, (blocks, 1, kh, kw, 1, 16)).astype("int8")
    data[0, 0, :2] = 255  # a corner of all-extreme products: 255 * -128 per tap
    kernel[0, 0, 0, :, 0, :] = -128
    d, k = te.placeholder(data.shape, "uint8", name="d"), te.placeholder(kernel.shape, "int8", name="k")
    with tvm.target.Target(target):
        out = depthwise_nchwc_dot(d, k, stride, pad, 1)
        func = tvm.build(schedule_depthwise_nchwc_dot([out]), [d, k, out], target=target)
    dev = tvm.cpu()
    result = tvm.nd.empty([int(x) for x in out.shape], "int32", dev)
    func(tvm.nd.array(data, dev), tvm.nd.array(kernel, dev), result)
    np.testing.assert_array_equal(result.numpy(), _reference(data, kernel, stride, pad))


@pytest.mark.parametrize("taps, products", [(3, 1), (5, 2)])
def test_depthwise_rows_are_one_dot_product_a_quad(taps, products):
    # A kernel row of 3 taps x 16 channels: one vpdpbusd, its pixels gathered by a single-source byte permute
    # of one 64-byte load (a two-source vpermt2b of two loads took the dot product's port twice as long); 5
    # taps: two. No 32-bit multiply (TVM's schedule: one vpmulld per tap).
    target = "llvm -mcpu=znver4"
    d = te.placeholder((1, 2, 15 + taps, 15 + taps, 16), "uint8", name="d")  # 16 outputs a row: tiles of 8
    k = te.placeholder((2, 1, taps, taps, 1, 16), "int8")
    with tvm.target.Target(target):
        out = depthwise_nchwc_dot(d, k, 1, 0, 1)
        asm = tvm.build(schedule_depthwise_nchwc_dot([out]), [d, k, out], target=target).get_source("asm")
    # A kernel row of a tile, unrolled over its 8 pixels: 8 x the row's products (LLVM may unroll the rows).
    count = asm.count("vpdpbusd")
    assert count >= 8 * products and count % (8 * products) == 0, count
    assert "vpermb" in asm and "vpermt2b" not in asm
    assert "vpmulld" not in asm


@pytest.mark.parametrize("case, args", [
    ("avx2", ("x86_avx2", (1, 2, 8, 8, 16), (2, 1, 3, 3, 1, 16), 1, "uint8", "int8", "int32")),
    ("int8_data", ("x86_vnni", (1, 2, 8, 8, 16), (2, 1, 3, 3, 1, 16), 1, "int8", "int8", "int32")),
    ("nine_taps", ("x86_vnni", (1, 2, 12, 12, 16), (2, 1, 9, 9, 1, 16), 1, "uint8", "int8", "int32")),
    ("dilation", ("x86_vnni", (1, 2, 8, 8, 16), (2, 1, 3, 3, 1, 16), 2, "uint8", "int8", "int32")),
    ("block_8", ("x86_vnni", (1, 4, 8, 8, 8), (4, 1, 3, 3, 1, 8), 1, "uint8", "int8", "int32")),
    ("float", ("x86_vnni", (1, 2, 8, 8, 16), (2, 1, 3, 3, 1, 16), 1, "float32", "float32", "float32")),
])
def test_depthwise_applies_only_where_it_computes(case, args):
    from tvm_tcutils.dotprod.isa import ISAS

    isa = {i.name: i for i in ISAS}[args[0]]
    assert not applicable(isa, *args[1:])
    if case == "dilation":
        with tvm.target.Target("llvm -mcpu=znver4"), pytest.raises(ValueError, match="dilation 1"):
            depthwise_nchwc_dot(te.placeholder(args[1], "uint8"), te.placeholder(args[2], "int8"), 1, 0, 2)


def _depthwise_model(channels=32, size=20, taps=3, stride=1, padding=None, kernel_zero=0):
    """A QNN depthwise conv (u8 data, i8 kernel, zero points 3 and ``kernel_zero``) and a bias, as a QDQ
    MobileNet's."""
    data = relay.var("data", shape=(1, channels, size, size), dtype="uint8")
    kernel = relay.const(RNG.integers(-128, 128, (channels, 1, taps, taps)).astype("int8"))
    conv = relay.qnn.op.conv2d(data, kernel, relay.const(3), relay.const(kernel_zero), relay.const(0.02),
                               relay.const(0.01), kernel_size=(taps, taps), channels=channels, groups=channels,
                               strides=(stride, stride), padding=padding or (taps // 2, taps // 2), out_dtype="int32")
    # int32 out with an elementwise epilogue: TVM's and the package's requantize round differently (the
    # package rounds as onnxruntime does), the sums must not.
    out = relay.add(conv, relay.const(RNG.integers(-1000, 1000, (1, channels, 1, 1)).astype("int32")))
    return tvm.IRModule.from_expr(relay.Function([data], out))


def _kernels(lib):
    graph = json.loads(lib.get_graph_json())
    shapes, rows = graph["attrs"]["shape"][1], graph["node_row_ptr"]
    return [(n["attrs"]["func_name"], shapes[rows[i]]) for i, n in enumerate(graph["nodes"]) if n["op"] == "tvm_op"]


# (channels, size, taps, stride, padding, kernel zero point, padded width the depthwise kernel reads or None
# where the data keeps TVM's zero-point padding: a kernel zero point that is not 0; channels the kernel does
# not take are legalize_depthwise_padding's doctest's and test_depthwise_applies_only_where_it_computes').
PADDED = {
    "3x3": (32, 20, 3, 1, None, 0, 20 + 2 + 1),
    "5x5": (32, 20, 5, 1, None, 0, 20 + 4 + 3),
    "3x3_s2": (48, 21, 3, 2, None, 0, 21 + 2 + 1),
    "3x3_asym": (16, 12, 3, 2, (0, 0, 1, 1), 0, 12 + 1 + 1),  # TF's "SAME" at stride 2
    "kernel_zero_point": (32, 12, 3, 1, None, 2, None),
}


# 5x5 under -m slow (CI time): its rows' two dot products are checked by default in
# test_depthwise_rows_are_one_dot_product_a_quad, its padding like 3x3's here.
@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c == "5x5" else []) for c in sorted(PADDED)])
def test_plain_relay_build_takes_it_for_a_quantized_depthwise_conv(case):
    import tvm_tcutils  # noqa: F401  (the hooks)

    target = dot_target("vnni")
    channels, size, taps, stride, padding, kernel_zero, padded_width = PADDED[case]
    mod = _depthwise_model(channels, size, taps, stride, padding, kernel_zero)
    before = tvm.ir.load_json(tvm.ir.save_json(mod))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    assert tvm.ir.structural_equal(mod, before)  # the input module is not changed
    kernels = _kernels(lib)
    depthwise = [name for name, _ in kernels if "depthwise" in name]
    assert len(depthwise) == 1, kernels
    pads = [shape for name, shape in kernels if "pad" in name]
    if padded_width is not None:
        # The package's kernel: its asm has the row's dot product, and the zero-point padding is the only copy
        # of the data: one pad kernel, as wide as the kernel's whole-quad rows read (qdq.legalize_depthwise_padding).
        assert "vpdpbusd" in lib.get_lib().get_source("asm")
        assert len(pads) == 1 and pads[0][3] == padded_width, kernels
    x = RNG.integers(0, 256, (1, channels, size, size)).astype("uint8")
    runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input("data", x)
    runner.run()
    # TVM's own build of the same module (no package hooks) is the oracle.
    tvm_tcutils.unregister()
    try:
        with tvm.transform.PassContext(opt_level=3):
            reference = relay.build(mod, target=target)
    finally:
        tvm_tcutils.register()
    oracle = tvm.contrib.graph_executor.GraphModule(reference["default"](tvm.cpu()))
    oracle.set_input("data", x)
    oracle.run()
    np.testing.assert_array_equal(runner.get_output(0).numpy(), oracle.get_output(0).numpy())


def test_tvm_depthwise_is_the_reference_for_the_fallback_shapes():
    # TVM's own depthwise (what every case applicable() rejects keeps) agrees with the numpy reference.
    target = "llvm"
    data = RNG.integers(0, 256, (1, 1, 7, 7, 16)).astype("uint8")
    kernel = RNG.integers(-128, 128, (1, 1, 3, 3, 1, 16)).astype("int8")
    d, k = te.placeholder(data.shape, "uint8"), te.placeholder(kernel.shape, "int8")
    with tvm.target.Target(target):
        out = topi.x86.depthwise_conv2d_NCHWc(d, k, 1, 0, 1, "NCHW16c", "NCHW16c", "int32")
        func = tvm.build(topi.x86.schedule_depthwise_conv2d_NCHWc([out]), [d, k, out], target=target)
    result = tvm.nd.empty([int(x) for x in out.shape], "int32")
    func(tvm.nd.array(data), tvm.nd.array(kernel), result)
    np.testing.assert_array_equal(result.numpy(), _reference(data, kernel, 1, (0, 0, 0, 0)))
