"""Relay wiring of the int8 dot-product conv2d and dense (x86 VNNI / AVX2, Hexagon HVX).

For targets with a 4-way dot-product ISA (see :mod:`tvm_tcutils.dotprod.isa`) and
8-bit operands:

* ``FTVMLegalize`` (``nn.conv2d``, ``nn.dense``) makes the operands fit the
  instruction: an (i8, i8) pair the ISA lacks becomes (u8, i8) by adding 128
  to the data (an xor of the sign bit) and subtracting the compensation
  ``128 * sum(W)`` -- for conv2d, the kernel's sum over input channels
  windowed over the same padding / stride / dilation, computed as a small
  ``(O, KH*KW) x (KH*KW, OH*OW)`` product that constant folding evaluates once
  for a constant kernel (never a second convolution); channels are
  zero-padded to multiples of 4 (input) and of the lane count (output).
* ``FTVMAlterOpLayout`` turns those ops into ``contrib_conv2d_NCHWc`` with an
  ``OIHW{b/4}i{L}o4i`` kernel (on AVX2 ``OIHW{b/2}i{L}o2i``, cast to int16) and
  ``contrib_dense_pack`` with an ``NC{L}n4c`` weight; Relay inserts the layout
  transforms and folds them (and the cast) for constants.
* Both hooks decide per layer (:func:`layer_isa`): a constant int8 kernel whose
  values all lie in a reduce-range ISA's range (AVX2 without VNNI: [-64, 64], where
  ``vpmaddubsw`` cannot saturate on u8 data) gets that ISA, packed with its mark
  (``OIHW1h{b/4}i8o4i`` int8; dense: one zero quad more); every other kernel keeps
  the target's exact ISA.
* 8-bit constant pads of an image's rows (``NCHW``) on x86 get a row schedule
  (:mod:`.topi.pad`): 8-10x faster than TVM's; same compute.
* 8-bit ``layout_transform`` between ``NCHW`` and ``NCHW{b}c`` on x86 gets a
  byte-shuffle schedule (:mod:`..topi.dot_product.layout_transform`): the
  transforms at the edges of a run of packed convs move 2-4x faster. Same
  compute as TVM's, so same results; every other transform keeps TVM's.
* Strategy rows select the tensorized computes. They are *exclusive* for the
  8-bit cases they handle, because TVM's own x86 int8 path aborts LLVM 22 on
  VNNI targets and saturates (wrong results) on AVX2 ones.
* Every 8-bit ``nn.batch_matmul`` with int32 output on x86 (``qnn.batch_matmul``
  lowers to one) gets :mod:`.topi.batch_matmul`: tensorized for the dtype pairs
  the ISA multiplies, directly or with one operand's sign bit flipped (u8 x u8
  attention products on VNNI), exact plain int32 arithmetic for any other. TVM's
  legalization (i8 data to u8, padding) still runs before it.
* A u8 x i8 depthwise conv (``contrib_depthwise_conv2d_NCHWc``, as TVM's alter-layout hook makes it) on
  AVX-512 VNNI gets :mod:`.topi.depthwise`: each kernel row's taps gathered into one ``vpdpbusd``, two
  for rows of 5 to 8 taps (TVM's schedule multiplies tap by tap in int32); every other depthwise conv
  keeps TVM's.
* A u8 x u8 dense on VNNI keeps its plain layout: TVM's alteration would pack
  it for ``vpdpbusd``, which cannot multiply it, and no implementation takes
  the packed op.

* A grouped 8-bit conv (more than one input channel a group) gets the same kernel, each output chunk
  reducing its group's data chunks: legalization pads each group's channels (to 4 in, the lanes out)
  where that costs at most :data:`~.topi.conv2d_nchwc.MAX_GROUP_PADDING` times its multiply-adds
  (TVM's int8 grouped conv on x86 is a generic loop, 5-7x slower than OpenVINO's per layer).

Everything else (float, depthwise-like and heavily padded grouped convs, other layouts, targets without
an ISA) goes to TVM's own hooks unchanged.
"""
from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import numpy as np

from .._tvm import tvm
from tvm import autotvm, relay, te, topi
from tvm.relay.op import strategy as _strategy
from tvm.topi.nn.utils import get_pad_tuple
from tvm.topi.utils import get_const_tuple

from .. import registry
from .isa import DotProductISA, for_layer, for_target, range_isa, tile_isa
from .topi import (batch_matmul, batch_matmul_amx, conv2d_amx, conv2d_nchwc, dense_amx, dense_pack, depthwise,
                   injective, pool)
from .topi.conv2d_nchwc import ROW_QUAD, rows_kernel_layout
from .topi.layout_transform import byte_tile_plan, schedule_byte_layout_transform
from .topi.pad import row_pad_applies, schedule_row_pad
from .topi.packing import channel_block, conv_kernel_marked, dense_weight_marked, kernel_layout, round_up

#: Task names of the AutoTVM templates.
CONV2D_NCHWC_TASK = "tcutils.conv2d_nchwc_dot"
CONV2D_NCHW_TASK = "tcutils.conv2d_nchw_dot"
DENSE_PACK_TASK = "tcutils.dense_pack_dot"
DENSE_TASK = "tcutils.dense_dot"
DENSE_AMX_TASK = "tcutils.dense_pack_amx"
BATCH_MATMUL_AMX_TASK = "tcutils.batch_matmul_amx"
CONV2D_AMX_TASK = "tcutils.conv2d_nchwc_amx"
CONV2D_STEM_AMX_TASK = "tcutils.conv2d_stem_amx"
BATCH_MATMUL_TASK = "tcutils.batch_matmul_dot"
CONV2D_ROWS_TASK = "tcutils.conv2d_rows_dot"
GROUP_CONV2D_NCHWC_TASK = "tcutils.group_conv2d_nchwc_dot"
GROUP_CONV2D_NCHW_TASK = "tcutils.group_conv2d_nchw_dot"

#: Target keys whose hooks this module installs (a Hexagon target has both keys).
TARGET_KEYS = ("cpu", "hexagon")

_INT8 = ("int8", "uint8")

#: ISAs whose convs of few input channels take the row form (:func:`conv2d_nchwc.conv2d_rows_dot`), as
#: measured (ResNet-18's 7x7 RGB stem, one core: VNNI 709 -> 603 us, AVX2 x1.20); SSE and HVX pad
#: channels to 4.
ROWS_ISAS = frozenset({"x86_vnni", "x86_avx2"})


def layer_isa(data_dtype: str, kernel: relay.Expr, shift: bool = True) -> Optional[DotProductISA]:
    """The ISA for one conv2d / dense on the current target: a reduce-range ISA when ``kernel`` is a
    constant whose values it takes exactly (and it multiplies ``data_dtype`` data, or -- ``shift``,
    as legalization may -- the u8 data made of it), else the target's ISA.

    Examples
    --------
    >>> import numpy as np, tvm
    >>> with tvm.target.Target("llvm -mcpu=core-avx2"):
    ...     narrow = layer_isa("uint8", relay.const(np.full((8, 4), -64, "int8"))).name
    ...     wide = layer_isa("uint8", relay.const(np.full((8, 4), 127, "int8"))).name
    ...     unknown = layer_isa("uint8", relay.var("w", shape=(8, 4), dtype="int8")).name
    >>> narrow, wide, unknown
    ('x86_avx2_u8s7', 'x86_avx2', 'x86_avx2')
    """
    target = tvm.target.Target.current(allow_none=True)
    checkable = isinstance(kernel, relay.Constant) and kernel.data.dtype == "int8" and range_isa(target)
    isa = for_layer(target, kernel.data.numpy() if checkable else None)
    if isa is not None and isa.kernel_range is not None:
        fits = _legal_pair(isa, str(data_dtype), "int8") if shift else isa.variant(str(data_dtype), "int8")
        if fits is None:
            return for_target(target)
    return isa


