"""Relay to ONNX: convert a Relay function into an ONNX model onnxruntime runs well.

This is the converter behind the ``tcutils_ort`` toolchain. It differs from
TVM 0.19's exporter (:mod:`tvm.contrib.target.onnx`) where that one is wrong or
slow for this use, and calls into it where it is right:

* constants become initializers only, never graph inputs, so onnxruntime can
  fold and fuse them (TVM lists them as inputs as well);
* the graph is walked once, iteratively, over types inferred once (TVM infers
  types again for every call node and recurses);
* opset 17, so that ``Softmax`` means Relay's softmax on any axis and
  ``LayerNormalization`` exists; TVM's opset-11 converters for ``Squeeze``,
  ``Unsqueeze``, ``bias_add`` and ``ReduceSum`` do not apply there;
* average pooling keeps ``count_include_pad``; ``tanh``, ``erf``, ``lrn``,
  ``batch_matmul``, ``matmul``, ``layer_norm``, ``variance`` and the other
  rows of :data:`CONVERTERS` that TVM lacks are added;
* composite functions (as made by ``relay.transform.MergeComposite``) are
  inlined first, and decomposed layer norms (``mean``, ``variance``, ``sqrt``,
  ``divide`` as TVM's ONNX importer writes ``LayerNormalization``) are fused
  back into one ``LayerNormalization`` node, which onnxruntime runs as one
  kernel (about 15% of a BERT-like encoder's time otherwise);
* the IR version is one onnxruntime accepts (:func:`_compat.onnx_model_for_ort`);
* quantized models: ``qnn.quantize`` / ``qnn.dequantize`` with constant
  scales and zero points (per tensor, or per channel along ``axis``; int8 and
  uint8, and int32 dequantized with a zero point of 0 as quantizers write
  biases) become ``QuantizeLinear`` / ``DequantizeLinear``, their scale and zero
  point initializers. ``DequantizeLinear -> Conv / Gemm -> QuantizeLinear``
  regions are what onnxruntime fuses into integer kernels (``QLinearConv``,
  ``QGemm``, ``QLinearAdd``...) when the session is created, so a convolution's
  ``bias_add`` and a ``dense``'s bias ``add`` are written as the Conv's / Gemm's
  own bias input (with an ``Add`` after them the sum would stay float). Ops
  that only move values (``reshape``, ``transpose``, ``concatenate``,
  ``strided_slice``, ``max_pool2d``...) are claimed on int8 and uint8 tensors
  too, where they are exact; arithmetic stays float32 only.

Rounding of ``qnn.quantize``: Relay's is ``clip(round(x / scale) + zero_point)``
and ONNX's ``QuantizeLinear`` the same float32 division, saturation and zero
point, but TVM's generic lowering rounds exact ties (``x / scale`` a half
integer) away from zero, ONNX to even. Results differ by one quantization step
there, and only there (``python_tests/collage/test_relay_to_onnx.py`` checks
both: equal elsewhere, the tie rule at ties). The calls are claimed anyway:
the models that hold them are QDQ files whose ``QuantizeLinear`` means half to
even, which is also what the package's own TVM build of QDQ regions on
dot-product CPUs computes (:mod:`tvm_tcutils.dotprod.qdq`); and a float op
before a quantize moves values across rounding boundaries by its accumulation
order alone, so partitions of quantized models match TVM within a step, not
bit for bit, whatever the rule at ties.

TVM's converters are used as they are for ``softmax``, ``batch_flatten`` and
``concatenate``. Each row of :data:`CONVERTERS` says which calls it handles (its predicate);
:func:`supported` answers for one call, and the ``tcutils_ort`` pattern table
claims exactly those calls.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Dict, List, Optional

import numpy as np

from ..._tvm import tvm
from ...onnx_writer import OPSET, OnnxGraph, onnx_dtype  # noqa: F401  (OPSET: what the exporter emits)
from tvm import relay

#: Element types the converter claims (onnxruntime's CPU kernels cover them).
FLOAT_TYPES = ("float32",)

#: Types ``qnn.quantize`` makes and ``qnn.dequantize`` reads as ONNX's QuantizeLinear / DequantizeLinear
#: (opset 17) do; ``qnn.dequantize`` of int32 (a quantizer's bias) is claimed too, with a zero point of 0.
QUANTIZED_TYPES = ("int8", "uint8")


class _Graph(OnnxGraph):
    """The package's ONNX writer (:class:`tvm_tcutils.onnx_writer.OnnxGraph`) as TVM's converters see it.

    Offers the ``add_nodes`` / ``add_inputs`` / ``add_initializers``
    interface of TVM's ``ModelContainer`` so that TVM's own op converters can
    write into it; inputs that TVM adds for its constants are dropped, because
    constants belong in the initializers only.
    """

    # -- TVM ModelContainer interface -------------------------------------
    def add_nodes(self, nodes) -> None:
        self.nodes.extend(nodes)

    def add_initializers(self, initializers) -> None:
        self.initializers.extend(initializers)

    def add_inputs(self, inputs) -> None:
        """Ignored: TVM's converters call it for constants, which are initializers here."""

    def relay_value(self, name: str, ttype):
        """A graph input or output of a Relay tensor type."""
        return self.value_info(name, ttype.dtype, _shape(ttype))

    def __init__(self, name: str = "tvm_tcutils"):
        super().__init__(name)
        #: How many times each node of the body being converted is used (by other nodes, or as the result).
        self.uses: Dict[relay.Expr, int] = {}

    # -- for converters -----------------------------------------------------
    def producer(self, name: str):
        """The node that computes value ``name`` (None for inputs and initializers)."""
        # Converters look for the node they just wrote: a search from the end is short.
        for node in reversed(self.nodes):
            if name in node.output:
                return node
        return None


