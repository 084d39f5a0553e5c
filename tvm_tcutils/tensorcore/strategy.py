"""Wiring of the integer tensor-core kernels into Relay for CUDA targets.

What :func:`hooks` declares (all for the ``cuda``/``gpu`` target keys):

* AutoTVM templates ``tcutils.conv2d_hwnc_tensorcore.cuda``,
  ``tcutils.dense_tensorcore.cuda``, ``tcutils.dense_mma.cuda`` (the sm_80+
  int8 GEMM of :mod:`.topi.mma_gemm`), ``tcutils.conv2d_hwnc_mma.cuda`` (the
  implicit-GEMM conv2d on it, :mod:`.topi.mma_conv2d`) and
  ``tcutils.dense_wgmma.cuda``;
* a strategy row for HWNC int8/uint8 x HWOI int8 ``nn.conv2d`` on the implicit
  GEMM, above the WMMA row, for the archs of :data:`MMA_VERIFIED_ARCHS` only;
  where it applies the WMMA row steps aside (one AutoTVM task per layer) and
  legalization leaves the layer unpadded;
* strategy rows: ``nn.conv2d`` in HWNC layout and ``nn.dense``, both with
  int4/uint4/int8/uint8 operands and int32 output, when
  :func:`tvm_tcutils.tensorcore.rules.hwnc_conv2d_qualifies` says so and a
  WMMA tile fits the sizes exactly;
* strategy rows for ``nn.dense`` with an int8 weight and int8 or uint8 data on
  :mod:`.topi.mma_gemm`'s kernel, above the WMMA row, for the architectures of
  :data:`MMA_VERIFIED_ARCHS` only (those where the GPU check ran it bit-exact)
  and sizes one of its tilings fits; for uint8 data (onnxruntime's QDQ
  activations) the only row, as TVM's CUDA dense rows fail on mixed types;
  above them, the same for sm_90's warp-group kernel (:mod:`.topi.wgmma_gemm`,
  gated by :data:`WGMMA_VERIFIED_ARCHS`);
* a strategy row for 8-bit ``nn.batch_matmul`` (``transpose_b``, any mix of
  int8/uint8, int32 out) on the mma kernel's batched form, under the same gate:
  the attention products of a quantized encoder;
* ``FTVMLegalize`` for ``nn.conv2d``: an HWNC layer that qualifies but whose
  batch or channels do not fit a WMMA tile is zero-padded to the verdict's
  sizes (and its output sliced); an HWNC layer that does not qualify (channel
  padding above :func:`max_pad_fraction`, float types, an old ``-arch``) is
  rewritten to NHWC, which TVM's own CUDA schedules compile, and a log line
  says why; an int4/uint4 layer for sm_90 and newer (no tensor cores for it
  there: :func:`tvm_tcutils.tensorcore.rules.unsupported_reason`) is a
  ``ValueError`` that says to use int8, as TVM's CUDA conv2d has no 4-bit path;
  constant int4/uint4 inputs (``cast(<constant>, "int4")``) are folded there,
  correctly (:func:`tvm_tcutils.cuda_subbyte.fold_subbyte_cast`), before TVM's
  ``FoldConstant`` would fold them on the CPU, wrong;
* ``FTVMLegalize`` for ``nn.dense``: the same folding of constant int4/uint4
  inputs, then TVM's own legalization; other dense layers go to TVM's alone;
* ``FTVMAlterOpLayout`` for ``nn.conv2d``: when our conv2d implementation is
  selected and the kernel is a constant, the kernel is re-laid out to
  ``HWOI<n>o<k>i`` tiles once at compile time (int8/uint8 only: a 4-bit
  layout transform would be folded wrong, so 4-bit kernels are packed inside
  the kernel).

Everything else (float or NCHW/NHWC layers, targets without tensor cores) goes
to TVM's original hooks.

Setting
-------
``max_pad_fraction`` (default :data:`DEFAULT_PAD_FRACTION`): the largest
fraction of extra work channel padding may add to a layer, the same setting
``prepare_for_tensorcore(skip_layers="auto")`` reads (see
:mod:`tvm_tcutils.tensorcore.rules`). Change it for a scope with
``with pad_limit(0.5): relay.build(...)`` or for the process with
:func:`set_max_pad_fraction`.
"""
from __future__ import annotations

