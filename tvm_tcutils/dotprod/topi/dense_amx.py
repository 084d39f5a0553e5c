"""int8 dense on a tile engine (AMX), on the dot-product kernels' packed weight.

The weight keeps the ``NC16n4c`` layout the VNNI kernels pack (``(N/16, K/4, 16, 4)``): 16 quads of a
block are one 16-row x 64-byte ``B`` tile as they lie, so the alter-layout hook and the constant-folded
weights stay as they are. Data ``(M, K)`` rows are the ``A`` tiles (16 rows x 64 bytes at the row
stride). Each parallel task takes ``tile_b`` weight blocks (a strip of ``16 * tile_b`` output columns,
whose weights then serve every row from the L1/L2 caches) and walks the rows ``16 * tile_a`` at a time;
a step loads ``tile_a`` data tiles and ``tile_b`` weight tiles and multiplies each pair into its own
accumulator tile, the whole of ``K`` before one store. Rows past the last full step take a second tile
configuration of fewer rows (no padding copy, no read past ``M``). Elementwise ops after it (the
requantize epilogue) run on the task's strip while it is in cache.

Requires ``K`` to be a multiple of the tile depth (64) and 16-column weight blocks; other denses keep
the VNNI kernels (:func:`applicable`).
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.utils import get_const_tuple

from ..isa.x86_amx import TileISA
from .common import current_tile_isa, divisors_up_to, inline_between, tagged_outputs
from .dense_pack import packed_product
from .tiles import matrix, run_steps, vnni_block

#: Tag of the tile dense op.
TAG = "dense_pack_amx"


def applicable(isa: Optional[TileISA], m: int, k: int, w_shape, data_dtype: str, weight_dtype: str) -> str:
    """Why a dense of ``(m, k)`` data and a packed weight of ``w_shape`` cannot run on ``isa``'s tiles,
    or ``""`` when it can.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> applicable(X86_AMX, 128, 768, (48, 192, 16, 4), "uint8", "int8")
    ''
    >>> applicable(X86_AMX, 128, 100, (48, 25, 16, 4), "uint8", "int8")
    'K=100 is not a multiple of the tile depth 64'
    >>> applicable(X86_AMX, 8, 768, (48, 192, 16, 4), "uint8", "int8")
    'M=8 rows fill under one 16-row tile (the vector kernels are as fast)'
    """
    if isa is None:
        return "the target has no tile engine"
    if isa.variant(data_dtype, weight_dtype) is None:
        return f"{isa.name} has no {data_dtype} x {weight_dtype} product"
    if len(w_shape) != 4 or w_shape[2] != isa.columns or w_shape[3] != isa.reduce or w_shape[1] * 4 != k:
        return f"weight {tuple(w_shape)} is not (N/{isa.columns}, {k // 4}, {isa.columns}, {isa.reduce})"
    if k % isa.depth:
        return f"K={k} is not a multiple of the tile depth {isa.depth}"
    if m < isa.rows:
        return f"M={m} rows fill under one {isa.rows}-row tile (the vector kernels are as fast)"
    return ""


def fallback_tile(isa: TileISA, m: int, blocks: int) -> Tuple[int, int]:
    """Untuned ``(tile_a, tile_b)``: the ISA's step (:meth:`TileISA.block`) cut to what divides the
    weight blocks and fills the rows, then as many data tiles as the registers left hold.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> fallback_tile(X86_AMX, 128, 48), fallback_tile(X86_AMX, 128, 3), fallback_tile(X86_AMX, 16, 4)
    ((2, 2), (3, 1), (1, 2))
    """
    best_a, best_b = isa.block()
    tile_b = divisors_up_to(blocks, best_b)[-1]
    row_tiles = -(-m // isa.rows)
    tile_a = max(a for a in range(1, isa.tiles) if isa.fits(a, tile_b) and (a <= best_a or tile_b < best_b))
    return min(tile_a, row_tiles), tile_b


#: Tile products a parallel task runs at least, where the columns allow: each task loads its tile
#: configuration and reaches the tiles through TVM's thread pool, which a task of a few products does not
#: pay for (measured: see :func:`task_groups`).
MIN_TASK_PRODUCTS = 256


def task_groups(isa: TileISA, m: int, k: int, blocks: int, tile_b: int) -> int:
    """Untuned strips of ``tile_b`` weight blocks per parallel task: the fewest that give a task
    :data:`MIN_TASK_PRODUCTS` tile products (all strips where none does).

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> task_groups(X86_AMX, 128, 768, 48, 2), task_groups(X86_AMX, 128, 64, 8, 2)
    (2, 4)
    """
    per_strip = -(-m // isa.rows) * tile_b * (k // isa.depth)
    strips = blocks // tile_b
    return next((g for g in divisors_up_to(strips, strips) if g * per_strip >= MIN_TASK_PRODUCTS), strips)


def define_step_knobs(cfg, isa: TileISA, blocks: int, pixels: int, knobs=(), also=None):
    """Define a tile step's knobs ``tile_a`` (data tiles) and ``tile_b`` (weight tiles of ``blocks``), then
    ``knobs`` (``(name, values)``), keeping the points whose tiles all have registers and that ``also``
    (a filter on the entities) keeps. Returns the untuned ``(tile_a, tile_b)`` (:func:`fallback_tile`, for
    ``pixels`` rows of data) where ``cfg`` is a fallback, else None."""
    cfg.define_knob("tile_a", list(range(1, isa.tiles)))
    cfg.define_knob("tile_b", divisors_up_to(blocks, isa.tiles))
    for name, values in knobs:
        cfg.define_knob(name, values)
    cfg.multi_filter(filter=lambda e: isa.fits(e["tile_a"].val, e["tile_b"].val) and (also is None or also(e)))
    if not cfg.is_fallback:
        return None
    tile_a, tile_b = fallback_tile(isa, pixels, blocks)
    cfg["tile_a"] = OtherOptionEntity(tile_a)
    cfg["tile_b"] = OtherOptionEntity(tile_b)
    return tile_a, tile_b


def define_knobs(cfg, isa: TileISA, m: int, k: int, blocks: int) -> None:
    """The knobs of a tile product of ``m`` rows by ``blocks`` column blocks over ``k``: the step
    (:func:`define_step_knobs`) and ``groups`` (strips a task, untuned :func:`task_groups`)."""
    untuned = define_step_knobs(cfg, isa, blocks, m, [("groups", divisors_up_to(blocks, blocks))],
                                also=lambda e: blocks % (e["tile_b"].val * e["groups"].val) == 0)
    if untuned is not None:
        cfg["groups"] = OtherOptionEntity(task_groups(isa, m, k, blocks, untuned[1]))


def dense_pack_amx(cfg, data, weight, bias=None, out_dtype="int32"):
    """Compute int8 dense ``data @ unpack(weight).T`` with AMX tiles on an ``NC16n4c`` weight.

    Parameters
    ----------
    cfg : ConfigSpace or ConfigEntity
        AutoTVM configuration (knobs ``tile_a``: data tiles a step, ``tile_b``: weight blocks a task).
    data : te.Tensor
        ``(M, K)`` uint8/int8, ``K`` a multiple of 64.
    weight : te.Tensor
        ``(N/16, K/4, 16, 4)`` int8/uint8.
    bias : te.Tensor, optional
        ``(N,)`` int32, added to the result.
    out_dtype : str
        Must be ``"int32"``.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((20, 128), "uint8"); w = te.placeholder((4, 32, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     out = dense_pack_amx(autotvm.get_config(), d, w)
    >>> [int(x) for x in out.shape]
    [20, 64]
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for an AMX dense, got {out_dtype!r}")
    (m, k), w_shape = get_const_tuple(data.shape), get_const_tuple(weight.shape)
    isa = current_tile_isa(str(data.dtype), str(weight.dtype))
    why = applicable(isa, m, k, w_shape, str(data.dtype), str(weight.dtype))
    if why and m >= isa.rows:
        raise ValueError(f"dense_pack_amx: {why}")
    define_knobs(cfg, isa, m, k, w_shape[0])
    cfg.add_flop(2 * m * w_shape[0] * isa.columns * k)
    return packed_product(data, weight, isa.columns, bias, "dense_pack_amx", TAG)


def strip_intrin(isa: TileISA, m: int, k: int, tile_a: int, tile_b: int, data_dtype: str, weight_dtype: str,
                 batched: bool = False, groups: int = 1):
    """The tensor intrinsic of one task: ``(m, 16 * tile_b * groups)`` int32 of ``m`` data rows by
    ``groups`` strips of ``tile_b`` weight blocks over the whole ``k``, as one tile program
    (:class:`~.tiles.Tiles`); ``batched``: each operand has a leading batch axis of extent 1 (one batch
    of a batch_matmul)."""
    variant = isa.variant(data_dtype, weight_dtype)
    lanes, depth = isa.columns, isa.depth
    lead = (1,) if batched else ()
    a = te.placeholder(lead + (m, k), data_dtype, name="a")
    w = te.placeholder(lead + (tile_b * groups, k // 4, lanes, 4), weight_dtype, name="w")
    r_ko = te.reduce_axis((0, k // 4), name="ko")
    r_ki = te.reduce_axis((0, 4), name="ki")
    c = te.compute(
        lead + (m, tile_b * groups * lanes),
        lambda *idx: te.sum(a[idx[:-2] + (idx[-2], r_ko * 4 + r_ki)].astype("int32")
                            * w[idx[:-2] + (idx[-1] // lanes, r_ko, idx[-1] % lanes, r_ki)].astype("int32"),
                            axis=[r_ko, r_ki]),
        name="c",
    )
    def batch_stride(name):
        return [te.var(f"{name}_batch")] if batched else []

    binds = {
        a: tvm.tir.decl_buffer(a.shape, a.dtype, name="a_buf", offset_factor=1,
                               strides=batch_stride("a") + [te.var("a_row"), 1]),
        w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1,
                               strides=batch_stride("w") + [te.var("w_block"), lanes * 4, 4, 1]),
        c: tvm.tir.decl_buffer(c.shape, c.dtype, name="c_buf", offset_factor=1,
                               strides=batch_stride("c") + [te.var("c_row"), 1]),
    }
    tile_rows = [min(isa.rows, m - start) for start in range(0, m, isa.rows)]

    def program(ins, outs):
        a_buf, w_buf = ins
        (c_buf,) = outs
        ib = tvm.tir.ir_builder.create()
        run_steps(ib, isa, variant, tile_rows, (k // depth,), tile_a, tile_b, groups, depth // 4,
                  data=lambda g, kk: matrix(a_buf, g * isa.rows, kk * depth),
                  weights=lambda col, kk: vnni_block(w_buf, col // lanes, kk * (depth // 4), isa),
                  outputs=lambda g, col: matrix(c_buf, g * isa.rows, col, element_bytes=4))
        return ib.get()

    return te.decl_tensor_intrin(c.op, program, binds=binds)


def schedule_dense_pack_amx(cfg, outs):
    """Schedule :func:`dense_pack_amx` and the elementwise ops fused after it.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((20, 128), "uint8"); w = te.placeholder((4, 32, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     cfg = autotvm.get_config()
    ...     out = dense_pack_amx(cfg, d, w)
    ...     s = schedule_dense_pack_amx(cfg, [out])
    >>> "tdpbusd" in str(tvm.lower(s, [d, w, out]))
    True
    """
    outs, dense = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    data, weight = dense.op.input_tensors
    isa = current_tile_isa(str(data.dtype), str(weight.dtype))
    m, k = get_const_tuple(data.shape)
    tile_a, tile_b, groups = cfg["tile_a"].val, cfg["tile_b"].val, cfg["groups"].val
    intrin = strip_intrin(isa, m, k, tile_a, tile_b, str(data.dtype), str(weight.dtype), groups=groups)
    strips(s, outs, dense, isa, tile_b * groups, intrin)
    return s


def strips(s: te.Schedule, outs, product: te.Tensor, isa: TileISA, blocks: int, intrin) -> None:
    """Run ``product`` (``(..., M, N)``) one parallel task per leading index and ``16 * blocks``
    columns, each one tile program (``intrin``), with the elementwise ops between it and ``outs[0]``
    inlined into one vectorized pass over the task's strip."""
    out = outs[0]
    inline_between(s, outs, product)
    if get_const_tuple(out.shape) != get_const_tuple(product.shape):
        out = product
    *lead, i, j = s[out].op.axis
    j_o, j_i = s[out].split(j, factor=blocks * isa.columns)
    s[out].reorder(*lead, j_o, i, j_i)
    task = s[out].fuse(*lead, j_o) if lead else j_o
    s[out].parallel(task)
    if out.op != product.op:
        s[product].compute_at(s[out], task)
        s[out].vectorize(s[out].split(j_i, factor=isa.columns)[1])
        s[product].tensorize(s[product].op.axis[len(lead)], intrin)
    else:
        s[product].tensorize(i, intrin)


__all__ = ["TAG", "applicable", "dense_pack_amx", "schedule_dense_pack_amx", "strip_intrin", "strips", "fallback_tile",
           "define_knobs", "define_step_knobs"]

