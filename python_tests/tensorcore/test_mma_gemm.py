"""The sm_80+ int8 GEMM (mma.sync m16n8k32, ldmatrix, cp.async pipeline): tilings, errors, machine code, wiring.

No GPU is needed: the kernels are compiled by the package's CUDA plugin and their
SASS read back (as in test_sass.py). What the SASS must show for every arch from
sm_80 on: the m16n8k32 integer MMA (``IMMA.16832.S8.S8``) and never the WMMA
kernels' ``IMMA.16816``, ``ldmatrix.x4`` (``LDSM.16.M88.4``), the asynchronous
global-to-shared copies (``LDGSTS``) and their waits (``DEPBAR``), no local
memory and no stack. The numbers (bit-exact against numpy, TOPS against
cuBLASLt) come from ``scripts/gpu_check.sh`` on a GPU.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import tvm
from tvm import autotvm, relay, te

from conftest import SASS_OPCODE, cuda_status, each_value_once, gpu_arch, needs_cuda_codegen, run_python
from tvm_tcutils import cuda
from tvm_tcutils.tensorcore import strategy
from tvm_tcutils.tensorcore.topi import mma_gemm

_STATUS = cuda_status()




ARCHS = [arch for arch in cuda.TENSORCORE_ARCHS if mma_gemm.arch_number(arch) >= mma_gemm.MIN_ARCH]
#: Instructions the kernel must contain.
MUST = ("LDSM.16.M88.4", "LDGSTS.E.BYPASS.LTC128B.128", "DEPBAR.LE", "BAR.SYNC.DEFER_BLOCKING")
#: The integer MMA each activation type must use.
IMMA = {"int8": "IMMA.16832.S8.S8", "uint8": "IMMA.16832.U8.S8"}


def _build(m: int, n: int, k: int, arch: str, tiles=None, dtype: str = "int8"):
    target = tvm.target.Target(f"cuda -arch={arch}", host="llvm")
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((n, k), "int8", name="w")
    with target:
        if tiles is None:
            cfg = autotvm.get_config()
            out = mma_gemm.dense_template(cfg, x, w)
        else:
            out = mma_gemm.dense(x, w, tiles, mma_gemm.arch_number(arch))
        sched = mma_gemm.schedule_dense(None, [out])
    return tvm.build(sched, [x, w, out], target=target)


def _kernel(module):
    """(opcode counts, resources, CUDA source) of the module's one kernel."""
    cubin = cuda.module_cubin(module)
    ((name, code),) = cuda.sass(cubin).items()
    return Counter(SASS_OPCODE.findall(code)), cuda.resources(cubin)[name], module.imported_modules[0].get_source()