def _shape(ttype) -> List[int]:
    return [int(dim) for dim in ttype.shape]


def _ints(values) -> List[int]:
    return [int(v) for v in values] if values is not None else []


# --------------------------------------------------------------------------
# Predicates.
# --------------------------------------------------------------------------
def _tensor_types(call: relay.Call) -> list:
    types = []
    for arg in call.args:
        ttype = arg.checked_type
        types.extend(ttype.fields if isinstance(ttype, relay.TupleType) else [ttype])
    out = call.checked_type
    types.extend(out.fields if isinstance(out, relay.TupleType) else [out])
    return types


def _static(ttype) -> bool:
    return isinstance(ttype, relay.TensorType) and all(isinstance(dim, tvm.tir.IntImm) for dim in ttype.shape)


def _static_float(call: relay.Call) -> bool:
    """All operands and results are statically shaped tensors of a claimed float type."""
    return all(_static(ttype) and str(ttype.dtype) in FLOAT_TYPES for ttype in _tensor_types(call))


def _static_moving(call: relay.Call) -> bool:
    """A call of an op that only moves or selects values: also claimed on 8-bit tensors (of one type).

    Its ONNX op (Reshape, Transpose, Concat, Slice, MaxPool...) is defined on int8 and uint8 in
    opset 17, runs there in onnxruntime and OpenVINO, and picks values without arithmetic, so it is
    exact on them; an int8 region can then go on past it without a QuantizeLinear / DequantizeLinear.
    """
    if _static_float(call):
        return True
    types = _tensor_types(call)
    return all(_static(ttype) and str(ttype.dtype) == str(types[0].dtype) for ttype in types) and str(
        types[0].dtype) in QUANTIZED_TYPES


def _nchw_pool(call: relay.Call) -> bool:
    return _static_float(call) and _nchw(call)


def _nchw(call: relay.Call) -> bool:
    return call.attrs.layout == "NCHW" and len(call.args[0].checked_type.shape) == 4


def _moving_max_pool(call: relay.Call) -> bool:
    return _static_moving(call) and _nchw(call)


def _no_dilation(call: relay.Call) -> bool:
    return _nchw_pool(call) and all(int(d) == 1 for d in call.attrs.dilation)


def _conv2d_ok(call: relay.Call) -> bool:
    attrs = call.attrs
    return (
        _static_float(call)
        and attrs.data_layout == "NCHW"
        and attrs.kernel_layout == "OIHW"
        and str(attrs.out_dtype) in ("", str(call.args[0].checked_type.dtype))
    )


def _same_out_dtype(call: relay.Call) -> bool:
    return _static_float(call) and str(call.attrs.out_dtype) in ("", str(call.args[0].checked_type.dtype))


def _last_axis(call: relay.Call) -> bool:
    ndim = len(call.args[0].checked_type.shape)
    return _static_float(call) and int(call.attrs.axis) in (-1, ndim - 1)


def _channel_axis(call: relay.Call) -> bool:
    ndim = len(call.args[0].checked_type.shape)
    return _static_float(call) and ndim >= 2 and int(call.attrs.axis) in (1, 1 - ndim)


def _cast_ok(call: relay.Call) -> bool:
    src = str(call.args[0].checked_type.dtype)
    dst = str(call.checked_type.dtype)
    kinds = FLOAT_TYPES + ("float16", "int32", "int64", "int8", "uint8")
    return src in kinds and dst in kinds and src != dst


# --------------------------------------------------------------------------
# Converters: (graph, call, input names) -> output name.
# --------------------------------------------------------------------------
Converter = Callable[[_Graph, relay.Call, List[str]], str]


def _unary(op_type: str) -> Converter:
    def convert(graph: _Graph, call: relay.Call, ins: List[str]) -> str:
        return graph.node(op_type, ins[:1])

    return convert


def _binary(op_type: str) -> Converter:
    def convert(graph: _Graph, call: relay.Call, ins: List[str]) -> str:
        return graph.node(op_type, ins[:2])

    return convert


def _rsqrt(graph, call, ins):
    return graph.node("Reciprocal", [graph.node("Sqrt", ins[:1])])


def _conv2d(graph, call, ins):
    attrs = call.attrs
    return graph.node(
        "Conv", ins[:2],
        group=int(attrs.groups), pads=_ints(attrs.padding),
        strides=_ints(attrs.strides), dilations=_ints(attrs.dilation),
    )


def _transposed_operand(graph: _Graph, expr: relay.Expr, name: str, perm: List[int]) -> str:
    """``expr`` transposed by ``perm``: folded into a new initializer when it is a constant."""
    if isinstance(expr, relay.Constant):
        return graph.const(np.ascontiguousarray(expr.data.numpy().transpose(perm)), "weight_t")
    return graph.node("Transpose", [name], perm=perm)


def _dense(graph, call, ins):
    data, weight = call.args
    if not isinstance(weight, relay.Constant) and len(data.checked_type.shape) == 2:
        # A weight passed in (a lifted one, see packed_call.lift_constants): Gemm reads it transposed,
        # where a Transpose node would make onnxruntime fold a transposed copy of it.
        return graph.node("Gemm", [ins[0], ins[1]], transB=1)
    return graph.node("MatMul", [ins[0], _transposed_operand(graph, weight, ins[1], [1, 0])])


