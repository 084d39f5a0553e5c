"""int8 models for the dot-product schedules: the quantization ``tune`` and ``bench`` apply."""
from __future__ import annotations

import logging
import os
import tempfile
from typing import Dict, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from tvm import relay

from ..files import atomic_path
from ..measure import Params
from ..prebuild import calls_op

logger = logging.getLogger("tvm_tcutils.dotprod.quantize")

#: Precisions ``tvm-tcutils tune`` and ``bench`` build.
DTYPES = ("float32", "int8")


def quantize_int8(mod: tvm.IRModule, params: Params) -> tvm.IRModule:
    """An int8 version of a float model (``relay.quantize``, weights bound as constants).

    Convolutions become int8; relay.quantize may leave some dense layers in fp32 (it does so
    for ResNet-50's final one).

    Uses a global activation scale and per-tensor max weight scales (TVM 0.19's
    default power-of-two weight calibration calls ``np.math``, gone in NumPy 2).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> qmod = quantize_int8(*load_model("mlp"))
    >>> dense_weights = []
    >>> relay.analysis.post_order_visit(qmod["main"], lambda e: dense_weights.append(
    ...     e.args[1].checked_type.dtype) if isinstance(e, relay.Call) and e.op.name == "nn.dense" else None)
    >>> dense_weights
    ['int8', 'int8', 'int8']
    >>> qmod["main"].ret_type  # inputs and outputs stay float
    TensorType([1, 10], float32)
    """
    # TVM's quantize binds the parameters by assigning the caller's module a new "main": it works on a
    # module of its own (the same functions), so that the caller's keeps its parameters.
    own = tvm.IRModule(dict(mod.functions.items()), dict(mod.type_definitions.items()))
    with relay.quantize.qconfig(
        calibrate_mode="global_scale", global_scale=8.0, weight_scale="max", skip_conv_layers=[],
        skip_dense_layer=False,
    ):
        return relay.quantize.quantize(own, params)


def prepare(mod: tvm.IRModule, params: Params, dtype: str) -> Tuple[tvm.IRModule, Params]:
    """The model to compile for ``dtype`` (``"float32"`` as is, ``"int8"`` quantized).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = prepare(*load_model("mlp"), "float32")   # as is
    >>> qmod, qparams = prepare(*load_model("mlp"), "int8")     # weights bound as int8 constants
    >>> len(params) > 0, qparams
    (True, {})
    """
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    if dtype == "float32":
        return mod, params
    if is_quantized(mod):
        # An int8 model from a quantizer (QDQ or QOperator ONNX): quantizing it again with
        # relay.quantize would stack a second quantization on its own; it is built as it is.
        logger.info("the model is already quantized (qnn ops): built as it is, not through relay.quantize")
        return mod, params
    return quantize_int8(mod, params), {}


#: Operators that mark a model as already quantized (an ONNX QDQ or QOperator import).
QUANTIZED_OPS = ("qnn.quantize", "qnn.conv2d", "qnn.dense", "qnn.batch_matmul")


def is_quantized(mod: tvm.IRModule) -> bool:
    """Whether ``mod`` already holds quantized ops (:data:`QUANTIZED_OPS`): a quantizer's int8 model.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> is_quantized(mod), is_quantized(quantize_int8(mod, params))
    (False, False)
    """
    return any(calls_op(mod, name) for name in QUANTIZED_OPS)


#: onnxruntime ``quantize_static`` formats :func:`ort_quantize` writes.
ORT_FORMATS = ("qdq", "qoperator")


def ort_quantize(model, path: str, samples: Sequence[Dict[str, np.ndarray]], fmt: str = "qdq",
                 per_channel: bool = True, reduce_range: bool = False) -> str:
    """Quantize an ONNX model with onnxruntime's ``quantize_static`` (u8 activations, s8 weights).

    Parameters
    ----------
    model : onnx.ModelProto or str
        The float model (or its file).
    path : str
        Where the quantized model goes (written whole or not at all).
    samples : sequence of dict
        Calibration inputs (name -> array), at least one.
    fmt : {"qdq", "qoperator"}
        ``QuantFormat.QDQ`` (QuantizeLinear / DequantizeLinear around float ops, the default of
        ``quantize_static``) or ``QuantFormat.QOperator`` (``QLinearConv``, ``QLinearAdd``...).
    per_channel : bool
        Per-output-channel weight scales.
    reduce_range : bool
        7-bit weights (int8 in [-64, 64]), which AVX2 runs on the 8-bit multiply-add exactly.

    Returns
    -------
    str
        ``path``.

    Examples
    --------
    >>> import os, tempfile
    >>> from tvm_tcutils.onnx_writer import OnnxGraph
    >>> g = OnnxGraph(); g.input("x", "float32", [1, 4])
    >>> g.output(g.node("MatMul", ["x", g.const(np.eye(4, dtype="float32"), "w")]), "float32", [1, 4])
    >>> out = ort_quantize(g.model(), os.path.join(tempfile.mkdtemp(), "q.onnx"), [{"x": np.ones((1, 4), "float32")}])
    >>> import onnx; sorted({n.op_type for n in onnx.load(out).graph.node})
    ['DequantizeLinear', 'MatMul', 'QuantizeLinear']
    """
    if fmt not in ORT_FORMATS:
        raise ValueError(f"fmt must be one of {ORT_FORMATS}, got {fmt!r}")
    if not samples:
        raise ValueError("samples must hold at least one calibration input")
    import onnx
    from onnxruntime import quantization as ortq

    class _Reader(ortq.CalibrationDataReader):
        def __init__(self):
            self._rest = iter(samples)

        def get_next(self):
            return next(self._rest, None)

    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        source = model if isinstance(model, str) else os.path.join(scratch, "float.onnx")
        if not isinstance(model, str):
            onnx.save(model, source)
        with atomic_path(path, suffix=".onnx") as partial:  # a reader never sees half a model
            ortq.quantize_static(
                source, partial, _Reader(),
                quant_format=ortq.QuantFormat.QDQ if fmt == "qdq" else ortq.QuantFormat.QOperator,
                per_channel=per_channel, reduce_range=reduce_range, activation_type=ortq.QuantType.QUInt8,
                weight_type=ortq.QuantType.QInt8)
    return path