def test_importing_the_package_does_not_parse_tvms_cuda_intrinsics():
    # tvm.tir.tensor_intrin parses some eighty TVMScript functions per target: seconds in every process
    # that imports the package (each measuring worker, each CLI run), 10x that on a busy machine.
    done = run_python("import sys, tvm_tcutils\nprint(sorted(m for m in sys.modules if 'tir.tensor_intrin' in m))",
                      fresh=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# --------------------------------------------------------------------------
# Tilings (no compiler needed).
# --------------------------------------------------------------------------
@pytest.mark.parametrize("m, n, k, arch, block", [
    (4096, 4096, 4096, 90, (128, 128, 64)),
    (512, 4096, 1024, 90, (64, 128, 64)),   # 4 x 32 blocks of 128 x 128 would not fill 132 SMs
    (512, 4096, 1024, 86, (128, 128, 64)),  # 128 of them fill an sm_86's 82
    (128, 1024, 1024, 90, (64, 64, 64)),    # nothing fills the GPU: the most blocks of at least 64 x 64
    (32, 32, 192, 80, (32, 32, 64)),        # only the smallest tile fits
])
def test_fallback_tiles(m, n, k, arch, block):
    tiles = mma_gemm.fallback_tiles(m, n, k, arch)
    assert tiles.block == block and mma_gemm.fits(m, n, k, tiles, arch) is None


@pytest.mark.parametrize("m, n, k, arch, reason", [
    (4096, 4096, 4096, 75, "sm_75 has no int8 mma.sync m16n8k32"),
    (100, 4096, 4096, 90, "is not made of whole"),
    (4096, 4096, 4016, 90, "not a multiple of the 64-byte stage"),  # nor of the short-K tiles' 32
    (4096, 4096, 32, 90, "fewer than 2 stages"),  # the short-K tiles' two stages of 32 bytes
])
def test_what_no_tiling_takes_is_named(m, n, k, arch, reason):
    assert mma_gemm.fallback_tiles(m, n, k, arch) is None
    assert any(reason in (mma_gemm.fits(m, n, k, tiles, arch) or "") for tiles in mma_gemm.FALLBACK_TILES)


@pytest.mark.parametrize("k", [64, 128, 4000])
def test_short_or_odd_k_takes_a_32_byte_stage(k):
    # An attention head's K of 64, or a K that is not a multiple of 64: two stages of 32 bytes.
    tiles = mma_gemm.fallback_tiles(4096, 4096, k, 90)
    assert tiles.block == (128, 128, 32) and tiles.stages == 2


@pytest.mark.parametrize("tiles, reason", [
    (mma_gemm.MmaTiles(2, 2, 4, 8, 2, 3), "accumulator registers"),
    (mma_gemm.MmaTiles(4, 4, 1, 1, 1, 2), "warps a block are too many"),
    (mma_gemm.MmaTiles(4, 1, 1, 1, 1, 2), "do not split into"),
])
def test_impossible_tilings_are_named(tiles, reason):
    assert reason in tiles.problem()


def test_shared_memory_limit_is_the_archs():
    big = mma_gemm.MmaTiles(2, 2, 4, 4, 4, 4)  # 256 rows x 144 bytes x 4 stages = 147,456 bytes
    assert big.shared_bytes == 147456
    assert mma_gemm.fits(4096, 4096, 4096, big, 90) is None and mma_gemm.fits(4096, 4096, 4096, big, 80) is None
    assert "exceed sm_86's 101376" in mma_gemm.fits(4096, 4096, 4096, big, 86)


@pytest.mark.parametrize("dtypes, error, match", [
    (("int4", "int8"), TypeError, "data: the mma kernel takes int8 or uint8 data, got int4"),
    (("uint8", "uint8"), TypeError, "weight: the mma kernel takes int8 weights, got uint8"),
])
def test_bad_operand_types_are_refused(dtypes, error, match):
    with pytest.raises(error, match=match):
        mma_gemm.dense(te.placeholder((256, 512), dtypes[0]), te.placeholder((256, 512), dtypes[1]))


def test_bad_shapes_are_refused_before_any_scheduling():
    with pytest.raises(ValueError, match="weight has 256 input features, data has 512"):
        mma_gemm.dense(te.placeholder((256, 512), "int8"), te.placeholder((256, 256), "int8"))
    with pytest.raises(ValueError, match=r"dense 100x256x512 on sm_90: no tiling fits"):
        mma_gemm.dense(te.placeholder((100, 512), "int8"), te.placeholder((256, 512), "int8"))


# --------------------------------------------------------------------------
# Machine code.
# --------------------------------------------------------------------------
@needs_cuda_codegen
@pytest.mark.parametrize("arch, shape, dtype", each_value_once(ARCHS, [(512, 4096, 1024), (128, 768, 3072)],
                                                               ["int8", "uint8"]))
def test_fallback_kernel_uses_m16n8k32_ldmatrix_and_async_copies(arch, shape, dtype):
    ops, used, _ = _kernel(_build(*shape, arch, dtype=dtype))
    missing = [op for op in (*MUST, IMMA[dtype]) if not ops[op]]
    assert not missing, (arch, shape, missing, sorted(ops))
    assert not any(op.startswith("IMMA.16816") for op in ops), sorted(ops)
    assert used.local == 0 and used.stack == 0 and used.registers <= 255, used
    tiles = mma_gemm.fallback_tiles(*shape[:2], shape[2], mma_gemm.arch_number(arch))
    assert tiles.shared_bytes <= mma_gemm.MAX_SHARED[mma_gemm.arch_number(arch)]
    print(f"{arch} {shape}: tiles {tuple(tiles)}, {used.registers} registers, {tiles.shared_bytes} B shared")


@needs_cuda_codegen
def test_a_stage_is_not_overwritten_before_every_warp_has_read_it():
    """In the K loop a barrier precedes the copies into the stage the previous step read (a WAR hazard
    TVM's barrier placement cannot see once the copies are cp.async), and each step waits for its group."""
    _, _, source = _kernel(_build(256, 256, 1024, "sm_80", mma_gemm.MmaTiles(2, 2, 2, 2, 2, 3)))
    loop = source[source.index("for (int k_0_0 = 0;"):]
    assert loop.index("__syncthreads()") < loop.index("cp.async.cg.shared.global")
    # Three stages: two groups may stay in flight while the oldest one is read.
    assert loop.index("cp.async.commit_group") < loop.index("cp.async.wait_group 2") < loop.index("ldmatrix")
    assert "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" in loop


@needs_cuda_codegen
@pytest.mark.parametrize("tiles", [mma_gemm.MmaTiles(1, 2, 2, 2, 1, 2), mma_gemm.MmaTiles(2, 1, 4, 2, 4, 4),
                                   mma_gemm.MmaTiles(4, 2, 2, 2, 2, 3)])
def test_other_tilings_compile_to_the_same_instructions(tiles):
    ops, used, _ = _kernel(_build(512, 512, 1024, "sm_90", tiles))
    assert all(ops[op] for op in (*MUST, IMMA["int8"])) and used.local == 0, (tiles, sorted(ops), used)


def test_an_invalid_config_of_the_template_is_an_instantiation_error():
    task = autotvm.task.create(mma_gemm.TASK, (te.placeholder((256, 512), "int8"), te.placeholder((256, 512), "int8"),
                                               "int32"), tvm.target.Target("cuda -arch=sm_90"))
    space = task.config_space
    invalid = next(space.get(i) for i in range(len(space))
                   if mma_gemm.fits(256, 256, 512, mma_gemm.MmaTiles(*(space.get(i)[key].val
                                                                       for key in mma_gemm.MmaTiles._fields)))
                   is not None)
    with tvm.target.Target("cuda -arch=sm_90"), pytest.raises(autotvm.task.space.InstantiationError):
        task.instantiate(invalid)


# --------------------------------------------------------------------------
# relay.build takes it where the GPU check verified it, and only there.
# --------------------------------------------------------------------------
def _requantized_dense(x: np.ndarray, w: np.ndarray) -> tvm.IRModule:
    """int8 dense, then what a quantized layer's epilogue looks like after lowering: bias, shift, clip, cast."""
    data = relay.var("x", shape=x.shape, dtype="int8")
    bias = relay.const(np.arange(w.shape[0], dtype="int32") * 37 - 4000)
    out = relay.add(relay.nn.dense(data, relay.const(w), out_dtype="int32"), bias)
    out = relay.cast(relay.clip(relay.right_shift(out, relay.const(9)), -128, 127), "int8")
    return tvm.IRModule.from_expr(relay.Function([data], out))


def _requantized_reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    acc = x.astype(np.int64) @ w.astype(np.int64).T + (np.arange(w.shape[0]) * 37 - 4000)
    return np.clip(acc >> 9, -128, 127).astype("int8")


def _relay_mma(arch: str, epilogue: bool = False, dtype: str = "int8") -> list:
    x = relay.var("x", shape=(256, 512), dtype=dtype)
    w = np.random.default_rng(0).integers(-128, 128, (256, 512)).astype("int8")
    mod = _requantized_dense(np.zeros((256, 512), "int8"), w) if epilogue else \
        tvm.IRModule.from_expr(relay.nn.dense(x, relay.const(w), out_dtype="int32"))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"))
    cubin = cuda.module_cubin(lib.get_lib())
    return sorted({op for code in cuda.sass(cubin).values() for op in SASS_OPCODE.findall(code) if op.startswith("IMMA")})


@needs_cuda_codegen
def test_relay_build_takes_the_kernel_on_verified_archs_only(monkeypatch):
    assert _relay_mma("sm_90") == (["IMMA.16832.S8.S8"] if "sm_90" in strategy.MMA_VERIFIED_ARCHS
                                   else ["IMMA.16816.S8.S8"])
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    assert _relay_mma("sm_90") == ["IMMA.16832.S8.S8"]
    # What Relay fuses after the dense (an extern op) is scheduled too: bias, shift, clip and cast.
    assert _relay_mma("sm_90", epilogue=True) == ["IMMA.16832.S8.S8"]
    assert _relay_mma("sm_90", dtype="uint8") == ["IMMA.16832.U8.S8"]  # onnxruntime's QDQ activations
    if "sm_80" not in strategy.MMA_VERIFIED_ARCHS:
        assert _relay_mma("sm_80") == ["IMMA.16816.S8.S8"]  # the WMMA kernel


# --------------------------------------------------------------------------
# On a GPU (scripts/gpu_check.sh runs these): bit-exact against numpy, alone and through relay.build.
# --------------------------------------------------------------------------
def _gpu_arch() -> str:
    return gpu_arch(mma_gemm.MIN_ARCH)


def _operands(m: int, n: int, k: int, seed: int = 0, dtype: str = "int8"):
    rng = np.random.default_rng(seed)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (m, k)).astype(dtype)
    w = rng.integers(-128, 128, (n, k)).astype("int8")
    # The range's ends: -128 x -128 (or 255 x -128) products are the largest.
    x.flat[0], w.flat[-1], w.flat[0] = info.min if dtype == "int8" else info.max, -128, -128
    return x, w


