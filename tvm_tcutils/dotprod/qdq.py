"""QDQ models (``QuantizeLinear`` / ``DequantizeLinear`` around float ops) as integer ``qnn`` ops.

Quantizers such as onnxruntime's ``quantize_static`` write their default QDQ
format: every float op reads ``DequantizeLinear`` outputs and its result goes
through ``QuantizeLinear``. ``relay.frontend.from_onnx`` keeps that shape
(``qnn.quantize(op(qnn.dequantize(x), qnn.dequantize(W))))``), so the convs run
in float and the dot-product schedules never see an 8-bit operand.
:func:`to_integer` replaces each such region, ended by a ``qnn.quantize``, by
the integer op it stands for:

========================================  ====================================================
float region (before ``qnn.quantize``)    integer form
========================================  ====================================================
``conv2d`` (+ ``bias_add``), per-channel  ``qnn.conv2d`` (int32) + int32 bias, requantized
``dense`` / ONNX ``MatMul`` (+ bias)      ``qnn.dense`` (int32) + int32 bias, requantized
``batch_matmul`` (MatMul of activations)  ``qnn.batch_matmul`` (int32), requantized
``add`` of two quantized tensors          ONNX ``QLinearAdd`` arithmetic
``concatenate``                           each input requantized, then concatenated
``global_avg_pool2d``                     int32 sum, requantized
``max_pool2d``, reshapes, transposes...   the same op on the 8-bit tensor
``relu`` / ``clip`` after any of these     a clamp of the 8-bit result
========================================  ====================================================

Conv weights must be constants (per-tensor or per-output-channel scales, zero
points 0, as quantizers write them); a MatMul's other operand may be such a
constant or a per-tensor quantized activation. A region that does not fit stays
float, exactly as it was.

Requantization (``requantize=``, see :data:`REQUANTIZE`) defaults to
``"onnx"``: ``saturate(round_half_to_even(float32(acc) * multiplier) + zero_point)``
with ``multiplier = float32(x_scale * w_scale) / y_scale`` evaluated in float32,
what onnxruntime's ``QLinearConv`` / ``QLinearMatMul`` compute, so results
match them bit for bit. ``"qnn"`` uses TVM's ``qnn.requantize`` / ``qnn.add``
instead (float32 arithmetic with rounding half up on x86 SSE4.1+ targets).

The rewrite visits each node once (no recursion: deep models are fine) and
returns a new module; the input module is not changed. Plain ``relay.build``
applies the same rewrite region by region, through the package's
``FTVMQnnLegalize`` handler of ``qnn.quantize`` (:func:`legalize_quantize`).

Examples
--------
>>> import numpy as np
>>> from tvm import relay
>>> x = relay.var("x", shape=(1, 4, 6, 6))
>>> w = relay.const(np.ones((8, 4, 3, 3), "int8"))
>>> dq = lambda q, s, z: relay.qnn.op.dequantize(q, relay.const(s), relay.const(z))
>>> xq = relay.qnn.op.quantize(x, relay.const(0.1), relay.const(3), out_dtype="uint8")
>>> y = relay.nn.conv2d(dq(xq, 0.1, 3), dq(w, 0.02, 0), kernel_size=(3, 3), channels=8)
>>> mod = tvm.IRModule.from_expr(relay.qnn.op.quantize(y, relay.const(0.5), relay.const(0), out_dtype="uint8"))
>>> ops = lambda m: sorted({c.op.name for c in calls(m)})
>>> ops(mod)
['nn.conv2d', 'qnn.dequantize', 'qnn.quantize']
>>> ops(to_integer(mod))   # integer conv; ONNX rounding (half to even)
['add', 'annotation.stop_fusion', 'cast', 'clip', 'divide', 'multiply', 'qnn.conv2d', 'reinterpret']
>>> ops(to_integer(mod, requantize="qnn"))
['qnn.conv2d', 'qnn.quantize', 'qnn.requantize']
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._tvm import constant_expression, tvm
from tvm import relay

# FAST_FORMS and round_half_even stay importable from here: part of this module's API.
from ..fast_forms import FAST_FORMS, fast_region, round_half_even, rounded_int32, saturated_parts  # noqa: F401
from .isa import for_target

#: Requantization modes: ``"onnx"`` (float32 multiplier, round half to even, as onnxruntime) and
#: ``"qnn"`` (TVM's ``qnn.requantize`` / ``qnn.add``).
REQUANTIZE = ("onnx", "qnn")

#: Ops that move or select 8-bit values without arithmetic: ``op(dequantize(q))`` is
#: ``dequantize(op(q))`` with the same scale and zero point.
VALUE_PRESERVING_OPS = (
    "nn.max_pool2d", "nn.batch_flatten", "reshape", "transpose", "squeeze", "expand_dims",
    "layout_transform", "strided_slice", "nn.global_max_pool2d",
)


@dataclasses.dataclass(frozen=True)
class QParams:
    """How a tensor is quantized: ``real = scale * (q - zero_point)`` (scale per channel on ``axis``)."""

    scale: np.ndarray
    zero_point: np.ndarray
    dtype: str
    axis: int = -1

    @property
    def per_tensor(self) -> bool:
        return self.scale.size == 1 and self.zero_point.size == 1

    def scalar(self) -> Tuple[np.float32, int]:
        return np.float32(self.scale.reshape(-1)[0]), int(self.zero_point.reshape(-1)[0])


def calls(mod_or_expr) -> List[relay.Call]:
    """Every operator call of a module's ``main`` (or of an expression), in post order.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> [c.op.name for c in calls(relay.nn.relu(relay.exp(x)))]
    ['exp', 'nn.relu']
    """
    expr = mod_or_expr["main"] if isinstance(mod_or_expr, tvm.IRModule) else mod_or_expr
    found: List[relay.Call] = []
    relay.analysis.post_order_visit(
        expr, lambda e: found.append(e) if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None)
    return found


def _op(expr, *names: str) -> bool:
    return isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in names


def _const(expr) -> Optional[np.ndarray]:
    return expr.data.numpy() if isinstance(expr, relay.Constant) else None


def _type(expr: relay.Expr):
    """``expr``'s checked type; inferred from its typed inputs (and kept on the node) where a pass inside
    TVM's build left it untyped (a node downstream of one it replaced)."""
    try:
        return expr.checked_type
    except ValueError:
        return relay.transform.InferTypeLocal(expr)


#: At most this many nodes in an expression :meth:`_Rewriter._constant` folds (zero points written as
#: ``cast(constant)``, a reshaped bias: a few nodes each).
_FOLD_LIMIT = 32


class _RegionInputs(dict):
    """The memo of a rewrite of one region (:func:`integer_region`): a node outside the region reads as a
    new variable of its type, a constant as itself; :attr:`bound` maps each variable to its node."""

    def __init__(self):
        super().__init__()
        self.bound: Dict[relay.Var, relay.Expr] = {}

    def __missing__(self, node: relay.Expr) -> relay.Expr:
        if isinstance(node, relay.Constant):
            return node
        var = relay.var(f"tcutils_region_input{len(self.bound)}", type_annotation=_type(node))
        self[node] = var
        self.bound[var] = node
        return var


