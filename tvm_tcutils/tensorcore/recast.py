"""Recast chosen layers of a graph to another data type."""
from __future__ import annotations

import functools
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple, Union

from .._tvm import tvm
from tvm import relay
from tvm.relay.dataflow_pattern import CallPattern, DFPatternCallback, is_op, rewrite

from ._graph import (
    AttrsReplacer, ExprOrMod, Numbered, check_dtype, check_numbering, node_key, numbered_layers, post_order,
    relay_functions, resolve_ops, resolve_skip_layers, typed,
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


#: Per layer call (by node key): its index and the data type its result had.
Layers = Dict[int, Tuple[int, str]]


class _Recaster(DFPatternCallback):
    """Rewrites each matching call that is not skipped; one pass, no fixpoint."""

    def __init__(
        self, ops: Sequence[tvm.ir.Op], layers: Layers, skip: FrozenSet[int], dtype: str,
        attrs: _AttrsWithOutDtype,
    ):
        super().__init__(require_type=False, rewrite_once=True)
        self.pattern = CallPattern(functools.reduce(lambda a, b: a | b, [is_op(op.name) for op in ops]), None)
        self._layers = layers
        self._skip = skip
        self._dtype = dtype
        self._attrs = attrs

    def callback(self, pre, post, node_map):
        # ``pre`` is the node of the input graph, so its layer is known; calls of
        # functions left out of the numbering are not layers.
        layer = self._layers.get(node_key(pre))
        if layer is None or layer[0] in self._skip:
            return post
        args = [_cast_argument(arg, self._dtype) for arg in post.args]
        new_call = relay.Call(post.op, args, self._attrs(post.attrs), None, post.span)
        return relay.cast(new_call, layer[1])


def _result_dtypes(original: ExprOrMod, source: ExprOrMod, functions: Numbered) -> List[Layers]:
    """Per numbered function of ``original``, its layers with the result types read in ``source``.

    ``source`` is ``original`` or its type-checked copy, the same graph node
    for node: both walks meet the nodes in the same order. Reading types there
    lets the rewrite work on the input's own nodes, which keeps its (lack of)
    type annotations.
    """
    copies = {gv.name_hint if gv is not None else None: fn for gv, fn in relay_functions(source)}
    result = []
    for global_var, function, layers in functions:
        index = {node_key(call): i for call, i in layers}
        if source is original:
            pairs = [(call, call) for call, _ in layers]
        else:
            twin = copies[global_var.name_hint if global_var is not None else None]
            pairs = [
                (node, typed_node) for node, typed_node in zip(post_order(function), post_order(twin), strict=True)
                if node_key(node) in index
            ]
        result.append({node_key(n): (index[node_key(n)], _result_dtype(typed_node)) for n, typed_node in pairs})
    return result


def recast(
    expr_or_mod: ExprOrMod,
    dtype: str,
    out_dtype: str,
    ops: Union[str, Iterable[str]] = ("nn.conv2d",),
    skip_layers: Optional[Iterable[int]] = None,
    numbering: str = "chain",
) -> ExprOrMod:
    """Make chosen layers compute in another data type, leaving the rest of the graph as it was.

    Each argument of a matching call is cast to ``dtype``, the call computes in
    ``out_dtype`` (its ``out_dtype`` attribute, where it has one) and its
    result is cast back to the type it had. The casts are plain conversions,
    not quantization: use it to build and time models in a new type. The
    rest of the graph is the input's own nodes: an input without types gives
    an output without types, as TVM's ``relay.transform.recast`` does.

    Parameters
    ----------
    expr_or_mod : tvm.IRModule or relay.Expr
        Every Relay function of a module is recast (layers numbered across
        them, ``main`` first; ``main`` alone under ``numbering="tvm"``, the
        others kept as they are); an expression gives an expression back.
        Not modified.
    dtype : str
        Type the inputs of each layer are cast to, e.g. ``"int8"``.
    out_dtype : str
        Type the layer computes/accumulates in, e.g. ``"int32"``.
    ops : list of str
        Op names whose calls are layers.
    skip_layers : list of int, optional
        Layer indices to leave alone (see :func:`count_layers`); negative
        indices count from the last layer.
    numbering : {"chain", "tvm"}
        How ``skip_layers`` name layers: ``"tvm"`` as TVM's recast does, so
        ``recast(..., numbering="tvm")`` returns what ``relay.transform.recast``
        returns (see :data:`tvm_tcutils.tensorcore._graph.NUMBERINGS`).

    Returns
    -------
    tvm.IRModule or relay.Expr
        Same kind as the input; it type-checks.

    Raises
    ------
    ValueError, TypeError
        Unknown op, dtype or numbering, a skip index out of range or not an
        integer, or an input that does not type-check.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("resnet-18")
    >>> int8 = recast(mod, "int8", "int32", skip_layers=[0, -1])
    >>> "int8" in int8.astext()
    True
    >>> tvm_style = recast(mod, "int8", "int32", skip_layers=[0], numbering="tvm")
    >>> tvm.ir.structural_equal(tvm_style, relay.transform.recast(mod, "int8", "int32", skip_layers=[0]))
    True
    """
    op_list = resolve_ops(ops, "ops")
    check_dtype(dtype, "dtype")
    check_dtype(out_dtype, "out_dtype")
    count, functions = numbered_layers(expr_or_mod, op_list, check_numbering(numbering))
    skip = resolve_skip_layers(skip_layers, count)
    layers = _result_dtypes(expr_or_mod, typed(expr_or_mod), functions)
    return _rewrite(expr_or_mod, functions, layers, op_list, dtype, out_dtype, skip)


def recast_layers(
    source: ExprOrMod, ops: Sequence[tvm.ir.Op], dtype: str, out_dtype: str, skip: FrozenSet[int],
    result_dtypes: Sequence[str],
) -> ExprOrMod:
    """:func:`recast` with checked arguments and the result type of every layer known.

    ``source`` needs no types: ``prepare_for_tensorcore`` passes the layers'
    result types from before layout conversion (which keeps them) and so
    saves a type inference of the whole graph. Layers are numbered as by
    default.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> from tvm_tcutils.tensorcore._graph import resolve_ops
    >>> mod, _ = load_model("mlp")
    >>> out = recast_layers(mod, resolve_ops("nn.dense", "ops"), "int8", "int32", frozenset({2}), ["float32"] * 3)
    >>> out.astext().count("int8")
    4
    """
    _, functions = numbered_layers(source, ops)
    layers = [{node_key(call): (i, result_dtypes[i]) for call, i in calls} for _, _, calls in functions]
    return _rewrite(source, functions, layers, ops, dtype, out_dtype, skip)


def _rewrite(
    source: ExprOrMod, functions: Numbered, layers: List[Layers], ops: Sequence[tvm.ir.Op], dtype: str,
    out_dtype: str, skip: FrozenSet[int],
) -> ExprOrMod:
    attrs = _AttrsWithOutDtype(out_dtype)
    # One recaster per function: functions may share nodes, numbered differently in each.
    rewritten = [
        (global_var, rewrite(_Recaster(ops, function_layers, skip, dtype, attrs), function))
        for (global_var, function, _), function_layers in zip(functions, layers)
    ]
    if not isinstance(source, tvm.IRModule):
        return rewritten[0][1]
    result = source.clone()
    for global_var, function in rewritten:
        result.update_func(global_var, function)
    return result
