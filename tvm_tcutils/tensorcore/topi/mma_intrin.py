"""The package's own TensorIR intrinsics for ``mma.sync.m16n8k32`` on 8-bit operands.

:mod:`.mma_gemm` tensorizes its fragments with these rather than TVM's
``tvm.tir.tensor_intrin.cuda``, for two reasons:

* importing TVM's module parses some eighty TVMScript functions (10-50 s on a
  busy 2-core machine, in every process that schedules the kernel); these are
  the six the kernel needs, built on first use;
* TVM registers int8 x int8 only, while onnxruntime's QDQ files and the
  package's Relay routes give the GEMM *uint8* activations: PTX's
  ``mma.sync.m16n8k32`` takes ``.u8.s8`` as well, and the register layouts are
  those of ``.s8.s8``.

The layouts (from the PTX ISA's "Matrix fragments for mma.m16n8k32"; a lane is
``4 * group + index-in-group``):

* A, a 16x32 byte tile, is four 8x16-byte matrices read by one ``ldmatrix.x4``:
  register ``q`` of a lane holds rows ``8 * (q % 2) + group``, bytes
  ``16 * (q // 2) + 4 * index .. + 3``;
* B, stored as 16 (n) x 32 (k) bytes (the weight's rows), the same way with the
  matrices ordered n-major: registers ``2h, 2h + 1`` are the k = 0-15 and 16-31
  halves of columns ``8h + group``, the B operand of the ``h``-th m16n8k32;
* the 16x16 int32 accumulator: registers ``4h .. 4h + 3`` are the ``h``-th
  16x8 result, ``(row group, cols 2 * index, +1)`` then ``(row group + 8, ...)``.

:func:`simulate` replays these maps through the instructions' definitions in
numpy: the CPU check that the maps make a GEMM.

Examples
--------
>>> fragment_a(9, 17)  # row 9, byte 17 of an A tile: matrix 3, lane 4 * 1 + 0, register 3's byte 1
(4, 13)
>>> fragment_c(15, 15)
(31, 7)
"""
from __future__ import annotations

from typing import Callable, Dict, NamedTuple

import numpy as np

from ..._tvm import tvm  # noqa: F401  (the package's TVM, loaded first)
from tvm import tir
from tvm.script import tir as T

#: Lanes of a warp.
LANES = 32

#: Bytes of an A or B operand tile a lane holds (16x32 bytes over 32 lanes).
OPERAND_BYTES = 16

#: int32 accumulators of a 16x16 tile a lane holds.
ACCUMULATORS = 8

#: 8-bit activation types the A operand may have (the weight is int8).
A_DTYPES = ("int8", "uint8")


def fragment_a(i, j):
    """Row ``i``, byte ``j`` of a 16x32 A tile -> (lane, byte of the lane's 16) after ``ldmatrix.x4``."""
    matrix = i // 8 + 2 * (j // 16)
    return 4 * (i % 8) + (j % 16) // 4, 4 * matrix + j % 4


