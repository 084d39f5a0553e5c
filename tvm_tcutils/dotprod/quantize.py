"""int8 models for the dot-product schedules: the quantization ``tune`` and ``bench`` apply."""
from __future__ import annotations

from typing import Tuple

from .._tvm import tvm
from tvm import relay

from ..measure import Params

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
    with relay.quantize.qconfig(
        calibrate_mode="global_scale", global_scale=8.0, weight_scale="max", skip_conv_layers=[],
        skip_dense_layer=False,
    ):
        return relay.quantize.quantize(mod, params)


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
    if dtype == "int8":
        return quantize_int8(mod, params), {}
    return mod, params