def _static(shape) -> Optional[Tuple[int, ...]]:
    try:
        return tuple(int(x) for x in shape)
    except (TypeError, ValueError):
        return None


def _int8_pair(data_dtype, kernel_dtype, out_dtype) -> bool:
    return str(data_dtype) in _INT8 and str(kernel_dtype) in _INT8 and str(out_dtype) == "int32"


# --------------------------------------------------------------------------
# Legalize
# --------------------------------------------------------------------------
def _shift_to_uint8(data: relay.Expr) -> relay.Expr:
    """int8 -> uint8 holding ``value + 128`` (flipping the sign bit)."""
    return relay.bitwise_xor(relay.reinterpret(data, "uint8"), relay.const(128, "uint8"))


def _legal_pair(isa: DotProductISA, data_dtype: str, kernel_dtype: str) -> Optional[Tuple[str, bool]]:
    """(data dtype to use, shift data by 128?) for an operand pair, or None if unsupported."""
    if isa.variant(data_dtype, kernel_dtype) is not None:
        return data_dtype, False
    if data_dtype == "int8" and isa.variant("uint8", kernel_dtype) is not None:
        return "uint8", True
    return None


def window_mask(size: int, kernel: int, stride: int, dilation: int, pad_before: int, out: int) -> np.ndarray:
    """``mask[k, o] = 1`` where kernel tap ``k`` of output ``o`` reads inside the (unpadded) input.

    Examples
    --------
    >>> window_mask(4, 3, 1, 1, 1, 4).astype(int).tolist()
    [[0, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0]]
    """
    pos = np.arange(out)[None, :] * stride - pad_before + np.arange(kernel)[:, None] * dilation
    return ((pos >= 0) & (pos < size)).astype("int32")


def _conv_compensation(kernel: relay.Expr, k_shape, in_hw, out_hw, attrs, pads) -> relay.Expr:
    """``128 * windowed sum of the kernel``: the term shifting the data by 128 adds, (1, O, OH, OW)."""
    out_c, _, k_h, k_w = k_shape
    (s_h, s_w), (d_h, d_w) = get_const_tuple(attrs.strides), get_const_tuple(attrs.dilation)
    rows = window_mask(in_hw[0], k_h, s_h, d_h, pads[0], out_hw[0])  # (KH, OH)
    cols = window_mask(in_hw[1], k_w, s_w, d_w, pads[1], out_hw[1])  # (KW, OW)
    taps = np.einsum("ky,lx->yxkl", rows, cols).reshape(out_hw[0] * out_hw[1], k_h * k_w)
    if isinstance(kernel, relay.Constant):
        k_sum = kernel.data.numpy().astype("int64").sum(axis=1).reshape(out_c, k_h * k_w)
        comp = (128 * k_sum @ taps.T.astype("int64")).astype("int32")
        return relay.const(comp.reshape(1, out_c, out_hw[0], out_hw[1]))
    k_sum = relay.sum(relay.cast(kernel, "int32"), axis=[1])  # (O, KH, KW)
    comp = relay.nn.dense(relay.reshape(k_sum, (out_c, k_h * k_w)), relay.const(taps), out_dtype="int32")
    return relay.reshape(relay.multiply(comp, relay.const(128, "int32")), (1, out_c, out_hw[0], out_hw[1]))


def _legal_plan(types, kernel) -> Optional[Tuple[DotProductISA, bool, List[Tuple[int, ...]]]]:
    """(ISA, shift data by 128?, static shapes) for an 8-bit op on the current target, or None."""
    isa = layer_isa(types[0].dtype, kernel)
    if isa is None or not _int8_pair(types[0].dtype, types[1].dtype, types[-1].dtype):
        return None
    shapes = [_static(t.shape) for t in types]
    pair = _legal_pair(isa, types[0].dtype, types[1].dtype)
    if None in shapes or pair is None:
        return None
    return isa, pair[1], shapes


def legalize_conv2d(attrs, inputs, types) -> Optional[relay.Expr]:
    """Fit an 8-bit NCHW conv2d to the target's dot-product instruction (dtype shift, channel padding; a
    grouped conv's per group)."""
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    plan = _legal_plan(types, inputs[1])
    if plan is None or attrs.out_layout not in ("", "NCHW"):
        return None
    isa, shift, (d_shape, k_shape, o_shape) = plan
    data, kernel = inputs
    if attrs.groups != 1:
        if not conv2d_nchwc.group_padding_pays(isa, d_shape[1], k_shape[0], int(attrs.groups)):
            return None
        new_data = _shift_to_uint8(data) if shift else data
        out = _group_padded(attrs, new_data, kernel, d_shape, k_shape, o_shape, isa.lanes)
        return relay.subtract(out, _conv_compensation(kernel, k_shape, d_shape[2:], o_shape[2:], attrs,
                                                      _pair_pads(attrs))) if shift else out
    chans, out_c = d_shape[1], k_shape[0]
    chans_p, out_p = round_up(chans, 4), round_up(out_c, isa.lanes)
    new_data = _shift_to_uint8(data) if shift else data
    new_kernel = kernel
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    data_dtype = "uint8" if shift else str(types[0].dtype)
    if _stem_on_tiles(attrs, d_shape, k_shape, str(types[1].dtype), data_dtype):
        out = _stem_form(attrs, new_data, new_kernel, d_shape, k_shape, o_shape)
        return relay.subtract(out, _conv_compensation(kernel, k_shape, d_shape[2:], o_shape[2:], attrs,
                                                      _pair_pads(attrs))) if shift else out
    if _takes_rows(attrs, isa, d_shape, k_shape):
        new_data, new_kernel, rows_attrs, rows_shape = _rows_form(attrs, new_data, new_kernel, d_shape, k_shape,
                                                                  o_shape)
        new_attrs.update(rows_attrs)
        _carry_tuned_config(*_rows_tasks(attrs, isa, data_dtype, str(types[1].dtype), d_shape, k_shape, out_p,
                                         rows_shape))
    elif chans_p != chans:
        if _rows_shapes(attrs, isa, d_shape, k_shape) and _extracting():
            # AutoTVM extracts with AlterOpLayout off, so this stem is padded here; a build packs it in the
            # row form, so that is the task to tune.
            rows_shape = _rows_form(attrs, new_data, new_kernel, d_shape, k_shape, o_shape)[3]
            _trace_rows_task(*_rows_tasks(attrs, isa, data_dtype, str(types[1].dtype), d_shape, k_shape, out_p,
                                          rows_shape))
        new_data = relay.nn.pad(new_data, ((0, 0), (0, chans_p - chans), (0, 0), (0, 0)))
        new_kernel = relay.nn.pad(new_kernel, ((0, 0), (0, chans_p - chans), (0, 0), (0, 0)))
    if out_p != out_c:
        new_kernel = relay.nn.pad(new_kernel, ((0, out_p - out_c), (0, 0), (0, 0), (0, 0)))
    new_attrs["channels"] = out_p
    new_attrs["out_dtype"] = "int32"
    out = relay.nn.conv2d(new_data, new_kernel, **new_attrs)
    if out_p != out_c:
        out = relay.strided_slice(out, begin=(0, 0, 0, 0), end=(o_shape[0], out_c, o_shape[2], o_shape[3]))
    if shift:
        out = relay.subtract(out, _conv_compensation(kernel, k_shape, d_shape[2:], o_shape[2:], attrs,
                                                     _pair_pads(attrs)))
    return out


