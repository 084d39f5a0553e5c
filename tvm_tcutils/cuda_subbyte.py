"""int4/uint4 tensors in CUDA kernels: element-wise reads and writes that TVM's code generator gets wrong.

TVM 0.19's CUDA code generator keeps 4-bit integers packed eight to a 32-bit
word and handles them right only as whole words (the tensor-core kernels'
``int4x8``/``int4x16`` copies). An element-wise access -- the ``cast`` kernel
that makes an int4 tensor, an epilogue that stores int4, a layout transform
or a pad of int4 data -- is printed as the whole word at ``index / 8``: a read
returns eight nibbles, a write replaces eight of them with one unshifted value,
and the threads that share the word race. Such kernels compile and run, with
wrong results on every GPU (the int4 failure first seen on an H200).

:func:`lower_subbyte_access` rewrites the device functions of a module
before TVM's CUDA code generator prints them: each scalar 4-bit read becomes
a call that extracts and extends its nibble, each scalar write one that
updates its nibble only (with two atomic operations in global and shared
memory, where neighbouring nibbles belong to other threads), and the 4-bit
arithmetic between them is done in 32-bit integers, wrapped to 4 bits where
int4 arithmetic would wrap. Whole-word vector accesses are left as they are.
:func:`add_helpers` puts the device functions those calls name in front of
the generated source. The package installs both around TVM's
``target.build.cuda`` and ``tvm_callback_cuda_postproc``
(:mod:`tvm_tcutils.tensorcore.hooks`).

The same holds for TVM's CPU code generator, which ``FoldConstant`` runs:
a weight cast to int4 and folded there comes out with every 16-value chunk
after the first at the wrong place (LLVM addresses an ``i4`` pointer in
bytes). :func:`fold_subbyte_cast` folds such casts in NumPy instead; the
tensor-core legalization applies it to the layers it handles.

Examples
--------
>>> from tvm.script import tir as T
>>> @T.prim_func
... def cast(a: T.Buffer((64,), "int8"), b: T.Buffer((64,), "int4")):
...     for i in range(64):
...         b[i] = T.Cast("int4", a[i])
>>> fixed = lower_subbyte_access(tvm.IRModule({"cast": cast}))
>>> "tcutils_store4_atomic" in fixed["cast"].script()
True
>>> scalar_subbyte_accesses(fixed["cast"])
[]
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from ._tvm import constant_expression, tvm
from .cuda import prepend_helpers
from tvm import relay, tir
from tvm.tir import stmt_functor

#: The device functions the rewritten kernels call, put in front of the source by :func:`add_helpers`.
HELPERS = r"""
// tvm-tcutils: element-wise access to 4-bit integers packed eight to a 32-bit word (element i in bits 4*(i%8)).
__device__ __forceinline__ int tcutils_wrap_s4(int v) { return (int)((unsigned)v << 28) >> 28; }
__device__ __forceinline__ int tcutils_wrap_u4(int v) { return v & 15; }
__device__ __forceinline__ int tcutils_load_s4(const void* base, long long i) {
  return tcutils_wrap_s4((int)(((const unsigned*)base)[i >> 3] >> (4 * (int)(i & 7))));
}
__device__ __forceinline__ int tcutils_load_u4(const void* base, long long i) {
  return (int)(((const unsigned*)base)[i >> 3] >> (4 * (int)(i & 7))) & 15;
}
// Other threads may own the other nibbles of the word: clear and set this one with atomics.
__device__ __forceinline__ void tcutils_store4_atomic(void* base, long long i, int v) {
  unsigned* word = (unsigned*)base + (i >> 3);
  const int shift = 4 * (int)(i & 7);
  atomicAnd(word, ~(15u << shift));
  atomicOr(word, ((unsigned)v & 15u) << shift);
}
// Thread-local buffers belong to one thread.
__device__ __forceinline__ void tcutils_store4(void* base, long long i, int v) {
  unsigned* word = (unsigned*)base + (i >> 3);
  const int shift = 4 * (int)(i & 7);
  *word = (*word & ~(15u << shift)) | (((unsigned)v & 15u) << shift);
}
"""

#: Calls whose 4-bit arguments are addresses or types, not values (the WMMA loads' and stores' pointers).
_OPAQUE = ("tir.address_of", "tir.type_annotation", "tir.tvm_access_ptr")
_CMP = (tir.EQ, tir.NE, tir.LT, tir.LE, tir.GT, tir.GE)
_WRAPPING = {tir.Add: lambda a, b: a + b, tir.Sub: lambda a, b: a - b, tir.Mul: lambda a, b: a * b}


def is_subbyte(dtype) -> bool:
    """Whether ``dtype`` is int4 or uint4 (any number of lanes).

    Examples
    --------
    >>> is_subbyte("int4"), is_subbyte("uint4x8"), is_subbyte("int8")
    (True, True, False)
    """
    dtype = tvm.DataType(str(dtype))
    return dtype.bits == 4 and dtype.type_code in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT)


def _scalar_subbyte(dtype) -> bool:
    return is_subbyte(dtype) and tvm.DataType(str(dtype)).lanes == 1


def _signed(dtype) -> bool:
    return tvm.DataType(str(dtype)).type_code == tvm.DataTypeCode.INT


def _wrap(value: tir.PrimExpr, dtype) -> tir.PrimExpr:
    return tir.call_extern("int32", "tcutils_wrap_s4" if _signed(dtype) else "tcutils_wrap_u4", value)


def _opaque(node) -> bool:
    return isinstance(node, tir.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name in _OPAQUE


def _index(indices) -> tir.PrimExpr:
    if len(indices) != 1:
        raise ValueError(f"4-bit buffer access with {len(indices)} indices: the module is not flattened")
    return indices[0]


class _Rewriter:
    """Rewrites one device function; ``where`` names it in errors."""

    def __init__(self, where: str):
        self.where = where

    def stmt(self, stmt: tir.Stmt) -> tir.Stmt:
        return stmt_functor.ir_transform(stmt, self._pre, None)

    def expr(self, expr: tir.PrimExpr) -> tir.PrimExpr:
        return self.stmt(tir.Evaluate(expr)).value

    def _pre(self, node):
        if _opaque(node) or isinstance(node, tir.Broadcast) and isinstance(node.value, tir.IntImm):
            return node  # an address, or a whole-word constant (the kernels' zero fills): TVM prints those right
        if isinstance(node, tir.BufferStore) and _scalar_subbyte(node.value.dtype):
            buffer = node.buffer
            helper = "tcutils_store4" if buffer.scope() == "local" else "tcutils_store4_atomic"
            return tir.Evaluate(tir.call_extern(
                "int32", helper, buffer.data, self.expr(_index(node.indices)), self.widen(node.value)))
        if isinstance(node, tir.Cast) and _scalar_subbyte(node.value.dtype) and not is_subbyte(node.dtype):
            return tir.Cast(node.dtype, self.widen(node.value))
        if isinstance(node, _CMP) and _scalar_subbyte(node.a.dtype):
            return type(node)(self.widen(node.a), self.widen(node.b))
        if isinstance(node, tir.PrimExpr) and _scalar_subbyte(node.dtype):
            raise ValueError(f"{self.where}: a 4-bit value used where the package cannot widen it: {node}")
        return None

    def widen(self, expr: tir.PrimExpr) -> tir.PrimExpr:
        """``expr`` (scalar int4/uint4) as an int32 holding its value, sign- or zero-extended."""
        dtype = expr.dtype
        if isinstance(expr, tir.BufferLoad):
            helper = "tcutils_load_s4" if _signed(dtype) else "tcutils_load_u4"
            return tir.call_extern("int32", helper, expr.buffer.data, self.expr(_index(expr.indices)))
        if isinstance(expr, tir.IntImm):
            value = int(expr.value) & 15
            return tir.IntImm("int32", value - 16 if _signed(dtype) and value >= 8 else value)
        if isinstance(expr, tir.Cast):
            inner = expr.value
            value = self.widen(inner) if _scalar_subbyte(inner.dtype) else self.expr(inner)
            if value.dtype != "int32":
                value = tir.Cast("int32", value)
            return _wrap(value, dtype)
        if isinstance(expr, tir.Select):
            return tir.Select(self.expr(expr.condition), self.widen(expr.true_value), self.widen(expr.false_value))
        if isinstance(expr, tir.Call) and expr.op.same_as(tvm.ir.Op.get("tir.if_then_else")):
            return tir.if_then_else(self.expr(expr.args[0]), self.widen(expr.args[1]), self.widen(expr.args[2]))
        if isinstance(expr, (tir.Max, tir.Min)):
            return type(expr)(self.widen(expr.a), self.widen(expr.b))
        for node_type, combine in _WRAPPING.items():
            if isinstance(expr, node_type):
                return _wrap(combine(self.widen(expr.a), self.widen(expr.b)), dtype)
        raise ValueError(f"{self.where}: 4-bit expression the package cannot widen: {type(expr).__name__} {expr}")


def scalar_subbyte_accesses(func: tir.PrimFunc) -> List[str]:
    """The element-wise (scalar) int4/uint4 loads and stores left in ``func``, as text.

    Examples
    --------
    >>> from tvm.script import tir as T
    >>> @T.prim_func
    ... def copy(a: T.Buffer((16,), "int4"), b: T.Buffer((16,), "int4")):
    ...     for i in range(16):
    ...         b[i] = a[i]
    >>> len(scalar_subbyte_accesses(copy))
    2
    """
    found: List[str] = []

    def visit(node):
        if _opaque(node):
            return node  # not an access: do not look inside
        if isinstance(node, tir.BufferStore) and _scalar_subbyte(node.value.dtype):
            found.append(f"store {node.buffer.name}[{_index(node.indices)}]")
        elif isinstance(node, tir.BufferLoad) and _scalar_subbyte(node.dtype):
            found.append(f"load {node.buffer.name}[{_index(node.indices)}]")
        return None

    stmt_functor.ir_transform(func.body, visit, None)
    return found


def lower_subbyte_access(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every scalar int4/uint4 load and store of its functions done on the nibble.

    Functions without such accesses are returned as they are (the same
    objects); ``mod`` itself is not changed.

    Raises
    ------
    ValueError
        When a function computes with 4-bit values in a form the rewrite does
        not know (it would otherwise be compiled to wrong code).
    """
    changed = {}
    for global_var, func in mod.functions.items():
        if not isinstance(func, tir.PrimFunc) or not scalar_subbyte_accesses(func):
            continue
        rewriter = _Rewriter(f"kernel {global_var.name_hint}")
        changed[global_var] = func.with_body(rewriter.stmt(func.body))
    if not changed:
        return mod
    functions = {gv: changed.get(gv, func) for gv, func in mod.functions.items()}
    return tvm.IRModule(functions, attrs=mod.attrs)