def _matmul_like(graph, call, ins):
    """``nn.matmul`` and ``nn.batch_matmul`` with their transpose flags."""
    names = []
    for expr, name, flag in zip(call.args, ins, (call.attrs.transpose_a, call.attrs.transpose_b)):
        if flag:
            ndim = len(expr.checked_type.shape)
            perm = list(range(ndim - 2)) + [ndim - 1, ndim - 2]
            name = _transposed_operand(graph, expr, name, perm)
        names.append(name)
    return graph.node("MatMul", names)


def _channel_shaped(graph: _Graph, vector_name: str, vector_expr, ndim: int, axis: int) -> str:
    """A 1-d vector reshaped to broadcast along ``axis`` of an ``ndim`` tensor."""
    axis = axis + ndim if axis < 0 else axis
    tail = ndim - axis - 1
    if tail == 0:
        return vector_name
    if isinstance(vector_expr, relay.Constant):
        value = vector_expr.data.numpy()
        return graph.const(value.reshape(value.shape + (1,) * tail), "bias")
    return graph.node("Unsqueeze", [vector_name, graph.const(list(range(1, tail + 1)), "axes", np.int64)])


def _bias_input(graph: _Graph, producer: relay.Expr, name: str, op_type: str, bias: str) -> bool:
    """Give the ``op_type`` node computing ``name`` (``producer``'s value) the bias input ``bias``.

    onnxruntime fuses ``DequantizeLinear -> Conv / Gemm -> QuantizeLinear`` with a dequantized int32
    bias into one integer kernel (QLinearConv, QGemm) only when the bias is the node's own third
    input; after an Add the sum stays float. False (nothing changed) unless the node is of that type,
    has no bias yet, and nothing else reads its value (it changes to include the bias).
    """
    node = graph.producer(name)
    if node is None or node.op_type != op_type or len(node.input) != 2 or graph.uses.get(producer) != 1:
        return False
    # Moved last: the bias may be computed after it (a DequantizeLinear), and nothing between reads it.
    graph.nodes.remove(node)
    node.input.append(bias)
    graph.nodes.append(node)
    return True


def _bias_add(graph, call, ins):
    data = call.args[0]
    ndim = len(data.checked_type.shape)
    axis = int(call.attrs.axis)
    # Conv's bias B is per output channel, the NCHW axis 1.
    if axis in (1, 1 - ndim) and _bias_input(graph, data, ins[0], "Conv", ins[1]):
        return ins[0]
    bias = _channel_shaped(graph, ins[1], call.args[1], ndim, axis)
    return graph.node("Add", [ins[0], bias])


def _add(graph, call, ins):
    # A Gemm's (dense's) bias as its input C when it broadcasts into the product (the sum has its shape).
    for index in (0, 1):
        gemm = call.args[index]
        if _shape(call.checked_type) == _shape(gemm.checked_type) and _bias_input(
                graph, gemm, ins[index], "Gemm", ins[1 - index]):
            return ins[index]
    return graph.node("Add", ins[:2])


def _optional_param(graph: _Graph, name: str, use: bool, size: int, fill: float, dtype: str) -> str:
    return name if use else graph.const(np.full((size,), fill, dtype=dtype), "fill")


def _layer_norm(graph, call, ins):
    attrs = call.attrs
    ttype = call.args[0].checked_type
    size, dtype = int(ttype.shape[-1]), str(ttype.dtype)
    gamma = _optional_param(graph, ins[1], bool(attrs.scale), size, 1.0, dtype)
    beta = _optional_param(graph, ins[2], bool(attrs.center), size, 0.0, dtype)
    return graph.node("LayerNormalization", [ins[0], gamma, beta], axis=-1, epsilon=float(attrs.epsilon))


def _batch_norm(graph, call, ins):
    attrs = call.attrs
    ttype = call.args[0].checked_type
    size, dtype = int(ttype.shape[1]), str(ttype.dtype)
    gamma = _optional_param(graph, ins[1], bool(attrs.scale), size, 1.0, dtype)
    beta = _optional_param(graph, ins[2], bool(attrs.center), size, 0.0, dtype)
    return graph.node(
        "BatchNormalization", [ins[0], gamma, beta, ins[3], ins[4]], epsilon=float(attrs.epsilon)
    )


def _pool_attrs(attrs) -> dict:
    return {
        "kernel_shape": _ints(attrs.pool_size),
        "strides": _ints(attrs.strides),
        "pads": _ints(attrs.padding),
        "ceil_mode": int(bool(attrs.ceil_mode)),
    }


def _max_pool(graph, call, ins):
    return graph.node("MaxPool", ins[:1], dilations=_ints(call.attrs.dilation), **_pool_attrs(call.attrs))


def _avg_pool(graph, call, ins):
    return graph.node(
        "AveragePool", ins[:1], count_include_pad=int(bool(call.attrs.count_include_pad)), **_pool_attrs(call.attrs)
    )


def _reshape(graph, call, ins):
    # The inferred shape is static and free of Relay's special values (-2, -3, -4).
    return graph.node("Reshape", [ins[0], graph.const(_shape(call.checked_type), "shape", np.int64)])


def _transpose(graph, call, ins):
    ndim = len(call.args[0].checked_type.shape)
    axes = _ints(call.attrs.axes) or list(reversed(range(ndim)))
    return graph.node("Transpose", ins[:1], perm=[a + ndim if a < 0 else a for a in axes])


def _reduce_axes(call: relay.Call) -> List[int]:
    ndim = len(call.args[0].checked_type.shape)
    axes = [a + ndim if a < 0 else a for a in _ints(call.attrs.axis)] if call.attrs.axis is not None else []
    if call.attrs.exclude:
        axes = [a for a in range(ndim) if a not in axes]
    elif call.attrs.axis is None:
        axes = list(range(ndim))
    return axes


