"""What a toolchain claims, as one predicate its pattern and its builder both use.

A toolchain's pattern table says which calls it takes (the predicate of each
entry); its codegen then has to build every partition made of them. When the
two hold their own copies of the rules, a call can be claimed and then fail at
build time (``nn.dense`` + ``add`` where the add was not a bias). Here each
claim is written once:

* :func:`matrix_product` and :func:`biased_product`: the ``tcutils_blas``
  claims (a matrix product numpy's BLAS computes, and a bias over one); its
  pattern predicate is :func:`blas_claims` and its codegen asks
  :func:`biased_product` for the operands it computes;
* the ONNX toolchains (``ort``, ``openvino``) share the exporter's own
  :func:`~.toolchains.relay_to_onnx.supported` in both places already.

:func:`require` is how a builder asserts a claim: the same predicate, with a
``ValueError`` naming what was refused.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from .._tvm import tvm
from tvm import relay

#: Relay matrix products the BLAS toolchain runs.
MATRIX_PRODUCTS = ("nn.dense", "nn.batch_matmul", "nn.matmul")

#: Element types numpy's BLAS computes natively.
BLAS_DTYPES = ("float32", "float64")

#: Ops that add a bias to a product's result.
BIAS_OPS = ("nn.bias_add", "add")


def static_tensor(ttype) -> bool:
    """Whether ``ttype`` is a tensor type with every dimension known.

    Examples
    --------
    >>> static_tensor(relay.TensorType((2, 3))), static_tensor(relay.TensorType((relay.Any(), 3)))
    (True, False)
    """
    return isinstance(ttype, relay.TensorType) and all(isinstance(d, tvm.tir.IntImm) for d in ttype.shape)


def _op_name(expr: relay.Expr) -> Optional[str]:
    return str(expr.op.name) if isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) else None


def _dims(ttype) -> Tuple[int, ...]:
    return tuple(int(d) for d in ttype.shape)


def matrix_product(expr: relay.Expr, products: Sequence[str] = MATRIX_PRODUCTS) -> bool:
    """Whether ``expr`` is a typed call of ``products`` (of :data:`MATRIX_PRODUCTS`) that numpy's BLAS computes.

    Operands and result statically shaped, all of one type of
    :data:`BLAS_DTYPES`, no widening ``out_dtype``.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(4, 8)), relay.var("w", shape=(16, 8))
    >>> f = relay.transform.InferType()(tvm.IRModule.from_expr(relay.nn.dense(x, w)))["main"]
    >>> matrix_product(f.body), matrix_product(relay.transform.InferType()(
    ...     tvm.IRModule.from_expr(relay.nn.relu(x)))["main"].body)
    (True, False)
    """
    if _op_name(expr) not in products or _op_name(expr) not in MATRIX_PRODUCTS:
        return False
    try:
        types = [arg.checked_type for arg in expr.args] + [expr.checked_type]
    except ValueError:  # not type-checked
        return False
    dtype = str(getattr(types[-1], "dtype", ""))
    if dtype not in BLAS_DTYPES or not all(static_tensor(t) and str(t.dtype) == dtype for t in types):
        return False
    return str(getattr(expr.attrs, "out_dtype", "")) in ("", dtype)


def _is_bias(bias: relay.Expr, out, axis: int) -> bool:
    """A bias of the product's type along ``axis`` of its result: shape ``(N,)`` or ``(1, ..., 1, N)``."""
    try:
        ttype = bias.checked_type
    except ValueError:
        return False
    if not static_tensor(ttype) or str(ttype.dtype) != str(out.dtype):
        return False
    shape, size = _dims(ttype), _dims(out)[axis]
    return len(shape) >= 1 and shape[-1] == size and all(d == 1 for d in shape[:-1]) \
        and len(shape) <= len(out.shape)


