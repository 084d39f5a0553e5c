"""The ``tcutils_blas`` toolchain: dense, batch_matmul and matmul through numpy's BLAS.

A library-style toolchain, like cuBLAS for TVM on CUDA: a partition marked
``Compiler="tcutils_blas"`` holds one matrix product (``nn.dense``,
``nn.batch_matmul`` or ``nn.matmul``, plain or as a composite function) and an
optional bias (``nn.bias_add`` or a broadcasting ``add``). The external
codegen ``relay.ext.tcutils_blas`` records which operands are inputs and which
are constants (embedded), and the compiled function calls ``np.matmul`` (the
OpenBLAS numpy ships) with the executor's buffers as zero-copy views, writing
straight into the output buffer.

Threads: OpenBLAS's threads busy-wait for work long after a call returns,
and then take cores from TVM's own thread pool in a mixed model (measured
here: a 2-thread OpenBLAS GEMM next to TVM's pool ran 10-100x slower than
alone). The toolchain therefore runs OpenBLAS with
``TVM_TCUTILS_BLAS_THREADS`` threads (default 1) during its calls and restores
numpy's setting afterwards.
"""
from __future__ import annotations

import ctypes
import dataclasses
import functools
import io
import json
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..._tvm import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import is_op, wildcard

from ... import registry
from .. import predicates
from .packed_call import PackedToolchain, byoc_partition, function_of, tensor_view

#: BYOC compiler name of this toolchain.
COMPILER = "tcutils_blas"

#: Element types numpy's BLAS computes natively.
DTYPES = predicates.BLAS_DTYPES

#: Relay matrix products the toolchain runs.
PRODUCTS = predicates.MATRIX_PRODUCTS


def available() -> Tuple[bool, str]:
    """Whether numpy here is linked to an optimized BLAS, and which.

    Examples
    --------
    >>> ok, reason = available()
    >>> isinstance(ok, bool)
    True
    """
    try:
        config = np.show_config(mode="dicts")
    except TypeError:  # numpy < 1.26 cannot report its configuration as data
        return True, "numpy (BLAS not reported by this numpy version)"
    blas = (config or {}).get("Build Dependencies", {}).get("blas", {})
    if not blas.get("found", False):
        return False, "numpy was built without an optimized BLAS"
    return True, f"numpy {np.__version__} with {blas.get('name', 'BLAS')} {blas.get('version', '')}".strip()


# --------------------------------------------------------------------------
# Patterns: what the codegen builds, one predicate for both (see ..predicates).
# --------------------------------------------------------------------------
def pattern_table() -> List[tuple]:
    """Patterns ``tcutils_blas.<product>`` and ``tcutils_blas.<product>_bias``.

    Their predicate is :func:`~..predicates.blas_claim` of the product, the
    claim the codegen asserts (:func:`~..predicates.blas_claims`): what is
    claimed builds.

    Examples
    --------
    >>> [name for name, _, _ in pattern_table()][:2]
    ['tcutils_blas.dense_bias', 'tcutils_blas.dense']
    """
    table = []
    for op_name in PRODUCTS:
        short = op_name.split(".")[-1]
        product = is_op(op_name)(wildcard(), wildcard())
        biased = is_op("nn.bias_add")(product, wildcard()) | is_op("add")(product, wildcard())
        claims = predicates.blas_claim(op_name)
        table.append((f"{COMPILER}.{short}_bias", biased, claims))
        table.append((f"{COMPILER}.{short}", product, claims))
    return table


