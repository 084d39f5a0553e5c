"""int8 dense on sm_80+ tensor cores: ``mma.sync`` m16n8k32, ``ldmatrix`` and a multi-stage ``cp.async`` pipeline.

The WMMA kernels of :mod:`.tiled_mma` issue ``IMMA.16816`` (half the K of the
int8 instruction Ampere and Hopper have), load fragments with plain
shared-memory reads and stage the operands with synchronous copies: about a
tenth of an H200's int8 peak. This kernel is the GEMM the architecture wants:

* each warp holds ``frags_m x frags_n`` 16x16 int32 accumulators in registers
  and multiplies them with ``mma.sync.aligned.m16n8k32`` (``IMMA.16832`` in
  SASS) on fragments loaded by ``ldmatrix.x4`` (``LDSM``);
* the block's A and B tiles (``block_k`` bytes of K per stage) travel from
  global to shared memory with ``cp.async`` (``LDGSTS``), ``stages`` of them in
  flight, so that the copies of later K steps overlap the multiplies of this one;
* shared rows are padded by 16 bytes, so that the eight 16-byte rows one
  ``ldmatrix`` phase reads fall in distinct banks; the stages live in dynamic
  shared memory (over the 48 KB of static memory: TVM's CUDA runtime raises the
  kernel's limit at launch).

The kernel is written with TVM's TensorIR schedule and the package's
``ldmatrix``/``mma`` tensor intrinsics (:mod:`.mma_intrin`: they generate the
same instructions as TVM's int8 ones, and take uint8 activations too), lowered
here, and wrapped as a TE extern op (:func:`dense`), so that it takes part in TE
schedules, AutoTVM templates and Relay strategies like any other compute. It
computes ``data (M, K) x weight (N, K)^T`` in int32 for int8 or uint8 data and
int8 weights whose sizes are whole tiles (:func:`fits`).

Examples
--------
>>> tiles = MmaTiles(2, 2, 4, 4, 2, 3)
>>> tiles.block, tiles.threads, tiles.shared_bytes
((128, 128, 64), 128, 61440)
"""
from __future__ import annotations

import math
import re
from typing import Dict, NamedTuple, Optional, Sequence, Tuple

from ..._tvm import tvm
from tvm import autotvm, te, tir
from tvm.topi.utils import get_const_tuple

from . import epilogue, mma_intrin

#: AutoTVM task name of the template.
TASK = "tcutils.dense_mma.cuda"

#: The oldest architecture with int8 ``mma.sync.m16n8k32`` (sm_75 has m8n8k16 only).
MIN_ARCH = 80

#: Bytes added to each shared-memory row (ldmatrix's eight rows of a phase then hit distinct banks).
ROW_PAD = 16

#: Bytes one ``cp.async`` moves (the widest: ``cp.async.cg`` bypasses L1 only at this size).
COPY_BYTES = 16

#: Shared memory a block may opt in to, per compute capability (CUDA programming guide, "Maximum amount of
#: shared memory per thread block"). Architectures between rows take the row below them.
MAX_SHARED: Dict[int, int] = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}

#: Streaming multiprocessors of the common GPU of each architecture (A100, A10/RTX 3090, L4/RTX 4090,
#: H100/H200): the fallback tile is the largest whose grid fills them once.
TYPICAL_SMS: Dict[int, int] = {80: 108, 86: 82, 87: 16, 89: 58, 90: 132}

#: Accumulator registers a thread may hold (frags_m x frags_n x 8): more spills or starves occupancy.
MAX_ACCUMULATORS = 128

#: Warps a block may have (256 threads: two such blocks still share an SM's registers).
MAX_WARPS = 8

#: Knob values of the AutoTVM template.
WARPS = (1, 2, 4)
FRAGS = (1, 2, 4)
CHUNKS = (1, 2, 4)
STAGES = (2, 3, 4)
KNOBS = {"warps_m": WARPS, "warps_n": WARPS, "frags_m": FRAGS, "frags_n": FRAGS, "chunk": CHUNKS, "stages": STAGES}