import logging
from typing import List, Optional, Sequence, Tuple

from .._tvm import tvm
from tvm import autotvm, relay, te
from tvm import topi
from tvm.relay.op.strategy.generic import wrap_compute_batch_matmul, wrap_compute_conv2d, wrap_topi_schedule
from tvm.topi.utils import get_const_tuple

from .. import cuda, cuda_subbyte, registry
from .rules import (  # noqa: F401  (the setting, re-exported beside the hooks it steers)
    DEFAULT_PAD_FRACTION, Verdict, fitting_shapes, hwnc_conv2d_qualifies, max_pad_fraction, pad_limit,
    set_max_pad_fraction, unsupported_reason,
)
from .topi import conv2d_hwnc, dense, mma_conv2d, mma_gemm, mma_intrin, wgmma_gemm, wmma

logger = logging.getLogger("tvm_tcutils.tensorcore")

TARGETS = ("cuda", "gpu")
CONV2D_IMPL = "tcutils.conv2d_hwnc_tensorcore.cuda"
DENSE_IMPL = "tcutils.dense_tensorcore.cuda"
MMA_DENSE_IMPL = "tcutils.dense_mma.cuda"
MMA_CONV2D_IMPL = "tcutils.conv2d_hwnc_mma.cuda"
_PLEVEL = 25  # above TVM's own tensor-core rows (20)

#: Architectures on which ``relay.build`` takes the mma int8 dense kernel (:mod:`.topi.mma_gemm`): those
#: where ``scripts/gpu_check.sh`` ran it bit-exact against numpy on a GPU. It compiles, and its SASS is
#: checked, for every sm_80+ arch on any machine; until a GPU has run it an arch keeps the WMMA kernel.
MMA_VERIFIED_ARCHS: frozenset = frozenset()

WGMMA_DENSE_IMPL = "tcutils.dense_wgmma.cuda"
MMA_BATCH_MATMUL_IMPL = "tcutils.batch_matmul_mma.cuda"

#: The same for the sm_90 warp-group kernel (:mod:`.topi.wgmma_gemm`), taken above the mma one: ``{"sm_90"}``
#: once an H100/H200 ran it bit-exact (its SASS is checked on any machine).
WGMMA_VERIFIED_ARCHS: frozenset = frozenset()
# The conv2d row is exclusive: TVM's own HWNC row comes with an alter-op that
# asserts a local GPU (``tvm.cuda(0).compute_version``), so a tuning log that
# preferred it would crash compilation on a GPU-less build machine; one row
# also gives one AutoTVM task per layer.


# --------------------------------------------------------------------------
# Predicates.
# --------------------------------------------------------------------------
def _conv2d_dims(attrs, data_type, kernel_type):
    """(batch, in_channels, out_channels, packed_n) of an HWNC conv2d, or None for other layouts."""
    if attrs.data_layout != "HWNC":
        return None
    kernel = get_const_tuple(kernel_type.shape)
    data = get_const_tuple(data_type.shape)
    if not all(isinstance(v, int) for v in kernel + data):
        return None  # dynamic shapes: left to TVM
    _, _, batch, in_channels = data
    if attrs.kernel_layout == "HWOI" and len(kernel) == 4:
        return batch, in_channels, kernel[2], None
    shape = _packed_shape(attrs.kernel_layout, data_type.dtype)
    if shape is not None and len(kernel) == 6 and tuple(kernel[4:]) == (shape.n, shape.k):
        return batch, in_channels, kernel[2] * kernel[4], shape.n
    return None


def _packed_shape(layout: str, dtype: str) -> Optional[wmma.WmmaShape]:
    for shape in wmma.WMMA_SHAPES.get(dtype, ()):
        if layout == conv2d_hwnc.kernel_layout(shape):
            return shape
    return None


def _out_dtype(attrs, fallback: str) -> str:
    return attrs.out_dtype if attrs.out_dtype not in ("", "same") else fallback


