"""HWNC int8 conv2d as an implicit GEMM on the sm_80+ mma kernel: geometry, gathers, machine code, wiring.

Without a GPU: the gathers and the product are run as plain TIR on the CPU against
numpy (itself checked against TVM's conv2d), the kernel's copies are checked to be
all ``cp.async`` (predicated where they can fall in the padding), and its SASS
for every sm_80+ arch. On a GPU (``scripts/gpu_check.sh``): bit-exact against
numpy, alone and through ``relay.build`` with a requantize epilogue.
"""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import autotvm, relay, te

from conftest import each_value_once, gpu_arch, needs_cuda_codegen, sass_opcodes
from tvm_tcutils import cuda
from tvm_tcutils.tensorcore import strategy
from tvm_tcutils.tensorcore.topi import mma_conv2d, mma_gemm

ARCHS = [arch for arch in cuda.TENSORCORE_ARCHS if mma_gemm.arch_number(arch) >= mma_gemm.MIN_ARCH]
IMMA = {"int8": "IMMA.16832.S8.S8", "uint8": "IMMA.16832.U8.S8"}

#: (data HWNC, kernel HWOI, strides, padding, dilation): ResNet-50's kinds of layer at batch 8, and odd ones.
RESNET_LAYERS = [
    ((56, 56, 8, 64), (3, 3, 64, 64), 1, 1, 1),
    ((56, 56, 8, 256), (1, 1, 128, 256), 2, 0, 1),  # a strided 1x1 (the downsampling shortcut's kind)
    ((7, 7, 8, 512), (3, 3, 512, 512), 1, 1, 1),    # 392 pixels: rows padded to the block
    ((28, 28, 8, 128), (1, 1, 512, 128), 1, 0, 1),  # a plain 1x1: the GEMM's rows are the output's
]


def _operands(data_shape, kernel_shape, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, data_shape).astype(dtype)
    w = rng.integers(-128, 128, kernel_shape).astype("int8")
    x.flat[0], w.flat[0] = (info.min if dtype == "int8" else info.max), -128  # the largest product
    return x, w


# --------------------------------------------------------------------------
# Geometry and tiles (no compiler).
# --------------------------------------------------------------------------
@pytest.mark.parametrize("layer, gemm", [
    (RESNET_LAYERS[0], (25088, 64, 576)), (RESNET_LAYERS[1], (6272, 128, 256)),
    (RESNET_LAYERS[2], (392, 512, 4608)), (((9, 7, 3, 32), (3, 3, 32, 32), 2, (1, 0, 2, 1), 1), (45, 32, 288)),
    (((10, 10, 1, 16), (3, 3, 32, 16), 1, 2, 2), (100, 32, 144)),
])
def test_gemm_sizes(layer, gemm):
    assert mma_conv2d.geometry(*layer).gemm == gemm


def test_rows_are_padded_little_by_the_fallback():
    geom = mma_conv2d.geometry(*RESNET_LAYERS[2])
    tiles = mma_conv2d.fallback_tiles(geom, 90)
    assert mma_conv2d.padded_rows(392, tiles) <= 392 * (1 + mma_conv2d.MAX_ROW_WASTE)
    # A 128-row block would have padded 392 rows to 512, but it fits: the template may still pick it.
    assert mma_conv2d.fits(geom, mma_gemm.FALLBACK_TILES[0], 90) is None


@pytest.mark.parametrize("layer, reason", [
    (((224, 224, 8, 3), (7, 7, 64, 3), 2, 3, 1), "3 input channels are not a multiple of 16"),
    (((2, 2, 8, 16), (5, 5, 32, 16), 1, 0, 1), "the output would be -2x-2"),
    (((14, 14, 8, 64), (3, 3, 40, 64), 1, 1, 1), "not made of whole"),
])
def test_what_the_kernel_cannot_take_is_named(layer, reason):
    geom = mma_conv2d.geometry(*layer)
    assert mma_conv2d.fallback_tiles(geom, 90) is None
    assert reason in (geom.problem() or mma_conv2d.fits(geom, mma_gemm.FALLBACK_TILES[-1], 90))
    x, w = te.placeholder(layer[0], "int8"), te.placeholder(layer[1], "int8")
    with pytest.raises(ValueError, match="conv2d HWNC") as raised:
        mma_conv2d.conv2d_hwnc(x, w, *layer[2:])
    assert (geom.problem() or "no tiling fits") in str(raised.value)


