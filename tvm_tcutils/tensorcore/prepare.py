"""Prepare a float model for the HWNC tensor-core schedules in one call."""
from __future__ import annotations

import dataclasses
from typing import Iterable, List, NamedTuple, Optional, Union

from .._tvm import tvm
from tvm import relay

from .rules import DATA_LAYOUT, WMMA_SHAPES, unsupported_reason
from ._graph import check_dtype, layer_calls, resolve_ops, resolve_skip_layers, typed
from .layer_table import TargetLike, as_target, conv2d_verdict
from .layout_config import LayoutConfig
from .recast import recast_layers

CONV = "nn.conv2d"


@dataclasses.dataclass(frozen=True)
class SkippedLayer:
    """A conv2d layer left in its float type and layout, and why."""

    index: int
    reason: str

    def __str__(self) -> str:
        return f"layer {self.index}: {self.reason}"


class Prepared(NamedTuple):
    """What :func:`prepare_for_tensorcore` returns: ``mod, skipped = prepare_for_tensorcore(...)``."""

    mod: tvm.IRModule
    skipped: List[SkippedLayer]


def prepare_for_tensorcore(
    mod: tvm.IRModule,
    dtype: str = "int4",
    out_dtype: str = "int32",
    skip_layers: Union[str, Iterable[int]] = "auto",
    pad_fraction: Optional[float] = None,
    target: TargetLike = None,
    skipped_layout: str = "auto",
) -> Prepared:
    """Convert conv2d layers to HWNC and recast them to int4/int8, skipping those that cannot use tensor cores.

    The manual workflow in one call: ``ConvertLayout({"nn.conv2d": ["HWNC",
    "default"]})`` under a :class:`LayoutConfig` that keeps the skipped layers,
    then :func:`recast` of the same layers to ``dtype``/``out_dtype``.

    Parameters
    ----------
    mod : tvm.IRModule
        A float model; not modified.
    dtype : {"int4", "uint4", "int8", "uint8"}
        Input type of the converted layers.
    out_dtype : str
        Accumulator type (tensor cores accumulate in ``int32``).
    skip_layers : "auto" or list of int
        ``"auto"`` skips exactly the layers that do not qualify for the HWNC
        tensor-core schedules (:func:`tvm_tcutils.tensorcore.rules.hwnc_conv2d_qualifies`),
        for example ResNet's first conv with 3 input channels; a list skips
        those layer indices (negative from the end) like the manual workflow.
        With the same pad fraction, ``"auto"`` skips exactly the layers the
        tensor-core strategy would not put on tensor cores.
    pad_fraction : float, optional
        Channel-padding tolerance for ``"auto"``; default: the current setting
        that the tensor-core legalization also reads
        (:func:`tvm_tcutils.tensorcore.rules.max_pad_fraction`, 1.0 unless
        changed with ``pad_limit``/``set_max_pad_fraction``).
    target : str or tvm.target.Target, optional
        The target the model will be built for. With it, ``"auto"`` also
        applies the target's rules: a layer is skipped when the target has no
        tensor cores for ``dtype`` (not CUDA, or an ``-arch`` below sm_72 for
        int8 / sm_75 for int4; a CUDA target needs ``-arch`` when no GPU is
        attached). int4/uint4 for sm_90 and newer is refused with a
        ``ValueError`` before any work: those GPUs have no 4-bit tensor-core
        instruction (the 4-bit tiles run emulated on 8-bit MMA, slower than
        int8 on an H200); use
        ``dtype="int8"`` there. Default: the layers alone are judged.
    skipped_layout : {"auto", "NHWC", "keep"}
        The data layout of the skipped layers, which stay in float. ``"auto"``:
        ``NHWC`` for a CUDA ``target``, else as they are. On a GPU a skipped
        3-channel stem in NCHW runs on TVM's untuned NCHW schedule: 38 ms for
        ResNet-50's at batch 8 on an H200, 1.0 ms in NHWC
        (``docs/benchmarks/tensorcore.md``).

    Returns
    -------
    Prepared
        ``(mod, skipped)``: the type-checked converted module and the skipped
        layers with reasons.

    Raises
    ------
    ValueError, TypeError
        A bad dtype, skip index, target or module (including one that does not type-check);
        int4/uint4 for a target of sm_90 or newer.
    tvm_tcutils.tensorcore.rules.MissingArchError
        A CUDA ``target`` without ``-arch`` on a machine without a GPU.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> prepared, skipped = prepare_for_tensorcore(mod, "int4")
    >>> [layer.index for layer in skipped]
    [0]
    >>> prepare_for_tensorcore(mod, "int4", target="cuda -arch=sm_90")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: prepare_for_tensorcore(dtype='int4') for target 'cuda -arch=sm_90': int4 on sm_90 and newer ...
    """
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    if dtype not in WMMA_SHAPES:
        raise ValueError(f"dtype must be one of {sorted(WMMA_SHAPES)}, got {dtype!r}")
    check_dtype(out_dtype, "out_dtype")
    given, target = target, as_target(target)
    refused = unsupported_reason(dtype, target)  # before the work: a target without -arch fails here too
    if refused:
        raise ValueError(f"prepare_for_tensorcore(dtype={dtype!r}) for target {str(given)!r}: {refused} "
                         "(prepare with dtype='int8' for this target; docs/cuda.md)")
    if skipped_layout not in SKIPPED_LAYOUTS:
        raise ValueError(f"skipped_layout must be one of {', '.join(SKIPPED_LAYOUTS)}, got {skipped_layout!r}")
    if skipped_layout == "auto":
        skipped_layout = "NHWC" if target is not None and target.kind.name == "cuda" else "keep"
    mod = typed(mod, "mod")
    calls = layer_calls(mod, resolve_ops(CONV, "ops"))
    if isinstance(skip_layers, str):
        if skip_layers != "auto":
            raise ValueError(f"skip_layers must be 'auto' or a list of layer indices, got {skip_layers!r}")
        verdicts = [conv2d_verdict(call, dtype, out_dtype, pad_fraction, target) for call in calls]
        skipped = [SkippedLayer(i, v.reason) for i, v in enumerate(verdicts) if not v]
    else:
        indices = resolve_skip_layers(skip_layers, len(calls))
        skipped = [SkippedLayer(i, "skipped as requested") for i in sorted(indices)]
    skip = [layer.index for layer in skipped]
    config = LayoutConfig(skip_layers=skip, num_layers=len(calls))
    with config, tvm.transform.PassContext(opt_level=3):
        converted = relay.transform.ConvertLayout({CONV: [DATA_LAYOUT, "default"]})(mod)
    already = {i for i, call in enumerate(calls) if str(call.attrs.data_layout) == DATA_LAYOUT}
    _check_converted(converted, config, len(calls), (set(range(len(calls))) - set(skip)) | already)
    if skip and skipped_layout == "NHWC":
        # The converted layers are skipped this time: only the float ones move, to NHWC.
        others = sorted(set(range(len(calls))) - set(skip))
        with LayoutConfig(skip_layers=others, num_layers=len(calls)), tvm.transform.PassContext(opt_level=3):
            converted = relay.transform.ConvertLayout({CONV: ["NHWC", "default"]})(converted)
    # ConvertLayout keeps every layer's result type: no type inference needed before recasting.
    result_dtypes = [str(call.checked_type.dtype) for call in calls]
    recast_mod = recast_layers(converted, resolve_ops(CONV, "ops"), dtype, out_dtype, frozenset(skip), result_dtypes)
    return Prepared(relay.transform.InferType()(recast_mod), skipped)


#: The choices of ``prepare_for_tensorcore(skipped_layout=...)``.
SKIPPED_LAYOUTS = ("auto", "NHWC", "keep")


def _check_converted(mod: tvm.IRModule, config: LayoutConfig, num_layers: int, expected: set) -> None:
    """Check that conversion numbered the layers as count_layers does; an internal invariant."""
    calls = layer_calls(mod, resolve_ops(CONV, "ops"))
    converted = {i for i, call in enumerate(calls) if str(call.attrs.data_layout) == DATA_LAYOUT}
    seen = config.layers_seen.get(CONV, 0)
    if seen != num_layers or len(calls) != num_layers or converted != expected:
        raise RuntimeError(
            f"ConvertLayout visited {seen} of {num_layers} conv2d layers and converted {sorted(converted)}; "
            "the layer numbering of tvm_tcutils and ConvertLayout disagree"
        )