def _reduce(op_type: str) -> Converter:
    def convert(graph, call, ins):
        keepdims = int(bool(call.attrs.keepdims))
        # ReduceSum takes its axes as an input from opset 13; the others still as an attribute.
        if op_type == "ReduceSum":
            return graph.node(op_type, [ins[0], graph.const(_reduce_axes(call), "axes", np.int64)], keepdims=keepdims)
        return graph.node(op_type, ins[:1], axes=_reduce_axes(call), keepdims=keepdims)

    return convert


def _nonempty_reduce(call: relay.Call) -> bool:
    return _static_float(call) and bool(_reduce_axes(call))


def _variance(graph, call, ins):
    """``variance(data, mean)``: mean of squared deviations (Bessel-corrected when unbiased)."""
    diff = graph.node("Sub", ins[:2])
    square = graph.node("Mul", [diff, diff])
    axes = _reduce_axes(call)
    out = graph.node("ReduceMean", [square], axes=axes, keepdims=int(bool(call.attrs.keepdims)))
    if call.attrs.unbiased:
        shape = _shape(call.args[0].checked_type)
        count = int(np.prod([shape[a] for a in axes]))
        factor = graph.const(np.array(count / max(count - 1, 1), dtype=str(call.checked_type.dtype)), "bessel")
        out = graph.node("Mul", [out, factor])
    return out


def _clip(graph, call, ins):
    dtype = str(call.checked_type.dtype)
    low = graph.const(np.array(float(call.attrs.a_min), dtype=dtype), "min")
    high = graph.const(np.array(float(call.attrs.a_max), dtype=dtype), "max")
    return graph.node("Clip", [ins[0], low, high])


def _strided_slice(graph, call, ins):
    attrs = call.attrs
    shape = _shape(call.args[0].checked_type)
    axes = _ints(attrs.axes) if attrs.axes is not None else list(range(len(_ints(attrs.begin))))
    begin, end = _ints(attrs.begin), _ints(attrs.end)
    strides = _ints(attrs.strides) or [1]
    strides = strides + [strides[-1]] * (len(axes) - len(strides)) if len(strides) == 1 else strides
    if attrs.slice_mode == "size":
        end = [shape[a] if size < 0 else b + size for a, b, size in zip(axes, begin, end)]
        strides = [1] * len(axes)
    # Relay clamps "end" like numpy; INT64 bounds keep that meaning in ONNX.
    return graph.node(
        "Slice",
        [
            ins[0],
            graph.const(begin, "starts", np.int64),
            graph.const(end, "ends", np.int64),
            graph.const(axes, "axes", np.int64),
            graph.const(strides, "steps", np.int64),
        ],
    )


def _squeeze(graph, call, ins):
    shape = _shape(call.args[0].checked_type)
    axes = _ints(call.attrs.axis) if call.attrs.axis is not None else [i for i, d in enumerate(shape) if d == 1]
    axes = [a + len(shape) if a < 0 else a for a in axes]
    if not axes:
        return graph.node("Identity", ins[:1])
    return graph.node("Squeeze", [ins[0], graph.const(axes, "axes", np.int64)])


def _expand_dims(graph, call, ins):
    ndim = len(call.args[0].checked_type.shape)
    axis = int(call.attrs.axis)
    axis = axis + ndim + 1 if axis < 0 else axis
    axes = list(range(axis, axis + int(call.attrs.num_newaxis)))
    if not axes:
        return graph.node("Identity", ins[:1])
    return graph.node("Unsqueeze", [ins[0], graph.const(axes, "axes", np.int64)])


def _pad(graph, call, ins):
    attrs = call.attrs
    widths = [_ints(pair) for pair in attrs.pad_width]
    pads = graph.const([w[0] for w in widths] + [w[1] for w in widths], "pads", np.int64)
    mode = str(attrs.pad_mode)
    if mode != "constant":
        return graph.node("Pad", [ins[0], pads], mode=mode)
    # Relay's pad value may have another type than the data (an int32 zero); ONNX's may not.
    value = graph.node("Cast", [ins[1]], to=onnx_dtype(call.checked_type.dtype))
    return graph.node("Pad", [ins[0], pads, value], mode=mode)


def _pad_ok(call: relay.Call) -> bool:
    ttype = call.args[0].checked_type
    return (
        str(ttype.dtype) in FLOAT_TYPES
        and all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape)
        and str(call.attrs.pad_mode) in ("constant", "edge", "reflect")
        and len(call.args[1].checked_type.shape) == 0
    )


def _cast(graph, call, ins):
    return graph.node("Cast", ins[:1], to=onnx_dtype(call.checked_type.dtype))


# --------------------------------------------------------------------------
# Quantization: qnn.quantize / qnn.dequantize as QuantizeLinear / DequantizeLinear.
# --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _QuantParams:
    """The constant scale and zero point of a ``qnn.quantize`` / ``qnn.dequantize`` call, as ONNX takes them.

    Attributes
    ----------
    scale : numpy.ndarray
        float32, shape ``()`` (per tensor) or ``(n,)`` (per channel along ``axis``).
    zero_point : numpy.ndarray
        int64 values of the same shape (ONNX stores them in the quantized type).
    axis : int
        The channel axis, non-negative (meaningful per channel only).
    """

    scale: np.ndarray
    zero_point: np.ndarray
    axis: int

    @property
    def per_channel(self) -> bool:
        return self.scale.ndim == 1