def _group_padded(attrs, data: relay.Expr, kernel: relay.Expr, d_shape, k_shape, o_shape, lanes: int) -> relay.Expr:
    """The grouped conv2d (int32 out) with each group's input channels zero-padded to a multiple of 4 and
    its output channels to one of ``lanes``, the padded outputs sliced off again: exact (the added channels
    are zeros), and what :func:`~.topi.conv2d_nchwc.group_conv2d_nchwc_dot` packs."""
    groups = int(attrs.groups)
    (n, _, h, w), (o, cpg, k_h, k_w) = d_shape, k_shape
    opg = o // groups
    cpg_p, opg_p = round_up(cpg, 4), round_up(opg, lanes)
    if cpg_p != cpg:
        data = relay.reshape(data, (n, groups, cpg, h, w))
        data = relay.reshape(relay.nn.pad(data, ((0, 0), (0, 0), (0, cpg_p - cpg), (0, 0), (0, 0))),
                             (n, groups * cpg_p, h, w))
    if (cpg_p, opg_p) != (cpg, opg):
        kernel = relay.reshape(kernel, (groups, opg, cpg, k_h, k_w))
        kernel = relay.nn.pad(kernel, ((0, 0), (0, opg_p - opg), (0, cpg_p - cpg), (0, 0), (0, 0)))
        kernel = relay.reshape(kernel, (groups * opg_p, cpg_p, k_h, k_w))
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(channels=groups * opg_p, out_dtype="int32")
    out = relay.nn.conv2d(data, kernel, **new_attrs)
    if opg_p != opg:
        out = relay.reshape(out, (n, groups, opg_p, *o_shape[2:]))
        out = relay.strided_slice(out, begin=(0, 0, 0, 0, 0), end=(n, groups, opg, *o_shape[2:]))
        out = relay.reshape(out, o_shape)
    return out


def _pair_pads(attrs) -> Tuple[int, int]:
    pad = get_const_tuple(attrs.padding)
    return (pad[0], pad[1] if len(pad) > 1 else pad[0])


def _stem_on_tiles(attrs, d_shape, k_shape, kernel_dtype: str, data_dtype: str) -> bool:
    """Whether a few-channel conv (an RGB stem) goes to the tile engine's stem form
    (:func:`~.topi.conv2d_amx.conv2d_stem_amx`): a target with tiles, a build that alters layouts, at most
    4 channels, kernel rows of at most 16 taps, whole 64-channel output blocks, no dilation."""
    engine = tile_isa(tvm.target.Target.current(allow_none=True))
    if engine is None or not _alter_layout_runs() or engine.variant(data_dtype, kernel_dtype) is None:
        return False
    return (d_shape[1] <= conv2d_amx.STEM_CHANNELS and k_shape[3] <= conv2d_amx.stem_taps(engine)
            and k_shape[0] % engine.row_bytes == 0 and get_const_tuple(attrs.dilation) == (1, 1))


def _stem_form(attrs, data: relay.Expr, kernel: relay.Expr, d_shape, k_shape, o_shape) -> relay.Expr:
    """The same conv2d (NCHW out) on ``NHWC`` data of 4 channels padded to whole tile rows and a kernel whose
    rows are zero-padded to a tile row of taps (``OHWI``, ``(O, KH, 16, 4)``): exact, the added taps and
    channels are zeros. The alter-layout hook then blocks the kernel by 64 output channels."""
    engine = tile_isa(tvm.target.Target.current(allow_none=True))
    taps, chans = conv2d_amx.stem_taps(engine), conv2d_amx.STEM_CHANNELS
    (n, c, h, w), (o, _, k_h, k_w) = d_shape, k_shape
    s_w = get_const_tuple(attrs.strides)[1]
    top, left, bottom, right = get_pad_tuple(get_const_tuple(attrs.padding), (k_h, k_w))
    # Columns the last output pixel's tile row reads (past the image: zero taps), and the padded width.
    need, have = (o_shape[3] - 1) * s_w + taps, w + left + right
    # Padded as planes, then interleaved by the byte layout transform (NCHW4c of one block is NHWC): a plain
    # transpose gathers a byte at a time (98 us for ResNet-50's image, 3x the conv's own epilogue).
    x = relay.nn.pad(data, ((0, 0), (0, chans - c), (top, bottom), (left, right + max(0, need - have))))
    if have > need:
        x = relay.strided_slice(x, begin=(0, 0, 0, 0), end=(n, chans, h + top + bottom, need))
    x = relay.layout_transform(x, "NCHW", f"NCHW{chans}c")
    x = relay.reshape(x, (n, h + top + bottom, min(need, have + max(0, need - have)), chans))
    kern = relay.transpose(relay.nn.pad(kernel, ((0, 0), (0, chans - c), (0, 0), (0, taps - k_w))), (0, 2, 3, 1))
    return relay.nn.conv2d(x, kern, strides=attrs.strides, padding=(0, 0, 0, 0), channels=o,
                           kernel_size=(k_h, taps), data_layout="NHWC", kernel_layout="OHWI", out_layout="NCHW",
                           out_dtype="int32")


def _alter_layout_runs() -> bool:
    """Whether the current build runs ``AlterOpLayout`` (opt_level 3, not disabled)."""
    ctx = tvm.transform.PassContext.current()
    return ctx.opt_level >= 3 and "AlterOpLayout" not in [str(name) for name in ctx.disabled_pass]


def _rows_shapes(attrs, isa: DotProductISA, d_shape, k_shape) -> bool:
    """Whether a legal conv2d of few input channels is cheaper in the row form (fewer dot products)."""
    chans, (_, _, _, k_w) = d_shape[1], k_shape
    return (
        isa.name in ROWS_ISAS and chans % 4 != 0 and get_const_tuple(attrs.dilation) == (1, 1)
        and chans * round_up(k_w, ROW_QUAD) < round_up(chans, 4) * k_w
    )


def _takes_rows(attrs, isa: DotProductISA, d_shape, k_shape) -> bool:
    """:func:`_rows_shapes`, where the alter-layout hook will pack it (else the channel-blocked path pads the
    channels)."""
    return _rows_shapes(attrs, isa, d_shape, k_shape) and _alter_layout_runs()


def _extracting() -> bool:
    """Whether AutoTVM is extracting tuning tasks (its ``TaskExtractEnv`` traces the computes)."""
    env = autotvm.task.TaskExtractEnv.current
    return env is not None and env.tracing


#: ``(task list, workloads)``: the padded stems whose row form :func:`_trace_rows_task` added to that
#: extraction's task list (an extraction starts a new list, which ends the entry).
_STAND_INS: list = [None, set()]


def _trace_rows_task(old_task: str, old_args, new_task: str, new_args) -> None:
    """Put a stem's row form into the tasks being extracted, in place of its padded conv.

    The padded conv's own task is added later, when its compute is traced; :func:`_drop_stand_ins`
    takes it out again. Tuned, the row form is what the build runs: a config tuned on the padded conv
    and carried over (:func:`_carry_tuned_config`, kept for such logs) made ResNet-18's AVX2 stem 15 %
    slower (docs/benchmarks/dotprod.md).
    """
    env = autotvm.task.TaskExtractEnv.current
    if _STAND_INS[0] is not env.task_collection:
        _STAND_INS[:] = [env.task_collection, set()]
    _STAND_INS[1].add(autotvm.task.args_to_workload(old_args, old_task))
    env.add_task(new_task, new_args)


def _drop_stand_ins() -> None:
    """Take the padded stems of :func:`_trace_rows_task` out of the tasks being extracted."""
    env = autotvm.task.TaskExtractEnv.current
    if env is None or not env.tracing or _STAND_INS[0] is not env.task_collection or not _STAND_INS[1]:
        return
    env.task_collection[:] = [key for key in env.task_collection if (key[0], *key[1]) not in _STAND_INS[1]]


