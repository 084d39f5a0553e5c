"""ONNX converters for onnxruntime's dynamic quantization: MatMulInteger, ConvInteger, DynamicQuantizeLinear.

``onnxruntime.quantization.quantize_dynamic`` (its recommended route for
transformers) quantizes each activation at run time with
``DynamicQuantizeLinear`` (u8 data, its scale and zero point computed from the
tensor's range) and multiplies it by int8 or uint8 weights with
``MatMulInteger`` / ``ConvInteger`` (exact int32 results), then casts and scales
back to float. TVM 0.19's importer refuses u8 x s8 ``MatMulInteger`` (the
default ``QuantType.QInt8`` weights), takes per-column and run-time zero points
only in part, and rounds ``DynamicQuantizeLinear`` half away from zero where
ONNX and onnxruntime round half to even.

The converters here replace TVM's three (:func:`tvm_tcutils._compat.install_onnx_converters`
puts them in at ``import tvm_tcutils``, for ``relay.frontend.from_onnx`` and
:func:`tvm_tcutils.load_model`):

* ``MatMulInteger``: any pair of ``uint8``/``int8`` inputs, 1-D to N-D with
  numpy broadcasting; becomes ``qnn.dense`` when ``B`` is 2-D (``A`` of any
  rank flattened to rows) and ``qnn.batch_matmul`` otherwise, so it reaches
  the int8 kernels of :mod:`tvm_tcutils.dotprod` (and TVM's QNN legalization
  to the target's signedness pair).
* ``ConvInteger``: 1-D and 2-D, groups, strides, dilations, ``pads`` and
  ``auto_pad``; becomes ``qnn.conv2d``; padding takes the data's zero point,
  as in onnxruntime.
* ``DynamicQuantizeLinear``: onnxruntime's arithmetic (range widened to hold 0,
  scale 1 for an all-zero tensor, ``x / scale`` rounded half to even). The
  elementwise ops (and softmax) right before it, whose values it rounds to 8
  bits, take their fast forms (:func:`tvm_tcutils.fast_forms.fast_chain`: GELU's
  ``erf``, attention's softmax), as in a static QDQ region: their error is far
  below the 8-bit step (onnxruntime approximates both as well). Attention's two
  float products of activations on that chain (``quantize_dynamic`` leaves them
  float) become one float ``dense`` per head (:func:`tvm_tcutils.fast_forms.dense_per_batch`):
  TVM's x86 ``batch_matmul`` runs them 2.5-4x slower than its ``dense``.

Zero points that are constant scalars (or constant vectors of one value) go
into the QNN op; the rest -- per-row ``a_zero_point``, per-column
``b_zero_point``, per-output-channel ``w_zero_point``, zero points computed at
run time (``DynamicQuantizeLinear``'s) -- are applied exactly in int32 around
it: with ``a = a' - da`` and ``b = b' - db`` per element,
``sum (a' - da)(b' - db) = sum a'b' - db * sum a' - da * sum b' + K * da * db``.
The integer results therefore equal onnxruntime's bit for bit.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import tvm
from tvm import relay

from .fast_forms import TREE_LANES, fast_chain, halving_tree, next_halving, rounded_int32

#: The element types ``MatMulInteger`` and ``ConvInteger`` take for each input and its zero point.
INTEGER_DTYPES = ("uint8", "int8")


def _type(expr: relay.Expr) -> relay.TensorType:
    return relay.transform.InferTypeLocal(expr)


def _shape(expr: relay.Expr) -> Tuple[int, ...]:
    try:
        return tuple(int(dim) for dim in _type(expr).shape)
    except TypeError:  # tvm.tir.Any: a dimension known only at run time
        raise ValueError(f"needs static shapes, got {_type(expr).shape}") from None


def _dtype(expr: relay.Expr) -> str:
    return str(_type(expr).dtype)


def _node(op: str, attrs: dict) -> str:
    name = (attrs.get("tvm_custom") or {}).get("name") or ""
    return f"{op} node {name!r}" if name else f"{op} node"


def _constant(expr: Optional[relay.Expr], params: dict) -> Optional[np.ndarray]:
    """The value of ``expr`` when it is known at import time (an initializer or a folded expression)."""
    if expr is None:
        return None
    if isinstance(expr, relay.Var) and expr.name_hint in params:
        return params[expr.name_hint].numpy()
    if not isinstance(expr, relay.Constant) and not relay.analysis.free_vars(expr):
        expr = relay.transform.FoldConstantExpr(expr, tvm.IRModule())
    return expr.data.numpy() if isinstance(expr, relay.Constant) else None


def _check_dtype(where: str, role: str, expr: relay.Expr, allowed: Sequence[str] = INTEGER_DTYPES) -> str:
    dtype = _dtype(expr)
    if dtype not in allowed:
        name = f" ({expr.name_hint!r})" if isinstance(expr, relay.Var) else ""
        raise TypeError(f"{where}: input {role}{name} is {dtype}; {role} must be one of {', '.join(allowed)}")
    return dtype


def _int32(expr: relay.Expr) -> relay.Expr:
    return relay.cast(expr, "int32")


def _i32(value: int) -> relay.Constant:
    return relay.const(int(value), "int32")


class _ZeroPoint:
    """A zero point split into the constant scalar the QNN op takes and the rest, applied in int32.

    ``qnn`` is an int; ``rest`` is None (all of it is in ``qnn``) or an int32 expression shaped to
    broadcast against the op's output.
    """

    def __init__(self, qnn: int = 0, rest: Optional[relay.Expr] = None):
        self.qnn, self.rest = qnn, rest


def _zero_point(where: str, role: str, zp: Optional[relay.Expr], tensor_role: str, tensor_dtype: str,
                params: dict, shapes: Dict[int, Tuple[int, ...]],
                nd_shape: Optional[Tuple[int, ...]] = None) -> _ZeroPoint:
    """Check ``zp`` against its tensor's type and split it (see :class:`_ZeroPoint`).

    ``shapes`` maps the element count of a 1-D zero point to the shape that broadcasts it against
    the output (per row, per column, per output channel); ``nd_shape``, when given, is the trailing
    shape an N-D zero point may have; anything else is a ValueError.
    """
    if zp is None:
        return _ZeroPoint()
    dtype = _dtype(zp)
    if dtype != tensor_dtype:
        raise TypeError(f"{where}: input {role} is {dtype} but {tensor_role} is {tensor_dtype}; "
                        f"a zero point has its tensor's type (one of {', '.join(INTEGER_DTYPES)})")
    shape = _shape(zp)
    size = int(np.prod(shape))
    value = _constant(zp, params) if size else None
    if value is not None and (value == value.flat[0]).all():
        return _ZeroPoint(int(value.flat[0]))
    if size == 1:
        return _ZeroPoint(0, relay.reshape(_int32(zp), []))
    if len(shape) == 1 and size in shapes:
        return _ZeroPoint(0, relay.reshape(_int32(zp), shapes[size]))
    if nd_shape is not None and len(shape) >= len(nd_shape) and shape[-len(nd_shape):] == nd_shape:
        return _ZeroPoint(0, _int32(zp))
    allowed = [f"{count} values" for count in shapes] + ([f"of shape [..., {', '.join(map(str, nd_shape))}]"]
                                                        if nd_shape else [])
    raise ValueError(f"{where}: input {role} has shape {list(shape)}; it must be "
                     + " or ".join(["a scalar"] + allowed))


def _corrected(y: relay.Expr, za: _ZeroPoint, zb: _ZeroPoint, sum_a, sum_b, terms: int) -> relay.Expr:
    """``y`` (the QNN op's result with ``za.qnn``, ``zb.qnn``) with the remaining zero points applied.

    ``sum_a()`` / ``sum_b()`` build the sums of ``a - za.qnn`` / ``b - zb.qnn`` over each output's
    reduction, shaped to broadcast against ``y``; ``terms`` is the reduction's length.
    """
    if zb.rest is not None:
        y = relay.subtract(y, relay.multiply(zb.rest, sum_a()))
    if za.rest is not None:
        y = relay.subtract(y, relay.multiply(za.rest, sum_b()))
    if za.rest is not None and zb.rest is not None:
        y = relay.add(y, relay.multiply(_i32(terms), relay.multiply(za.rest, zb.rest)))
    return y


def _integer_operands(where: str, inputs: List[Optional[relay.Expr]], names: Sequence[str]):
    """``(inputs padded to four, dtypes, shapes)`` of an integer product's two tensors (``names``), checked.

    Raises ``ValueError`` naming the node for a wrong input count, a non-8-bit tensor or a shape known
    only at run time.
    """
    if len(inputs) < 2 or len(inputs) > 4 or inputs[0] is None or inputs[1] is None:
        raise ValueError(f"{where}: takes {names[0]}, {names[1]} and optionally {names[0].lower()}_zero_point, "
                         f"{names[1].lower()}_zero_point; got {len(inputs)} inputs")
    inputs = list(inputs) + [None] * (4 - len(inputs))
    dtypes = tuple(_check_dtype(where, name, expr) for name, expr in zip(names, inputs[:2]))
    try:
        shapes = tuple(_shape(expr) for expr in inputs[:2])
    except ValueError as err:
        raise ValueError(f"{where}: {err}") from None
    return inputs, dtypes, shapes


def _scale() -> relay.Constant:
    return relay.const(1.0, "float32")


# --------------------------------------------------------------------------
# MatMulInteger
# --------------------------------------------------------------------------
def matmul_integer(inputs: List[Optional[relay.Expr]], attrs: dict, params: dict) -> relay.Expr:
    """``MatMulInteger(A, B, a_zero_point, b_zero_point)``: ``(A - a_zp) @ (B - b_zp)`` in int32.

    Examples
    --------
    >>> a = relay.var("a", shape=(2, 3, 4), dtype="uint8")
    >>> b = relay.const(np.ones((4, 5), "int8"))
    >>> y = matmul_integer([a, b], {}, {})
    >>> relay.transform.InferTypeLocal(y)
    TensorType([2, 3, 5], int32)
    """
    where = _node("MatMulInteger", attrs)
    inputs, (a_dtype, b_dtype), (a_shape, b_shape) = _integer_operands(where, inputs, ("A", "B"))
    a, b = inputs[0], inputs[1]
    # numpy's 1-D rules: A (K,) is one row, B (K,) one column; the unit axis goes again at the end.
    squeeze = []
    if len(a_shape) == 1:
        a, a_shape = relay.reshape(a, (1,) + a_shape), (1,) + a_shape
        squeeze.append(-2)
    if len(b_shape) == 1:
        b, b_shape = relay.reshape(b, b_shape + (1,)), b_shape + (1,)
        squeeze.append(-1)
    (m, k), (k_b, n) = a_shape[-2:], b_shape[-2:]
    if k != k_b:
        raise ValueError(f"{where}: A {list(a_shape)} and B {list(b_shape)} do not multiply (K {k} != {k_b})")
    za = _zero_point(where, "a_zero_point", inputs[2], "A", a_dtype, params, {m: (m, 1)}, (m, 1))
    zb = _zero_point(where, "b_zero_point", inputs[3], "B", b_dtype, params, {n: (1, n)}, (1, n))

    if len(b_shape) == 2:
        rows = relay.reshape(a, (-1, k)) if len(a_shape) != 2 else a
        y = relay.qnn.op.dense(rows, relay.transpose(b, (1, 0)), _i32(za.qnn), _i32(zb.qnn), _scale(), _scale(),
                               units=n, out_dtype="int32")
        # Not for a 2-D A: a reshape, even to the same shape, ends the ops TVM fuses into the dense's kernel
        # (the zero-point correction, the scales, the bias, a GELU), which then read its output again.
        if len(a_shape) != 2:
            y = relay.reshape(y, a_shape[:-1] + (n,))
    else:
        try:
            batch = tuple(np.broadcast_shapes(a_shape[:-2], b_shape[:-2]))
        except ValueError:
            raise ValueError(f"{where}: the batch axes of A {list(a_shape)} and B {list(b_shape)} "
                             "do not broadcast") from None
        a3 = relay.reshape(relay.broadcast_to(a, batch + (m, k)), (-1, m, k))
        swap = tuple(range(len(batch))) + (len(batch) + 1, len(batch))  # B as (..., N, K)
        b3 = relay.reshape(relay.transpose(relay.broadcast_to(b, batch + (k, n)), swap), (-1, n, k))
        y = relay.qnn.op.batch_matmul(a3, b3, _i32(za.qnn), _i32(zb.qnn), _scale(), _scale(), out_dtype="int32")
        y = relay.reshape(y, batch + (m, n))

    def sum_a():  # sum over K of a - za.qnn, per row: (..., M, 1)
        return relay.subtract(relay.sum(_int32(a), axis=[-1], keepdims=True), _i32(k * za.qnn))

    def sum_b():  # per column: (..., 1, N)
        return relay.subtract(relay.sum(_int32(b), axis=[-2], keepdims=True), _i32(k * zb.qnn))

    y = _corrected(y, za, zb, sum_a, sum_b, k)
    return relay.squeeze(y, axis=squeeze) if squeeze else y


# --------------------------------------------------------------------------
# ConvInteger
# --------------------------------------------------------------------------
def _attr_ints(attrs: dict, name: str, default: Sequence[int]) -> Tuple[int, ...]:
    value = attrs.get(name)
    return tuple(int(v) for v in value) if value is not None else tuple(default)


def _pads(where: str, attrs: dict, spatial: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
          dilations: Sequence[int]) -> Tuple[int, ...]:
    """ONNX ``pads`` (all begins, then all ends) from ``pads`` or ``auto_pad``."""
    auto_pad = attrs.get("auto_pad", b"NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else str(auto_pad)
    rank = len(spatial)
    if auto_pad == "NOTSET":
        return _attr_ints(attrs, "pads", [0] * (2 * rank))
    if auto_pad == "VALID":
        return (0,) * (2 * rank)
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        raise ValueError(f"{where}: auto_pad {auto_pad!r} is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID")
    begins, ends = [], []
    for size, k, s, d in zip(spatial, kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        begins.append(small if auto_pad == "SAME_UPPER" else large)
        ends.append(large if auto_pad == "SAME_UPPER" else small)
    return tuple(begins + ends)


def conv_integer(inputs: List[Optional[relay.Expr]], attrs: dict, params: dict) -> relay.Expr:
    """``ConvInteger(x, w, x_zero_point, w_zero_point)``: the int32 convolution of ``x - x_zp`` by ``w - w_zp``.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 3, 8, 8), dtype="uint8")
    >>> w = relay.const(np.ones((4, 3, 3, 3), "int8"))
    >>> y = conv_integer([x, w], {"pads": (1, 1, 1, 1), "strides": (2, 2)}, {})
    >>> relay.transform.InferTypeLocal(y)
    TensorType([1, 4, 4, 4], int32)
    """
    where = _node("ConvInteger", attrs)
    inputs, (x_dtype, w_dtype), (x_shape, w_shape) = _integer_operands(where, inputs, ("x", "w"))
    x, w = inputs[0], inputs[1]
    rank = len(x_shape) - 2
    if rank not in (1, 2) or len(w_shape) != len(x_shape):
        raise ValueError(f"{where}: x {list(x_shape)} and w {list(w_shape)}: only 1-D and 2-D convolutions "
                         "(x (N, C, W) or (N, C, H, W), w of the same rank) are supported")
    groups = int(attrs.get("group", 1))
    channels, kernel = w_shape[0], w_shape[2:]
    if x_shape[1] != w_shape[1] * groups or channels % groups:
        raise ValueError(f"{where}: x {list(x_shape)}, w {list(w_shape)} and group={groups} do not fit")
    if tuple(attrs.get("kernel_shape", kernel)) != kernel:
        raise ValueError(f"{where}: kernel_shape {list(attrs['kernel_shape'])} is not w's {list(kernel)}")
    strides = _attr_ints(attrs, "strides", [1] * rank)
    dilations = _attr_ints(attrs, "dilations", [1] * rank)
    pads = _pads(where, attrs, x_shape[2:], kernel, strides, dilations)
    zx = _zero_point(where, "x_zero_point", inputs[2], "x", x_dtype, params, {})
    zw = _zero_point(where, "w_zero_point", inputs[3], "w", w_dtype, params, {channels: (1, channels, 1, 1)})
    if rank == 1:  # as a 2-D convolution of height 1
        x, w = relay.expand_dims(x, 2), relay.expand_dims(w, 2)
        kernel, strides, dilations = (1,) + kernel, (1,) + strides, (1,) + dilations
        pads = (0, pads[0], 0, pads[1])
    if zx.rest is not None and any(pads):
        # The padding holds the zero point; the QNN op pads with its own (here 0), so pad first.
        pad_value = relay.reshape(inputs[2], [])
        x = relay.nn.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])), pad_value=pad_value)
        pads = (0, 0, 0, 0)
    y = relay.qnn.op.conv2d(x, w, _i32(zx.qnn), _i32(zw.qnn), _scale(), _scale(), kernel_size=kernel,
                            channels=channels, strides=strides, padding=pads, dilation=dilations, groups=groups,
                            out_dtype="int32")

    def sum_x():  # window sums of x - zx.qnn over each group's channels (padding: zx.qnn, so 0): (N, M, OH, OW)
        data = relay.subtract(_int32(x), _i32(zx.qnn))
        n, c, h, wd = _shape(data)
        data = relay.sum(relay.reshape(data, (n, groups, c // groups, h, wd)), axis=[2])
        ones = relay.const(np.ones((groups, 1) + tuple(kernel), "int32"))
        sums = relay.nn.conv2d(data, ones, strides=strides, padding=pads, dilation=dilations, groups=groups,
                               channels=groups, kernel_size=kernel, out_dtype="int32")
        return relay.repeat(sums, channels // groups, axis=1) if groups > 1 else sums

    terms = int(np.prod(w_shape[1:]))

    def sum_w():  # sums of w - zw.qnn per output channel: (1, M, 1, 1)
        sums = relay.subtract(relay.sum(_int32(w), axis=[1, 2, 3]), _i32(terms * zw.qnn))
        return relay.reshape(sums, (1, channels, 1, 1))

    y = _corrected(y, zx, zw, sum_x, sum_w, terms)
    return relay.squeeze(y, axis=[2]) if rank == 1 else y


# --------------------------------------------------------------------------
# DynamicQuantizeLinear
# --------------------------------------------------------------------------
#: Row width at which :func:`_min_max` stops halving: 32 floats, two AVX-512 registers.
_TREE_WIDTH = 32

#: Rows at which :func:`_min_max` stops halving the rows of its trees.
_TREE_ROWS = 8


def _min_max(x: relay.Expr) -> Tuple[relay.Expr, relay.Expr]:
    """``(min, max)`` over all of ``x``: both from one vectorized pass, then one small reduction.

    TVM schedules a reduction as a serial loop per output, which LLVM does not vectorize for floats. So
    each row of ``-x`` and of ``x`` is halved elementwise (the ``maximum`` of its two halves,
    :func:`~tvm_tcutils.fast_forms.halving_tree`) down to 32-48 columns, the two trees side by side,
    stacked as ``[-min part, max part]``, and the rows halved down to
    8, all in one injective kernel (AVX-512 ``vminps``/``vmaxps``, each input read once), which
    ``stop_fusion`` keeps out of the reduction that follows (fused into it, TVM copied the first slices out
    in kernels of their own and ran the rest in scalar code); one ``max`` over that ``[2, 8, 32]`` tensor
    gives ``-min`` and ``max``, one output per thread. Min and max are exact in any order: the same values
    as reducing ``x`` directly. 1 thread, AVX-512: [128, 1024] 51 us for the earlier two halving trees, 10 us
    now; [128, 256] 12 -> 3 us.

    Examples
    --------
    >>> x = relay.var("x", shape=(4, 256))
    >>> low, high = _min_max(x)
    >>> [str(relay.transform.InferTypeLocal(v).shape) for v in (low, high)]
    ['[]', '[]']
    """
    try:
        shape = _shape(x)
    except ValueError:  # a dimension known only at run time
        shape = ()
    cols = shape[-1] if shape else 0
    if not shape or cols <= _TREE_WIDTH or cols % (2 * TREE_LANES):
        # Rows first, then the rest: parallel over rows where one reduction to a scalar is one serial loop
        # (a [128, 1024] tensor's min: 0.072 -> 0.031 ms).
        if len(_type(x).shape) >= 2:
            return relay.min(relay.min(x, axis=-1)), relay.max(relay.max(x, axis=-1))
        return relay.min(x), relay.max(x)
    rows = int(np.prod(shape[:-1]))
    low = high = relay.reshape(x, (rows, cols))
    # Both trees as maxima, the min one over -x: one combine, both side by side in one kernel.
    (low, high), cols, levels = halving_tree([relay.negative(low), high], relay.maximum, rows, cols, _TREE_WIDTH)
    both = relay.stack([low, high], axis=0)
    # Rows halved too, in the same kernel, down to 8: the serial reduction then reads 256 values per output,
    # not rows x 32 ([128, 256]: 7.1 -> 3.0 us). Halved to 1 row, the kernel itself loses its parallel loop.
    # Past FUSED_HALVINGS in all, the rows' halvings go to a kernel of their own (its build time).
    while rows > _TREE_ROWS and rows % 2 == 0:
        (both,), levels = next_halving([both], levels)
        half = rows // 2
        both = relay.maximum(relay.strided_slice(both, [0, 0, 0], [2, half, cols]),
                             relay.strided_slice(both, [0, half, 0], [2, rows, cols]))
        rows = half
    both = relay.max(relay.annotation.stop_fusion(both), axis=[1, 2])
    return relay.negative(relay.take(both, relay.const(0))), relay.take(both, relay.const(1))


def dynamic_quantize_linear(inputs: List[Optional[relay.Expr]], attrs: dict, params: dict) -> relay.TupleWrapper:
    """``DynamicQuantizeLinear(x) -> (y, y_scale, y_zero_point)`` as onnxruntime computes it (uint8).

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> out = dynamic_quantize_linear([x], {}, {})
    >>> [str(relay.transform.InferTypeLocal(out[i]).dtype) for i in range(3)]
    ['uint8', 'float32', 'uint8']
    """
    where = _node("DynamicQuantizeLinear", attrs)
    if len(inputs) != 1 or inputs[0] is None:
        raise ValueError(f"{where}: takes one input, got {len(inputs)}")
    _check_dtype(where, "x", inputs[0], ("float32",))
    x = fast_chain(inputs[0])
    zero = relay.const(0.0, "float32")
    low, high = _min_max(x)
    low, high = relay.minimum(low, zero), relay.maximum(high, zero)
    # (high - low) / 255, or 1 for an all-zero tensor. TVM compiles a division by a constant as a
    # multiplication by its reciprocal (one ulp off here); a divisor chosen at run time stays a division.
    flat = relay.equal(high, low)
    one = relay.const(1.0, "float32")
    scale = relay.divide(relay.where(flat, one, relay.subtract(high, low)),
                         relay.where(flat, one, relay.const(255.0, "float32")))
    # low <= 0 <= high: -low / scale and x / scale lie within [-255, 255] (|x| <= high - low), where the
    # one-add rounding of fast_forms.rounded_int32 is exact, ties to even.
    zero_point = rounded_int32(relay.clip(relay.divide(relay.negative(low), scale), 0.0, 255.0))
    y = relay.clip(relay.add(rounded_int32(relay.divide(x, scale)), zero_point), 0, 255)
    return relay.TupleWrapper(relay.Tuple([relay.cast(y, "uint8"), scale, relay.cast(zero_point, "uint8")]), 3)


#: ONNX op type -> converter, as ``relay.frontend.onnx`` calls them: ``(inputs, attrs, params)``.
CONVERTERS = {
    "MatMulInteger": matmul_integer,
    "ConvInteger": conv_integer,
    "DynamicQuantizeLinear": dynamic_quantize_linear,
}