def _quant_params(call: relay.Call) -> Optional[_QuantParams]:
    """The scale and zero point of a typed ``qnn.quantize`` / ``qnn.dequantize`` call, or None where
    they are not constants ONNX can take (see :func:`supported`).

    A scale and a zero point of one element each are per tensor (whatever the
    ``axis``); otherwise both are per channel along ``axis``, one of them
    possibly a single value broadcast (ONNX needs the two of the same shape).

    Examples
    --------
    >>> import numpy as np
    >>> x = relay.var("x", shape=(1, 3, 4, 4))
    >>> q = relay.qnn.op.quantize(x, relay.const(np.array([0.1, 0.2, 0.3], "float32")), relay.const(5),
    ...                           axis=1, out_dtype="uint8")
    >>> p = _quant_params(_infer(relay.Function([x], q)).body)
    >>> p.scale.shape, p.zero_point.tolist(), p.axis, p.per_channel
    ((3,), [5, 5, 5], 1, True)
    """
    scale_expr, zero_expr = call.args[1], call.args[2]
    # ONNX takes the scale and zero point as tensors too, but onnxruntime fuses QDQ nodes into integer
    # kernels only around constant ones, and OpenVINO reads them as constants.
    if not isinstance(scale_expr, relay.Constant) or not isinstance(zero_expr, relay.Constant):
        return None
    scale, zero = scale_expr.data.numpy(), zero_expr.data.numpy()
    if scale.dtype != np.float32 or zero.dtype.kind not in "iu" or scale.ndim > 1 or zero.ndim > 1:
        return None
    if not np.all(np.isfinite(scale)):
        return None
    shape = _shape(call.args[0].checked_type)
    axis = int(call.attrs.axis)
    axis = axis + len(shape) if axis < 0 else axis
    count = max(scale.size, zero.size)
    if count == 1:
        return _QuantParams(scale.reshape(()), zero.reshape(()).astype(np.int64), axis)
    if not 0 <= axis < len(shape) or shape[axis] != count or not {scale.size, zero.size} <= {1, count}:
        return None
    return _QuantParams(
        np.broadcast_to(scale.reshape(-1), (count,)).copy(),
        np.broadcast_to(zero.reshape(-1), (count,)).astype(np.int64),
        axis,
    )


def _in_range(values: np.ndarray, dtype: str) -> bool:
    info = np.iinfo(dtype)
    return bool(np.all((values >= info.min) & (values <= info.max)))


def _quantize_ok(call: relay.Call) -> bool:
    data, out = call.args[0].checked_type, call.checked_type
    if str(data.dtype) not in FLOAT_TYPES or str(out.dtype) not in QUANTIZED_TYPES or not _static(data):
        return False
    params = _quant_params(call)
    # A zero scale makes x / 0: infinities and NaNs, which TVM and onnxruntime saturate differently.
    return (
        params is not None and bool(np.all(params.scale != 0))
        and _in_range(params.zero_point, str(out.dtype))
    )


def _dequantize_ok(call: relay.Call) -> bool:
    data, out = call.args[0].checked_type, call.checked_type
    if str(out.dtype) not in FLOAT_TYPES or not _static(data):
        return False
    params = _quant_params(call)
    if params is None:
        return False
    dtype = str(data.dtype)
    if dtype == "int32":
        # ONNX dequantizes int32 (a quantizer's bias) without a zero point: it must be 0.
        return not np.any(params.zero_point)
    return dtype in QUANTIZED_TYPES and _in_range(params.zero_point, dtype)


def _qdq_inputs(graph: _Graph, params: _QuantParams, dtype: str) -> List[str]:
    scale = graph.const(params.scale, "scale", np.float32)
    if dtype == "int32":
        return [scale]
    return [scale, graph.const(params.zero_point.astype(dtype), "zero_point")]


def _qdq_attrs(params: _QuantParams) -> dict:
    return {"axis": params.axis} if params.per_channel else {}


def _quantize(graph, call, ins):
    # Relay: clip(round(x / scale) + zero_point); ONNX: saturate(round(x / scale) + zero_point), the
    # same float32 division. Only the rounding of exact ties differs (see the module's docstring).
    params = _quant_params(call)
    dtype = str(call.checked_type.dtype)
    return graph.node("QuantizeLinear", [ins[0], *_qdq_inputs(graph, params, dtype)], **_qdq_attrs(params))


def _dequantize(graph, call, ins):
    # Relay and ONNX alike: float32(x - zero_point) * scale, exact for 8-bit x.
    params = _quant_params(call)
    dtype = str(call.args[0].checked_type.dtype)
    return graph.node("DequantizeLinear", [ins[0], *_qdq_inputs(graph, params, dtype)], **_qdq_attrs(params))


def _lrn(graph, call, ins):
    # Relay's and ONNX's LRN are one formula: x / (bias + alpha / size * sum of squares in the window)^beta.
    attrs = call.attrs
    return graph.node("LRN", ins[:1], size=int(attrs.size), alpha=float(attrs.alpha), beta=float(attrs.beta),
                      bias=float(attrs.bias))


def _lrn_ok(call: relay.Call) -> bool:
    # ONNX's LRN windows the channels of an (N, C, ...) tensor: axis 1 only.
    return _channel_axis(call) and len(call.args[0].checked_type.shape) >= 3


def _leaky_relu(graph, call, ins):
    return graph.node("LeakyRelu", ins[:1], alpha=float(call.attrs.alpha))


def _tvm_converter(class_name: str) -> Converter:
    """Call TVM's own converter class ``class_name`` (where it is right for opset 17)."""

    def convert(graph: _Graph, call: relay.Call, ins: List[str]) -> str:
        from ..._compat import ensure_onnx_mapping

        ensure_onnx_mapping()
        from tvm.contrib.target import onnx as tvm_onnx

        out = graph.fresh(class_name.lower())
        entry = {
            "relay_node": call,
            "inputs": list(call.args),
            "types": [call.checked_type],
            "name": out,
            "input_names": ins,
            "output_names": [out],
            "op": call.op,
        }
        node_dict = {arg: [{"types": [arg.checked_type]}] for arg in call.args}
        getattr(tvm_onnx, class_name).convert(entry, graph, node_dict)
        return out

    return convert