def _conv2d_verdict(attrs, data_type, kernel_type, target) -> Tuple[Verdict, Optional[tuple]]:
    """The package's verdict on an HWNC conv2d and its (batch, in, out) sizes (None for other layouts)."""
    dims = _conv2d_dims(attrs, data_type, kernel_type)
    if dims is None:
        return Verdict(False, f"layouts {attrs.data_layout}/{attrs.kernel_layout} are not HWNC/HWOI"), None
    batch, in_channels, out_channels, packed_n = dims
    verdict = hwnc_conv2d_qualifies(
        batch, in_channels, out_channels, data_type.dtype, kernel_dtype=kernel_type.dtype,
        groups=int(attrs.groups), out_dtype=_out_dtype(attrs, data_type.dtype), target=target,
    )
    if verdict and packed_n is not None:
        if not any(s.n == packed_n for s in fitting_shapes(data_type.dtype, batch, in_channels, out_channels)):
            verdict = Verdict(False, "kernel packed for other tiles")
    return verdict, (batch, in_channels, out_channels)


def _fits_as_is(verdict: Verdict, sizes: Optional[tuple]) -> bool:
    """Qualifies without padding: the kernels themselves only take exact tiles (legalization pads)."""
    return bool(verdict) and verdict.padded == sizes


def _conv2d_applies(attrs, inputs, out_type, target) -> bool:
    # The WMMA kernel steps aside where the mma one takes the layer: one row, one AutoTVM task per layer.
    return (_fits_as_is(*_conv2d_verdict(attrs, inputs[0], inputs[1], target))
            and not _mma_conv2d_applies(attrs, inputs, out_type, target))


def _mma_conv2d_applies(attrs, inputs, out_type, target) -> bool:
    """Whether :mod:`.topi.mma_conv2d`'s implicit GEMM takes this conv2d: HWNC data (int8 or uint8) and an
    unpacked HWOI int8 kernel, int32 out, no groups, static shapes, a verified arch and a tiling that fits."""
    data, kernel = inputs[0], inputs[1]
    if attrs.data_layout != "HWNC" or attrs.kernel_layout != "HWOI" or int(attrs.groups) != 1:
        return False
    if data.dtype not in mma_intrin.A_DTYPES or kernel.dtype != "int8" or _out_dtype(attrs, data.dtype) != "int32":
        return False
    shapes = get_const_tuple(data.shape), get_const_tuple(kernel.shape)
    if not all(isinstance(v, int) for shape in shapes for v in shape):
        return False
    number = _verified_arch(target, MMA_VERIFIED_ARCHS)
    if number is None:
        return False
    geom = mma_conv2d.geometry(*shapes, get_const_tuple(attrs.strides), get_const_tuple(attrs.padding),
                               get_const_tuple(attrs.dilation))
    return mma_conv2d.fallback_tiles(geom, number) is not None


def _dense_applies(attrs, inputs, out_type, target) -> bool:
    data, weight = inputs
    if len(data.shape) != 2 or len(weight.shape) != 2 or data.dtype not in wmma.WMMA_SHAPES:
        return False
    # The same GEMM as an HWNC conv2d's pixel: batch x out_features x in_features, never padded.
    sizes = (*get_const_tuple(data.shape), get_const_tuple(weight.shape)[0])
    verdict = hwnc_conv2d_qualifies(
        *sizes, data.dtype, kernel_dtype=weight.dtype, out_dtype=_out_dtype(attrs, data.dtype), target=target,
    )
    return _fits_as_is(verdict, sizes)


def _gemm_fits(attrs, inputs, target, data_dtype: str, verified: frozenset, tiles_for) -> bool:
    """Whether an int8-weight GEMM kernel takes this ``nn.dense``: ``data_dtype`` data, int32 out, static
    2-D shapes, an arch in ``verified``, and a tiling ``tiles_for(m, n, k, arch_number)`` finds."""
    data, weight = inputs
    if data.dtype != data_dtype or weight.dtype != "int8" or _out_dtype(attrs, data.dtype) != "int32":
        return False
    if len(data.shape) != 2 or len(weight.shape) != 2:
        return False
    sizes = (*get_const_tuple(data.shape), get_const_tuple(weight.shape)[0])
    if not all(isinstance(v, int) for v in sizes):
        return False
    number = _verified_arch(target, verified)
    m, k, n = sizes
    return number is not None and tiles_for(m, n, k, number) is not None


