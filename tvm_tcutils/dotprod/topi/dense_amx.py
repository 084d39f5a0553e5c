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

from ..isa.x86_amx import X86_AMX, TileISA
from .common import divisors_up_to, inline_between, tagged_outputs
from .tiles import Tiles, matrix, vnni_block

#: Tag of the tile dense op.
TAG = "dense_pack_amx"


def applicable(isa: Optional[TileISA], m: int, k: int, w_shape, data_dtype: str, weight_dtype: str) -> str:
    """Why a dense of ``(m, k)`` data and a packed weight of ``w_shape`` cannot run on ``isa``'s tiles,
    or ``""`` when it can.

    Examples
    --------
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
    >>> fallback_tile(X86_AMX, 128, 48), fallback_tile(X86_AMX, 128, 3), fallback_tile(X86_AMX, 16, 4)
    ((2, 2), (3, 1), (1, 2))
    """
    best_a, best_b = isa.block()
    tile_b = divisors_up_to(blocks, best_b)[-1]
    row_tiles = -(-m // isa.rows)
    tile_a = max(a for a in range(1, isa.tiles) if isa.fits(a, tile_b) and (a <= best_a or tile_b < best_b))
    return min(tile_a, row_tiles), tile_b


def _define_knobs(cfg, isa: TileISA, m: int, blocks: int) -> None:
    cfg.define_knob("tile_a", list(range(1, isa.tiles)))
    cfg.define_knob("tile_b", divisors_up_to(blocks, isa.tiles))
    cfg.multi_filter(filter=lambda e: isa.fits(e["tile_a"].val, e["tile_b"].val))
    if cfg.is_fallback:
        tile_a, tile_b = fallback_tile(isa, m, blocks)
        cfg["tile_a"] = OtherOptionEntity(tile_a)
        cfg["tile_b"] = OtherOptionEntity(tile_b)


def current_tile_isa(data_dtype: str, weight_dtype: str) -> TileISA:
    """The current target's tile engine for the dtype pair.

    Raises
    ------
    ValueError
        When the target has none, or no such product.
    """
    target = tvm.target.Target.current(allow_none=True)
    if target is None or not X86_AMX.supports(target):
        raise ValueError(f"target {target} has no usable AMX tile engine (needs amx-tile and amx-int8)")
    if X86_AMX.variant(data_dtype, weight_dtype) is None:
        raise ValueError(f"{X86_AMX.name} cannot multiply {data_dtype} by {weight_dtype}")
    return X86_AMX


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
    _define_knobs(cfg, isa, m, w_shape[0])
    lanes = isa.columns
    r_ko = te.reduce_axis((0, k // 4), name="k_outer")
    r_ki = te.reduce_axis((0, 4), name="k_inner")
    out = te.compute(
        (m, w_shape[0] * lanes),
        lambda i, j: te.sum(
            data[i, r_ko * 4 + r_ki].astype("int32")
            * weight[j // lanes, r_ko, j % lanes, r_ki].astype("int32"),
            axis=[r_ko, r_ki],
        ),
        name="dense_pack_amx",
        tag=TAG,
    )
    cfg.add_flop(2 * m * w_shape[0] * lanes * k)
    if bias is not None:
        out = te.compute(out.shape, lambda i, j: out[i, j] + bias[j].astype("int32"), tag="injective,bias")
    return out


def strip_intrin(isa: TileISA, m: int, k: int, tile_a: int, tile_b: int, data_dtype: str, weight_dtype: str):
    """The tensor intrinsic of one task: ``(m, 16 * tile_b)`` int32 of ``m`` data rows by ``tile_b``
    weight blocks over the whole ``k``, as one tile program (:class:`~.tiles.Tiles`)."""
    variant = isa.variant(data_dtype, weight_dtype)
    lanes, depth = isa.columns, isa.depth
    a = te.placeholder((m, k), data_dtype, name="a")
    w = te.placeholder((tile_b, k // 4, lanes, 4), weight_dtype, name="w")
    r_ko = te.reduce_axis((0, k // 4), name="ko")
    r_ki = te.reduce_axis((0, 4), name="ki")
    c = te.compute(
        (m, tile_b * lanes),
        lambda i, j: te.sum(a[i, r_ko * 4 + r_ki].astype("int32")
                            * w[j // lanes, r_ko, j % lanes, r_ki].astype("int32"), axis=[r_ko, r_ki]),
        name="c",
    )
    binds = {
        a: tvm.tir.decl_buffer(a.shape, a.dtype, name="a_buf", offset_factor=1, strides=[te.var("a_row"), 1]),
        w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1,
                               strides=[te.var("w_block"), lanes * 4, 4, 1]),
        c: tvm.tir.decl_buffer(c.shape, c.dtype, name="c_buf", offset_factor=1, strides=[te.var("c_row"), 1]),
    }
    step_rows = isa.rows * tile_a
    full, tail = divmod(m, step_rows)

    def shapes(rows_by_tile):
        # Registers: accumulators a x b, then the data tiles, then the weight tiles.
        acc = [(rows_by_tile[i], isa.row_bytes) for i in range(tile_a) for _ in range(tile_b)]
        data = [(rows_by_tile[i], depth) for i in range(tile_a)]
        return acc + data + [(depth // 4, isa.row_bytes)] * tile_b

    def program(ins, outs):
        a_buf, w_buf = ins
        (c_buf,) = outs
        ib = tvm.tir.ir_builder.create()

        def steps(tiles: Tiles, row0, row_tiles: int) -> None:
            for t in range(row_tiles * tile_b):
                tiles.zero(t)
            with ib.for_range(0, k // depth, name="kk") as kk:
                for i in range(row_tiles):
                    tiles.load(tile_a * tile_b + i, matrix(a_buf, row0 + i * isa.rows, kk * depth))
                for j in range(tile_b):
                    tiles.load(tile_a * tile_b + tile_a + j, vnni_block(w_buf, j, kk * (depth // 4), isa))
                for i in range(row_tiles):
                    for j in range(tile_b):
                        tiles.multiply(i * tile_b + j, tile_a * tile_b + i, tile_a * tile_b + tile_a + j)
            for i in range(row_tiles):
                for j in range(tile_b):
                    tiles.store(i * tile_b + j, matrix(c_buf, row0 + i * isa.rows, j * lanes, element_bytes=4))

        if full:
            tiles = Tiles(ib, isa, variant, shapes([isa.rows] * tile_a))
            with ib.for_range(0, full, name="step") as step:
                steps(tiles, step * step_rows, tile_a)
        if tail:
            # The rows left: a configuration whose last data and accumulator tiles hold fewer rows.
            rows = [min(isa.rows, tail - i * isa.rows) for i in range(-(-tail // isa.rows))]
            rows += [isa.rows] * (tile_a - len(rows))
            steps(Tiles(ib, isa, variant, shapes(rows)), full * step_rows, -(-tail // isa.rows))
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
    tile_a, tile_b = cfg["tile_a"].val, cfg["tile_b"].val
    intrin = strip_intrin(isa, m, k, tile_a, tile_b, str(data.dtype), str(weight.dtype))
    out = outs[0]
    inline_between(s, outs, dense)
    if len(out.shape) != 2 or get_const_tuple(out.shape) != get_const_tuple(dense.shape):
        out = dense
    i, j = s[out].op.axis
    j_o, j_i = s[out].split(j, factor=tile_b * isa.columns)
    s[out].reorder(j_o, i, j_i)
    s[out].parallel(j_o)
    if out.op != dense.op:
        s[dense].compute_at(s[out], j_o)
        s[out].vectorize(s[out].split(j_i, factor=isa.columns)[1])
        s[dense].tensorize(s[dense].op.axis[0], intrin)
    else:
        s[dense].tensorize(i, intrin)
    return s


__all__ = ["TAG", "applicable", "dense_pack_amx", "schedule_dense_pack_amx", "strip_intrin", "fallback_tile"]

