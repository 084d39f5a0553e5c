"""Compatibility shims between TVM 0.19 and the current onnx / onnxruntime.

TVM 0.19's ONNX importer and Relay-to-ONNX exporter read ``onnx.mapping``,
which onnx 1.19+ removed. :func:`ensure_onnx_mapping` puts back the few tables
TVM uses, computed from ``onnx.helper``'s own type conversion functions, so
both directions work with whichever onnx is installed. This is the only place
that patches a third-party module.

``import tvm_tcutils`` calls :func:`install_onnx_shim`: the tables go in when
onnx is imported (right away if it already is), so that a user's own
``relay.frontend.from_onnx`` works too, while importing the package neither
imports onnx (about 0.2 s) nor needs it installed.

:func:`install_onnx_converters` (also at ``import tvm_tcutils``) adds the
package's converters for the ONNX ops TVM 0.19 imports wrongly or not at all
(:mod:`tvm_tcutils.onnx_quantize_dynamic`: onnxruntime's dynamic quantization)
to the table TVM's importer looks operators up in.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types

#: Highest ONNX IR version the supported onnxruntime releases load.
MAX_ORT_IR_VERSION = 10


def ensure_onnx_mapping():
    """Make ``onnx.mapping`` importable (no-op when onnx still has it).

    Returns
    -------
    module
        The ``onnx`` module.

    Examples
    --------
    >>> onnx = ensure_onnx_mapping()
    >>> onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[onnx.TensorProto.FLOAT].name
    'float32'
    """
    import numpy as np
    import onnx

    if hasattr(onnx, "mapping") and hasattr(onnx.mapping, "TENSOR_TYPE_TO_NP_TYPE"):
        return onnx
    mapping = types.ModuleType("onnx.mapping")
    tensor_to_np = {}
    for tensor_type in onnx.TensorProto.DataType.values():
        try:
            np_type = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type))
        except (KeyError, TypeError):  # UNDEFINED (KeyError) and types numpy cannot represent
            continue
        tensor_to_np[tensor_type] = np_type
    np_to_tensor = {}
    for tensor_type, np_type in tensor_to_np.items():
        # The first (canonical) onnx type wins for numpy dtypes that several
        # onnx types map to, as the old table did.
        np_to_tensor.setdefault(np_type, tensor_type)
    mapping.TENSOR_TYPE_TO_NP_TYPE = tensor_to_np
    mapping.NP_TYPE_TO_TENSOR_TYPE = np_to_tensor
    mapping.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE = {t: t for t in tensor_to_np}
    onnx.mapping = mapping
    sys.modules["onnx.mapping"] = mapping
    return onnx


class _ShimmingLoader(importlib.abc.Loader):
    """onnx's own loader, followed by :func:`ensure_onnx_mapping` once the package has run."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        ensure_onnx_mapping()

    def __getattr__(self, name: str):
        # Resource and source queries (get_data, is_package, ...) are the real loader's.
        return getattr(self._loader, name)


class OnnxMappingFinder(importlib.abc.MetaPathFinder):
    """Finds ``onnx`` where Python would, and makes its import also put back ``onnx.mapping``."""

    #: Marks the finder across ``importlib.reload`` of this module (a new class object each time).
    tcutils_onnx_shim = True

    def find_spec(self, name, path, target=None):
        if name != "onnx":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None  # not installed: Python's own ModuleNotFoundError, unchanged
        spec.loader = _ShimmingLoader(spec.loader)
        return spec


def install_onnx_shim() -> None:
    """Make ``onnx.mapping`` available whenever onnx is (or gets) imported; idempotent.

    Examples
    --------
    >>> install_onnx_shim()
    >>> import onnx
    >>> from onnx.mapping import TENSOR_TYPE_TO_NP_TYPE
    >>> TENSOR_TYPE_TO_NP_TYPE[onnx.TensorProto.INT8].name
    'int8'
    """
    if sys.modules.get("onnx") is not None:  # None: marked unimportable
        ensure_onnx_mapping()
        return
    if not any(getattr(finder, "tcutils_onnx_shim", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, OnnxMappingFinder())


def dropout_for_inference(inputs, attrs, params):
    """ONNX ``Dropout`` at inference: its data, unchanged.

    TVM 0.19 converts ``Dropout`` by its opset-7 attribute ``ratio``; from opset 12 ``ratio`` and
    ``training_mode`` are inputs and TVM's converter fails ("expected float but got Object") on
    every model converted to a newer opset. A model that asks for training mode is refused.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> dropout_for_inference([x, relay.const(0.5)], {}, {}) is x
    True
    """
    from tvm import relay

    training = inputs[2] if len(inputs) > 2 else None
    if isinstance(training, relay.Constant) and bool(training.data.numpy()):
        raise ValueError("Dropout: training_mode=True is not an inference model; export it in eval mode")
    if training is not None and not isinstance(training, relay.Constant):
        raise ValueError("Dropout: training_mode must be a constant (an inference model has it False)")
    return inputs[0]


#: ONNX op type -> converter, for ops TVM 0.19's importer converts wrongly or not at all.
IMPORTER_GAPS = {"Dropout": dropout_for_inference}


def install_onnx_converters() -> None:
    """Make TVM's ONNX importer use the package's converters (:data:`onnx_quantize_dynamic.CONVERTERS`,
    :data:`IMPORTER_GAPS`); idempotent.

    TVM 0.19's ``relay.frontend.onnx`` builds its operator table anew in
    ``_get_convert_map(opset)`` for each node; that function is wrapped so that the
    table it returns holds the package's converters in place of TVM's for the same
    op types. Everything else is TVM's.

    Examples
    --------
    >>> install_onnx_converters()
    >>> from tvm.relay.frontend import onnx as frontend
    >>> frontend._get_convert_map(17)["MatMulInteger"].__module__
    'tvm_tcutils.onnx_quantize_dynamic'
    """
    from tvm.relay.frontend import onnx as frontend

    from .onnx_quantize_dynamic import CONVERTERS

    converters = {**CONVERTERS, **IMPORTER_GAPS}
    original = frontend._get_convert_map
    # The original across re-installs and importlib.reload of either module.
    original = getattr(original, "tcutils_original", original)

    def convert_map(opset):
        table = original(opset)
        table.update(converters)
        return table

    convert_map.tcutils_original = original
    convert_map.__doc__ = original.__doc__
    frontend._get_convert_map = convert_map


def onnx_model_for_ort(model):
    """Return ``model`` with an IR version the installed onnxruntime accepts.

    Examples
    --------
    >>> import onnx
    >>> m = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    >>> onnx_model_for_ort(m).ir_version <= MAX_ORT_IR_VERSION
    True
    """
    if model.ir_version <= MAX_ORT_IR_VERSION:
        return model
    fixed = type(model)()
    fixed.CopyFrom(model)
    fixed.ir_version = MAX_ORT_IR_VERSION
    return fixed
