"""Conv2d in HWNC layout on integer tensor cores (int4/uint4 and int8/uint8, int32 accumulation).

Layouts:

* data ``HWNC`` ``(H, W, N, C)``; packed and padded to
  ``(H + pads, W + pads, N/m, C/k, m, k)`` inside the kernel;
* kernel ``HWOI`` ``(KH, KW, O, I)`` or pre-packed ``HWOI{n}o{k}i``
  ``(KH, KW, O/n, I/k, n, k)`` (what :func:`kernel_layout` names and the
  alter-op hook produces once at compile time);
* output ``HWNC`` ``(OH, OW, N, O)``, unpacked from the packed int32 GEMM result
  ``(OH, OW, N/m, O/n, m, n)``.

Plain functions only: registration lives in :mod:`tvm_tcutils.tensorcore.strategy`.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

from ..._tvm import tvm
from tvm import te, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from . import tiled_mma, wmma

#: AutoTVM task name of the conv2d template.
TASK = "tcutils.conv2d_hwnc_tensorcore.cuda"

IntOrPair = Union[int, Sequence[int]]


def kernel_layout(shape: wmma.WmmaShape) -> str:
    """Relay layout name of a kernel pre-packed for ``shape``.

    Examples
    --------
    >>> kernel_layout(wmma.WmmaShape(8, 8, 32))
    'HWOI8o32i'
    """
    return f"HWOI{shape.n}o{shape.k}i"


def _pair(value: IntOrPair, name: str) -> Tuple[int, int]:
    values = (value, value) if isinstance(value, int) else tuple(int(v) for v in value)
    if len(values) != 2 or min(values) < 1:
        raise ValueError(f"{name} must be a positive int or a pair of them, got {value!r}")
    return values


def pack_kernel(kernel: te.Tensor, shape: wmma.WmmaShape) -> te.Tensor:
    """``HWOI`` -> ``(KH, KW, O/n, I/k, n, k)``: one B tile per ``(o, i)`` block, ``k`` innermost.

    Examples
    --------
    >>> w = te.placeholder((3, 3, 64, 64), "int8")
    >>> pack_kernel(w, wmma.WmmaShape(16, 16, 16)).shape
    [3, 3, 4, 4, 16, 16]
    """
    kh, kw, co, ci = get_const_tuple(kernel.shape)
    return te.compute(
        (kh, kw, co // shape.n, ci // shape.k, shape.n, shape.k),
        lambda h, w, ob, ib, o, i: kernel[h, w, ob * shape.n + o, ib * shape.k + i],
        name="kernel_packed", tag="tcutils_pack",
    )


def pack_data(data: te.Tensor, shape: wmma.WmmaShape, pads: Sequence[int]) -> te.Tensor:
    """``HWNC`` -> zero-padded ``(H', W', N/m, C/k, m, k)``; ``pads`` is (top, left, bottom, right).

    Examples
    --------
    >>> x = te.placeholder((7, 7, 8, 64), "int4")
    >>> pack_data(x, wmma.WmmaShape(8, 8, 32), (1, 1, 1, 1)).shape
    [9, 9, 1, 2, 8, 32]
    """
    h, w, n, c = get_const_tuple(data.shape)
    top, left, bottom, right = pads
    zero = tvm.tir.const(0, data.dtype)

    def _element(y, x, nb, cb, ni, ci):
        inside = tvm.tir.all(y >= top, y < h + top, x >= left, x < w + left)
        value = data[y - top, x - left, nb * shape.m + ni, cb * shape.k + ci]
        return tvm.tir.if_then_else(inside, value, zero)

    return te.compute(
        (h + top + bottom, w + left + right, n // shape.m, c // shape.k, shape.m, shape.k),
        _element, name="data_packed", tag="tcutils_pack",
    )


def conv2d_hwnc(
    data: te.Tensor,
    kernel: te.Tensor,
    strides: IntOrPair,
    padding: Union[int, Sequence[int]],
    dilation: IntOrPair,
    out_dtype: str = "int32",
    shape: Optional[wmma.WmmaShape] = None,
    unit: Optional[Sequence[int]] = None,
) -> te.Tensor:
    """HWNC conv2d as a packed tensor-core GEMM followed by unpacking.

    Parameters
    ----------
    data : te.Tensor
        ``(H, W, N, C)`` in int4/uint4/int8/uint8.
    kernel : te.Tensor
        ``(KH, KW, O, C)`` (``HWOI``) or pre-packed ``(KH, KW, O/n, C/k, n, k)``, same dtype.
    strides, dilation : int or pair
    padding : int, pair or (top, left, bottom, right)
    out_dtype : str
        Must be ``int32``.
    shape : WmmaShape, optional
        WMMA shape (default: the preferred fitting one, or the pre-packed kernel's).
    unit : (int, int), optional
        Tiling unit of the schedule knobs (default ``(shape.m, shape.n)``).

    Returns
    -------
    te.Tensor
        ``(OH, OW, N, O)`` int32.

    Examples
    --------
    >>> x = te.placeholder((14, 14, 8, 64), "int8"); w = te.placeholder((3, 3, 64, 64), "int8")
    >>> conv2d_hwnc(x, w, 1, 1, 1).shape
    [14, 14, 8, 64]
    """
    if len(data.shape) != 4:
        raise ValueError(f"data must be 4-D HWNC, got shape {get_const_tuple(data.shape)}")
    if len(kernel.shape) not in (4, 6):
        raise ValueError(f"kernel must be HWOI (4-D) or HWOI<n>o<k>i (6-D), got shape {get_const_tuple(kernel.shape)}")
    h, w, n, c = get_const_tuple(data.shape)
    dims = get_const_tuple(kernel.shape)
    prepacked = len(dims) == 6
    kh, kw = dims[:2]
    co, ci = (dims[2] * dims[4], dims[3] * dims[5]) if prepacked else dims[2:]
    if ci != c:
        raise ValueError(f"kernel has {ci} input channels, data has {c}")
    if prepacked and shape is None and data.dtype in wmma.WMMA_SHAPES:
        shape = wmma.shape_for(data.dtype, n=dims[4])
    shape = tiled_mma.resolve_shape([data, kernel], out_dtype, n, c, co, shape)
    if prepacked and (shape.n, shape.k) != dims[4:]:
        raise ValueError(f"kernel is packed for {dims[4]}x{dims[5]} tiles but WMMA shape {shape.name} was asked for")
    packed_kernel = kernel if prepacked else pack_kernel(kernel, shape)
    sh, sw = _pair(strides, "strides")
    dh, dw = _pair(dilation, "dilation")
    pads = get_pad_tuple(padding, ((kh - 1) * dh + 1, (kw - 1) * dw + 1))
    packed_data = pack_data(data, shape, pads)
    out_h = (h + pads[0] + pads[2] - (kh - 1) * dh - 1) // sh + 1
    out_w = (w + pads[1] + pads[3] - (kw - 1) * dw - 1) // sw + 1

    ry, rx = te.reduce_axis((0, kh), name="ry"), te.reduce_axis((0, kw), name="rx")
    rb, ri = te.reduce_axis((0, c // shape.k), name="rb"), te.reduce_axis((0, shape.k), name="ri")
    gemm = tiled_mma.packed_gemm(
        (out_h, out_w, n // shape.m, co // shape.n, shape.m, shape.n),
        lambda y, x, nb, ob_, mi, ni: te.sum(
            packed_data[y * sh + ry * dh, x * sw + rx * dw, nb, rb, mi, ri].astype(out_dtype)
            * packed_kernel[ry, rx, ob_, rb, ni, ri].astype(out_dtype),
            axis=[ry, rx, rb, ri],
        ),
        shape, unit or (shape.m, shape.n), name="conv2d_hwnc_packed",
    )
    return te.compute(
        (out_h, out_w, n, co),
        lambda y, x, b, o: gemm[y, x, b // shape.m, o // shape.n, b % shape.m, o % shape.n],
        name="conv2d_hwnc", tag=topi.tag.INJECTIVE,
    )


def conv2d_hwnc_template(cfg, data, kernel, strides, padding, dilation, out_dtype="int32") -> te.Tensor:
    """AutoTVM compute of :data:`TASK`: :func:`conv2d_hwnc` with the WMMA shape as a knob.

    Examples
    --------
    >>> from tvm import autotvm
    >>> x = te.placeholder((14, 14, 8, 64), "int8"); w = te.placeholder((3, 3, 64, 64), "int8")
    >>> with tvm.target.Target("cuda -arch=sm_80"):
    ...     out = conv2d_hwnc_template(autotvm.get_config(), x, w, 1, 1, 1)
    >>> out.shape, out.dtype
    ([14, 14, 8, 64], 'int32')
    """
    _, _, n, c = get_const_tuple(data.shape)
    kshape = get_const_tuple(kernel.shape)
    packed_n = kshape[4] if len(kshape) == 6 else None
    co = kshape[2] * kshape[4] if packed_n else kshape[2]
    shape, unit = tiled_mma.choose_shape(cfg, data.dtype, n, c, co, packed_n)
    out = conv2d_hwnc(data, kernel, strides, padding, dilation, out_dtype, shape, unit)
    kh, kw = get_const_tuple(kernel.shape)[:2]
    out_h, out_w, n, co = get_const_tuple(out.shape)
    cfg.add_flop(2 * out_h * out_w * n * co * kh * kw * get_const_tuple(data.shape)[3])
    return out


def schedule_conv2d_hwnc(cfg, outs) -> te.Schedule:
    """AutoTVM schedule of :data:`TASK` (see :mod:`.tiled_mma`).

    Lowering needs no GPU, only the target:

    Examples
    --------
    >>> from tvm import autotvm
    >>> x = te.placeholder((14, 14, 8, 64), "int8"); w = te.placeholder((3, 3, 64, 64), "int8")
    >>> with tvm.target.Target("cuda -arch=sm_80"):
    ...     cfg = autotvm.get_config()
    ...     out = conv2d_hwnc_template(cfg, x, w, 1, 1, 1)
    ...     sched = schedule_conv2d_hwnc(cfg, [out])
    >>> "tvm_mma_sync" in str(tvm.lower(sched, [x, w, out]))
    True
    """
    return tiled_mma.schedule(cfg, outs)
