"""One row per layer: shapes, types, layouts and whether it qualifies for HWNC tensor cores."""
from __future__ import annotations

import dataclasses
from typing import Iterable, List, Optional, Tuple, Union

from .._tvm import tvm
from tvm import relay

from .rules import DATA_LAYOUT, KERNEL_LAYOUT, Verdict, hwnc_conv2d_qualifies
from ._graph import ExprOrMod, check_dtype, check_numbering, numbered_layers, resolve_ops, typed

#: Ops that have HWNC tensor-core schedules.
CONV_OPS = ("nn.conv2d", "qnn.conv2d")


@dataclasses.dataclass(frozen=True)
class Layer:
    """One row of :func:`layer_table`."""

    index: int
    op: str
    input_shapes: Tuple[Tuple[int, ...], ...]
    input_dtypes: Tuple[str, ...]
    output_shape: Tuple[int, ...]
    output_dtype: str
    data_layout: str
    kernel_layout: str
    qualifies: bool
    reason: str

    def __str__(self) -> str:
        shape = "x".join(map(str, self.input_shapes[0])) if self.input_shapes else "-"
        out = "x".join(map(str, self.output_shape))
        layout = f"{self.data_layout}/{self.kernel_layout}" if self.data_layout else "-"
        verdict = "yes" if self.qualifies else f"no: {self.reason}"
        dtype = self.input_dtypes[0] if self.input_dtypes else "-"
        return (
            f"{self.index:>5}  {self.op:<12} {shape:<18} {dtype:<8} -> {out:<18} {self.output_dtype:<8} "
            f"{layout:<10} {verdict}"
        )


HEADER = (
    f"{'layer':>5}  {'op':<12} {'input':<18} {'dtype':<8}    {'output':<18} {'dtype':<8} {'layout':<10} "
    "HWNC tensor cores"
)


def _shape(ttype) -> Tuple[int, ...]:
    return tuple(int(dim) if isinstance(dim, tvm.tir.IntImm) else -1 for dim in ttype.shape)


def _tensor_types(ttype) -> List[relay.TensorType]:
    if isinstance(ttype, relay.TupleType):
        return [t for field in ttype.fields for t in _tensor_types(field)]
    return [ttype] if isinstance(ttype, relay.TensorType) else []


TargetLike = Union[str, "tvm.target.Target", None]


def as_target(target: TargetLike) -> Optional[tvm.target.Target]:
    """``target`` as a ``tvm.target.Target`` (``None`` stays ``None``: the layer alone is judged).

    Raises
    ------
    TypeError
        For anything but a string, a target or ``None``.

    Examples
    --------
    >>> str(as_target("cuda -arch=sm_90").attrs["arch"]), as_target(None)
    ('sm_90', None)
    """
    if target is None or isinstance(target, tvm.target.Target):
        return target
    if isinstance(target, str):
        return tvm.target.Target(target)
    raise TypeError(f"target must be a target string like 'cuda -arch=sm_80' or a tvm.target.Target, "
                    f"got {type(target).__name__}")


def conv2d_verdict(
    call: relay.Call, dtype: str, out_dtype: str = "int32", pad_fraction: Optional[float] = None,
    target: TargetLike = None,
) -> Verdict:
    """Judge a typed conv2d call as it will be after conversion to HWNC and recasting to ``dtype``.

    A layer not yet in HWNC gets the HWOI kernel that conversion gives it; one
    already in HWNC is judged with its own kernel layout. With a ``target`` the
    target's rules apply too (:func:`tvm_tcutils.tensorcore.rules.hwnc_conv2d_qualifies`):
    a CUDA arch with these tensor cores, and no int4/uint4 on sm_90 and newer.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.tensorcore._graph import layer_calls, resolve_ops
    >>> mod, _ = load_model("resnet-18")
    >>> first = layer_calls(mod, resolve_ops("nn.conv2d", "ops"))[0]
    >>> conv2d_verdict(first, "int4").qualifies
    False
    """
    if call.op.name not in CONV_OPS:
        return Verdict(False, f"{call.op.name} has no HWNC tensor-core schedule (only {', '.join(CONV_OPS)})")
    attrs = call.attrs
    data_layout, kernel_layout = str(attrs.data_layout), str(attrs.kernel_layout)
    data_shape = _shape(call.args[0].checked_type)
    out_layout = str(attrs.out_layout) or data_layout
    out_shape = _shape(call.checked_type)
    sizes = (data_shape[data_layout.index("N")], data_shape[data_layout.index("C")], out_shape[out_layout.index("C")])
    if min(sizes) < 1:
        return Verdict(False, "dynamic batch or channel count; the schedules need static shapes")
    converted_kernel = kernel_layout if data_layout == DATA_LAYOUT else KERNEL_LAYOUT
    return hwnc_conv2d_qualifies(
        *sizes, dtype, groups=int(attrs.groups), out_dtype=out_dtype,
        data_layout=DATA_LAYOUT, kernel_layout=converted_kernel, pad_fraction=pad_fraction,
        target=as_target(target),
    )