# --------------------------------------------------------------------------
# Codegen: a function to a plan.
# --------------------------------------------------------------------------
@dataclasses.dataclass
class _Plan:
    """What to compute: ``out = op(a, b) (+ bias)``, each operand an input index or a constant."""

    op: str
    transpose_a: bool
    transpose_b: bool
    operands: Dict[str, object]  # "a"/"b"/"bias" -> int (input index) or np.ndarray
    bias_shape: Optional[List[int]]
    num_inputs: int

    def to_bytes(self) -> bytes:
        header = {
            "op": self.op, "transpose_a": self.transpose_a, "transpose_b": self.transpose_b,
            "inputs": {k: v for k, v in self.operands.items() if isinstance(v, int)},
            "bias_shape": self.bias_shape, "num_inputs": self.num_inputs,
        }
        arrays = {k: v for k, v in self.operands.items() if not isinstance(v, int)}
        buffer = io.BytesIO()
        np.savez(buffer, __header__=np.frombuffer(json.dumps(header).encode(), dtype=np.uint8), **arrays)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, payload: bytes) -> "_Plan":
        with np.load(io.BytesIO(payload), allow_pickle=False) as data:
            header = json.loads(data["__header__"].tobytes().decode())
            operands: Dict[str, object] = {k: np.ascontiguousarray(data[k]) for k in data.files if k != "__header__"}
        operands.update({k: int(v) for k, v in header["inputs"].items()})
        return cls(
            header["op"], header["transpose_a"], header["transpose_b"], operands,
            header["bias_shape"], header["num_inputs"],
        )


def _resolve(expr: relay.Expr, env: Dict[relay.Var, relay.Expr]) -> relay.Expr:
    while isinstance(expr, relay.Var) and expr in env:
        expr = env[expr]
    return expr


def _inline_composite(expr: relay.Expr, env: Dict[relay.Var, relay.Expr]) -> relay.Expr:
    """Step into a composite function call, binding its parameters to the call's arguments."""
    expr = _resolve(expr, env)
    if isinstance(expr, relay.Call) and isinstance(expr.op, relay.Function):
        env.update({param: _resolve(arg, env) for param, arg in zip(expr.op.params, expr.args)})
        return _resolve(expr.op.body, env)
    return expr


def _plan(func: relay.Function) -> _Plan:
    params = {param: index for index, param in enumerate(func.params)}
    env: Dict[relay.Var, relay.Expr] = {}
    root = _inline_composite(func.body, env)
    if not (isinstance(root, relay.Call) and isinstance(root.op, tvm.ir.Op)
            and root.op.name in PRODUCTS + predicates.BIAS_OPS):
        raise ValueError(f"a {COMPILER} function must compute one of {list(PRODUCTS)} (plus a bias); got {root}")
    # The claim the pattern made, asserted with the same predicate.
    predicates.require(predicates.blas_claims, root, COMPILER)
    bias_expr, bias_shape = None, None
    found = predicates.biased_product(root)
    if found is not None:
        product, bias_expr = found
        bias_expr = _resolve(bias_expr, env)
        out_ndim = len(root.checked_type.shape)
        bias_shape = [int(d) for d in bias_expr.checked_type.shape]
        if root.op.name == "nn.bias_add":
            axis = int(root.attrs.axis)
            axis = axis + out_ndim if axis < 0 else axis
            bias_shape = bias_shape + [1] * (out_ndim - axis - 1)
        root = product

    def operand(expr: relay.Expr, what: str):
        expr = _resolve(expr, env)
        if isinstance(expr, relay.Constant):
            return expr.data.numpy()
        if isinstance(expr, relay.Var) and expr in params:
            return params[expr]
        raise ValueError(f"the {what} operand of a {COMPILER} function must be a parameter or a constant")

    operands = {"a": operand(root.args[0], "first"), "b": operand(root.args[1], "second")}
    if bias_expr is not None:
        bias = operand(bias_expr, "bias")
        operands["bias"] = bias.reshape(bias_shape) if isinstance(bias, np.ndarray) else bias
    if root.op.name == "nn.dense":
        transpose_a, transpose_b = False, True
    else:
        transpose_a, transpose_b = bool(root.attrs.transpose_a), bool(root.attrs.transpose_b)
    return _Plan(root.op.name, transpose_a, transpose_b, operands, bias_shape, len(func.params))


