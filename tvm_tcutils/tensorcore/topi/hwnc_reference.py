"""A plain HWNC conv2d for CPU targets, so that converted models build and can be checked on llvm.

TVM has HWNC conv2d only as a CUDA tensor-core schedule; its CPU strategies
reject the layout. This compute is the textbook definition (any kernel
layout that is a permutation of OIHW, stride, padding, dilation, groups,
out_dtype) with a simple parallel schedule: a reference for numerics, not a
fast kernel. It is wired as a strategy row for ``cpu`` targets that applies
only to ``data_layout == "HWNC"`` (see :mod:`tvm_tcutils.tensorcore.hooks`).
"""
from __future__ import annotations

from typing import Sequence, Union

from ..._tvm import tvm  # noqa: F401  (TVM checked first; the examples use it)
from tvm import te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple, traverse_inline

#: Tag of the compute, used by the schedule to find it among fused ops.
TAG = "tcutils_conv2d_hwnc_reference"
DATA_LAYOUT = "HWNC"


def _pair(value) -> tuple:
    return (value, value) if isinstance(value, int) else tuple(int(v) for v in value)


def conv2d_hwnc(
    data: te.Tensor,
    kernel: te.Tensor,
    strides: Union[int, Sequence[int]],
    padding: Union[int, Sequence[int]],
    dilation: Union[int, Sequence[int]],
    groups: int = 1,
    kernel_layout: str = "HWOI",
    out_dtype: str = "",
) -> te.Tensor:
    """Direct conv2d with data in HWNC layout; the output is HWNC too.

    Parameters
    ----------
    data : te.Tensor
        ``(height, width, batch, in_channels)``.
    kernel : te.Tensor
        Kernel in ``kernel_layout`` (a permutation of ``OIHW``; ``I`` is
        ``in_channels // groups``).
    strides, padding, dilation : int or sequence of int
        As for ``relay.nn.conv2d`` (padding 1, 2 or 4 values).
    groups : int
        Convolution groups.
    kernel_layout : str
        Layout of ``kernel``.
    out_dtype : str
        Accumulation and output type; the data type when empty.

    Returns
    -------
    te.Tensor
        ``(out_height, out_width, batch, out_channels)``.

    Examples
    --------
    >>> data = te.placeholder((8, 8, 1, 4), name="data")
    >>> kernel = te.placeholder((3, 3, 6, 4), name="kernel")
    >>> conv2d_hwnc(data, kernel, 1, 1, 1).shape
    [8, 8, 1, 6]
    """
    out_dtype = out_dtype or data.dtype
    in_height, in_width, batch, in_channels = get_const_tuple(data.shape)
    kernel_shape = dict(zip(kernel_layout, get_const_tuple(kernel.shape)))
    out_channels, group_in, kernel_h, kernel_w = (kernel_shape[axis] for axis in "OIHW")
    if in_channels != group_in * groups or out_channels % groups:
        raise ValueError(
            f"conv2d_hwnc: {in_channels} input channels, {out_channels} output channels and a kernel with "
            f"{group_in} inputs per group do not fit groups={groups}"
        )
    stride_h, stride_w = _pair(strides)
    dilation_h, dilation_w = _pair(dilation)
    pad_top, pad_left, pad_bottom, pad_right = get_pad_tuple(
        padding, ((kernel_h - 1) * dilation_h + 1, (kernel_w - 1) * dilation_w + 1)
    )
    out_height = (in_height + pad_top + pad_bottom - (kernel_h - 1) * dilation_h - 1) // stride_h + 1
    out_width = (in_width + pad_left + pad_right - (kernel_w - 1) * dilation_w - 1) // stride_w + 1
    padded = topi.nn.pad(data, [pad_top, pad_left, 0, 0], [pad_bottom, pad_right, 0, 0], name="hwnc_pad")
    group_out = out_channels // groups
    rh = te.reduce_axis((0, kernel_h), name="rh")
    rw = te.reduce_axis((0, kernel_w), name="rw")
    rc = te.reduce_axis((0, group_in), name="rc")

    def kernel_at(o, i, h, w):
        where = {"O": o, "I": i, "H": h, "W": w}
        return kernel[tuple(where[axis] for axis in kernel_layout)]

    return te.compute(
        (out_height, out_width, batch, out_channels),
        lambda h, w, n, o: te.sum(
            padded[h * stride_h + rh * dilation_h, w * stride_w + rw * dilation_w, n, (o // group_out) * group_in + rc]
            .astype(out_dtype)
            * kernel_at(o, rc, rh, rw).astype(out_dtype),
            axis=[rh, rw, rc],
        ),
        name="conv2d_hwnc",
        tag=TAG,
    )


def schedule_conv2d_hwnc(outs: Union[te.Tensor, Sequence[te.Tensor]]) -> te.Schedule:
    """Schedule :func:`conv2d_hwnc` and the ops fused after it: rows of the output in parallel.

    Examples
    --------
    >>> data = te.placeholder((8, 8, 1, 4), name="data")
    >>> kernel = te.placeholder((3, 3, 6, 4), name="kernel")
    >>> out = conv2d_hwnc(data, kernel, 1, 1, 1)
    >>> func = tvm.build(schedule_conv2d_hwnc(out), [data, kernel, out], "llvm")
    >>> import numpy as np
    >>> ones = [tvm.nd.array(np.ones(shape, "float32")) for shape in ((8, 8, 1, 4), (3, 3, 6, 4))]
    >>> result = tvm.nd.empty((8, 8, 1, 6)); func(*ones, result)
    >>> result.numpy()[[4, 0], [4, 0], 0, 0].tolist()  # 3x3x4 inside, 2x2x4 at a padded corner
    [36.0, 16.0]
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    sched = te.create_schedule([out.op for out in outs])

    def parallel_rows(stage):
        axes = stage.op.axis
        if len(axes) >= 2:
            stage.parallel(stage.fuse(axes[0], axes[1]))
        elif axes:
            stage.parallel(axes[0])

    def visit(op):
        if op.tag == TAG:
            pad = op.input_tensors[0]
            if isinstance(pad.op, te.ComputeOp) and pad.op.name == "hwnc_pad":
                sched[pad].compute_inline()
            parallel_rows(sched[op])

    traverse_inline(sched, outs[0].op, visit)
    for out in outs:
        if out.op.tag != TAG:
            parallel_rows(sched[out])
    return sched