def _verified_arch(target, verified: frozenset) -> Optional[int]:
    """The arch number of ``target`` where ``verified`` has it (None: no arch to ask, an old one, or one the
    GPU check has not run the kernel on; the WMMA row and TVM's decide)."""
    try:
        number = mma_gemm.arch_number(cuda.target_arch(target))
    except ValueError:
        return None
    return number if f"sm_{number}" in verified else None


def _mma_tiles(m: int, n: int, k: int, number: int):
    return mma_gemm.fallback_tiles(m, n, k, number)


def _wgmma_tiles(m: int, n: int, k: int, number: int):
    return wgmma_gemm.fallback_tiles(m, n, k) if number == 90 else None


def _mma_dense_applies(attrs, inputs, out_type, target) -> bool:
    return _gemm_fits(attrs, inputs, target, "int8", MMA_VERIFIED_ARCHS, _mma_tiles)


def _mma_dense_u8_applies(attrs, inputs, out_type, target) -> bool:
    # Exclusive: TVM's CUDA dense rows assert equal operand types (its tensor-core compute fails on
    # uint8 x int8), so where this kernel takes the product TVM's rows are not offered.
    return _gemm_fits(attrs, inputs, target, "uint8", MMA_VERIFIED_ARCHS, _mma_tiles)


def _wgmma_dense_applies(attrs, inputs, out_type, target) -> bool:
    return _gemm_fits(attrs, inputs, target, "int8", WGMMA_VERIFIED_ARCHS, _wgmma_tiles)


def _wgmma_dense_u8_applies(attrs, inputs, out_type, target) -> bool:
    return _gemm_fits(attrs, inputs, target, "uint8", WGMMA_VERIFIED_ARCHS, _wgmma_tiles)


# --------------------------------------------------------------------------
# Strategy rows (templates are looked up when the strategy runs).
# --------------------------------------------------------------------------
def _conv2d_compute(attrs, inputs, out_type):
    return wrap_compute_conv2d(registry.template(conv2d_hwnc.TASK)[0])(attrs, inputs, out_type)


def _mma_conv2d_compute(attrs, inputs, out_type):
    return wrap_compute_conv2d(registry.template(mma_conv2d.TASK)[0])(attrs, inputs, out_type)


def _dense_compute(attrs, inputs, out_type):
    compute = registry.template(dense.TASK)[0]
    return [compute(inputs[0], inputs[1], _out_dtype(attrs, inputs[0].dtype))]


def _mma_dense_compute(attrs, inputs, out_type):
    return [registry.template(mma_gemm.TASK)[0](inputs[0], inputs[1], "int32")]


def takes_integer_products(target) -> bool:
    """Whether ``relay.build`` for ``target`` puts 8-bit ``nn.dense`` and ``nn.batch_matmul`` on the
    package's GEMMs: a CUDA target whose arch is in :data:`MMA_VERIFIED_ARCHS` (the batched products need the
    mma kernel; dense may go to the warp-group one). The QDQ route (:func:`tvm_tcutils.dotprod.qdq.rewrites_for`)
    makes a quantized model's regions integer for such targets.

    Examples
    --------
    >>> takes_integer_products("cuda -arch=sm_90"), takes_integer_products("llvm"), takes_integer_products(None)
    (False, False, False)
    """
    if target is None:
        return False
    target = tvm.target.Target(target) if isinstance(target, str) else target
    return target.kind.name == "cuda" and _verified_arch(target, MMA_VERIFIED_ARCHS) is not None