class MmaTiles(NamedTuple):
    """One tiling of the kernel: warps per block, 16x16 fragments per warp, k32 steps per stage, stages."""

    warps_m: int
    warps_n: int
    frags_m: int
    frags_n: int
    chunk: int
    stages: int

    @property
    def block(self) -> Tuple[int, int, int]:
        """Rows, columns and K bytes of one block's tile."""
        return self.warps_m * self.frags_m * 16, self.warps_n * self.frags_n * 16, self.chunk * 32

    @property
    def threads(self) -> int:
        return self.warps_m * self.warps_n * 32

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of a block: both operands' padded rows, ``stages`` times."""
        rows_m, rows_n, k = self.block
        return (rows_m + rows_n) * (k + ROW_PAD) * self.stages

    def problem(self) -> Optional[str]:
        """Why this tiling cannot be scheduled at all (None when it can).

        Examples
        --------
        >>> MmaTiles(4, 4, 4, 4, 2, 3).problem()
        '16 warps a block are too many (at most 8)'
        """
        rows_m, rows_n, k = self.block
        if self.frags_m * self.frags_n * 8 > MAX_ACCUMULATORS:
            return (f"{self.frags_m}x{self.frags_n} fragments a warp need {self.frags_m * self.frags_n * 8} "
                    f"accumulator registers a thread (at most {MAX_ACCUMULATORS})")
        if self.warps_m * self.warps_n > MAX_WARPS:
            return f"{self.warps_m * self.warps_n} warps a block are too many (at most {MAX_WARPS})"
        for rows in (rows_m, rows_n):
            if rows * k // COPY_BYTES % self.threads:
                return f"{rows} rows of {k} bytes do not split into {self.threads} threads' 16-byte copies"
        return None


#: Tilings the fallback configuration chooses from, largest first (see :func:`fallback_tiles`).
FALLBACK_TILES: Tuple[MmaTiles, ...] = (
    MmaTiles(2, 2, 4, 4, 2, 3),  # 128 x 128
    MmaTiles(2, 2, 2, 4, 2, 3),  # 64 x 128
    MmaTiles(2, 2, 4, 2, 2, 3),  # 128 x 64
    MmaTiles(2, 2, 2, 2, 2, 3),  # 64 x 64
    MmaTiles(1, 2, 2, 2, 2, 3),  # 32 x 64
    MmaTiles(1, 1, 2, 2, 2, 3),  # 32 x 32
    # Short K (an attention head's 64): 32-byte stages, two of them.
    MmaTiles(2, 2, 4, 4, 1, 2),  # 128 x 128
    MmaTiles(2, 2, 2, 2, 1, 2),  # 64 x 64
    MmaTiles(1, 1, 2, 2, 1, 2),  # 32 x 32
)


def arch_number(arch: str) -> int:
    """``sm_90`` (or ``sm_90a``) -> 90.

    Examples
    --------
    >>> arch_number("sm_86"), arch_number("sm_90a")
    (86, 90)
    """
    match = re.fullmatch(r"sm_(\d+)[a-z]?", arch)
    if match is None:
        raise ValueError(f"arch: {arch!r} is not an architecture like sm_80")
    return int(match.group(1))


def _table(table: Dict[int, int], arch: int) -> int:
    return table[max(key for key in table if key <= arch)] if arch >= min(table) else 0


def whole_tiles_problem(m: int, n: int, k: int, tiles, min_stages: int) -> Optional[str]:
    """Why a GEMM tiling (anything with ``problem()`` and ``block``) cannot cover ``m x n x k`` in whole
    block tiles and K stages, at least ``min_stages`` of them (None when it can).

    Examples
    --------
    >>> whole_tiles_problem(100, 128, 128, FALLBACK_TILES[0], 3)
    '100x128 is not made of whole 128x128 block tiles'
    """
    problem = tiles.problem()
    if problem:
        return problem
    rows_m, rows_n, block_k = tiles.block
    if m % rows_m or n % rows_n:
        return f"{m}x{n} is not made of whole {rows_m}x{rows_n} block tiles"
    if k % block_k:
        return f"K = {k} is not a multiple of the {block_k}-byte stage"
    if k // block_k < min_stages:
        return f"K = {k} has fewer than {min_stages} stages of {block_k} bytes"
    return None


