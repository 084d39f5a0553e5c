"""int8 conv2d on a tile engine (AMX): an implicit GEMM over output rows, 16 pixels x 64 channels a tile.

Layouts: data ``NCHW64c`` (a pixel's 64 input channels are one 64-byte ``A`` tile row; 16 pixels of an
output row are 16 rows at the stride's pitch), kernel ``OIHW16i64o4i`` (``(O/64, C/64, KH, KW, 16, 64,
4)``: for one tap and input block, 16 quads of 64 output channels x 4, so a ``B`` tile is 16 rows of 64
bytes at a 256-byte pitch), output ``NCHW64c`` (an accumulator tile is 16 pixels x 16 channels at a
256-byte pitch). Each parallel task computes one output row of one 64-channel block: strips of
``16 * tile_b`` channels, steps of ``16 * tile_a`` pixels (the rest of the row with a second tile
configuration of fewer rows), each step's accumulators summed over every input block and kernel tap
before one store. Padding is a stage of its own (zeros the tiles read as they are). Elementwise ops
after it (requantize, a residual add) run over the task's row while it is in cache.

Requires input and output channels in whole 64-channel blocks, no dilation and a native dtype pair
(:func:`applicable`); other convs keep the dot-product kernels.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te, topi
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from ..isa.x86_amx import TileISA
from .common import divisors_up_to, inline_between, pair, tagged_outputs
from .dense_amx import current_tile_isa, fallback_tile
from .tiles import Tiles, TileMemory

#: Tag of the tile conv.
TAG = "conv2d_nchwc_amx"

#: Channels of a data / output block: one tile row of 8-bit data.
BLOCK = 64


def layouts(isa: TileISA) -> Tuple[str, str, str]:
    """``(data, kernel, out)`` layouts of the tile conv.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> layouts(X86_AMX)
    ('NCHW64c', 'OIHW16i64o4i', 'NCHW64c')
    """
    block = isa.row_bytes
    return f"NCHW{block}c", f"OIHW{block // isa.reduce}i{block}o{isa.reduce}i", f"NCHW{block}c"


def applicable(isa, in_channels: int, out_channels: int, groups: int, dilation, data_dtype: str,
               kernel_dtype: str) -> str:
    """Why a plain conv2d cannot run on ``isa``'s tiles, or ``""``.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> applicable(X86_AMX, 256, 64, 1, (1, 1), "uint8", "int8")
    ''
    >>> applicable(X86_AMX, 96, 64, 1, (1, 1), "uint8", "int8")
    '96 input channels are not whole 64-channel blocks'
    """
    if isa is None:
        return "the target has no tile engine"
    if isa.variant(data_dtype, kernel_dtype) is None:
        return f"{isa.name} has no {data_dtype} x {kernel_dtype} product"
    if groups != 1:
        return "grouped conv"
    if tuple(pair(dilation)) != (1, 1):
        return "dilated conv"
    block = isa.row_bytes
    if in_channels % block:
        return f"{in_channels} input channels are not whole {block}-channel blocks"
    if out_channels % block:
        return f"{out_channels} output channels are not whole {block}-channel blocks"
    return ""


def _define_knobs(cfg, isa: TileISA, out_w: int, blocks: int) -> None:
    cfg.define_knob("tile_a", list(range(1, isa.tiles)))
    cfg.define_knob("tile_b", divisors_up_to(blocks, isa.tiles))
    cfg.multi_filter(filter=lambda e: isa.fits(e["tile_a"].val, e["tile_b"].val))
    if cfg.is_fallback:
        tile_a, tile_b = fallback_tile(isa, out_w, blocks)
        cfg["tile_a"] = OtherOptionEntity(tile_a)
        cfg["tile_b"] = OtherOptionEntity(tile_b)


def conv2d_nchwc_amx(cfg, data, kernel, strides, padding, dilation, layout, out_layout, out_dtype="int32"):
    """Compute int8 conv2d with AMX tiles on ``NCHW64c`` data and an ``OIHW16i64o4i`` kernel.

    Parameters are those of :func:`~.conv2d_nchwc.conv2d_nchwc_dot` (knobs ``tile_a``: pixel tiles a
    step, ``tile_b``: 16-channel tiles a strip).

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 1, 8, 8, 64), "uint8"); k = te.placeholder((1, 1, 3, 3, 16, 64, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     out = conv2d_nchwc_amx(autotvm.get_config(), d, k, 1, 1, 1, "NCHW64c", "NCHW64c")
    >>> [int(x) for x in out.shape]
    [1, 1, 8, 8, 64]
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for an AMX conv2d, got {out_dtype!r}")
    isa = current_tile_isa(str(data.dtype), str(kernel.dtype))
    block, quads = isa.row_bytes, isa.row_bytes // isa.reduce
    d_shape, k_shape = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if len(d_shape) != 5 or d_shape[4] != block:
        raise ValueError(f"data must be NCHW{block}c, got shape {d_shape}")
    if len(k_shape) != 7 or k_shape[1] != d_shape[1] or k_shape[4:] != (quads, block, isa.reduce):
        raise ValueError(f"kernel must be (O/{block}, {d_shape[1]}, KH, KW, {quads}, {block}, {isa.reduce}), "
                         f"got {k_shape}")
    if tuple(pair(dilation)) != (1, 1):
        raise ValueError(f"conv2d_nchwc_amx takes no dilation, got {dilation}")
    batch, ic_chunks, in_h, in_w, _ = d_shape
    oc_chunks, _, k_h, k_w = k_shape[:4]
    s_h, s_w = pair(strides)
    pad_t, pad_l, pad_b, pad_r = get_pad_tuple(padding, (k_h, k_w))
    out_h = (in_h + pad_t + pad_b - k_h) // s_h + 1
    out_w = (in_w + pad_l + pad_r - k_w) // s_w + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"empty conv2d output ({out_h}x{out_w}) for input {in_h}x{in_w}")
    _define_knobs(cfg, isa, out_w, block // isa.columns)
    if pad_t or pad_l or pad_b or pad_r:
        data = topi.nn.pad(data, [0, 0, pad_t, pad_l, 0], [0, 0, pad_b, pad_r, 0], name="data_pad")
    r_ic = te.reduce_axis((0, ic_chunks), name="ic_outer")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, k_w), name="kw")
    r_icf = te.reduce_axis((0, quads), name="ic_f")
    r_ics = te.reduce_axis((0, isa.reduce), name="ic_s")
    conv = te.compute(
        (batch, oc_chunks, out_h, out_w, block),
        lambda n, oc, y, x, oci: te.sum(
            data[n, r_ic, y * s_h + r_kh, x * s_w + r_kw, r_icf * isa.reduce + r_ics].astype("int32")
            * kernel[oc, r_ic, r_kh, r_kw, r_icf, oci, r_ics].astype("int32"),
            axis=[r_ic, r_kh, r_kw, r_icf, r_ics],
        ),
        name="conv2d_nchwc_amx", tag=TAG,
    )
    cfg.add_flop(2 * batch * oc_chunks * block * out_h * out_w * ic_chunks * block * k_h * k_w)
    return conv


def row_intrin(isa: TileISA, data_shape: Sequence[int], kernel_shape: Sequence[int], stride_w: int, out_w: int,
               tile_a: int, tile_b: int, data_dtype: str, kernel_dtype: str):
    """The tensor intrinsic of one task: one output row (``out_w`` pixels x 64 channels, int32) of one
    output block, as one tile program."""
    variant = isa.variant(data_dtype, kernel_dtype)
    ic_chunks, k_h, k_w = int(kernel_shape[1]), int(kernel_shape[2]), int(kernel_shape[3])
    block, quads, lanes = isa.row_bytes, isa.row_bytes // isa.reduce, isa.columns
    in_w = (out_w - 1) * stride_w + k_w
    d = te.placeholder((1, ic_chunks, k_h, in_w, block), data_dtype, name="d")
    w = te.placeholder((1, ic_chunks, k_h, k_w, quads, block, isa.reduce), kernel_dtype, name="w")
    r_ic = te.reduce_axis((0, ic_chunks), name="ic")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, k_w), name="kw")
    r_icf = te.reduce_axis((0, quads), name="icf")
    r_ics = te.reduce_axis((0, isa.reduce), name="ics")
    c = te.compute(
        (1, 1, 1, out_w, block),
        lambda n, o, y, x, oci: te.sum(
            d[n, r_ic, y + r_kh, x * stride_w + r_kw, r_icf * isa.reduce + r_ics].astype("int32")
            * w[o, r_ic, r_kh, r_kw, r_icf, oci, r_ics].astype("int32"),
            axis=[r_ic, r_kh, r_kw, r_icf, r_ics]),
        name="c",
    )
    binds = {
        d: tvm.tir.decl_buffer(d.shape, d.dtype, name="d_buf", offset_factor=1,
                               strides=[te.var("d_n"), te.var("d_c"), te.var("d_h"), block, 1]),
        w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1,
                               strides=[te.var("w_o"), te.var("w_c"), te.var("w_h"), te.var("w_w"),
                                        block * isa.reduce, isa.reduce, 1]),
        c: tvm.tir.decl_buffer(c.shape, c.dtype, name="c_buf", offset_factor=1,
                               strides=[te.var("c_n"), te.var("c_c"), te.var("c_h"), block, 1]),
    }
    step = isa.rows * tile_a
    full, tail = divmod(out_w, step)
    groups = block // (lanes * tile_b)

    def shapes(rows_by_tile):
        acc = [(rows_by_tile[i], isa.row_bytes) for i in range(tile_a) for _ in range(tile_b)]
        pixels = [(rows_by_tile[i], block) for i in range(tile_a)]
        return acc + pixels + [(quads, isa.row_bytes)] * tile_b

    def program(ins, outs):
        d_buf, w_buf = ins
        (c_buf,) = outs
        ib = tvm.tir.ir_builder.create()
        d_row, w_quad = d_buf.strides[3], w_buf.strides[4]

        def pixels(x0, ic, kh, kw) -> TileMemory:
            return TileMemory(
                pointer=lambda access: d_buf.access_ptr(
                    access, offset=ic * d_buf.strides[1] + kh * d_buf.strides[2] + (x0 * stride_w + kw) * d_row),
                stride=d_row * stride_w,
                element=lambda r, col: (d_buf, [0, ic, kh, (x0 + r) * stride_w + kw, col]),
            )

        def weights(ic, kh, kw, oc0) -> TileMemory:
            return TileMemory(
                pointer=lambda access: w_buf.access_ptr(
                    access, offset=ic * w_buf.strides[1] + kh * w_buf.strides[2] + kw * w_buf.strides[3]
                    + oc0 * isa.reduce),
                stride=w_quad,
                element=lambda r, col: (w_buf, [0, ic, kh, kw, r, oc0 + col // isa.reduce, col % isa.reduce]),
            )

        def outputs(x0, oc0) -> TileMemory:
            return TileMemory(
                pointer=lambda access: c_buf.access_ptr(access, offset=x0 * c_buf.strides[3] + oc0),
                stride=c_buf.strides[3] * 4,
                element=lambda r, col: (c_buf, [0, 0, 0, x0 + r, oc0 + col]),
            )

        def steps(tiles: Tiles, x0, pixel_tiles: int, oc0) -> None:
            for t in range(pixel_tiles * tile_b):
                tiles.zero(t)
            with ib.for_range(0, ic_chunks, name="ic") as ic:
                with ib.for_range(0, k_h, name="kh") as kh:
                    with ib.for_range(0, k_w, name="kw") as kw:
                        for i in range(pixel_tiles):
                            tiles.load(tile_a * tile_b + i, pixels(x0 + i * isa.rows, ic, kh, kw))
                        for j in range(tile_b):
                            tiles.load(tile_a * tile_b + tile_a + j, weights(ic, kh, kw, oc0 + j * lanes))
                        for i in range(pixel_tiles):
                            for j in range(tile_b):
                                tiles.multiply(i * tile_b + j, tile_a * tile_b + i, tile_a * tile_b + tile_a + j)
            for i in range(pixel_tiles):
                for j in range(tile_b):
                    tiles.store(i * tile_b + j, outputs(x0 + i * isa.rows, oc0 + j * lanes))

        if full:
            tiles = Tiles(ib, isa, variant, shapes([isa.rows] * tile_a))
            with ib.for_range(0, groups, name="strip") as strip:
                with ib.for_range(0, full, name="step") as s:
                    steps(tiles, s * step, tile_a, strip * tile_b * lanes)
        if tail:
            rows = [min(isa.rows, tail - i * isa.rows) for i in range(-(-tail // isa.rows))]
            rows += [isa.rows] * (tile_a - len(rows))
            tiles = Tiles(ib, isa, variant, shapes(rows))
            with ib.for_range(0, groups, name="strip") as strip:
                steps(tiles, full * step, -(-tail // isa.rows), strip * tile_b * lanes)
        return ib.get()

    return te.decl_tensor_intrin(c.op, program, binds=binds)


def schedule_conv2d_nchwc_amx(cfg, outs):
    """Schedule :func:`conv2d_nchwc_amx`: one task per image, output block and row; the padding stage
    and the elementwise ops after the conv fused as they fit.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 1, 8, 8, 64), "uint8"); k = te.placeholder((1, 1, 3, 3, 16, 64, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     cfg = autotvm.get_config()
    ...     out = conv2d_nchwc_amx(cfg, d, k, 1, 1, 1, "NCHW64c", "NCHW64c")
    ...     s = schedule_conv2d_nchwc_amx(cfg, [out])
    >>> "tdpbusd" in str(tvm.lower(s, [d, k, out]))
    True
    """
    outs, conv = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    data, kernel = conv.op.input_tensors
    isa = current_tile_isa(str(data.dtype), str(kernel.dtype))
    if isinstance(data.op, te.ComputeOp) and "pad" in data.op.name:
        n, c, h, _, _ = s[data].op.axis
        s[data].parallel(s[data].fuse(n, c, h))
        s[data].vectorize(s[data].op.axis[-1])
    out = outs[0]
    inline_between(s, outs, conv)
    if get_const_tuple(out.shape) != get_const_tuple(conv.shape):
        out = conv
    # The intrinsic reads a row's pixels at the conv's horizontal stride.
    x_index = conv.op.body[0].source[0].a.value.indices[3]
    stride_w = _stride_of(x_index)
    n, oc, y, x, oci = s[out].op.axis
    task = s[out].fuse(n, oc, y)
    s[out].parallel(task)
    tile_a, tile_b = cfg["tile_a"].val, cfg["tile_b"].val
    intrin = row_intrin(isa, get_const_tuple(data.shape), get_const_tuple(kernel.shape), stride_w,
                        int(conv.shape[3]), tile_a, tile_b, str(data.dtype), str(kernel.dtype))
    if out.op != conv.op:
        s[conv].compute_at(s[out], task)
        s[out].vectorize(s[out].split(oci, factor=isa.columns)[1])
        s[conv].tensorize(s[conv].op.axis[3], intrin)
    else:
        s[conv].tensorize(x, intrin)
    return s


def _stride_of(index) -> int:
    """The factor of the output column in a data read's column index ``x * s + kw`` (1 where none)."""
    from tvm import tir

    terms = [index]
    while terms:
        term = terms.pop()
        if isinstance(term, tir.Mul) and isinstance(term.b, tir.IntImm):
            return int(term.b.value)
        if isinstance(term, (tir.Add, tir.Sub)):
            terms += [term.a, term.b]
    return 1