def _mma_batch_matmul_applies(attrs, inputs, out_type, target) -> bool:
    # Exclusive: TVM's CUDA batch_matmul rows cannot build 8-bit products with an epilogue fused (its
    # tensor-core schedule leaves the fused cast unscheduled), the attention products of a QDQ encoder.
    data, weight = inputs
    if bool(attrs.transpose_a) or not bool(attrs.transpose_b) or _out_dtype(attrs, data.dtype) != "int32":
        return False
    if data.dtype not in mma_intrin.A_DTYPES or weight.dtype not in mma_intrin.A_DTYPES:
        return False
    if len(data.shape) != 3 or len(weight.shape) != 3:
        return False
    shapes = get_const_tuple(data.shape) + get_const_tuple(weight.shape)
    if not all(isinstance(v, int) for v in shapes) or shapes[0] != shapes[3]:
        return False
    number = _verified_arch(target, MMA_VERIFIED_ARCHS)
    batch, m, k, _, n, _ = shapes
    return number is not None and mma_gemm.fallback_tiles(m, n, k, number, batch) is not None


def _uint8_batch_matmul_elsewhere(attrs, inputs, out_type, target) -> bool:
    # The QDQ route makes an encoder's attention products uint8 x uint8 for targets whose integer products
    # the package takes (takes_integer_products); where the mma kernel's tiles do not fit them (a sequence
    # length not a multiple of 32), TVM's tensor-core batch_matmul row would be chosen and cannot build them
    # with their epilogue fused: TVM's plain CUDA batch_matmul schedule, exclusive, instead.
    data, weight = inputs
    return ("uint8" in (data.dtype, weight.dtype) and takes_integer_products(target)
            and not _mma_batch_matmul_applies(attrs, inputs, out_type, target))


def _mma_batch_matmul_compute(attrs, inputs, out_type):
    return [mma_gemm.batch_matmul(inputs[0], inputs[1], arch=mma_gemm.target_arch_number())]


def _extern_gemm_schedule(attrs, outs, target):
    # The GEMM is scheduled inside its extern op; what Relay fused after it is one element-wise kernel.
    return wrap_topi_schedule(lambda outs_: mma_gemm.schedule_dense(None, outs_))(attrs, outs, target)


def _wgmma_dense_compute(attrs, inputs, out_type):
    return [registry.template(wgmma_gemm.TASK)[0](inputs[0], inputs[1], "int32")]


def _schedule_of(task: str):
    def _schedule(attrs, outs, target):
        return wrap_topi_schedule(registry.template(task)[1])(attrs, outs, target)

    return _schedule


# --------------------------------------------------------------------------
# Legalize: pad to the tile, or leave the layer to a non-tensor-core path.
# --------------------------------------------------------------------------
def _conv2d_attrs(attrs, **changes) -> dict:
    new = {key: attrs[key] for key in attrs.keys()}
    new.update(changes)
    return new


def _to_nhwc(attrs, data, kernel):
    """The same convolution in NHWC/HWIO between layout transforms (TVM's CUDA schedules take it)."""
    new_attrs = _conv2d_attrs(attrs, data_layout="NHWC", kernel_layout="HWIO", out_layout="")
    out = relay.nn.conv2d(
        relay.layout_transform(data, "HWNC", "NHWC"), relay.layout_transform(kernel, "HWOI", "HWIO"), **new_attrs
    )
    return relay.layout_transform(out, "NHWC", "HWNC")


def _pad_to_tiles(attrs, data, kernel, sizes, in_channels, out_shape):
    """Zero-pad batch and channels to ``sizes`` (batch, in, out) and slice the output back."""
    new_batch, new_in, new_out = sizes
    batch, out_channels = out_shape[2], out_shape[3]
    if (new_batch, new_in) != (batch, in_channels):
        data = relay.nn.pad(data, ((0, 0), (0, 0), (0, new_batch - batch), (0, new_in - in_channels)))
    if (new_out, new_in) != (out_channels, in_channels):
        # A 4-bit constant kernel is padded in NumPy: FoldConstant would pad it on the CPU, wrong (cuda_subbyte).
        kernel = cuda_subbyte.fold_subbyte_pads(
            relay.nn.pad(kernel, ((0, 0), (0, 0), (0, new_out - out_channels), (0, new_in - in_channels))),
            stop=[kernel])
    out = relay.nn.conv2d(data, kernel, **_conv2d_attrs(attrs, channels=new_out))
    return relay.strided_slice(out, begin=[0, 0, 0, 0], end=list(out_shape))