def _rows_form(attrs, data: relay.Expr, kernel: relay.Expr, d_shape, k_shape, o_shape):
    """``(data, kernel, attrs, data shape)`` of the same conv2d with its padding made explicit and its kernel
    rows zero-padded to whole quads (:func:`~.topi.conv2d_nchwc.conv2d_rows_dot`). Exact: same products."""
    width, (_, _, k_h, k_w) = d_shape[3], k_shape
    s_w = get_const_tuple(attrs.strides)[1]
    top, left, bottom, right = get_pad_tuple(get_const_tuple(attrs.padding), (k_h, k_w))
    taps = round_up(k_w, ROW_QUAD)
    # Columns the last output's quads read (past the last pixel: zero taps), and the padded width.
    need, have = (o_shape[3] - 1) * s_w + taps, width + left + right
    right += max(0, need - have)
    if top or left or bottom or right:
        data = relay.nn.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right)))
    if have > need:  # columns no output reads would add an output column
        data = relay.strided_slice(data, begin=(0, 0, 0, 0), end=(*d_shape[:2], d_shape[2] + top + bottom, need))
    kernel = relay.nn.pad(kernel, ((0, 0), (0, 0), (0, 0), (0, taps - k_w)))
    shape = (*d_shape[:2], d_shape[2] + top + bottom, need)
    return data, kernel, {"padding": (0, 0, 0, 0), "kernel_size": (k_h, taps)}, shape


def legalize_dense(attrs, inputs, types) -> Optional[relay.Expr]:
    """Fit an 8-bit dense to the target's dot-product instruction (dtype shift, K / N padding)."""
    plan = _legal_plan(types, inputs[1])
    if plan is None or len(plan[2][0]) != 2:
        return None
    isa, shift, (d_shape, w_shape, _) = plan
    data, weight = inputs
    (k, (n, _)) = d_shape[1], w_shape
    k_p, n_p = round_up(k, 4), round_up(n, isa.lanes)
    new_data = _shift_to_uint8(data) if shift else data
    new_weight = weight
    if k_p != k:
        new_data = relay.nn.pad(new_data, ((0, 0), (0, k_p - k)))
        new_weight = relay.nn.pad(new_weight, ((0, 0), (0, k_p - k)))
    if n_p != n:
        new_weight = relay.nn.pad(new_weight, ((0, n_p - n), (0, 0)))
    out = relay.nn.dense(new_data, new_weight, units=n_p, out_dtype="int32")
    if n_p != n:
        out = relay.strided_slice(out, begin=(0, 0), end=(d_shape[0], n))
    if shift:
        if isinstance(weight, relay.Constant):
            comp = relay.const((128 * weight.data.numpy().astype("int64").sum(axis=1)).astype("int32"))
        else:
            comp = relay.multiply(relay.sum(relay.cast(weight, "int32"), axis=[1]), relay.const(128, "int32"))
        out = relay.subtract(out, comp)
    return out


# --------------------------------------------------------------------------
# Alter op layout
# --------------------------------------------------------------------------
def _legal_conv_shapes(attrs, types, isa) -> Optional[Tuple[Tuple[int, ...], Tuple[int, ...]]]:
    """(data, kernel) static shapes of an (already legal) plain NCHW 8-bit conv2d the ISA multiplies."""
    data_t, kernel_t = types[0], types[1]
    if isa is None or not _int8_pair(data_t.dtype, kernel_t.dtype, types[2].dtype):
        return None
    if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    if isa.variant(data_t.dtype, kernel_t.dtype) is None or attrs.out_layout not in ("", "NCHW"):
        return None
    d_shape, k_shape = _static(data_t.shape), _static(kernel_t.shape)
    if d_shape is None or k_shape is None or not _groups_fit(isa, int(attrs.groups), k_shape):
        return None
    return d_shape, k_shape


def _groups_fit(isa: DotProductISA, groups: int, k_shape) -> bool:
    """Whether a legal conv2d's groups are whole dot products: every group's output channels a multiple of
    the lanes, and (groups > 1) its input channels of 4 (as :func:`_group_padded` makes them)."""
    if groups == 1:
        return k_shape[0] % isa.lanes == 0
    return k_shape[0] % (groups * isa.lanes) == 0 and k_shape[1] % 4 == 0 and k_shape[1] > 1


def _packable_conv(attrs, types, isa) -> Optional[Tuple[int, int]]:
    """(ic_bn, oc_bn) when an (already legal) conv2d goes to the packed compute (a grouped one: blocks of
    its groups' channels)."""
    shapes = _legal_conv_shapes(attrs, types, isa)
    if shapes is None or shapes[1][1] % 4:
        return None
    return channel_block(shapes[1][1], isa.lanes), isa.lanes


def _stem_blocks(attrs, inputs, types) -> Optional[relay.Expr]:
    """The stem form of :func:`_stem_form` with its kernel blocked by 64 output channels and its output
    ``NCHW64c`` (:func:`~.topi.conv2d_amx.stem_layouts`), where the target has the tile engine."""
    engine = tile_isa(tvm.target.Target.current(allow_none=True))
    k_shape = _static(types[1].shape)
    if engine is None or k_shape is None or len(k_shape) != 4 or engine.variant(types[0].dtype, types[1].dtype) is None:
        return None
    if k_shape[2:] != (conv2d_amx.stem_taps(engine), conv2d_amx.STEM_CHANNELS) or k_shape[0] % engine.row_bytes:
        return None
    _, kernel_layout_, out_layout = conv2d_amx.stem_layouts(engine)
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(kernel_layout=kernel_layout_, out_layout=out_layout)
    return relay.nn.conv2d(inputs[0], inputs[1], **new_attrs)


def _tile_conv(attrs, types, isa):
    """``inputs -> contrib_conv2d_NCHWc`` in the tile conv's layouts (:mod:`.topi.conv2d_amx`) where the
    target has a tile engine that takes this (already legal) conv2d; else None."""
    shapes = _legal_conv_shapes(attrs, types, isa)
    engine = tile_isa(tvm.target.Target.current(allow_none=True))
    if shapes is None or engine is None or isa.kernel_range is not None:
        return None
    (_, c, _, _), (o, _, _, _) = shapes
    if conv2d_amx.applicable(engine, c, o, attrs.groups, get_const_tuple(attrs.dilation), str(types[0].dtype),
                             str(types[1].dtype)):
        return None
    data_layout, kernel_layout_, out_layout = conv2d_amx.layouts(engine)
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(data_layout=data_layout, kernel_layout=kernel_layout_, out_layout=out_layout, out_dtype="int32")
    return lambda inputs: relay.nn.contrib_conv2d_nchwc(inputs[0], inputs[1], **new_attrs)


def _packable_rows(attrs, types, isa) -> bool:
    """Whether an (already legal) conv2d is one :func:`_rows_form` made (channels not a multiple of 4)."""
    shapes = None if isa is None or isa.name not in ROWS_ISAS else _legal_conv_shapes(attrs, types, isa)
    return (
        shapes is not None and attrs.groups == 1 and shapes[0][1] % 4 != 0 and shapes[1][3] % ROW_QUAD == 0
        and not any(get_const_tuple(attrs.padding)) and get_const_tuple(attrs.dilation) == (1, 1)
    )


def _carry_tuned_config(old_task: str, old_args, new_task: str, new_args) -> None:
    """Make a tuned config of the unpacked op's task apply to the packed op it became, unless the packed
    op has a record of its own.

    AutoTVM extracts and tunes tasks with AlterOpLayout disabled (the
    unpacked ops); both templates define the same knobs, so the best config
    found for the unpacked workload is registered for the packed one.
    """
    target = tvm.target.Target.current(allow_none=True)
    dispatch = autotvm.task.DispatchContext.current
    if target is None or dispatch is None or isinstance(dispatch, autotvm.task.FallbackContext):
        return  # no tuning records: nothing to carry (and no "cannot find config" warning)
    new = autotvm.task.args_to_workload(new_args, new_task)
    if not dispatch.query(target, new).is_fallback:
        return  # tuned as it is built (a stem's row form, since the tasks have it)
    cfg = dispatch.query(target, autotvm.task.args_to_workload(old_args, old_task))
    if not cfg.is_fallback:
        dispatch.update(target, new, cfg)


