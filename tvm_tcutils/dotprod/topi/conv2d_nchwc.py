"""int8 conv2d in NCHW[x]c layout, tensorized with a 4-way dot-product instruction.

Layouts (``L`` = lanes of the target's ISA, ``b`` = input-channel block, a
multiple of 4):

* data ``NCHW{b}c``: ``(N, C/b, H, W, b)``, uint8 or int8;
* kernel ``OIHW{b/4}i{B}o4i``: ``(O/B, I/b, KH, KW, b/4, B, 4)`` with ``B`` a
  multiple of ``L``, so each ``L x 4`` kernel block is contiguous; for an ISA
  with ``wide_kernel`` (AVX2) ``OIHW{b/2}i{B}o2i`` in int16, widened at compile
  time, so each instruction's ``L x 2`` operand is contiguous; for a reduce-range
  ISA ``OIHW1h{b/4}i{B}o4i`` (8-D, the unit axis marks a kernel whose values were
  checked: :func:`~.packing.conv_kernel_marked`);
* output ``NCHW{B}c``, int32.

The schedule keeps a ``tile_oh x tile_ow x B/L`` block of accumulators in
vector registers, loops over input channels and the window around it, and
replaces the innermost ``L`` output channels x 4 input channels with one
dot-product instruction. Elementwise ops fused after the conv (bias, requantize,
clip, cast) are computed per tile on the registers' values and vectorized.
"""
from __future__ import annotations

from typing import Sequence, Tuple

from ..._tvm import tvm
from tvm import te, topi
from tvm.autotvm.task.space import OtherOptionEntity
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from .common import (REQUANTIZED, current_isa, divisors_up_to, inline_between, limit_tile_space, measuring_packed_alone,
                     pair, requantized, tagged_outputs, vectorize_inner)
from ..cpu_facts import chains_in_flight
from .intrinsics import dot_product_intrin
from .packing import channel_block, conv_kernel_marked, round_up

#: Tag of the conv op, used by the schedule to find it among fused ops.
TAG = "conv2d_nchwc_dot"
#: Tag of the stage that widens the (padded) data once for ISAs with ``wide_data``.
WIDE_TAG = "dot_widen"


def conv2d_nchwc_shapes(data_shape: Sequence[int], kernel_shape: Sequence[int], group: int = 4,
                        groups: int = 1) -> Tuple[int, ...]:
    """Check packed shapes; return ``(ic_bn, oc_bn)``.

    ``group`` is the kernel's innermost axis (4, or the ISA's ``wide_group`` for a
    kernel packed widened). A marked kernel (8-D, reduce-range) is checked without its unit axis.
    ``groups``: a grouped conv's kernel has the input-channel chunks of one group, and each group whole
    chunks of the data and of the output.

    Raises
    ------
    ValueError
        When the shapes are not ``(N, C/b, H, W, b)`` / ``(O/B, I/b, KH, KW, b/g, B, g)`` (``I`` the
        input channels of a group), or the groups do not split both into whole chunks.

    Examples
    --------
    >>> conv2d_nchwc_shapes((1, 4, 28, 28, 16), (8, 4, 3, 3, 4, 16, 4))
    (16, 16)
    >>> conv2d_nchwc_shapes((1, 4, 28, 28, 8), (8, 4, 3, 3, 4, 8, 2), group=2)
    (8, 8)
    >>> conv2d_nchwc_shapes((1, 4, 28, 28, 8), (8, 4, 3, 3, 1, 2, 8, 4))
    (8, 8)
    >>> conv2d_nchwc_shapes((1, 4, 14, 14, 16), (8, 2, 1, 1, 4, 16, 4), groups=2)
    (16, 16)
    """
    kernel_shape = _unmarked(kernel_shape)
    if len(data_shape) != 5 or len(kernel_shape) != 7:
        raise ValueError(
            f"data must be NCHW[x]c (5-D) and kernel OIHW[x]i[y]o{group}i (7-D); got {len(data_shape)}-D "
            f"and {len(kernel_shape)}-D"
        )
    if groups < 1 or data_shape[1] % groups or kernel_shape[0] % groups:
        raise ValueError(f"groups={groups} does not split the data's {data_shape[1]} and the kernel's "
                         f"{kernel_shape[0]} channel chunks into whole chunks per group")
    ic_bn, (_, icc_k, _, _, icf, oc_bn, inner) = data_shape[4], kernel_shape
    if inner != group or icf * group != ic_bn or icc_k * groups != data_shape[1] or ic_bn % 4:
        raise ValueError(
            f"kernel shape {tuple(kernel_shape)} does not match data shape {tuple(data_shape)} "
            f"(expected (O/B, {data_shape[1] // groups}, KH, KW, {ic_bn // group}, B, {group}))"
        )
    return ic_bn, oc_bn


