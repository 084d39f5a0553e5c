"""int8 dense on Hopper (sm_90a): warp-group MMA (``wgmma.mma_async``) fed by a multi-stage ``cp.async`` pipeline.

Hopper's int8 peak needs its warp-group instruction: ``mma.sync`` (:mod:`.mma_gemm`)
reaches a fraction of it. Here four warps (a *warp group*, 128 threads) multiply
a 64 x ``n_tile`` x 32 product per instruction, both operands read by the tensor
cores straight from shared memory through 64-bit matrix descriptors
(``IGMMA.64xNx32`` in SASS), the int32 accumulators in registers.

The kernel:

* a block is ``warpgroups`` warp groups stacked along M (64 rows each), all
  sharing the block's ``n_tile`` columns;
* each K stage (``32 * chunk`` bytes) of both operands travels global -> shared
  with ``cp.async`` (``LDGSTS``), ``stages`` of them in flight, laid out in the
  descriptors' canonical no-swizzle K-major form: 8-row x 16-byte *core
  matrices* of 128 contiguous bytes, core matrices adjacent in M (or N) 128
  bytes apart (the *stride* byte offset), adjacent in K ``rows * 16`` bytes
  apart (the *leading* byte offset): :func:`shared_offset`;
* after a stage has landed (``cp.async.wait_group``, a proxy fence so that the
  tensor cores' asynchronous reads see the copies, a block barrier) the next
  stage's copies are issued into the slot the step before last read, then the
  warp groups issue their ``wgmma`` (``wgmma.fence``, one per 32 bytes of K,
  ``commit_group``) and wait until at most this step's group is in flight
  (``wait_group 1``): the tensor cores multiply while the warps wait, fence and
  copy for the next step;
* the accumulators go to global memory in the instruction's D layout
  (:func:`accumulator_position`).

TVM 0.19 has no warp-group intrinsics: the kernel is written in TIR with the
package's device helpers (:data:`HELPERS`: descriptor, fences, the
``wgmma.mma_async`` inline assembly per shape and operand types) called as
externs, and :func:`add_helpers` puts their definitions in front of the CUDA
source in the package's ``tvm_callback_cuda_postproc``. ``wgmma`` needs the
architecture-specific ``sm_90a``: the package's CUDA compile step compiles a
module holding it for ``sm_90a`` where the target says ``sm_90``.

Examples
--------
>>> tiles = WgmmaTiles(2, 128, 2, 4)
>>> tiles.block, tiles.threads, tiles.shared_bytes
((128, 128, 64), 256, 65536)
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Tuple

import numpy as np

from ..._tvm import tvm  # noqa: F401  (the package's TVM, loaded first)
from tvm import te, tir
from tvm.script import tir as T

from ...cuda import prepend_helpers
from .mma_gemm import (arch_number, extern_op, operand_sizes, schedule_dense, template_tiles,
                       whole_tiles_problem)

#: AutoTVM task name of the template.
TASK = "tcutils.dense_wgmma.cuda"

#: The architecture-specific target ``wgmma`` needs (``sm_90`` without ``a`` rejects it).
ARCH = "sm_90a"

#: Threads of a warp group.
GROUP_THREADS = 128

#: Rows of the product one warp group's instruction computes.
GROUP_ROWS = 64

#: Bytes of K one instruction multiplies (int8 and uint8).
STEP_K = 32

#: N sizes of the instruction the kernel issues (a multiple of 8 up to 256 exists; these tile well).
N_TILES = (64, 128, 256)

#: Bytes of one core matrix row, and of one ``cp.async``.
CORE_ROW = 16

#: Bytes between core matrices adjacent in M (or N): the descriptors' stride byte offset (each core matrix is
#: 8 rows x 16 bytes, contiguous; the leading byte offset, between core matrices adjacent in K, is rows x 16).
STRIDE_BYTES = 128

#: Opt-in shared memory of an sm_90 block (CUDA programming guide).
MAX_SHARED = 227 * 1024

#: Registers a thread may have (the accumulators take ``n_tile / 2``).
MAX_REGISTERS = 255

#: The package's 8-bit activation types (the weight is int8).
A_DTYPES = {"int8": "s8", "uint8": "u8"}

#: Knob values of an AutoTVM template over this kernel.
WARPGROUPS = (1, 2)
CHUNKS = (1, 2, 4)
STAGES = (3, 4, 5, 6)


class WgmmaTiles(NamedTuple):
    """One tiling: warp groups along M, the instruction's N, 32-byte K steps per stage, stages in flight."""

    warpgroups: int
    n_tile: int
    chunk: int
    stages: int

    @property
    def block(self) -> Tuple[int, int, int]:
        """Rows, columns and K bytes of one block's tile per stage."""
        return self.warpgroups * GROUP_ROWS, self.n_tile, self.chunk * STEP_K

    @property
    def threads(self) -> int:
        return self.warpgroups * GROUP_THREADS

    @property
    def shared_bytes(self) -> int:
        rows_m, rows_n, k = self.block
        return (rows_m + rows_n) * k * self.stages

    def problem(self) -> Optional[str]:
        """Why this tiling cannot be scheduled at all (None when it can).

        Examples
        --------
        >>> WgmmaTiles(1, 96, 2, 3).problem()
        'n_tile 96 is not one of (64, 128, 256)'
        """
        rows_m, rows_n, k = self.block
        if self.n_tile not in N_TILES:
            return f"n_tile {self.n_tile} is not one of {N_TILES}"
        if self.stages < 3:
            return (f"{self.stages} stages cannot overlap copies and multiplies (at least 3: one being copied, "
                    "one multiplied, one still read by the instructions left in flight)")
        for rows in (rows_m, rows_n):
            if rows * k // CORE_ROW % self.threads:
                return f"{rows} rows of {k} bytes do not split into {self.threads} threads' 16-byte copies"
        if self.shared_bytes > MAX_SHARED:
            return f"{self.shared_bytes} bytes of shared memory exceed sm_90's {MAX_SHARED} a block"
        return None