@pytest.mark.parametrize("shape, tiles, dtype", [
    ((512, 4096, 1024), None, "int8"), ((128, 768, 3072), None, "int8"), ((2048, 2048, 2048), None, "int8"),
    ((512, 4096, 1024), None, "uint8"), ((128, 768, 3072), None, "uint8"),
    ((512, 512, 1024), mma_gemm.MmaTiles(1, 2, 2, 2, 1, 2), "int8"),
    ((512, 512, 1024), mma_gemm.MmaTiles(2, 1, 4, 2, 4, 4), "uint8"),
    ((512, 512, 1024), mma_gemm.MmaTiles(4, 2, 2, 2, 2, 3), "int8"),
    ((256, 256, 8192), mma_gemm.MmaTiles(2, 2, 2, 2, 2, 4), "int8"),
], ids=lambda v: "x".join(map(str, v)) if isinstance(v, tuple) else str(v))
def test_kernel_is_bit_exact_on_the_gpu(shape, tiles, dtype):
    arch = _gpu_arch()
    m, n, k = shape
    x, w = _operands(m, n, k, dtype=dtype)
    func = _build(m, n, k, arch, tiles, dtype)
    dev = tvm.cuda(0)
    out = tvm.nd.empty((m, n), "int32", dev)
    func(tvm.nd.array(x, dev), tvm.nd.array(w, dev), out)
    np.testing.assert_array_equal(out.numpy(), (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.int32))


