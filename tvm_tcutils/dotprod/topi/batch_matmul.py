"""int8 batch_matmul on x86: tensorized with the dot-product instruction, or exact and plain.

TVM 0.19 sends a u8 x i8 ``batch_matmul`` (which its legalization makes of
every i8 x i8 one on AVX-512 targets) to a schedule tensorized with its own
VNNI / ``vpmaddubsw`` intrinsic: LLVM 22 aborts the process on VNNI targets and
the 16-bit saturating path gives wrong int32 results on AVX-512BW ones. Two
replacements:

* :func:`batch_matmul_dot` (an AutoTVM template) for every 8-bit pair the ISA
  multiplies natively or after flipping one operand's sign bit (:func:`stored_pair`:
  u8 x u8 on VNNI, the two activations of attention, is x x (y - 128) plus
  ``128 * sum_k x``, exact in int32): both operands are packed once per call,
  ``x`` to ``(B, M, K4)`` and ``y`` to ``(B, N/L, K4/4, L, 4)`` (``L`` lanes,
  ``K4`` = ``K`` rounded up to 4), which also undoes ``transpose_a`` /
  ``transpose_b`` (and flips the sign bit), and each ``L``-lane output block is
  one dot-product step per 4 ``K``; when ``N`` is a whole number of lanes each product tile is
  consumed (correction, fused epilogue) in the loop that computed it, and on AVX-512 the correction's
  row sums run on ``vpsadbw``;
* :func:`batch_matmul_exact` for 8-bit pairs no ISA variant takes even so:
  int32 products summed in int32, vectorized over ``N``.

Both broadcast a batch of 1 against the other operand's batch, as Relay does.
"""
from __future__ import annotations

from typing import Callable, Optional, Tuple

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te, tir
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.utils import get_const_tuple

from .common import (current_isa, divisors_up_to, find_op, flipped, inline_between, limit_row_tiles,
                     register_tile, tagged_outputs)
from .intrinsics import BYTE_SUM_WIDTH, WORD_BLOCK, byte_sum_intrin, dot_product_intrin, word_transpose_intrin
from .packing import round_up

#: Tag of the tensorized product, used by the schedule to find it among fused ops.
TAG = "batch_matmul_dot"
#: Tag of the exact fallback.
EXACT_TAG = "batch_matmul_exact"


def _dims(x: te.Tensor, y: te.Tensor, transpose_a: bool, transpose_b: bool) -> Tuple[int, int, int, int]:
    """``(batch, M, K, N)`` of ``x @ y`` after the transposes; raises on mismatched shapes."""
    (xb, x1, x2), (yb, y1, y2) = get_const_tuple(x.shape), get_const_tuple(y.shape)
    m, k = (x2, x1) if transpose_a else (x1, x2)
    n, k_y = (y1, y2) if transpose_b else (y2, y1)
    if k != k_y or (xb != yb and 1 not in (xb, yb)):
        raise ValueError(f"batch_matmul of {x.shape} and {y.shape} (transpose_a={transpose_a}, "
                         f"transpose_b={transpose_b}) does not fit")
    return max(xb, yb), m, k, n


_FLIPPED = {"uint8": "int8", "int8": "uint8"}


def stored_pair(isa, x_dtype: str, y_dtype: str) -> Optional[Tuple[str, str]]:
    """The dtypes ``x`` and ``y`` are packed in so that ``isa`` multiplies them: as given when it
    does natively, else with one operand's sign bit flipped (``v ^ 0x80``, i.e. ``v -/+ 128``);
    None when neither works.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> stored_pair(X86_VNNI, "uint8", "int8"), stored_pair(X86_VNNI, "uint8", "uint8")
    (('uint8', 'int8'), ('uint8', 'int8'))
    >>> stored_pair(X86_VNNI, "int8", "int8")  # y flipped: VNNI's swapped (i8, u8) form
    ('int8', 'uint8')
    """
    for pair in ((x_dtype, y_dtype), (x_dtype, _FLIPPED[y_dtype]), (_FLIPPED[x_dtype], y_dtype)):
        if isa.variant(*pair) is not None:
            return pair
    return None


