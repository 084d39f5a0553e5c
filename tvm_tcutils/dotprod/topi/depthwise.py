"""int8 depthwise conv2d in NCHW{L}c layout: the taps of a kernel row in one dot-product instruction.

TVM 0.19's x86 depthwise schedule (``depthwise_conv2d_NCHWc``) multiplies each tap
separately in int32 lanes: a widening load, a 32-bit multiply and an add per tap and
16 channels. Here four taps of a kernel row of 16 channels are gathered into one
register as channel-major quads (``[c0: t0 t1 t2 t3, c1: ...]``: four pixels are 64
contiguous bytes in ``NCHW16c``, read as one vector and reordered by one single-source
byte permute, ``vpermb``) and multiplied with the row's weights, gathered the same way,
by one ``vpdpbusd``: per output vector and kernel row one instruction (two for rows of
5 to 8 taps: 5x5 and 7x7 kernels) instead of ``KW`` multiply-adds. Rows are whole
quads: the kernel is zero-padded to a multiple of 4 taps and the data by as many pixels
on the right (a 3-tap row read as three loads and shuffles was 12-19 % slower). The
permute runs on the execution port the dot product uses, so its kind matters: the four
pixels gathered from four 16-byte loads took two 32-byte loads and a two-source
``vpermt2b`` (on Zen 4 a ``vpdpbusd`` and a ``vpermt2b`` take 2 cycles, with a
``vpermb`` 1.3-1.5), and the kernels ran 1.5x as long (3x3) and 1.2x (5x5, 7x7). The
same integer sums, exact.

Layouts (``L`` = the ISA's 16 int32 lanes): data ``(N, C/L, H, W, L)`` uint8; kernel
``OIHW1i{L}o`` as TVM's alter-layout hook packs a depthwise kernel: ``(C/L, 1, KH, KW,
1, L)`` int8; output ``(N, C/L, OH, OW, L)`` int32. Dilation 1 (a row's taps are then
adjacent pixels).
"""
from __future__ import annotations

import functools
from typing import Optional, Sequence

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te, tir, topi
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from ..isa import DotProductISA
from .common import current_isa, inline_between, pair, tagged_outputs, vectorize_inner

#: Tag of the depthwise op, used by the schedule to find it among fused ops.
TAG = "depthwise_nchwc_dot"

#: Taps one instruction multiplies per lane (the dot product's 4).
QUAD = 4

#: Most taps of a kernel row: two quads (the second zero-padded where the row has fewer than 8).
MAX_TAPS = 2 * QUAD

#: Output pixels whose accumulators a tile keeps in registers.
TILE_OW = 8


def applicable(isa: Optional[DotProductISA], data_shape: Sequence[int], kernel_shape: Sequence[int],
               dilation, data_dtype: str, kernel_dtype: str, out_dtype: str) -> bool:
    """Whether :func:`depthwise_nchwc_dot` computes this depthwise conv: a 16-lane ISA with the
    (``uint8``, ``int8``) product (AVX-512 VNNI), int32 out, ``NCHW16c`` data, an ``OIHW1i16o`` kernel of at
    most 8 taps per row, dilation 1.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI, X86_AVX2
    >>> applicable(X86_VNNI, (1, 2, 10, 10, 16), (2, 1, 3, 3, 1, 16), 1, "uint8", "int8", "int32")
    True
    >>> applicable(X86_AVX2, (1, 2, 10, 10, 16), (2, 1, 3, 3, 1, 16), 1, "uint8", "int8", "int32")
    False
    >>> applicable(X86_VNNI, (1, 2, 10, 10, 16), (2, 1, 5, 5, 1, 16), 1, "uint8", "int8", "int32")  # 2 quads
    True
    >>> applicable(X86_VNNI, (1, 2, 10, 10, 16), (2, 1, 9, 9, 1, 16), 1, "uint8", "int8", "int32")
    False
    """
    if isa is None or isa.lanes != 16 or isa.reduce != QUAD or isa.variant("uint8", "int8") is None:
        return False
    if (str(data_dtype), str(kernel_dtype), str(out_dtype)) != ("uint8", "int8", "int32"):
        return False
    if len(data_shape) != 5 or len(kernel_shape) != 6:
        return False
    lanes = data_shape[4]
    blocks, one, _, kw, one_i, lanes_k = kernel_shape
    return (lanes == lanes_k == isa.lanes and blocks == data_shape[1] and one == one_i == 1 and kw <= MAX_TAPS
            and pair(dilation) == (1, 1))