@dataclasses.dataclass(frozen=True)
class OpRule:
    """How one Relay operator converts, and which of its calls the conversion handles."""

    convert: Converter
    supports: Callable[[relay.Call], bool] = _static_float


#: Relay operator name -> conversion rule. The ``tcutils_ort`` pattern table
#: claims exactly these operators, each under its rule's predicate.
CONVERTERS: Dict[str, OpRule] = {
    **{op: OpRule(_binary(onnx_op)) for op, onnx_op in (
        ("subtract", "Sub"), ("multiply", "Mul"), ("divide", "Div"),
        ("power", "Pow"), ("maximum", "Max"), ("minimum", "Min"),
    )},
    **{op: OpRule(_unary(onnx_op)) for op, onnx_op in (
        ("nn.relu", "Relu"), ("sigmoid", "Sigmoid"), ("tanh", "Tanh"), ("erf", "Erf"), ("exp", "Exp"),
        ("log", "Log"), ("sqrt", "Sqrt"), ("negative", "Neg"), ("abs", "Abs"),
    )},
    "copy": OpRule(_unary("Identity"), _static_moving),
    "add": OpRule(_add),
    "rsqrt": OpRule(_rsqrt),
    # Inference: dropout is the identity (its mask result is never produced).
    "nn.dropout": OpRule(_unary("Identity")),
    "nn.leaky_relu": OpRule(_leaky_relu),
    "nn.lrn": OpRule(_lrn, _lrn_ok),
    "nn.conv2d": OpRule(_conv2d, _conv2d_ok),
    "nn.dense": OpRule(_dense, _same_out_dtype),
    "nn.matmul": OpRule(_matmul_like, _same_out_dtype),
    "nn.batch_matmul": OpRule(_matmul_like, _same_out_dtype),
    "nn.bias_add": OpRule(_bias_add),
    "nn.softmax": OpRule(_tvm_converter("Softmax")),
    "nn.layer_norm": OpRule(_layer_norm, _last_axis),
    "nn.batch_norm": OpRule(_batch_norm, _channel_axis),
    "nn.max_pool2d": OpRule(_max_pool, _moving_max_pool),
    "nn.avg_pool2d": OpRule(_avg_pool, _no_dilation),
    "nn.global_avg_pool2d": OpRule(_unary("GlobalAveragePool"), _nchw_pool),
    "nn.global_max_pool2d": OpRule(_unary("GlobalMaxPool"), _nchw_pool),
    "nn.batch_flatten": OpRule(_tvm_converter("Flatten"), _static_moving),
    "nn.pad": OpRule(_pad, _pad_ok),
    "reshape": OpRule(_reshape, _static_moving),
    "transpose": OpRule(_transpose, _static_moving),
    "concatenate": OpRule(_tvm_converter("Concat"), _static_moving),
    "clip": OpRule(_clip),
    "mean": OpRule(_reduce("ReduceMean"), _nonempty_reduce),
    "sum": OpRule(_reduce("ReduceSum"), _nonempty_reduce),
    "max": OpRule(_reduce("ReduceMax"), _nonempty_reduce),
    "min": OpRule(_reduce("ReduceMin"), _nonempty_reduce),
    "variance": OpRule(_variance, _nonempty_reduce),
    "strided_slice": OpRule(_strided_slice, _static_moving),
    "squeeze": OpRule(_squeeze, _static_moving),
    "expand_dims": OpRule(_expand_dims, _static_moving),
    "cast": OpRule(_cast, _cast_ok),
    "qnn.quantize": OpRule(_quantize, _quantize_ok),
    "qnn.dequantize": OpRule(_dequantize, _dequantize_ok),
}


def supported(call: relay.Expr) -> bool:
    """Whether ``call`` (a type-checked call of a Relay operator) converts to ONNX.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2, 3))
    >>> f = relay.transform.InferType()(tvm.IRModule.from_expr(relay.tanh(x)))["main"]
    >>> supported(f.body)
    True
    """
    if not isinstance(call, relay.Call) or not isinstance(call.op, tvm.ir.Op):
        return False
    rule = CONVERTERS.get(call.op.name)
    if rule is None:
        return False
    try:
        return bool(rule.supports(call))
    except (AttributeError, ValueError, TypeError):  # an untyped or unusual call
        return False