def add_helpers(code: str) -> str:
    """``code`` with :data:`HELPERS` in front when it calls them (once).

    Examples
    --------
    >>> "tcutils_wrap_s4(int v)" in add_helpers("x = tcutils_load_s4(p, 3);")
    True
    >>> add_helpers("x = 1;")
    'x = 1;'
    """
    return prepend_helpers(code, HELPERS, ("tcutils_wrap_", "tcutils_load_", "tcutils_store4"))


def subbyte_array(values: np.ndarray, dtype: str) -> "tvm.nd.NDArray":
    """Integer ``values`` as a ``dtype`` (int4/uint4) NDArray, packed as TVM's kernels read it.

    Element ``i`` goes to bits ``4 * (i % 2)`` of byte ``i // 2`` (so ``4 * (i % 8)`` of word
    ``i // 8``); each value is truncated to its low four bits, as a cast to ``dtype`` does.

    Examples
    --------
    >>> arr = subbyte_array(np.array([1, -2, 7, -8]), "int4")
    >>> arr.dtype, arr.shape, arr._create_view((2,), "uint8").numpy().tolist()
    ('int4', (4,), [225, 135])
    """
    if not is_subbyte(dtype) or tvm.DataType(dtype).lanes != 1:
        raise ValueError(f"dtype {dtype!r} is not a 4-bit integer type; valid: int4, uint4")
    values = np.asarray(values)
    nibbles = (values.astype(np.int64) & 15).reshape(-1)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, 0)
    packed = (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8)
    array = tvm.nd.empty(values.shape, dtype)
    array._create_view((packed.size,), "uint8").copyfrom(packed)
    return array