def test_relay_build_runs_it_and_its_epilogue_bit_exact_on_the_gpu(monkeypatch):
    from tvm.contrib import graph_executor

    arch = _gpu_arch()
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({arch}))
    x, w = _operands(256, 512, 1024, seed=1)
    mod = _requantized_dense(x, w)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"))
    assert any(op == "IMMA.16832.S8.S8" for code in cuda.sass(cuda.module_cubin(lib.get_lib())).values()
               for op in SASS_OPCODE.findall(code))
    module = graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("x", x)
    module.run()
    np.testing.assert_array_equal(module.get_output(0).numpy(), _requantized_reference(x, w))


# --------------------------------------------------------------------------
# The GPU check's rehearsal of this kernel (scripts/gpu_check.sh: dense and tune_dense_mma parts).
# --------------------------------------------------------------------------
@needs_cuda_codegen
def test_gpu_check_rehearses_the_kernel_beside_the_wmma_one(tmp_path):
    from tvm_tcutils.bench import gpu_check
    from tvm_tcutils.bench.results import Results

    if _STATUS["device"]:
        pytest.skip("this machine has a GPU: the rehearsal is for machines without one")
    results = Results("gpu_check_test", [])
    gpu_check.dense(results, "sm_90", shapes=[(128, 256, 512)])
    (row,) = results.rows
    assert row["rehearsal"] and row["kernels"] == ["mma", "tcutils", "wgmma"] and row["mma_tiles"]["stages"] >= 2
    assert row["wgmma_tiles"]["n_tile"] == 64  # sm_90: the warp-group kernel too
    before = strategy.MMA_VERIFIED_ARCHS
    gpu_check.tune(results, "sm_90", "dense_mma", log_dir=str(tmp_path))
    tuned = results.rows[-1]
    assert tuned["rehearsal"] and tuned["tasks"] == 1 and tuned["template"] == mma_gemm.TASK
    assert strategy.MMA_VERIFIED_ARCHS is before  # the part let relay.build take it for its own run only