def to_onnx(func: relay.Function, name: str = "tcutils"):
    """Convert a Relay function to an ONNX model.

    Parameters
    ----------
    func : relay.Function
        The function; its body may call operators of :data:`CONVERTERS` and
        composite functions made of them. Its parameters become the graph
        inputs ``in0, in1, ...`` and its results the outputs ``out0, ...``
        (a tuple result gives one output per field). Not modified.
    name : str
        Name of the ONNX graph.

    Returns
    -------
    onnx.ModelProto
        A checked model with an IR version the installed onnxruntime loads.

    Raises
    ------
    NotImplementedError
        A call that :func:`supported` rejects, naming the operator.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(1, 8))
    >>> model = to_onnx(relay.Function([x], relay.nn.relu(x)))
    >>> [n.op_type for n in model.graph.node]
    ['Relu', 'Identity']
    """
    if not isinstance(func, relay.Function):
        raise TypeError(f"func must be a relay.Function, got {type(func).__name__}")
    func = _plain_function(func)
    graph = _Graph(name)
    names: Dict[relay.Expr, List[str]] = {}
    for index, param in enumerate(func.params):
        _expect_tensor(param.checked_type, f"parameter {param.name_hint}")
        names[param] = [f"in{index}"]
        graph.inputs.append(graph.relay_value(f"in{index}", param.checked_type))
    graph.uses = _use_counts(func.body)
    _convert_body(graph, func.body, names)
    results = names[func.body]
    out_type = func.body.checked_type
    out_types = list(out_type.fields) if isinstance(out_type, relay.TupleType) else [out_type]
    if len(results) != len(out_types):
        # A multi-result operator (batch_norm, dropout) returned whole: only its first result converts.
        raise NotImplementedError(
            f"the function returns {len(out_types)} results, of which only {len(results)} convert")
    for index, (result, ttype) in enumerate(zip(results, out_types)):
        _expect_tensor(ttype, f"result {index}")
        # Distinct output names even when a result is an input or repeats.
        graph.node("Identity", [result], [f"out{index}"])
        graph.outputs.append(graph.relay_value(f"out{index}", ttype))
    # Constants consumed only in a folded form (a transposed weight) are left out by the writer.
    return graph.model()


def externalize_inputs(model, names) -> None:
    """Turn the graph inputs ``names`` of ``model`` into initializers whose data comes later.

    Each becomes an initializer with external data (location ``tcutils-lifted``)
    that the session is given in memory (onnxruntime's
    ``SessionOptions.add_external_initializers``): a constant it can fold and
    pre-pack, not an input, while the model carries no weight bytes. ``model``
    is changed in place.

    Examples
    --------
    >>> from tvm import relay
    >>> x, w = relay.var("x", shape=(1, 8)), relay.var("w", shape=(1, 8))
    >>> model = to_onnx(relay.Function([x, w], x + w))
    >>> externalize_inputs(model, ["in1"])
    >>> [i.name for i in model.graph.input], [i.name for i in model.graph.initializer]
    (['in0'], ['in1'])
    """
    onnx = importlib.import_module("onnx")
    wanted = set(names)
    kept, moved = [], []
    for value in model.graph.input:
        (moved if value.name in wanted else kept).append(value)
    if len(moved) != len(wanted):
        raise ValueError(f"inputs {sorted(wanted - {v.name for v in moved})} are not graph inputs of the model")
    del model.graph.input[:]
    model.graph.input.extend(kept)
    for value in moved:
        tensor = model.graph.initializer.add()
        tensor.name = value.name
        tensor.data_type = value.type.tensor_type.elem_type
        tensor.dims.extend(d.dim_value for d in value.type.tensor_type.shape.dim)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        entry = tensor.external_data.add()
        entry.key, entry.value = "location", "tcutils-lifted"


def _expect_tensor(ttype, what: str) -> None:
    if not isinstance(ttype, relay.TensorType) or not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
        raise NotImplementedError(f"{what} has type {ttype}; only statically shaped tensors convert to ONNX")


def _children(node: relay.Expr) -> list:
    if isinstance(node, relay.Call):
        # Composite functions are converted where they are called, not entered here.
        return list(node.args)
    if isinstance(node, relay.Tuple):
        return list(node.fields)
    if isinstance(node, relay.TupleGetItem):
        return [node.tuple_value]
    return []


def _use_counts(body: relay.Expr) -> Dict[relay.Expr, int]:
    """How many times each node of ``body`` is an operand (the result counts as one use)."""
    counts: Dict[relay.Expr, int] = {body: 1}
    for node in _post_order(body):
        for child in _children(node):
            counts[child] = counts.get(child, 0) + 1
    return counts


def _post_order(expr: relay.Expr) -> List[relay.Expr]:
    """Nodes of ``expr`` in post order, each once, without recursion."""
    order: List[relay.Expr] = []
    done = set()
    stack = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if node in done:
            continue
        if expanded:
            done.add(node)
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)) if child not in done)
    return order


def _convert_body(graph: _Graph, body: relay.Expr, names: Dict[relay.Expr, List[str]]) -> None:
    """Convert every node of ``body`` in post order; ``names`` maps an expression to its output names."""
    for node in _post_order(body):
        if node in names:
            continue
        if isinstance(node, relay.Var):
            raise NotImplementedError(f"free variable {node.name_hint} in the function body")
        if isinstance(node, relay.Constant):
            names[node] = [graph.const(node.data.numpy(), "const")]
        elif isinstance(node, relay.Tuple):
            names[node] = [name for field in node.fields for name in names[field]]
        elif isinstance(node, relay.TupleGetItem):
            names[node] = _tuple_item(node, names)
        elif isinstance(node, relay.Call):
            names[node] = [_convert_call(graph, node, names)]
        else:
            raise NotImplementedError(f"{type(node).__name__} nodes do not convert to ONNX")


def _tuple_item(node: relay.TupleGetItem, names: Dict[relay.Expr, List[str]]) -> List[str]:
    source = names[node.tuple_value]
    tuple_type = node.tuple_value.checked_type
    if isinstance(node.tuple_value, relay.Call) and len(source) == 1 and isinstance(tuple_type, relay.TupleType):
        # A multi-result operator (batch_norm) of which only the first result is produced.
        if node.index != 0:
            raise NotImplementedError(f"result {node.index} of {node.tuple_value.op} does not convert to ONNX")
        return source
    return [source[node.index]]