def _unmarked(kernel_shape: Sequence[int]) -> Tuple[int, ...]:
    """A packed kernel shape without the reduce-range mark's unit axis."""
    kernel_shape = tuple(kernel_shape)
    return kernel_shape[:4] + kernel_shape[5:] if conv_kernel_marked(kernel_shape) else kernel_shape


def _pixel_block(oh: int, ow: int, pixels: int):
    """``(tile_ow, tile_oh)`` of ``pixels`` output pixels, square first, then the wider of two (a row's
    pixels lie next to each other), where both divide the output.

    Examples
    --------
    >>> _pixel_block(56, 56, 4), _pixel_block(7, 7, 4), _pixel_block(3, 8, 4), _pixel_block(28, 28, 7)
    ((2, 2), None, (4, 1), (7, 1))
    """
    if pixels <= 0:
        return None
    shapes = sorted(((w, pixels // w) for w in range(1, pixels + 1) if pixels % w == 0),
                    key=lambda shape: (abs(shape[0] - shape[1]), -shape[0]))
    for tile_ow, tile_oh in shapes:
        if ow % tile_ow == 0 and oh % tile_oh == 0:
            return tile_ow, tile_oh
    return None


#: Reduction bytes (input channels x kernel taps) up to which conv2d's fallback keeps the ISA's own
#: pixel block on every CPU: over a reduction that short, a wider tile's epilogue costs more than its
#: products gain (Zen 5, 1x1 convs of 64 channels: 2x2 blocks 674-695 GOPS, 1x7 rows 620-639).
SHORT_REDUCTION = 64


def _define_knobs(cfg, isa, oc_chunks: int, oh: int, ow: int, oc_bn: int, kw: int, reduction: int) -> None:
    blocks = max(1, oc_bn // isa.lanes)  # instructions per output-channel chunk

    def budget(tile_oc: int) -> int:  # accumulators per output-channel chunk of the tile
        return max(1, isa.accumulator_budget(blocks * tile_oc) // blocks)

    # Output-channel blocks per tile share each broadcast data word.
    cfg.define_knob("tile_oc", divisors_up_to(oc_chunks, 4))
    cfg.define_knob("tile_ow", divisors_up_to(ow, budget(1)))
    cfg.define_knob("tile_oh", divisors_up_to(oh, budget(1)))
    cfg.define_knob("unroll_kw", [False, True] if kw > 1 else [False])
    cfg.define_knob("par_depth", [3, 2])
    # Two output-channel blocks per tile when there are (measured 10-30% faster on ResNet-50
    # layers than one on VNNI: each broadcast data word feeds two instructions); where operands
    # take two registers each (AVX2) two blocks leave room for few accumulators, so there the
    # tiling with more accumulators wins. Then the ISA's pixel block where it asks for one and
    # the output has it -- or, on a CPU with more instructions in flight than that block holds,
    # the smallest block that covers them (a short reduction keeps the ISA's: there a wider
    # tile's epilogue costs more than its products gain), or the smallest larger one the output has;
    # else the widest row tile that fits the register budget, then as many rows as still fit.
    chains = chains_in_flight(isa) if reduction > SHORT_REDUCTION and isa.conv_tile_pixels else None

    def tile(tile_oc: int):
        per_block = max(1, budget(tile_oc) // tile_oc)
        wanted = isa.conv_pixels(chains, blocks * tile_oc)
        # Where the output has no block of that many pixels, the smallest larger one that fits (55 x 55: a
        # 5 x 1 row; the widest row, 11, ran SqueezeNet's 16-channel convs at half the speed on Zen 4). An
        # ISA that asks for none (0: AVX2) fills the budget below.
        small = next(filter(None, (_pixel_block(oh, ow, p) for p in range(wanted, per_block + 1))),
                     None) if wanted else None
        if small is not None:
            return (tile_oc, *small)
        tile_ow = divisors_up_to(ow, per_block)[-1]
        return tile_oc, tile_ow, divisors_up_to(oh, max(1, per_block // tile_ow))[-1]

    choices = [tile(2)] if oc_chunks % 2 == 0 else [tile(1)]
    # One block where two leave a tile smaller than the ISA's pixel block: an output side that is a prime
    # above half the budget (GoogLeNet's and SqueezeNet's 13 x 13) gets a one-pixel tile with two blocks
    # (two accumulators: the unit waits on their latency), a whole row with one.
    small = choices[0][1] * choices[0][2] == 1 < oh * ow
    if oc_chunks % 2 == 0 and (isa.operand_registers > 1 or small):
        choices.append(tile(1))
    tile_oc, tile_ow, tile_oh = max(choices, key=lambda t: t[0] * t[1] * t[2])  # first wins ties
    untuned = blocks * tile_oc * tile_ow * tile_oh
    # Tuned tiles stay within the register budget next to their own output-channel blocks (24 on VNNI:
    # the probe's grid of ResNet-50 tiles up to it found the best of each layer inside it).
    limit_tile_space(cfg, lambda e: blocks * e["tile_oc"].val * e["tile_ow"].val * e["tile_oh"].val,
                     lambda e: max(isa.accumulator_budget(blocks * e["tile_oc"].val), untuned))
    if cfg.is_fallback:
        cfg["tile_oc"] = OtherOptionEntity(tile_oc)
        cfg["tile_ow"] = OtherOptionEntity(tile_ow)
        cfg["tile_oh"] = OtherOptionEntity(tile_oh)
        cfg["unroll_kw"] = OtherOptionEntity(False)
        cfg["par_depth"] = OtherOptionEntity(3)


def conv2d_nchwc_dot(cfg, data, kernel, strides, padding, dilation, layout, out_layout, out_dtype="int32"):
    """Compute int8 conv2d on packed NCHW[x]c data and an OIHW[x]i[y]o4i kernel.

    Parameters
    ----------
    cfg : ConfigSpace or ConfigEntity
        AutoTVM configuration (knobs ``tile_oc``, ``tile_ow``, ``tile_oh``, ``unroll_kw``, ``par_depth``).
    data : te.Tensor
        ``(N, C/b, H, W, b)`` uint8/int8.
    kernel : te.Tensor
        ``(O/B, C/b, KH, KW, b/4, B, 4)`` int8/uint8, or ``(O/B, C/b, KH, KW, b/g, B, g)``
        in the ISA's ``wide_kernel`` dtype with ``g = wide_group``, or int8
        ``(O/B, C/b, KH, KW, 1, b/4, B, 4)``: marked for the target's reduce-range ISA.
    strides, padding, dilation
        As for ``nn.conv2d`` (padding: 1, 2 or 4 values).
    layout, out_layout : str
        Data / output layouts (``NCHW{b}c`` / ``NCHW{B}c``); kept for Relay's signature.
    out_dtype : str
        Must be ``"int32"``.

    Returns
    -------
    te.Tensor
        ``(N, O/B, OH, OW, B)`` int32.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 1, 8, 8, 16), "uint8"); k = te.placeholder((1, 1, 3, 3, 4, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = conv2d_nchwc_dot(autotvm.get_config(), d, k, 1, 1, 1, "NCHW16c", "NCHW16c")
    >>> [int(x) for x in out.shape]
    [1, 1, 8, 8, 16]
    """
    return _conv2d_nchwc(cfg, data, kernel, strides, padding, dilation, 1, out_dtype)


#: Most multiply-adds a grouped conv may grow by when its groups' channels are padded to the dot product's
#: multiples (4 input, the lanes output): above it TVM's grouped conv keeps the layer.
MAX_GROUP_PADDING = 3.0


def group_padding_pays(isa, channels: int, out_channels: int, groups: int) -> bool:
    """Whether a grouped 8-bit conv goes to the dot-product kernel: more than one group, more than one input
    channel a group (a depthwise conv has its own kernel), and the per-group padding costs at most
    :data:`MAX_GROUP_PADDING` times the layer's multiply-adds.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> [group_padding_pays(X86_VNNI, c, o, g) for c, o, g in ((136, 136, 4), (128, 128, 32), (64, 64, 64))]
    [True, False, False]
    """
    if groups <= 1 or channels % groups or out_channels % groups or channels // groups < 2:
        return False
    cpg, opg = channels // groups, out_channels // groups
    return round_up(cpg, 4) * round_up(opg, isa.lanes) <= MAX_GROUP_PADDING * cpg * opg


def group_conv2d_nchwc_dot(cfg, data, kernel, strides, padding, dilation, groups, layout, out_layout,
                           out_dtype="int32"):
    """:func:`conv2d_nchwc_dot` of a grouped conv: output chunk ``oc`` reduces the data chunks of its group.

    Each group's input channels are whole chunks of the data (``b`` divides them) and its output
    channels whole chunks of the output (``B`` divides them); the legalization hook pads each group's
    channels to make them so. The kernel is the groups' kernels packed as one: ``(O/B, I/b, KH, KW, b/4,
    B, 4)`` with ``I`` the input channels of a group. A tile's output-channel chunks lie in one group,
    so that they share each broadcast data word as an ungrouped conv's do.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 4, 8, 8, 16), "uint8"); k = te.placeholder((4, 1, 1, 1, 4, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = group_conv2d_nchwc_dot(autotvm.get_config(), d, k, 1, 0, 1, 4, "NCHW16c", "NCHW16c")
    >>> [int(x) for x in out.shape]
    [1, 4, 8, 8, 16]
    """
    return _conv2d_nchwc(cfg, data, kernel, strides, padding, dilation, int(groups), out_dtype)


def _conv2d_nchwc(cfg, data, kernel, strides, padding, dilation, groups: int, out_dtype):
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for dot-product conv2d, got {out_dtype!r}")
    data_shape, kernel_shape = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    marked = conv_kernel_marked(kernel_shape)
    isa = current_isa(data.dtype, kernel.dtype, reduce_range=marked)
    group = isa.kernel_group(kernel.dtype)
    ic_bn, oc_bn = conv2d_nchwc_shapes(data_shape, kernel_shape, group, groups)
    kernel_shape = _unmarked(kernel_shape)
    if oc_bn % isa.lanes:
        raise ValueError(f"output-channel block {oc_bn} is not a multiple of {isa.name}'s {isa.lanes} lanes")
    batch, data_chunks, in_h, in_w, _ = data_shape
    oc_chunks, ic_chunks, k_h, k_w, _, _, _ = kernel_shape  # ic_chunks: of one group
    oc_per_group = oc_chunks // groups
    (s_h, s_w), (d_h, d_w) = pair(strides), pair(dilation)
    pad_t, pad_l, pad_b, pad_r = get_pad_tuple(padding, ((k_h - 1) * d_h + 1, (k_w - 1) * d_w + 1))
    out_h = (in_h + pad_t + pad_b - (k_h - 1) * d_h - 1) // s_h + 1
    out_w = (in_w + pad_l + pad_r - (k_w - 1) * d_w - 1) // s_w + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"empty conv2d output ({out_h}x{out_w}) for input {in_h}x{in_w}")
    _define_knobs(cfg, isa, oc_per_group, out_h, out_w, oc_bn, k_w, ic_chunks * ic_bn * k_h * k_w)

    if pad_t or pad_l or pad_b or pad_r:
        data = topi.nn.pad(data, [0, 0, pad_t, pad_l, 0], [0, 0, pad_b, pad_r, 0], name="data_pad")
    if isa.wide_data:
        # Each data value feeds every output-channel block and kernel tap: widen it once here
        # (fused with the padding copy) rather than in every step.
        # A strided 1x1 kernel reads one pixel in s_h * s_w: widen only those, then step by 1.
        narrow, wide = data, isa.wide_data
        step_h, step_w = (s_h, s_w) if k_h == k_w == 1 else (1, 1)
        shape = (batch, data_chunks, out_h, out_w, ic_bn) if k_h == k_w == 1 else narrow.shape
        data = te.compute(
            shape, lambda n, c, y, x, b: narrow[n, c, y * step_h, x * step_w, b].astype(wide),
            name="data_wide", tag=WIDE_TAG,
        )
        s_h, s_w = s_h // step_h, s_w // step_w
    r_ic = te.reduce_axis((0, ic_chunks), name="ic_outer")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, k_w), name="kw")
    r_icf = te.reduce_axis((0, ic_bn // 4), name="ic_f")
    r_ics = te.reduce_axis((0, 4), name="ic_s")

    def kernel_at(oc, oci):
        if marked:
            return kernel[oc, r_ic, r_kh, r_kw, 0, r_icf, oci, r_ics]
        if group == 4:
            return kernel[oc, r_ic, r_kh, r_kw, r_icf, oci, r_ics]
        return kernel[oc, r_ic, r_kh, r_kw, r_icf * (4 // group) + r_ics // group, oci, r_ics % group]

    def chunk_of(oc):  # the data chunk reduced: of the output chunk's group (groups == 1: r_ic as it is)
        return r_ic if groups == 1 else oc // oc_per_group * ic_chunks + r_ic

    conv = te.compute(
        (batch, oc_chunks, out_h, out_w, oc_bn),
        lambda n, oc, y, x, oci: te.sum(
            data[n, chunk_of(oc), y * s_h + r_kh * d_h, x * s_w + r_kw * d_w, r_icf * 4 + r_ics].astype("int32")
            * kernel_at(oc, oci).astype("int32"),
            axis=[r_ic, r_kh, r_kw, r_icf, r_ics],
        ),
        name="conv2d_nchwc_dot",
        tag=TAG,
    )
    cfg.add_flop(2 * batch * oc_chunks * oc_bn * out_h * out_w * ic_chunks * ic_bn * k_h * k_w)
    return conv


#: Taps of a kernel row one dot product reduces in :func:`conv2d_rows_dot`.
ROW_QUAD = 4


def rows_kernel_layout(lanes: int, group: int = ROW_QUAD) -> str:
    """The kernel layout of :func:`conv2d_rows_dot`: ``OIHW{lanes}o{group}w``, ``group`` taps of a row
    innermost (4; 2 for a kernel the ISA takes widened, in pairs: AVX2's int16).

    Examples
    --------
    >>> rows_kernel_layout(16), rows_kernel_layout(8, 2)
    ('OIHW16o4w', 'OIHW8o2w')
    """
    return f"OIHW{lanes}o{group}w"


def conv2d_rows_dot(cfg, data, kernel, strides, padding, dilation, out_dtype="int32"):
    """int8 conv2d of a few-channel ``NCHW`` image, four taps of a kernel row per dot product.

    The channel-blocked compute pads an image's channels to a multiple of 4 (an RGB input: a zero
    fourth channel); this one keeps the image's planes as they are and reduces each kernel row's
    taps four at a time (the row zero-padded to whole quads): ``C * ceil(KW/4)`` dot products a
    kernel row against ``KW * ceil(C/4)`` (a 7x7 RGB stem: 6 for 7), and the input needs no layout
    transform. The legalization hook rewrites such convs into this form.

    Parameters
    ----------
    cfg : ConfigSpace or ConfigEntity
        AutoTVM configuration (the knobs of :func:`conv2d_nchwc_dot`).
    data : te.Tensor
        ``(N, C, H, W)`` uint8/int8, already padded.
    kernel : te.Tensor
        ``(O/L, C, KH, KW/g, L, g)`` (:func:`rows_kernel_layout`), ``L`` the ISA's lanes, ``g`` its kernel
        group (4; 2 for the ISA's ``wide_kernel`` dtype: AVX2's int16 pairs), ``KW`` a multiple of 4.
    strides : int or tuple
        As for ``nn.conv2d``.
    padding, dilation
        Must be 0 and 1 (pad the data first).
    out_dtype : str
        Must be ``"int32"``.

    Returns
    -------
    te.Tensor
        ``(N, O/L, OH, OW, L)`` int32, scheduled by :func:`schedule_conv2d_nchwc_dot`.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 3, 9, 12), "uint8"); k = te.placeholder((1, 3, 3, 1, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = conv2d_rows_dot(autotvm.get_config(), d, k, 2, 0, 1)
    >>> [int(x) for x in out.shape]
    [1, 1, 4, 5, 16]
    """
    if out_dtype not in ("int32", None, ""):
        raise ValueError(f"out_dtype must be 'int32' for dot-product conv2d, got {out_dtype!r}")
    data_shape, kernel_shape = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if len(data_shape) != 4 or len(kernel_shape) != 6 or kernel_shape[1] != data_shape[1]:
        raise ValueError(f"data must be (N, C, H, W) and kernel (O/L, C, KH, KW/g, L, g); got {data_shape} "
                         f"and {kernel_shape}")
    if any(get_pad_tuple(padding, (1, 1))) or pair(dilation) != (1, 1):
        raise ValueError(f"padding must be 0 and dilation 1 (pad the data first), got {padding} and {dilation}")
    isa = current_isa(data.dtype, kernel.dtype)
    group = isa.kernel_group(kernel.dtype)
    oc_chunks, chans, k_h, runs, oc_bn, inner = kernel_shape
    quads = runs * group // ROW_QUAD
    if inner != group or oc_bn % isa.lanes or (runs * group) % ROW_QUAD:
        raise ValueError(f"kernel {kernel_shape} is not {rows_kernel_layout(isa.lanes, group)} for {isa.name}")
    batch, _, in_h, in_w = data_shape
    if isa.wide_data:
        # Each data value feeds every output-channel block and kernel row: widened once (the
        # channel-blocked compute's stage, which its schedule finds by the tag).
        narrow, wide = data, isa.wide_data
        data = te.compute(data_shape, lambda n, c, y, x: narrow[n, c, y, x].astype(wide), name="data_wide",
                          tag=WIDE_TAG)
    s_h, s_w = pair(strides)
    out_h, out_w = (in_h - k_h) // s_h + 1, (in_w - quads * ROW_QUAD) // s_w + 1
    if out_h < 1 or out_w < 1:
        raise ValueError(f"empty conv2d output ({out_h}x{out_w}) for input {in_h}x{in_w}")
    _define_knobs(cfg, isa, oc_chunks, out_h, out_w, oc_bn, 1, chans * k_h * quads * ROW_QUAD)
    # The channel-blocked compute's five reduction axes (the kernel-column one of extent 1), so that
    # schedule_conv2d_nchwc_dot tiles and tensorizes this one unchanged.
    r_c = te.reduce_axis((0, chans), name="ic_outer")
    r_kh = te.reduce_axis((0, k_h), name="kh")
    r_kw = te.reduce_axis((0, 1), name="kw")
    r_q = te.reduce_axis((0, quads), name="ic_f")
    r_t = te.reduce_axis((0, ROW_QUAD), name="ic_s")
    per_quad = ROW_QUAD // group
    conv = te.compute(
        (batch, oc_chunks, out_h, out_w, oc_bn),
        lambda n, oc, y, x, oci: te.sum(
            data[n, r_c, y * s_h + r_kh, x * s_w + r_kw + r_q * ROW_QUAD + r_t].astype("int32")
            * kernel[oc, r_c, r_kh, r_q * per_quad + r_t // group, oci, r_t % group].astype("int32"),
            axis=[r_c, r_kh, r_kw, r_q, r_t],
        ),
        name="conv2d_nchwc_dot",
        tag=TAG,
    )
    cfg.add_flop(2 * batch * oc_chunks * oc_bn * out_h * out_w * chans * k_h * quads * ROW_QUAD)
    if measuring_packed_alone():  # a tuner measures it ending as the network's kernel does
        return requantized(conv, (1, 4))
    return conv


def schedule_conv2d_nchwc_dot(cfg, outs, mode: str = "llvm"):
    """Schedule :func:`conv2d_nchwc_dot` and the elementwise ops fused after it.

    ``mode`` selects the tile's code (see :func:`~.intrinsics.dot_product_intrin`); with
    ``"extern"`` nothing else is vectorized either, so TVM's C backend can print the nest.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 1, 8, 8, 16), "uint8"); k = te.placeholder((1, 1, 3, 3, 4, 16, 4), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     cfg = autotvm.get_config()
    ...     out = conv2d_nchwc_dot(cfg, d, k, 1, 1, 1, "NCHW16c", "NCHW16c")
    ...     s = schedule_conv2d_nchwc_dot(cfg, [out])
    >>> "vpdpbusd" in str(tvm.lower(s, [d, k, out]))  # tensorized with VNNI
    True
    """
    outs, conv = tagged_outputs(outs, TAG)
    s = te.create_schedule([t.op for t in outs])
    data, kernel = conv.op.input_tensors
    wide, pad, source = _data_stages(data)
    isa = current_isa(source.dtype, kernel.dtype, reduce_range=conv_kernel_marked(get_const_tuple(kernel.shape)))
    intrin = dot_product_intrin(isa, str(source.dtype), str(kernel.dtype), mode, wide is not None)

    if wide is not None and pad is not None:
        s[pad].compute_inline()
    copy = wide if wide is not None else pad
    if copy is not None:
        axes = s[copy].op.axis  # (N, C/b, H, W, b); the row form's (N, C, H, W)
        s[copy].parallel(s[copy].fuse(*axes[:3]))
        if mode == "llvm":
            s[copy].vectorize(axes[-1])

    out = outs[0]
    inline_between(s, outs, conv)
    tile_oh, tile_ow = cfg["tile_oh"].val, cfg["tile_ow"].val
    if len(out.shape) != 5 or get_const_tuple(out.shape)[:4] != get_const_tuple(conv.shape)[:4]:
        out = conv  # a fused op that reshapes: keep the conv tiled on its own
    if out.op == conv.op:
        # Accumulate the tile in a small buffer of its own, which LLVM keeps in vector registers
        # across the whole reduction; accumulating in the output itself costs a load and a
        # store per register whenever the loop nest stops LLVM's promotion.
        conv = s.cache_write(conv, "global")
    n, occ, oh, ow, oci = s[out].op.axis
    occ_o, occ_i = s[out].split(occ, factor=cfg["tile_oc"].val)
    oh_o, oh_i = s[out].split(oh, factor=tile_oh)
    ow_o, ow_i = s[out].split(ow, factor=tile_ow)
    s[out].reorder(n, occ_o, oh_o, ow_o, occ_i, oh_i, ow_i, oci)
    outer = [n, occ_o, oh_o][: cfg["par_depth"].val]
    s[out].parallel(s[out].fuse(*outer))
    s[conv].compute_at(s[out], ow_o)
    if mode == "llvm":
        s[out].vectorize(oci)
        for tensor in outs[1:]:
            vectorize_inner(s, tensor)
    _, c_occ, c_oh, c_ow, c_oci = s[conv].op.axis
    r_ic, r_kh, r_kw, r_icf, r_ics = s[conv].op.reduce_axis
    oc_o, oc_l = s[conv].split(c_oci, factor=isa.lanes)
    s[conv].reorder(r_ic, r_kh, r_kw, r_icf, c_occ, c_oh, c_ow, oc_o, oc_l, r_ics)
    for axis in (c_occ, c_oh, c_ow, oc_o):
        s[conv].unroll(axis)
    if cfg["unroll_kw"].val:
        s[conv].unroll(r_kw)
    s[conv].tensorize(oc_l, intrin)
    return s


def _data_stages(data: te.Tensor):
    """``(wide, pad, source)`` stages feeding the conv's data (``None`` where absent)."""
    wide = data if data.op.tag == WIDE_TAG else None
    if wide is not None:
        data = data.op.input_tensors[0]
    pad = data if isinstance(data.op, te.ComputeOp) and "pad" in data.op.tag else None
    if pad is not None:
        data = data.op.input_tensors[0]
    return wide, pad, data


def conv2d_nchw_dot(cfg, data, kernel, strides, padding, dilation, out_dtype="int32"):
    """int8 conv2d on plain NCHW / OIHW tensors: packs both, runs :func:`conv2d_nchwc_dot`, unpacks.

    Used where Relay did not alter the layout (opt_level < 3); channels that are
    not multiples of 4 (data) or of the lane count (output) are zero-padded.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 3, 8, 8), "uint8"); k = te.placeholder((5, 3, 3, 3), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = conv2d_nchw_dot(autotvm.get_config(), d, k, 1, 1, 1)
    >>> [int(x) for x in out.shape]
    [1, 5, 8, 8]
    """
    return _conv2d_nchw(cfg, data, kernel, strides, padding, dilation, 1, out_dtype)


def group_conv2d_nchw_dot(cfg, data, kernel, strides, padding, dilation, groups, out_dtype="int32"):
    """:func:`conv2d_nchw_dot` of a grouped conv (:func:`group_conv2d_nchwc_dot` inside): each group's input
    channels a multiple of 4 and its output channels of the lane count (as the legalization hook pads them).

    Raises
    ------
    ValueError
        When a group's channels are not so.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 8, 8, 8), "uint8"); k = te.placeholder((32, 4, 1, 1), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     out = group_conv2d_nchw_dot(autotvm.get_config(), d, k, 1, 0, 1, 2)
    >>> [int(x) for x in out.shape]
    [1, 32, 8, 8]
    """
    return _conv2d_nchw(cfg, data, kernel, strides, padding, dilation, int(groups), out_dtype)


def _conv2d_nchw(cfg, data, kernel, strides, padding, dilation, groups: int, out_dtype):
    isa = current_isa(data.dtype, kernel.dtype)
    (batch, chans, in_h, in_w), (out_c, k_c, k_h, k_w) = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if k_c * groups != chans:
        raise ValueError(f"kernel has {k_c} input channels a group but data has {chans} in {groups} group(s)")
    if groups > 1 and (k_c % 4 or out_c % (groups * isa.lanes)):
        raise ValueError(f"a group's channels must be multiples of 4 (input, got {k_c}) and of {isa.name}'s "
                         f"{isa.lanes} lanes (output, got {out_c // groups}): legalize pads them")
    ic_bn, oc_bn = channel_block(k_c, isa.lanes), isa.lanes
    chans_p, out_p = round_up(chans, ic_bn), round_up(out_c, oc_bn)
    k_dtype = isa.conv_kernel_dtype(kernel.dtype)
    group = isa.kernel_group(k_dtype)
    k_c_p = chans_p // groups

    def packed(data_p, kernel_p):
        if groups == 1:
            return conv2d_nchwc_dot(cfg, data_p, kernel_p, strides, padding, dilation, "", "", out_dtype)
        return group_conv2d_nchwc_dot(cfg, data_p, kernel_p, strides, padding, dilation, groups, "", "", out_dtype)

    if measuring_packed_alone():
        data_p = te.placeholder((batch, chans_p // ic_bn, in_h, in_w, ic_bn), data.dtype, name="data_pack")
        kernel_p = te.placeholder((out_p // oc_bn, k_c_p // ic_bn, k_h, k_w, ic_bn // group, oc_bn, group),
                                  k_dtype, name="kernel_pack")
        return requantized(packed(data_p, kernel_p), (1, 4))
    zero_d, zero_k = tvm.tir.const(0, data.dtype), tvm.tir.const(0, k_dtype)
    data_p = te.compute(
        (batch, chans_p // ic_bn, in_h, in_w, ic_bn),
        lambda n, c, y, x, cb: tvm.tir.if_then_else(
            c * ic_bn + cb < chans, data[n, tvm.te.min(c * ic_bn + cb, chans - 1), y, x], zero_d
        ),
        name="data_pack", tag="dot_pack",
    )
    kernel_p = te.compute(
        (out_p // oc_bn, k_c_p // ic_bn, k_h, k_w, ic_bn // group, oc_bn, group),
        lambda o, c, y, x, cf, ob, cs: tvm.tir.if_then_else(
            tvm.tir.all(o * oc_bn + ob < out_c, c * ic_bn + cf * group + cs < k_c),
            kernel[te.min(o * oc_bn + ob, out_c - 1), te.min(c * ic_bn + cf * group + cs, k_c - 1), y, x]
            .astype(k_dtype),
            zero_k,
        ),
        name="kernel_pack", tag="dot_pack",
    )
    conv = packed(data_p, kernel_p)
    return te.compute(
        (batch, out_c, conv.shape[2], conv.shape[3]),
        lambda n, c, y, x: conv[n, c // oc_bn, y, x, c % oc_bn],
        name="conv_unpack", tag="injective,dot_unpack",
    )


def schedule_conv2d_nchw_dot(cfg, outs, mode: str = "llvm"):
    """Schedule :func:`conv2d_nchw_dot`: the packing stages, the conv, and the unpacked output.

    Examples
    --------
    >>> import tvm
    >>> from tvm import te, autotvm
    >>> d = te.placeholder((1, 3, 8, 8), "uint8"); k = te.placeholder((5, 3, 3, 3), "int8")
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     cfg = autotvm.get_config()
    ...     out = conv2d_nchw_dot(cfg, d, k, 1, 1, 1)
    ...     s = schedule_conv2d_nchw_dot(cfg, [out])
    >>> "vpdpbusd" in str(tvm.lower(s, [d, k, out]))  # tensorized with VNNI
    True
    """
    outs, conv = tagged_outputs(outs, TAG)
    if outs[0].op.name == REQUANTIZED:  # packed operands, an epilogue like a network's (measuring_packed_alone)
        return schedule_conv2d_nchwc_dot(cfg, outs, mode)
    # The conv is scheduled on its own (its output shape differs from the unpacked one).
    s = schedule_conv2d_nchwc_dot(cfg, [conv] + outs, mode)
    packs = [t for t in (_data_stages(conv.op.input_tensors[0])[2], conv.op.input_tensors[1]) if t.op.tag == "dot_pack"]
    for pack in packs:
        axes = s[pack].op.axis
        s[pack].parallel(s[pack].fuse(*axes[:3]))
        if mode == "llvm":
            s[pack].vectorize(axes[-1])
    final = outs[0]
    inline_between(s, outs, conv)
    n, c, y, x = s[final].op.axis
    s[final].parallel(s[final].fuse(n, c, y))
    return s
