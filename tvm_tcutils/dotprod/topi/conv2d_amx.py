"""int8 conv2d on a tile engine (AMX): an implicit GEMM over output rows, 16 pixels x 64 channels a tile.

Layouts: data ``NCHW64c`` (a pixel's 64 input channels are one 64-byte ``A`` tile row; 16 pixels of an
output row are 16 rows at the stride's pitch), kernel ``OIHW16i64o4i`` (``(O/64, C/64, KH, KW, 16, 64,
4)``: for one tap and input block, 16 quads of 64 output channels x 4, so a ``B`` tile is 16 rows of 64
bytes at a 256-byte pitch), output ``NCHW64c`` (an accumulator tile is 16 pixels x 16 channels at a
256-byte pitch). Each parallel task computes one output row of one 64-channel block: strips of
``16 * tile_b`` channels, steps of ``16 * tile_a`` pixels (the rest of the row with a second tile
configuration of fewer rows), each step's accumulators summed over every input block and kernel tap
before one store. Padding is a stage of its own (zeros the tiles read as they are). Elementwise ops
after it (requantize, a residual add) run step by step inside the task's tile program, each step's share
after its stores (:mod:`..tile_epilogue`).

Requires input and output channels in whole 64-channel blocks, no dilation and a native dtype pair
(:func:`applicable`); other convs keep the dot-product kernels.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..._tvm import tvm  # noqa: F401  (TVM checked first)
from tvm import te, tir, topi
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from ..isa.x86_amx import TileISA
from .common import current_tile_isa, divisors_up_to, inline_between, pair, tagged_outputs
from .dense_amx import define_step_knobs
from .tiles import TileMemory, run_steps

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


def flat_rows(isa: TileISA, out_h: int, out_w: int, tile_a: int) -> int:
    """Untuned output rows a task of a flat conv (:func:`is_flat`) takes: the fewest whose pixels fill
    whole steps of ``16 * tile_a`` (no tail configuration), else the whole image.

    A 1x1 conv of stride 1 reads its pixels in the order it writes them, so a task's rows are one run of
    pixels: ResNet-50's 7x7 stage gets 49-pixel tasks instead of 7-pixel rows (tiles a third full, the
    weights loaded again for every row), its 56x56 stage 224-pixel ones.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> flat_rows(X86_AMX, 56, 56, 2), flat_rows(X86_AMX, 28, 28, 2), flat_rows(X86_AMX, 7, 7, 2)
    (4, 28, 7)
    """
    step = isa.rows * tile_a
    return next((r for r in divisors_up_to(out_h, out_h) if r * out_w % step == 0), out_h)


def is_flat(k_h: int, k_w: int, strides, padding) -> bool:
    """Whether a conv reads one input pixel per output pixel in the same order (1x1, stride 1, no
    padding): its rows then join into one run of pixels."""
    return k_h == k_w == 1 and tuple(pair(strides)) == (1, 1) and not any(get_pad_tuple(padding, (1, 1)))


def tile_pixels(isa: TileISA, run: int) -> int:
    """Pixels a data tile holds in a run of ``run`` pixels (a row, a flat task, a stem row): the run in
    equal tiles of at most ``isa.rows`` where it divides so, else ``isa.rows`` (a last tile partial).

    Equal tiles need no second tile configuration for a tail of fewer rows, and a tile product's time
    goes with its rows: ResNet's 56-pixel rows as 4 x 14, not 16 + 16 + 16 + 8.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> [tile_pixels(X86_AMX, n) for n in (56, 28, 112, 224, 49, 40, 11)]
    [14, 14, 16, 16, 16, 16, 11]
    """
    tiles = -(-run // isa.rows)
    return run // tiles if run % tiles == 0 else isa.rows


def stacked_rows(out_h: int, tile_a: int) -> int:
    """Untuned output rows a task of short rows (at most 16 pixels, one tile each) takes: the fewest
    that fill whole steps of ``tile_a`` rows, else the fewest that fill one step, else all.

    Examples
    --------
    >>> stacked_rows(14, 2), stacked_rows(7, 2), stacked_rows(1, 2)
    (2, 7, 1)
    """
    divisors = divisors_up_to(out_h, out_h)
    return next((r for r in divisors if r % tile_a == 0),
                next((r for r in divisors if r >= tile_a), out_h))


def wide_run(isa: TileISA, rows: int, out_w: int, k_w: int, strides) -> Tuple[int, int]:
    """``(tiles, pixels a tile)`` of a task of ``rows`` short output rows read as one *wide* run, or
    ``(0, 0)`` where stacking the rows (one tile each) needs no more tiles.

    At stride 1 output pixel ``(y, x)`` reads the padded data at ``(y + kh) * pitch + x + kw`` (``pitch``
    the padded width ``out_w + k_w - 1``): over ``p = y * pitch + x`` a run of consecutive pixels, every
    tap a fixed offset. The task computes the run's ``(rows - 1) * pitch + out_w`` pixels in equal tiles
    and drops the ``k_w - 1`` it computes past each row's end. A 7 x 7 plane of a 3x3 conv is 61 pixels,
    4 tiles of 16 instead of 7 tiles of 7 rows: fewer tile products, and each weight tile loaded serves
    more of them.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> wide_run(X86_AMX, 7, 7, 3, 1), wide_run(X86_AMX, 2, 14, 3, 1), wide_run(X86_AMX, 7, 7, 3, 2)
    ((4, 16), (0, 0), (0, 0))
    """
    if tuple(pair(strides)) != (1, 1) or rows < 2 or out_w > isa.rows:
        return 0, 0
    run = (rows - 1) * (out_w + k_w - 1) + out_w
    tiles = -(-run // isa.rows)
    return (tiles, -(-run // tiles)) if tiles < rows else (0, 0)


def wide_rows_past(isa: TileISA, rows: int, out_w: int, k_h: int, k_w: int, strides) -> int:
    """Rows of zeros a wide task (:func:`wide_run`) reads past its data's last row: its last tile's
    pixels past the run, at the last tap. The padding stage adds them under the image, so that the
    bottom task stays inside the data.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> wide_rows_past(X86_AMX, 7, 7, 3, 3, 1), wide_rows_past(X86_AMX, 2, 14, 3, 3, 1)
    (1, 0)
    """
    tiles, per_tile = wide_run(isa, rows, out_w, k_w, strides)
    if not tiles:
        return 0
    pitch = out_w + k_w - 1
    last_read = tiles * per_tile - 1 + (k_h - 1) * pitch + k_w - 1
    return max(0, -(-(last_read + 1) // pitch) - (rows - 1 + k_h))


def _run_tiles(isa: TileISA, run: int) -> List[int]:
    """Rows of each data tile of a run of ``run`` pixels (:func:`tile_pixels` each, the last maybe fewer)."""
    per_tile = tile_pixels(isa, run)
    return [min(per_tile, run - start) for start in range(0, run, per_tile)]


def task_tiles(isa: TileISA, rows: int, out_w: int, k_h: int, k_w: int, strides) -> Tuple[str, List[int]]:
    """``(form, rows of each data tile)`` of a task of ``rows`` output rows of ``out_w`` pixels, the form one
    of ``"flat"``, ``"row"``, ``"wide"`` and ``"stacked"`` (:func:`row_intrin`).

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> task_tiles(X86_AMX, 1, 56, 3, 3, 1), task_tiles(X86_AMX, 7, 7, 3, 3, 1)
    (('row', [14, 14, 14, 14]), ('wide', [16, 16, 16, 16]))
    >>> task_tiles(X86_AMX, 2, 14, 3, 3, 1), task_tiles(X86_AMX, 4, 56, 1, 1, 1)[0]
    (('stacked', [14, 14]), 'flat')
    """
    flat = rows > 1 and is_flat(k_h, k_w, strides, 0)
    if flat or rows == 1:
        return ("flat" if flat else "row"), _run_tiles(isa, out_w * rows)
    if out_w > isa.rows:
        raise ValueError(f"stacked rows need rows of at most {isa.rows} pixels, got {out_w}")
    tiles, per_tile = wide_run(isa, rows, out_w, k_w, strides)
    return ("wide", [per_tile] * tiles) if tiles else ("stacked", [out_w] * rows)


def _define_knobs(cfg, isa: TileISA, out_h: int, out_w: int, blocks: int, flat: bool) -> None:
    stacked = not flat and out_w <= isa.rows
    pixels = out_h * out_w if flat else out_h * isa.rows if stacked else out_w
    untuned = define_step_knobs(cfg, isa, blocks, pixels,
                                [("rows", divisors_up_to(out_h, out_h) if flat or stacked else [1])])
    if untuned is not None:
        tile_a = untuned[0]
        rows = flat_rows(isa, out_h, out_w, tile_a) if flat else stacked_rows(out_h, tile_a) if stacked else 1
        cfg["rows"] = OtherOptionEntity(rows)


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
    _define_knobs(cfg, isa, out_h, out_w, block // isa.columns, is_flat(k_h, k_w, strides, padding))
    rows = getattr(cfg["rows"], "val", None)  # None: a tuning space, not one configuration
    if rows is not None and task_tiles(isa, rows, out_w, k_h, k_w, strides)[0] == "wide":
        # Only a wide task reads past its rows; a flat one (a 1x1 conv's short rows, run as one) does not,
        # and padding it would copy the whole input for nothing.
        pad_b += wide_rows_past(isa, rows, out_w, k_h, k_w, strides)
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


def row_intrin(isa: TileISA, data_shape: Sequence[int], kernel_shape: Sequence[int], strides, out_w: int,
               tile_a: int, tile_b: int, data_dtype: str, kernel_dtype: str, rows: int = 1):
    """The tensor intrinsic of one task: ``rows`` output rows (``out_w`` pixels x 64 channels, int32) of
    one output block, as one tile program over *pixel tiles* of three kinds:

    * a flat conv's (:func:`is_flat`): the task's rows are one run of pixels in the data and the output,
      cut into tiles of 16;
    * one row (``rows == 1``): the row cut into tiles of 16 pixels at the horizontal stride;
    * stacked rows (``rows > 1``, a row of at most 16 pixels): one tile a row, so that each weight tile
      loaded serves ``tile_a`` rows (14x14 planes: rows of 14 pixels);
    * a wide run (:func:`wide_run`: short rows at stride 1 where it takes fewer tiles than stacking, a
      7x7 plane): the rows one run at the padded data's pitch, stored to a scratch of the run's pixels
      and copied to the task's rows without the pixels past each row's end.

    Steps of ``tile_a`` pixel tiles share each weight tile; the tiles left after the whole steps (fewer,
    or a last one of fewer rows) run with a second tile configuration."""
    variant = isa.variant(data_dtype, kernel_dtype)
    ic_chunks, k_h, k_w = int(kernel_shape[1]), int(kernel_shape[2]), int(kernel_shape[3])
    block, quads, lanes = isa.row_bytes, isa.row_bytes // isa.reduce, isa.columns
    stride_h, stride_w = pair(strides)
    in_w = (out_w - 1) * stride_w + k_w
    form, tile_rows = task_tiles(isa, rows, out_w, k_h, k_w, strides)
    flat, wide, stacked = form == "flat", form == "wide", form == "stacked"
    per_tile = tile_rows[0]
    d = te.placeholder((1, ic_chunks, (rows - 1) * stride_h + k_h, in_w, block), data_dtype, name="d")
    w = te.placeholder((1, ic_chunks, k_h, k_w, quads, block, isa.reduce), kernel_dtype, name="w")
    r_ic = te.reduce_axis((0, ic_chunks), name="ic")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, k_w), name="kw")
    r_icf = te.reduce_axis((0, quads), name="icf")
    r_ics = te.reduce_axis((0, isa.reduce), name="ics")
    c = te.compute(
        (1, 1, rows, out_w, block),
        lambda n, o, y, x, oci: te.sum(
            d[n, r_ic, y * stride_h + r_kh, x * stride_w + r_kw, r_icf * isa.reduce + r_ics].astype("int32")
            * w[o, r_ic, r_kh, r_kw, r_icf, oci, r_ics].astype("int32"),
            axis=[r_ic, r_kh, r_kw, r_icf, r_ics]),
        name="c",
    )
    # A flat or wide task's rows must follow each other in memory: its row pitch is fixed to a row's bytes.
    d_h = in_w * block if flat or wide else te.var("d_h")
    c_h = out_w * block if flat else te.var("c_h")
    binds = {
        d: tvm.tir.decl_buffer(d.shape, d.dtype, name="d_buf", offset_factor=1,
                               strides=[te.var("d_n"), te.var("d_c"), d_h, block, 1]),
        w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1,
                               strides=[te.var("w_o"), te.var("w_c"), te.var("w_h"), te.var("w_w"),
                                        block * isa.reduce, isa.reduce, 1]),
        c: tvm.tir.decl_buffer(c.shape, c.dtype, name="c_buf", offset_factor=1,
                               strides=[te.var("c_n"), te.var("c_c"), c_h, block, 1]),
    }
    last_row = (rows - 1) * stride_h + k_h - 1  # a wide task's reference form reads no further
    groups = block // (lanes * tile_b)

    def program(ins, outs):
        d_buf, w_buf = ins
        (c_buf,) = outs
        ib = tvm.tir.ir_builder.create()
        d_col, w_quad, c_col = d_buf.strides[3], w_buf.strides[4], c_buf.strides[3]

        if wide:
            scratch = ib.allocate(c_buf.dtype, len(tile_rows) * per_tile * block, name="wide_run", scope="local")

        def pixels(g, ic, kh, kw) -> TileMemory:
            # Pixel tile g: its first pixel's output row and column, and the data row / column it reads.
            if wide:
                row, col = 0, g * per_tile + kh * in_w + kw

                def element(r, ch):
                    flat_pixel = tir.min(g * per_tile + r + kh * in_w + kw, last_row * in_w + in_w - 1)
                    return d_buf, [0, ic, flat_pixel // in_w, flat_pixel % in_w, ch]
            elif stacked:
                row, col = g * stride_h + kh, kw
                element = lambda r, ch: (d_buf, [0, ic, row, r * stride_w + kw, ch])  # noqa: E731
            elif flat:
                row, col = 0, g * per_tile
                element = lambda r, ch: (d_buf, [0, ic, (g * per_tile + r) // in_w,  # noqa: E731
                                                 (g * per_tile + r) % in_w, ch])
            else:
                row, col = kh, g * per_tile * stride_w + kw
                element = lambda r, ch: (d_buf, [0, ic, kh, (g * per_tile + r) * stride_w + kw, ch])  # noqa: E731
            return TileMemory(
                pointer=lambda access: d_buf.access_ptr(
                    access, offset=ic * d_buf.strides[1] + row * d_buf.strides[2] + col * d_col),
                stride=d_col * stride_w, element=element)

        def weights(ic, kh, kw, oc0) -> TileMemory:
            return TileMemory(
                pointer=lambda access: w_buf.access_ptr(
                    access, offset=ic * w_buf.strides[1] + kh * w_buf.strides[2] + kw * w_buf.strides[3]
                    + oc0 * isa.reduce),
                stride=w_quad,
                element=lambda r, col: (w_buf, [0, ic, kh, kw, r, oc0 + col // isa.reduce, col % isa.reduce]),
            )

        def outputs(g, oc0) -> TileMemory:
            if wide:
                first = g * per_tile * block + oc0
                return TileMemory(
                    pointer=lambda access: tir.call_intrin("handle", "tir.address_of", scratch[first]),
                    stride=block * 4, element=lambda r, col: (scratch._buffer, [first + r * block + col]))
            if stacked:
                offset = g * c_buf.strides[2] + oc0
                element = lambda r, col: (c_buf, [0, 0, g, r, oc0 + col])  # noqa: E731
            else:  # flat or one row: the run's pixels follow each other
                offset = g * per_tile * c_col + oc0
                element = lambda r, col: (c_buf, [0, 0, (g * per_tile + r) // out_w,  # noqa: E731
                                                  (g * per_tile + r) % out_w, oc0 + col])
            return TileMemory(pointer=lambda access: c_buf.access_ptr(access, offset=offset), stride=c_col * 4,
                              element=element)

        run_steps(ib, isa, variant, tile_rows, (ic_chunks, k_h, k_w), tile_a, tile_b, groups, quads,
                  data=pixels, weights=lambda col, ic, kh, kw: weights(ic, kh, kw, col), outputs=outputs,
                  mark_steps=not wide)
        if wide:  # the run's pixels to the task's rows, less those past each row's end
            with ib.for_range(0, rows, name="y") as y:
                with ib.for_range(0, out_w, name="x") as x:
                    with ib.for_range(0, block, name="ch", kind="vectorize") as ch:
                        ib.emit(tir.BufferStore(c_buf, scratch[(y * in_w + x) * block + ch], [0, 0, y, x, ch]))
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
    # The intrinsic reads rows and pixels at the conv's strides.
    indices = conv.op.body[0].source[0].a.value.indices
    strides = (_stride_of(indices[2]), _stride_of(indices[3]))
    rows = cfg["rows"].val
    intrin = row_intrin(isa, get_const_tuple(data.shape), get_const_tuple(kernel.shape), strides,
                        int(conv.shape[3]), cfg["tile_a"].val, cfg["tile_b"].val, str(data.dtype),
                        str(kernel.dtype), rows)
    form, tile_rows = task_tiles(isa, rows, int(conv.shape[3]), int(kernel.shape[2]), int(kernel.shape[3]),
                                 strides)
    # A wide task stores to its scratch: its epilogue runs after the program (its rows fit L1).
    _row_tasks(s, outs, conv, isa, intrin, rows, None if form == "wide" else _step_extents(isa, cfg, tile_rows[0]))
    return s


def _step_extents(isa: TileISA, cfg, tile_pixels: int) -> Tuple[int, int]:
    """``(pixels, channels)`` of one step of a task's tile program whose data tiles hold ``tile_pixels``."""
    return tile_pixels * cfg["tile_a"].val, isa.columns * cfg["tile_b"].val


