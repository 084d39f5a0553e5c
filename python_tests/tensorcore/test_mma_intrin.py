"""The package's m16n8k32 intrinsics: their maps make a GEMM, their descriptions match their implementations,
and the kernel they tensorize is the one TVM's int8 intrinsics give (the oracle, under ``-m slow``)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import tvm
from tvm import te

from tvm_tcutils import cuda
from tvm_tcutils.tensorcore.topi import mma_gemm, mma_intrin

_EXTREMES = {"int8": (-128, 127), "uint8": (0, 255)}


@pytest.mark.parametrize("dtype, b_dtype, seed", itertools.product(mma_intrin.A_DTYPES, mma_intrin.A_DTYPES, range(2)))
def test_the_implementations_maps_compute_the_product(dtype, b_dtype, seed):
    rng = np.random.default_rng(seed)
    low, high = _EXTREMES[dtype]
    a = rng.integers(low, high + 1, (16, 32)).astype(dtype)
    b = rng.integers(_EXTREMES[b_dtype][0], _EXTREMES[b_dtype][1] + 1, (16, 32)).astype(b_dtype)
    a[0, :] = low if dtype == "int8" else high  # the largest products
    b[:, 0] = _EXTREMES[b_dtype][0] if b_dtype == "int8" else _EXTREMES[b_dtype][1]
    np.testing.assert_array_equal(mma_intrin.simulate(a, b), a.astype(np.int32) @ b.astype(np.int32).T)


@pytest.mark.parametrize("operand, layout", [("A", mma_intrin.fragment_a), ("B", mma_intrin.fragment_b)])
def test_descriptions_place_each_byte_where_ldmatrix_puts_it(operand, layout):
    tile = np.arange(16 * 32, dtype=np.int32).reshape(16, 32)  # every byte distinct
    regs = mma_intrin.loaded(tile, operand)
    slots = {layout(i, j) for i in range(16) for j in range(32)}
    assert len(slots) == 16 * 32  # one byte per slot
    for i, j in itertools.product(range(16), range(32)):
        assert regs[layout(i, j)] == tile[i, j], (operand, i, j)


def test_accumulator_description_is_the_stores_inverse():
    positions = {mma_intrin.store_position(lane, reg) for lane in range(32) for reg in range(8)}
    assert positions == set(itertools.product(range(16), range(16)))
    for lane, reg in itertools.product(range(32), range(8)):
        assert mma_intrin.fragment_c(*mma_intrin.store_position(lane, reg)) == (lane, reg)


def test_a_wrong_map_is_caught():
    # The check above is not vacuous: B's ldmatrix does not place bytes where the A tile's map says.
    tile = np.arange(16 * 32, dtype=np.int32).reshape(16, 32)
    regs = mma_intrin.loaded(tile, "B")
    assert any(regs[mma_intrin.fragment_a(i, j)] != tile[i, j] for i in range(16) for j in range(32))


def test_names_are_registered_once_and_bad_types_refused():
    first = mma_intrin.names("uint8")
    assert mma_intrin.names("uint8") == first
    assert tvm.tir.TensorIntrin.get(first["mma"]) is not None
    assert first["load_b"] == mma_intrin.names("int8")["load_b"]  # the weight is int8 either way
    with pytest.raises(TypeError, match="a_dtype: .* int8 or uint8 operands, got float16"):
        mma_intrin.names("float16")


_STATUS = cuda.status()


def _tvms_intrinsics() -> mma_intrin.IntrinsicSet:
    """TVM's int8 intrinsics (reading dynamic shared memory) as an intrinsic set for the same schedule."""
    from tvm.tir import TensorIntrin
    from tvm.tir.tensor_intrin import cuda as tvm_cuda

    loads = {"load_a": ("oracle_ldmatrix_a_dyn", "A", False), "load_b": ("oracle_ldmatrix_b_dyn", "B", True)}
    for name, matrix, transposed in loads.values():
        if TensorIntrin.get(name, allow_missing=True) is None:
            TensorIntrin.register(name, *tvm_cuda.get_ldmatrix_intrin(32, "int8", matrix, transposed, "shared.dyn"))
    names = {key: value[0] for key, value in loads.items()}
    names.update(mma=tvm_cuda.MMA_i8i8i32_TRANS_B_INTRIN, fill=tvm_cuda.MMA_fill_16x16_i32_INTRIN,
                 store=tvm_cuda.MMA_store_16x16_i32_global_INTRIN)
    ab = tvm_cuda.shared_16x32_to_ldmatrix_32x16_layout
    return mma_intrin.IntrinsicSet(names, ab, ab, tvm_cuda.shared_16x16_to_ldmatrix_32x8_layout)


def _kernel_source(intrinsics=None) -> str:
    target = tvm.target.Target("cuda -arch=sm_80", host="llvm")
    x, w = te.placeholder((256, 256), "int8", name="x"), te.placeholder((256, 256), "int8", name="w")
    func = mma_gemm.lower(mma_gemm.schedule_primfunc(x, w, mma_gemm.MmaTiles(2, 2, 2, 2, 2, 3), intrinsics))
    return tvm.build(func, target=target).imported_modules[0].get_source()


def _before_the_store(source: str) -> list:
    lines = source.splitlines()
    end = next(n for n, line in enumerate(lines) if "local_id" in line or "dense_mma[" in line)
    return lines[:end]


@pytest.mark.slow
@pytest.mark.skipif(not _STATUS["codegen"], reason=f"no CUDA code generation here: {_STATUS['reason']}")
def test_the_kernel_is_the_one_tvms_int8_intrinsics_give():
    # Slow: importing TVM's intrinsics parses some eighty TVMScript functions. The copies, every ldmatrix
    # address and mma operand are the same code; the stores differ in form only (TVM's mma_store loop, the
    # package's unrolled stores of store_position, checked above against fragment_c).
    ours, theirs = _kernel_source(), _kernel_source(_tvms_intrinsics())
    assert _before_the_store(ours) == _before_the_store(theirs)
    assert ours.count("mma.sync.aligned.m16n8k32") == theirs.count("mma.sync.aligned.m16n8k32") > 0
