"""Fast forms of float ops whose results are rounded to 8 bits right after: quantized models only.

TVM lowers ``erf`` and ``exp`` to one libm call per element, which LLVM does not
vectorize; TVM's own ``fast_erf`` / ``fast_softmax`` (the forms its FastMath pass
uses) are vectorized arithmetic accurate to a few float32 ulp -- far below the
8-bit step their results are quantized to. Two places know that a float value is
about to be quantized: a static QDQ region's ``qnn.quantize``
(:func:`fast_region`, used by :mod:`tvm_tcutils.dotprod.qdq`) and onnxruntime's
``DynamicQuantizeLinear`` (:func:`fast_chain`, used by
:mod:`tvm_tcutils.onnx_quantize_dynamic`). Float models never pass through
either: their ops keep TVM's exact forms.

Also here: decompositions of float ops that TVM 0.19's x86 schedules run slowly, for
the same quantized models only -- a batch of float products as one kernel parallel over the
batches on x86 (:mod:`tvm_tcutils.float_batch_matmul`) or one packed ``dense`` per batch
(:func:`dense_per_batch`; both by :func:`legalize_batch_matmul`, an ``FTVMQnnLegalize``
handler that acts only after a ``qnn`` op), softmax and layer-norm reductions over 16-wide
partial results (:func:`split_softmax`), and layer norms' mean and variance from one
vectorized pass over each row (:func:`legalize_mean` and :func:`legalize_variance`,
``FTVMQnnLegalize`` handlers that act only after a ``qnn`` op). The same float32
arithmetic in another order of the additions (the variance as onnxruntime's layer norm
computes it: the mean of squares less the squared mean).
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from ._tvm import tvm, upstream_nodes
from tvm import relay


def _op(expr, *names: str) -> bool:
    return isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name in names


#: Float ops of a region that stays float with a faster form whose error is far below the 8-bit step its
#: result is quantized to. TVM lowers ``erf`` to one libm call per element that LLVM does not vectorize: a
#: QDQ BERT's GELU took 15.4 of 24.7 ms (bert-tiny, 1 thread, AVX-512 VNNI); ``fast_erf`` is TVM's
#: vectorizable rational approximation (the one its FastMath pass uses), float32-accurate to a few ulp.
#: Attention's softmax (then 1.0 of 4.4 ms) likewise: ``fast_softmax`` is the same reduction over
#: ``fast_exp`` (relative error about 1e-7), vectorized where ``exp`` is a call per element.
FAST_FORMS = {"erf": "fast_erf", "nn.softmax": "nn.fast_softmax"}


class _FastForms(relay.ExprMutator):
    """:data:`FAST_FORMS` in the float ops behind an 8-bit quantization: stops at ``qnn.dequantize`` (a
    static region's inputs) and, with ``chain``, at every op that is neither injective nor a fast form's
    nor one of :data:`_LINEAR_PASSES`."""

    def __init__(self, chain: bool = False):
        super().__init__()
        self.chain = chain
        self.changed = 0

    def _stops(self, call: relay.Call) -> bool:
        if _op(call, "qnn.dequantize", "qnn.quantize"):
            return True
        if not self.chain:
            return False
        if not isinstance(call.op, tvm.ir.Op):
            return True
        if call.op.name in FAST_FORMS or call.op.name in _LINEAR_PASSES or call.op.name == "nn.lrn":
            return False
        pattern = call.op.get_attr("TOpPattern")
        return pattern is None or int(pattern) > _INJECTIVE

    def visit_call(self, call):
        if self._stops(call):
            return call
        new = super().visit_call(call)
        name = getattr(new.op, "name", "")
        if name == "nn.softmax":
            split = split_softmax(new)
            if split is not None:
                self.changed += 1
                return split
        if name == "nn.lrn":
            fast = fast_lrn(new)
            if fast is not None:
                self.changed += 1
                return fast
        if name in FAST_FORMS:
            self.changed += 1
            return relay.Call(tvm.ir.Op.get(FAST_FORMS[name]), new.args, new.attrs, new.type_args, new.span)
        return new


#: Width of the partial sums :func:`split_softmax` reduces a row to first.
_PARTIAL = 16


def _split_reduce(reduce, value: relay.Expr, shape, width: int) -> relay.Expr:
    """``reduce`` over the last axis (kept), as ``width``-wide partial results first."""
    parts = relay.reshape(value, (*shape[:-1], shape[-1] // width, width))
    return relay.expand_dims(reduce(reduce(parts, axis=-2), axis=-1), -1)


def split_softmax(call: relay.Call) -> Optional[relay.Expr]:
    """A float32 softmax over the last axis as ``fast_exp(x - max) / sum``, each reduction over 16-wide
    partial results first; None where it does not apply (then :data:`FAST_FORMS` gives ``fast_softmax``).

    The same arithmetic as TVM's ``fast_softmax`` (``fast_exp``, a max and a sum per row), in another
    order of the additions. TVM 0.19's x86 softmax schedule reduces each row in one serial loop, which
    LLVM does not vectorize for floats, and evaluates the exponential twice per element (once for the
    sum, once for the quotient); 16-wide partial sums break the loop-carried chain, and the exponential is
    computed once. AMD EPYC Zen 4, 1 thread: [4, 128, 128] 87.6 -> 35.3 us, [128, 256] 56.5 -> 18.4 us.

    Examples
    --------
    >>> x = relay.var("x", shape=(4, 128))
    >>> out = split_softmax(relay.nn.softmax(x))
    >>> sorted({c.op.name for c in _calls(out)} & {"fast_exp", "max", "sum", "nn.softmax"})
    ['fast_exp', 'max', 'sum']
    >>> split_softmax(relay.nn.softmax(relay.var("y", shape=(4, 100)))) is None  # 100: not 16-wide parts
    True
    """
    typed = _typed(call.args[0])
    if typed is None:  # dynamic shapes: keep the op
        return None
    typed, shape = typed
    axis = int(call.attrs.axis)
    if str(typed.dtype) != "float32" or not _splits(shape) or axis not in (-1, len(shape) - 1):
        return None
    x = call.args[0]
    shifted = relay.subtract(x, _split_reduce(relay.max, x, shape, _PARTIAL))
    exp = relay.Call(tvm.ir.Op.get("fast_exp"), [shifted])
    return relay.divide(exp, _split_reduce(relay.sum, exp, shape, _PARTIAL))


#: ``t ** beta`` for the LRN exponents :func:`fast_lrn` takes, in float32 square roots and products (each
#: correctly rounded; the result within 2 ulp of ``powf``); every model with LRN the package has met
#: (AlexNet, CaffeNet, ZFNet, GoogLeNet) uses 0.75.
LRN_POWERS = {
    0.5: relay.sqrt,
    0.75: lambda t: relay.sqrt(relay.multiply(t, relay.sqrt(t))),
    1.0: lambda t: t,
}


def fast_lrn(call: relay.Call) -> Optional[relay.Expr]:
    """A float32 ``nn.lrn`` across the channels of a static 4-D NCHW tensor as a pool and elementwise ops;
    None where it does not apply (another dtype, axis or exponent: the op stays).

    TVM 0.19 has no x86 schedule for ``nn.lrn`` (one serial loop) and lowers its power to a libm
    ``powf`` per element: the two LRNs of a quantized GoogLeNet took 5.8 of 15.7 ms (AMD EPYC Zen 4, 1
    thread). Here the squares are viewed as ``(N, 1, C, H * W)`` and the window's mean is an
    ``avg_pool2d`` over the channels (padding counted, so every mean is the window's sum over ``size``),
    then ``x / (bias + alpha * mean) ** beta`` with the power from :data:`LRN_POWERS`: the same float32
    arithmetic in another order, a few ulp from TVM's, far below the 8-bit step the result is
    quantized to. A 192 x 55 x 55 LRN, Zen 4, 1 thread: 4.30 -> 1.52 ms.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 8, 4, 4))
    >>> out = fast_lrn(relay.nn.lrn(x, size=5, axis=1, bias=2.0, alpha=1e-4, beta=0.75))
    >>> sorted({c.op.name for c in _calls(out)})
    ['add', 'divide', 'multiply', 'nn.avg_pool2d', 'reshape', 'sqrt']
    >>> fast_lrn(relay.nn.lrn(x, size=5, axis=1, beta=0.6)) is None  # no exact-enough form: the op stays
    True
    """
    typed = _typed(call.args[0])
    if typed is None:
        return None
    typed, shape = typed
    attrs = call.attrs
    size, axis, beta = int(attrs.size), int(attrs.axis), float(attrs.beta)
    if str(typed.dtype) != "float32" or len(shape) != 4 or axis not in (1, -3) or beta not in LRN_POWERS:
        return None
    x = call.args[0]
    n, c, h, w = shape
    half = size // 2  # TVM's window: size // 2 channels on each side (size is odd)
    squares = relay.reshape(relay.multiply(x, x), (n, 1, c, h * w))
    mean = relay.nn.avg_pool2d(squares, pool_size=(size, 1), padding=(half, 0, half, 0), count_include_pad=True)
    scaled = relay.multiply(relay.const(float(attrs.alpha)), relay.reshape(mean, shape))
    return relay.divide(x, LRN_POWERS[beta](relay.add(relay.const(float(attrs.bias)), scaled)))


def after_quantized_op(expr: relay.Expr, limit: int = 64) -> bool:
    """Whether a ``qnn.*`` op computes ``expr``, found among at most ``limit`` nodes upstream
    (:func:`~tvm_tcutils._tvm.upstream_nodes`); float models have none.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> dq = relay.qnn.op.dequantize(relay.var("q", shape=(4,), dtype="int8"), relay.const(0.1), relay.const(0))
    >>> after_quantized_op(relay.add(x, relay.exp(dq))), after_quantized_op(relay.add(x, relay.exp(x)))
    (True, False)
    """
    nodes, _ = upstream_nodes(expr, limit)
    return any(isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name.startswith("qnn.")
               for node in nodes)


def _static_shape(tensor_type) -> Optional[list]:
    """The dimensions of a tensor type, or None where one is known only at run time (or there is no type)."""
    try:
        return [int(d) for d in tensor_type.shape]
    except (TypeError, ValueError, AttributeError):
        return None


def _typed(expr: relay.Expr):
    """``(type, static shape)`` of ``expr``, or None where it has no type or a dynamic dimension."""
    try:
        typed = relay.transform.InferTypeLocal(expr)
    except (tvm.TVMError, TypeError, ValueError, AttributeError):
        return None
    shape = _static_shape(typed)
    return None if shape is None else (typed, shape)


def _splits(shape) -> bool:
    """Whether a last axis of ``shape`` reduces over :data:`_PARTIAL`-wide parts (at least two)."""
    return bool(shape) and shape[-1] % _PARTIAL == 0 and shape[-1] >= 2 * _PARTIAL


def _last_axis_rows(attrs, data: relay.Expr, data_type) -> Optional[list]:
    """The static shape of a float32 reduction over the last axis only that splits into 16-wide parts."""
    shape = _static_shape(data_type)
    axes = [int(a) for a in attrs.axis] if attrs.axis is not None else None
    if shape is None or str(data_type.dtype) != "float32" or not _splits(shape) or bool(attrs.exclude):
        return None
    if axes is None or len(axes) != 1 or axes[0] not in (-1, len(shape) - 1):
        return None
    return shape


#: Lanes of TVM's x86 vectorized inner loop: a halved row stays a multiple of it, or the tree's kernel is
#: not vectorized (an [n, 24] output came out as scalar code, 3x slower than [n, 48]).
TREE_LANES = 16

#: Halvings one kernel takes at most: each output of a kernel of ``n`` halvings is one expression of
#: ``2 ** n`` reads, and TVM's common-subexpression pass (``tir.CommonSubexprElimTIR``) takes time that
#: grows much faster than that expression. A [128, 3072] tensor's min and max as 10 halvings in one kernel
#: took 38 s of BERT-base's 85 s ``relay.build`` (282 KB of TIR); cut after the 6 column halvings, the same
#: two kernels build in 0.3 s and run as fast (38 us, AMD EPYC Zen 4, 1 thread). 8 (256 reads: [128, 768]'s
#: min and max, 1.3 s) stays whole.
FUSED_HALVINGS = 8


def next_halving(values: list, levels: int) -> Tuple[list, int]:
    """Before one more halving of ``values``, ``levels`` halvings already fused into their kernel:
    ``(values, levels + 1)``, or, where those reached :data:`FUSED_HALVINGS`, ``(stop_fusion of each, 1)``
    (the next halving starts a kernel of its own).

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> (same,), levels = next_halving([x], 3)
    >>> same is x, levels
    (True, 4)
    >>> (cut,), levels = next_halving([x], FUSED_HALVINGS)
    >>> cut.op.name, levels
    ('annotation.stop_fusion', 1)
    """
    if levels >= FUSED_HALVINGS:
        return [relay.annotation.stop_fusion(v) for v in values], 1
    return values, levels + 1


def halving_tree(values: list, combine, rows: int, cols: int, width: int) -> Tuple[list, int, int]:
    """``(values, cols, levels)``: each ``[rows, cols]`` value's two column halves combined elementwise
    (``combine``: ``relay.add``, ``relay.minimum``...) until a row is at most ``width`` wide or its half
    would not be a whole number of :data:`TREE_LANES`; ``levels``: the halvings in the last kernel
    (at most :data:`FUSED_HALVINGS` in one, :func:`next_halving`), for more halvings after these.

    TVM schedules a reduction over a row as one serial loop per output, which LLVM does not vectorize for
    floats; halving trees of injective ops fuse into one vectorized kernel that reads each input once, the
    trees of several values side by side. ``stop_fusion`` on the result keeps it out of the (now short)
    reduction that follows: fused into it, TVM copied the first slices out in kernels of their own and ran
    the rest as scalar code.

    Examples
    --------
    >>> x = relay.var("x", shape=(4, 256))
    >>> (low, high), cols, levels = halving_tree([x, x], relay.minimum, 4, 256, 32)
    >>> cols, levels, str(relay.transform.InferTypeLocal(low).shape)
    (32, 3, '[4, 32]')
    """
    levels = 0
    while cols > width and (cols // 2) % TREE_LANES == 0:
        values, levels = next_halving(values, levels)
        half = cols // 2
        values = [combine(relay.strided_slice(v, [0, 0], [rows, half]), relay.strided_slice(v, [0, half], [rows, cols]))
                  for v in values]
        cols = half
    return values, cols, levels


def _row_moments(values: relay.Expr, shape) -> Tuple[relay.Expr, relay.Expr]:
    """``(mean, mean of squares)`` of each row of ``values`` (last axis, kept as 1): both from one
    vectorized pass (:func:`halving_tree`) and one short sum.

    A layer norm's mean and variance each took two serial sums and a copy of ``(x - mean)^2`` (8 kernels,
    [128, 256] 11.0 us at 1 thread; [128, 768] 133 us at 2 threads); from the moments 3 kernels, 6.3 and
    32 us (AMD EPYC Zen 4). :func:`legalize_mean` and :func:`legalize_variance` build the same expression
    for the same input, which TVM's common-subexpression pass then computes once.
    """
    rows, cols = int(np.prod(shape[:-1])), int(shape[-1])
    flat = relay.reshape(values, (rows, cols))
    (total, squares), width, _ = halving_tree([flat, relay.multiply(flat, flat)], relay.add, rows, cols, _PARTIAL)
    sums = relay.sum(relay.annotation.stop_fusion(relay.stack([total, squares], axis=0)), axis=-1)
    count = relay.const(float(cols), "float32")
    kept = (*shape[:-1], 1)
    return tuple(relay.reshape(relay.divide(relay.take(sums, relay.const(i), axis=0), count), kept)
                 for i in (0, 1))


def _unkept(value: relay.Expr, shape, keepdims: bool) -> relay.Expr:
    return value if keepdims else relay.squeeze(value, [len(shape) - 1])


def legalize_mean(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``mean``: a quantized model's row mean (a layer norm's: TVM's ONNX importer
    writes ``LayerNormalization`` as ``mean`` and ``variance``) over 16-wide partial sums; None for the rest,
    float models' included (:func:`after_quantized_op`).

    TVM 0.19's x86 reduction schedule sums a row in one serial loop (LLVM does not vectorize float sums):
    a [128, 256] mean 20.8 us (AMD EPYC Zen 4, 1 thread). Here it is one of the row moments
    (:func:`_row_moments`) that :func:`legalize_variance` shares: the same sum in another order. The QNN
    legalization is TVM's first pass, before the layer norm is fused.

    Examples
    --------
    >>> q = relay.var("q", shape=(8, 64), dtype="int8")
    >>> x = relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(0))
    >>> call = relay.mean(x, axis=-1, keepdims=True)
    >>> out = legalize_mean(call.attrs, [x], [relay.transform.InferTypeLocal(x)])
    >>> sorted({c.op.name for c in _calls(out)} & {"mean", "sum"}), str(relay.transform.InferTypeLocal(out).shape)
    (['sum'], '[8, 1]')
    """
    shape = _last_axis_rows(attrs, inputs[0], types[0])
    if shape is None or not after_quantized_op(inputs[0]):
        return None
    return _unkept(_row_moments(inputs[0], shape)[0], shape, bool(attrs.keepdims))