def _row_tasks(s: te.Schedule, outs, conv: te.Tensor, isa: TileISA, intrin, rows: int = 1,
               steps: Optional[Tuple[int, int]] = None) -> None:
    """One parallel task per image, output block and ``rows`` output rows, running the tile program
    ``intrin`` over them (tensorized at the rows, or at the row's pixels for one row), with the elementwise
    ops between ``conv`` and ``outs[0]`` inlined into a vectorized pass over the task's rows. ``steps``
    (pixels, channels of one step of the program): that pass runs strip by strip and step by step (the
    last step maybe partial), in the tile program's order, so that :mod:`..tile_epilogue` can move each
    step's share into the program."""
    out = outs[0]
    inline_between(s, outs, conv)
    if get_const_tuple(out.shape) != get_const_tuple(conv.shape):
        out = conv
    n, oc, y, x, oci = s[out].op.axis
    y_o, y_i = s[out].split(y, factor=rows)
    task = s[out].fuse(n, oc, y_o)
    s[out].parallel(task)
    if out.op != conv.op:
        s[conv].compute_at(s[out], task)
        if steps is not None:
            pixel_o, pixel_i = s[out].split(s[out].fuse(y_i, x), factor=steps[0])
            strip, channel = s[out].split(oci, factor=steps[1])
            lanes_o, lanes = s[out].split(channel, factor=isa.columns)
            s[out].reorder(strip, pixel_o, pixel_i, lanes_o, lanes)
            s[out].vectorize(lanes)
        else:
            s[out].vectorize(s[out].split(oci, factor=isa.columns)[1])
        s[conv].tensorize(s[conv].op.axis[2 if rows > 1 else 3], intrin)
    else:
        s[conv].tensorize(y_i if rows > 1 else x, intrin)


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