def _convert_call(graph: _Graph, call: relay.Call, names: Dict[relay.Expr, List[str]]) -> str:
    if not isinstance(call.op, tvm.ir.Op):
        raise NotImplementedError(f"calls of {type(call.op).__name__} do not convert to ONNX")
    if not supported(call):
        raise NotImplementedError(
            f"operator {call.op.name} with type {call.checked_type} and these attributes does not convert to ONNX"
        )
    return CONVERTERS[call.op.name].convert(graph, call, [name for arg in call.args for name in names[arg]])


# --------------------------------------------------------------------------
# Preparation: a plain-operator function onnxruntime optimizes well.
# --------------------------------------------------------------------------
def _rebuild(body: relay.Expr, env: Dict[relay.Expr, relay.Expr]) -> relay.Expr:
    """``body`` with composite function calls replaced by their bodies; ``env`` maps vars to values."""
    for node in _post_order(body):
        if node in env:
            continue
        if isinstance(node, relay.Call):
            args = [env[arg] for arg in node.args]
            if isinstance(node.op, relay.Function):
                # Composite functions nest at most a level or two: recursion depth is bounded by that.
                env[node] = _rebuild(node.op.body, dict(zip(node.op.params, args)))
            else:
                env[node] = relay.Call(node.op, args, node.attrs, node.type_args, node.span)
        elif isinstance(node, relay.Tuple):
            env[node] = relay.Tuple([env[field] for field in node.fields])
        elif isinstance(node, relay.TupleGetItem):
            env[node] = relay.TupleGetItem(env[node.tuple_value], node.index)
        else:
            env[node] = node
    return env[body]


def _plain_function(func: relay.Function) -> relay.Function:
    """``func`` without composite functions, decomposed layer norms fused, typed."""
    body = _rebuild(func.body, {param: param for param in func.params})
    # Rewritten as a whole function: the rewriter re-types free variables as new ones.
    return _infer(_fuse_layer_norms(_infer(relay.Function(list(func.params), body))))


def _infer(func: relay.Function) -> relay.Function:
    return relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]


def _scalar(expr: relay.Expr) -> Optional[float]:
    if isinstance(expr, relay.Constant) and expr.data.numpy().size == 1:
        return float(expr.data.numpy().reshape(()))
    return None


def _over_last_axis(call: relay.Call, ndim: int) -> bool:
    attrs = call.attrs
    axes = _ints(attrs.axis) if attrs.axis is not None else list(range(ndim))
    return (
        len(axes) == 1 and axes[0] in (-1, ndim - 1) and bool(attrs.keepdims) and not bool(attrs.exclude)
        and not bool(getattr(attrs, "unbiased", False))
    )


def _layer_norm_rewrite():
    """A pattern callback fusing decomposed layer norms (as TVM's ONNX importer and models write them)."""
    from tvm.relay.dataflow_pattern import DFPatternCallback, is_constant, is_op, wildcard

    class _FuseLayerNorm(DFPatternCallback):
        def __init__(self):
            super().__init__(require_type=True)
            self.x, self.eps, self.gamma, self.beta = wildcard(), is_constant(), wildcard(), wildcard()
            self.mean = is_op("mean")(self.x)
            self.diff = is_op("subtract")(self.x, self.mean)
            self.exponent, self.one = is_constant(), is_constant()
            self.var = is_op("variance")(self.x, self.mean) | is_op("mean")(
                is_op("power")(self.diff, self.exponent) | is_op("multiply")(self.diff, self.diff)
            )
            std = is_op("sqrt")(is_op("add")(self.var, self.eps))
            self.norm = is_op("divide")(self.diff, std) | is_op("multiply")(self.diff, is_op("divide")(self.one, std))
            self.pattern = is_op("add")(is_op("multiply")(self.norm, self.gamma), self.beta) | self.norm

        def callback(self, pre, post, node_map):
            x = node_map[self.x][0]
            ttype = x.checked_type
            if str(ttype.dtype) not in FLOAT_TYPES or not all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape):
                return post
            ndim, size = len(ttype.shape), int(ttype.shape[-1])
            reductions = [node_map[self.mean][0]] + [
                node for node in node_map[self.var]
                if isinstance(node, relay.Call) and node.op.name in ("mean", "variance")
            ]
            if not all(_over_last_axis(node, ndim) for node in reductions):
                return post
            if self.exponent in node_map and _scalar(node_map[self.exponent][0]) != 2.0:
                return post
            if self.one in node_map and _scalar(node_map[self.one][0]) != 1.0:
                return post
            eps = _scalar(node_map[self.eps][0])
            if eps is None:
                return post
            dtype = str(ttype.dtype)
            gamma = relay.const(np.ones(size, dtype))
            beta = relay.const(np.zeros(size, dtype))
            if self.gamma in node_map:
                found = [_channel_vector(node_map[v][0], size, dtype) for v in (self.gamma, self.beta)]
                if any(value is None for value in found):
                    return post
                gamma, beta = found
            return relay.nn.layer_norm(x, gamma, beta, axis=-1, epsilon=eps)

    return _FuseLayerNorm()


def _channel_vector(expr: relay.Expr, size: int, dtype: str) -> Optional[relay.Expr]:
    """A constant that broadcasts along the last axis only, as a 1-d constant; else None."""
    if not isinstance(expr, relay.Constant):
        return None
    value = expr.data.numpy()
    if str(value.dtype) != dtype or value.size != size or (value.ndim and value.shape[-1] != size):
        return None
    return relay.const(value.reshape(size))


def _fuse_layer_norms(func: relay.Function) -> relay.Function:
    """Rewrite decomposed layer norms over the last axis into ``nn.layer_norm`` (one ONNX node)."""
    from tvm.relay.dataflow_pattern import rewrite

    return rewrite(_layer_norm_rewrite(), func)
