"""NumPy packing of int8 operands into the dot-product layouts (and back).

These are the host-side equivalents of the Relay layout transforms the
alter-op hook inserts; tests, the Hexagon emulator harness and benchmarks use
them to feed the computes of :mod:`.conv2d_nchwc` and :mod:`.dense_pack`.
Channels are zero-padded up to the block sizes (zeros add nothing to a dot
product).

Kernels packed for a reduce-range ISA (one with a ``kernel_range``, chosen per
layer after checking a constant kernel's values) carry a *mark*, so that no
other kernel -- hand-packed, or of an unchecked layer whose compiled function
would otherwise be shared -- reaches the saturating instruction: conv2d's kernel
has a unit axis after the window (layout ``OIHW1h{b/4}i{B}o4i``, the same bytes
as ``OIHW{b/4}i{B}o4i``), dense's weight one zero quad more than the data's
``K / 4`` (:func:`conv_kernel_marked`, :func:`dense_weight_marked`).
"""
from __future__ import annotations

import numpy as np


def round_up(value: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` not below ``value``.

    Examples
    --------
    >>> round_up(17, 4), round_up(16, 16)
    (20, 16)
    """
    return -(-value // multiple) * multiple


def _pad_axis(array: np.ndarray, axis: int, size: int) -> np.ndarray:
    if array.shape[axis] == size:
        return array
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, size - array.shape[axis])
    return np.pad(array, widths)


def pack_data_nchwc(data: np.ndarray, ic_bn: int) -> np.ndarray:
    """NCHW -> ``(N, C/b, H, W, b)``, zero-padding C to a multiple of ``ic_bn``.

    Examples
    --------
    >>> pack_data_nchwc(np.zeros((1, 3, 5, 5), "uint8"), 4).shape
    (1, 1, 5, 5, 4)
    """
    if data.ndim != 4:
        raise ValueError(f"data must be NCHW (4-D), got shape {data.shape}")
    n, c, h, w = data.shape
    data = _pad_axis(data, 1, round_up(c, ic_bn))
    return np.ascontiguousarray(data.reshape(n, -1, ic_bn, h, w).transpose(0, 1, 3, 4, 2))


def pack_kernel_oihw(kernel: np.ndarray, ic_bn: int, oc_bn: int, group: int = 4, dtype=None) -> np.ndarray:
    """OIHW -> ``(O/B, I/b, KH, KW, b/g, B, g)`` (``g = group``), zero-padding O and I.

    ``dtype`` converts the values (``"int16"``: the widened kernel some ISAs take, with
    ``group=2``; see :meth:`~tvm_tcutils.dotprod.isa.DotProductISA.conv_kernel_dtype`).

    Examples
    --------
    >>> pack_kernel_oihw(np.zeros((17, 3, 3, 3), "int8"), 4, 16).shape
    (2, 1, 3, 3, 1, 16, 4)
    >>> pack_kernel_oihw(np.zeros((8, 8, 1, 1), "int8"), 8, 8, group=2, dtype="int16").shape
    (1, 1, 1, 1, 4, 8, 2)
    """
    if kernel.ndim != 4 or ic_bn % 4 or group not in (1, 2, 4):
        raise ValueError(
            f"kernel must be OIHW, ic_bn a multiple of 4 and group 1, 2 or 4; got {kernel.shape}, {ic_bn}, {group}"
        )
    o, i, kh, kw = kernel.shape
    kernel = _pad_axis(_pad_axis(kernel, 0, round_up(o, oc_bn)), 1, round_up(i, ic_bn))
    blocks = kernel.reshape(-1, oc_bn, kernel.shape[1] // ic_bn, ic_bn // group, group, kh, kw)
    packed = np.ascontiguousarray(blocks.transpose(0, 2, 5, 6, 3, 1, 4))
    return packed if dtype is None else packed.astype(dtype)


def conv_kernel_marked(kernel_shape) -> bool:
    """Whether a packed conv2d kernel shape carries the reduce-range mark (the unit axis at 4).

    Examples
    --------
    >>> conv_kernel_marked((1, 1, 3, 3, 1, 2, 8, 4)), conv_kernel_marked((1, 1, 3, 3, 2, 8, 4))
    (True, False)
    """
    return len(kernel_shape) == 8 and int(kernel_shape[4]) == 1


def dense_weight_marked(weight_shape, k: int) -> bool:
    """Whether a packed ``(N/L, K/4 + 1, L, 4)`` dense weight carries the reduce-range mark for data of ``k`` columns.

    Examples
    --------
    >>> dense_weight_marked((2, 5, 8, 4), 16), dense_weight_marked((2, 4, 8, 4), 16)
    (True, False)
    """
    return len(weight_shape) == 4 and int(weight_shape[1]) * 4 == k + 4


def pack_kernel_for(isa, kernel: np.ndarray, ic_bn: int) -> np.ndarray:
    """OIHW -> the packed kernel ``isa``'s conv2d takes (``isa.lanes`` output channels per block).

    That is :func:`pack_kernel_oihw` in :meth:`~tvm_tcutils.dotprod.isa.DotProductISA.conv_kernel_dtype`
    with its :meth:`~tvm_tcutils.dotprod.isa.DotProductISA.kernel_group`: the 8-bit kernel in quads, or
    int16 pairs on AVX2, marked (8-D) for a reduce-range ISA -- what the alter-op hook's folded
    layout transform produces.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AVX2, X86_AVX2_U8S7
    >>> k = pack_kernel_for(X86_AVX2, np.zeros((8, 8, 3, 3), "int8"), 8)
    >>> k.shape, k.dtype.name
    ((1, 1, 3, 3, 4, 8, 2), 'int16')
    >>> pack_kernel_for(X86_AVX2_U8S7, np.zeros((8, 8, 3, 3), "int8"), 8).shape
    (1, 1, 3, 3, 1, 2, 8, 4)
    """
    k_dtype = isa.conv_kernel_dtype(kernel.dtype.name)
    packed = pack_kernel_oihw(kernel, ic_bn, isa.lanes, isa.kernel_group(k_dtype), k_dtype)
    return packed[:, :, :, :, None] if isa.kernel_range is not None else packed


def kernel_layout(ic_bn: int, oc_bn: int, group: int = 4, marked: bool = False) -> str:
    """The Relay layout name of :func:`pack_kernel_oihw`'s result (``marked``: of :func:`pack_kernel_for`'s
    for a reduce-range ISA).

    Examples
    --------
    >>> kernel_layout(16, 16), kernel_layout(8, 8, 2), kernel_layout(8, 8, marked=True)
    ('OIHW4i16o4i', 'OIHW4i8o2i', 'OIHW1h2i8o4i')
    """
    return f"OIHW{'1h' if marked else ''}{ic_bn // group}i{oc_bn}o{group}i"


def unpack_nchwc(out: np.ndarray, channels: int) -> np.ndarray:
    """``(N, C/B, H, W, B)`` -> NCHW with the first ``channels`` channels.

    Examples
    --------
    >>> unpack_nchwc(np.zeros((1, 2, 3, 3, 16)), 17).shape
    (1, 17, 3, 3)
    """
    n, cc, h, w, cb = out.shape
    return np.ascontiguousarray(out.transpose(0, 1, 4, 2, 3).reshape(n, cc * cb, h, w)[:, :channels])


def pack_dense_weight(weight: np.ndarray, lanes: int, marked: bool = False) -> np.ndarray:
    """``(N, K)`` -> ``(N/L, K/4, L, 4)``, zero-padding N to ``lanes`` and K to 4 (``marked``: and one
    zero quad more, the reduce-range mark).

    Examples
    --------
    >>> pack_dense_weight(np.zeros((10, 6), "int8"), 16).shape
    (1, 2, 16, 4)
    >>> pack_dense_weight(np.zeros((10, 6), "int8"), 8, marked=True).shape
    (2, 3, 8, 4)
    """
    if weight.ndim != 2:
        raise ValueError(f"weight must be (N, K), got shape {weight.shape}")
    k_p = round_up(weight.shape[1], 4) + 4 * marked
    weight = _pad_axis(_pad_axis(weight, 0, round_up(weight.shape[0], lanes)), 1, k_p)
    n, k = weight.shape
    return np.ascontiguousarray(weight.reshape(n // lanes, lanes, k // 4, 4).transpose(0, 2, 1, 3))


def pad_dense_data(data: np.ndarray) -> np.ndarray:
    """``(M, K)`` -> ``(M, K')`` with K' the next multiple of 4 (zeros).

    Examples
    --------
    >>> pad_dense_data(np.zeros((2, 6), "uint8")).shape
    (2, 8)
    """
    return np.ascontiguousarray(_pad_axis(data, 1, round_up(data.shape[1], 4)))


def channel_block(channels: int, lanes: int) -> int:
    """The input-channel block for ``channels`` (after padding to 4).

    ``lanes`` when it divides, else the largest multiple of 4 that does.

    Examples
    --------
    >>> channel_block(64, 16), channel_block(3, 16), channel_block(24, 16)
    (16, 4, 12)
    """
    padded = round_up(channels, 4)
    return max(b for b in range(4, lanes + 1, 4) if padded % b == 0)
