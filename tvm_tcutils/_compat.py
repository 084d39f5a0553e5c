"""Compatibility shims between TVM 0.19 and the current onnx / onnxruntime.

TVM 0.19's ONNX importer and Relay-to-ONNX exporter read ``onnx.mapping``,
which onnx 1.19+ removed. :func:`ensure_onnx_mapping` puts back the few tables
TVM uses, computed from ``onnx.helper``'s own type conversion functions, so
both directions work with whichever onnx is installed. This is the only place
that patches a third-party module.
"""
from __future__ import annotations

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