def depthwise_nchwc_dot(data: te.Tensor, kernel: te.Tensor, strides, padding, dilation, layout: str = "",
                        out_layout: str = "", out_dtype: str = "int32") -> te.Tensor:
    """Compute an int8 depthwise conv2d (``NCHW16c`` data, ``OIHW1i16o`` kernel), int32 out.

    The signature of TVM's ``depthwise_conv2d_NCHWc`` compute (``layout`` and ``out_layout`` are the
    data's). Padding, where there is any, is a zero-padded copy of the data.

    Raises
    ------
    ValueError
        Shapes, dtypes or a dilation :func:`applicable` rejects.

    Examples
    --------
    >>> d = te.placeholder((1, 2, 10, 10, 16), "uint8"); k = te.placeholder((2, 1, 3, 3, 1, 16), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = depthwise_nchwc_dot(d, k, 1, 0, 1)
    >>> [int(x) for x in out.shape]
    [1, 2, 8, 8, 16]
    """
    isa = current_isa(data.dtype, kernel.dtype)
    d_shape, k_shape = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if not applicable(isa, d_shape, k_shape, dilation, data.dtype, kernel.dtype, out_dtype or "int32"):
        raise ValueError(f"depthwise_nchwc_dot takes uint8 (N, C/16, H, W, 16) data, an int8 (C/16, 1, KH, KW<=8, "
                         f"1, 16) kernel, dilation 1 and int32 out on AVX-512 VNNI; got {d_shape} {data.dtype}, "
                         f"{k_shape} {kernel.dtype}, dilation {dilation}, out {out_dtype}")
    n, blocks, height, width, lanes = d_shape
    _, _, kh, kw, _, _ = k_shape
    sh, sw = pair(strides)
    top, left, bottom, right = get_pad_tuple(padding, (kh, kw))
    out_h = (height + top + bottom - kh) // sh + 1
    out_w = (width + left + right - kw) // sw + 1
    # Rows as whole quads: the kernel zero-padded to a multiple of 4 taps and the data by as many pixels on
    # the right (zeros times zero weights), so each quad's pixels are one 64-byte load.
    quads = -(-kw // QUAD)
    extra = QUAD * quads - kw
    if top or left or bottom or right or extra:
        data = topi.nn.pad(data, [0, 0, top, left, 0], [0, 0, bottom, right + extra, 0], name="depthwise_pad")
    if extra:
        zero = tir.const(0, kernel.dtype)
        kernel = te.compute((blocks, 1, kh, QUAD * quads, 1, lanes),
                            lambda b, o, y, t, i, c: tir.if_then_else(t < kw, kernel[b, o, y, t, i, c], zero),
                            name="depthwise_kernel_quads")
    r_y = te.reduce_axis((0, kh), name="r_y")
    r_q = te.reduce_axis((0, quads), name="r_q")
    r_t = te.reduce_axis((0, QUAD), name="r_t")
    return te.compute(
        (n, blocks, out_h, out_w, lanes),
        lambda i, b, y, x, c: te.sum(
            data[i, b, y * sh + r_y, x * sw + r_q * QUAD + r_t, c].astype("int32")
            * kernel[b, 0, r_y, r_q * QUAD + r_t, 0, c].astype("int32"), axis=[r_y, r_q, r_t]),
        name="depthwise_nchwc_dot", tag=TAG,
    )


def _quads(taps: tir.PrimExpr, lanes: int) -> tir.PrimExpr:
    """A vector of four taps' ``lanes`` bytes each (tap-major) as channel-major quads: byte ``4c + t`` is tap
    ``t`` of channel ``c`` (LLVM: one ``vpermb``)."""
    return tir.Shuffle([taps], [tir.const(p * lanes + ch, "int32") for ch in range(lanes) for p in range(QUAD)])


@functools.lru_cache(maxsize=None)
def row_intrin(isa: DotProductISA):
    """The tensor intrinsic of one quad of a kernel row: ``out[c] += sum_{t < 4} data[t, c] * kernel[t, 0, c]``.

    ``data`` is 4 adjacent pixels of 16 bytes, ``kernel`` the quad's taps (16 bytes each), both
    contiguous as ``NCHW16c`` and ``OIHW1i16o`` lay them out: each is read as one 64-byte vector and
    gathered into channel-major quads (:func:`_quads`) for one dot-product instruction; rows of other
    lengths are padded to whole quads by :func:`depthwise_nchwc_dot`.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> [t.dtype for t in row_intrin(X86_VNNI).inputs]
    ['uint8', 'int8']
    """
    taps = QUAD
    lanes = isa.lanes
    data = te.placeholder((taps, lanes), "uint8", name="row_data")
    # The kernel's row as it lies in OIHW1i16o: (taps, 1, lanes), the unit axis its input channel.
    kernel = te.placeholder((taps, 1, lanes), "int8", name="row_kernel")
    t = te.reduce_axis((0, taps), name="t")
    out = te.compute((lanes,), lambda c: te.sum(data[t, c].astype("int32") * kernel[t, 0, c].astype("int32"),
                                                axis=t), name="row_out")
    # Pixels are contiguous in NCHW{lanes}c: a quad's four are one vector, gathered by a one-source permute.
    a_buf = tir.decl_buffer(data.shape, "uint8", "a_buf", offset_factor=1, strides=[lanes, 1])
    b_buf = tir.decl_buffer(kernel.shape, "int8", "b_buf", offset_factor=1, strides=[lanes, lanes, 1])
    c_buf = tir.decl_buffer(out.shape, "int32", "c_buf", offset_factor=1, strides=[1])
    variant = isa.variant("uint8", "int8")

    def intrin_func(ins, outs):
        a, b = ins
        (c,) = outs
        zero = tir.Broadcast(tir.const(0, "int32"), lanes)

        def make(kind: str):
            builder = tir.ir_builder.create()
            if kind == "reset":
                builder.emit(c.vstore([0], zero))
                return builder.get()
            gathered = _quads(a.vload([0, 0], f"uint8x{taps * lanes}"), lanes)
            weights = _quads(b.vload([0, 0, 0], f"int8x{taps * lanes}"), lanes)
            acc = zero if kind == "body" else c.vload([0], f"int32x{lanes}")
            builder.emit(c.vstore([0], isa.emit(variant, acc, gathered, weights)))
            return builder.get()

        return make("body"), make("reset"), make("update")

    return te.decl_tensor_intrin(out.op, intrin_func, binds={data: a_buf, kernel: b_buf, out: c_buf},
                                 default_buffer_params={})


def schedule_depthwise_nchwc_dot(outs) -> te.Schedule:
    """Schedule :func:`depthwise_nchwc_dot` and the elementwise ops fused after it.

    A tile is up to :data:`TILE_OW` output pixels of one row and channel block, accumulated in registers
    over the kernel's rows; the rows of a tile are the tensorized unit (:func:`row_intrin`).

    Examples
    --------
    >>> d = te.placeholder((1, 2, 10, 10, 16), "uint8"); k = te.placeholder((2, 1, 3, 3, 1, 16), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = depthwise_nchwc_dot(d, k, 1, 0, 1)
    ...     s = schedule_depthwise_nchwc_dot([out])
    >>> "vpdpbusd" in str(tvm.lower(s, [d, k, out]))
    True
    """
    outs, conv = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    data, kernel = conv.op.input_tensors
    isa = current_isa("uint8", "int8")
    if isinstance(kernel.op, te.ComputeOp):  # the kernel's rows zero-padded to whole quads
        s[kernel].vectorize(s[kernel].op.axis[-1])
    if isinstance(data.op, te.ComputeOp):  # the zero-padded copy
        _, b, y, _, c = s[data].op.axis
        s[data].parallel(s[data].fuse(b, y))
        s[data].vectorize(c)

    out = outs[0]
    inline_between(s, outs, conv)
    if len(out.shape) != 5 or get_const_tuple(out.shape)[:4] != get_const_tuple(conv.shape)[:4]:
        out = conv  # a fused op that reshapes: keep the conv tiled on its own
    if out.op == conv.op:
        # Accumulators in a buffer of their own, which LLVM keeps in registers over the kernel's rows.
        conv = s.cache_write(conv, "global")
    out_w = int(conv.shape[3])
    tile = max(d for d in range(1, TILE_OW + 1) if out_w % d == 0)
    n, b, y, x, c = s[out].op.axis
    x_o, x_i = s[out].split(x, factor=tile)
    s[out].reorder(n, b, y, x_o, x_i, c)
    s[out].parallel(s[out].fuse(n, b, y))
    s[conv].compute_at(s[out], x_o)
    s[out].vectorize(c)
    for tensor in outs[1:]:
        vectorize_inner(s, tensor)
    _, _, _, c_x, c_c = s[conv].op.axis
    r_y, r_q, r_t = s[conv].op.reduce_axis
    s[conv].reorder(r_y, r_q, c_x, c_c, r_t)
    s[conv].unroll(c_x)
    s[conv].tensorize(c_c, row_intrin(isa))
    return s
