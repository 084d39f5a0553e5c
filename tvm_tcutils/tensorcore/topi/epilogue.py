"""What Relay fuses after a tensor-core GEMM, applied inside the GEMM's kernel as it stores its sums.

The package's GEMM kernels (:mod:`.mma_gemm`, :mod:`.mma_conv2d`, :mod:`.wgmma_gemm`)
are TE extern ops: their code is written before Relay's fused function is
lowered, and TE cannot inline the element-wise ops that follow an extern op into
it. Left alone, a quantized layer is two kernels: the GEMM writes its int32 sums
to global memory and a second kernel reads them back for the bias, requantize,
clip and cast (five bytes moved per output byte, and a launch).

Here the element-wise op is folded into the extern op instead: every store of
the GEMM's kernel, ``out[e] = sum``, becomes ``out'[e] = f(sum, coordinates of
e)``, where ``f`` is the op's TE body with its other inputs (a bias, scales, a
residual) read from buffers the new extern op takes as inputs. Each op of the
chain is folded the same way into the extern op the previous one made, so the
layer is one kernel that writes its 8-bit result once. The GEMM's own code
(tiling, pipeline, instructions) is not touched.

An op is folded only when it is element-wise on the GEMM's output: one output
of the same shape, no reduction, the GEMM's value read at the op's own
coordinates only. TE computations among its other inputs are inlined (they are
Relay's injective ops in the same fused function); anything else is left as it
was.

Examples
--------
>>> from tvm.script import tir as T
>>> @T.prim_func
... def gemm(a: T.Buffer((2, 4), "int8"), b: T.Buffer((3, 4), "int8"), c: T.Buffer((2, 3), "int32")):
...     for i, j in T.grid(2, 3):
...         c[i, j] = T.Cast("int32", a[i, 0]) * T.Cast("int32", b[j, 0])
>>> from tvm_tcutils.tensorcore.topi import mma_gemm
>>> x, w = te.placeholder((2, 4), "int8"), te.placeholder((3, 4), "int8")
>>> sums = mma_gemm.extern_op(gemm, x, w, "demo")
>>> bias = te.placeholder((3,), "int32", name="bias")
>>> out = te.compute(sums.shape, lambda i, j: (sums[i, j] + bias[j]).astype("int8"), name="requantize")
>>> fused = fold(out)
>>> fused.op.tag, fused.dtype, [t.name for t in fused.op.input_tensors][2:]
('tcutils_demo', 'int8', ['bias'])
"""
from __future__ import annotations

import math
from typing import Callable, List, Optional, Sequence

from ..._tvm import tvm
from tvm import te, tir

#: Tag prefix of the package's GEMM extern ops (:func:`.mma_gemm.extern_op`): those an op may be folded into.
TAG_PREFIX = "tcutils_"

#: How deep TE computations among an op's inputs are inlined (a chain of Relay's injective ops).
MAX_INLINE_DEPTH = 32


def foldable(tensor: te.Tensor) -> bool:
    """Whether ``tensor`` is the output of one of the package's GEMM extern ops.

    Examples
    --------
    >>> foldable(te.placeholder((2, 2), "int32"))
    False
    """
    op = tensor.op
    return isinstance(op, te.ExternOp) and str(op.tag).startswith(TAG_PREFIX) and op.num_outputs == 1


def flat_index(store: tir.BufferStore) -> tir.PrimExpr:
    """The element a scalar store writes, as an offset from its buffer's start (row-major, or the buffer's
    strides).

    Raises
    ------
    ValueError
        For a vector store (the kernels store scalars; a vector's lanes would need one coordinate each).
    """
    buf, indices = store.buffer, list(store.indices)
    if any(tvm.DataType(i.dtype).lanes != 1 for i in [*indices, store.value]):
        raise ValueError(f"a vector store into {buf.name} cannot take an epilogue: {store}")
    if buf.strides:
        offset = sum((i * s for i, s in zip(indices, buf.strides)), tir.const(0, indices[0].dtype))
    else:
        offset = indices[0]
        for index, extent in zip(indices[1:], list(buf.shape)[1:]):
            offset = offset * extent + index
    elem_offset = buf.elem_offset
    if not (isinstance(elem_offset, tir.IntImm) and elem_offset.value == 0):
        offset = offset + elem_offset
    return offset


def coordinates(offset: tir.PrimExpr, shape: Sequence[int]) -> List[tir.PrimExpr]:
    """The row-major coordinates of element ``offset`` of a tensor of ``shape``.

    Examples
    --------
    >>> e = tir.Var("e", "int32")
    >>> [str(c) for c in coordinates(e, (2, 3, 4))]
    ['e // 12', 'e % 12 // 4', 'e % 4']
    """
    shape = [int(s) for s in shape]
    coords = []
    for k, extent in enumerate(shape):
        inner = math.prod(shape[k + 1:])
        index = tir.floordiv(offset, inner) if inner > 1 else offset
        coords.append(tir.floormod(index, extent) if k > 0 else index)
    analyzer = tvm.arith.Analyzer()
    return [analyzer.simplify(c) for c in coords]