@pytest.mark.parametrize("data, kernel, error, match", [
    (((14, 14, 8, 64), "float16"), ((3, 3, 64, 64), "int8"), TypeError, "data: .*int8 or uint8"),
    (((14, 14, 8, 64), "int8"), ((3, 3, 64, 64), "uint8"), TypeError, "kernel: .*int8 kernels"),
    (((14, 14, 8, 64), "int8"), ((3, 3, 64, 32), "int8"), ValueError, "kernel has 32 input channels, data has 64"),
    (((14, 14, 64), "int8"), ((3, 3, 64, 64), "int8"), ValueError, "HWNC data and an HWOI kernel"),
])
def test_bad_operands_are_refused_before_any_scheduling(data, kernel, error, match):
    with pytest.raises(error, match=match):
        mma_conv2d.conv2d_hwnc(te.placeholder(*data), te.placeholder(*kernel), 1, 1)


def test_strides_must_be_positive():
    with pytest.raises(ValueError, match="strides"):
        mma_conv2d.geometry((14, 14, 8, 64), (3, 3, 64, 64), 0, 1, 1)


# --------------------------------------------------------------------------
# The gathers, run on the CPU: what the kernel's copies read is the convolution.
# --------------------------------------------------------------------------
def test_numpy_reference_is_tvms_conv2d():
    x, w = _operands((9, 7, 2, 32), (3, 3, 48, 32), "int8", seed=3)
    data = relay.var("x", shape=(2, 9, 7, 32), dtype="int8")  # NHWC: TVM's CPU conv2d takes it
    out = relay.nn.conv2d(data, relay.const(w.transpose(0, 1, 3, 2)), strides=(2, 1), padding=(1, 0, 2, 1),
                          dilation=(1, 2), data_layout="NHWC", kernel_layout="HWIO", out_dtype="int32")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(out), target="llvm")
    from tvm.contrib import graph_executor

    module = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    module.set_input("x", x.transpose(2, 0, 1, 3))
    module.run()
    expected = module.get_output(0).numpy().transpose(1, 2, 0, 3)
    np.testing.assert_array_equal(mma_conv2d.reference(x, w, (2, 1), (1, 0, 2, 1), (1, 2)), expected)


@pytest.mark.parametrize("data_shape, kernel_shape, strides, padding, dilation, dtype", [
    ((5, 6, 2, 16), (3, 3, 32, 16), 1, 1, 1, "int8"),
    ((9, 7, 3, 32), (3, 3, 32, 32), 2, (1, 0, 2, 1), 1, "uint8"),
    ((6, 6, 1, 16), (3, 3, 32, 16), 1, 2, 2, "int8"),
    ((4, 4, 2, 48), (1, 1, 32, 48), 1, 0, 1, "uint8"),
    ((11, 11, 1, 16), (7, 7, 32, 16), 2, 3, 1, "int8"),
    ((8, 8, 2, 64), (1, 1, 32, 64), 2, 0, 1, "uint8"),
], ids=str)
def test_gathered_gemm_is_the_convolution_on_the_cpu(data_shape, kernel_shape, strides, padding, dilation, dtype):
    geom = mma_conv2d.geometry(data_shape, kernel_shape, strides, padding, dilation)
    rows = geom.gemm[0] + 9  # rows past the last pixel, as a padded block has them, read as zeros
    x, w = _operands(data_shape, kernel_shape, dtype)
    func = tvm.build(mma_conv2d.gathered_reference(te.placeholder(data_shape, dtype), te.placeholder(
        kernel_shape, "int8"), strides, padding, dilation, rows=rows), target="llvm")
    out = tvm.nd.array(np.full((rows, kernel_shape[2]), 7, "int32"))
    func(tvm.nd.array(x), tvm.nd.array(w), out)
    got = out.numpy()
    out_h, out_w = geom.out_size
    expected = mma_conv2d.reference(x, w, strides, padding, dilation)
    np.testing.assert_array_equal(got[:geom.gemm[0]].reshape(out_h, out_w, data_shape[2], -1), expected)
    assert not got[geom.gemm[0]:].any()


def _lowered_copies(layer, dtype="int8"):
    geom = mma_conv2d.geometry(*layer)
    tiles = mma_conv2d.fallback_tiles(geom, 90)
    x, w = te.placeholder(layer[0], dtype, name="x"), te.placeholder(layer[1], "int8", name="w")
    left, right = mma_conv2d._gathered(x, w, geom, mma_conv2d.padded_rows(geom.gemm[0], tiles))
    func = mma_gemm.lower(mma_gemm.schedule_primfunc(left, right, tiles, inputs=(x, w)))
    copies, stores = [], []

    def visit(node):
        if isinstance(node, tvm.tir.Call) and node.op.name == "tir.ptx_cp_async":
            copies.append(node)
        elif isinstance(node, tvm.tir.BufferStore) and "shared" in node.buffer.scope():
            stores.append(node)

    tvm.tir.stmt_functor.post_order_visit(func.body, visit)
    return copies, stores