def _saturate(value: relay.Expr, out: QParams) -> relay.Expr:
    """``saturate(round_half_even(value) + zero_point)`` as ``out.dtype`` (``value`` float32, scaled)."""
    _, zero = out.scalar()
    info = np.iinfo(out.dtype)
    # Clamped before rounding (as onnxruntime): the bounds are integers, so the result is the same
    # and the float stays small enough for exact rounding.
    clamped = relay.clip(value, float(info.min - zero), float(info.max - zero))
    return relay.cast(rounded_int32(clamped, int(zero)), out.dtype)


def _channel_const(values: np.ndarray, rank: int, axis: int, dtype: str) -> relay.Constant:
    """A per-channel vector shaped to broadcast along ``axis`` of a rank-``rank`` tensor."""
    values = np.asarray(values, dtype)
    if values.size == 1:
        return relay.const(values.reshape(()))
    shape = [1] * rank
    shape[axis] = values.size
    return relay.const(values.reshape(shape))


def _scale_const(scale: np.ndarray) -> relay.Constant:
    """A scale as QNN ops take it: a scalar, or a vector per channel."""
    return relay.const(np.float32(scale.reshape(-1)[0]) if scale.size == 1 else scale.reshape(-1))


class _Rewriter:
    """One pass over a function body: each ``qnn.quantize`` of a known float region becomes integer."""

    def __init__(self, requantize: str, one_region: bool = False):
        self.requantize = requantize
        #: ``one_region``: rewrite a single ``qnn.quantize`` (:func:`integer_region`) rather than a whole body.
        self.one_region = one_region
        self.memo: Dict[relay.Expr, relay.Expr] = _RegionInputs() if one_region else {}
        self.folded: Dict[relay.Expr, Optional[np.ndarray]] = {}
        #: float op -> rule(region, out quantization) -> integer expression or None.
        self.rules: Dict[str, Callable[[relay.Call, QParams], Optional[relay.Expr]]] = {
            "nn.conv2d": self._conv2d, "nn.dense": self._dense, "nn.batch_matmul": self._batch_matmul,
            "nn.bias_add": self._bias_add,
            "add": self._add, "concatenate": self._concatenate, "nn.global_avg_pool2d": self._global_avg_pool,
            "nn.relu": self._relu, "clip": self._clip,
            **{name: self._value_preserving for name in VALUE_PRESERVING_OPS},
        }

    # -- traversal ------------------------------------------------------------
    def rewrite(self, body: relay.Expr) -> relay.Expr:
        order: List[relay.Expr] = []
        relay.analysis.post_order_visit(body, order.append)
        for node in order:
            self.memo[node] = self._visit(node)
        return self.memo[body]

    def _visit(self, node: relay.Expr) -> relay.Expr:
        new = self.memo
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            if node.op.name == "qnn.quantize":
                integer = self._quantize(node)
                if integer is not None:
                    return integer
            return relay.Call(node.op, [new[a] for a in node.args], node.attrs, node.type_args, node.span)
        if isinstance(node, relay.Tuple):
            return relay.Tuple([new[f] for f in node.fields], node.span)
        if isinstance(node, relay.TupleGetItem):
            return relay.TupleGetItem(new[node.tuple_value], node.index)
        # Variables, constants, and constructs the rewrite leaves alone (functions, lets, ifs) as they are.
        return node

    # -- quantization parameters ------------------------------------------------
    def _constant(self, expr) -> Optional[np.ndarray]:
        """``expr``'s value if it is a constant. A whole module is folded first (:func:`to_integer`); one
        region inside TVM's build (before its FoldConstant) folds a small expression of constants here,
        as that FoldConstant would (zero points imported as ``cast(constant)``)."""
        if isinstance(expr, relay.Constant) or not self.one_region:
            return _const(expr)
        if expr not in self.folded:
            small = constant_expression(expr, _FOLD_LIMIT)
            folded = relay.transform.FoldConstantExpr(expr, tvm.IRModule()) if small else None
            self.folded[expr] = _const(folded)
        return self.folded[expr]

    def _qparams(self, call: relay.Call, dtype: str) -> Optional[QParams]:
        scale, zero = self._constant(call.args[1]), self._constant(call.args[2])
        if scale is None or zero is None:
            return None
        return QParams(scale.astype("float32"), zero.astype("int64"), dtype, int(call.attrs.axis))

    def _dequantized(self, expr) -> Optional[Tuple[relay.Expr, QParams]]:
        """(the rewritten 8-bit tensor, its quantization) of a per-tensor ``qnn.dequantize``, also seen
        through value-preserving ops (``reshape(dequantize(q))`` is ``dequantize(reshape(q))``)."""
        chain = []
        while _op(expr, *VALUE_PRESERVING_OPS) and len(expr.args) == 1:
            chain.append(expr)
            expr = expr.args[0]
        if not _op(expr, "qnn.dequantize"):
            return None
        params = self._qparams(expr, str(_type(expr.args[0]).dtype))
        if params is None or not params.per_tensor or params.dtype not in ("uint8", "int8"):
            return None
        q = self.memo[expr.args[0]]
        for call in reversed(chain):
            q = relay.Call(call.op, [q], call.attrs, call.type_args, call.span)
        return q, params

    def _weight(self, expr, channel_axis: int) -> Optional[Tuple[np.ndarray, QParams]]:
        """(8-bit constant, quantization) of a dequantized constant weight, symmetric, per tensor or per
        channel on ``channel_axis``."""
        if not _op(expr, "qnn.dequantize"):
            return None
        data = self._constant(expr.args[0])
        params = self._qparams(expr, str(_type(expr.args[0]).dtype))
        if data is None or params is None or data.dtype != np.int8 or np.any(params.zero_point != 0):
            return None
        if not params.per_tensor and params.axis % data.ndim != channel_axis % data.ndim:
            return None
        return data, params

    def _quantize(self, call: relay.Call) -> Optional[relay.Expr]:
        out = self._qparams(call, str(call.attrs.out_dtype))
        if out is None or not out.per_tensor:
            return None
        region = self._region(call.args[0], out) if isinstance(call.args[0], relay.Call) else None
        if region is None and self.requantize == "onnx" and _type(call.args[0]).dtype == "float32":
            # A float tensor (a model input): ONNX QuantizeLinear rounds half to even, qnn.quantize
            # half away from zero.
            # In a kernel of its own: fused with the conv's padding and packing that follow, TVM's
            # schedule quantized one pixel at a time (ResNet-50's input 110 us; alone, vectorized over
            # rows, 18 us, and the 8-bit padding and packing 54).
            quantized = _saturate(relay.divide(self.memo[call.args[0]], relay.const(out.scalar()[0])), out)
            return relay.annotation.stop_fusion(quantized)
        return region

    def _region(self, expr, out: QParams) -> Optional[relay.Expr]:
        if not isinstance(expr, relay.Call) or not isinstance(expr.op, tvm.ir.Op):
            return None
        rule = self.rules.get(expr.op.name)
        return rule(expr, out) if rule is not None else None

    # -- requantization -----------------------------------------------------------
    def _requantize(self, acc: relay.Expr, acc_scale: np.ndarray, acc_zero: int, out: QParams, rank: int,
                    axis: int) -> relay.Expr:
        """int32 ``acc`` of real value ``acc_scale * (acc - acc_zero)`` quantized as ``out``."""
        out_scale, out_zero = out.scalar()
        if self.requantize == "qnn":
            return relay.qnn.op.requantize(
                acc, _scale_const(np.asarray(acc_scale, "float32")),
                relay.const(acc_zero, "int32"), relay.const(out_scale), relay.const(out_zero, "int32"),
                axis=axis, out_dtype=out.dtype)
        multiplier = (np.asarray(acc_scale, "float32") / out_scale).astype("float32")
        if acc_zero:
            acc = relay.subtract(acc, relay.const(acc_zero, "int32"))
        scaled = relay.multiply(relay.cast(acc, "float32"), _channel_const(multiplier, rank, axis, "float32"))
        return _saturate(scaled, out)

    def _rescale(self, q: relay.Expr, params: QParams, out: QParams, rank: int) -> relay.Expr:
        """An 8-bit tensor re-quantized to ``out`` (ONNX: dequantize in float32, then quantize)."""
        scale, zero = params.scalar()
        out_scale, out_zero = out.scalar()
        if scale == out_scale and zero == out_zero and params.dtype == out.dtype:
            return q
        if self.requantize == "qnn":
            return relay.qnn.op.requantize(q, relay.const(scale), relay.const(zero, "int32"),
                                           relay.const(out_scale), relay.const(out_zero, "int32"),
                                           out_dtype=out.dtype)
        real = relay.multiply(self._centered(q, zero), relay.const(scale))
        return _saturate(relay.divide(real, relay.const(out_scale)), out)

    @staticmethod
    def _centered(q: relay.Expr, zero: int) -> relay.Expr:
        """``float32(q - zero)``."""
        return relay.cast(relay.subtract(relay.cast(q, "int32"), relay.const(zero, "int32")), "float32")

    # -- rules ----------------------------------------------------------------------
    def _conv2d(self, conv: relay.Call, out: QParams, bias=None) -> Optional[relay.Expr]:
        attrs = conv.attrs
        if attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
            return None
        data, weight = self._dequantized(conv.args[0]), self._weight(conv.args[1], 0)
        if data is None or weight is None:
            return None
        (x, x_params), (w, w_params) = data, weight
        x_scale, x_zero = x_params.scalar()
        acc = relay.qnn.op.conv2d(
            x, relay.const(w), relay.const(x_zero, "int32"), relay.const(0, "int32"), relay.const(x_scale),
            _scale_const(w_params.scale), kernel_size=tuple(w.shape[2:]), channels=w.shape[0],
            strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation, groups=attrs.groups,
            out_dtype="int32")
        return self._finish(acc, x_scale * w_params.scale.reshape(-1), bias, out, rank=4, axis=1)

    def _dense(self, dense: relay.Call, out: QParams, bias=None) -> Optional[relay.Expr]:
        data = self._dequantized(dense.args[0])
        weight_expr, transposed = dense.args[1], False
        if _op(weight_expr, "transpose") and [int(a) for a in weight_expr.attrs.axes or [1, 0]] == [1, 0]:
            weight_expr, transposed = weight_expr.args[0], True  # ONNX MatMul: (K, N) weight
        if data is None or len(_type(dense.args[0]).shape) != 2:
            return None
        (x, x_params), units = data, int(_type(dense).shape[1])
        x_scale, x_zero = x_params.scalar()
        weight = self._weight(weight_expr, 1 if transposed else 0)
        if weight is not None:
            w, w_params = weight
            w_expr, w_zero = relay.const(np.ascontiguousarray(w.T) if transposed else w), 0
        else:  # a MatMul of two activations: the weight is a quantized tensor too
            activation = self._dequantized(weight_expr)
            if activation is None:
                return None
            w_expr, w_params = activation
            w_expr = relay.transpose(w_expr, [1, 0]) if transposed else w_expr
            w_zero = w_params.scalar()[1]
        acc = relay.qnn.op.dense(x, w_expr, relay.const(x_zero, "int32"), relay.const(w_zero, "int32"),
                                 relay.const(x_scale), _scale_const(w_params.scale), units=units, out_dtype="int32")
        return self._finish(acc, x_scale * w_params.scale.reshape(-1), bias, out, rank=2, axis=1)

    def _batch_matmul(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        a, b = self._dequantized(call.args[0]), self._dequantized(call.args[1])
        if a is None or b is None:
            return None
        (qa, pa), (qb, pb) = a, b
        (sa, za), (sb, zb) = pa.scalar(), pb.scalar()
        # qnn.batch_matmul takes (batch, M, K) x (batch, N, K).
        qa = relay.transpose(qa, [0, 2, 1]) if call.attrs.transpose_a else qa
        qb = qb if call.attrs.transpose_b else relay.transpose(qb, [0, 2, 1])
        acc = relay.qnn.op.batch_matmul(qa, qb, relay.const(za, "int32"), relay.const(zb, "int32"),
                                        relay.const(sa), relay.const(sb), out_dtype="int32")
        return self._requantize(acc, np.asarray(sa * sb, "float32"), 0, out, 3, -1)

    def _finish(self, acc, acc_scale: np.ndarray, bias, out: QParams, rank: int, axis: int) -> Optional[relay.Expr]:
        """Add a dequantized constant bias to the int32 accumulator (in its scale), then requantize."""
        acc_scale = np.asarray(acc_scale, "float32")
        if bias is not None:
            b_data, b_params = self._constant(bias.args[0]), self._qparams(bias, "int32")
            if b_data is None or b_params is None or np.any(b_params.zero_point != 0):
                return None
            if np.array_equal(np.broadcast_to(b_params.scale, acc_scale.shape), acc_scale):
                b_int = b_data.astype("int32")   # quantizers store the bias in the accumulator's scale
            else:
                b_int = np.rint(b_data * (b_params.scale.astype("float64") / acc_scale)).astype("int32")
            acc = relay.add(acc, _channel_const(b_int, rank, axis, "int32"))
        return self._requantize(acc, acc_scale, 0, out, rank, axis)

    def _bias_add(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        inner = call.args[0]
        if not _op(call.args[1], "qnn.dequantize"):
            return None
        if _op(inner, "nn.conv2d") and int(call.attrs.axis) == 1:
            return self._conv2d(inner, out, bias=call.args[1])
        if _op(inner, "nn.dense") and int(call.attrs.axis) in (1, -1):
            return self._dense(inner, out, bias=call.args[1])
        return None

    def _add(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        lhs, rhs = call.args
        if _op(lhs, "nn.dense") and _op(rhs, "qnn.dequantize") and str(_type(rhs.args[0]).dtype) == "int32":
            return self._dense(lhs, out, bias=rhs)   # ONNX Gemm: MatMul + Add of an int32 bias
        a, b = self._dequantized(lhs), self._dequantized(rhs)
        if a is None or b is None or a[1].dtype != b[1].dtype:
            return None
        (qa, pa), (qb, pb) = a, b
        (sa, za), (sb, zb), (sc, zc) = pa.scalar(), pb.scalar(), out.scalar()
        if self.requantize == "qnn":
            return relay.qnn.op.add(qa, qb, relay.const(sa), relay.const(za, "int32"), relay.const(sb),
                                    relay.const(zb, "int32"), relay.const(sc), relay.const(zc, "int32"))
        # onnxruntime's QLinearAdd (what it runs for a QDQ Add): each centered input times its scale over
        # the output's, in float32, summed, then rounded (ONNX's dequantize-add-quantize up to the
        # rounding of a near tie; one multiply less per element).
        centered_a, centered_b = self._add_operands((qa, za), (qb, zb))
        real = relay.add(relay.multiply(centered_a, relay.const(np.float32(sa) / np.float32(sc))),
                         relay.multiply(centered_b, relay.const(np.float32(sb) / np.float32(sc))))
        return _saturate(real, out)

    def _add_operands(self, *operands: Tuple[relay.Expr, int]) -> List[relay.Expr]:
        """``float32(q - zero)`` of each of an add's 8-bit operands, one of them read before its 8-bit cast.

        The add of a residual block follows a conv (or dense) whose result was just requantized to 8 bits:
        fused into one kernel, each output went float -> rounded -> 8 bits -> int32 -> float (five vector
        instructions on top of the rounding, for a value the kernel had). Read at the rounding instead
        (:func:`~tvm_tcutils.fast_forms.saturated_parts`), the same value costs one (the add's result can
        differ only where the kernel then fuses the other product into an FMA: a near tie, rounded once).
        Only for an operand that is a product's requantized result and not also an input of the other
        operand (it has another reader then, which needs the 8 bits); the other operand, when it is such a
        result too (a downsampling branch), ends its own kernel in 8 bits (``stop_fusion``) rather than in
        the float of its dequantize, a quarter of the bytes to write and read again.
        """
        sources = [self.memo.bound.get(q, q) if self.one_region else q for q, _ in operands]
        # A QOperator file's conv ends in qnn.requantize, which plain relay.build legalizes
        # (legalize_requantize) before it reaches this add: read it as that form here too.
        parts = [saturated_parts(_as_onnx_requantize(source)) for source in sources]
        products = [part is not None and _reads_product(part[0]) for part in parts]
        fused = [k for k, (product, (_, zero)) in enumerate(zip(products, operands)) if product
                 and parts[k][1] == zero
                 and not any(_computes(sources[j], sources[k]) for j in range(len(operands)) if j != k)]
        out = [self._centered(q, zero) for q, zero in operands]
        if fused:
            k = fused[0]
            clamped = parts[k][0]
            out[k] = round_half_even(self.memo[clamped] if self.one_region else clamped)
            for j, (q, zero) in enumerate(operands):
                if j != k and products[j]:
                    out[j] = self._centered(relay.annotation.stop_fusion(q), zero)
        return out

    def _concatenate(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        fields = call.args[0].fields if isinstance(call.args[0], relay.Tuple) else None
        inputs = [self._dequantized(f) for f in fields or []]
        if not inputs or any(i is None for i in inputs) or len({p.dtype for _, p in inputs} | {out.dtype}) != 1:
            return None
        rank = len(_type(call).shape)
        return relay.concatenate([self._rescale(q, p, out, rank) for q, p in inputs], int(call.attrs.axis))

    def _global_avg_pool(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        data = self._dequantized(call.args[0])
        if data is None or call.attrs.layout != "NCHW":
            return None
        (x, params), (h, w) = data, [int(d) for d in _type(call.args[0]).shape[2:]]
        scale, zero = params.scalar()
        total = relay.sum(relay.cast(x, "int32"), axis=[2, 3], keepdims=True)
        if self.requantize == "qnn":
            return self._requantize(total, np.asarray(scale / np.float32(h * w), "float32"), zero * h * w, out, 4, 1)
        # onnxruntime's QLinearGlobalAveragePool: (sum - N * zero) * (x_scale / (y_scale * N)) in float32.
        multiplier = scale / (out.scalar()[0] * np.float32(h * w))
        centered = relay.cast(relay.subtract(total, relay.const(zero * h * w, "int32")), "float32")
        return _saturate(relay.multiply(centered, relay.const(np.float32(multiplier))), out)

    def _value_preserving(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        if len(call.args) != 1:
            return None
        # quantize(reshape(region)) = reshape(quantize(region)): quantization is elementwise.
        inner = self._region(call.args[0], out)
        if inner is not None:
            return relay.Call(call.op, [inner], call.attrs, call.type_args, call.span)
        data = self._dequantized(call)
        return None if data is None else self._rescale(*data, out, len(_type(call).shape))

    def _relu(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        # quantize(relu(v)) = max(quantize(v), quantize(0)): quantization is monotone.
        inner = self._region(call.args[0], out)
        return None if inner is None else relay.maximum(inner, relay.const(out.scalar()[1], out.dtype))

    def _clip(self, call: relay.Call, out: QParams) -> Optional[relay.Expr]:
        inner = self._region(call.args[0], out)
        if inner is None:
            return None
        scale, zero = out.scalar()
        info = np.iinfo(out.dtype)
        bounds = [int(np.clip(np.rint(np.float32(v) / scale) + zero, info.min, info.max))
                  for v in (call.attrs.a_min, call.attrs.a_max)]
        return relay.clip(inner, *bounds)


def to_integer(mod: tvm.IRModule, requantize: str = "onnx") -> tvm.IRModule:
    """``mod`` with its fake-quantized (QDQ) regions as integer ``qnn`` ops (see the module's table).

    Parameters
    ----------
    mod : IRModule
        A Relay module, typically ``relay.frontend.from_onnx`` of a QDQ model
        (constants bound: ``freeze_params=True``). Not changed.
    requantize : {"onnx", "qnn"}
        ``"onnx"``: float32 multiplier, round half to even, saturation (matches
        onnxruntime); ``"qnn"``: TVM's ``qnn.requantize`` / ``qnn.add``.

    Returns
    -------
    IRModule
        A new module; the same object when ``mod`` has no ``qnn.quantize``.

    Examples
    --------
    >>> x = relay.var("x", shape=(2, 3))
    >>> float_mod = tvm.IRModule.from_expr(relay.nn.relu(x))
    >>> to_integer(float_mod) is float_mod
    True
    >>> to_integer(float_mod, requantize="fast")
    Traceback (most recent call last):
    ...
    ValueError: requantize must be one of ('onnx', 'qnn'), got 'fast'
    """
    if requantize not in REQUANTIZE:
        raise ValueError(f"requantize must be one of {REQUANTIZE}, got {requantize!r}")
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    if not any(_op(c, "qnn.quantize") for c in calls(mod)):
        return mod
    typed = relay.transform.FoldConstant()(relay.transform.InferType()(mod))
    main = typed["main"]
    body = _Rewriter(requantize).rewrite(main.body)
    out = tvm.IRModule(dict(typed.functions.items()), dict(typed.type_definitions.items()))
    out["main"] = relay.Function(main.params, body, None, main.type_params, main.attrs)
    return relay.transform.InferType()(out)


def quantized_to_integer(requantize: str = "onnx") -> tvm.transform.Pass:
    """:func:`to_integer` as a module pass, for ``tvm.transform.Sequential`` pipelines.

    Examples
    --------
    >>> seq = tvm.transform.Sequential([relay.transform.InferType(), quantized_to_integer()])
    >>> x = relay.var("x", shape=(4,))
    >>> seq(tvm.IRModule.from_expr(relay.exp(x)))["main"].body.op.name
    'exp'
    """
    if requantize not in REQUANTIZE:
        raise ValueError(f"requantize must be one of {REQUANTIZE}, got {requantize!r}")

    def transform(mod: tvm.IRModule, _ctx) -> tvm.IRModule:
        return to_integer(mod, requantize)

    return tvm.transform.module_pass(transform, opt_level=0, name="tcutils.QuantizedToInteger")


def prepare_for_target(mod: tvm.IRModule, target) -> tvm.IRModule:
    """What the package's build applies: :func:`to_integer` for targets with a dot-product ISA.

    Other targets, and modules without ``qnn.quantize``, get ``mod`` itself back.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> mod = tvm.IRModule.from_expr(relay.exp(x))
    >>> prepare_for_target(mod, "llvm -mcpu=znver4") is mod
    True
    """
    if not rewrites_for(target) or _legalize_hook_installed():
        # With the package's FTVMQnnLegalize hook of qnn.quantize installed, relay.build makes each
        # region integer itself, with the fast forms of a region's float ops (softmax, GELU) that
        # to_integer alone does not write: rewriting first built a QDQ encoder 4x slower than plain
        # relay.build (bert-tiny 20.8 against 4.9 ms) in measure.build, the CLI and Collage.
        return mod
    return to_integer(mod)


def _legalize_hook_installed() -> bool:
    """Whether the package's ``FTVMQnnLegalize`` of ``qnn.quantize`` (:func:`legalize_quantize`) is installed."""
    from .. import registry  # read only; imported here, as the registry's hooks import this module

    return any(r.name == "qnn.quantize" and r.attr == "FTVMQnnLegalize" for r in registry.registered())


def rewrites_for(target) -> bool:
    """Whether the package makes QDQ regions integer for ``target`` (a Target, a string or None): the one
    decision behind :func:`prepare_for_target` (``measure.build``, the CLI, tuning) and the
    ``FTVMQnnLegalize`` hook behind plain ``relay.build`` (:func:`legalize_quantize`). Targets with a
    dot-product ISA.

    Examples
    --------
    >>> rewrites_for("llvm -mcpu=znver4"), rewrites_for("llvm"), rewrites_for(None)
    (True, False, False)

    Also targets another capability says its kernels take the integer products of (the tensor-core
    capability's CUDA GEMMs, on the architectures a GPU check verified them on): it registers
    :data:`INTEGER_TARGET_FUNC` while installed; the capabilities do not import each other.
    """
    if for_target(target) is not None:
        return True
    takes = tvm.get_global_func(INTEGER_TARGET_FUNC, allow_missing=True)
    return target is not None and takes is not None and bool(takes(str(target)))


#: The TVM global function (``target string -> bool``) another capability registers to have the QDQ route
#: make regions integer for targets whose integer products its kernels take.
INTEGER_TARGET_FUNC = "tvm_tcutils.qdq.takes_integer_products"


def integer_region(quantize: relay.Call, requantize: str = "onnx"
                   ) -> Optional[Tuple[relay.Expr, Dict[relay.Var, relay.Expr]]]:
    """What :func:`to_integer` makes of one ``qnn.quantize`` call and the float region it ends, or None.

    The rewrite is :func:`to_integer`'s, applied to ``quantize`` alone: what lies outside the region
    (the 8-bit tensors its ``qnn.dequantize`` calls read, a float input) becomes a new variable. Nodes may
    be untyped (a pass's new nodes): their types are inferred from their typed inputs.

    Returns
    -------
    (expr, inputs) or None
        The integer expression, closed over the new variables, and each variable's node; None when the
        region stays as it is.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 4, 6, 6))
    >>> q = relay.qnn.op.quantize(x, relay.const(0.1), relay.const(3), out_dtype="uint8")
    >>> d = relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(3))
    >>> w = relay.qnn.op.dequantize(relay.const(np.ones((8, 4, 3, 3), "int8")), relay.const(0.02), relay.const(0))
    >>> y = relay.qnn.op.quantize(relay.nn.conv2d(d, w, kernel_size=(3, 3), channels=8), relay.const(0.5),
    ...                           relay.const(0), out_dtype="uint8")
    >>> expr, inputs = integer_region(y)
    >>> [node.op.name for node in inputs.values()], "qnn.conv2d" in {c.op.name for c in calls(expr)}
    (['qnn.quantize'], True)
    """
    if not _op(quantize, "qnn.quantize"):
        raise TypeError(f"integer_region takes a qnn.quantize call, got {type(quantize).__name__}")
    rewriter = _Rewriter(requantize, one_region=True)
    integer = rewriter._quantize(quantize)
    if integer is None:
        return None
    bound = rewriter.memo.bound
    return integer, {var: bound[var] for var in relay.analysis.free_vars(integer)}


#: Set while :func:`legalize_quantize` legalizes a region it made: the nested pass leaves quantizes to TVM.
_LEGALIZING = threading.local()


def legalize_quantize(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.quantize``: the QDQ region it ends as :func:`to_integer` makes it.

    TVM's build runs this legalization first, with the parameters bound as constants; so plain
    ``relay.build`` of a QDQ model for a target :func:`rewrites_for` builds the integer graph that
    ``to_integer`` + ``relay.build`` builds. The region's new ``qnn.conv2d`` / ``qnn.dense`` go through
    TVM's ``FTVMQnnLegalize`` here (the pass does not visit what a handler returns). None (TVM's own
    lowering) for other targets and for a region that stays float, such as one ``to_integer`` already
    saw: a module made integer before the build is built as it is. A region that stays float gets
    the fast forms of its slow ops (:func:`fast_region`: GELU's ``erf``).
    """
    target = tvm.target.Target.current(allow_none=True)
    if getattr(_LEGALIZING, "active", False) or not rewrites_for(target):
        return None
    original = relay.Call(tvm.ir.Op.get("qnn.quantize"), list(inputs), attrs)
    # The float ops between the region's dequantizes and this quantize in their fast forms (FAST_FORMS:
    # GELU's erf); the rewrite may leave them in float outside the integer expression.
    fast = fast_region(original)
    quantize = original if fast is None else fast
    found = integer_region(quantize)
    if found is None:
        return fast
    integer, bound = found
    return _legalized(integer, bound)


def _legalized(expr: relay.Expr, bound: Dict[relay.Var, relay.Expr]) -> Optional[relay.Call]:
    """``expr`` (closed over ``bound``'s variables) through TVM's ``FTVMQnnLegalize``, the variables then
    bound back: the pass does not visit what a handler returns, so a handler that makes new QNN ops
    legalizes them itself. The package's handlers step aside meanwhile (no recursion)."""
    region = tvm.IRModule.from_expr(relay.Function(list(bound), expr))
    outer = getattr(_LEGALIZING, "active", False)
    _LEGALIZING.active = True
    try:
        region = relay.transform.Legalize("FTVMQnnLegalize")(relay.transform.InferType()(region))
    finally:
        _LEGALIZING.active = outer
    legal = region["main"]
    out = relay.bind(legal.body, dict(zip(legal.params, bound.values())))
    # The pass takes a call only (every region ends in one: a cast, clip, concatenate...).
    return out if isinstance(out, relay.Call) else None


def legalize_uniform_zero_point(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.conv2d`` / ``qnn.dense``: a constant per-channel kernel zero point whose
    values are all equal becomes that scalar, then TVM's legalization runs as before.

    onnxruntime's QOperator files carry per-channel weights' zero points as vectors (all 0 for its
    symmetric s8 weights); TVM's canonicalization cannot see that they are equal and adds the data's
    channel sums times the zero points for every conv: on ResNet-50's QOperator file, 2.6 ms of sums and
    0.6 ms of layout transforms and repeats for a term that is zero. For targets :func:`rewrites_for`;
    None (TVM's own legalization unchanged) elsewhere and for zero points that differ or are scalars.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8), dtype="uint8")
    >>> w = relay.const(np.ones((4, 8), "int8"))
    >>> d = relay.qnn.op.dense(x, w, relay.const(3), relay.const(np.zeros(4, "int32")), relay.const(0.1),
    ...                        relay.const(np.full(4, 0.2, "float32")), units=4)
    >>> call = relay.transform.InferType()(tvm.IRModule.from_expr(d))["main"].body
    >>> types = [a.checked_type for a in call.args] + [call.checked_type]
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     legal = legalize_uniform_zero_point(call.attrs, call.args, types)
    >>> [c.args[3].data.numpy().shape for c in calls(legal) if c.op.name == "qnn.dense"]
    [()]
    """
    if getattr(_LEGALIZING, "active", False) or not rewrites_for(tvm.target.Target.current(allow_none=True)):
        return None
    args = _uniform_zero_point(inputs)
    if args is None:
        return None
    # Only the call's own inputs become variables of the region to legalize.
    bound, call_args = _region_inputs(args, types, "tcutils_zp_arg", lambda k, arg: isinstance(arg, relay.Constant))
    op = tvm.ir.Op.get("qnn.conv2d" if hasattr(attrs, "kernel_layout") else "qnn.dense")
    return _legalized(relay.Call(op, call_args, attrs), bound)


def _region_inputs(inputs, types, prefix: str, kept) -> Tuple[Dict[relay.Var, relay.Expr], List[relay.Expr]]:
    """``(bound, args)``: the call's ``inputs`` for a region to legalize (:func:`_legalized`), each one
    ``kept(index, input)`` rejects replaced by a variable ``{prefix}{index}`` of its type (``bound`` maps the
    variables back to the inputs)."""
    bound: Dict[relay.Var, relay.Expr] = {}
    args = []
    for k, (arg, arg_type) in enumerate(zip(inputs, types)):
        if not kept(k, arg):
            var = relay.var(f"{prefix}{k}", type_annotation=arg_type)
            bound[var], arg = arg, var
        args.append(arg)
    return bound, args


def _uniform_zero_point(inputs) -> Optional[list]:
    """``inputs`` of a ``qnn.conv2d`` / ``qnn.dense`` with its constant per-channel kernel zero point of equal
    values as that scalar; None where it is no such vector."""
    zero = _const(inputs[3])
    if zero is None or zero.size < 2 or not np.all(zero == zero.reshape(-1)[0]):
        return None
    args = list(inputs)
    args[3] = relay.const(zero.reshape(-1)[0].astype(zero.dtype))
    return args


def legalize_depthwise_padding(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.conv2d``: a padded u8 x i8 depthwise conv whose kernel rows the package's
    depthwise kernel reads as whole quads (:mod:`.topi.depthwise`) gets its data padded once.

    TVM's canonical form pads the data with the zero point in a kernel of its own, then the package's
    depthwise kernel copied the padded data again, one pixel wider on the right, for its 4-tap rows (a 3x3
    kernel read as 3 x 4 with a zero tap): two copies of every depthwise conv's input (MobileNet-v2: 16 of
    them). Here the zero-point padding adds the pixels the quads read, and the kernel gets its zero taps
    (``kernel_size`` widened to whole quads): the conv then reads the one padded copy as it is. The same
    sums (the added taps are zero; the data's zero point times the kernel's sum is unchanged). For targets
    :func:`rewrites_for` whose ISA the depthwise kernel takes, ``NCHW`` convs of a multiplier of 1, channels
    a multiple of its 16 lanes, dilation 1, a kernel zero point of 0 and rows of fewer than 8 taps not
    already whole quads; None (the other handlers, then TVM's) elsewhere.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 16, 8, 8), dtype="uint8")
    >>> w = relay.const(np.ones((16, 1, 3, 3), "int8"))
    >>> conv = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.1), relay.const(0.2),
    ...                            kernel_size=(3, 3), channels=16, groups=16, padding=(1, 1))
    >>> call = relay.transform.InferType()(tvm.IRModule.from_expr(conv))["main"].body
    >>> types = [a.checked_type for a in call.args] + [call.checked_type]
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     legal = legalize_depthwise_padding(call.attrs, call.args, types)
    >>> [(c.op.name, [int(v) for v in c.attrs.kernel_size]) for c in calls(legal) if c.op.name == "qnn.conv2d"]
    [('qnn.conv2d', [3, 4])]
    """
    from tvm.topi.nn.utils import get_pad_tuple

    from .topi import depthwise  # TOPI modules import TVM's topi: only where a handler runs

    # Also inside a QDQ region's legalization (:func:`_legalized`), where the region's convs are made; what
    # this returns has no padding, so it does not come back here.
    if not rewrites_for(tvm.target.Target.current(allow_none=True)):
        return None
    data_type, kernel_type = types[0], types[1]
    if (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW") or len(data_type.shape) != 4:
        return None
    try:
        n, channels, height, width = (int(d) for d in data_type.shape)
        kernel_shape = [int(d) for d in kernel_type.shape]
    except TypeError:  # a dynamic dimension
        return None
    _, multiplier, k_h, k_w = kernel_shape
    isa = for_target(tvm.target.Target.current(allow_none=True))
    quads = -(-k_w // depthwise.QUAD)
    extra = quads * depthwise.QUAD - k_w
    top, left, bottom, right = get_pad_tuple(tuple(int(p) for p in attrs.padding), (k_h, k_w))
    kernel_zero = _const(inputs[3])
    if (int(attrs.groups) != channels or multiplier != 1 or not extra or not (top or left or bottom or right)
            or kernel_zero is None or np.any(kernel_zero != 0) or isa is None or channels % isa.lanes):
        return None
    lanes = isa.lanes
    if not depthwise.applicable(isa, (n, channels // lanes, height, width, lanes),
                                (channels // lanes, 1, k_h, k_w + extra, 1, lanes), attrs.dilation,
                                str(data_type.dtype), str(kernel_type.dtype), "int32"):
        return None
    # The call's inputs that are not closed expressions become variables of the region to legalize.
    bound, args = _region_inputs(inputs, types, "tcutils_dw_arg",
                                 lambda k, arg: k != 0 and not relay.analysis.free_vars(arg))
    data, kernel, data_zero, _, data_scale, kernel_scale = args
    padded = relay.nn.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right + extra)), pad_value=data_zero)
    kernel = relay.nn.pad(kernel, ((0, 0), (0, 0), (0, 0), (0, extra)))
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(padding=(0, 0, 0, 0), kernel_size=(k_h, k_w + extra))
    call = relay.qnn.op.conv2d(padded, kernel, data_zero, relay.const(0, "int32"), data_scale, kernel_scale,
                               **new_attrs)
    return _legalized(call, bound)


def legalize_group_conv2d(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.conv2d``: a grouped (not depthwise) conv as a conv of its 8-bit operands.

    TVM's canonical form lowers a grouped ``qnn.conv2d`` (groups neither 1 nor the channels) to a conv of
    its operands widened to int32, which no dot product takes (ShuffleNet's grouped 1x1 convs: 5-7x
    slower than OpenVINO's). With a kernel zero point of 0 the same sums are the 8-bit operands' conv of
    the data padded with its zero point, minus the zero point times each output channel's kernel sum; the
    int8 conv2d hooks then pad each group's channels for the dot product
    (:func:`~.topi.conv2d_nchwc.group_padding_pays`). For targets :func:`rewrites_for` with a
    dot-product ISA, ``NCHW`` convs with constant zero points, the kernel's all 0; None (the other
    handlers, then TVM's) elsewhere.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 16, 6, 6), dtype="uint8")
    >>> w = relay.const(np.ones((32, 4, 1, 1), "int8"))
    >>> conv = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(0), relay.const(0.1), relay.const(0.2),
    ...                            kernel_size=(1, 1), channels=32, groups=4)
    >>> call = relay.transform.InferType()(tvm.IRModule.from_expr(conv))["main"].body
    >>> types = [a.checked_type for a in call.args] + [call.checked_type]
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     legal = legalize_group_conv2d(call.attrs, call.args, types)
    >>> [(c.op.name, c.args[0].checked_type.dtype) for c in calls(legal) if c.op.name == "nn.conv2d"]
    [('nn.conv2d', 'uint8')]
    """
    from tvm.topi.nn.utils import get_pad_tuple

    from .topi.conv2d_nchwc import group_padding_pays  # TOPI modules import TVM's topi: only where it runs

    # Also inside a QDQ region's legalization (:func:`_legalized`): what this returns has no QNN op.
    target = tvm.target.Target.current(allow_none=True)
    isa = for_target(target)
    if isa is None or not rewrites_for(target) or (attrs.data_layout, attrs.kernel_layout) != ("NCHW", "OIHW"):
        return None
    data_type, kernel_type = types[0], types[1]
    try:
        (n, channels, _, _), (out_c, _, k_h, k_w) = ([int(d) for d in t.shape] for t in (data_type, kernel_type))
    except (TypeError, ValueError):  # a dynamic dimension
        return None
    data_zero, kernel_zero = _const(inputs[2]), _const(inputs[3])
    if (data_zero is None or data_zero.size != 1 or kernel_zero is None or np.any(kernel_zero != 0)
            or not group_padding_pays(isa, channels, out_c, int(attrs.groups))):
        return None
    zero = int(data_zero.reshape(-1)[0])
    data, kernel = inputs[0], inputs[1]
    (d_h, d_w) = (int(d) for d in attrs.dilation)
    top, left, bottom, right = get_pad_tuple(tuple(int(p) for p in attrs.padding),
                                             ((k_h - 1) * d_h + 1, (k_w - 1) * d_w + 1))
    if top or left or bottom or right:
        data = relay.nn.pad(data, ((0, 0), (0, 0), (top, bottom), (left, right)),
                            pad_value=relay.const(zero, str(data_type.dtype)))
    new_attrs = {key: attrs[key] for key in attrs.keys()}
    new_attrs.update(padding=(0, 0, 0, 0), out_dtype="int32")
    out = relay.nn.conv2d(data, kernel, **new_attrs)
    if not zero:
        return out
    if isinstance(kernel, relay.Constant):
        sums = kernel.data.numpy().astype("int64").sum(axis=(1, 2, 3)) * zero
        return relay.subtract(out, relay.const(sums.astype("int32").reshape(1, out_c, 1, 1)))
    sums = relay.sum(relay.cast(kernel, "int32"), axis=[1, 2, 3], keepdims=True)  # (O, 1, 1, 1)
    return relay.subtract(out, relay.reshape(relay.multiply(sums, relay.const(zero, "int32")), (1, out_c, 1, 1)))


#: Target key whose TVM ``qnn.conv2d`` legalization pads every NCHW conv's channels for ``vrmpy``.
PADDING_KEY = "hexagon"


def legalize_grouped_conv2d(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.conv2d`` on Hexagon targets: a grouped (depthwise) conv left unpadded.

    TVM 0.19's Hexagon legalization pads the output channels of every NCHW ``qnn.conv2d`` to a multiple of
    32 (the input channels to 4) for ``vrmpy``, groups or not: a depthwise conv of 8 channels gets a kernel
    of 32 output channels in 8 groups, which no strategy takes ("Unsupported group_conv2d layout NCHW"), so
    no QDQ MobileNet built for Hexagon. A grouped conv is no ``vrmpy`` product: it is returned as it is (a
    per-channel kernel zero point of equal values as the scalar), and TVM's canonical form lowers it for any
    channel count. None (the other handlers, then TVM's) for ungrouped convs and other targets; also while
    a QDQ region is legalized (:func:`_legalized`), since TVM's padding is what this keeps away.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8, 6, 6), dtype="uint8")
    >>> w = relay.const(np.ones((8, 1, 3, 3), "int8"))
    >>> conv = relay.qnn.op.conv2d(x, w, relay.const(3), relay.const(np.zeros(8, "int32")), relay.const(0.1),
    ...                            relay.const(np.full(8, 0.2, "float32")), kernel_size=(3, 3), channels=8, groups=8)
    >>> call = relay.transform.InferType()(tvm.IRModule.from_expr(conv))["main"].body
    >>> types = [a.checked_type for a in call.args] + [call.checked_type]
    >>> with tvm.target.Target("c -keys=hexagon,cpu -mcpu=hexagonv66"):
    ...     legal = legalize_grouped_conv2d(call.attrs, call.args, types)
    >>> legal.op.name, legal.args[1].data.shape, legal.args[3].data.shape
    ('qnn.conv2d', (8, 1, 3, 3), ())
    """
    target = tvm.target.Target.current(allow_none=True)
    if int(attrs.groups) == 1 or target is None or PADDING_KEY not in target.keys:
        return None
    return relay.Call(tvm.ir.Op.get("qnn.conv2d"), _uniform_zero_point(inputs) or list(inputs), attrs)


def legalize_requantize(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``qnn.requantize``: an int32 accumulator requantized as onnxruntime does it.

    A QOperator file (``QLinearConv``, ``QLinearMatMul``) imports as ``qnn.conv2d`` / ``qnn.dense`` +
    ``qnn.requantize``, which TVM lowers to a fixed-point multiply in int64, rounding half up: up to one
    step from onnxruntime, and slower than the QDQ route's epilogue. For targets :func:`rewrites_for`,
    an int32 input with constant scales and zero points becomes that epilogue -- ``float32(acc - zp_in)``
    times the float32 multiplier ``in_scale / out_scale`` (per channel on ``axis``), clamped, rounded half
    to even, plus ``zp_out`` -- the arithmetic :func:`to_integer` gives QDQ regions. None (TVM's lowering)
    for other targets and inputs: 8-bit rescales, scales known only at run time.

    Examples
    --------
    >>> acc = relay.var("acc", shape=(1, 4), dtype="int32")
    >>> q = relay.qnn.op.requantize(acc, relay.const(0.02), relay.const(0), relay.const(0.5), relay.const(3),
    ...                             out_dtype="uint8")
    >>> call = relay.transform.InferType()(tvm.IRModule.from_expr(q))["main"].body
    >>> types = [a.checked_type for a in call.args] + [call.checked_type]
    >>> with tvm.target.Target("llvm -mcpu=znver4"):
    ...     legal = legalize_requantize(call.attrs, call.args, types)
    >>> legal.op.name, "qnn.requantize" in {c.op.name for c in calls(legal)}
    ('cast', False)
    """
    if not rewrites_for(tvm.target.Target.current(allow_none=True)):
        return None
    return _onnx_requantize(attrs, inputs, types)


def _onnx_requantize(attrs, inputs, types) -> Optional[relay.Expr]:
    """:func:`legalize_requantize`'s expression for any target, or None where it leaves the call to TVM."""
    data, in_scale, in_zero, out_scale, out_zero = inputs
    consts = [_const(x) for x in (in_scale, in_zero, out_scale, out_zero)]
    if any(c is None for c in consts) or types[0].dtype != "int32":
        return None
    in_scale_np, in_zero_np, out_scale_np, out_zero_np = consts
    out_dtype = str(types[-1].dtype)
    if out_dtype not in ("int8", "uint8") or in_zero_np.size != 1 or out_scale_np.size != 1 or out_zero_np.size != 1:
        return None
    rank = len(types[0].shape)
    axis = int(attrs.axis) % rank if rank else 0
    out = QParams(out_scale_np.astype("float32").reshape(1), out_zero_np.astype("int32").reshape(1), out_dtype)
    multiplier = (in_scale_np.astype("float32") / np.float32(out_scale_np.reshape(-1)[0])).astype("float32")
    acc = data if int(in_zero_np.reshape(-1)[0]) == 0 else relay.subtract(
        data, relay.const(int(in_zero_np.reshape(-1)[0]), "int32"))
    scaled = relay.multiply(relay.cast(acc, "float32"), _channel_const(multiplier, rank, axis, "float32"))
    return _saturate(scaled, out)


#: Ops whose int32 result, requantized, is worth reading in float by the add that follows (its kernel's epilogue).
_PRODUCTS = ("qnn.conv2d", "qnn.dense", "qnn.batch_matmul", "nn.conv2d", "nn.dense", "nn.batch_matmul")


def _reads_product(value: relay.Expr, depth: int = 8) -> bool:
    """Whether ``value`` is a product (:data:`_PRODUCTS`) through at most ``depth`` first arguments (the
    requantize's clip, scale, cast, bias add)."""
    for _ in range(depth):
        if not isinstance(value, relay.Call) or not isinstance(value.op, tvm.ir.Op) or not value.args:
            return False
        if value.op.name in _PRODUCTS:
            return True
        value = value.args[0]
    return False


def _as_onnx_requantize(expr: relay.Expr) -> relay.Expr:
    """A ``qnn.requantize`` call as :func:`legalize_requantize` makes it, other expressions as they are."""
    if not _op(expr, "qnn.requantize"):
        return expr
    types = [_type(arg) for arg in expr.args] + [_type(expr)]
    legal = _onnx_requantize(expr.attrs, list(expr.args), types)
    return expr if legal is None else legal


def _reaches(expr: relay.Expr, target: relay.Expr, limit: Optional[int] = None) -> Optional[bool]:
    """Whether ``target`` is one of the nodes that compute ``expr``: depth first, stopping when found;
    None when ``limit`` nodes were seen first. (Depth first and without repeats, unlike
    :func:`~tvm_tcutils._tvm.upstream_nodes`' breadth-first look: a residual block's input lies a few layers
    down one path, past attention's three branches.)"""
    seen, pending = set(), [expr]
    while pending:
        node = pending.pop()
        if node.same_as(target):
            return True
        if node in seen:
            continue
        if limit is not None and len(seen) >= limit:
            return None
        seen.add(node)
        if isinstance(node, relay.Call):
            pending.extend(reversed(node.args))
        elif isinstance(node, relay.Tuple):
            pending.extend(node.fields)
        elif isinstance(node, relay.TupleGetItem):
            pending.append(node.tuple_value)
    return False


#: Nodes :func:`_computes` walks from the candidate before it walks the other operand's whole input graph.
_NEAR = 512


def _computes(expr: relay.Expr, target: relay.Expr) -> bool:
    """Whether ``target`` is one of the nodes that compute ``expr``, asked the cheap way round first: where
    ``expr`` is an input of ``target`` (a residual block's input and its last conv), a walk from ``target``
    finds it a few layers down, and in a graph without cycles ``target`` then cannot compute ``expr``.
    Otherwise ``expr``'s whole input graph is walked (TVM's own traversal)."""
    if _reaches(target, expr, _NEAR):
        return False
    found = []
    relay.analysis.post_order_visit(expr, lambda node: found.append(True) if node.same_as(target) else None)
    return bool(found)


def _reads_dequantized(expr) -> bool:
    while _op(expr, *VALUE_PRESERVING_OPS) and len(expr.args) == 1:
        expr = expr.args[0]
    return _op(expr, "qnn.dequantize")


def qdq_regions(mod: tvm.IRModule) -> Sequence[str]:
    """The float ops that compute on dequantized tensors (what runs in float), in post order.

    Ops that only move values (:data:`VALUE_PRESERVING_OPS`) and QNN ops are not listed.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> dq = relay.qnn.op.dequantize(relay.qnn.op.quantize(x, relay.const(0.1), relay.const(0)),
    ...                              relay.const(0.1), relay.const(0))
    >>> q = relay.qnn.op.quantize(relay.exp(relay.reshape(dq, (2, 2))), relay.const(0.1), relay.const(0))
    >>> qdq_regions(tvm.IRModule.from_expr(q))
    ['exp']
    """
    return [c.op.name for c in calls(mod)
            if not c.op.name.startswith("qnn.") and c.op.name not in VALUE_PRESERVING_OPS
            and any(_reads_dequantized(a) for a in c.args)]
