"""One float32 batch of products parallel over its batches: a quantized model's attention on x86.

onnxruntime's ``quantize_dynamic`` leaves attention's two products of activations (scores ``Q K^T`` and
context ``P V``, 12 heads of ``128 x 128 x 64`` in BERT-base) in float. TVM 0.19's x86 ``batch_matmul``
schedule reduces each output with a 16-wide ``rfactor`` and runs them slowly, and one packed ``dense``
per head (:func:`tvm_tcutils.fast_forms.dense_per_batch`) launches the thread pool once per head for a
12 us product: on two threads it ran no faster than on one (BERT-base's 288 head products, Xeon EMR:
4.66 ms at 1 thread, 5.29 at 2). The op here, ``tcutils.float_batch_matmul``, is the same product as
``nn.batch_matmul`` (float32, the same ``transpose_a``/``transpose_b`` attributes, either batch 1 to
broadcast) computed by one kernel whose parallel loop runs over batches x row blocks: the transposed
operand packed ``[batch, N / lanes, K, lanes]`` in the kernel, each row block's outputs in registers
(rows x two vectors) over the whole reduction. Only
:func:`tvm_tcutils.fast_forms.legalize_batch_matmul` emits it, for quantized models' float products on
x86 targets (:func:`applies`); float models never see it.

Examples
--------
>>> x, y = relay.var("x", shape=(12, 128, 64)), relay.var("y", shape=(12, 128, 64))
>>> call = make(x, y, transpose_b=True)
>>> [int(d) for d in relay.transform.InferTypeLocal(call).shape]
[12, 128, 128]
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ._tvm import target_has, tvm
from tvm import relay, te

#: The op's name in TVM's op registry.
OP_NAME = "tcutils.float_batch_matmul"

#: TVM's ``OpPatternKind.kOpaque``: the kernel is fused with nothing (its own loop nest, no epilogue).
_OPAQUE = 8

#: Output rows held in registers per block, tried in order: the first that divides the rows (else
#: the first, with a tail). Six rows x two 16-lane vectors are 12 of AVX-512's 32 registers, the
#: tile TVM's float dense schedules pick too; measured on BERT's heads (Xeon EMR, 1 thread): 6 rows
#: 191 us, 4 rows 198, 8 rows 202, 12 rows 311 (spills).
ROW_BLOCKS: Tuple[int, ...] = (6, 4, 8)

#: Name of the packing stage that transposes ``y`` (kept as a stage; the other is inlined).
_TRANSPOSED = "packed_y_transposed"

#: Vector lanes of float32 per ISA feature, widest first.
LANES: Tuple[Tuple[str, int], ...] = (("avx512f", 16), ("avx2", 8), ("sse4.2", 4))


def lanes(target) -> Optional[int]:
    """The float32 vector lanes the kernel uses on ``target``, None where it does not build (not an x86
    LLVM target).

    Examples
    --------
    >>> lanes(tvm.target.Target("llvm -mcpu=skylake-avx512")), lanes(tvm.target.Target("llvm -mcpu=haswell"))
    (16, 8)
    >>> lanes(None) is None
    True
    """
    if target is None or target.kind.name != "llvm" or "x86" not in str(target.attrs.get("mtriple", "x86")):
        return None
    return next((width for feature, width in LANES if target_has(target, feature)), None)


def product_dims(x_shape: Sequence[int], y_shape: Sequence[int], transpose_a: bool, transpose_b: bool):
    """``(m, n, k, k_y)`` of ``nn.batch_matmul``'s operands of these shapes (``k == k_y`` where they multiply).

    Examples
    --------
    >>> product_dims((12, 128, 64), (12, 128, 64), False, True)
    (128, 128, 64, 64)
    """
    m, k = (x_shape[2], x_shape[1]) if transpose_a else (x_shape[1], x_shape[2])
    n, k_y = (y_shape[1], y_shape[2]) if transpose_b else (y_shape[2], y_shape[1])
    return m, n, k, k_y


def _type_relation(arg_types, attrs):
    """``nn.batch_matmul``'s rule for static float32 shapes; None (not yet known) otherwise."""
    x, y = arg_types[:2]
    if not all(isinstance(t, relay.TensorType) for t in (x, y)):
        return None
    shapes = [[int(d) for d in t.shape] for t in (x, y)]
    if any(len(s) != 3 for s in shapes) or {str(x.dtype), str(y.dtype)} != {"float32"}:
        raise ValueError(f"{OP_NAME} takes two 3-d float32 tensors, got {x} and {y}")
    m, n, k, k_y = product_dims(*shapes, bool(attrs.transpose_a), bool(attrs.transpose_b))
    batches = max(shapes[0][0], shapes[1][0])
    if k != k_y or any(s[0] not in (1, batches) for s in shapes):
        raise ValueError(f"{OP_NAME}: operands {x} and {y} do not multiply")
    return relay.TensorType((batches, m, n), "float32")


def make(x: relay.Expr, y: relay.Expr, transpose_a: bool = False, transpose_b: bool = True) -> relay.Call:
    """A ``tcutils.float_batch_matmul`` call: ``nn.batch_matmul(x, y, "float32", transpose_a, transpose_b)``
    by this module's kernel (the op must be registered: ``import tvm_tcutils`` does it).

    Examples
    --------
    >>> call = make(relay.var("x", shape=(2, 3, 4)), relay.var("y", shape=(2, 4, 5)), transpose_b=False)
    >>> call.op.name, bool(call.attrs.transpose_b)
    ('tcutils.float_batch_matmul', False)
    """
    attrs = tvm.ir.make_node("relay.attrs.BatchMatmulAttrs", out_dtype="float32",
                             transpose_a=transpose_a, transpose_b=transpose_b)
    return relay.Call(tvm.ir.Op.get(OP_NAME), [x, y], attrs)


