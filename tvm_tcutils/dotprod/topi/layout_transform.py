"""Byte-shuffle schedule for the 8-bit ``NCHW`` <-> ``NCHW{b}c`` layout transforms.

The packed int8 conv2d takes ``NCHW{b}c`` data; at the edges of a model (or
of a run of convs) Relay inserts ``layout_transform`` ops that move u8 / i8
activations between ``NCHW`` and that layout. TVM's x86 injective schedule
vectorizes the innermost output axis: for packing that is the ``b`` channels,
one byte from each channel plane (a gather with a stride of ``H*W`` bytes);
for unpacking it is ``W`` bytes whose sources sit ``b`` bytes apart. Either way
it moves 2-5 bytes per nanosecond, and on a whole-op int8 conv (u8 in, u8 out,
as onnxruntime's ``QLinearConv``) the two transforms cost 15-25 % of the conv.

Both transforms are transposes of ``b x t`` byte tiles: ``b`` channels by ``t``
consecutive pixels of the ``H*W`` plane are ``b`` contiguous rows of ``t`` bytes
in ``NCHW`` and ``t*b`` contiguous bytes in ``NCHW{b}c``. The schedule
tensorizes a block of ``th`` whole image rows (``th*W`` pixels, a multiple of
``t``) with an intrinsic that, per tile, loads the ``b`` rows as vectors and
interleaves them with one ``tir.Shuffle`` into a single vector store (unpack:
one vector load, ``b`` de-interleaving shuffles, ``b`` stores); LLVM lowers
the fixed permutations to byte shuffles and unpacks. The compute is TVM's own
``topi.layout_transform``; only the loop nest changes, so results are
identical by construction.
"""
from __future__ import annotations

import re
from typing import Optional, Sequence, Tuple, Union

from tvm import te, tir
from tvm.topi.utils import get_const_tuple

from .injective import schedule_or_tvms

_PACKED = re.compile(r"^NCHW(\d+)c$")

#: Pixels per tile, preferred first (16 and 8 time alike on AVX2; 8 and 4 serve planes too big to
#: move whole that have no 16-pixel block of rows).
_TILE_PIXELS = (16, 8, 4)

#: Tiles unrolled in one intrinsic call at most (a ``th``-row block of a wide image).
_MAX_TILES = 64

#: Name TVM's ``topi.layout_transform`` gives its compute.
_TOPI_NAME = "T_layout_trans"


def packed_block(layout: str) -> Optional[int]:
    """The channel block ``b`` of an ``NCHW{b}c`` layout, None for any other layout.

    Examples
    --------
    >>> packed_block("NCHW8c"), packed_block("NHWC")
    (8, None)
    """
    match = _PACKED.match(layout)
    return int(match.group(1)) if match else None


