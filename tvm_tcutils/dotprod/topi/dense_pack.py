"""int8 dense with a packed weight, tensorized with a 4-way dot-product instruction.

Layouts (``L`` = lanes of the target's ISA): data ``(M, K)`` uint8/int8 with
``K`` a multiple of 4; weight ``NC{L}n4c``: ``(N/L, K/4, L, 4)``, so each
``L x 4`` block is contiguous (for a reduce-range ISA ``(N/L, K/4 + 1, L, 4)``:
one zero quad more marks a weight whose values were checked,
:func:`~.packing.dense_weight_marked`); output ``(M, N)`` int32. The schedule keeps a
``tile_m x tile_nb`` block of ``L``-lane accumulators in registers while it
walks ``K`` four at a time, and fuses following elementwise ops per tile;
on VNNI the tiles run column block by column block (:data:`COLUMNS_OUTER_ISAS`).
"""
from __future__ import annotations

from typing import Tuple

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.utils import get_const_tuple

from .common import (LATENCY_CHAINS, REQUANTIZED, current_isa, divisors_up_to, inline_between, limit_row_tiles,
                     measuring_packed_alone, register_tile, requantized, tagged_outputs)
from .intrinsics import dot_product_intrin
from .packing import dense_weight_marked, round_up

#: Tag of the dense op, used by the schedule to find it among fused ops.
TAG = "dense_pack_dot"

#: ISAs whose dense tiles walk the weight's column blocks outermost: each block of weights then serves every
#: row tile while it is in cache, and the weight is read from memory once. Rows outermost, a token matrix
#: (M = 128) reads the whole weight again for every row tile, and BERT-base's weights (85 MB) do not stay in
#: cache between runs: on VNNI (Zen 4, dynamic route, 1 thread) its dense kernels ran 3-7 % faster, the
#: model x1.04 end to end. AVX2's kernels (4x the compute per weight byte) measured level to 1-3 % slower
#: that way (x0.98 [0.89, 1.01] end to end) and keep rows outermost, as SSE and HVX (not measured). A one-row
#: dense (a CNN's classifier) runs the same loop either way.
COLUMNS_OUTER_ISAS = frozenset({"x86_vnni"})