def _row_block(m: int) -> int:
    return next((rows for rows in ROW_BLOCKS if m % rows == 0), ROW_BLOCKS[0])


def compute(x: te.Tensor, y: te.Tensor, transpose_a: bool, transpose_b: bool, width: int) -> te.Tensor:
    """The product, ``y`` packed ``[batch, N / width, K, width]`` first (a stage the schedule keeps where
    ``transpose_b`` makes it a transpose, inlines where ``y``'s rows are already its columns).

    Examples
    --------
    >>> x, y = te.placeholder((2, 6, 8), name="x"), te.placeholder((2, 32, 8), name="y")
    >>> [int(d) for d in compute(x, y, False, True, 16).shape]
    [2, 6, 32]
    """
    xs, ys = [[int(d) for d in t.shape] for t in (x, y)]
    m, n, k, _ = product_dims(xs, ys, transpose_a, transpose_b)
    batches = max(xs[0], ys[0])

    def pick(shape, b):
        return b if shape[0] == batches else 0

    if transpose_b:
        packed = te.compute((ys[0], n // width, k, width), lambda b, o, r, i: y[b, o * width + i, r],
                            name=_TRANSPOSED)
    else:
        packed = te.compute((ys[0], n // width, k, width), lambda b, o, r, i: y[b, r, o * width + i],
                            name="packed_y")
    r = te.reduce_axis((0, k), name="r")

    def element(b, i, j):
        left = x[pick(xs, b), r, i] if transpose_a else x[pick(xs, b), i, r]
        return te.sum(left * packed[pick(ys, b), j // width, r, j % width], axis=r)

    return te.compute((batches, m, n), element, name="float_batch_matmul", tag="tcutils_float_batch_matmul")


def schedule(out: te.Tensor, width: int) -> te.Schedule:
    """Batches x row blocks in parallel; each block's rows x (two vectors) of outputs in registers over
    the reduction, then stored.

    Examples
    --------
    >>> x, y = te.placeholder((2, 6, 8), name="x"), te.placeholder((2, 32, 8), name="y")
    >>> f = tvm.build(schedule(compute(x, y, False, True, 16), 16), [x, y], "llvm")
    """
    s = te.create_schedule(out.op)
    packed = out.op.input_tensors[1]
    batches, m, n = [int(d) for d in out.shape]
    acc = s.cache_write(out, "global")
    b, i, j = s[out].op.axis
    rows = _row_block(m)
    cols = 2 * width if n % (2 * width) == 0 else width
    io, ii = s[out].split(i, rows)
    jo, ji = s[out].split(j, cols)
    jv, jl = s[out].split(ji, width)
    s[out].reorder(b, io, jo, ii, jv, jl)
    s[out].parallel(s[out].fuse(b, io))
    s[out].vectorize(jl)
    s[acc].compute_at(s[out], jo)
    _, ai, aj = s[acc].op.axis
    (ar,) = s[acc].op.reduce_axis
    av, al = s[acc].split(aj, width)
    s[acc].reorder(ar, ai, av, al)
    s[acc].unroll(ai)
    s[acc].unroll(av)
    s[acc].vectorize(al)
    if packed.op.name != _TRANSPOSED:
        s[packed].compute_inline()  # [K, N] rows: the packed view reads them as they are
    else:
        pb, po, _, pi = s[packed].op.axis
        s[packed].parallel(s[packed].fuse(pb, po))
        s[packed].vectorize(pi)
    return s


def _fcompute(attrs, inputs, out_type) -> List[te.Tensor]:
    width = lanes(tvm.target.Target.current(allow_none=True)) or 16
    return [compute(inputs[0], inputs[1], bool(attrs.transpose_a), bool(attrs.transpose_b), width)]


def _fschedule(attrs, outs, target):
    width = lanes(target) or 16
    with target:
        return schedule(outs[0], width)


def applies(shape_x: Sequence[int], shape_y: Sequence[int], transpose_a: bool, transpose_b: bool,
            target) -> bool:
    """Whether the op builds for these static shapes on ``target``: an x86 LLVM target
    (:func:`lanes`) and columns that fill whole vectors.

    Examples
    --------
    >>> t = tvm.target.Target("llvm -mcpu=skylake-avx512")
    >>> applies((12, 128, 64), (12, 128, 64), False, True, t), applies((1, 5, 3), (1, 7, 3), False, True, t)
    (True, False)
    """
    width = lanes(target)
    if width is None or len(shape_x) != 3 or len(shape_y) != 3:
        return False
    _, n, k, k_y = product_dims(shape_x, shape_y, transpose_a, transpose_b)
    return n % width == 0 and k == k_y


def op_declaration():
    """What :mod:`tvm_tcutils.registry` installs for the op: its name, inputs, type relation, attributes'
    type and pattern (a ``registry.relay_op`` hook's payload)."""
    return dict(name=OP_NAME, inputs=("x", "y"), type_relation=_type_relation,
                attrs_type_key="relay.attrs.BatchMatmulAttrs", pattern=_OPAQUE)


def strategy_impls():
    """The op's one implementation (a ``registry.strategy`` table)."""
    from . import registry

    return [registry.StrategyImpl("tcutils.float_batch_matmul.x86", _fcompute, _fschedule,
                                  lambda attrs, inputs, out_type, target: lanes(target) is not None, plevel=10)]
