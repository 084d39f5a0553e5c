"""The sm_90 int8 GEMM on warp-group MMA (wgmma + cp.async pipeline): tilings, index maps, errors, machine code.

No GPU is needed for most of it: the kernel's index maps are replayed in numpy
(:func:`wgmma_gemm.simulate`, the PTX ISA's descriptor and accumulator layouts),
and its SASS is read back from the package's CUDA plugin: the warp-group MMA
(``IGMMA.64xNx32.S8.S8`` / ``.U8.S8``) with its ``WARPGROUP.ARRIVE``, the
asynchronous copies (``LDGSTS``), no local memory. The numbers (bit-exact
against numpy on an H100/H200) come from ``scripts/gpu_check.sh``.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import te

from conftest import SASS_OPCODE, cuda_status, each_value_once, gpu_arch, needs_cuda_codegen
from tvm_tcutils import cuda
from tvm_tcutils.tensorcore.topi import wgmma_gemm

_STATUS = cuda_status()
_SIGN = {"int8": "S8", "uint8": "U8"}




def _operands(m: int, n: int, k: int, dtype: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    x.flat[0], w.flat[0] = (info.min if dtype == "int8" else info.max), -128  # the largest product
    return x, w


def _reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32)


# --------------------------------------------------------------------------
# Tilings and errors (no compiler needed).
# --------------------------------------------------------------------------
@pytest.mark.parametrize("m, n, k, block", [
    (4096, 4096, 4096, (128, 256, 64)),   # 16 x 16 = 256 blocks fill 132 SMs
    (512, 4096, 1024, (64, 128, 64)),     # 64 blocks of 128 x 256 and 128 of 128 x 128 do not; 256 of 64 x 128 do
    (128, 1024, 1024, (64, 64, 64)),      # nothing fills the GPU: the most blocks
    (64, 64, 192, (64, 64, 64)),          # only the smallest fits
])
def test_fallback_tiles(m, n, k, block):
    assert wgmma_gemm.fallback_tiles(m, n, k).block == block


@pytest.mark.parametrize("tiles, reason", [
    (wgmma_gemm.WgmmaTiles(1, 96, 2, 3), "n_tile 96 is not one of"),
    (wgmma_gemm.WgmmaTiles(1, 64, 2, 2), "at least 3"),
    (wgmma_gemm.WgmmaTiles(2, 256, 4, 5), "exceed sm_90's"),
    (wgmma_gemm.WgmmaTiles(2, 64, 1, 3), "do not split into 256 threads"),
])
def test_impossible_tilings_are_named(tiles, reason):
    assert reason in tiles.problem()


@pytest.mark.parametrize("dtypes, match", [
    (("int4", "int8"), "data: the wgmma kernel takes int8 or uint8 data, got int4"),
    (("uint8", "uint8"), "weight: the wgmma kernel takes int8 weights, got uint8"),
])
def test_bad_operand_types_are_refused(dtypes, match):
    with pytest.raises(TypeError, match=match):
        wgmma_gemm.dense(te.placeholder((128, 128), dtypes[0]), te.placeholder((128, 128), dtypes[1]))


def test_bad_shapes_are_refused_before_any_scheduling():
    with pytest.raises(ValueError, match="weight has 64 input features, data has 128"):
        wgmma_gemm.dense(te.placeholder((128, 128), "int8"), te.placeholder((128, 64), "int8"))
    with pytest.raises(ValueError, match="dense 100x128x128 on sm_90a: no tiling fits"):
        wgmma_gemm.dense(te.placeholder((100, 128), "int8"), te.placeholder((128, 128), "int8"))


def test_helpers_are_added_once_and_only_where_called():
    code = wgmma_gemm.add_helpers("tcutils_wgmma_fence();")
    assert code.count("tcutils_gmma_desc(") == 1 and wgmma_gemm.add_helpers(code) == code
    assert wgmma_gemm.add_helpers("x = 1;") == "x = 1;"
    for n in wgmma_gemm.N_TILES:
        for sign in ("s8", "u8"):
            assert f"wgmma.mma_async.sync.aligned.m64n{n}k32.s32.{sign}.s8 " in code


# --------------------------------------------------------------------------
# The kernel's index maps, replayed in numpy through PTX's layouts.
# --------------------------------------------------------------------------
@pytest.mark.parametrize("shape, tiles, dtype", each_value_once(
    [(128, 128, 256), (128, 256, 384)],
    [wgmma_gemm.WgmmaTiles(2, 64, 2, 3), wgmma_gemm.WgmmaTiles(1, 128, 1, 4), wgmma_gemm.WgmmaTiles(1, 64, 4, 3)],
    ["int8", "uint8"],
))
def test_the_kernels_maps_compute_the_product(shape, tiles, dtype):
    m, n, k = shape
    assert wgmma_gemm.fits(m, n, k, tiles) is None
    x, w = _operands(m, n, k, dtype)
    np.testing.assert_array_equal(wgmma_gemm.simulate(x, w, tiles), _reference(x, w))


def test_the_simulation_catches_swapped_descriptor_offsets(monkeypatch):
    # Not vacuous: reading core matrices with the leading and stride byte offsets swapped gives another product.
    x, w = _operands(64, 64, 128, "int8")
    tiles = wgmma_gemm.WgmmaTiles(1, 64, 4, 3)
    assert (wgmma_gemm.simulate(x, w, tiles) == _reference(x, w)).all()
    read = wgmma_gemm._descriptor_read
    monkeypatch.setattr(wgmma_gemm, "_descriptor_read",
                        lambda smem, start, rows, leading, stride: read(np.tile(smem, 2), start, rows, stride, leading))
    assert not (wgmma_gemm.simulate(x, w, tiles) == _reference(x, w)).all()


def test_each_accumulator_has_one_place():
    for n_tile in wgmma_gemm.N_TILES:
        places = {wgmma_gemm.accumulator_position(t, r) for t in range(128) for r in range(n_tile // 2)}
        assert places == {(i, j) for i in range(64) for j in range(n_tile)}


# --------------------------------------------------------------------------
# Machine code.
# --------------------------------------------------------------------------
def _build(m: int, n: int, k: int, tiles=None, dtype: str = "int8", arch: str = "sm_90"):
    target = tvm.target.Target(f"cuda -arch={arch}", host="llvm")
    x, w = te.placeholder((m, k), dtype, name="x"), te.placeholder((n, k), "int8", name="w")
    with target:
        out = wgmma_gemm.dense(x, w, tiles)
        sched = te.create_schedule(out.op)
    return tvm.build(sched, [x, w, out], target=target)


def _kernel(module):
    cubin = cuda.module_cubin(module)
    ((name, code),) = cuda.sass(cubin).items()
    return Counter(SASS_OPCODE.findall(code)), cuda.resources(cubin)[name], module.imported_modules[0].get_source()


@needs_cuda_codegen
@pytest.mark.parametrize("shape, tiles, dtype", each_value_once(
    [(4096, 4096, 4096), (512, 1024, 1024)],
    [None, wgmma_gemm.WgmmaTiles(2, 128, 2, 4), wgmma_gemm.WgmmaTiles(1, 64, 4, 3)],
    ["int8", "uint8"],
))
def test_kernel_uses_warpgroup_mma_and_async_copies(shape, tiles, dtype):
    m, n, k = shape
    chosen = tiles or wgmma_gemm.fallback_tiles(m, n, k)
    ops, used, _ = _kernel(_build(m, n, k, tiles, dtype))
    imma = f"IGMMA.64x{chosen.n_tile}x32.{_SIGN[dtype]}.S8"
    for op in (imma, "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR.LE", "LDGSTS.E.BYPASS.LTC128B.128", "DEPBAR.LE",
               "BAR.SYNC.DEFER_BLOCKING"):
        assert ops[op], (op, sorted(ops))
    assert not any(op.startswith(("IMMA", "HMMA")) for op in ops), sorted(ops)
    assert used.local == 0 and used.stack == 0 and used.registers <= wgmma_gemm.MAX_REGISTERS, used
    print(f"{shape} {dtype}: tiles {tuple(chosen)}, {used.registers} registers, {chosen.shared_bytes} B shared")


@needs_cuda_codegen
def test_a_stage_is_read_only_after_it_landed_and_refilled_only_after_it_was_read():
    _, _, source = _kernel(_build(256, 256, 1024, wgmma_gemm.WgmmaTiles(1, 64, 2, 4)))
    body = source[source.index("for (int kt_1 = 0;"):]
    # Four stages: two in flight while one is multiplied and one may still be read by step kt - 1's group.
    order = ["cp.async.wait_group 1", "tcutils_wgmma_proxy_fence()", "__syncthreads()", "cp.async.cg.shared.global",
             "cp.async.commit_group", "tcutils_wgmma_fence()", "tcutils_wgmma_m64n64k32_s8s8(",
             "tcutils_wgmma_commit()", "tcutils_wgmma_wait_one()", "tcutils_wgmma_wait_all()", "dense_wgmma["]
    positions = [body.index(step) for step in order]
    assert positions == sorted(positions), list(zip(order, positions))


# --------------------------------------------------------------------------
# On an H100/H200 (scripts/gpu_check.sh runs these): bit-exact against numpy.
# --------------------------------------------------------------------------
@pytest.mark.parametrize("shape, tiles, dtype", [
    ((4096, 4096, 4096), None, "int8"), ((512, 4096, 1024), None, "uint8"), ((128, 768, 3072), None, "int8"),
    ((512, 512, 1024), wgmma_gemm.WgmmaTiles(2, 128, 2, 4), "uint8"),
    ((512, 512, 1024), wgmma_gemm.WgmmaTiles(1, 64, 4, 3), "int8"),
    ((256, 512, 2048), wgmma_gemm.WgmmaTiles(2, 256, 1, 6), "int8"),
    ((128, 128, 192), wgmma_gemm.WgmmaTiles(1, 64, 2, 3), "int8"),  # as few K steps as stages
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_kernel_is_bit_exact_on_the_gpu(shape, tiles, dtype):
    arch = gpu_arch()
    if not wgmma_gemm.supports(arch):
        pytest.skip(f"the GPU is {arch}: wgmma runs on sm_90 only")
    m, n, k = shape
    x, w = _operands(m, n, k, dtype)
    func = _build(m, n, k, tiles, dtype, arch)
    dev = tvm.cuda(0)
    out = tvm.nd.empty((m, n), "int32", dev)
    func(tvm.nd.array(x, dev), tvm.nd.array(w, dev), out)
    np.testing.assert_array_equal(out.numpy(), _reference(x, w))


# --------------------------------------------------------------------------
# relay.build takes it where the GPU check verified it, and only there.
# --------------------------------------------------------------------------
def _relay_gemm_ops(dtype: str, epilogue: bool = False) -> list:
    from tvm import relay

    x = relay.var("x", shape=(256, 512), dtype=dtype)
    w = relay.const(np.random.default_rng(0).integers(-128, 128, (256, 512)).astype("int8"))
    out = relay.nn.dense(x, w, out_dtype="int32")
    if epilogue:
        out = relay.cast(relay.clip(relay.right_shift(out, relay.const(9)), -128, 127), "int8")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(out), target=tvm.target.Target("cuda -arch=sm_90", host="llvm"))
    codes = cuda.sass(cuda.module_cubin(lib.get_lib())).values()
    return sorted({op for code in codes for op in SASS_OPCODE.findall(code) if "MMA" in op})


@needs_cuda_codegen
def test_relay_build_takes_the_kernel_on_verified_archs_only(monkeypatch):
    from tvm_tcutils.tensorcore import strategy

    if "sm_90" not in strategy.WGMMA_VERIFIED_ARCHS:
        assert not any(op.startswith("IGMMA") for op in _relay_gemm_ops("int8"))
    monkeypatch.setattr(strategy, "WGMMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    assert _relay_gemm_ops("int8", epilogue=True) == ["IGMMA.64x64x32.S8.S8"]
    assert _relay_gemm_ops("uint8") == ["IGMMA.64x64x32.U8.S8"]


def test_relay_build_runs_it_and_its_epilogue_bit_exact_on_the_gpu(monkeypatch):
    from tvm import relay
    from tvm.contrib import graph_executor

    from tvm_tcutils.tensorcore import strategy

    if not (_STATUS["codegen"] and _STATUS["device"]):
        pytest.skip("needs a GPU and CUDA code generation (scripts/gpu_check.sh)")
    arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    if not wgmma_gemm.supports(arch):
        pytest.skip(f"the GPU is {arch}: wgmma runs on sm_90 only")
    monkeypatch.setattr(strategy, "WGMMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    x, w = _operands(256, 512, 1024, "uint8", seed=1)
    data = relay.var("x", shape=x.shape, dtype="uint8")
    out = relay.nn.dense(data, relay.const(w), out_dtype="int32") + relay.const(np.arange(512, dtype="int32") * 37)
    out = relay.cast(relay.clip(relay.right_shift(out, relay.const(9)), -128, 127), "int8")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(out), target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"))
    module = graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("x", x)
    module.run()
    want = np.clip((x.astype(np.int64) @ w.astype(np.int64).T + np.arange(512) * 37) >> 9, -128, 127).astype("int8")
    np.testing.assert_array_equal(module.get_output(0).numpy(), want)


def test_an_invalid_config_of_the_template_is_an_instantiation_error():
    from tvm import autotvm

    task = autotvm.task.create(wgmma_gemm.TASK, (te.placeholder((256, 512), "int8"),
                                                 te.placeholder((256, 512), "int8"), "int32"),
                               tvm.target.Target("cuda -arch=sm_90"))
    space = task.config_space
    invalid = next(space.get(i) for i in range(len(space))
                   if wgmma_gemm.WgmmaTiles(*(space.get(i)[knob].val for knob in wgmma_gemm.WgmmaTiles._fields))
                   .problem() is not None)
    with pytest.raises(autotvm.task.space.InstantiationError, match="tiling"):
        task.instantiate(invalid)
    assert len(space) == len(wgmma_gemm.WARPGROUPS) * len(wgmma_gemm.N_TILES) * len(wgmma_gemm.CHUNKS) \
        * len(wgmma_gemm.STAGES)