# --------------------------------------------------------------------------
# The batched form (nn.batch_matmul: attention's two activations, any int8/uint8 pair).
# --------------------------------------------------------------------------
def test_batches_must_agree():
    with pytest.raises(ValueError, match="data has batch 4, weight 2"):
        mma_gemm.batch_matmul(te.placeholder((4, 128, 64), "uint8"), te.placeholder((2, 128, 64), "uint8"))
    with pytest.raises(ValueError, match="batch_matmul needs 3-D"):
        mma_gemm.batch_matmul(te.placeholder((128, 64), "uint8"), te.placeholder((128, 64), "uint8"))


@needs_cuda_codegen
@pytest.mark.parametrize("dtypes, imma", [(("uint8", "uint8"), "IMMA.16832.U8.U8"),
                                          (("int8", "uint8"), "IMMA.16832.S8.U8")])
def test_batched_kernel_puts_the_batches_on_the_grid(dtypes, imma):
    target = tvm.target.Target("cuda -arch=sm_80", host="llvm")
    x, w = te.placeholder((4, 64, 64), dtypes[0], name="x"), te.placeholder((4, 128, 64), dtypes[1], name="w")
    with target:
        out = mma_gemm.batch_matmul(x, w, arch=80)
        sched = mma_gemm.schedule_dense(None, [out])
    ops, used, source = _kernel(tvm.build(sched, [x, w, out], target=target))
    assert ops[imma] and ops["LDSM.16.M88.4"] and used.local == 0, sorted(ops)
    assert "blockIdx.z) * 4096" in source and "blockIdx.z) * 8192" in source  # each batch's own x and w


def _relay_batch_matmul_mma(seq: int) -> list:
    x = relay.var("x", shape=(4, seq, 64), dtype="uint8")
    y = relay.var("y", shape=(4, seq, 64), dtype="uint8")
    out = relay.cast(relay.clip(relay.right_shift(relay.nn.batch_matmul(x, y, out_dtype="int32"),
                                                  relay.const(9)), 0, 255), "uint8")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x, y], out)),
                          target=tvm.target.Target("cuda -arch=sm_80", host="llvm"))
    codes = cuda.sass(cuda.module_cubin(lib.get_lib())).values()
    return sorted({op for code in codes for op in SASS_OPCODE.findall(code) if "MMA" in op})


@needs_cuda_codegen
def test_relay_batch_matmul_with_its_epilogue_takes_it_where_verified(monkeypatch):
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_80"}))
    assert _relay_batch_matmul_mma(64) == ["IMMA.16832.U8.U8"]
    # A sequence its tiles do not fit still builds (TVM's tensor-core row cannot, with the epilogue fused):
    # TVM's plain CUDA batch_matmul, exclusive, where the QDQ route made the product uint8.
    assert _relay_batch_matmul_mma(48) == []