@pytest.mark.parametrize("layer", [RESNET_LAYERS[0], RESNET_LAYERS[3]], ids=["3x3", "1x1"])
def test_every_gathered_piece_is_one_asynchronous_copy(layer):
    copies, stores = _lowered_copies(layer)
    assert not stores  # no byte-by-byte copy left behind
    sources = {str(call.args[2]): call for call in copies}
    assert {"x", "w"} <= {name.split(".")[0] for name in sources}
    for call in copies:
        assert int(call.args[4]) == 16
        from_data = str(call.args[2]).startswith("x")
        # The data's pieces may fall in the zero padding or past the last pixel; the kernel's never do.
        assert (len(call.args) == 6) == (from_data and layer[1][0] > 1), call


# --------------------------------------------------------------------------
# Machine code for every sm_80+ arch.
# --------------------------------------------------------------------------
def _build(layer, arch: str, dtype: str = "int8", tiles=None):
    target = tvm.target.Target(f"cuda -arch={arch}", host="llvm")
    x, w = te.placeholder(layer[0], dtype, name="x"), te.placeholder(layer[1], "int8", name="w")
    with target:
        if tiles is None:
            out = mma_conv2d.conv2d_template(autotvm.get_config(), x, w, *layer[2:])
        else:
            out = mma_conv2d.conv2d_hwnc(x, w, *layer[2:], tiles=tiles, arch=mma_gemm.arch_number(arch))
        sched = mma_gemm.schedule_dense(None, [out])
    return tvm.build(sched, [x, w, out], target=target)


@needs_cuda_codegen
@pytest.mark.parametrize("arch, layer, dtype", each_value_once(ARCHS, RESNET_LAYERS, ["int8", "uint8"]))
def test_kernel_uses_m16n8k32_ldmatrix_and_async_copies(arch, layer, dtype):
    module = _build(layer, arch, dtype)
    kernels = sass_opcodes(module)
    resources = cuda.resources(cuda.module_cubin(module))
    gemm = [name for name, ops in kernels.items() if ops[IMMA[dtype]]]
    assert len(gemm) == 1, kernels.keys()
    ops = kernels[gemm[0]]
    for must in ("LDSM.16.M88.4", "LDGSTS.E.BYPASS.LTC128B.128", "DEPBAR.LE"):
        assert ops[must], must
    assert not ops["IMMA.16816.S8.S8"] and not ops["LDL"] and not ops["STL"]
    assert resources[gemm[0]].local == 0 and resources[gemm[0]].stack == 0
    # Rows padded past the last pixel are computed but not stored: still one kernel, no copy after it.
    assert len(kernels) == 1, kernels.keys()


def test_an_invalid_config_of_the_template_is_an_instantiation_error():
    x, w = te.placeholder((14, 14, 8, 64), "int8"), te.placeholder((3, 3, 64, 64), "int8")
    with tvm.target.Target("cuda -arch=sm_80"):
        task = autotvm.task.create(mma_conv2d.TASK, args=(x, w, 1, 1, 1, "int32"), target="cuda -arch=sm_80")
    invalid = next(c for c in (task.config_space.get(i) for i in range(len(task.config_space)))
                   if c["warps_m"].val * c["warps_n"].val > mma_gemm.MAX_WARPS)
    with pytest.raises(autotvm.task.space.InstantiationError, match="warps a block are too many"):
        with tvm.target.Target("cuda -arch=sm_80"):
            task.instantiate(invalid)