def _define_knobs(cfg, isa, m: int, n_blocks: int, k_quads: int, block: int) -> None:
    budget = max(1, isa.registers * 3 // 4 // (block // isa.lanes))
    # Rows need not divide M (the last tile's rows are guarded outside the tensorized lanes).
    cfg.define_knob("tile_m", list(range(1, min(m, budget) + 1)))
    cfg.define_knob("tile_nb", divisors_up_to(n_blocks, budget))
    cfg.define_knob("tile_k", divisors_up_to(k_quads, 64)[-4:])
    tile_m, tile_nb = _fallback_tile(m, n_blocks, block, budget)
    limit_row_tiles(cfg, block, budget, (tile_m, tile_nb))
    if cfg.is_fallback:
        cfg["tile_m"] = OtherOptionEntity(tile_m)
        cfg["tile_nb"] = OtherOptionEntity(tile_nb)
        cfg["tile_k"] = OtherOptionEntity(divisors_up_to(k_quads, 64)[-1])


def _fallback_tile(m: int, n_blocks: int, block: int, budget: int) -> Tuple[int, int]:
    """Untuned ``(tile_m, tile_nb)``: 4 rows (or M's largest divisor below) by blocks for half the budget;
    a token matrix (M >= 8) on a wide register file whose tile that leaves under
    :data:`~.common.LATENCY_CHAINS` accumulators takes up to 4 blocks by as many rows as stay in registers
    (bert-tiny's 256-wide products, 16 blocks: 4 x 2 -> 3 x 4, the model 5-7 % faster on Zen 5; BERT-base's
    4 x 3 stays, 3 x 4 made it 4-5 % slower).

    Examples
    --------
    >>> _fallback_tile(128, 16, 16, 24), _fallback_tile(128, 48, 16, 24), _fallback_tile(1, 63, 16, 24)
    ((3, 4), (4, 3), (1, 9))
    """
    tile_m = divisors_up_to(m, 4)[-1]
    tile_nb = divisors_up_to(n_blocks, max(1, budget // tile_m // 2))[-1]
    if m >= 8 and budget >= 16 and tile_m * tile_nb < LATENCY_CHAINS:
        tile_m, tile_nb = register_tile(m, n_blocks, block, budget)
    return tile_m, tile_nb


def dense_pack_dot(cfg, data, weight, bias=None, out_dtype="int32"):
    """Compute int8 dense ``data @ unpack(weight).T`` on a ``NC{L}n4c`` packed weight.

    Parameters
    ----------
    cfg : ConfigSpace or ConfigEntity
        AutoTVM configuration (knobs ``tile_m``, ``tile_nb`` (weight blocks per tile), ``tile_k``).
    data : te.Tensor
        ``(M, K)`` uint8/int8, ``K`` a multiple of 4.
    weight : te.Tensor
        ``(N/L, K/4, L, 4)`` int8/uint8, or int8 ``(N/L, K/4 + 1, L, 4)``: marked for the
        target's reduce-range ISA (its last quad is not read).
    bias : te.Tensor, optional
        ``(N,)`` int32, added to the result.
    out_dtype : str
        Must be ``"int32"``.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((2, 64), "uint8"); w = te.placeholder((4, 16, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = dense_pack_dot(autotvm.get_config(), d, w)
    >>> [int(x) for x in out.shape]
    [2, 64]
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for dot-product dense, got {out_dtype!r}")
    (m, k), w_shape = get_const_tuple(data.shape), get_const_tuple(weight.shape)
    marked = dense_weight_marked(w_shape, k)
    isa = current_isa(data.dtype, weight.dtype, reduce_range=marked)
    if len(w_shape) != 4 or w_shape[1] * 4 != k + 4 * marked or w_shape[3] != 4:
        raise ValueError(f"weight must be (N/L, {k // 4}, L, 4) for data (M, {k}); got {w_shape}")
    lanes = w_shape[2]
    if lanes % isa.lanes:
        raise ValueError(f"weight block {lanes} is not a multiple of {isa.name}'s {isa.lanes} lanes")
    n = w_shape[0] * lanes
    _define_knobs(cfg, isa, m, w_shape[0], k // 4, lanes)
    cfg.add_flop(2 * m * n * k)
    return packed_product(data, weight, lanes, bias, "dense_pack_dot", TAG)


def packed_product(data: te.Tensor, weight: te.Tensor, lanes: int, bias, name: str, tag: str) -> te.Tensor:
    """``data @ unpack(weight).T`` in int32 on an ``NC{lanes}n4c`` weight (plus ``bias``): the compute the
    dot-product and the tile kernels (:mod:`.dense_amx`) schedule, each under its own ``tag``.

    Examples
    --------
    >>> d = te.placeholder((2, 8), "uint8"); w = te.placeholder((1, 2, 16, 4), "int8")
    >>> out = packed_product(d, w, 16, None, "p", "p")
    >>> [int(x) for x in out.shape], out.op.tag
    ([2, 16], 'p')
    """
    m, k = get_const_tuple(data.shape)
    n = int(weight.shape[0]) * lanes
    r_ko = te.reduce_axis((0, k // 4), name="k_outer")
    r_ki = te.reduce_axis((0, 4), name="k_inner")
    out = te.compute(
        (m, n),
        lambda i, j: te.sum(
            data[i, r_ko * 4 + r_ki].astype("int32")
            * weight[j // lanes, r_ko, j % lanes, r_ki].astype("int32"),
            axis=[r_ko, r_ki],
        ),
        name=name,
        tag=tag,
    )
    if bias is not None:
        out = te.compute((m, n), lambda i, j: out[i, j] + bias[j].astype("int32"), tag="injective,bias")
    return out


def schedule_dense_pack_dot(cfg, outs, mode: str = "llvm"):
    """Schedule :func:`dense_pack_dot` and the elementwise ops fused after it.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((2, 64), "uint8"); w = te.placeholder((4, 16, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     cfg = autotvm.get_config()
    ...     out = dense_pack_dot(cfg, d, w)
    ...     s = schedule_dense_pack_dot(cfg, [out])
    >>> "vpdpbusd" in str(tvm.lower(s, [d, w, out]))  # tensorized with VNNI
    True
    """
    outs, dense = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    data, weight = dense.op.input_tensors
    marked = dense_weight_marked(get_const_tuple(weight.shape), int(data.shape[1]))
    isa = current_isa(data.dtype, weight.dtype, reduce_range=marked)
    intrin = dot_product_intrin(isa, str(data.dtype), str(weight.dtype), mode)
    out = outs[0]
    inline_between(s, outs, dense)
    if len(out.shape) != 2 or get_const_tuple(out.shape) != get_const_tuple(dense.shape):
        out = dense
    # Tiles hold whole weight blocks, so j // block is the tile's block index plus a loop variable.
    block = int(weight.shape[2])
    tile_m, tile_n = cfg["tile_m"].val, cfg["tile_nb"].val * block
    i, j = s[out].op.axis
    i_o, i_i = s[out].split(i, factor=tile_m)
    j_o, j_i = s[out].split(j, factor=tile_n)
    outer = (j_o, i_o) if isa.name in COLUMNS_OUTER_ISAS else (i_o, j_o)
    s[out].reorder(*outer, i_i, j_i)
    tile = s[out].fuse(*outer)
    s[out].parallel(tile)
    if out.op != dense.op:
        s[dense].compute_at(s[out], tile)
        if mode == "llvm":
            s[out].vectorize(s[out].split(j_i, factor=isa.lanes)[1])
        c_i, c_j = s[dense].op.axis
    else:
        c_i, c_j = i_i, j_i
    r_ko, r_ki = s[dense].op.reduce_axis
    k_o, k_i = s[dense].split(r_ko, factor=cfg["tile_k"].val)
    j_b, j_w = s[dense].split(c_j, factor=block)
    j_wo, j_l = s[dense].split(j_w, factor=isa.lanes)
    s[dense].reorder(k_o, k_i, c_i, j_b, j_wo, j_l, r_ki)
    for axis in (c_i, j_b, j_wo):
        s[dense].unroll(axis)
    s[dense].tensorize(j_l, intrin)
    return s


def dense_dot(cfg, data, weight, bias=None, out_dtype="int32"):
    """int8 dense on a plain ``(N, K)`` weight: packs it, runs :func:`dense_pack_dot`, slices.

    Used where Relay did not alter the layout (opt_level < 3); K is zero-padded
    to a multiple of 4 and N to the lane count.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((2, 10), "uint8"); w = te.placeholder((5, 10), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = dense_dot(autotvm.get_config(), d, w)
    >>> [int(x) for x in out.shape]
    [2, 5]
    """
    isa = current_isa(data.dtype, weight.dtype)
    (m, k), (n, k_w) = get_const_tuple(data.shape), get_const_tuple(weight.shape)
    if k != k_w:
        raise ValueError(f"data has K={k} but weight has K={k_w}")
    lanes = isa.lanes
    k_p, n_p = round_up(k, 4), round_up(n, lanes)
    if measuring_packed_alone() and bias is None:
        data_p = te.placeholder((m, k_p), data.dtype, name="data_pack")
        weight_p = te.placeholder((n_p // lanes, k_p // 4, lanes, 4), weight.dtype, name="weight_pack")
        return requantized(dense_pack_dot(cfg, data_p, weight_p, None, out_dtype), (1,))
    zero_d, zero_w = tvm.tir.const(0, data.dtype), tvm.tir.const(0, weight.dtype)
    data_p = te.compute(
        (m, k_p), lambda i, j: tvm.tir.if_then_else(j < k, data[i, te.min(j, k - 1)], zero_d),
        name="data_pack", tag="dot_pack",
    )
    weight_p = te.compute(
        (n_p // lanes, k_p // 4, lanes, 4),
        lambda o, c, ol, cs: tvm.tir.if_then_else(
            tvm.tir.all(o * lanes + ol < n, c * 4 + cs < k),
            weight[te.min(o * lanes + ol, n - 1), te.min(c * 4 + cs, k - 1)], zero_w,
        ),
        name="weight_pack", tag="dot_pack",
    )
    out = dense_pack_dot(cfg, data_p, weight_p, None, out_dtype)
    return te.compute(
        (m, n),
        lambda i, j: out[i, j] + (bias[j].astype("int32") if bias is not None else 0),
        name="dense_slice", tag="injective,dot_unpack",
    )


def schedule_dense_dot(cfg, outs, mode: str = "llvm"):
    """Schedule :func:`dense_dot` (packing stages, the dense, the sliced output).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((2, 10), "uint8"); w = te.placeholder((5, 10), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     cfg = autotvm.get_config()
    ...     out = dense_dot(cfg, d, w)
    ...     s = schedule_dense_dot(cfg, [out])
    >>> "vpdpbusd" in str(tvm.lower(s, [d, w, out]))  # tensorized with VNNI
    True
    """
    outs, dense = tagged_outputs(outs, TAG)
    if outs[0].op.name == REQUANTIZED:  # packed operands, an epilogue like a network's (measuring_packed_alone)
        return schedule_dense_pack_dot(cfg, outs, mode)
    s = schedule_dense_pack_dot(cfg, [dense] + outs, mode)
    for pack in dense.op.input_tensors:
        if pack.op.tag == "dot_pack":
            axes = s[pack].op.axis
            s[pack].parallel(axes[0])
            if mode == "llvm":
                s[pack].vectorize(axes[-1])
    final = outs[0]
    inline_between(s, outs, dense)
    s[final].parallel(s[final].op.axis[0])
    return s