#: Tilings the untuned kernel chooses from, largest first (:func:`fallback_tiles`).
FALLBACK_TILES: Tuple[WgmmaTiles, ...] = (
    WgmmaTiles(2, 256, 2, 5),  # 128 x 256: CUTLASS's usual Hopper tile, two warp groups; 120 KB
    WgmmaTiles(2, 128, 2, 5),  # 128 x 128
    WgmmaTiles(1, 128, 2, 5),  # 64 x 128
    WgmmaTiles(1, 64, 2, 5),   # 64 x 64
)

#: Streaming multiprocessors of an H100/H200 (SXM): the fallback tile is the largest whose grid fills them.
SMS = 132


def fits(m: int, n: int, k: int, tiles: WgmmaTiles) -> Optional[str]:
    """Why ``tiles`` cannot compute an ``m x n x k`` product (None when it can).

    Examples
    --------
    >>> fits(4096, 4096, 4096, FALLBACK_TILES[0]) is None
    True
    >>> fits(4096, 4096, 96, FALLBACK_TILES[0])
    'K = 96 is not a multiple of the 64-byte stage'
    """
    return whole_tiles_problem(m, n, k, tiles, tiles.stages - 2)  # the stages prefetched before the loop


def fallback_tiles(m: int, n: int, k: int) -> Optional[WgmmaTiles]:
    """The untuned tiling: the largest of :data:`FALLBACK_TILES` whose grid fills an H100's SMs once, else
    the one with the most blocks; None when none fits.

    Examples
    --------
    >>> fallback_tiles(4096, 4096, 4096).block
    (128, 256, 64)
    >>> fallback_tiles(128, 1024, 1024).block
    (64, 64, 64)
    """
    usable = [t for t in FALLBACK_TILES if fits(m, n, k, t) is None]
    if not usable:
        return None

    def blocks(t: WgmmaTiles) -> int:
        return (m // t.block[0]) * (n // t.block[1])

    for tiles in usable:
        if blocks(tiles) >= SMS:
            return tiles
    return max(usable, key=blocks)


def shared_offset(row, byte, rows: int):
    """Byte offset of an operand's (row, K byte) in a stage of ``rows`` rows: the canonical no-swizzle
    K-major layout (16-byte column ``byte // 16`` of core matrices, each 8 rows x 16 bytes contiguous).

    Examples
    --------
    >>> shared_offset(9, 17, 64)  # core matrix 8 (K column 1) + 1 (rows 8-15), its row 1, byte 1
    1169
    """
    return ((byte // CORE_ROW) * (rows // 8) + row // 8) * 128 + (row % 8) * CORE_ROW + byte % CORE_ROW


def accumulator_position(thread, reg):
    """(row, column) of a warp group's 64 x N result that accumulator ``reg`` of ``thread`` (0-127) holds:
    warp ``thread // 32`` owns rows 16w..16w+15, and per 8 columns a lane holds two pairs of columns.

    Examples
    --------
    >>> accumulator_position(37, 6)  # warp 1, lane 5: 8-column block 1, lower row, first column
    (25, 10)
    """
    warp, lane = thread // 32, thread % 32
    return 16 * warp + lane // 4 + 8 * ((reg // 2) % 2), 8 * (reg // 4) + 2 * (lane % 4) + reg % 2


def piece(index, chunks_per_row: int):
    """(row, K byte) of a stage's 16-byte piece ``index`` (``chunks_per_row`` pieces a row): eight
    consecutive pieces are eight rows of one 16-byte K column (128 contiguous bytes of shared memory), so
    a warp's 32 cover 8 rows x 64 bytes of global memory.

    Examples
    --------
    >>> [piece(i, 4) for i in (0, 7, 8, 32)]
    [(0, 0), (7, 0), (0, 16), (8, 0)]
    """
    return index % 8 + 8 * (index // (8 * chunks_per_row)), (index // 8) % chunks_per_row * CORE_ROW


def descriptor_offsets(group, step, tiles: "WgmmaTiles"):
    """Byte offsets in a stage where warp group ``group``'s ``step``-th instruction starts reading A (its 64
    rows) and B (all ``n_tile`` rows), both at K byte ``32 * step``.

    Examples
    --------
    >>> descriptor_offsets(1, 1, WgmmaTiles(2, 128, 2, 4))
    (5120, 12288)
    """
    rows_m, rows_n, block_k = tiles.block
    return (shared_offset(GROUP_ROWS * group, STEP_K * step, rows_m),
            rows_m * block_k + shared_offset(0, STEP_K * step, rows_n))


def _helper_name(n_tile: int, a_dtype: str) -> str:
    return f"tcutils_wgmma_m64n{n_tile}k32_{A_DTYPES[a_dtype]}s8"


def _wgmma_helper(n_tile: int, a_dtype: str) -> str:
    regs = n_tile // 2
    slots = ", ".join(f"%{i}" for i in range(regs))
    outs = ", ".join(f'"+r"(d[{i}])' for i in range(regs))
    instruction = f"wgmma.mma_async.sync.aligned.m64n{n_tile}k32.s32.{A_DTYPES[a_dtype]}.s8"
    # scale-d (accumulate into d when true) is a predicate operand: set from a register operand.
    body = (r"{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %" + str(regs + 2) + r", 0;\n"
            + instruction + " {" + slots + "}, %" + str(regs) + ", %" + str(regs + 1) + r", accumulate;\n}\n")
    return (
        f"__device__ __forceinline__ void {_helper_name(n_tile, a_dtype)}(int* d, unsigned long long a,"
        " unsigned long long b) {\n"
        f'  asm volatile("{body}"\n    : {outs}\n    : "l"(a), "l"(b), "r"(1));\n}}\n'
    )


_MARK = "// tvm-tcutils: warp-group MMA helpers"

#: Device helpers the kernel calls: the matrix descriptor, the fences and one ``wgmma`` per shape and types.
HELPERS = _MARK + "\n" + r"""
__device__ __forceinline__ unsigned long long tcutils_gmma_desc(const void* smem, int leading, int stride) {
  // Bits 0-13: start address >> 4; 16-29: leading (K) byte offset >> 4; 32-45: stride (M/N) byte offset >> 4;
  // 62-63: swizzle mode, 0 for the canonical layout without swizzle.
  unsigned long long addr = (unsigned long long)(__cvta_generic_to_shared(smem));
  return ((addr & 0x3FFFF) >> 4) | ((unsigned long long)((leading & 0x3FFFF) >> 4) << 16)
         | ((unsigned long long)((stride & 0x3FFFF) >> 4) << 32);
}
__device__ __forceinline__ void tcutils_wgmma_proxy_fence() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void tcutils_wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void tcutils_wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tcutils_wgmma_wait_one() {
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
}
__device__ __forceinline__ void tcutils_wgmma_wait_all() {
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
""" + "".join(_wgmma_helper(n, a) for n in N_TILES for a in A_DTYPES)


def add_helpers(code: str) -> str:
    """``code`` with :data:`HELPERS` in front when it calls them (once).

    Examples
    --------
    >>> "wgmma.mma_async.sync.aligned.m64n128k32.s32.u8.s8" in add_helpers("tcutils_wgmma_fence();")
    True
    >>> add_helpers("x = 1;")
    'x = 1;'
    """
    return prepend_helpers(code, HELPERS, ("tcutils_wgmma_", "tcutils_gmma_desc"))


def primfunc(m: int, n: int, k: int, tiles: WgmmaTiles, a_dtype: str = "int8") -> tir.PrimFunc:
    """The kernel for ``data (m, k) x weight (n, k)^T`` as a TIR function in lowered form.

    Examples
    --------
    >>> text = primfunc(128, 128, 128, WgmmaTiles(1, 64, 2, 3), "uint8").script()
    >>> "tcutils_wgmma_m64n64k32_u8s8" in text, "T.ptx_cp_async" in text
    (True, True)
    """
    rows_m, rows_n, block_k = tiles.block
    stages, threads, regs = tiles.stages, tiles.threads, tiles.n_tile // 2
    stage_a, stage_b = rows_m * block_k, rows_n * block_k
    stage = stage_a + stage_b
    k_tiles = k // block_k
    chunks_per_row = block_k // CORE_ROW
    copies_a, copies_b = stage_a // CORE_ROW // threads, stage_b // CORE_ROW // threads
    steps = block_k // STEP_K
    helper = _helper_name(tiles.n_tile, a_dtype)

    @T.macro
    def copy_stage(A, B, smem, tx, bx, by, slot, tile):
        # K stage ``tile`` of both operands into shared slot ``slot``, 16 bytes a cp.async.
        for q in T.unroll(copies_a):
            row, byte = T.meta_var(piece(q * threads + tx, chunks_per_row))
            T.evaluate(T.ptx_cp_async(a_dtype, smem.data, slot * stage + shared_offset(row, byte, rows_m),
                                      A.data, (by * rows_m + row) * k + tile * block_k + byte, CORE_ROW))
        for q in T.unroll(copies_b):
            row, byte = T.meta_var(piece(q * threads + tx, chunks_per_row))
            T.evaluate(T.ptx_cp_async("int8", smem.data, slot * stage + stage_a + shared_offset(row, byte, rows_n),
                                      B.data, (bx * rows_n + row) * k + tile * block_k + byte, CORE_ROW))

    @T.prim_func
    def kernel(a: T.handle, b: T.handle, c: T.handle):
        T.func_attr({"global_symbol": "main", "tir.noalias": T.bool(True)})
        A = T.match_buffer(a, (m, k), a_dtype)
        B = T.match_buffer(b, (n, k), "int8")
        C = T.match_buffer(c, (m, n), "int32")
        bx = T.launch_thread("blockIdx.x", n // rows_n)
        by = T.launch_thread("blockIdx.y", m // rows_m)
        tx = T.launch_thread("threadIdx.x", threads)
        smem = T.decl_buffer((stages * stage,), "int8", scope="shared.dyn")
        acc = T.decl_buffer((regs,), "int32", scope="local")
        for r in T.unroll(regs):
            acc[r] = 0
        # Prologue: the first stages - 2 stages in flight, one commit group each (of the other two slots, one
        # is multiplied, one may still be read by the instructions of the step before).
        for kt in T.serial(stages - 2):
            copy_stage(A, B, smem, tx, bx, by, kt, kt)
            T.evaluate(T.ptx_commit_group())
        for kt in T.serial(k_tiles):
            # Stage kt has landed (this thread's copies), is visible to the async proxy, and every thread's
            # copies are in; every warp group has also finished reading stage kt - 2 (one group of
            # instructions, step kt - 1's, is left in flight below).
            T.evaluate(T.ptx_wait_group(stages - 3))
            T.evaluate(T.call_extern("handle", "tcutils_wgmma_proxy_fence"))
            T.evaluate(T.tvm_storage_sync("shared"))
            nxt = kt + stages - 2
            if nxt < k_tiles:
                copy_stage(A, B, smem, tx, bx, by, nxt % stages, nxt)
            T.evaluate(T.ptx_commit_group())  # an empty group past the end keeps the count uniform
            T.evaluate(T.call_extern("handle", "tcutils_wgmma_fence"))
            for s in T.unroll(steps):
                at_a, at_b = T.meta_var(descriptor_offsets(tx // GROUP_THREADS, s, tiles))
                base = T.meta_var((kt % stages) * stage)
                T.evaluate(T.call_extern(
                    "handle", helper, T.address_of(acc[0]),
                    T.call_extern("uint64", "tcutils_gmma_desc", T.address_of(smem[base + at_a]),
                                  rows_m * CORE_ROW, STRIDE_BYTES),
                    T.call_extern("uint64", "tcutils_gmma_desc", T.address_of(smem[base + at_b]),
                                  rows_n * CORE_ROW, STRIDE_BYTES)))
            T.evaluate(T.call_extern("handle", "tcutils_wgmma_commit"))
            T.evaluate(T.call_extern("handle", "tcutils_wgmma_wait_one"))
        T.evaluate(T.call_extern("handle", "tcutils_wgmma_wait_all"))
        for r in T.unroll(regs):
            row, col = T.meta_var(accumulator_position(tx % GROUP_THREADS, r))
            C[by * rows_m + GROUP_ROWS * (tx // GROUP_THREADS) + row, bx * rows_n + col] = acc[r]

    return kernel


def _descriptor_read(smem: np.ndarray, start: int, rows: int, leading: int, stride: int) -> np.ndarray:
    """The ``rows x 32`` K-major operand a no-swizzle descriptor (start, leading, stride byte offsets)
    names, per the PTX ISA's canonical layout: row ``r``, byte ``j`` at ``start + (j // 16) * leading +
    (r // 8) * stride + (r % 8) * 16 + j % 16``."""
    r, j = np.meshgrid(np.arange(rows), np.arange(STEP_K), indexing="ij")
    return smem[start + (j // CORE_ROW) * leading + (r // 8) * stride + (r % 8) * CORE_ROW + j % CORE_ROW]


def simulate(data: np.ndarray, weight: np.ndarray, tiles: WgmmaTiles) -> np.ndarray:
    """``data x weight^T`` computed the way the kernel moves the bytes, in numpy: each block's stages copied
    piece by piece (:func:`piece`) to :func:`shared_offset`, each warp group's instructions reading the
    operands through its descriptors (:func:`descriptor_offsets`, leading ``rows x 16``, stride
    :data:`STRIDE_BYTES`) as PTX defines them, the accumulators written from :func:`accumulator_position`.
    Equals the product exactly when the kernel's index maps are right (the CPU check of the kernel).

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> x = rng.integers(0, 256, (128, 128)).astype(np.uint8); w = rng.integers(-128, 128, (64, 128)).astype(np.int8)
    >>> bool((simulate(x, w, WgmmaTiles(2, 64, 2, 3)) == x.astype(np.int32) @ w.astype(np.int32).T).all())
    True
    """
    m, k = data.shape
    n = weight.shape[0]
    rows_m, rows_n, block_k = tiles.block
    chunks = block_k // CORE_ROW
    out = np.zeros((m, n), np.int32)
    for by in range(m // rows_m):
        for bx in range(n // rows_n):
            acc = np.zeros((tiles.threads, tiles.n_tile // 2), np.int64)
            for kt in range(k // block_k):
                smem = np.zeros((rows_m + rows_n) * block_k, np.int64)
                for operand, rows, base, first in ((data, rows_m, 0, by * rows_m),
                                                   (weight, rows_n, rows_m * block_k, bx * rows_n)):
                    for index in range(rows * chunks):
                        row, byte = piece(index, chunks)
                        at = base + shared_offset(row, byte, rows)
                        smem[at:at + CORE_ROW] = operand[first + row, kt * block_k + byte:][:CORE_ROW]
                for group in range(tiles.warpgroups):
                    for step in range(block_k // STEP_K):
                        at_a, at_b = descriptor_offsets(group, step, tiles)
                        a = _descriptor_read(smem, at_a, GROUP_ROWS, rows_m * CORE_ROW, STRIDE_BYTES)
                        b = _descriptor_read(smem, at_b, rows_n, rows_n * CORE_ROW, STRIDE_BYTES)
                        d = a @ b.T
                        for thread in range(GROUP_THREADS):
                            for reg in range(tiles.n_tile // 2):
                                acc[group * GROUP_THREADS + thread, reg] += d[accumulator_position(thread, reg)]
            for tx in range(tiles.threads):
                group, thread = divmod(tx, GROUP_THREADS)
                for reg in range(tiles.n_tile // 2):
                    row, col = accumulator_position(thread, reg)
                    out[by * rows_m + GROUP_ROWS * group + row, bx * rows_n + col] = acc[tx, reg]
    return out


def dense(data: te.Tensor, weight: te.Tensor, tiles: Optional[WgmmaTiles] = None) -> te.Tensor:
    """``data (M, K) x weight (N, K)^T`` in int32 as a TE extern op running this kernel (int8 or uint8
    data, int8 weight; build for ``cuda -arch=sm_90`` or ``sm_90a``).

    Raises
    ------
    TypeError
        For a ``data`` that is not int8 or uint8, or a ``weight`` that is not int8.
    ValueError
        For shapes or tiles the kernel cannot take (the reason from :func:`fits`).

    Examples
    --------
    >>> dense(te.placeholder((128, 96), "int8"), te.placeholder((128, 96), "int8"))
    Traceback (most recent call last):
    ...
    ValueError: dense 128x128x96 on sm_90a: no tiling fits
    """
    _, m, n, k = operand_sizes(data, weight, "wgmma")
    tiles = tiles or fallback_tiles(m, n, k)
    problem = "no tiling fits" if tiles is None else fits(m, n, k, tiles)
    if problem:
        raise ValueError(f"dense {m}x{n}x{k} on {ARCH}: {problem}")
    return extern_op(primfunc(m, n, k, tiles, data.dtype), data, weight, "dense_wgmma")


def dense_template(cfg, data: te.Tensor, weight: te.Tensor, out_dtype: str = "int32") -> te.Tensor:
    """AutoTVM compute of :data:`TASK`: :func:`dense` with the tiling as knobs (``warpgroups``, ``n_tile``,
    ``chunk``, ``stages``); a tiling that does not fit the shape is invalid (AutoTVM records it as such).

    Examples
    --------
    >>> from tvm import autotvm
    >>> x = te.placeholder((256, 512), "int8"); w = te.placeholder((256, 512), "int8")
    >>> dense_template(autotvm.get_config(), x, w, "int16")
    Traceback (most recent call last):
    ...
    ValueError: out_dtype: the wgmma kernel accumulates in int32, got int16
    """
    if out_dtype != "int32":
        raise ValueError(f"out_dtype: the wgmma kernel accumulates in int32, got {out_dtype}")
    _, m, n, k = operand_sizes(data, weight, "wgmma")
    cfg.add_flop(2 * m * n * k)
    knobs = {"warpgroups": WARPGROUPS, "n_tile": N_TILES, "chunk": CHUNKS, "stages": STAGES}
    tiles = template_tiles(cfg, knobs, WgmmaTiles, fallback_tiles(m, n, k), lambda tiles: fits(m, n, k, tiles))
    return dense(data, weight, tiles)


#: AutoTVM schedule of :data:`TASK`: the GEMM is scheduled inside its extern op; what Relay fused after it is
#: one element-wise kernel (as for the mma kernel).
schedule_template = schedule_dense


def supports(arch: str) -> bool:
    """Whether ``arch`` runs ``wgmma``: sm_90 GPUs (a module for ``sm_90`` holding this kernel is compiled for
    ``sm_90a`` by :func:`tvm_tcutils.cuda.compile_cuda`; later architectures dropped the instruction).

    Examples
    --------
    >>> supports("sm_90a"), supports("sm_90"), supports("sm_89"), supports("sm_100a")
    (True, True, False, False)
    """
    return arch_number(arch) == 90


__all__ = ["TASK", "WgmmaTiles", "FALLBACK_TILES", "HELPERS", "accumulator_position", "add_helpers", "dense",
           "dense_template", "schedule_template",
           "descriptor_offsets", "fallback_tiles", "fits", "piece", "primfunc", "shared_offset", "simulate",
           "supports"]
