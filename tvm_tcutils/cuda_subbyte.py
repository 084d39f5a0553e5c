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

from typing import List

from ._tvm import tvm
from tvm import tir
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
_MARK = "tvm-tcutils: element-wise access to 4-bit integers"
_CMP = (tir.EQ, tir.NE, tir.LT, tir.LE, tir.GT, tir.GE)
_WRAPPING = {tir.Add: lambda a, b: a + b, tir.Sub: lambda a, b: a - b, tir.Mul: lambda a, b: a * b}


def _is_subbyte(dtype) -> bool:
    dtype = tvm.DataType(str(dtype))
    return dtype.bits == 4 and dtype.type_code in (tvm.DataTypeCode.INT, tvm.DataTypeCode.UINT)


def _scalar_subbyte(dtype) -> bool:
    return _is_subbyte(dtype) and tvm.DataType(str(dtype)).lanes == 1


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
        if isinstance(node, tir.Cast) and _scalar_subbyte(node.value.dtype) and not _is_subbyte(node.dtype):
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
    if "tcutils_" not in code or _MARK in code:
        return code
    return HELPERS + code