# --------------------------------------------------------------------------
# Runtime.
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _openblas_threads_api():
    """``(get, set)`` of the OpenBLAS numpy loaded, or None where it cannot be found (not Linux, not OpenBLAS)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = sorted({line.split()[-1] for line in maps if "openblas" in line.lower() and ".so" in line})
    except OSError:
        return None
    for path in paths:
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            for suffix in ("64_", ""):
                getter = getattr(library, f"{prefix}_get_num_threads{suffix}", None)
                setter = getattr(library, f"{prefix}_set_num_threads{suffix}", None)
                if getter is not None and setter is not None:
                    getter.restype = ctypes.c_int
                    setter.argtypes = [ctypes.c_int]
                    return getter, setter
    return None


def _blas_threads() -> int:
    value = os.environ.get("TVM_TCUTILS_BLAS_THREADS", "1")
    return int(value) if value.isdigit() and int(value) > 0 else 1


def _swap_last(array: np.ndarray) -> np.ndarray:
    return np.swapaxes(array, -1, -2)


def _execute(plan: _Plan, inputs, outputs) -> None:
    api = _openblas_threads_api()
    if api is None:
        _compute(plan, inputs, outputs)
        return
    get, set_ = api
    before, wanted = get(), _blas_threads()
    if before != wanted:
        set_(wanted)
    try:
        _compute(plan, inputs, outputs)
    finally:
        if before != wanted:
            set_(before)


def _compute(plan: _Plan, inputs, outputs) -> None:
    def value(name):
        operand = plan.operands[name]
        return tensor_view(inputs[operand]) if isinstance(operand, int) else operand

    a, b = value("a"), value("b")
    out = tensor_view(outputs[0])
    a = _swap_last(a) if plan.transpose_a else a
    b = _swap_last(b) if plan.transpose_b else b
    if plan.op == "nn.dense" and a.ndim > 2:
        # One GEMM over all leading dimensions instead of one per row block.
        np.matmul(a.reshape(-1, a.shape[-1]), b, out=out.reshape(-1, out.shape[-1]))
    else:
        np.matmul(a, b, out=out)
    if "bias" in plan.operands:
        bias = value("bias")
        np.add(out, bias.reshape(plan.bias_shape) if bias.shape != tuple(plan.bias_shape) else bias, out=out)


#: The packed functions ``tvm_tcutils.blas.run`` / ``tvm_tcutils.blas.load``.
TOOLCHAIN = PackedToolchain("blas", _Plan.from_bytes, _execute)


def compile_function(func: relay.Function) -> "tvm.runtime.Module":
    """External codegen ``relay.ext.tcutils_blas``: a matrix-product function to a runtime module.

    Parameters
    ----------
    func : relay.Function
        A partition (``global_symbol`` set) computing one of :data:`PRODUCTS`
        with an optional bias, its operands parameters or constants.

    Returns
    -------
    tvm.runtime.Module
        A module exporting the function's ``global_symbol``.

    Raises
    ------
    ValueError
        The function is not a single (biased) matrix product of :data:`DTYPES`.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(4, 8)), relay.var("w", shape=(16, 8))
    >>> f = relay.Function([x, w], relay.nn.dense(x, w)).with_attr("global_symbol", "blas_0")
    >>> compile_function(f).get_function("blas_0") is not None
    True
    """
    func = function_of(func)
    return TOOLCHAIN.build_module(func, _plan(func).to_bytes())


def partition_for(mod: tvm.IRModule, params=None) -> tvm.IRModule:
    """Greedy BYOC partitioning: every matrix product (with its bias) as its own partition goes to ``{COMPILER}``.

    ``mod`` is not modified; ``params`` are bound as constants first.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(4, 8)), relay.const(np.ones((16, 8), "float32"))
    >>> mod = tvm.IRModule.from_expr(relay.nn.dense(relay.nn.dense(x, w), w))
    >>> len(partition_for(mod).get_global_vars())
    3
    """
    return byoc_partition(mod, COMPILER, params, merge=False)


def hooks() -> List[registry.Hook]:
    """The codegen, the packed functions and the pattern table."""
    return TOOLCHAIN.hooks(COMPILER, compile_function, "numpy BLAS") + [
        registry.pattern_table(COMPILER, pattern_table, "dense / batch_matmul / matmul (+ bias)"),
    ]