# --------------------------------------------------------------------------
# relay.build takes it where the GPU check verified the mma kernel, and only there.
# --------------------------------------------------------------------------
def _requantized_conv(w: np.ndarray, data_shape, dtype: str = "int8") -> tvm.IRModule:
    """An HWNC conv2d with the epilogue of a quantized layer after lowering: bias, shift, clip, cast."""
    data = relay.var("x", shape=data_shape, dtype=dtype)
    bias = relay.const(np.arange(w.shape[2], dtype="int32") * 37 - 4000)
    out = relay.nn.conv2d(data, relay.const(w), padding=(w.shape[0] // 2,) * 2, channels=w.shape[2],
                          kernel_size=w.shape[:2], data_layout="HWNC", kernel_layout="HWOI", out_dtype="int32")
    out = relay.cast(relay.clip(relay.right_shift(relay.add(out, bias), relay.const(9)), -128, 127), "int8")
    return tvm.IRModule.from_expr(relay.Function([data], out))


def _requantized_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = mma_conv2d.reference(x, w, 1, w.shape[0] // 2).astype(np.int64) + np.arange(w.shape[2]) * 37 - 4000
    return np.clip(acc >> 9, -128, 127).astype("int8")


@needs_cuda_codegen
def test_relay_build_takes_the_kernel_on_verified_archs_only(monkeypatch):
    w = np.random.default_rng(0).integers(-128, 128, (3, 3, 64, 64)).astype("int8")
    mod = _requantized_conv(w, (7, 7, 8, 64), "uint8")
    target = "cuda -arch=sm_90"
    if "sm_90" not in strategy.MMA_VERIFIED_ARCHS:
        assert strategy.implementations(mod, target)[0][3] != strategy.MMA_CONV2D_IMPL
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    assert strategy.implementations(mod, target)[0][3] == strategy.MMA_CONV2D_IMPL
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm.target.Target(target, host="llvm"))
    ops = [op for counts in sass_opcodes(lib.get_lib()).values() for op in counts if op.startswith("IMMA")]
    assert ops == ["IMMA.16832.U8.S8"]
    # One AutoTVM task per layer: the mma template's, not also the WMMA one's.
    with tvm.transform.PassContext(opt_level=3):
        tasks = autotvm.task.extract_from_program(mod, target=target, params={})
    assert [task.name for task in tasks] == [mma_conv2d.TASK]


def test_a_conv2d_with_an_8_bit_output_is_left_to_the_other_rows(monkeypatch):
    # out_dtype "" means the data's type: int8 sums, which an int32 GEMM does not make.
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    data = relay.var("x", shape=(14, 14, 8, 64), dtype="int8")
    weight = relay.const(np.ones((3, 3, 64, 64), "int8"))
    for out_dtype, expected in (("int32", True), ("", False)):
        out = relay.nn.conv2d(data, weight, padding=(1, 1), channels=64, kernel_size=(3, 3), data_layout="HWNC",
                              kernel_layout="HWOI", out_dtype=out_dtype)
        rows = strategy.implementations(tvm.IRModule.from_expr(out), "cuda -arch=sm_90")
        assert (rows[0][3] == strategy.MMA_CONV2D_IMPL) is expected, (out_dtype, rows)


# --------------------------------------------------------------------------
# On a GPU (scripts/gpu_check.sh runs these): bit-exact against numpy.
# --------------------------------------------------------------------------
@pytest.mark.parametrize("layer, dtype", [(RESNET_LAYERS[0], "int8"), (RESNET_LAYERS[1], "uint8"),
                                          (RESNET_LAYERS[2], "int8"), (RESNET_LAYERS[3], "uint8"),
                                          (((9, 7, 4, 32), (3, 3, 64, 32), 2, (1, 0, 2, 1), 1), "int8")],
                         ids=str)
def test_kernel_is_bit_exact_on_the_gpu(layer, dtype):
    arch = gpu_arch(mma_gemm.MIN_ARCH)
    geom = mma_conv2d.geometry(*layer)
    x, w = _operands(layer[0], layer[1], dtype)
    func = _build(layer, arch, dtype)
    dev = tvm.cuda(0)
    out = tvm.nd.empty((*geom.out_size, layer[0][2], layer[1][2]), "int32", dev)
    func(tvm.nd.array(x, dev), tvm.nd.array(w, dev), out)
    np.testing.assert_array_equal(out.numpy(), mma_conv2d.reference(x, w, *layer[2:]))


@pytest.mark.parametrize("data_shape", [(14, 14, 8, 64), (7, 7, 8, 64)], ids=["whole-blocks", "rows-past-the-end"])
def test_relay_build_runs_it_and_its_epilogue_bit_exact_on_the_gpu(monkeypatch, data_shape):
    # The epilogue runs inside the GEMM's kernel (tensorcore.topi.epilogue), the padded rows unstored.
    from tvm.contrib import graph_executor

    arch = gpu_arch(mma_gemm.MIN_ARCH)
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({arch}))
    x, w = _operands(data_shape, (3, 3, 128, 64), "uint8", seed=1)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_requantized_conv(w, x.shape, "uint8"),
                          target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"))
    module = graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("x", x)
    module.run()
    np.testing.assert_array_equal(module.get_output(0).numpy(), _requantized_reference(x, w))