def legalize_variance(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``variance``: as :func:`legalize_mean`, for a quantized model's row variance
    about its given mean (``mean((x - m)^2)``, the biased one a layer norm takes), from the same row
    moments as the mean's; None for the rest.

    Examples
    --------
    >>> q = relay.var("q", shape=(8, 64), dtype="int8")
    >>> x = relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(0))
    >>> m = relay.mean(x, axis=-1, keepdims=True)
    >>> call = relay.variance(x, axis=-1, keepdims=True, with_mean=m)
    >>> types = [relay.transform.InferTypeLocal(x), relay.transform.InferTypeLocal(m)]
    >>> out = legalize_variance(call.attrs, [x, m], types)
    >>> sorted({c.op.name for c in _calls(out)} & {"variance", "sum"}), str(relay.transform.InferTypeLocal(out).shape)
    (['sum'], '[8, 1]')
    """
    shape = _last_axis_rows(attrs, inputs[0], types[0])
    if shape is None or bool(getattr(attrs, "unbiased", False)) or not after_quantized_op(inputs[0]):
        return None
    mean_type = types[1] if len(types) > 1 else None
    if mean_type is not None and len(mean_type.shape) != len(shape):  # a mean without its kept axis
        return None
    # mean((x - m)^2) = E[x^2] - m (2 E[x] - m) for any given m; with m = E[x] (a layer norm's) it is
    # E[x^2] - E[x]^2, as onnxruntime's layer norm computes it. Rounding can take it a little below 0.
    mean, squares = _row_moments(inputs[0], shape)
    given = inputs[1]
    doubled = relay.subtract(relay.multiply(mean, relay.const(2.0, "float32")), given)
    variance = relay.maximum(relay.subtract(squares, relay.multiply(given, doubled)), relay.const(0.0, "float32"))
    return _unkept(variance, shape, bool(attrs.keepdims))


#: ``TOpPattern`` of injective ops (TVM's ``kInjective``: reshape, transpose); elementwise and broadcasting
#: ones are below it. A chain passes through them: they move values without changing them.
_INJECTIVE = 2

#: Float ops a chain passes through to reach a softmax behind them: attention's second product
#: (``probabilities x V``) is linear in the softmax, so the softmax's relative error of about 1e-7 stays
#: about that after it, far below the 8-bit step the context is quantized to. A dynamically quantized
#: encoder's softmax feeds a ``DynamicQuantizeLinear`` only through it (bert-tiny, 1 thread: softmax
#: 0.87 of 7.0 ms).
_LINEAR_PASSES = ("nn.batch_matmul",)

#: Most batches a float ``nn.batch_matmul`` of a quantized model is split into (one dense kernel each).
DENSE_BATCHES_MAX = 128


def dense_pack_block(m: int, n: int, k: int) -> Optional[int]:
    """The weight block of the packed layout (``NC{block}n``) that ``nn.dense``'s alter-layout hook gives a
    float32 ``[m, k] x [n, k]`` product on the current target, or None where it packs nothing (no target,
    another schedule chosen).

    Asked of the hook itself (TVM's x86 one: its AutoTVM config, tuned or the fallback's tile), which also
    records the packed workload's config, so a weight packed with this block compiles with the same tile:
    a packed weight whose block differs from the schedule's tile failed LLVM's verifier.

    Examples
    --------
    >>> with tvm.target.Target("llvm -mcpu=skylake-avx512"):
    ...     dense_pack_block(128, 64, 128)
    32
    >>> dense_pack_block(128, 64, 128) is None  # no target
    True
    """
    if tvm.target.Target.current(allow_none=True) is None:
        return None
    alter = tvm.ir.Op.get("nn.dense").get_attr("FTVMAlterOpLayout")
    if alter is None:
        return None
    data, weight = relay.var("data", shape=(m, k)), relay.var("weight", shape=(n, k))
    tensors = [tvm.te.placeholder((m, k), "float32"), tvm.te.placeholder((n, k), "float32")]
    try:
        packed = alter(relay.nn.dense(data, weight).attrs, [data, weight], tensors, relay.TensorType((m, n)))
    except (tvm.TVMError, ValueError, TypeError, AttributeError):  # the hook declines: keep nn.dense
        return None
    if not _op(packed, "nn.contrib_dense_pack"):
        return None
    layout = str(packed.attrs.weight_layout)
    block = layout[2:-1] if layout.startswith("NC") and layout.endswith("n") else ""
    return int(block) if block.isdigit() and n % int(block) == 0 else None


def dense_per_batch(call: relay.Call, block: Optional[int] = None) -> Optional[relay.Expr]:
    """A float32 ``nn.batch_matmul`` as one dense per batch, stacked; None where it does not apply.

    The same products, each summed in float32 (only the order of the additions may differ). TVM 0.19's
    x86 ``batch_matmul`` schedule reduces each output with a 16-wide ``rfactor`` and a horizontal sum:
    21-36 GFLOPS on BERT's attention shapes, where its ``dense`` schedules (a packed, register-tiled
    product) run the same heads at 83-87 GFLOPS, with numpy's OpenBLAS (AMD EPYC Zen 4, 1 thread:
    ``(4, 128, 128, 64)`` 394 -> 98 us). Each batch's operand is a field of one ``split`` of the whole
    operand reshaped to rows (no copy kernel per batch); with ``block`` (:func:`dense_pack_block`) the
    weights are packed for ``nn.contrib_dense_pack`` all at once, in the kernel that splits them, instead
    of one layout transform per batch (bert-tiny's attention, 1 thread: 253 -> 204 us). Applies to
    static shapes of at most :data:`DENSE_BATCHES_MAX` batches, either operand broadcast over the batch
    when its batch is 1.

    Examples
    --------
    >>> x, y = relay.var("x", shape=(2, 3, 4)), relay.var("y", shape=(2, 8, 4))
    >>> out = dense_per_batch(relay.nn.batch_matmul(x, y))
    >>> sorted({c.op.name for c in _calls(out)} & {"nn.dense", "nn.batch_matmul"})
    ['nn.dense']
    >>> [int(d) for d in relay.transform.InferTypeLocal(out).shape]
    [2, 3, 8]
    >>> packed = dense_per_batch(relay.nn.batch_matmul(x, y), block=4)
    >>> [c.attrs.weight_layout for c in _calls(packed) if c.op.name == "nn.contrib_dense_pack"]
    ['NC4n', 'NC4n']
    """
    x, y = call.args
    typed = [_typed(x), _typed(y)]
    if None in typed:  # untyped or dynamic: keep the op
        return None
    (tx, shape_x), (ty, shape_y) = typed
    shapes = [shape_x, shape_y]
    attrs = call.attrs
    out_dtype = str(attrs.out_dtype or "float32")
    if {str(tx.dtype), str(ty.dtype), out_dtype} != {"float32"} or any(len(s) != 3 for s in shapes):
        return None
    batches = max(shapes[0][0], shapes[1][0])
    if batches > DENSE_BATCHES_MAX or any(s[0] not in (1, batches) for s in shapes):
        return None
    transpose_a, transpose_b = bool(attrs.transpose_a), bool(attrs.transpose_b)
    n = shape_y[1] if transpose_b else shape_y[2]
    if block is not None and (block < 1 or n % block):
        raise ValueError(f"block must divide the {n} columns of the product, got {block}")

    def split(value: relay.Expr, count: int, shape) -> list:
        # All batches stacked along the first axis, split: each field is one batch's operand of ``shape``
        # as it is (a reshape of a field would be a copy kernel of its own; of the whole, none).
        value = relay.reshape(value, (count * shape[0], *shape[1:]))
        return [value] if count == 1 else list(relay.split(value, count, axis=0))

    def rows(value: relay.Expr, shape, transposed: bool) -> list:
        # dense(data, weight) multiplies data [M, K] by weight [N, K]: rows of both along K.
        parts = split(value, shape[0], shape[1:])
        return [relay.transpose(part, (1, 0)) for part in parts] if transposed else parts

    def packed(value: relay.Expr, shape) -> list:
        # Weight [N, K] (or [K, N] without transpose_b) as [N / block, K, block] per batch.
        count = shape[0]
        if transpose_b:
            k = shape[2]
            value = relay.transpose(relay.reshape(value, (count, n // block, block, k)), (0, 1, 3, 2))
        else:
            k = shape[1]
            value = relay.transpose(relay.reshape(value, (count, k, n // block, block)), (0, 2, 1, 3))
        return split(value, count, (n // block, k, block))

    data = rows(x, shape_x, transpose_a)
    if block is None:
        weight = rows(y, shape_y, not transpose_b)
        products = [relay.nn.dense(data[i % len(data)], weight[i % len(weight)]) for i in range(batches)]
    else:
        weight = packed(y, shape_y)
        products = [relay.nn.contrib_dense_pack(data[i % len(data)], weight[i % len(weight)], f"NC{block}n",
                                                None, "float32") for i in range(batches)]
    return relay.stack(products, axis=0)


def _dequantized(value: relay.Expr) -> bool:
    """Whether ``value`` is a ``qnn.dequantize``'s output, moved only by shape ops (reshape, transpose):
    a static QDQ region's input, which its ``qnn.quantize``'s legalization makes integer."""
    while isinstance(value, relay.Call) and isinstance(value.op, tvm.ir.Op):
        if value.op.name == "qnn.dequantize":
            return True
        pattern = value.op.get_attr("TOpPattern")
        if pattern is None or int(pattern) != _INJECTIVE or not value.args:
            return False
        value = value.args[0]
    return False


def legalize_batch_matmul(attrs, inputs, types) -> Optional[relay.Expr]:
    """``FTVMQnnLegalize`` of ``nn.batch_matmul``: a quantized model's float32 product of two activations
    (attention's, which onnxruntime's ``quantize_dynamic`` leaves in float) as one kernel parallel over
    the batches (:mod:`tvm_tcutils.float_batch_matmul`) where the x86 target has vectors for it, else as
    :func:`dense_per_batch`, its weights packed for the target's dense schedule (:func:`dense_pack_block`);
    None for the rest: float
    models' (:func:`after_quantized_op`), every 8-bit product, and a static QDQ region's, whose operands
    are dequantized values (its ``qnn.quantize``'s legalization makes it an integer product).

    Examples
    --------
    >>> q = relay.var("q", shape=(2, 128, 64), dtype="int8")
    >>> x = relay.add(relay.qnn.op.dequantize(q, relay.const(0.1), relay.const(0)), relay.const(1.0))
    >>> call = relay.nn.batch_matmul(x, x)
    >>> types = [relay.transform.InferTypeLocal(x)] * 2
    >>> with tvm.target.Target("llvm -mcpu=skylake-avx512"):
    ...     out = legalize_batch_matmul(call.attrs, [x, x], types)
    >>> out.op.name
    'tcutils.float_batch_matmul'
    >>> with tvm.target.Target("llvm -mcpu=x86-64"):  # no vectors for it: one packed dense per batch
    ...     out = legalize_batch_matmul(call.attrs, [x, x], types)
    >>> sorted({c.op.name for c in _calls(out)} & {"nn.batch_matmul", "nn.contrib_dense_pack"})
    ['nn.contrib_dense_pack']
    """
    if any(_dequantized(value) for value in inputs) or not any(after_quantized_op(value) for value in inputs):
        return None
    shapes = [_static_shape(t) for t in types[:2]]
    if any(s is None or len(s) != 3 for s in shapes):
        return None
    float_inputs = all(str(t.dtype) == "float32" for t in types[:2])
    if float_inputs and str(attrs.out_dtype or "float32") == "float32":
        batched = _one_kernel(inputs, shapes, bool(attrs.transpose_a), bool(attrs.transpose_b))
        if batched is not None:
            return batched
    from .float_batch_matmul import product_dims  # imported where used, as in _one_kernel

    m, n, k, _ = product_dims(*shapes, bool(attrs.transpose_a), bool(attrs.transpose_b))
    block = dense_pack_block(m, n, k) if float_inputs else None
    call = relay.nn.batch_matmul(*inputs, out_dtype=attrs.out_dtype, transpose_a=attrs.transpose_a,
                                 transpose_b=attrs.transpose_b)
    return dense_per_batch(call, block)


def _batch_transposed(value: relay.Expr) -> Optional[relay.Expr]:
    """``value``'s operand where ``value`` swaps the last two axes of a 3-d tensor, else None."""
    if _op(value, "transpose") and value.attrs.axes is not None and [int(a) for a in value.attrs.axes] == [0, 2, 1]:
        return value.args[0]
    return None


def _one_kernel(inputs, shapes, transpose_a: bool, transpose_b: bool) -> Optional[relay.Expr]:
    """A float32 product as :mod:`tvm_tcutils.float_batch_matmul`'s op, where the current target builds
    it; a transpose of an operand's last two axes (an ONNX ``Transpose`` before ``MatMul``) taken into
    the op's attributes instead of a kernel of its own. None where the op does not apply."""
    from . import float_batch_matmul

    target = tvm.target.Target.current(allow_none=True)
    x, y = inputs
    shape_x, shape_y = list(shapes[0]), list(shapes[1])
    inner_x, inner_y = _batch_transposed(x), _batch_transposed(y)
    if inner_x is not None:
        x, transpose_a, shape_x = inner_x, not transpose_a, [shape_x[0], shape_x[2], shape_x[1]]
    if inner_y is not None:
        y, transpose_b, shape_y = inner_y, not transpose_b, [shape_y[0], shape_y[2], shape_y[1]]
    if not float_batch_matmul.applies(shape_x, shape_y, transpose_a, transpose_b, target):
        return None
    return float_batch_matmul.make(x, y, transpose_a, transpose_b)


def _calls(expr: relay.Expr) -> list:
    found: list = []
    relay.analysis.post_order_visit(expr, lambda e: found.append(e) if isinstance(e, relay.Call) else None)
    return found


def fast_region(quantize: relay.Call) -> Optional[relay.Call]:
    """``quantize`` with :data:`FAST_FORMS` in the float region it ends, or None when it has none.

    Examples
    --------
    >>> x = relay.var("x", shape=(8,))
    >>> dq = relay.qnn.op.dequantize(relay.qnn.op.quantize(x, relay.const(0.1), relay.const(0)),
    ...                              relay.const(0.1), relay.const(0))
    >>> q = relay.qnn.op.quantize(relay.multiply(dq, relay.erf(dq)), relay.const(0.1), relay.const(0))
    >>> fast_region(q).args[0].args[1].op.name
    'fast_erf'
    >>> fast_region(relay.qnn.op.quantize(dq, relay.const(0.1), relay.const(0))) is None
    True
    """
    mutator = _FastForms()
    data = mutator.visit(quantize.args[0])
    if not mutator.changed:
        return None
    return relay.Call(quantize.op, [data, *quantize.args[1:]], quantize.attrs, quantize.type_args, quantize.span)


def fast_chain(value: relay.Expr) -> relay.Expr:
    """``value``, about to be quantized to 8 bits at run time, with :data:`FAST_FORMS` in the elementwise
    and injective ops (softmax, and attention's ``batch_matmul`` behind which a softmax sits) that compute
    it from the last other ops (the float ``batch_matmul`` among them become :func:`dense_per_batch` when
    the model is built: :func:`legalize_batch_matmul`); ``value`` itself when there are none.

    For onnxruntime's ``DynamicQuantizeLinear`` (:mod:`tvm_tcutils.onnx_quantize_dynamic`): a dynamically
    quantized encoder's GELU and softmax feed one, as a static one's feed a ``qnn.quantize``. Other users of
    the ops keep the exact forms (the fast ones are new nodes).

    Examples
    --------
    >>> x = relay.var("x", shape=(8,))
    >>> h = relay.nn.dense(relay.reshape(x, (1, 8)), relay.var("w", shape=(8, 8)))
    >>> fast_chain(relay.multiply(h, relay.erf(h))).args[1].op.name
    'fast_erf'
    >>> z = relay.nn.dense(relay.erf(x), relay.var("w")); fast_chain(z).same_as(z)  # a dense stops it
    True
    """
    mutator = _FastForms(chain=True)
    if isinstance(value, relay.Call) and mutator._stops(value):
        return value
    new = mutator.visit(value)
    return new if mutator.changed else value


#: 1.5 * 2**23: added to a float32 of magnitude below 2**22, the sum lies where float32's spacing is 1.0,
#: so the addition itself rounds to the nearest integer, ties to even (IEEE's default rounding), and
#: the sum's bits read as an int32, less this constant's bits, are that integer.
_ROUNDING_SHIFT = 12582912.0

#: The shifts :func:`rounded_int32` adds (the second where its offset is a multiple of 256, see there).
ROUNDING_SHIFTS = (_ROUNDING_SHIFT, _ROUNDING_SHIFT + 128.0)


def rounded_int32(value: relay.Expr, offset: int = 0) -> relay.Expr:
    """``round_half_even(value) + offset`` as int32, for float32 ``value`` with |value| < 2**22 - 128.

    Three vector instructions (add, a free bit reinterpretation, an integer add) that TVM fuses into
    the producing kernel; none of them can be folded away (``(v + c) - c`` in float would be, by TVM's
    simplifier).
    """
    # Shifted 128 further where the final add would otherwise be a multiple of 256: LLVM then drops
    # that add when the int32 is cast to 8 bits and folds the cast into the store (a vpmovdb to
    # memory, slower than vpmovdb to a register + vpaddb + a store on Zen 4). Both shifts are even
    # integers in [2**23, 2**24), so the addition still rounds half to even.
    shift = ROUNDING_SHIFTS[1 if offset % 256 == 0 else 0]
    shifted = relay.add(value, relay.const(shift, "float32"))
    return relay.add(relay.reinterpret(shifted, "int32"), relay.const(offset - float_bits(shift), "int32"))


def float_bits(value: float) -> int:
    """A float32's bits read as an int32.

    Examples
    --------
    >>> float_bits(ROUNDING_SHIFTS[0]) == 0x4B400000
    True
    """
    return int(np.array(value, "float32").view("int32"))


def saturated_parts(expr: relay.Expr) -> Optional[Tuple[relay.Expr, int]]:
    """``(clamped, offset)`` of an 8-bit ``cast(rounded_int32(clamped, offset))``, else None.

    ``round_half_even(clamped)`` is then the 8-bit value less ``offset`` (the zero point), as float32,
    without the round trip through 8 bits.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> q = relay.cast(rounded_int32(relay.clip(x, -3.0, 252.0), 3), "uint8")
    >>> clamped, offset = saturated_parts(q)
    >>> clamped.op.name, offset
    ('clip', 3)
    >>> saturated_parts(relay.cast(x, "uint8")) is None
    True
    """
    if not _op(expr, "cast") or str(expr.attrs.dtype) not in ("uint8", "int8") or not _op(expr.args[0], "add"):
        return None
    shifted_bits, offset = expr.args[0].args
    if not _op(shifted_bits, "reinterpret") or not isinstance(offset, relay.Constant):
        return None
    shifted = shifted_bits.args[0]
    if not _op(shifted, "add") or not isinstance(shifted.args[1], relay.Constant):
        return None
    shift = float(shifted.args[1].data.numpy())
    if shift not in ROUNDING_SHIFTS or not _op(shifted.args[0], "clip"):
        return None
    return shifted.args[0], int(offset.data.numpy()) + float_bits(shift)


def round_half_even(value: relay.Expr) -> relay.Expr:
    """Float32 rounding to the nearest integer, ties to even (ONNX ``QuantizeLinear``), for |value| < 2**22 - 128.

    IEEE float32 addition of 1.5 * 2**23 rounds to an integer, ties to even, on every
    target (TVM's ``round`` follows the backend: half away from zero on LLVM).

    Examples
    --------
    >>> v = relay.const(np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, -2.6, 254.5, -255.5], "float32"))
    >>> relay.create_executor().evaluate(round_half_even(v)).numpy().tolist()
    [0.0, 2.0, 2.0, 0.0, -2.0, 2.0, -3.0, 254.0, -256.0]
    """
    return relay.cast(rounded_int32(value), "float32")