def biased_product(call: relay.Expr, products: Sequence[str] = MATRIX_PRODUCTS
                   ) -> Optional[Tuple[relay.Call, relay.Expr]]:
    """``(product, bias)`` when ``call`` adds a bias to a :func:`matrix_product` of ``products``, else None.

    ``nn.bias_add(product, b)`` with a 1-D ``b``, or ``add`` of a product and
    a bias in either order, where the bias has the product's element type and
    broadcasts over its last axis only (shape ``(N,)`` or ``(1, ..., 1, N)``
    for a result ``(..., N)``), so that the sum has the product's shape. An
    ``add`` of a product and anything else (a residual, another layer's
    output) is not a bias.

    Examples
    --------
    >>> x = relay.var("x", shape=(4, 8))
    >>> w, b, r = relay.const([[1.0] * 8] * 16), relay.const([0.5] * 16), relay.var("r", shape=(4, 16))
    >>> def typed(e): return relay.transform.InferType()(tvm.IRModule.from_expr(e))["main"].body
    >>> biased_product(typed(relay.add(b, relay.nn.dense(x, w))))[1].data.shape
    (16,)
    >>> biased_product(typed(relay.add(relay.nn.dense(x, w), r))) is None
    True
    """
    name = _op_name(call)
    if name not in BIAS_OPS or len(call.args) != 2:
        return None
    try:
        out = call.checked_type
    except ValueError:
        return None
    if name == "nn.bias_add":
        product, bias = call.args
        if not matrix_product(product, products):
            return None
        ndim = len(product.checked_type.shape)
        axis = int(call.attrs.axis)
        axis = axis + ndim if axis < 0 else axis
        ok = 0 <= axis < ndim and len(bias.checked_type.shape) == 1 and _is_bias(bias, product.checked_type, axis)
        return (product, bias) if ok else None
    args = list(call.args)
    for product, bias in (args, args[::-1]):
        if matrix_product(product, products) and _is_bias(bias, product.checked_type, -1) \
                and _dims(out) == _dims(product.checked_type):
            return product, bias
    return None


def blas_claims(expr: relay.Expr) -> bool:
    """What ``tcutils_blas`` builds: a :func:`matrix_product`, or a :func:`biased_product`.

    Examples
    --------
    >>> blas_claims(relay.var("x"))
    False
    """
    return matrix_product(expr) or biased_product(expr) is not None


def blas_claim(op_name: str) -> Callable[[relay.Expr], bool]:
    """The predicate of the ``tcutils_blas`` patterns of one product: :func:`blas_claims` with that product only.

    The pattern matcher tries an ``add``'s arguments in both orders; naming the
    product keeps the predicate on the argument the pattern matched (in
    ``add(batch_matmul, dense)`` the dense pattern matched the dense).

    Examples
    --------
    >>> blas_claim("nn.dense").__name__
    'blas_claims[nn.dense]'
    """
    if op_name not in MATRIX_PRODUCTS:
        raise ValueError(f"op_name: expected one of {list(MATRIX_PRODUCTS)}, got {op_name!r}")

    def claims(expr: relay.Expr) -> bool:
        return matrix_product(expr, (op_name,)) or biased_product(expr, (op_name,)) is not None

    claims.__name__ = f"blas_claims[{op_name}]"
    return claims


def require(predicate: Callable[[relay.Expr], object], expr: relay.Expr, what: str):
    """``predicate(expr)``, or ``ValueError`` saying that ``what`` is not claimed.

    How a builder asserts the claim its pattern made, with the same predicate.

    Examples
    --------
    >>> require(blas_claims, relay.var("x"), "tcutils_blas")
    Traceback (most recent call last):
    ...
    ValueError: tcutils_blas: x is not what the toolchain claims (blas_claims)
    """
    answer = predicate(expr)
    if not answer:
        text = _op_name(expr) or (expr.name_hint if isinstance(expr, relay.Var) else type(expr).__name__)
        raise ValueError(f"{what}: {text} is not what the toolchain claims ({predicate.__name__})")
    return answer