# --------------------------------------------------------------------------
# Few-channel convs (an RGB stem): pixels x taps in a tile row
# --------------------------------------------------------------------------
#: Channels of a stem pixel in its ``NHWC`` data (an RGB image's 3, zero-padded): one 4-value group.
STEM_CHANNELS = 4


def stem_layouts(isa: TileISA) -> Tuple[str, str, str]:
    """``(data, kernel, out)`` layouts of the stem conv: ``NHWC`` data of :data:`STEM_CHANNELS` channels,
    the kernel's taps padded to a tile row (16 pixels of 4 channels) and blocked by 64 output channels.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> stem_layouts(X86_AMX)
    ('NHWC', 'OHW64oI', 'NCHW64c')
    """
    return "NHWC", f"OHW{isa.row_bytes}oI", f"NCHW{isa.row_bytes}c"


def stem_taps(isa: TileISA) -> int:
    """Kernel columns one tile row holds: ``row_bytes / STEM_CHANNELS`` pixels (16).

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_AMX
    >>> stem_taps(X86_AMX)
    16
    """
    return isa.row_bytes // STEM_CHANNELS


def conv2d_stem_amx(cfg, data, kernel, strides, padding, dilation, data_layout, kernel_layout, out_layout,
                    out_dtype="int32"):
    """int8 conv2d of a few-channel image on AMX tiles, no channel blocks needed.

    A tile row is 64 bytes of the ``NHWC`` image from an output pixel's first input pixel: 16 pixels of 4
    channels, i.e. every tap of a kernel row (zero-padded to 16) at once, and the next output pixel's row
    starts ``stride * 4`` bytes further (the rows overlap). So a 7x7 RGB stem is 7 tile products per
    16 pixels and 16 output channels, with no copy of the image into columns. The legalization hook
    writes such a conv in this form (``NHWC`` data padded to 4 channels and to whole tile rows, the
    kernel's columns to 16, exact); the alter-layout hook blocks its kernel by 64 output channels.

    Parameters
    ----------
    data : te.Tensor
        ``(N, H, W, 4)`` uint8/int8, already padded (``padding`` must be 0).
    kernel : te.Tensor
        ``(O/64, KH, 16, 64, 4)`` int8/uint8.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 13, 30, 4), "uint8"); k = te.placeholder((1, 7, 16, 64, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     out = conv2d_stem_amx(autotvm.get_config(), d, k, 2, 0, 1, "NHWC", "OHW64oI", "NCHW64c")
    >>> [int(x) for x in out.shape]
    [1, 1, 4, 8, 64]
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for an AMX conv2d, got {out_dtype!r}")
    isa = current_tile_isa(str(data.dtype), str(kernel.dtype))
    block, taps = isa.row_bytes, stem_taps(isa)
    d_shape, k_shape = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if len(d_shape) != 4 or d_shape[3] != STEM_CHANNELS:
        raise ValueError(f"data must be NHWC with {STEM_CHANNELS} channels, got shape {d_shape}")
    if len(k_shape) != 5 or k_shape[2:] != (taps, block, STEM_CHANNELS):
        raise ValueError(f"kernel must be (O/{block}, KH, {taps}, {block}, {STEM_CHANNELS}), got {k_shape}")
    if any(get_pad_tuple(padding, (1, 1))) or tuple(pair(dilation)) != (1, 1):
        raise ValueError("conv2d_stem_amx takes padded data (padding 0) and no dilation")
    batch, in_h, in_w, _ = d_shape
    oc_chunks, k_h = k_shape[:2]
    s_h, s_w = pair(strides)
    out_h, out_w = (in_h - k_h) // s_h + 1, (in_w - taps) // s_w + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"empty conv2d output ({out_h}x{out_w}) for input {in_h}x{in_w}")
    _define_knobs(cfg, isa, out_h, out_w, block // isa.columns, flat=False)
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, taps), name="kw")
    r_c = te.reduce_axis((0, STEM_CHANNELS), name="c")
    conv = te.compute(
        (batch, oc_chunks, out_h, out_w, block),
        lambda n, oc, y, x, oci: te.sum(
            data[n, y * s_h + r_kh, x * s_w + r_kw, r_c].astype("int32")
            * kernel[oc, r_kh, r_kw, oci, r_c].astype("int32"),
            axis=[r_kh, r_kw, r_c]),
        name="conv2d_stem_amx", tag=STEM_TAG,
    )
    cfg.add_flop(2 * batch * oc_chunks * block * out_h * out_w * k_h * taps * STEM_CHANNELS)
    return conv


#: Tag of the stem conv.
STEM_TAG = "conv2d_stem_amx"


def stem_intrin(isa: TileISA, k_h: int, stride_w: int, out_w: int, tile_a: int, tile_b: int, data_dtype: str,
                kernel_dtype: str):
    """The tensor intrinsic of one stem task: one output row (``out_w`` pixels x 64 channels)."""
    variant = isa.variant(data_dtype, kernel_dtype)
    block, taps, lanes = isa.row_bytes, stem_taps(isa), isa.columns
    in_w = (out_w - 1) * stride_w + taps
    d = te.placeholder((1, k_h, in_w, STEM_CHANNELS), data_dtype, name="d")
    w = te.placeholder((1, k_h, taps, block, STEM_CHANNELS), kernel_dtype, name="w")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, taps), name="kw")
    r_c = te.reduce_axis((0, STEM_CHANNELS), name="c")
    c = te.compute(
        (1, 1, 1, out_w, block),
        lambda n, o, y, x, oci: te.sum(
            d[n, y + r_kh, x * stride_w + r_kw, r_c].astype("int32")
            * w[o, r_kh, r_kw, oci, r_c].astype("int32"), axis=[r_kh, r_kw, r_c]),
        name="c",
    )
    binds = {
        d: tvm.tir.decl_buffer(d.shape, d.dtype, name="d_buf", offset_factor=1,
                               strides=[te.var("d_n"), te.var("d_h"), STEM_CHANNELS, 1]),
        w: tvm.tir.decl_buffer(w.shape, w.dtype, name="w_buf", offset_factor=1,
                               strides=[te.var("w_o"), te.var("w_h"), block * STEM_CHANNELS, STEM_CHANNELS, 1]),
        c: tvm.tir.decl_buffer(c.shape, c.dtype, name="c_buf", offset_factor=1,
                               strides=[te.var("c_n"), te.var("c_c"), te.var("c_h"), block, 1]),
    }
    tile_rows = _run_tiles(isa, out_w)
    per_tile = tile_rows[0]
    groups = block // (lanes * tile_b)

    def program(ins, outs):
        d_buf, w_buf = ins
        (c_buf,) = outs
        ib = tvm.tir.ir_builder.create()

        def pixels(g, kh) -> TileMemory:
            # Output pixels 16g...: rows of 64 bytes from each one's first input pixel, stride * 4 apart.
            return TileMemory(
                pointer=lambda access: d_buf.access_ptr(
                    access, offset=kh * d_buf.strides[1] + g * per_tile * stride_w * STEM_CHANNELS),
                stride=stride_w * STEM_CHANNELS,
                element=lambda r, b: (d_buf, [0, kh, (g * per_tile + r) * stride_w + b // STEM_CHANNELS,
                                              b % STEM_CHANNELS]))

        def weights(kh, oc0) -> TileMemory:
            return TileMemory(
                pointer=lambda access: w_buf.access_ptr(access, offset=kh * w_buf.strides[1] + oc0 * STEM_CHANNELS),
                stride=block * STEM_CHANNELS,
                element=lambda r, b: (w_buf, [0, kh, r, oc0 + b // STEM_CHANNELS, b % STEM_CHANNELS]))

        def outputs(g, oc0) -> TileMemory:
            return TileMemory(
                pointer=lambda access: c_buf.access_ptr(access, offset=g * per_tile * block + oc0),
                stride=block * 4, element=lambda r, col: (c_buf, [0, 0, 0, g * per_tile + r, oc0 + col]))

        run_steps(ib, isa, variant, tile_rows, (k_h,), tile_a, tile_b, groups, taps, data=pixels,
                  weights=lambda col, kh: weights(kh, col), outputs=outputs, mark_steps=True)
        return ib.get()

    return te.decl_tensor_intrin(c.op, program, binds=binds)


def schedule_conv2d_stem_amx(cfg, outs):
    """Schedule :func:`conv2d_stem_amx`: one task per image, output block and row.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 13, 30, 4), "uint8"); k = te.placeholder((1, 7, 16, 64, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=sapphirerapids"):
    ...     cfg = autotvm.get_config()
    ...     out = conv2d_stem_amx(cfg, d, k, 2, 0, 1, "NHWC", "OHW64oI", "NCHW64c")
    ...     s = schedule_conv2d_stem_amx(cfg, [out])
    >>> "tdpbusd" in str(tvm.lower(s, [d, k, out]))
    True
    """
    outs, conv = tagged_outputs(outs, STEM_TAG)
    s = te.create_schedule([t.op for t in outs])
    data, kernel = conv.op.input_tensors
    isa = current_tile_isa(str(data.dtype), str(kernel.dtype))
    stride_w = _stride_of(conv.op.body[0].source[0].a.value.indices[2])
    intrin = stem_intrin(isa, int(kernel.shape[1]), stride_w, int(conv.shape[3]), cfg["tile_a"].val,
                         cfg["tile_b"].val, str(data.dtype), str(kernel.dtype))
    _row_tasks(s, outs, conv, isa, intrin, steps=_step_extents(isa, cfg, _run_tiles(isa, int(conv.shape[3]))[0]))
    return s