def _legalize_conv2d(attrs, inputs, types):
    """Pad HWNC int4/int8 conv2d to WMMA tiles, or move it to NHWC with a log line that says why.

    Constant int4/uint4 inputs are folded here, correctly (:func:`~tvm_tcutils.cuda_subbyte.fold_subbyte_cast`),
    before TVM's ``FoldConstant`` would fold them wrong.
    """
    if attrs.data_layout != "HWNC" or attrs.kernel_layout != "HWOI":
        return None
    target = tvm.target.Target.current(allow_none=True)
    if target is None or target.kind.name != "cuda":
        return None
    data, kernel = cuda_subbyte.fold_subbyte_inputs(inputs)
    data_type, kernel_type, out_type = types[0], types[1], types[-1]
    name = f"conv2d HWNC {get_const_tuple(data_type.shape)} x {get_const_tuple(kernel_type.shape)} {data_type.dtype}"
    # The package's one verdict (raises MissingArchError without -arch), so
    # that this decides exactly what prepare_for_tensorcore(skip_layers="auto") does.
    verdict, sizes = _conv2d_verdict(attrs, data_type, kernel_type, target)
    if _fits_as_is(verdict, sizes) or _mma_conv2d_applies(attrs, types[:2], out_type, target):
        # Returning the same call (not None) keeps TVM's CUDA legalization,
        # which knows only its own tile shapes, from padding it anyway (for
        # example int8 16x64->16 to 32 output channels).
        return relay.nn.conv2d(data, kernel, **_conv2d_attrs(attrs))
    if verdict:
        logger.info(
            "%s: zero-padded to batch=%d, in=%d, out=%d for WMMA %s (+%.0f%% channel work, "
            "max_pad_fraction=%g)", name, *verdict.padded, verdict.wmma_shape.name, 100 * verdict.pad_fraction,
            max_pad_fraction(),
        )
        return _pad_to_tiles(attrs, data, kernel, verdict.padded, sizes[1], get_const_tuple(out_type.shape))
    refused = unsupported_reason(str(data_type.dtype), target)
    if refused:
        # TVM's CUDA conv2d has no 4-bit path (an int4 NHWC conv2d aborts the process in TVM 0.19's
        # build or fails in its winograd transform), so say so here instead of moving the layer there.
        raise ValueError(
            f"{name}: {refused}. TVM's CUDA conv2d has no {data_type.dtype} path to move the layer to: "
            "prepare the model with dtype='int8' (prepare_for_tensorcore(mod, 'int8', target=...))"
        )
    # A warning: the layer loses tensor cores, which users should see without configuring logging.
    logger.warning(
        "%s: not on tensor cores (%s; max_pad_fraction=%g); using the NHWC CUDA path",
        name, verdict.reason, max_pad_fraction(),
    )
    return _to_nhwc(attrs, data, kernel)


def _legalize_dense(attrs, inputs, types):
    """Fold constant int4/uint4 inputs of ``nn.dense`` correctly, then TVM's own legalization; else ``None``."""
    folded = cuda_subbyte.fold_subbyte_inputs(inputs)
    if all(new.same_as(old) for new, old in zip(folded, inputs)):
        return None
    legal = tvm.topi.nn.dense_legalize(attrs, folded, types)
    if legal is None:
        return relay.nn.dense(*folded, units=attrs.units, out_dtype=attrs.out_dtype)
    return cuda_subbyte.fold_subbyte_pads(legal, stop=folded)  # TVM's pads its int4 operands to its tiles