def rewrite_stores(body: tir.Stmt, data: tir.Var, rewrite: Callable[[tir.BufferStore], tir.Stmt]) -> tir.Stmt:
    """``body`` with every store into the buffer(s) over ``data`` replaced by ``rewrite(store)``.

    Raises
    ------
    ValueError
        Where ``body`` still uses ``data`` otherwise (a kernel reading its own output back).
    """
    def post(node):
        if isinstance(node, tir.BufferStore) and node.buffer.data.same_as(data):
            return rewrite(node)
        return None

    new = tir.stmt_functor.ir_transform(body, None, post, ["tir.BufferStore"])
    left: List[object] = []

    def visit(node):
        if (isinstance(node, tir.Var) and node.same_as(data)
                or isinstance(node, (tir.BufferLoad, tir.BufferStore)) and node.buffer.data.same_as(data)):
            left.append(node)

    tir.stmt_functor.post_order_visit(new, visit)
    if left:
        raise ValueError(f"the kernel uses its output {data.name} other than by storing into it")
    return new


def flat_view(buf: tir.Buffer) -> tir.Buffer:
    """``buf``'s elements as one dimension, over the same data."""
    return tir.decl_buffer((math.prod(int(s) for s in buf.shape),), buf.dtype, f"{buf.name}_flat", data=buf.data)


def output_buffers(shape: Sequence, dtype: str, name: str):
    """A fresh output buffer of ``shape`` (the extern op's) and its flat view over the same data."""
    out = tir.decl_buffer(shape, dtype, name)
    return out, flat_view(out)


def narrowed(body: tir.Stmt, data: tir.Var, shape: Sequence, dtype: str, name: str):
    """``body`` storing only the first ``prod(shape)`` elements of the output over ``data``, into a new
    buffer of ``shape``: for a GEMM computed past the last row it owns (whole block tiles). Returns the
    body and the new output buffer."""
    out, flat = output_buffers(shape, dtype, name)
    limit = math.prod(int(s) for s in shape)

    def rewrite(store: tir.BufferStore) -> tir.Stmt:
        offset = flat_index(store)
        return tir.IfThenElse(offset < limit, tir.BufferStore(flat, store.value, [offset]), None)

    return rewrite_stores(body, data, rewrite), out


def _loads(expr: tir.PrimExpr, replace: Callable[[tir.ProducerLoad], Optional[tir.PrimExpr]]) -> tir.PrimExpr:
    stmt = tir.stmt_functor.ir_transform(tir.Evaluate(expr), None, replace, ["tir.ProducerLoad"])
    return stmt.value


def _inlined(expr: tir.PrimExpr, depth: int = 0) -> tir.PrimExpr:
    """``expr`` with the element-wise TE computations it reads (other than the GEMMs) substituted in."""
    if depth > MAX_INLINE_DEPTH:
        raise ValueError(f"more than {MAX_INLINE_DEPTH} computations deep")

    def replace(load: tir.ProducerLoad):
        tensor = load.producer
        op = tensor.op
        if not isinstance(op, te.ComputeOp) or op.reduce_axis:
            return None
        value = op.body[tensor.value_index]
        if isinstance(value, tir.Reduce):
            return None
        value = tir.stmt_functor.substitute(value, {iv.var: index for iv, index in zip(op.axis, load.indices)})
        return _inlined(value, depth + 1)

    return _loads(expr, replace)


def _producers(expr: tir.PrimExpr) -> List[tir.ProducerLoad]:
    found: List[tir.ProducerLoad] = []
    tir.stmt_functor.post_order_visit(tir.Evaluate(expr),
                                      lambda node: found.append(node) if isinstance(node, tir.ProducerLoad) else None)
    return found


def why_not(out: te.Tensor) -> Optional[str]:
    """Why the op computing ``out`` cannot be folded into a GEMM it reads (None when it can).

    Examples
    --------
    >>> x = te.placeholder((4,), "int32")
    >>> why_not(te.compute((4,), lambda i: x[i] + 1))
    'it reads no GEMM of the package'
    """
    return _plan(out)[1]


def _at_own_coordinates(load: tir.ProducerLoad, axis: Sequence[tir.Var]) -> bool:
    return len(load.indices) == len(axis) and all(i.same_as(v) for i, v in zip(load.indices, axis))


