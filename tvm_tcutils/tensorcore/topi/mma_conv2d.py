"""HWNC int8 conv2d on sm_80+ tensor cores as an implicit GEMM on the :mod:`.mma_gemm` kernel.

An HWNC convolution is a GEMM whose rows are the output pixels in their own
order, ``(oh, ow, n)``, whose columns are the output channels, and whose K runs
over ``(kh, kw, c)``: row ``(oh, ow, n)`` of the left operand is the receptive
field of that pixel, and row ``o`` of the right one is ``kernel[:, :, o, :]``
of the HWOI kernel. Neither operand is materialized: the GEMM's copies into
shared memory gather them, 16 bytes of channels at a time, straight from the
HWNC data and the HWOI kernel (``cp.async``; the pieces that fall in the zero
padding, or on rows past the last pixel, are predicated off and written as
zeros), so the kernel reads each input where it lies, with the
``ldmatrix``/``mma.sync`` m16n8k32 core and pipeline of :mod:`.mma_gemm`.

Requirements: channels in multiples of 16 (a 16-byte piece never straddles two
kernel positions), output channels a multiple of the block's columns, int8 or
uint8 data, int8 kernel, int32 out, no groups. The output pixels need not fill
whole block rows: the GEMM computes rows up to the next block and stores only
its first rows, the ``(OH, OW, N, O)`` output. What Relay fuses after the
convolution (bias, requantize, cast) runs in the same kernel (:mod:`.epilogue`).

Examples
--------
>>> geometry((56, 56, 8, 64), (3, 3, 64, 64), 1, 1, 1).gemm
(25088, 64, 576)
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Tuple, Union

from ..._tvm import tvm  # noqa: F401  (TVM through the package's loader first)
from tvm import autotvm, te, tir  # noqa: F401  (autotvm: the doctests')
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from . import mma_gemm, mma_intrin
from .conv2d_hwnc import _pair

#: AutoTVM task name of the template.
TASK = "tcutils.conv2d_hwnc_mma.cuda"

#: Channels come in pieces of this many bytes (one ``cp.async`` each).
CHANNEL_PIECE = mma_gemm.COPY_BYTES

#: The largest fraction of a GEMM's rows the fallback tiling may spend on padding past the last pixel
#: (7x7 maps at batch 8: 392 pixels, 416 rows in 32-row blocks, 512 in 128-row ones).
MAX_ROW_WASTE = 0.125

IntOrPair = Union[int, Sequence[int]]


class Geometry(NamedTuple):
    """Sizes of an HWNC conv2d and of its implicit GEMM."""

    height: int
    width: int
    batch: int
    channels: int
    out_channels: int
    kernel: Tuple[int, int]
    strides: Tuple[int, int]
    pads: Tuple[int, int, int, int]  # top, left, bottom, right
    dilation: Tuple[int, int]

    @property
    def out_size(self) -> Tuple[int, int]:
        top, left, bottom, right = self.pads
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilation
        return ((self.height + top + bottom - (kh - 1) * dh - 1) // sh + 1,
                (self.width + left + right - (kw - 1) * dw - 1) // sw + 1)

    @property
    def gemm(self) -> Tuple[int, int, int]:
        """(rows M = output pixels, columns N = output channels, K = kernel positions x channels)."""
        out_h, out_w = self.out_size
        return out_h * out_w * self.batch, self.out_channels, self.kernel[0] * self.kernel[1] * self.channels

    def problem(self) -> Optional[str]:
        """Why the implicit GEMM cannot take this convolution (None when it can, tiles aside).

        Examples
        --------
        >>> geometry((224, 224, 8, 3), (7, 7, 64, 3), 2, 3, 1).problem()
        '3 input channels are not a multiple of 16'
        """
        if self.channels % CHANNEL_PIECE:
            return f"{self.channels} input channels are not a multiple of {CHANNEL_PIECE}"
        if min(self.out_size) < 1:
            return f"the output would be {self.out_size[0]}x{self.out_size[1]}"
        return None


def geometry(data_shape: Sequence[int], kernel_shape: Sequence[int], strides: IntOrPair,
             padding: IntOrPair, dilation: IntOrPair) -> Geometry:
    """The :class:`Geometry` of an HWNC ``data_shape`` x HWOI ``kernel_shape`` conv2d.

    Raises
    ------
    ValueError
        For shapes of another rank, channels that disagree, or bad strides/dilation.

    Examples
    --------
    >>> geometry((7, 7, 8, 512), (3, 3, 512, 512), 1, 1, 1).gemm
    (392, 512, 4608)
    """
    if len(data_shape) != 4 or len(kernel_shape) != 4:
        raise ValueError(f"the mma conv2d takes HWNC data and an HWOI kernel (4-D each), got shapes "
                         f"{tuple(data_shape)} and {tuple(kernel_shape)}")
    height, width, batch, channels = (int(v) for v in data_shape)
    kh, kw, out_channels, kernel_channels = (int(v) for v in kernel_shape)
    if kernel_channels != channels:
        raise ValueError(f"kernel has {kernel_channels} input channels, data has {channels}")
    top, left, bottom, right = (int(v) for v in get_pad_tuple(padding, (kh, kw)))
    return Geometry(height, width, batch, channels, out_channels, (kh, kw), _pair(strides, "strides"),
                    (top, left, bottom, right), _pair(dilation, "dilation"))


def padded_rows(rows: int, tiles: mma_gemm.MmaTiles) -> int:
    """``rows`` rounded up to whole block rows of ``tiles``.

    Examples
    --------
    >>> padded_rows(392, mma_gemm.MmaTiles(1, 2, 2, 2, 2, 3))
    416
    """
    block = tiles.block[0]
    return -(-rows // block) * block


def fits(geom: Geometry, tiles: mma_gemm.MmaTiles, arch: int = 90) -> Optional[str]:
    """Why ``tiles`` cannot compute the convolution ``geom`` on ``sm_<arch>`` (None when they can).

    Examples
    --------
    >>> fits(geometry((7, 7, 8, 512), (3, 3, 512, 512), 1, 1, 1), mma_gemm.FALLBACK_TILES[0]) is None
    True
    """
    problem = geom.problem()
    if problem:
        return problem
    rows, columns, k = geom.gemm
    return mma_gemm.fits(padded_rows(rows, tiles), columns, k, tiles, arch)


def fallback_tiles(geom: Geometry, arch: int = 90) -> Optional[mma_gemm.MmaTiles]:
    """The untuned tiling: :func:`.mma_gemm.fallback_tiles`'s choice among the tilings that pad the rows
    by at most :data:`MAX_ROW_WASTE` (any that fits where none does); None when none fits.

    Examples
    --------
    >>> fallback_tiles(geometry((56, 56, 8, 256), (1, 1, 64, 256), 1, 0, 1)).block
    (128, 64, 64)
    >>> fallback_tiles(geometry((7, 7, 8, 512), (3, 3, 512, 512), 1, 1, 1)).block  # 416 rows, not 512
    (32, 32, 64)
    """
    rows, columns, k = geom.gemm
    if geom.problem():
        return None
    usable = [t for t in mma_gemm.FALLBACK_TILES if fits(geom, t, arch) is None]
    thrifty = [t for t in usable if padded_rows(rows, t) <= rows * (1 + MAX_ROW_WASTE)]
    return mma_gemm.choose_tiles(thrifty or usable, lambda t: padded_rows(rows, t) // t.block[0]
                                 * (columns // t.block[1]), arch)


def _gathered(data: te.Tensor, kernel: te.Tensor, geom: Geometry, rows: int) -> Tuple[te.Tensor, te.Tensor]:
    """The GEMM's operands as computations over ``data`` and ``kernel`` (inlined into their copies).

    K is decomposed through its 16-byte piece (``q = r // 16``): a piece's kernel position and channel
    run come from ``q`` alone, its lane from ``r % 16``, so that the copies can be made one ``cp.async``.
    """
    out_h, out_w = geom.out_size
    kw, (sh, sw), (dh, dw) = geom.kernel[1], geom.strides, geom.dilation
    top, left = geom.pads[:2]
    pieces = geom.channels // CHANNEL_PIECE
    real_rows = geom.gemm[0]
    zero = tir.const(0, data.dtype)

    def position(r):
        q = r // CHANNEL_PIECE
        channel = q % pieces * CHANNEL_PIECE + r % CHANNEL_PIECE
        return q // (kw * pieces), q // pieces % kw, channel

    def left_operand(m, r):
        n, ow, oh = m % geom.batch, m // geom.batch % out_w, m // (geom.batch * out_w)
        y, x, channel = position(r)
        h, w = oh * sh + y * dh - top, ow * sw + x * dw - left
        inside = tir.all(m < real_rows, h >= 0, h < geom.height, w >= 0, w < geom.width)
        return tir.if_then_else(inside, data[h, w, n, channel], zero)

    def right_operand(o, r):
        y, x, channel = position(r)
        return kernel[y, x, o, channel]

    k = geom.gemm[2]
    return (te.compute((rows, k), left_operand, name="conv_rows"),
            te.compute((geom.out_channels, k), right_operand, name="conv_columns"))


def conv2d_hwnc(data: te.Tensor, kernel: te.Tensor, strides: IntOrPair = 1, padding: IntOrPair = 0,
                dilation: IntOrPair = 1, tiles: Optional[mma_gemm.MmaTiles] = None, arch: int = 90) -> te.Tensor:
    """HWNC ``data`` (int8 or uint8) x HWOI ``kernel`` (int8) -> ``(OH, OW, N, O)`` int32 on this kernel.

    Raises
    ------
    TypeError
        For operand types the kernel does not take.
    ValueError
        For shapes or tiles it cannot take (the reason from :func:`fits`).

    Examples
    --------
    >>> x = te.placeholder((14, 14, 8, 64), "uint8"); w = te.placeholder((3, 3, 128, 64), "int8")
    >>> conv2d_hwnc(x, w, 1, 1).shape
    [14, 14, 8, 128]
    >>> conv2d_hwnc(x, te.placeholder((3, 3, 128, 64), "uint8"))
    Traceback (most recent call last):
    ...
    TypeError: kernel: the mma conv2d takes int8 kernels, got uint8
    """
    if data.dtype not in mma_intrin.A_DTYPES:
        raise TypeError(f"data: the mma conv2d takes {' or '.join(mma_intrin.A_DTYPES)} data, got {data.dtype}")
    if kernel.dtype != "int8":
        raise TypeError(f"kernel: the mma conv2d takes int8 kernels, got {kernel.dtype}")
    geom = geometry(get_const_tuple(data.shape), get_const_tuple(kernel.shape), strides, padding, dilation)
    tiles = tiles or fallback_tiles(geom, arch)
    problem = (geom.problem() or "no tiling fits") if tiles is None else fits(geom, tiles, arch)
    rows, columns, k = geom.gemm
    if problem:
        raise ValueError(f"conv2d HWNC {get_const_tuple(data.shape)} x {get_const_tuple(kernel.shape)} "
                         f"(GEMM {rows}x{columns}x{k}) on sm_{arch}: {problem}")
    gemm_rows = padded_rows(rows, tiles)
    left, right = _gathered(data, kernel, geom, gemm_rows)
    func = mma_gemm.lower(mma_gemm.schedule_primfunc(left, right, tiles, inputs=(data, kernel)))
    # The GEMM's first rows are the convolution's output in HWNC order; rows past the last pixel (whole
    # block rows) are not stored.
    return mma_gemm.extern_op(func, data, kernel, "conv2d_hwnc_mma", out_shape=(*geom.out_size, geom.batch, columns))


def conv2d_template(cfg, data: te.Tensor, kernel: te.Tensor, strides: IntOrPair, padding: IntOrPair,
                    dilation: IntOrPair, out_dtype: str = "int32") -> te.Tensor:
    """AutoTVM compute of :data:`TASK`: :func:`conv2d_hwnc` with the tiling as knobs (those of
    :data:`.mma_gemm.TASK`); a tiling that does not fit is an ``InstantiationError``.

    Examples
    --------
    >>> x = te.placeholder((14, 14, 8, 64), "int8"); w = te.placeholder((3, 3, 128, 64), "int8")
    >>> conv2d_template(autotvm.get_config(), x, w, 1, 1, 1, "float32")
    Traceback (most recent call last):
    ...
    ValueError: out_dtype: the mma conv2d accumulates in int32, got float32
    """
    if out_dtype != "int32":
        raise ValueError(f"out_dtype: the mma conv2d accumulates in int32, got {out_dtype}")
    geom = geometry(get_const_tuple(data.shape), get_const_tuple(kernel.shape), strides, padding, dilation)
    arch = mma_gemm.target_arch_number()
    rows, columns, k = geom.gemm
    cfg.add_flop(2 * rows * columns * k)
    tiles = mma_gemm.template_tiles(cfg, mma_gemm.KNOBS, mma_gemm.MmaTiles, fallback_tiles(geom, arch),
                                    lambda tiles: fits(geom, tiles, arch))
    return conv2d_hwnc(data, kernel, strides, padding, dilation, tiles, arch)


def reference(data, kernel, strides: IntOrPair = 1, padding: IntOrPair = 0, dilation: IntOrPair = 1):
    """The convolution in numpy (int64 sums cast to int32): what the kernel must give, bit for bit.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.ones((3, 3, 1, 16), "int8"); w = np.ones((3, 3, 2, 16), "int8")
    >>> reference(x, w, 1, 1)[1, 1, 0].tolist(), reference(x, w, 1, 1)[0, 0, 0].tolist()
    ([144, 144], [64, 64])
    """
    import numpy as np

    geom = geometry(data.shape, kernel.shape, strides, padding, dilation)
    top, left, bottom, right = geom.pads
    padded = np.pad(data.astype(np.int64), ((top, bottom), (left, right), (0, 0), (0, 0)))
    out_h, out_w = geom.out_size
    (kh, kw), (sh, sw), (dh, dw) = geom.kernel, geom.strides, geom.dilation
    out = np.zeros((out_h, out_w, geom.batch, geom.out_channels), np.int64)
    for y in range(kh):
        for x in range(kw):
            window = padded[y * dh:y * dh + (out_h - 1) * sh + 1:sh, x * dw:x * dw + (out_w - 1) * sw + 1:sw]
            out += np.einsum("hwnc,oc->hwno", window, kernel[y, x].astype(np.int64))
    return out.astype(np.int32)


def gathered_reference(data: te.Tensor, kernel: te.Tensor, strides: IntOrPair = 1, padding: IntOrPair = 0,
                       dilation: IntOrPair = 1, rows: Optional[int] = None) -> tir.PrimFunc:
    """The implicit GEMM as plain TIR (the kernel's gathers and product, unscheduled), to run on a CPU:
    parameters (data, kernel, out ``(rows, O)``), ``rows`` the GEMM's (default: the output pixels).

    Examples
    --------
    >>> x = te.placeholder((4, 4, 2, 16), "int8"); w = te.placeholder((3, 3, 32, 16), "int8")
    >>> [tuple(buf.shape) for buf in gathered_reference(x, w, 1, 1, rows=64).buffer_map.values()][2]
    (64, 32)
    """
    geom = geometry(get_const_tuple(data.shape), get_const_tuple(kernel.shape), strides, padding, dilation)
    left, right = _gathered(data, kernel, geom, rows or geom.gemm[0])
    red = te.reduce_axis((0, geom.gemm[2]), name="k")
    out = te.compute((left.shape[0], geom.out_channels), lambda i, j: te.sum(
        left[i, red].astype("int32") * right[j, red].astype("int32"), axis=red), name="gemm")
    return te.create_prim_func([data, kernel, out])