def byte_tile_plan(src_layout: str, dst_layout: str, src_shape: Sequence[int],
                   dtype: str) -> Optional[Tuple[str, int, int, int]]:
    """How this schedule tiles a transform: ``(direction, b, th, t)``, or None if it does not apply.

    ``direction`` is ``"pack"`` (``NCHW`` -> ``NCHW{b}c``) or ``"unpack"`` (the
    reverse); each intrinsic call moves ``th`` image rows of ``b`` channels, in
    tiles of ``t`` pixels. It applies to 8-bit data with static shapes and
    channels a multiple of ``b`` (no padding inside the transform). A block of
    whole rows that is a multiple of 16 pixels comes first; a plane of at most
    ``64 x 16`` pixels that has none (14x14, 7x7) is moved whole, in 16-pixel
    tiles and a narrower last one; other planes take 8- or 4-pixel tiles, or
    else the fewest whole rows in 16-pixel tiles and narrower last ones.

    Examples
    --------
    >>> byte_tile_plan("NCHW", "NCHW8c", (1, 64, 56, 56), "uint8")
    ('pack', 8, 2, 16)
    >>> byte_tile_plan("NCHW16c", "NCHW", (1, 64, 14, 14, 16), "uint8")
    ('unpack', 16, 14, 16)
    >>> byte_tile_plan("NCHW", "NCHW4c", (1, 4, 230, 230), "uint8")  # 230 = 14 x 16 + 4 + 2
    ('pack', 4, 1, 16)
    >>> byte_tile_plan("NCHW", "NCHW8c", (1, 64, 56, 56), "float32") is None
    True
    """
    if dtype not in ("int8", "uint8"):
        return None
    try:
        shape = tuple(int(x) for x in src_shape)
    except (TypeError, ValueError):
        return None
    block_in, block_out = packed_block(src_layout), packed_block(dst_layout)
    if src_layout == "NCHW" and block_out and len(shape) == 4 and shape[1] % block_out == 0:
        direction, block = "pack", block_out
    elif dst_layout == "NCHW" and block_in and len(shape) == 5 and shape[4] == block_in:
        direction, block = "unpack", block_in
    else:
        return None
    height, width = shape[2], shape[3]
    widest = _TILE_PIXELS[0]
    exact = _exact_rows(height, width, widest)
    if exact is not None:
        return direction, block, exact, widest
    if -(-height * width // widest) <= _MAX_TILES:
        return direction, block, height, widest
    for tile in _TILE_PIXELS[1:]:
        rows = _exact_rows(height, width, tile)
        if rows is not None:
            return direction, block, rows, tile
    # No block of rows is a whole number of tiles (a padded 230x230 image): the fewest rows, in 16-pixel
    # tiles and narrower last ones (TVM's schedule moves such a plane a byte per lane, 6-8x slower).
    for rows in range(1, height + 1):
        if height % rows == 0 and -(-rows * width // widest) <= _MAX_TILES:
            return direction, block, rows, widest
    return None


def _exact_rows(height: int, width: int, tile: int) -> Optional[int]:
    """The fewest whole rows that make a multiple of ``tile`` pixels in at most ``_MAX_TILES`` tiles."""
    for rows in range(1, height + 1):
        if height % rows == 0 and (rows * width) % tile == 0 and rows * width // tile <= _MAX_TILES:
            return rows
    return None


def _pieces(pixels: int, tile: int):
    """``(start, width)`` of the tiles covering ``pixels``: ``tile`` wide, then halving for the rest."""
    start, width = 0, tile
    while start < pixels:
        while width > pixels - start:
            width //= 2
        yield start, width
        start += width


def _transpose_intrin(direction: str, block: int, rows: int, width: int, tile: int, dtype: str):
    """``th`` rows x ``W`` pixels x ``b`` channels, moved between channel planes and pixel-major bytes."""
    if direction == "pack":
        src = te.placeholder((block, rows, width), dtype, name="src")
        dst = te.compute((rows, width, block), lambda h, w, c: src[c, h, w], name="dst")
        src_strides, dst_strides = [te.var("plane"), width, 1], [width * block, block, 1]
    else:
        src = te.placeholder((rows, width, block), dtype, name="src")
        dst = te.compute((block, rows, width), lambda c, h, w: src[h, w, c], name="dst")
        src_strides, dst_strides = [width * block, block, 1], [te.var("plane"), width, 1]
    # The row strides are fixed to W: the block covers whole rows, so each channel's part is contiguous.
    src_buf = tir.decl_buffer(src.shape, dtype, "src_buf", offset_factor=1, strides=src_strides)
    dst_buf = tir.decl_buffer(dst.shape, dtype, "dst_buf", offset_factor=1, strides=dst_strides)

    def body(ins, outs):
        ib = tir.ir_builder.create()
        src_b, dst_b = ins[0], outs[0]
        # A tile may run past the end of a row: the block holds whole rows, contiguous per channel.
        for start, size in _pieces(rows * width, tile):
            h, w = divmod(start, width)
            if size == 1:  # the last pixel of an odd plane: one byte per channel
                for c in range(block):
                    src_at = [c, h, w] if direction == "pack" else [h, w, c]
                    dst_at = [h, w, c] if direction == "pack" else [c, h, w]
                    ib.emit(dst_b.vstore(dst_at, src_b.vload(src_at, dtype)))
            elif direction == "pack":
                planes = [src_b.vload([c, h, w], f"{dtype}x{size}") for c in range(block)]
                mixed = tir.Shuffle(planes, [c * size + p for p in range(size) for c in range(block)])
                ib.emit(dst_b.vstore([h, w, 0], mixed))
            else:
                mixed = src_b.vload([h, w, 0], f"{dtype}x{size * block}")
                for c in range(block):
                    ib.emit(dst_b.vstore([c, h, w], tir.Shuffle([mixed], [p * block + c for p in range(size)])))
        return ib.get()

    return te.decl_tensor_intrin(dst.op, body, binds={src: src_buf, dst: dst_buf})


def schedule_byte_layout_transform(outs: Union[te.Tensor, Sequence[te.Tensor]], src_layout: str,
                                   dst_layout: str) -> te.Schedule:
    """Schedule an 8-bit ``layout_transform`` by byte-tile shuffles.

    Only a transform that is the group's single output, reads its input
    directly (nothing fused into it) and has a :func:`byte_tile_plan` is
    tensorized; any other group gets TVM's x86 injective schedule, so fusion
    never breaks the build.

    Parameters
    ----------
    outs : Tensor or list of Tensor
        Outputs of the (fused) group.
    src_layout, dst_layout : str
        The transform's layouts (``NCHW`` and ``NCHW{b}c``, either way).

    Returns
    -------
    Schedule

    Examples
    --------
    >>> from tvm import te, topi
    >>> x = te.placeholder((1, 64, 56, 56), "uint8")
    >>> y = topi.layout_transform(x, "NCHW", "NCHW8c")
    >>> s = schedule_byte_layout_transform(y, "NCHW", "NCHW8c")
    """
    outs = [outs] if isinstance(outs, te.Tensor) else list(outs)
    plan = _plain_transform_plan(outs, src_layout, dst_layout)
    if plan is None:  # the package's injective schedule (TVM's unless it leaves a loop scalar)
        return schedule_or_tvms(outs)
    out = outs[0]
    s = te.create_schedule(out.op)
    direction, block, rows, tile = plan
    dtype = out.dtype
    if direction == "pack":
        n, co, h, w, ci = s[out].op.axis
        h_o, h_i = s[out].split(h, factor=rows)
        s[out].reorder(n, co, h_o, h_i, w, ci)
        s[out].parallel(s[out].fuse(n, co, h_o))
        s[out].tensorize(h_i, _transpose_intrin(direction, block, rows, int(out.shape[3]), tile, dtype))
    else:
        n, c, h, w = s[out].op.axis
        co, ci = s[out].split(c, factor=block)
        h_o, h_i = s[out].split(h, factor=rows)
        s[out].reorder(n, co, h_o, ci, h_i, w)
        s[out].parallel(s[out].fuse(n, co, h_o))
        s[out].tensorize(ci, _transpose_intrin(direction, block, rows, int(out.shape[3]), tile, dtype))
    return s


def _plain_transform_plan(outs: Sequence[te.Tensor], src_layout: str,
                          dst_layout: str) -> Optional[Tuple[str, int, int, int]]:
    """The plan for ``outs`` when it is TVM's layout-transform compute alone on an unfused input."""
    if len(outs) != 1:
        return None
    op = outs[0].op
    if not isinstance(op, te.ComputeOp) or op.name != _TOPI_NAME or len(op.input_tensors) != 1:
        return None
    source = op.input_tensors[0]
    if not isinstance(source.op, te.PlaceholderOp) or source.dtype != outs[0].dtype:
        return None
    plan = byte_tile_plan(src_layout, dst_layout, source.shape, source.dtype)
    if plan is None:
        return None
    shape, block = get_const_tuple(source.shape), plan[1]
    if plan[0] == "pack":
        expected = (shape[0], shape[1] // block, shape[2], shape[3], block)
    else:
        expected = (shape[0], shape[1] * block, shape[2], shape[3])
    return plan if get_const_tuple(outs[0].shape) == expected else None