def _rows_tasks(attrs, isa: DotProductISA, data_dtype: str, kernel_dtype: str, d_shape, k_shape, out_p: int,
                rows_data_shape) -> tuple:
    """``(task, args, task, args)``: a stem's channel-padded conv and its row form, as AutoTVM names them.

    The padded conv is what AutoTVM extracted before the row form was (AlterOpLayout is off when it
    extracts, where a stem keeps its channels padded to 4); its tuned config carries to the row form,
    which has the same output and knobs (``data_dtype``: the legal data's, after any shift to u8).
    """
    (n, chans, height, width), (_, _, k_h, k_w) = d_shape, k_shape
    chans_p, taps = round_up(chans, 4), round_up(k_w, ROW_QUAD)
    k_dtype = isa.conv_kernel_dtype(kernel_dtype)
    group = isa.kernel_group(k_dtype)
    strides, padding, dilation = (get_const_tuple(attrs[key]) for key in ("strides", "padding", "dilation"))
    return (
        CONV2D_NCHW_TASK, [te.placeholder((n, chans_p, height, width), data_dtype),
                           te.placeholder((out_p, chans_p, k_h, k_w), kernel_dtype),
                           strides, padding, dilation, "int32"],
        CONV2D_ROWS_TASK, [te.placeholder(rows_data_shape, data_dtype),
                           te.placeholder((out_p // isa.lanes, chans, k_h, taps // group, isa.lanes, group), k_dtype),
                           strides, (0, 0, 0, 0), dilation, "int32"],
    )


def _placeholder(tensor_type, shape=None):
    return te.placeholder(shape or _static(tensor_type.shape), dtype=str(tensor_type.dtype))


def alter_conv2d(attrs, inputs, types, out_type) -> Optional[relay.Expr]:
    """Turn a legal 8-bit conv2d into ``contrib_conv2d_NCHWc`` with a dot-product kernel layout (one in
    the row form: ``conv2d`` with a :func:`~.topi.conv2d_nchwc.rows_kernel_layout` kernel)."""
    if attrs.data_layout == "NHWC" and attrs.kernel_layout == "OHWI" and attrs.out_layout == "NCHW":
        return _stem_blocks(attrs, inputs, types)
    isa = layer_isa(types[0].dtype, inputs[1], shift=False)  # legalization is over: the pair must be native
    if _packable_rows(attrs, list(types) + [out_type], isa):
        k_dtype = isa.conv_kernel_dtype(types[1].dtype)
        new_attrs = {key: attrs[key] for key in attrs.keys()}
        new_attrs.update(kernel_layout=rows_kernel_layout(isa.lanes, isa.kernel_group(k_dtype)),
                         out_layout=f"NCHW{isa.lanes}c", out_dtype="int32")
        # Widened here (AVX2), the cast folds with the kernel's layout transform, which Relay inserts.
        kernel = inputs[1] if k_dtype == str(types[1].dtype) else relay.cast(inputs[1], k_dtype)
        return relay.nn.conv2d(inputs[0], kernel, **new_attrs)
    tiled = _tile_conv(attrs, list(types) + [out_type], isa)
    if tiled is not None:
        return tiled(inputs)
    blocks = _packable_conv(attrs, list(types) + [out_type], isa)
    if blocks is None:
        return None
    ic_bn, oc_bn = blocks
    k_dtype = isa.conv_kernel_dtype(types[1].dtype)
    group = isa.kernel_group(k_dtype)
    marked = isa.kernel_range is not None
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(
        data_layout=f"NCHW{ic_bn}c",
        kernel_layout=kernel_layout(ic_bn, oc_bn, group, marked),
        out_layout=f"NCHW{oc_bn}c",
        out_dtype="int32",
    )
    (n, c, h, w), (o, cpg, kh, kw) = _static(types[0].shape), _static(types[1].shape)
    conv_args = [get_const_tuple(attrs[key]) for key in ("strides", "padding", "dilation")]
    groups = [int(attrs.groups)] if attrs.groups != 1 else []  # the grouped tasks' argument
    _carry_tuned_config(
        GROUP_CONV2D_NCHW_TASK if groups else CONV2D_NCHW_TASK,
        [_placeholder(types[0]), _placeholder(types[1]), *conv_args, *groups, "int32"],
        GROUP_CONV2D_NCHWC_TASK if groups else CONV2D_NCHWC_TASK, [
            _placeholder(types[0], (n, c // ic_bn, h, w, ic_bn)),
            te.placeholder((o // oc_bn, cpg // ic_bn, kh, kw) + (1,) * marked + (ic_bn // group, oc_bn, group),
                           dtype=k_dtype),
            *conv_args, *groups, new_attrs["data_layout"], new_attrs["out_layout"], "int32",
        ],
    )
    data, kernel = inputs
    if k_dtype != str(types[1].dtype):
        # Widened here, the cast folds with the kernel's layout transform into one constant.
        kernel = relay.cast(kernel, k_dtype)
    return relay.nn.contrib_conv2d_nchwc(data, kernel, **new_attrs)


def _unchanged_dense(attrs, inputs) -> relay.Expr:
    return relay.nn.dense(inputs[0], inputs[1], units=attrs.units, out_dtype=attrs.out_dtype)


def alter_dense(attrs, inputs, types, out_type) -> Optional[relay.Expr]:
    """Turn a legal 8-bit dense into ``contrib_dense_pack`` with an ``NC{L}n4c`` weight."""
    data_t, weight_t = types
    isa = layer_isa(data_t.dtype, inputs[1], shift=False)
    if isa is None or not _int8_pair(data_t.dtype, weight_t.dtype, out_type.dtype):
        return None
    if isa.variant(data_t.dtype, weight_t.dtype) is None:
        # TVM's own alteration would pack a u8 x u8 weight NC16n4c for an instruction that cannot
        # multiply it (and no implementation takes the result): the dense stays as it is.
        return _unchanged_dense(attrs, inputs) if isa.name.startswith("x86") else None
    w_shape = _static(weight_t.shape)
    if w_shape is None or w_shape[0] % isa.lanes or w_shape[1] % 4 or len(data_t.shape) != 2:
        return None
    n, k = w_shape
    marked = isa.kernel_range is not None
    _carry_tuned_config(
        DENSE_TASK, [_placeholder(data_t), _placeholder(weight_t), None, "int32"],
        DENSE_PACK_TASK,
        [_placeholder(data_t), _placeholder(weight_t, (n // isa.lanes, k // 4 + marked, isa.lanes, 4)), None,
         "int32"],
    )
    # The mark of a checked reduce-range weight: one zero quad more (folded into the packed constant).
    weight = relay.nn.pad(inputs[1], ((0, 0), (0, 4))) if marked else inputs[1]
    return relay.nn.contrib_dense_pack(inputs[0], weight, f"NC{isa.lanes}n4c", None, "int32")


# --------------------------------------------------------------------------
# Strategy rows
# --------------------------------------------------------------------------
def _tensor_isa(target, data, kernel, out_dtype, widened: bool = False,
                reduce_range: bool = False) -> Optional[DotProductISA]:
    isa = range_isa(target) if reduce_range else for_target(target)
    # ``widened``: the kernel may also be a conv2d kernel packed in the ISA's wide dtype.
    k_dtype = "int8" if widened and isa is not None and str(kernel.dtype) == isa.wide_kernel else kernel.dtype
    if isa is None or not _int8_pair(data.dtype, k_dtype, out_dtype):
        return None
    if isa.variant(data.dtype, kernel.dtype) is None:
        return None
    if _static(data.shape) is None or _static(kernel.shape) is None:
        return None
    return isa


def _applies_conv2d_nchwc(attrs, inputs, out_type, target, reduce_range: bool = False,
                          grouped: bool = False) -> bool:
    isa = _tensor_isa(target, inputs[0], inputs[1], out_type.dtype, widened=True, reduce_range=reduce_range)
    if isa is None or (attrs.groups != 1) != grouped or len(inputs[0].shape) != 5:
        return False
    if _applies_conv2d_amx(attrs, inputs, out_type, target):
        return False  # tiles alone (note at _applies_dense_amx)
    if conv_kernel_marked(_static(inputs[1].shape)) != reduce_range or len(inputs[1].shape) != 7 + reduce_range:
        return False
    try:
        _, oc_bn = conv2d_nchwc.conv2d_nchwc_shapes(
            _static(inputs[0].shape), _static(inputs[1].shape), isa.kernel_group(inputs[1].dtype), int(attrs.groups)
        )
    except ValueError:
        return False
    return oc_bn % isa.lanes == 0


def _applies_group_conv2d_nchwc(attrs, inputs, out_type, target) -> bool:
    # Either ISA the alter-layout hook packs for (a marked kernel: the reduce-range one).
    return any(_applies_conv2d_nchwc(attrs, inputs, out_type, target, reduce_range, grouped=True)
               for reduce_range in (False, True))


def _applies_conv2d_amx(attrs, inputs, out_type, target) -> bool:
    engine = tile_isa(target)
    if engine is None or not _int8_pair(inputs[0].dtype, inputs[1].dtype, out_type.dtype):
        return False
    d_shape, k_shape = _static(inputs[0].shape), _static(inputs[1].shape)
    if d_shape is None or k_shape is None or len(d_shape) != 5 or len(k_shape) != 7:
        return False
    block = engine.row_bytes
    return (d_shape[4] == block and k_shape[4:] == (block // engine.reduce, block, engine.reduce)
            and attrs.data_layout == conv2d_amx.layouts(engine)[0]
            and not conv2d_amx.applicable(engine, d_shape[1] * block, k_shape[0] * block, attrs.groups,
                                          get_const_tuple(attrs.dilation), str(inputs[0].dtype),
                                          str(inputs[1].dtype)))


def _applies_conv2d_stem_amx(attrs, inputs, out_type, target) -> bool:
    engine = tile_isa(target)
    if engine is None or not _int8_pair(inputs[0].dtype, inputs[1].dtype, out_type.dtype):
        return False
    if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != conv2d_amx.stem_layouts(engine):
        return False
    d_shape, k_shape = _static(inputs[0].shape), _static(inputs[1].shape)
    taps, chans = conv2d_amx.stem_taps(engine), conv2d_amx.STEM_CHANNELS
    return (d_shape is not None and k_shape is not None and len(d_shape) == 4 and d_shape[3] == chans
            and len(k_shape) == 5 and k_shape[2:] == (taps, engine.row_bytes, chans)
            and engine.variant(inputs[0].dtype, inputs[1].dtype) is not None
            and get_const_tuple(attrs.dilation) == (1, 1) and not any(get_const_tuple(attrs.padding)))


def _applies_conv2d(attrs, inputs, out_type, target, grouped: bool = False) -> bool:
    isa = _tensor_isa(target, inputs[0], inputs[1], out_type.dtype)
    if isa is None or (attrs.groups != 1) != grouped or len(inputs[0].shape) != 4:
        return False
    return (attrs.data_layout == "NCHW" and attrs.kernel_layout == "OIHW"
            and (not grouped or _groups_fit(isa, int(attrs.groups), _static(inputs[1].shape))))


def _applies_conv2d_rows(attrs, inputs, out_type, target) -> bool:
    isa = _tensor_isa(target, inputs[0], inputs[1], out_type.dtype, widened=True)
    return (
        isa is not None and isa.name in ROWS_ISAS and attrs.groups == 1 and attrs.data_layout == "NCHW"
        and attrs.kernel_layout == rows_kernel_layout(isa.lanes, isa.kernel_group(inputs[1].dtype))
        and attrs.out_layout == f"NCHW{isa.lanes}c"
        and len(inputs[0].shape) == 4 and len(inputs[1].shape) == 6
        and not any(get_const_tuple(attrs.padding)) and get_const_tuple(attrs.dilation) == (1, 1)
    )


def _applies_dense_pack(attrs, inputs, out_type, target, reduce_range: bool = False) -> bool:
    isa = _tensor_isa(target, inputs[0], inputs[1], out_type.dtype, reduce_range=reduce_range)
    if isa is None or len(inputs[1].shape) != 4 or len(inputs[0].shape) != 2:
        return False
    if _applies_dense_amx(attrs, inputs, out_type, target):
        return False  # tiles alone (note at _applies_dense_amx)
    w_shape, k = _static(inputs[1].shape), int(inputs[0].shape[1])
    if k % 4 or dense_weight_marked(w_shape, k) != reduce_range:
        return False
    return w_shape[3] == 4 and w_shape[2] % isa.lanes == 0 and w_shape[1] * 4 == k + 4 * reduce_range


# Where a tile row applies, the vector row of the same op does not: TVM picks an implementation that has a
# tuned record over the highest ``plevel``, so a log of VNNI records (what AutoTVM extracts and the layout
# hooks carry, with AlterOpLayout off) would otherwise send every tile op back to VNNI, 2-4x slower.
def _applies_dense_amx(attrs, inputs, out_type, target) -> bool:
    # The packed weight of the target's vector row (NC16n4c) is also the tile kernels' B layout.
    if len(inputs[0].shape) != 2 or not _int8_pair(inputs[0].dtype, inputs[1].dtype, out_type.dtype):
        return False
    d_shape, w_shape = _static(inputs[0].shape), _static(inputs[1].shape)
    if d_shape is None or w_shape is None:
        return False
    return not dense_amx.applicable(tile_isa(target), d_shape[0], d_shape[1], w_shape, str(inputs[0].dtype),
                                    str(inputs[1].dtype))


def _applies_dense(attrs, inputs, out_type, target) -> bool:
    isa = _tensor_isa(target, inputs[0], inputs[1], out_type.dtype)
    return isa is not None and len(inputs[0].shape) == 2 and len(inputs[1].shape) == 2


def _int8_batch_matmul_isa(inputs, out_type, target) -> Optional[DotProductISA]:
    """The x86 ISA of an 8-bit, int32-out, static-shape ``nn.batch_matmul`` TVM would mis-compile, or None."""
    if not _x86_kernels(target) or not _int8_pair(inputs[0].dtype, inputs[1].dtype, out_type.dtype):
        return None
    if _static(inputs[0].shape) is None or _static(inputs[1].shape) is None or len(inputs[0].shape) != 3:
        return None
    return for_target(target)


def _applies_batch_matmul_dot(attrs, inputs, out_type, target) -> bool:
    isa = _int8_batch_matmul_isa(inputs, out_type, target)
    if isa is None or _applies_batch_matmul_amx(attrs, inputs, out_type, target):
        return False  # tiles alone (note at _applies_dense_amx)
    return batch_matmul.stored_pair(isa, inputs[0].dtype, inputs[1].dtype) is not None


def _applies_batch_matmul_amx(attrs, inputs, out_type, target) -> bool:
    if _int8_batch_matmul_isa(inputs, out_type, target) is None:
        return False
    (_, x1, x2), (_, y1, y2) = _static(inputs[0].shape), _static(inputs[1].shape)
    m, k = (x2, x1) if attrs.transpose_a else (x1, x2)
    n = y1 if attrs.transpose_b else y2
    return not batch_matmul_amx.applicable(tile_isa(target), m, k, n, str(inputs[0].dtype), str(inputs[1].dtype))


def _applies_batch_matmul_exact(attrs, inputs, out_type, target) -> bool:
    isa = _int8_batch_matmul_isa(inputs, out_type, target)
    return isa is not None and batch_matmul.stored_pair(isa, inputs[0].dtype, inputs[1].dtype) is None


def _applies_depthwise(attrs, inputs, out_type, target) -> bool:
    if target.kind.name != "llvm":  # the tile is an LLVM byte shuffle
        return False
    d_shape, k_shape = _static(inputs[0].shape), _static(inputs[1].shape)
    if d_shape is None or k_shape is None or len(d_shape) != 5:
        return False
    return (int(attrs.groups) == d_shape[1] * d_shape[4] and attrs.data_layout == f"NCHW{d_shape[4]}c"
            and attrs.kernel_layout == f"OIHW1i{d_shape[4]}o" and depthwise.applicable(
                for_target(target), d_shape, k_shape, attrs.dilation, inputs[0].dtype, inputs[1].dtype,
                out_type.dtype))


def _applies_layout_transform(attrs, inputs, out_type, target) -> bool:
    # Measured on x86 only (AVX2): Hexagon and other CPUs keep TVM's schedule.
    return (
        target.kind.name == "llvm" and for_target(target) is not None
        and byte_tile_plan(attrs.src_layout, attrs.dst_layout, inputs[0].shape, inputs[0].dtype) is not None
    )


def _schedule_layout_transform(attrs, outs, target):
    with target:
        return schedule_byte_layout_transform(outs, attrs.src_layout, attrs.dst_layout)


def _x86_kernels(target) -> bool:
    """Whether ``target`` is where the package's int8 kernels run: an LLVM target with an x86 dot-product
    ISA. The schedules of the ops around them (pads, pools, injective groups) are taken over there only."""
    isa = for_target(target)
    return target.kind.name == "llvm" and isa is not None and isa.name.startswith("x86")


def _nchw_pool_shape(attrs, inputs, target, dtypes) -> Optional[Tuple[int, ...]]:
    """The static data shape of an undilated NCHW pool of ``dtypes`` data where the package's kernels run."""
    shape = _static(inputs[0].shape)
    if not _x86_kernels(target) or shape is None or len(shape) != 4 or str(inputs[0].dtype) not in dtypes:
        return None
    return shape if attrs.layout == "NCHW" and get_const_tuple(attrs.dilation) == (1, 1) else None


def _applies_max_pool_rows(attrs, inputs, out_type, target) -> bool:
    # 8-bit NCHW pools.
    shape = _nchw_pool_shape(attrs, inputs, target, _INT8)
    if shape is None:
        return False
    (k_h, k_w), (s_h, s_w) = get_const_tuple(attrs.pool_size), get_const_tuple(attrs.strides)
    top, left, bottom, right = pool.pool_padding(get_const_tuple(attrs.padding))
    out = (pool.pool_output_size(shape[2], k_h, s_h, top, bottom, bool(attrs.ceil_mode)),
           pool.pool_output_size(shape[3], k_w, s_w, left, right, bool(attrs.ceil_mode)))
    return out == _static(out_type.shape)[2:]


def _applies_avg_pool_columns(attrs, inputs, out_type, target) -> bool:
    # Float32 NCHW averages over rows only (fast_lrn's channel window).
    if _nchw_pool_shape(attrs, inputs, target, ("float32",)) is None or attrs.ceil_mode:
        return False
    _, left, _, right = pool.pool_padding(get_const_tuple(attrs.padding))
    return (get_const_tuple(attrs.pool_size)[1] == 1 and get_const_tuple(attrs.strides)[1] == 1
            and left == right == 0)


def _compute_avg_pool_columns(attrs, inputs, out_type):
    top, _, bottom, _ = pool.pool_padding(get_const_tuple(attrs.padding))
    return [pool.avg_pool2d_columns(inputs[0], get_const_tuple(attrs.pool_size)[0], get_const_tuple(attrs.strides)[0],
                                    (top, bottom), bool(attrs.count_include_pad))]


def _schedule_avg_pool_columns(attrs, outs, target):
    with target:
        return pool.schedule_avg_pool2d_columns(outs)


def _compute_max_pool_rows(attrs, inputs, out_type):
    return [pool.max_pool2d_rows(inputs[0], get_const_tuple(attrs.pool_size), get_const_tuple(attrs.strides),
                                 pool.pool_padding(get_const_tuple(attrs.padding)), bool(attrs.ceil_mode))]


def _schedule_max_pool_rows(attrs, outs, target):
    with target:
        return pool.schedule_max_pool2d_rows(outs)


def _applies_injective(attrs, inputs, out_type, target) -> bool:
    # The schedule keeps TVM's for the groups TVM vectorizes.
    return _x86_kernels(target)


def _compute_of(op_name: str):
    def compute(attrs, inputs, out_type):
        return relay.op.get(op_name).get_attr("FTVMCompute")(attrs, inputs, out_type)

    return compute


def _schedule_injective(attrs, outs, target):
    with target:
        return injective.schedule_or_tvms(outs)


#: Injective and elementwise ops that anchor the fused groups after a sliced or unpacked conv output (the
#: last op of the highest pattern in a group picks its schedule): their schedule vectorizes a loop TVM's
#: 16-lane split leaves scalar (:mod:`.topi.injective`).
INJECTIVE_ANCHORS = ("reshape", "strided_slice", "transpose", "squeeze", "expand_dims", "cast", "add",
                     "subtract", "multiply", "divide", "clip", "maximum", "minimum", "nn.relu", "right_shift",
                     "fixed_point_multiply", "round", "where")


def _applies_row_pad(attrs, inputs, out_type, target) -> bool:
    # Elsewhere TVM's schedule.
    return _x86_kernels(target) and row_pad_applies(attrs.pad_width, inputs[0].dtype, attrs.pad_mode)


def _schedule_row_pad(attrs, outs, target):
    with target:
        return schedule_row_pad(outs)


def _lazy(task: str, wrap, **wrap_kwargs):
    """Relay compute / schedule calling the AutoTVM-wrapped template (registered after hooks())."""

    def fcompute(attrs, inputs, out_type):
        out = wrap(registry.template(task)[0], **wrap_kwargs)(attrs, inputs, out_type)
        _drop_stand_ins()  # after the template's wrapper added its task
        return out

    def fschedule(attrs, outs, target):
        with target:
            return registry.template(task)[1](outs)

    return fcompute, fschedule


def _row(name: str, task: str, wrap, applies, plevel: int = 30, **wrap_kwargs) -> registry.StrategyImpl:
    fcompute, fschedule = _lazy(task, wrap, **wrap_kwargs)
    return registry.StrategyImpl(name, fcompute, fschedule, applies, plevel=plevel, exclusive=True)


#: (op, strategy row) -- one table for every ISA.
STRATEGY_ROWS = (
    # AMX tiles for the convs the alter-layout hook gave their layouts (NCHW64c); the rows below otherwise.
    ("nn.contrib_conv2d_NCHWc", _row(
        "conv2d_nchwc_amx.tcutils", CONV2D_AMX_TASK, _strategy.wrap_compute_conv2d, _applies_conv2d_amx,
        plevel=35, need_data_layout=True, need_out_layout=True)),
    ("nn.contrib_conv2d_NCHWc", _row(
        "conv2d_nchwc_dot.tcutils", CONV2D_NCHWC_TASK, _strategy.wrap_compute_conv2d,
        _applies_conv2d_nchwc, need_data_layout=True, need_out_layout=True)),
    # Kernels marked by the alter-layout hook after their values were checked (reduce-range ISA).
    ("nn.contrib_conv2d_NCHWc", _row(
        "conv2d_nchwc_u8s7.tcutils", CONV2D_NCHWC_TASK, _strategy.wrap_compute_conv2d,
        functools.partial(_applies_conv2d_nchwc, reduce_range=True), need_data_layout=True, need_out_layout=True)),
    # Grouped convs whose groups' channels are whole dot products (legalization pads them so).
    ("nn.contrib_conv2d_NCHWc", _row(
        "group_conv2d_nchwc_dot.tcutils", GROUP_CONV2D_NCHWC_TASK, _strategy.wrap_compute_conv2d,
        _applies_group_conv2d_nchwc, has_groups=True, need_data_layout=True, need_out_layout=True)),
    ("nn.conv2d", _row(
        "conv2d_nchw_dot.tcutils", CONV2D_NCHW_TASK, _strategy.wrap_compute_conv2d, _applies_conv2d)),
    ("nn.conv2d", _row(
        "group_conv2d_nchw_dot.tcutils", GROUP_CONV2D_NCHW_TASK, _strategy.wrap_compute_conv2d,
        functools.partial(_applies_conv2d, grouped=True), has_groups=True)),
    # An RGB stem on AMX tiles (the legalization hook's NHWC stem form, blocked by the alter-layout hook).
    ("nn.conv2d", _row(
        "conv2d_stem_amx.tcutils", CONV2D_STEM_AMX_TASK, _strategy.wrap_compute_conv2d, _applies_conv2d_stem_amx,
        plevel=35, need_data_layout=True, need_kernel_layout=True, need_out_layout=True)),
    # Convs of few input channels in the row form (the legalization hook's rewrite of an RGB stem).
    ("nn.conv2d", _row(
        "conv2d_rows_dot.tcutils", CONV2D_ROWS_TASK, _strategy.wrap_compute_conv2d, _applies_conv2d_rows)),
    # AMX tiles where the target has them and the dense fills them; the row below is their fallback.
    ("nn.contrib_dense_pack", _row(
        "dense_pack_amx.tcutils", DENSE_AMX_TASK, _strategy.wrap_compute_dense, _applies_dense_amx, plevel=35)),
    ("nn.contrib_dense_pack", _row(
        "dense_pack_dot.tcutils", DENSE_PACK_TASK, _strategy.wrap_compute_dense, _applies_dense_pack)),
    ("nn.contrib_dense_pack", _row(
        "dense_pack_u8s7.tcutils", DENSE_PACK_TASK, _strategy.wrap_compute_dense,
        functools.partial(_applies_dense_pack, reduce_range=True))),
    ("nn.dense", _row("dense_dot.tcutils", DENSE_TASK, _strategy.wrap_compute_dense, _applies_dense)),
    # Every 8-bit batch_matmul on x86 (qnn.batch_matmul lowers to it): TVM's int8 schedule aborts
    # LLVM on VNNI targets and saturates on AVX-512BW ones; pairs the ISA lacks get the exact one.
    ("nn.batch_matmul", _row(
        "batch_matmul_amx.tcutils", BATCH_MATMUL_AMX_TASK, _strategy.wrap_compute_batch_matmul,
        _applies_batch_matmul_amx, plevel=35, need_out_dtype=True)),
    ("nn.batch_matmul", _row(
        "batch_matmul_dot.tcutils", BATCH_MATMUL_TASK, _strategy.wrap_compute_batch_matmul,
        _applies_batch_matmul_dot, need_out_dtype=True)),
    ("nn.batch_matmul", registry.StrategyImpl(
        "batch_matmul_exact.tcutils",
        _strategy.wrap_compute_batch_matmul(batch_matmul.batch_matmul_exact, need_out_dtype=True),
        _strategy.wrap_topi_schedule(batch_matmul.schedule_batch_matmul_exact),
        _applies_batch_matmul_exact, plevel=30, exclusive=True)),
    # u8 x i8 depthwise convs on AVX-512 VNNI: a kernel row's taps in one vpdpbusd (TVM's: one multiply each).
    ("nn.contrib_depthwise_conv2d_NCHWc", registry.StrategyImpl(
        "depthwise_nchwc_dot.tcutils",
        _strategy.wrap_compute_conv2d(depthwise.depthwise_nchwc_dot, need_data_layout=True, need_out_layout=True),
        _strategy.wrap_topi_schedule(depthwise.schedule_depthwise_nchwc_dot),
        _applies_depthwise, plevel=30, exclusive=True)),
    # Not exclusive: TVM's generic transform stays in the strategy, below it.
    ("layout_transform", registry.StrategyImpl(
        "layout_transform_bytes.tcutils", _strategy.wrap_compute_layout_transform(topi.layout_transform),
        _schedule_layout_transform, _applies_layout_transform, plevel=20)),
    # 8-bit image pads (the QDQ stem's zero-point pad): a row per iteration; not exclusive either.
    ("nn.pad", registry.StrategyImpl("pad_rows.tcutils", _compute_of("nn.pad"), _schedule_row_pad, _applies_row_pad,
                                     plevel=20)),
)

# Exclusive, as one implementation: ops fused after a tuned conv carry its workload, and AutoTVM's selection
# among two of them compares the (carried, cost-less) config with itself.
STRATEGY_ROWS += (
    # 8-bit NCHW max pools as a row pass and a column pass (TVM's: scalar windows).
    ("nn.max_pool2d", registry.StrategyImpl("max_pool2d_rows.tcutils", _compute_max_pool_rows,
                                            _schedule_max_pool_rows, _applies_max_pool_rows, exclusive=True)),
    # Float32 NCHW averages down the rows (a quantized LRN's channel window; TVM's: scalar windows).
    ("nn.avg_pool2d", registry.StrategyImpl("avg_pool2d_columns.tcutils", _compute_avg_pool_columns,
                                            _schedule_avg_pool_columns, _applies_avg_pool_columns, exclusive=True)),
)
# TVM's own compute and, for every group it vectorizes, its own schedule.
STRATEGY_ROWS += tuple(
    (op, registry.StrategyImpl("injective_lanes.tcutils", _compute_of(op), _schedule_injective, _applies_injective,
                               exclusive=True))
    for op in INJECTIVE_ANCHORS)

#: AutoTVM task name -> (compute, schedule).
TEMPLATES = {
    CONV2D_AMX_TASK: (conv2d_amx.conv2d_nchwc_amx, conv2d_amx.schedule_conv2d_nchwc_amx),
    CONV2D_STEM_AMX_TASK: (conv2d_amx.conv2d_stem_amx, conv2d_amx.schedule_conv2d_stem_amx),
    CONV2D_NCHWC_TASK: (conv2d_nchwc.conv2d_nchwc_dot, conv2d_nchwc.schedule_conv2d_nchwc_dot),
    CONV2D_NCHW_TASK: (conv2d_nchwc.conv2d_nchw_dot, conv2d_nchwc.schedule_conv2d_nchw_dot),
    CONV2D_ROWS_TASK: (conv2d_nchwc.conv2d_rows_dot, conv2d_nchwc.schedule_conv2d_nchwc_dot),
    GROUP_CONV2D_NCHWC_TASK: (conv2d_nchwc.group_conv2d_nchwc_dot, conv2d_nchwc.schedule_conv2d_nchwc_dot),
    GROUP_CONV2D_NCHW_TASK: (conv2d_nchwc.group_conv2d_nchw_dot, conv2d_nchwc.schedule_conv2d_nchw_dot),
    DENSE_PACK_TASK: (dense_pack.dense_pack_dot, dense_pack.schedule_dense_pack_dot),
    DENSE_TASK: (dense_pack.dense_dot, dense_pack.schedule_dense_dot),
    DENSE_AMX_TASK: (dense_amx.dense_pack_amx, dense_amx.schedule_dense_pack_amx),
    BATCH_MATMUL_TASK: (batch_matmul.batch_matmul_dot, batch_matmul.schedule_batch_matmul_dot),
    BATCH_MATMUL_AMX_TASK: (batch_matmul_amx.batch_matmul_amx, batch_matmul_amx.schedule_batch_matmul_amx),
}

#: (op, attribute, handler) of the layout hooks.
LAYOUT_HOOKS = (
    ("nn.conv2d", "FTVMLegalize", legalize_conv2d),
    ("nn.dense", "FTVMLegalize", legalize_dense),
    ("nn.conv2d", "FTVMAlterOpLayout", alter_conv2d),
    ("nn.dense", "FTVMAlterOpLayout", alter_dense),
)


def hooks() -> List[registry.Hook]:
    """The int8 dot-product hooks: templates, legalize / alter-layout handlers, strategy rows.

    Examples
    --------
    >>> sorted({h.kind for h in hooks()})
    ['autotvm_template', 'op_attr', 'strategy']
    """
    out = [
        registry.autotvm_template(name, *pair, description=(pair[0].__doc__ or "").strip().splitlines()[0])
        for name, pair in TEMPLATES.items()
    ]
    out += [registry.op_attr(op, attr, fn, targets=TARGET_KEYS) for op, attr, fn in LAYOUT_HOOKS]
    out += [registry.strategy(op, [row], targets=TARGET_KEYS) for op, row in STRATEGY_ROWS]
    return out
