"""ConvertLayout handlers for ``nn.conv2d`` and ``qnn.conv2d``: HWNC, NCHW, NHWC and LayoutConfig.

What they take over from TVM's own handlers (and nothing else):

* inside a :class:`LayoutConfig` scope, the layers it lists keep their layout
  and the others are converted here;
* ``qnn.conv2d`` to ``HWNC``, which TVM's handler refuses.

Every other case returns None, so the registry calls TVM's original handler:
without a scope, ``nn.conv2d`` and ``qnn.conv2d`` to NCHW/NHWC behave exactly
as in TVM, and tiled layouts such as ``NCHW16c`` are always TVM's.

``"default"`` as the kernel layout means the data layout's partner:
``NCHW -> OIHW``, ``NHWC -> HWIO`` (``HWOI`` for depthwise, as TVM does) and
``HWNC -> HWOI``.
"""
from __future__ import annotations

from typing import Callable, Dict, FrozenSet, Optional, Sequence

from .._tvm import tvm
from tvm import relay

from ._graph import AttrsReplacer
from .layout_config import next_layer_skipped

#: Data layout -> kernel layout that ``"default"`` stands for.
DEFAULT_KERNEL_LAYOUTS: Dict[str, str] = {"NCHW": "OIHW", "NHWC": "HWIO", "HWNC": "HWOI"}
#: Exceptions for depthwise convolutions (TVM's NHWC depthwise schedules want HWOI).
DEPTHWISE_KERNEL_LAYOUTS: Dict[str, str] = {"NHWC": "HWOI"}
#: Data layouts TVM's own handler converts, per op (the rest of our table is ours alone).
TVM_HANDLES: Dict[str, FrozenSet[str]] = {
    "nn.conv2d": frozenset({"NCHW", "NHWC", "HWNC"}),
    "qnn.conv2d": frozenset({"NCHW", "NHWC"}),
}
_KERNEL_AXES = sorted("OIHW")
_REPLACE_ATTRS = AttrsReplacer()


def _channels(shape, layout: str, axis: str) -> int:
    return int(shape[layout.index(axis)])


def _is_depthwise(attrs, tinfos) -> bool:
    data_type, kernel_type = tinfos[0], tinfos[1]
    in_channels = _channels(data_type.shape, str(attrs.data_layout), "C")
    out_channels = _channels(kernel_type.shape, str(attrs.kernel_layout), "O")
    return int(attrs.groups) == in_channels == out_channels


def _desired(desired_layouts: Sequence) -> tuple:
    layouts = [str(layout) for layout in desired_layouts]
    if len(layouts) != 2 or layouts[0] == "default":
        raise ValueError(
            f"desired_layouts for conv2d must be [data_layout, kernel_layout] with data_layout one of "
            f"{sorted(DEFAULT_KERNEL_LAYOUTS)} (or a TVM layout such as NCHW16c) and kernel_layout "
            f"'default' or a permutation of OIHW; got {layouts}"
        )
    return layouts[0], layouts[1]


def _kernel_layout(data_layout: str, kernel_layout: str, attrs, tinfos) -> str:
    if kernel_layout == "default":
        if data_layout in DEPTHWISE_KERNEL_LAYOUTS and _is_depthwise(attrs, tinfos):
            return DEPTHWISE_KERNEL_LAYOUTS[data_layout]
        return DEFAULT_KERNEL_LAYOUTS[data_layout]
    if sorted(kernel_layout) != _KERNEL_AXES:
        raise ValueError(
            f"desired_layouts: kernel layout {kernel_layout!r} for {data_layout} must be 'default' "
            f"or a permutation of OIHW such as {DEFAULT_KERNEL_LAYOUTS[data_layout]}"
        )
    return kernel_layout


def _handler(op_name: str) -> Callable:
    op = tvm.ir.Op.get(op_name)

    def convert(attrs, inputs, tinfos, desired_layouts) -> Optional[relay.Expr]:
        """HWNC/NCHW/NHWC conversion that honours LayoutConfig."""
        data_layout, kernel_layout = _desired(desired_layouts)
        skipped = next_layer_skipped(op_name)
        if skipped:
            return relay.Call(op, list(inputs), attrs)
        in_scope = skipped is not None
        if data_layout not in DEFAULT_KERNEL_LAYOUTS or (not in_scope and data_layout in TVM_HANDLES[op_name]):
            return None
        new_attrs = _REPLACE_ATTRS(
            attrs, data_layout=data_layout, kernel_layout=_kernel_layout(data_layout, kernel_layout, attrs, tinfos)
        )
        return relay.Call(op, list(inputs), new_attrs)

    convert.__name__ = f"convert_{op_name.replace('.', '_')}_layout"
    return convert


#: The handlers, by op.
HANDLERS: Dict[str, Callable] = {name: _handler(name) for name in TVM_HANDLES}