def fits(m: int, n: int, k: int, tiles: MmaTiles, arch: int = 90) -> Optional[str]:
    """Why ``tiles`` cannot compute an ``m x n x k`` product on ``sm_<arch>`` (None when it can).

    Examples
    --------
    >>> fits(512, 512, 512, FALLBACK_TILES[0]) is None
    True
    >>> fits(512, 512, 96, FALLBACK_TILES[0])
    'K = 96 is not a multiple of the 64-byte stage'
    """
    if arch < MIN_ARCH:
        return f"sm_{arch} has no int8 mma.sync m16n8k32 (sm_{MIN_ARCH} and newer)"
    problem = whole_tiles_problem(m, n, k, tiles, tiles.stages)
    if problem:
        return problem
    limit = _table(MAX_SHARED, arch)
    if tiles.shared_bytes > limit:
        return f"{tiles.shared_bytes} bytes of shared memory exceed sm_{arch}'s {limit} a block"
    return None


def fallback_tiles(m: int, n: int, k: int, arch: int = 90, batch: int = 1) -> Optional[MmaTiles]:
    """The untuned tiling: the largest of :data:`FALLBACK_TILES` whose grid fills the GPU's SMs once.

    Where none does (small products), the one with the most blocks among those of at least 64x64 (a
    smaller tile reads each operand byte from shared memory too few times to feed the tensor cores),
    else any that fits; None when none fits.

    Examples
    --------
    >>> fallback_tiles(4096, 4096, 4096).block
    (128, 128, 64)
    >>> fallback_tiles(128, 1024, 1024).block
    (64, 64, 64)
    >>> fallback_tiles(100, 100, 100) is None
    True
    """
    usable = [t for t in FALLBACK_TILES if fits(m, n, k, t, arch) is None]
    return choose_tiles(usable, lambda t: batch * (m // t.block[0]) * (n // t.block[1]), arch)


def choose_tiles(usable: Sequence[MmaTiles], blocks, arch: int) -> Optional[MmaTiles]:
    """The first of ``usable`` (largest first) whose grid of ``blocks(tiles)`` blocks fills ``sm_<arch>``'s
    usual SM count once; else the one with the most blocks among those of at least 64x64 (a smaller tile
    reads each operand byte from shared memory too few times to feed the tensor cores), else of any;
    None when ``usable`` is empty.

    Examples
    --------
    >>> choose_tiles(FALLBACK_TILES[:2], lambda t: 1000, 90).block
    (128, 128, 64)
    """
    if not usable:
        return None
    sms = _table(TYPICAL_SMS, arch)
    for tiles in usable:
        if blocks(tiles) >= sms:
            return tiles
    large = [t for t in usable if min(t.block[:2]) >= 64]
    return max(large or usable, key=blocks)


def _tiled(tile_rows: int, tile_cols: int, inner, batched: bool = False):
    """A map of one tile's (row, column) made a map of the whole operand: (tile row, tile column, *inner),
    behind the batch index where the operand has one."""
    def tiled(i, j):
        return (i // tile_rows, j // tile_cols, *inner(i % tile_rows, j % tile_cols))

    return (lambda b, i, j: (b, *tiled(i, j))) if batched else tiled


def schedule_primfunc(data: te.Tensor, weight: te.Tensor, tiles: MmaTiles,
                      intrinsics: Optional[mma_intrin.IntrinsicSet] = None,
                      inputs: Optional[Tuple[te.Tensor, te.Tensor]] = None) -> tir.Schedule:
    """The kernel as a TensorIR schedule of ``data x weight^T`` (not lowered yet), tensorized with
    ``intrinsics`` (default: :func:`.mma_intrin.intrinsics` for the data's type).

    ``data`` and ``weight`` may be computed from ``inputs`` (the function's parameters then; an implicit
    GEMM's gathered rows, :mod:`.mma_conv2d`): their computations are inlined into the copies that stage
    them in shared memory, so that each 16-byte piece is read from where it lies.

    Examples
    --------
    >>> x = te.placeholder((64, 64), "uint8"); w = te.placeholder((64, 64), "int8")
    >>> text = schedule_primfunc(x, w, MmaTiles(1, 1, 2, 2, 1, 2)).mod.script()
    >>> text.count("T.ptx_mma("), '"m16n8k32", "row", "col", "uint8", "int8"' in text
    (1, True)
    """
    intrinsics = intrinsics or mma_intrin.intrinsics(data.dtype, "shared.dyn", weight.dtype)
    *batch, m, k = get_const_tuple(data.shape)
    n = get_const_tuple(weight.shape)[-2]
    red = te.reduce_axis((0, k), name="k")
    if batch:  # one GEMM per batch index, the batches on blockIdx.z
        out = te.compute((batch[0], m, n), lambda b, i, j: te.sum(
            data[b, i, red].astype("int32") * weight[b, j, red].astype("int32"), axis=red), name="dense_mma")
    else:
        out = te.compute((m, n), lambda i, j: te.sum(data[i, red].astype("int32") * weight[j, red].astype("int32"),
                                                       axis=red), name="dense_mma")
    sch = tir.Schedule(te.create_prim_func([*(inputs or (data, weight)), out]))
    gemm = sch.get_block("dense_mma")
    *outer, i, j, kk = sch.get_loops(gemm)
    i, i_tile = sch.split(i, [None, 16])
    j, j_tile = sch.split(j, [None, 16])
    kk, k_tile = sch.split(kk, [None, 32])
    i_block, i_warp, i_frag = sch.split(i, [None, tiles.warps_m, tiles.frags_m])
    j_block, j_warp, j_frag = sch.split(j, [None, tiles.warps_n, tiles.frags_n])
    k_stage, k_step = sch.split(kk, [None, tiles.chunk])
    sch.reorder(*outer, i_block, j_block, i_warp, j_warp, k_stage, k_step, i_frag, j_frag, i_tile, j_tile, k_tile)
    for loop in outer:
        sch.bind(loop, "blockIdx.z")
    sch.bind(i_block, "blockIdx.y")
    sch.bind(j_block, "blockIdx.x")
    warp = sch.fuse(i_warp, j_warp)
    sch.bind(warp, "threadIdx.y")

    # Accumulators in registers ("warp" scope: a 16x16 tile spread over the 32 lanes), stored per warp.
    acc = sch.cache_write(gemm, 0, "warp")
    sch.reverse_compute_at(acc, warp)

    # Operands staged in shared memory per K stage: consecutive lanes copy consecutive 16-byte pieces of
    # a row (whole 32-byte sectors per pair of lanes), one cp.async each.
    for operand in (0, 1):
        shared = sch.cache_read(gemm, operand, "shared.dyn")
        sch.compute_at(shared, k_stage)
        rows, cols = sch.get_loops(shared)[-2:]
        cols, piece = sch.split(cols, [None, COPY_BYTES])
        _, ty, tx = sch.split(sch.fuse(rows, cols), [None, tiles.warps_m * tiles.warps_n, 32])
        sch.bind(ty, "threadIdx.y")
        sch.bind(tx, "threadIdx.x")
        sch.storage_align(shared, 0, axis=-2, factor=tiles.block[2], offset=ROW_PAD)
        if inputs is not None and isinstance((data, weight)[operand].op, te.ComputeOp):
            sch.compute_inline(sch.get_block((data, weight)[operand].op.name))
            # A gathered piece is one cp.async too, but TVM's vectorizer cannot see it: the simplifier
            # folds the piece's (kh, kw) back into K modulo KW*C, lane included (see _gathered_copies).
            sch.annotate(piece, GATHERED_PIECE, COPY_BYTES)
        else:
            sch.vectorize(piece)

    # Fragments loaded from shared memory per k32 step.
    fragments = []
    for operand in (0, 1):
        frag = sch.cache_read(gemm, operand, "warp")
        sch.compute_at(frag, k_step)
        rows, cols = sch.get_loops(frag)[-2:]
        rows, rows_in = sch.split(rows, [None, 16])
        cols, cols_in = sch.split(cols, [None, 32])
        sch.reorder(rows, cols, rows_in, cols_in)
        fragments.append(frag)

    init = sch.decompose_reduction(gemm, k_stage)
    rows, cols = sch.get_loops(acc)[-2:]
    rows, rows_in = sch.split(rows, [None, 16])
    cols, cols_in = sch.split(cols, [None, 16])
    sch.reorder(rows, cols, rows_in, cols_in)
    # The stores index the accumulator registers by fragment: unrolled, they stay registers. nvcc unrolls
    # a short store loop by itself, but not one carrying a folded epilogue (the accumulators then went to
    # the stack: 512 bytes in ResNet-50's residual layers). Unrolled by nvcc (`#pragma unroll`), not by
    # TVM: TVM's warp-memory lowering cannot map an unrolled fragment's constant index to its lane.
    for loop in (rows, cols):
        sch.annotate(loop, UNROLL_IN_CUDA, 1)

    sch.transform_layout(fragments[0], ("write", 0), _tiled(16, 32, intrinsics.map_a, bool(batch)))
    sch.transform_layout(fragments[1], ("write", 0), _tiled(16, 32, intrinsics.map_b, bool(batch)))
    sch.transform_layout(acc, ("read", 0), _tiled(16, 16, intrinsics.map_c, bool(batch)))
    names = intrinsics.names
    sch.tensorize(sch.get_loops(fragments[0])[-2], names["load_a"])
    sch.tensorize(sch.get_loops(fragments[1])[-2], names["load_b"])
    sch.tensorize(sch.get_loops(gemm)[-3], names["mma"])
    sch.tensorize(sch.get_loops(init)[-2], names["fill"])
    sch.tensorize(sch.get_loops(acc)[-2], names["store"])

    # The K loop's body is [copy A, copy B, the k32 steps]: the copies run stages - 1 iterations ahead,
    # asynchronously (one commit group per iteration, waited for just before its stage is read).
    sch.annotate(k_stage, "software_pipeline_stage", [0, 0, tiles.stages - 1])
    sch.annotate(k_stage, "software_pipeline_order", [0, 1, 2])
    sch.annotate(k_stage, "software_pipeline_async_stages", [0])
    return sch


#: Loop annotation: made an unrolled loop (``#pragma unroll``) just before CUDA code generation
#: (:func:`unroll_in_cuda`), after TVM's passes that must still see the loop.
UNROLL_IN_CUDA = "tcutils_unroll_in_cuda"

#: Loop annotation of a gathered operand's 16-byte copy (:func:`schedule_primfunc`'s ``inputs``).
GATHERED_PIECE = "tcutils_gathered_piece"


def unroll_in_cuda(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` (device functions about to be printed as CUDA) with each :data:`UNROLL_IN_CUDA` loop made
    an unrolled loop, which TVM prints with ``#pragma unroll`` and nvcc then unrolls whatever its body.

    Examples
    --------
    >>> from tvm.script import tir as T
    >>> @T.prim_func
    ... def f(a: T.Buffer((4,), "int32")):
    ...     for i in T.serial(4, annotations={UNROLL_IN_CUDA: 1}):
    ...         a[i] = i
    >>> "T.unroll(4)" in unroll_in_cuda(tvm.IRModule({"f": f}))["f"].script()
    True
    """
    def unrolled(loop: tir.For) -> Optional[tir.Stmt]:
        if UNROLL_IN_CUDA not in loop.annotations:
            return None
        annotations = {key: value for key, value in loop.annotations.items() if key != UNROLL_IN_CUDA}
        return tir.For(loop.loop_var, loop.min, loop.extent, tir.ForKind.UNROLLED, loop.body, None, annotations)

    functions = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc):
            func = func.with_body(tir.stmt_functor.ir_transform(func.body, None, unrolled, ["tir.For"]))
        functions[gvar] = func
    return tvm.IRModule(functions, attrs=mod.attrs)


def _gathered_copies(func: tir.PrimFunc, mod, ctx) -> tir.PrimFunc:
    """Each :data:`GATHERED_PIECE` loop inside an asynchronous stage made one ``cp.async`` of 16 bytes,
    predicated where the gather has a condition (zero padding; a missing source row): the bytes are zero
    where it is false, as the gather's ``if_then_else(cond, x, 0)`` says.

    A piece is 16 consecutive K bytes starting at a multiple of 16 and an operand's gather keeps its
    innermost 16-aligned runs whole (:mod:`.mma_conv2d` requires channels in multiples of 16), so its
    source bytes are consecutive and its condition is the same for all 16: they are read at lane 0.
    """
    def piece(loop: tir.For) -> Optional[tir.Stmt]:
        at_zero = {loop.loop_var: tir.const(0, loop.loop_var.dtype)}

        def first(expr):  # the expression at the piece's first byte
            return tir.stmt_functor.substitute(expr, at_zero)

        lets, store = [], loop.body
        while isinstance(store, tir.LetStmt):  # common subexpressions bound inside the loop
            lets.append((store.var, first(store.value)))
            store = store.body
        if not isinstance(store, tir.BufferStore) or int(loop.extent) != COPY_BYTES:
            raise ValueError(f"{GATHERED_PIECE}: expected one 16-byte store in the loop, got {store}")
        value, predicate = store.value, None
        if isinstance(value, tir.Call) and value.op.same_as(tvm.ir.Op.get("tir.if_then_else")):
            if not (isinstance(value.args[2], tir.IntImm) and value.args[2].value == 0):
                raise ValueError(f"{GATHERED_PIECE}: cp.async fills with zeros, the gather with {value.args[2]}")
            predicate, value = first(value.args[0]), value.args[1]
        if (not isinstance(value, tir.BufferLoad) or tvm.DataType(value.buffer.dtype).bits != 8
                or len(value.indices) != 1):
            raise ValueError(f"{GATHERED_PIECE}: expected a flat 1-byte load, got {value}")
        args = [store.buffer.data, first(store.indices[0]), value.buffer.data, first(value.indices[0]), COPY_BYTES]
        if predicate is not None:
            args.append(tir.Cast("int32", predicate))
        copy = tir.Evaluate(tir.call_intrin(store.buffer.dtype, "tir.ptx_cp_async", *args))
        for var, value in reversed(lets):
            copy = tir.LetStmt(var, value, copy)
        return copy

    def asynchronous(scope: tir.AttrStmt) -> Optional[tir.Stmt]:
        if scope.attr_key != "async_scope":
            return None
        body = tir.stmt_functor.ir_transform(
            scope.body, None,
            lambda loop: piece(loop) if isinstance(loop, tir.For) and GATHERED_PIECE in loop.annotations else None,
            ["tir.For"])
        return tir.AttrStmt(scope.node, scope.attr_key, scope.value, body)

    return func.with_body(tir.stmt_functor.ir_transform(func.body, None, asynchronous, ["tir.AttrStmt"]))


def lower(sch: tir.Schedule) -> tir.PrimFunc:
    """The scheduled kernel lowered, with its barriers placed and its copies turned into ``cp.async``.

    The barriers come first: a copy that is already ``cp.async`` (an opaque call) would hide its
    write from TVM's barrier placement, and a stage could be overwritten while a slower warp still
    reads it. This is the order of TVM's own build when ``tir.use_async_copy`` is set; doing it here
    keeps it independent of the caller's ``PassContext``.
    """
    lowered = tvm.lower(sch.mod)
    lowered = tvm.transform.Sequential([tir.transform.ThreadSync("shared.dyn"),
                                        tir.transform.prim_func_pass(_gathered_copies, opt_level=0),
                                        tir.transform.InjectPTXAsyncCopy()])(lowered)
    return lowered["main"]


def operand_sizes(data: te.Tensor, weight: te.Tensor, kernel: str, weight_dtypes: Sequence[str] = ("int8",),
                  batched: bool = False) -> Tuple[int, int, int, int]:
    """(batch, M, N, K) of ``data ([batch,] M, K) x weight ([batch,] N, K)^T`` for an 8-bit GEMM ``kernel``
    (named in the errors); batch 1 for 2-D operands, which ``batched=False`` requires.

    Raises
    ------
    TypeError
        For a ``data`` that is not int8 or uint8, or a ``weight`` not of ``weight_dtypes``.
    ValueError
        For operands of another rank, or that disagree on K or the batch.

    Examples
    --------
    >>> operand_sizes(te.placeholder((128, 64), "uint8"), te.placeholder((256, 64), "int8"), "mma")
    (1, 128, 256, 64)
    """
    if data.dtype not in mma_intrin.A_DTYPES:
        raise TypeError(f"data: the {kernel} kernel takes {' or '.join(mma_intrin.A_DTYPES)} data, got {data.dtype}")
    if weight.dtype not in weight_dtypes:
        raise TypeError(f"weight: the {kernel} kernel takes {' or '.join(weight_dtypes)} weights, got {weight.dtype}")
    rank = 3 if batched else 2
    if len(data.shape) != rank or len(weight.shape) != rank:
        raise ValueError(f"{'batch_matmul needs 3-D' if batched else 'dense needs 2-D'} data and weight, got "
                         f"{get_const_tuple(data.shape)} and {get_const_tuple(weight.shape)}")
    *batch, m, k = get_const_tuple(data.shape)
    *weight_batch, n, wk = get_const_tuple(weight.shape)
    if wk != k:
        raise ValueError(f"weight has {wk} input features, data has {k}")
    if batch != weight_batch:
        raise ValueError(f"data has batch {batch[0]}, weight {weight_batch[0]} (no broadcasting)")
    return (batch[0] if batch else 1), m, n, k


def template_tiles(cfg, knobs: Dict[str, Sequence], tiles_type, fallback, problem_of):
    """The tiling an AutoTVM template's ``cfg`` picks: ``knobs`` defined (name -> values, the fields of
    ``tiles_type``), the ``fallback`` tiling (or None) set on an untuned config, and an
    ``InstantiationError`` with ``problem_of(tiles)``'s reason for one that does not fit.

    Examples
    --------
    >>> template_tiles(autotvm.get_config(), {"warps_m": WARPS, "warps_n": WARPS, "frags_m": FRAGS,
    ...                "frags_n": FRAGS, "chunk": CHUNKS, "stages": STAGES}, MmaTiles, FALLBACK_TILES[0],
    ...                lambda tiles: None).block
    (128, 128, 64)
    """
    for knob, values in knobs.items():
        cfg.define_knob(knob, list(values))
    if cfg.is_fallback and fallback is not None:
        for knob, value in fallback._asdict().items():
            cfg[knob] = autotvm.task.space.OtherOptionEntity(value)
    tiles = tiles_type(*(cfg[knob].val for knob in tiles_type._fields))
    problem = problem_of(tiles)
    if problem:
        raise autotvm.task.space.InstantiationError(f"tiling {tuple(tiles)}: {problem}")
    return tiles


def dense(data: te.Tensor, weight: te.Tensor, tiles: Optional[MmaTiles] = None, arch: int = 90) -> te.Tensor:
    """``data (M, K) x weight (N, K)^T`` in int32 as a TE extern op running this kernel: int8 or uint8
    data (``mma.sync`` ``.s8.s8`` or ``.u8.s8``), int8 weight.

    Raises
    ------
    TypeError
        For a ``data`` that is not int8 or uint8, or a ``weight`` that is not int8.
    ValueError
        For shapes or tiles the kernel cannot take (the reason from :func:`fits`).

    Examples
    --------
    >>> dense(te.placeholder((256, 512), "uint8"), te.placeholder((256, 512), "uint8"))
    Traceback (most recent call last):
    ...
    TypeError: weight: the mma kernel takes int8 weights, got uint8
    """
    return _extern(data, weight, tiles, arch, "dense", operand_sizes(data, weight, "mma"))


def _extern(data: te.Tensor, weight: te.Tensor, tiles: Optional[MmaTiles], arch: int, op: str,
            sizes: Tuple[int, int, int, int]) -> te.Tensor:
    batch, m, n, k = sizes
    tiles = tiles or fallback_tiles(m, n, k, arch, batch)
    problem = "no tiling fits" if tiles is None else fits(m, n, k, tiles, arch)
    if problem:
        raise ValueError(f"{op} {m}x{n}x{k} on sm_{arch}: {problem}")
    return extern_op(lower(schedule_primfunc(data, weight, tiles)), data, weight, f"{op}_mma")


def extern_op(func: tir.PrimFunc, data: te.Tensor, weight: te.Tensor, name: str,
              out_shape: Optional[Sequence[int]] = None) -> te.Tensor:
    """A GEMM kernel ``func`` of parameters (data, weight, out) as the TE extern op computing ``data`` x
    ``weight``: its buffers are the function's data pointers with the tensors' own shape objects (TE checks
    those by identity); tag ``tcutils_<name>`` (:mod:`.epilogue` folds what Relay fuses after such an op
    into it). ``out_shape``: the output's shape where it is another view of the same elements (an HWNC
    convolution's output of a GEMM's rows), or of the first of them (a GEMM computed in whole block rows
    past the last output pixel: the kernel stores only those).

    Examples
    --------
    >>> from tvm.script import tir as T
    >>> @T.prim_func
    ... def copy(a: T.Buffer((4, 8), "int8"), b: T.Buffer((4, 8), "int8"), c: T.Buffer((4, 4), "int32")):
    ...     c[0, 0] = T.Cast("int32", a[0, 0])
    >>> extern_op(copy, te.placeholder((4, 8), "int8"), te.placeholder((4, 8), "int8"), "demo").op.tag
    'tcutils_demo'
    """
    data_buf, weight_buf, out_buf = (func.buffer_map[param] for param in func.params)
    ins = [tir.decl_buffer(tensor.shape, tensor.dtype, buf.name, data=buf.data)
           for tensor, buf in ((data, data_buf), (weight, weight_buf))]
    body = func.body
    if out_shape is not None and math.prod(out_shape) < math.prod(get_const_tuple(out_buf.shape)):
        body, out = epilogue.narrowed(body, out_buf.data, out_shape, out_buf.dtype, out_buf.name)
    else:
        out = tir.decl_buffer(out_shape or out_buf.shape, out_buf.dtype, out_buf.name, data=out_buf.data)
    return te.extern([out.shape], [data, weight], lambda ins_, outs_: body, in_buffers=ins,
                     out_buffers=[out], name=name, tag=f"{epilogue.TAG_PREFIX}{name}", dtype=out_buf.dtype)


def batch_matmul(data: te.Tensor, weight: te.Tensor, tiles: Optional[MmaTiles] = None, arch: int = 90
                 ) -> te.Tensor:
    """``data (B, M, K) x weight (B, N, K)^T`` per batch index in int32 (Relay's ``nn.batch_matmul`` with
    ``transpose_b``): int8 or uint8 operands on both sides (an attention product's two activations are
    uint8 in onnxruntime's QDQ files), one block grid per batch index.

    Raises
    ------
    TypeError, ValueError
        As :func:`dense`, and for batches that differ.

    Examples
    --------
    >>> batch_matmul(te.placeholder((4, 128, 64), "uint8"), te.placeholder((2, 128, 64), "uint8"))
    Traceback (most recent call last):
    ...
    ValueError: data has batch 4, weight 2 (no broadcasting)
    """
    sizes = operand_sizes(data, weight, "mma", mma_intrin.A_DTYPES, batched=True)
    return _extern(data, weight, tiles, arch, "batch_matmul", sizes)


def target_arch_number() -> int:
    """The arch number (80, 90, ...) of the CUDA target in scope (its ``-arch``, else GPU 0's)."""
    from ... import cuda

    return arch_number(cuda.target_arch(tvm.target.Target.current(allow_none=True)))


def dense_template(cfg, data: te.Tensor, weight: te.Tensor, out_dtype: str = "int32") -> te.Tensor:
    """AutoTVM compute of :data:`TASK`: :func:`dense` with the tiling as knobs.

    A configuration whose tiling does not fit the shape or the architecture is
    invalid (AutoTVM records it as such and moves on).

    Examples
    --------
    >>> x = te.placeholder((256, 512), "int8"); w = te.placeholder((256, 512), "int8")
    >>> dense_template(autotvm.get_config(), x, w, "float32")
    Traceback (most recent call last):
    ...
    ValueError: out_dtype: the mma int8 kernel accumulates in int32, got float32
    """
    if out_dtype != "int32":
        raise ValueError(f"out_dtype: the mma int8 kernel accumulates in int32, got {out_dtype}")
    _, m, n, k = operand_sizes(data, weight, "mma")
    arch = target_arch_number()
    cfg.add_flop(2 * m * n * k)
    tiles = template_tiles(cfg, KNOBS, MmaTiles, fallback_tiles(m, n, k, arch),
                           lambda tiles: fits(m, n, k, tiles, arch))
    return dense(data, weight, tiles, arch)


def schedule_dense(cfg, outs: Sequence[te.Tensor]) -> te.Schedule:
    """AutoTVM schedule of :data:`TASK`: the GEMM is scheduled inside its extern op already, and what Relay
    fused after it is folded into that op's kernel (:mod:`.epilogue`) where it can be; what cannot (and
    any op when this schedules the GEMM alone) is inlined into one element-wise kernel over the output.

    Examples
    --------
    >>> x = te.placeholder((64, 64), "int32")  # standing in for the GEMM's output
    >>> shifted = te.compute(x.shape, lambda i, j: (x[i, j] >> 4).astype("int8"), tag="injective")
    >>> with tvm.target.Target("cuda -arch=sm_80"):
    ...     text = str(tvm.lower(schedule_dense(None, [shifted]), [x, shifted]))
    >>> 'T.launch_thread("threadIdx.x"' in text  # the epilogue is a kernel of its own
    True
    """
    from tvm.topi.cuda.injective import schedule_injective_from_existing

    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    sched = te.create_schedule([out.op for out in outs])
    outputs = {out.op for out in outs}
    seen = set()

    def visit(op) -> None:
        if op in seen or not isinstance(op, te.ComputeOp):
            return
        seen.add(op)
        if op not in outputs:
            sched[op].compute_inline()
        for tensor in op.input_tensors:
            visit(tensor.op)

    for out in outs:
        visit(out.op)
    for out in outs:
        if isinstance(out.op, te.ComputeOp):
            schedule_injective_from_existing(sched, out)
    return sched