def _plan(out: te.Tensor):
    op = out.op
    if not isinstance(op, te.ComputeOp):
        return None, "it is not a computation"
    if op.num_outputs != 1 or op.reduce_axis or isinstance(op.body[0], tir.Reduce):
        return None, "it is not element-wise (a reduction or several outputs)"
    try:
        body = _inlined(op.body[0])
    except ValueError as err:
        return None, str(err)
    loads = _producers(body)
    gemms = {load.producer.op for load in loads if foldable(load.producer)}
    if not gemms:
        return None, "it reads no GEMM of the package"
    if len(gemms) > 1:
        return None, "it reads two GEMMs"
    (gemm_op,) = gemms
    gemm = gemm_op.output(0)
    if not all(isinstance(s, tir.IntImm) for s in out.shape):
        return None, f"its shape {list(out.shape)} is not static"
    if [int(s) for s in gemm.shape] != [int(s) for s in out.shape]:
        return None, f"its shape {[int(s) for s in out.shape]} is not the GEMM's {[int(s) for s in gemm.shape]}"
    axis = [iv.var for iv in op.axis]
    for load in loads:
        if load.producer.op.same_as(gemm_op) and not _at_own_coordinates(load, axis):
            return None, "it reads the GEMM's output at other coordinates than its own"
    return (body, gemm, loads), None


def fold(out: te.Tensor) -> Optional[te.Tensor]:
    """``out``'s element-wise op folded into the package's GEMM extern op it reads: a new extern op of
    ``out``'s shape and type, or None where :func:`why_not` says why not.

    The new op takes the GEMM's inputs and then each other tensor the op reads (TE computations among
    them inlined); its kernel is the GEMM's with each store of a sum ``s`` at offset ``e`` made a store of
    the op's value at the coordinates of ``e``.

    Raises
    ------
    ValueError
        Where the GEMM's kernel reads its own output back (sums accumulated in memory, not in registers):
        its stores alone cannot carry the op, and the layer stays two kernels.
    """
    plan, _ = _plan(out)
    if plan is None:
        return None
    body, gemm, loads = plan
    old = gemm.op
    inputs = list(old.input_tensors)
    buffers = list(old.input_placeholders)

    def buffer_of(tensor: te.Tensor) -> Optional[tir.Buffer]:
        # Not a dict: TE refuses to compare two scalar tensors (a Relay constant such as a shift).
        for known, buf in zip(inputs, buffers):
            if known.op.same_as(tensor.op) and known.value_index == tensor.value_index:
                return buf
        return None

    for load in loads:
        tensor = load.producer
        if tensor.op.same_as(old) or buffer_of(tensor) is not None:
            continue
        inputs.append(tensor)
        buffers.append(tir.decl_buffer(tensor.shape, tensor.dtype, tensor.op.name))

    shape = [int(s) for s in out.shape]
    views: List[tir.Buffer] = []

    def view_of(buf: tir.Buffer) -> tir.Buffer:  # one flat view a buffer, shared by every store
        for view in views:
            if view.data.same_as(buf.data):
                return view
        views.append(flat_view(buf))
        return views[-1]

    old_out = old.output_placeholders[0]
    new_out, flat = output_buffers(out.shape, out.dtype, f"{old.name}_out")
    axis = [iv.var for iv in out.op.axis]

    # The sum is bound to a variable only where the op reads it more than once (a let of a float value
    # also trips LLVM's debug information on CPU targets).
    reads = sum(1 for load in loads if load.producer.op.same_as(old))

    def rewrite(store: tir.BufferStore) -> tir.Stmt:
        offset = flat_index(store)
        value = tir.Var("sum", store.value.dtype) if reads > 1 else store.value

        def replace(load: tir.ProducerLoad):
            if load.producer.op.same_as(old):
                return value
            buf = buffer_of(load.producer)
            if _at_own_coordinates(load, axis) and [int(s) for s in buf.shape] == shape:
                # Read at the output's own element (a residual): the store's offset, not the offset
                # rebuilt from its coordinates, which the simplifier does not fold back (registers).
                return tir.BufferLoad(view_of(buf), [offset])
            return tir.BufferLoad(buf, list(load.indices))

        expr = tir.stmt_functor.substitute(_loads(body, replace), dict(zip(axis, coordinates(offset, out.shape))))
        stored = tir.BufferStore(flat, expr, [offset])
        return tir.LetStmt(value, store.value, stored) if reads > 1 else stored

    # A kernel that reads its output back (accumulating in memory) raises here: the caller reports it.
    new_body = rewrite_stores(old.body, old_out.data, rewrite)
    return te.extern([out.shape], inputs, lambda ins, outs: new_body, in_buffers=buffers, out_buffers=[new_out],
                     name=old.name, tag=old.tag, dtype=out.dtype,
                     # AutoTVM finds its task's schedule through the workload in the anchor's attributes.
                     attrs={str(key): value for key, value in old.attrs.items()})