def subbyte_values(array: "tvm.nd.NDArray") -> np.ndarray:
    """The values of an int4/uint4 NDArray as int64 (``NDArray.numpy()`` neither unpacks nor sign-extends them).

    Examples
    --------
    >>> subbyte_values(subbyte_array(np.array([[1, -2], [7, -8]]), "int4")).tolist()
    [[1, -2], [7, -8]]
    >>> subbyte_values(subbyte_array(np.array([15, 3, 8]), "uint4")).tolist()
    [15, 3, 8]
    """
    dtype = str(array.dtype)
    if not is_subbyte(dtype):
        raise ValueError(f"array of dtype {dtype!r} is not 4-bit; valid: int4, uint4")
    shape = tuple(int(v) for v in array.shape)
    count = int(np.prod(shape))
    raw = array.copyto(tvm.cpu())._create_view(((count + 1) // 2,), "uint8").numpy()
    values = np.stack([raw & 15, raw >> 4], axis=1).reshape(-1)[:count].astype(np.int64)
    if _signed(dtype):
        values = np.where(values >= 8, values - 16, values)
    return values.reshape(shape)


#: Nodes :func:`fold_subbyte_cast` looks at before it takes an expression for a non-constant one: a weight's
#: constant expression is a short chain (layout transforms, casts) over a constant, and the legalization
#: calling it runs once per layer, where walking each layer's whole input graph would be quadratic.
CONSTANT_EXPRESSION_BUDGET = 64


def fold_subbyte_cast(expr: relay.Expr) -> Optional[relay.Constant]:
    """``cast(<constant expression>, int4/uint4)`` folded correctly, or ``None`` for any other ``expr``.

    Float values are truncated toward zero, then wrapped to four bits, as the
    cast does on the GPU.

    Examples
    --------
    >>> folded = fold_subbyte_cast(relay.cast(relay.const(np.arange(-8, 24, dtype="int8")), "int4"))
    >>> folded.data._create_view((16,), "uint8").numpy()[8:].tolist()  # 8, 9, ... wrapped to -8, -7, ...
    [152, 186, 220, 254, 16, 50, 84, 118]
    >>> fold_subbyte_cast(relay.cast(relay.var("x", shape=(4,), dtype="int8"), "int4")) is None
    True
    """
    if not (isinstance(expr, relay.Call) and getattr(expr.op, "name", "") == "cast"
            and _scalar_subbyte(expr.attrs.dtype)):
        return None
    inner = expr.args[0]
    if not constant_expression(inner, CONSTANT_EXPRESSION_BUDGET):
        return None
    if not isinstance(inner, relay.Constant):
        inner = relay.transform.FoldConstantExpr(inner, tvm.IRModule())
        if not isinstance(inner, relay.Constant):
            return None
    if is_subbyte(inner.data.dtype):
        return None  # a cast of a 4-bit constant: what is in it is already TVM's
    values = inner.data.numpy()
    if values.dtype.kind == "f":
        values = np.trunc(values)
    return relay.const(subbyte_array(values.astype(np.int64), str(expr.attrs.dtype)))


def fold_subbyte_inputs(inputs) -> List[relay.Expr]:
    """``inputs`` with each :func:`fold_subbyte_cast`-able one folded."""
    folded = [fold_subbyte_cast(expr) for expr in inputs]
    return [expr if new is None else new for expr, new in zip(inputs, folded)]


def fold_subbyte_pads(expr: relay.Expr, stop: Sequence[relay.Expr] = ()) -> relay.Expr:
    """``expr`` with each zero ``nn.pad`` of an int4/uint4 constant done in NumPy (FoldConstant would misplace it).

    For what a legalization (the package's conv2d one, TVM's dense one) makes of folded inputs. The walk
    does not enter the expressions in ``stop`` (a layer's inputs: the rest of the graph).

    Examples
    --------
    >>> weight = relay.const(subbyte_array(np.arange(-8, 8).reshape(2, 8), "int4"))
    >>> folded = fold_subbyte_pads(relay.nn.pad(weight, ((0, 0), (0, 8))))
    >>> subbyte_values(folded.data)[1].tolist()
    [0, 1, 2, 3, 4, 5, 6, 7, 0, 0, 0, 0, 0, 0, 0, 0]
    """

    class _Pads(relay.ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            if getattr(new.op, "name", "") != "nn.pad" or not isinstance(new.args[0], relay.Constant):
                return new
            data, value = new.args[0].data, new.args[1] if len(new.args) > 1 else None
            if not is_subbyte(data.dtype) or str(new.attrs.pad_mode) != "constant":
                return new
            if value is not None and not (isinstance(value, relay.Constant) and not value.data.numpy().any()):
                return new
            widths = [tuple(int(v) for v in pair) for pair in new.attrs.pad_width]
            return relay.const(subbyte_array(np.pad(subbyte_values(data), widths), str(data.dtype)))

    mutator = _Pads()
    for kept in stop:
        mutator.memo_map[kept] = kept
    return mutator.visit(expr)