def fragment_b(n, k):
    """Column ``n``, byte ``k`` of a 16 (n) x 32 (k) B tile -> (lane, byte of the lane's 16)."""
    matrix = 2 * (n // 8) + k // 16
    return 4 * (n % 8) + (k % 16) // 4, 4 * matrix + k % 4


def fragment_c(i, j):
    """Element (i, j) of a 16x16 int32 accumulator tile -> (lane, register of the lane's 8)."""
    return 4 * (i % 8) + (j % 8) // 2, 4 * (j // 8) + 2 * (i // 8) + j % 2


def _address_a(lane):
    """(row, byte) of the 16-byte row a lane hands ``ldmatrix.x4`` for an A tile: matrix ``lane // 8``."""
    return lane % 16, 16 * (lane // 16)


def _address_b(lane):
    """(n, byte) of the 16-byte row a lane hands ``ldmatrix.x4`` for a B tile (matrices ordered n-major)."""
    return lane % 8 + 8 * (lane // 16), 16 * ((lane // 8) % 2)


def store_position(lane, reg):
    """(row, column) of a 16x16 int32 tile that accumulator register ``reg`` of ``lane`` holds (the inverse of
    :func:`fragment_c`): result half ``reg // 4``, row half ``(reg // 2) % 2``, column ``reg % 2`` of its pair."""
    return lane // 4 + 8 * ((reg // 2) % 2), 8 * (reg // 4) + 2 * (lane % 4) + reg % 2


def _ldmatrix(operand: str, dtype: str, scope: str):
    layout = fragment_a if operand == "A" else fragment_b
    address = _address_a if operand == "A" else _address_b

    @T.prim_func
    def desc(warp_handle: T.handle, shared_handle: T.handle) -> None:
        shared = T.match_buffer(shared_handle, (16, 32), dtype, align=64, offset_factor=16, scope=scope)
        warp = T.match_buffer(warp_handle, (LANES, OPERAND_BYTES), dtype, align=64, offset_factor=16,
                              scope="warp")
        with T.block("root"):
            T.reads(shared[0:16, 0:32])
            T.writes(warp[0:LANES, 0:OPERAND_BYTES])
            for row, col in T.grid(16, 32):
                with T.block("load"):
                    vi, vj = T.axis.remap("SS", [row, col])
                    lane, byte = T.meta_var(layout(vi, vj))
                    T.reads(shared[vi, vj])
                    T.writes(warp[lane, byte])
                    warp[lane, byte] = shared[vi, vj]

    @T.prim_func
    def impl(warp_handle: T.handle, shared_handle: T.handle) -> None:
        stride = T.int32()
        unit = T.int32()
        shared = T.match_buffer(shared_handle, (16, 32), dtype, align=64, offset_factor=16, scope=scope,
                                strides=[stride, unit])
        warp = T.match_buffer(warp_handle, (LANES, OPERAND_BYTES), dtype, align=64, offset_factor=16,
                              scope="warp")
        with T.block("root"):
            T.reads(shared[0:16, 0:32])
            T.writes(warp[0:LANES, 0:OPERAND_BYTES])
            lane = T.env_thread("threadIdx.x")
            T.launch_thread(lane, LANES)
            row, byte = T.meta_var(address(lane))
            T.evaluate(T.ptx_ldmatrix(dtype, False, 4, ".b16", warp.data, warp.elem_offset + OPERAND_BYTES * lane,
                                      shared.access_ptr("r"), row * stride + byte))

    return desc, impl


def _mma(a_dtype: str, b_dtype: str = "int8"):
    @T.prim_func
    def desc(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (LANES, OPERAND_BYTES), a_dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (LANES, OPERAND_BYTES), b_dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (LANES, ACCUMULATORS), "int32", align=64, offset_factor=16, scope="warp")
        with T.block("root"):
            T.reads(C[0:LANES, 0:ACCUMULATORS], A[0:LANES, 0:OPERAND_BYTES], B[0:LANES, 0:OPERAND_BYTES])
            T.writes(C[0:LANES, 0:ACCUMULATORS])
            for i, j, k in T.grid(16, 16, 32):
                with T.block("mma"):
                    vi, vj, vk = T.axis.remap("SSR", [i, j, k])
                    c_lane, c_reg = T.meta_var(fragment_c(vi, vj))
                    a_lane, a_byte = T.meta_var(fragment_a(vi, vk))
                    b_lane, b_byte = T.meta_var(fragment_b(vj, vk))
                    T.reads(C[c_lane, c_reg], A[a_lane, a_byte], B[b_lane, b_byte])
                    T.writes(C[c_lane, c_reg])
                    C[c_lane, c_reg] = C[c_lane, c_reg] + T.Cast("int32", A[a_lane, a_byte]) * T.Cast(
                        "int32", B[b_lane, b_byte])

    @T.prim_func
    def impl(a: T.handle, b: T.handle, c: T.handle) -> None:
        A = T.match_buffer(a, (LANES, OPERAND_BYTES), a_dtype, align=64, offset_factor=16, scope="warp")
        B = T.match_buffer(b, (LANES, OPERAND_BYTES), b_dtype, align=64, offset_factor=16, scope="warp")
        C = T.match_buffer(c, (LANES, ACCUMULATORS), "int32", align=64, offset_factor=16, scope="warp")
        with T.block("root"):
            T.reads(C[0:LANES, 0:ACCUMULATORS], A[0:LANES, 0:OPERAND_BYTES], B[0:LANES, 0:OPERAND_BYTES])
            T.writes(C[0:LANES, 0:ACCUMULATORS])
            lane = T.env_thread("threadIdx.x")
            T.launch_thread(lane, LANES)
            # The h-th m16n8k32 takes B's registers 2h, 2h + 1 (bytes 8h..) and yields C's 4h .. 4h + 3.
            for half in T.unroll(2):
                T.evaluate(T.ptx_mma("int32", "m16n8k32", "row", "col", a_dtype, b_dtype, "int32",
                                     A.data, A.elem_offset + lane * OPERAND_BYTES,
                                     B.data, B.elem_offset + lane * OPERAND_BYTES + half * 8,
                                     C.data, C.elem_offset + lane * ACCUMULATORS + half * 4, False))

    return desc, impl


def _fill():
    @T.prim_func
    def desc(c: T.handle) -> None:
        C = T.match_buffer(c, (LANES, ACCUMULATORS), "int32", scope="warp")
        with T.block("root"):
            T.reads()
            T.writes(C[0:LANES, 0:ACCUMULATORS])
            for i, j in T.grid(16, 16):
                with T.block("fill"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(fragment_c(vi, vj))
                    T.reads()
                    T.writes(C[lane, reg])
                    C[lane, reg] = T.int32(0)

    @T.prim_func
    def impl(c: T.handle) -> None:
        C = T.match_buffer(c, (LANES, ACCUMULATORS), "int32", scope="warp", offset_factor=1)
        with T.block("root"):
            T.reads()
            T.writes(C[0:LANES, 0:ACCUMULATORS])
            lane = T.env_thread("threadIdx.x")
            T.launch_thread(lane, LANES)
            T.evaluate(T.mma_fill("int32", ACCUMULATORS, C.data, C.elem_offset))

    return desc, impl


def _store(scope: str):
    @T.prim_func
    def desc(a: T.handle, c: T.handle) -> None:
        C_warp = T.match_buffer(a, (LANES, ACCUMULATORS), "int32", scope="warp")
        C = T.match_buffer(c, (16, 16), "int32", scope=scope)
        with T.block("root"):
            T.reads(C_warp[0:LANES, 0:ACCUMULATORS])
            T.writes(C[0:16, 0:16])
            for i, j in T.grid(16, 16):
                with T.block("store"):
                    vi, vj = T.axis.remap("SS", [i, j])
                    lane, reg = T.meta_var(fragment_c(vi, vj))
                    T.reads(C_warp[lane, reg])
                    T.writes(C[vi, vj])
                    C[vi, vj] = C_warp[lane, reg]

    @T.prim_func
    def impl(a: T.handle, c: T.handle) -> None:
        stride = T.int32()
        unit = T.int32()
        C_warp = T.match_buffer(a, (LANES, ACCUMULATORS), "int32", scope="warp", offset_factor=1)
        C = T.match_buffer(c, (16, 16), "int32", scope=scope, offset_factor=1, strides=[stride, unit])
        with T.block("root"):
            T.reads(C_warp[0:LANES, 0:ACCUMULATORS])
            T.writes(C[0:16, 0:16])
            lane = T.env_thread("threadIdx.x")
            T.launch_thread(lane, LANES)
            for reg in T.unroll(ACCUMULATORS):
                row, col = T.meta_var(store_position(lane, reg))
                C[row, col] = C_warp[lane, reg]

    return desc, impl


class IntrinsicSet(NamedTuple):
    """What a schedule tensorizes with: registered names (``load_a``, ``load_b``, ``mma``, ``fill``,
    ``store``) and the tile maps their descriptions use (a tile's (row, column) -> (lane, slot))."""

    names: Dict[str, str]
    map_a: Callable
    map_b: Callable
    map_c: Callable


def intrinsics(a_dtype: str, scope: str = "shared.dyn", b_dtype: str = "int8") -> IntrinsicSet:
    """This module's intrinsics for an ``a_dtype`` x ``b_dtype`` GEMM reading ``scope`` (see :func:`names`).

    Examples
    --------
    >>> intrinsics("int8").map_b is fragment_b
    True
    """
    return IntrinsicSet(names(a_dtype, scope, b_dtype), fragment_a, fragment_b, fragment_c)


def names(a_dtype: str, scope: str = "shared.dyn", b_dtype: str = "int8") -> Dict[str, str]:
    """The registered intrinsics' names for an ``a_dtype`` x ``b_dtype`` GEMM reading ``scope``,
    registering them on first use: keys ``load_a``, ``load_b``, ``mma``, ``fill``, ``store``. PTX's 8-bit
    ``mma.m16n8k32`` takes any pair of ``.s8``/``.u8``: weights are int8, the two activations of an
    attention product may both be uint8.

    Raises
    ------
    TypeError
        For a dtype that is not one of :data:`A_DTYPES`.

    Examples
    --------
    >>> sorted(names("uint8"))
    ['fill', 'load_a', 'load_b', 'mma', 'store']
    >>> names("uint8", b_dtype="uint8")["mma"]
    'tcutils_mma_m16n8k32x2_u8u8'
    >>> names("int4")
    Traceback (most recent call last):
    ...
    TypeError: a_dtype: the m16n8k32 intrinsics take int8 or uint8 operands, got int4
    """
    for argument, dtype in (("a_dtype", a_dtype), ("b_dtype", b_dtype)):
        if dtype not in A_DTYPES:
            raise TypeError(f"{argument}: the m16n8k32 intrinsics take {' or '.join(A_DTYPES)} operands, got {dtype}")
    short = {"int8": "s8", "uint8": "u8"}
    scope_name = scope.replace(".", "_")
    wanted = {
        "load_a": (f"tcutils_ldmatrix_a_{short[a_dtype]}_{scope_name}", lambda: _ldmatrix("A", a_dtype, scope)),
        "load_b": (f"tcutils_ldmatrix_b_{short[b_dtype]}_{scope_name}", lambda: _ldmatrix("B", b_dtype, scope)),
        "mma": (f"tcutils_mma_m16n8k32x2_{short[a_dtype]}{short[b_dtype]}", lambda: _mma(a_dtype, b_dtype)),
        "fill": ("tcutils_mma_fill_16x16_s32", _fill),
        "store": ("tcutils_mma_store_16x16_s32_global", lambda: _store("global")),
    }
    for name, build in wanted.values():
        if tir.TensorIntrin.get(name, allow_missing=True) is None:
            tir.TensorIntrin.register(name, *build())
    return {key: name for key, (name, _) in wanted.items()}


def loaded(tile: np.ndarray, operand: str) -> np.ndarray:
    """What ``ldmatrix.x4`` puts in each lane's 16 bytes (``(32, 16)``) for a 16x32-byte ``operand`` ("A" or
    "B") tile, from the rows this module's intrinsic hands it: matrix ``q``'s row ``r`` comes from the
    address lane ``8q + r`` gives; lane ``L`` receives, as register ``q``, bytes ``4 * (L % 4) .. + 3`` of
    matrix ``q``'s row ``L // 4``.

    Examples
    --------
    >>> tile = np.arange(512).reshape(16, 32)
    >>> lane, byte = fragment_b(12, 20)
    >>> bool(loaded(tile, "B")[lane, byte] == tile[12, 20])
    True
    """
    address = {"A": _address_a, "B": _address_b}[operand]
    regs = np.zeros((LANES, OPERAND_BYTES), tile.dtype)
    for lane in range(LANES):
        for q in range(4):
            row, byte = address(8 * q + lane // 4)
            regs[lane, 4 * q:4 * q + 4] = tile[row, byte + 4 * (lane % 4):byte + 4 * (lane % 4) + 4]
    return regs


def simulate(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A 16x32 A tile times a 16 (n) x 32 (k) B tile, transposed, as the intrinsics' implementations compute
    it: :func:`loaded` fragments, the two ``mma.m16n8k32`` per the PTX ISA's fragment definitions (B's bytes
    ``8h ..`` for the ``h``-th, C's registers ``4h ..``) and the store's :func:`store_position`. Equals
    ``a @ b.T`` exactly when the implementations' maps are right; the descriptions' maps
    (:func:`fragment_a`, ...) are checked against :func:`loaded` and :func:`store_position` by the tests.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> a = rng.integers(0, 256, (16, 32)).astype(np.uint8); b = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    >>> bool((simulate(a, b) == a.astype(np.int32) @ b.astype(np.int32).T).all())
    True
    """
    frag_a, frag_b = loaded(a, "A"), loaded(b, "B")
    acc = np.zeros((LANES, ACCUMULATORS), np.int32)
    for half in range(2):
        # mma.m16n8k32 with 8-bit A (row) and B (col): lane = 4 * group + index.
        a16 = np.zeros((16, 32), np.int32)
        b8 = np.zeros((32, 8), np.int32)
        for lane in range(LANES):
            group, index = divmod(lane, 4)
            for reg in range(4):
                col = 16 * (reg // 2) + 4 * index
                a16[group + 8 * (reg % 2), col:col + 4] = frag_a[lane, 4 * reg:4 * reg + 4]
            for reg in range(2):
                row, byte = 16 * reg + 4 * index, 8 * half + 4 * reg
                b8[row:row + 4, group] = frag_b[lane, byte:byte + 4]
        d = a16 @ b8
        for lane in range(LANES):
            group, index = divmod(lane, 4)
            for reg in range(4):
                acc[lane, 4 * half + reg] += d[group + 8 * (reg // 2), 2 * index + reg % 2]
    out = np.zeros((16, 16), np.int32)
    for lane in range(LANES):
        for reg in range(ACCUMULATORS):
            out[store_position(lane, reg)] = acc[lane, reg]
    return out