def _reader(t: te.Tensor, transposed: bool) -> Callable:
    """``read(b, row, k)`` of a (batch, rows, K) operand stored as given (batch 1 broadcast)."""
    single = int(t.shape[0]) == 1

    def read(b, row, k):
        b = 0 if single else b
        return t[b, k, row] if transposed else t[b, row, k]

    return read


def batch_matmul_dot(cfg, x, y, out_shape=None, out_dtype="int32", transpose_a=False, transpose_b=True):
    """int8 ``batch_matmul`` tensorized with the current target's dot-product instruction.

    Parameters
    ----------
    cfg : ConfigSpace or ConfigEntity
        AutoTVM configuration (knobs ``tile_m`` and ``tile_nb``: output rows and ``L``-lane blocks per tile).
    x, y : te.Tensor
        ``(B, M, K)`` and ``(B, N, K)`` (``(B, K, M)`` / ``(B, K, N)`` when transposed), 8-bit, a dtype
        pair the ISA multiplies (see :func:`stored_pair`).
    out_shape : sequence, optional
        Relay's output shape (checked against the operands when given).
    out_dtype : str
        Must be ``"int32"``.
    transpose_a, transpose_b : bool
        As in Relay's ``nn.batch_matmul``.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> x = te.placeholder((2, 3, 10), "uint8"); y = te.placeholder((2, 5, 10), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = batch_matmul_dot(autotvm.get_config(), x, y)
    >>> [int(d) for d in out.shape], out.dtype
    ([2, 3, 5], 'int32')
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for a dot-product batch_matmul, got {out_dtype!r}")
    isa = current_isa("uint8", "int8")
    pair = stored_pair(isa, str(x.dtype), str(y.dtype))
    if pair is None:
        raise ValueError(f"the {isa.name} dot product takes no {x.dtype} x {y.dtype} operands, even with a "
                         f"sign bit flipped; use batch_matmul_exact")
    batch, m, k, n = _dims(x, y, transpose_a, transpose_b)
    if out_shape is not None and tuple(get_const_tuple(out_shape)) != (batch, m, n):
        raise ValueError(f"out_shape {out_shape} does not match the operands' ({batch}, {m}, {n})")
    lanes = isa.lanes
    k_p, n_p = round_up(k, 4), round_up(n, lanes)
    read_x, read_y = _reader(x, transpose_a), _reader(y, not transpose_b)
    zero_x, zero_y = tir.const(0, pair[0]), tir.const(0, pair[1])
    if k == k_p and not transpose_a and str(x.dtype) == pair[0] and int(x.shape[0]) == batch:
        x_pack = x  # already (B, M, K4) as the product reads it: no copy per call
    else:
        x_pack = te.compute(
            (batch, m, k_p),
            lambda b, i, c: tir.if_then_else(c < k, flipped(read_x(b, i, te.min(c, k - 1)), x.dtype, pair[0]),
                                             zero_x),
            name="bmm_data_pack", tag="dot_pack",
        )
    if isa.name in WORD_TRANSPOSE_ISAS and lanes == WORD_BLOCK and n == n_p and k % (4 * WORD_BLOCK) == 0 \
            and transpose_b:
        # Whole blocks of y as stored: packed 16 x 16 words at a time in registers (the schedule finds the tag).
        y_pack = te.compute(
            (batch, n // lanes, k // 4, lanes, 4),
            lambda b, o, c, ol, cs: flipped(read_y(b, o * lanes + ol, c * 4 + cs), y.dtype, pair[1]),
            name="bmm_weight_pack", tag=WORDS_TAG,
        )
    else:
        y_pack = te.compute(
            (batch, n_p // lanes, k_p // 4, lanes, 4),
            lambda b, o, c, ol, cs: tir.if_then_else(
                tir.all(o * lanes + ol < n, c * 4 + cs < k),
                flipped(read_y(b, te.min(o * lanes + ol, n - 1), te.min(c * 4 + cs, k - 1)), y.dtype, pair[1]),
                zero_y,
            ),
            name="bmm_weight_pack", tag="dot_pack",
        )
    budget = max(1, isa.accumulator_budget())
    # Rows need not divide M (the last tile's rows are guarded, outside the tensorized lanes); lane blocks
    # must divide N's, as a guard inside the lanes would stop the tensorization.
    cfg.define_knob("tile_m", list(range(1, min(m, budget) + 1)))
    cfg.define_knob("tile_nb", divisors_up_to(n_p // lanes, budget))
    tile_m, tile_nb = _fallback_tile(m, n_p // lanes, lanes, budget, per_tile=n == n_p)
    limit_row_tiles(cfg, lanes, budget, (tile_m, tile_nb))
    if cfg.is_fallback:
        cfg["tile_m"] = OtherOptionEntity(tile_m)
        cfg["tile_nb"] = OtherOptionEntity(tile_nb)
    r_ko = te.reduce_axis((0, k_p // 4), name="k_outer")
    r_ki = te.reduce_axis((0, 4), name="k_inner")
    product = te.compute(
        (batch, m, n_p),
        lambda b, i, j: te.sum(
            x_pack[b, i, r_ko * 4 + r_ki].astype("int32")
            * y_pack[b, j // lanes, r_ko, j % lanes, r_ki].astype("int32"),
            axis=[r_ko, r_ki],
        ),
        name="batch_matmul_dot", tag=TAG,
    )
    cfg.add_flop(2 * batch * m * n * k)
    correction = _flip_correction(x, y, pair, read_x, read_y, (batch, m, k, n))
    return te.compute(
        (batch, m, n), lambda b, i, j: product[b, i, j] + correction(b, i, j),
        name="bmm_slice", tag="injective,dot_unpack",
    )


def _fallback_tile(m: int, blocks: int, lanes: int, budget: int, per_tile: bool) -> Tuple[int, int]:
    """Untuned ``(tile_m, tile_nb)``.

    When N fills whole lane blocks each tile is consumed in the loop that computed it, and on a wide
    register file (16 or more accumulators' budget) the tile is up to 4 blocks by as many rows as keep
    the accumulators in registers (:func:`~.common.register_tile`): 12 (3 x 4) hide the dot
    product's latency where 8 do not (in registers, 8 chains reach 91 % of the peak, 12 reach 99 %),
    and BERT-base's attention products on Zen 5 run at 790-835 GOPS against 730-787 with 2 x 4.
    """
    if per_tile and budget >= 16:
        tile_m, tile_nb = register_tile(m, blocks, lanes, budget)
    else:
        tile_m = divisors_up_to(m, 4)[-1]
        tile_nb = divisors_up_to(blocks, max(1, budget // tile_m))[-1]
    return tile_m, tile_nb


def _flip_correction(x, y, pair, read_x, read_y, dims) -> Callable:
    """``correction(b, i, j)`` that makes the flipped operand's product exact again.

    Flipping ``y`` stores ``y' = y - s`` (``s`` = 128 for u8, -128 for i8), so
    ``sum_k x y = sum_k x y' + s * sum_k x``: a per-row sum of ``x`` (and likewise per column of
    ``y`` when ``x`` is flipped). Each sum is ``B * M * K`` additions, against ``B * M * N * K``
    multiply-adds of the product.
    """
    batch, m, k, n = dims
    if (str(x.dtype), str(y.dtype)) == tuple(pair):
        return lambda b, i, j: tir.const(0, "int32")
    flip_y = str(y.dtype) != pair[1]
    shift = 128 if str((y if flip_y else x).dtype) == "uint8" else -128
    rows, read = (m, read_x) if flip_y else (n, read_y)
    r_k = te.reduce_axis((0, k), name="k_sum")
    sums = te.compute(
        (batch, rows), lambda b, r: te.sum(read(b, r, r_k).astype("int32"), axis=r_k),
        name="bmm_flip_sum", tag="dot_flip_sum",
    )
    if flip_y:
        return lambda b, i, j: sums[b, i] * shift
    return lambda b, i, j: sums[b, j] * shift


def schedule_batch_matmul_dot(cfg, outs):
    """Schedule :func:`batch_matmul_dot` (packing, the tensorized product, the sliced output).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> x = te.placeholder((2, 3, 10), "uint8"); y = te.placeholder((2, 5, 10), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     cfg = autotvm.get_config()
    ...     out = batch_matmul_dot(cfg, x, y)
    ...     s = schedule_batch_matmul_dot(cfg, [out])
    >>> "vpdpbusd" in str(tvm.lower(s, [x, y, out]))  # tensorized with VNNI
    True
    """
    outs, product = tagged_outputs(outs, TAG)
    final = outs[-1]
    # N fills whole lane blocks: each product tile is consumed (correction, fused elementwise ops) while
    # it is in L1, in the same parallel loop, instead of by a second pass over the whole product.
    per_tile = (len(outs) == 1 and final.op != product.op and isinstance(final.op, te.ComputeOp)
                and get_const_tuple(final.shape) == get_const_tuple(product.shape))
    # Else the product is a root of the schedule, so that its bounds are its whole (lane-padded) shape.
    s = te.create_schedule([t.op for t in outs] if per_tile else [product.op] + [t.op for t in outs])
    x_pack, y_pack = product.op.input_tensors
    isa = current_isa(x_pack.dtype, y_pack.dtype)
    intrin = dot_product_intrin(isa, str(x_pack.dtype), str(y_pack.dtype))
    lanes = isa.lanes
    for pack in (x_pack, y_pack):
        if not isinstance(pack.op, te.ComputeOp):  # x read where it is
            continue
        axes = s[pack].op.axis
        s[pack].parallel(s[pack].fuse(axes[0], axes[1]))
        if pack.op.tag == WORDS_TAG:
            _, words = s[pack].split(axes[2], factor=WORD_BLOCK)
            s[pack].tensorize(words, word_transpose_intrin(str(pack.op.input_tensors[0].dtype), str(pack.dtype)))
        else:
            s[pack].vectorize(axes[-1])
    sums = find_op(outs, "dot_flip_sum")
    if sums is not None:
        s[sums].parallel(s[sums].op.axis[0])
        _byte_sums(s, sums, isa)
    tile_m, tile_n = cfg["tile_m"].val, cfg["tile_nb"].val * lanes
    if per_tile:
        inline_between(s, outs, product)
        b, i, j = s[final].op.axis
        i_o, i_i = s[final].split(i, factor=tile_m)
        j_o, j_i = s[final].split(j, factor=tile_n)
        s[final].reorder(b, i_o, j_o, i_i, j_i)
        tile = s[final].fuse(b, i_o, j_o)
        s[final].parallel(tile)
        j_b, j_l = s[final].split(j_i, factor=lanes)
        s[final].vectorize(j_l)
        s[final].unroll(i_i)
        s[final].unroll(j_b)
        s[product].compute_at(s[final], tile)
        _, i_i, j_i = s[product].op.axis
    else:
        # The product stays a stage of its own (its N is padded to the lanes); whatever follows it
        # (the slice, fused elementwise ops) is one parallel, vectorized loop nest over the output.
        _schedule_elementwise_tail(s, outs, product)
        b, i, j = s[product].op.axis
        i_o, i_i = s[product].split(i, factor=tile_m)
        j_o, j_i = s[product].split(j, factor=tile_n)
        s[product].reorder(b, i_o, j_o, i_i, j_i)
        s[product].parallel(s[product].fuse(b, i_o, j_o))
    r_ko, r_ki = s[product].op.reduce_axis
    j_b, j_l = s[product].split(j_i, factor=lanes)
    s[product].reorder(r_ko, i_i, j_b, j_l, r_ki)
    s[product].unroll(i_i)
    s[product].unroll(j_b)
    s[product].tensorize(j_l, intrin)
    return s


#: ISAs whose packing of ``y`` transposes 16 x 16 words in registers (:func:`~.intrinsics.word_transpose_intrin`).
WORD_TRANSPOSE_ISAS = ("x86_vnni",)
#: Tag of that packing stage.
WORDS_TAG = "dot_pack_words"

#: ISAs whose row sums run on AVX-512BW's ``vpsadbw`` (:func:`~.intrinsics.byte_sum_intrin`).
BYTE_SUM_ISAS = ("x86_vnni",)


def _byte_sums(s: te.Schedule, sums: te.Tensor, isa) -> None:
    """Tensorize the flip correction's row sums with ``vpsadbw`` where the ISA has it and rows are whole
    64-byte chunks read contiguously (the operand as stored, not transposed)."""
    (r_k,) = s[sums].op.reduce_axis
    source = sums.op.body[0].source[0]  # the read's widening cast
    load = source.value if isinstance(source, tir.Cast) else None
    contiguous = (isinstance(load, tir.ProducerLoad) and isinstance(load.indices[-1], tir.Var)
                  and load.indices[-1].same_as(r_k.var))
    if isa.name not in BYTE_SUM_ISAS or int(r_k.dom.extent) % BYTE_SUM_WIDTH or not contiguous:
        return
    _, k_i = s[sums].split(r_k, factor=BYTE_SUM_WIDTH)
    s[sums].tensorize(k_i, byte_sum_intrin(str(load.dtype)))


def _schedule_elementwise_tail(s: te.Schedule, outs, stop: te.Tensor) -> None:
    """Inline the injective ops between ``outs`` and ``stop``; parallelize and vectorize the outputs."""
    inline_between(s, outs, stop)
    for out in outs:
        if out.op == stop.op or not isinstance(out.op, te.ComputeOp):
            continue
        axes = s[out].op.axis
        fused = s[out].fuse(*axes[:-1]) if len(axes) > 1 else axes[0]
        s[out].parallel(fused)
        if len(axes) > 1:
            s[out].vectorize(s[out].split(axes[-1], factor=16)[1])


def batch_matmul_exact(x, y, out_shape=None, out_dtype="int32", transpose_a=False, transpose_b=True):
    """8-bit ``batch_matmul`` as plain int32 multiply-adds: exact for any dtype pair.

    For the pairs a target's dot-product instruction does not take (u8 x u8 on VNNI): TVM's own
    int8 path would pack them for an instruction that cannot multiply them.

    Examples
    --------
    >>> from tvm import te
    >>> x = te.placeholder((1, 3, 8), "uint8"); y = te.placeholder((4, 5, 8), "uint8")
    >>> out = batch_matmul_exact(x, y)
    >>> [int(d) for d in out.shape], out.dtype
    ([4, 3, 5], 'int32')
    """
    batch, m, k, n = _dims(x, y, transpose_a, transpose_b)
    dtype = out_dtype or "int32"
    read_x, read_y = _reader(x, transpose_a), _reader(y, not transpose_b)
    r_k = te.reduce_axis((0, k), name="k")
    return te.compute(
        (batch, m, n),
        lambda b, i, j: te.sum(read_x(b, i, r_k).astype(dtype) * read_y(b, j, r_k).astype(dtype), axis=r_k),
        name="batch_matmul_exact", tag=EXACT_TAG,
    )


def schedule_batch_matmul_exact(outs):
    """Schedule :func:`batch_matmul_exact`: parallel over batch and rows, ``N`` innermost and vectorized.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te
    >>> x = te.placeholder((2, 3, 8), "uint8"); y = te.placeholder((2, 20, 8), "uint8")
    >>> out = batch_matmul_exact(x, y)
    >>> f = tvm.build(schedule_batch_matmul_exact([out]), [x, y, out], "llvm")
    """
    outs, product = tagged_outputs(outs, EXACT_TAG)
    s = te.create_schedule([t.op for t in outs])
    _schedule_elementwise_tail(s, outs, product)
    b, i, j = s[product].op.axis
    (r_k,) = s[product].op.reduce_axis
    j_o, j_i = s[product].split(j, factor=16)
    s[product].reorder(b, i, j_o, r_k, j_i)
    s[product].parallel(s[product].fuse(b, i))
    s[product].vectorize(j_i)
    return s