def layer_table(
    expr_or_mod: ExprOrMod,
    valid_ops: Union[str, Iterable[str]] = ("nn.conv2d",),
    dtype: str = "int4",
    out_dtype: str = "int32",
    pad_fraction: Optional[float] = None,
    numbering: str = "chain",
    target: TargetLike = None,
) -> List[Layer]:
    """Describe every layer of ``valid_ops``, numbered as by :func:`count_layers`.

    Parameters
    ----------
    expr_or_mod : tvm.IRModule or relay.Expr
        The graph; type-checked first when it has no types. Not modified.
    valid_ops : list of str
        Op names whose calls are layers.
    dtype, out_dtype : str
        The types the layers would be recast to, for the tensor-core verdict.
    pad_fraction : float, optional
        Channel-padding tolerance of the verdict; default: the current setting
        that the tensor-core legalization also reads
        (:func:`tvm_tcutils.tensorcore.rules.max_pad_fraction`, 1.0 unless changed).
    numbering : {"chain", "tvm"}
        The layer numbering of the ``index`` column; under ``"tvm"`` the
        layers of ``main`` only, and parallel ones share an index (as in
        TVM's ``recast``).
    target : str or tvm.target.Target, optional
        The build's target, for its rules too: a CUDA arch with tensor cores
        for ``dtype`` (a CUDA target needs ``-arch`` when no GPU is attached),
        and no int4/uint4 for sm_90 and newer (no 4-bit MMA instruction there:
        int4 ran slower than int8 on an H200). Default:
        the layers alone are judged.

    Returns
    -------
    list of Layer
        Index, op, input shapes and dtypes, output shape and dtype, layouts,
        and whether the layer qualifies for the HWNC tensor-core schedules
        (with the reason when not). ``str(row)`` formats a row under :data:`HEADER`.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> rows = layer_table(mod, ["nn.conv2d"])
    >>> rows[0].reason
    '3 input channels would be padded to 32 (+967% work > 100% allowed)'
    >>> all(row.qualifies for row in rows[1:])
    True
    >>> [row.index for row in layer_table(mod, ["nn.conv2d"], numbering="tvm")][:6]  # a shortcut: 2 twice
    [0, 1, 2, 2, 3, 4]
    >>> print(layer_table(mod, ["nn.conv2d"], target="cuda -arch=sm_90")[1])  # doctest: +ELLIPSIS
        1  nn.conv2d ... no: int4 on sm_90 and newer (target has sm_90): no 4-bit MMA instruction ...; use int8
    """
    ops = resolve_ops(valid_ops, "valid_ops")
    check_dtype(dtype, "dtype")
    check_dtype(out_dtype, "out_dtype")
    target = as_target(target)
    _, functions = numbered_layers(typed(expr_or_mod), ops, check_numbering(numbering))
    rows = []
    for call, index in (layer for _, _, layers in functions for layer in layers):
        inputs = [t for arg in call.args for t in _tensor_types(arg.checked_type)]
        outputs = _tensor_types(call.checked_type)
        verdict = conv2d_verdict(call, dtype, out_dtype, pad_fraction, target)
        attrs = call.attrs
        has_layout = attrs is not None and "data_layout" in attrs.keys()
        rows.append(
            Layer(
                index=index,
                op=call.op.name,
                input_shapes=tuple(_shape(t) for t in inputs),
                input_dtypes=tuple(str(t.dtype) for t in inputs),
                output_shape=_shape(outputs[0]) if outputs else (),
                output_dtype=str(outputs[0].dtype) if outputs else "",
                data_layout=str(attrs.data_layout) if has_layout else "",
                kernel_layout=str(attrs.kernel_layout) if has_layout and "kernel_layout" in attrs.keys() else "",
                qualifies=verdict.qualifies,
                reason=verdict.reason,
            )
        )
    return rows
