"""Recast chosen layers of a graph to another data type."""
from __future__ import annotations

import functools
from typing import Dict, FrozenSet, Iterable, Optional, Sequence, Union

from .._tvm import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import CallPattern, DFPatternCallback, is_op, rewrite

from ._graph import (
    AttrsReplacer, ExprOrMod, check_dtype, function_layers, node_key, resolve_ops,
    resolve_skip_layers, typed,
)


def _cast_argument(arg: relay.Expr, dtype: str) -> relay.Expr:
    """Cast a tensor argument, or each field of a tuple argument (as for concatenate)."""
    if isinstance(arg, relay.Tuple):
        return relay.Tuple([relay.cast(field, dtype) for field in arg.fields])
    return relay.cast(arg, dtype)


class _AttrsWithOutDtype:
    """Attributes with ``out_dtype`` replaced (unchanged for ops without one)."""

    def __init__(self, out_dtype: str):
        self._out_dtype = out_dtype
        self._replace = AttrsReplacer()

    def __call__(self, attrs: Optional[tvm.ir.Attrs]) -> Optional[tvm.ir.Attrs]:
        if attrs is None or not hasattr(attrs, "out_dtype"):
            return attrs
        return self._replace(attrs, out_dtype=self._out_dtype)


def _result_dtype(call: relay.Call) -> str:
    result = call.checked_type
    if not isinstance(result, relay.TensorType):
        raise ValueError(
            f"ops: {call.op.name} returns {result}, not one tensor; recast handles ops with one tensor output"
        )
    return str(result.dtype)


class _Recaster(DFPatternCallback):
    """Rewrites each matching call that is not skipped; one pass, no fixpoint."""

    def __init__(
        self, ops: Sequence[tvm.ir.Op], index: Dict[int, int], skip: FrozenSet[int], dtype: str,
        attrs: _AttrsWithOutDtype, result_dtypes: Sequence[str],
    ):
        super().__init__(require_type=False, rewrite_once=True)
        self.pattern = CallPattern(functools.reduce(lambda a, b: a | b, [is_op(op.name) for op in ops]), None)
        self._index = index
        self._skip = skip
        self._dtype = dtype
        self._attrs = attrs
        self._result_dtypes = result_dtypes

    def callback(self, pre, post, node_map):
        # ``pre`` is the node of the input graph, so its layer index is known.
        index = self._index[node_key(pre)]
        if index in self._skip:
            return post
        args = [_cast_argument(arg, self._dtype) for arg in post.args]
        new_call = relay.Call(post.op, args, self._attrs(post.attrs), None, post.span)
        return relay.cast(new_call, self._result_dtypes[index])


def recast(
    expr_or_mod: ExprOrMod,
    dtype: str,
    out_dtype: str,
    ops: Union[str, Iterable[str]] = ("nn.conv2d",),
    skip_layers: Optional[Iterable[int]] = None,
) -> ExprOrMod:
    """Make chosen layers compute in another data type, leaving the rest of the graph as it was.

    Each argument of a matching call is cast to ``dtype``, the call computes in
    ``out_dtype`` (its ``out_dtype`` attribute, where it has one) and its
    result is cast back to the type it had. The casts are plain conversions,
    not quantization: use it to build and time models in a new type.

    Parameters
    ----------
    expr_or_mod : tvm.IRModule or relay.Expr
        Every Relay function of a module is recast (layers numbered across
        them, ``main`` first); an expression gives an expression back. Not
        modified.
    dtype : str
        Type the inputs of each layer are cast to, e.g. ``"int8"``.
    out_dtype : str
        Type the layer computes/accumulates in, e.g. ``"int32"``.
    ops : list of str
        Op names whose calls are layers.
    skip_layers : list of int, optional
        Layer indices to leave alone (see :func:`count_layers`); negative
        indices count from the last layer.

    Returns
    -------
    tvm.IRModule or relay.Expr
        Same kind as the input; it type-checks.

    Raises
    ------
    ValueError, TypeError
        Unknown op or dtype, a skip index out of range or not an integer, or
        an input that does not type-check.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> int8 = recast(mod, "int8", "int32", skip_layers=[0, -1])
    >>> "int8" in int8.astext()
    True
    """
    op_list = resolve_ops(ops, "ops")
    check_dtype(dtype, "dtype")
    check_dtype(out_dtype, "out_dtype")
    source = typed(expr_or_mod)
    layers = [call for _, _, calls in function_layers(source, op_list) for call in calls]
    skip = resolve_skip_layers(skip_layers, len(layers))
    return recast_layers(source, op_list, dtype, out_dtype, skip, [_result_dtype(call) for call in layers])


def recast_layers(
    source: ExprOrMod, ops: Sequence[tvm.ir.Op], dtype: str, out_dtype: str, skip: FrozenSet[int],
    result_dtypes: Sequence[str],
) -> ExprOrMod:
    """:func:`recast` with checked arguments and the result type of every layer known.

    ``source`` needs no types: ``prepare_for_tensorcore`` passes the layers'
    result types from before layout conversion (which keeps them) and so
    saves a type inference of the whole graph.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.tensorcore._graph import resolve_ops
    >>> mod, _ = load_model("mlp")
    >>> out = recast_layers(mod, resolve_ops("nn.dense", "ops"), "int8", "int32", frozenset({2}), ["float32"] * 3)
    >>> out.astext().count("int8")
    4
    """
    rewritten, first, attrs = [], 0, _AttrsWithOutDtype(out_dtype)
    for global_var, function, calls in function_layers(source, ops):
        # Indexed per function: functions may share nodes.
        index = {node_key(call): first + i for i, call in enumerate(calls)}
        recaster = _Recaster(ops, index, skip, dtype, attrs, result_dtypes)
        rewritten.append((global_var, rewrite(recaster, function)))
        first += len(calls)
    if not isinstance(source, tvm.IRModule):
        return rewritten[0][1]
    result = source.clone()
    for global_var, function in rewritten:
        result.update_func(global_var, function)
    return result