# --------------------------------------------------------------------------
# Alter-op: pack the constant kernel into tiles at compile time.
# --------------------------------------------------------------------------
def _alter_conv2d(attrs, inputs, tinfos, out_type):
    """Re-lay the constant HWOI kernel out as HWOI<n>o<k>i tiles when our conv2d is selected."""
    if attrs.data_layout != "HWNC" or attrs.kernel_layout != "HWOI":
        return None
    target = tvm.target.Target.current(allow_none=False)
    data, kernel = inputs
    if not _conv2d_applies(attrs, tinfos, out_type, target):
        return None
    impl, outs = relay.backend.te_compiler.select_implementation(
        relay.op.get("nn.conv2d"), attrs, tinfos, out_type, target
    )
    workload = autotvm.task.get_workload(outs)
    if workload is None or workload[0] != conv2d_hwnc.TASK:
        return None
    if cuda_subbyte.is_subbyte(tinfos[1].dtype):
        # The tile layout would be made by a layout_transform that FoldConstant runs on the CPU, whose code
        # generator misplaces 4-bit values (tvm_tcutils.cuda_subbyte); the kernel packs them itself instead.
        logger.info("conv2d HWNC: %s kernel packed inside the kernel on every run (TVM cannot fold a %s "
                    "layout transform correctly)", tinfos[1].dtype, tinfos[1].dtype)
        return None
    if not isinstance(kernel, relay.Constant):
        logger.info(
            "conv2d HWNC: kernel is not a constant (%s), so it is packed inside the kernel on every run; "
            "bind the weights as constants (relay.build(..., params=...)) to pack them once",
            type(kernel).__name__,
        )
        return None
    dispatch_ctx = autotvm.task.DispatchContext.current
    cfg = dispatch_ctx.query(target, workload)
    shape = wmma.shape_for(tinfos[0].dtype, m=cfg["wmma_m"].val)
    kh, kw, co, ci = get_const_tuple(tinfos[1].shape)
    packed = ("TENSOR", (kh, kw, co // shape.n, ci // shape.k, shape.n, shape.k), tinfos[1].dtype)
    dispatch_ctx.update(target, (workload[0], workload[1], packed, *workload[3:]), cfg)
    layout = conv2d_hwnc.kernel_layout(shape)
    # AlterOpLayout itself inserts the HWOI -> tiles transform of the kernel
    # (then folded into the constant) from the changed kernel_layout.
    return relay.nn.conv2d(data, kernel, **_conv2d_attrs(attrs, kernel_layout=layout, channels=co))


def implementations(
    mod: tvm.IRModule, target: str, ops: Sequence[str] = ("nn.conv2d", "nn.dense")
) -> List[Tuple[str, str, str, str, Optional[tuple]]]:
    """Which implementation TVM's strategy picks for each ``ops`` call of ``mod["main"]`` on ``target``.

    Legalizes a copy for ``target`` (``mod`` is not changed) as the build
    does, visits the calls in post order (layer order) and asks
    ``relay.backend.te_compiler.select_implementation`` for each.

    Returns
    -------
    list of (op, data layout or "", input dtype, implementation name, AutoTVM workload or None)

    Examples
    --------
    >>> x = relay.var("x", shape=(8, 64), dtype="int8"); w = relay.var("w", shape=(32, 64), dtype="int8")
    >>> mod = tvm.IRModule.from_expr(relay.nn.dense(x, w, out_dtype="int32"))
    >>> implementations(mod, "cuda -arch=sm_80")[0][3]
    'tcutils.dense_tensorcore.cuda'
    """
    if isinstance(ops, str) or not all(isinstance(op, str) for op in ops):
        raise TypeError(f"ops must be a sequence of op names like ('nn.conv2d',), got {ops!r}")
    target = tvm.target.Target(target)
    with target:
        # What the build sees: after legalization (padding, or the NHWC path).
        typed = relay.transform.InferType()(relay.transform.Legalize()(relay.transform.InferType()(mod)))
    calls: List[relay.Call] = []
    relay.analysis.post_order_visit(
        typed["main"],
        lambda node: calls.append(node)
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in ops else None,
    )
    rows = []
    with target:
        for call in calls:
            inputs = [te.placeholder(get_const_tuple(a.checked_type.shape), a.checked_type.dtype) for a in call.args]
            impl, outs = relay.backend.te_compiler.select_implementation(
                call.op, call.attrs, inputs, call.checked_type, target
            )
            layout = str(getattr(call.attrs, "data_layout", "") or "")
            rows.append((call.op.name, layout, inputs[0].dtype, impl.name, autotvm.task.get_workload(outs)))
    return rows


def hooks() -> List[registry.Hook]:
    """The tensor-core hook declarations (see the module docstring).

    Examples
    --------
    >>> sorted({h.kind for h in hooks()})
    ['autotvm_template', 'op_attr', 'strategy']
    """
    return [
        registry.autotvm_template(
            conv2d_hwnc.TASK, conv2d_hwnc.conv2d_hwnc_template, conv2d_hwnc.schedule_conv2d_hwnc,
            "HWNC conv2d on int4/int8 tensor cores",
        ),
        registry.autotvm_template(
            dense.TASK, dense.dense_template, dense.schedule_dense, "dense on int4/int8 tensor cores"
        ),
        registry.autotvm_template(
            mma_gemm.TASK, mma_gemm.dense_template, mma_gemm.schedule_dense,
            "int8 dense on sm_80+ tensor cores (mma.sync m16n8k32, ldmatrix, cp.async pipeline)",
        ),
        registry.autotvm_template(
            mma_conv2d.TASK, mma_conv2d.conv2d_template, mma_gemm.schedule_dense,
            "HWNC int8 conv2d on sm_80+ tensor cores (implicit GEMM on the mma kernel)",
        ),
        registry.autotvm_template(
            wgmma_gemm.TASK, wgmma_gemm.dense_template, wgmma_gemm.schedule_template,
            "int8 dense on sm_90 tensor cores (wgmma, cp.async pipeline)",
        ),
        registry.strategy(
            "nn.conv2d",
            [registry.StrategyImpl(CONV2D_IMPL, _conv2d_compute, _schedule_of(conv2d_hwnc.TASK),
                                   _conv2d_applies, plevel=_PLEVEL, exclusive=True),
             registry.StrategyImpl(MMA_CONV2D_IMPL, _mma_conv2d_compute, _schedule_of(mma_conv2d.TASK),
                                   _mma_conv2d_applies, plevel=_PLEVEL + 1, exclusive=True)],
            targets=TARGETS,
        ),
        registry.strategy(
            "nn.dense",
            [registry.StrategyImpl(DENSE_IMPL, _dense_compute, _schedule_of(dense.TASK),
                                   _dense_applies, plevel=_PLEVEL),
             registry.StrategyImpl(MMA_DENSE_IMPL, _mma_dense_compute, _schedule_of(mma_gemm.TASK),
                                   _mma_dense_applies, plevel=_PLEVEL + 1),
             registry.StrategyImpl(MMA_DENSE_IMPL, _mma_dense_compute, _schedule_of(mma_gemm.TASK),
                                   _mma_dense_u8_applies, plevel=_PLEVEL + 1, exclusive=True),
             registry.StrategyImpl(WGMMA_DENSE_IMPL, _wgmma_dense_compute, _schedule_of(wgmma_gemm.TASK),
                                   _wgmma_dense_applies, plevel=_PLEVEL + 2),
             registry.StrategyImpl(WGMMA_DENSE_IMPL, _wgmma_dense_compute, _schedule_of(wgmma_gemm.TASK),
                                   _wgmma_dense_u8_applies, plevel=_PLEVEL + 2, exclusive=True)],
            targets=TARGETS,
        ),
        registry.strategy(
            "nn.batch_matmul",
            [registry.StrategyImpl(MMA_BATCH_MATMUL_IMPL, _mma_batch_matmul_compute, _extern_gemm_schedule,
                                   _mma_batch_matmul_applies, plevel=_PLEVEL + 1, exclusive=True),
             registry.StrategyImpl("batch_matmul.cuda",
                                   wrap_compute_batch_matmul(topi.cuda.batch_matmul, need_out_dtype=True),
                                   wrap_topi_schedule(topi.cuda.schedule_batch_matmul),
                                   _uint8_batch_matmul_elsewhere, plevel=_PLEVEL, exclusive=True)],
            targets=TARGETS,
        ),
        registry.op_attr("nn.conv2d", "FTVMLegalize", _legalize_conv2d, targets=TARGETS),
        registry.op_attr("nn.dense", "FTVMLegalize", _legalize_dense, targets=TARGETS),
        registry.op_attr("nn.conv2d", "FTVMAlterOpLayout", _alter_conv2d, targets=TARGETS),
    ]
