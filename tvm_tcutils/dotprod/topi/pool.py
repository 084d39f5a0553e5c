"""8-bit NCHW max pooling as two separable passes, vectorized along the rows.

TVM's x86 pool schedule vectorizes only channel-blocked layouts; an 8-bit ``NCHW`` max pool (what a
quantized model's pool reads after a conv whose channels are no whole vector blocks: ShuffleNet's 24-channel
stem) runs as scalar loops over every window: 608 us for a 3x3 stride-2 pool of 24 x 112 x 112 bytes on
Zen 4. The maximum is separable, so this takes it along each padded row first (the ``KW`` taps of every
output column) and then down the columns (``KH`` rows), each pass vectorized over output columns: 31 us,
the same bytes (a maximum is exact). Padding holds the dtype's minimum, as TVM's pool pads; ``ceil_mode``
adds the rows and columns its last windows read to that padding.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from ..._tvm import tvm
from tvm import te, topi
from tvm.topi.utils import get_const_tuple

from .common import inline_between, tagged_outputs
from .injective import vector_factor

#: Tag of the pooled output (the column pass).
TAG = "max_pool2d_rows"


def pool_output_size(size: int, kernel: int, stride: int, before: int, after: int, ceil_mode: bool) -> int:
    """Output length of a pool along one axis, as ``nn.max_pool2d`` computes it.

    Examples
    --------
    >>> pool_output_size(112, 3, 2, 1, 1, False), pool_output_size(112, 3, 2, 0, 0, True)
    (56, 56)
    """
    span = size + before + after - kernel
    return (-(-span // stride) if ceil_mode else span // stride) + 1


def max_pool2d_rows(data: te.Tensor, pool_size: Sequence[int], strides: Sequence[int],
                    padding: Sequence[int], ceil_mode: bool = False) -> te.Tensor:
    """Max pool of 8-bit ``(N, C, H, W)`` data: the row pass, then the column pass.

    Parameters
    ----------
    data : te.Tensor
        ``(N, C, H, W)`` int8 / uint8.
    pool_size, strides : sequence of 2 ints
    padding : sequence of 4 ints
        ``(top, left, bottom, right)``.
    ceil_mode : bool
        As ``nn.max_pool2d``'s.

    Raises
    ------
    ValueError
        For data that is no 8-bit 4-D tensor.

    Examples
    --------
    >>> x = te.placeholder((1, 24, 112, 112), "uint8")
    >>> [int(d) for d in max_pool2d_rows(x, (3, 3), (2, 2), (1, 1, 1, 1)).shape]
    [1, 24, 56, 56]
    """
    if len(data.shape) != 4 or str(data.dtype) not in ("int8", "uint8"):
        raise ValueError(f"data must be 8-bit (N, C, H, W), got {str(data.dtype)} of {len(data.shape)} dims")
    (batch, chans, height, width), (k_h, k_w), (s_h, s_w) = get_const_tuple(data.shape), pool_size, strides
    top, left, bottom, right = padding
    out_h = pool_output_size(height, k_h, s_h, top, bottom, ceil_mode)
    out_w = pool_output_size(width, k_w, s_w, left, right, ceil_mode)
    # The rows and columns the last windows read (ceil_mode may read past the padding).
    bottom, right = (out_h - 1) * s_h + k_h - height - top, (out_w - 1) * s_w + k_w - width - left
    lowest = tvm.tir.min_value(data.dtype)
    if top or left or bottom or right:
        data = topi.nn.pad(data, (0, 0, top, left), (0, 0, max(bottom, 0), max(right, 0)), pad_value=lowest,
                           name="pool_pad")
    rows = te.compute(
        (batch, chans, height + top + max(bottom, 0), out_w),
        lambda n, c, y, x: _maximum([data[n, c, y, x * s_w + k] for k in range(k_w)]),
        name="pool_rows",
    )
    return te.compute(
        (batch, chans, out_h, out_w),
        lambda n, c, y, x: _maximum([rows[n, c, y * s_h + k, x] for k in range(k_h)]),
        name="pool_columns", tag=TAG,
    )


#: Tag of a column average (:func:`avg_pool2d_columns`).
AVG_TAG = "avg_pool2d_columns"


def avg_pool2d_columns(data: te.Tensor, pool_height: int, stride: int, padding: Tuple[int, int],
                       count_include_pad: bool) -> te.Tensor:
    """Average pool of float32 ``(N, C, H, W)`` data over ``pool_height`` rows and one column: the window
    along the rows (what :func:`~tvm_tcutils.fast_forms.fast_lrn` pools over a ``(N, 1, C, H*W)`` view of the
    channels).

    The taps are summed in TVM's order from its zero padding and the sum divided by the window (or, without
    ``count_include_pad``, by the rows inside the data), as ``nn.avg_pool2d`` computes it: the same floats.

    Raises
    ------
    ValueError
        For data that is no float32 4-D tensor.

    Examples
    --------
    >>> x = te.placeholder((1, 1, 192, 3025), "float32")
    >>> [int(d) for d in avg_pool2d_columns(x, 5, 1, (2, 2), True).shape]
    [1, 1, 192, 3025]
    """
    if len(data.shape) != 4 or str(data.dtype) != "float32":
        raise ValueError(f"data must be float32 (N, C, H, W), got {str(data.dtype)} of {len(data.shape)} dims")
    batch, chans, height, width = get_const_tuple(data.shape)
    top, bottom = padding
    out_h = pool_output_size(height, pool_height, stride, top, bottom, False)
    zero = tvm.tir.const(0.0, "float32")

    def tap(n, c, y, x, k):
        row = y * stride + k - top
        if not (top or bottom):
            return data[n, c, row, x]
        inside = tvm.tir.all(row >= 0, row < height)
        return tvm.tir.if_then_else(inside, data[n, c, te.max(te.min(row, height - 1), 0), x], zero)

    def average(n, c, y, x):
        total = zero + tap(n, c, y, x, 0)  # TVM's sum starts from its zero
        for k in range(1, pool_height):
            total = total + tap(n, c, y, x, k)
        if count_include_pad or not (top or bottom):
            return total / tvm.tir.const(float(pool_height), "float32")
        first, last = te.max(y * stride - top, 0), te.min(y * stride - top + pool_height, height)
        return total / (last - first).astype("float32")

    return te.compute((batch, chans, out_h, width), average, name="pool_columns_avg", tag=AVG_TAG)


def schedule_avg_pool2d_columns(outs) -> te.Schedule:
    """Schedule :func:`avg_pool2d_columns` and the elementwise ops fused after it: a channel plane a parallel
    task, vectorized along the columns by :func:`~.injective.vector_factor`.

    Examples
    --------
    >>> x = te.placeholder((1, 1, 64, 3025), "float32")
    >>> out = avg_pool2d_columns(x, 5, 1, (2, 2), True)
    >>> "+ 11]" in str(tvm.lower(schedule_avg_pool2d_columns([out]), [x, out]))  # 3025 = 11 * 275
    True
    """
    outs, pool = tagged_outputs(outs, AVG_TAG)
    s = te.create_schedule([out.op for out in outs])
    inline_between(s, outs, pool)
    if pool.op not in [out.op for out in outs]:
        s[pool].compute_inline()  # no reduction: computed where the fused op reads it
    lanes = vector_factor(int(pool.shape[3]))
    for out in outs:
        n, c, y, x = s[out].op.axis
        s[out].parallel(s[out].fuse(n, c, y))
        s[out].vectorize(s[out].split(x, factor=lanes)[1])
    return s


def _maximum(values):
    out = values[0]
    for value in values[1:]:
        out = te.max(out, value)
    return out


def schedule_max_pool2d_rows(outs) -> te.Schedule:
    """Schedule :func:`max_pool2d_rows` and the elementwise ops fused after it: a channel plane a parallel
    task, its row pass computed there, both passes vectorized by :func:`~.injective.vector_factor` of the
    output width.

    Examples
    --------
    >>> x = te.placeholder((1, 24, 112, 112), "uint8")
    >>> out = max_pool2d_rows(x, (3, 3), (2, 2), (1, 1, 1, 1))
    >>> text = str(tvm.lower(schedule_max_pool2d_rows([out]), [x, out]))
    >>> "T.parallel(24)" in text, "+ 14]" in text  # a plane a task; 14-lane rows
    (True, True)
    """
    outs, pool = tagged_outputs(outs, TAG)
    s = te.create_schedule([out.op for out in outs])
    rows = pool.op.input_tensors[0]
    if rows.op.input_tensors and isinstance(rows.op.input_tensors[0].op, te.ComputeOp):
        s[rows.op.input_tensors[0]].compute_inline()  # the padding
    lanes = vector_factor(int(pool.shape[3]))
    inline_between(s, outs, pool)
    n, c, y, x = s[pool].op.axis
    plane = s[pool].fuse(n, c)
    s[pool].parallel(plane)
    s[pool].vectorize(s[pool].split(x, factor=lanes)[1])
    s[rows].compute_at(s[pool], plane)
    s[rows].vectorize(s[rows].split(s[rows].op.axis[3], factor=lanes)[1])
    for out in outs:
        if out.op == pool.op:
            continue
        n, c, y, x = s[out].op.axis  # an elementwise epilogue: the pool's shape
        s[out].parallel(s[out].fuse(n, c))
        s[out].vectorize(s[out].split(x, factor=lanes)[1])
    return s


def pool_padding(padding: Sequence[int]) -> Tuple[int, int, int, int]:
    """``nn.max_pool2d``'s padding (1, 2 or 4 values) as ``(top, left, bottom, right)``.

    Examples
    --------
    >>> pool_padding((1,)), pool_padding((1, 2)), pool_padding((0, 1, 2, 3))
    ((1, 1, 1, 1), (1, 2, 1, 2), (0, 1, 2, 3))
    """
    padding = tuple(int(p) for p in padding)
    if len(padding) == 1:
        return padding * 4
    if len(padding) == 2:
        return padding * 2
    return padding
