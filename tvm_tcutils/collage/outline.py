"""Turning node sets back into Relay: partition functions and the partitioned ``main``.

The functions made here have the shape BYOC's ``MergeComposite`` +
``PartitionGraph`` give them, so that a toolchain's external codegen sees
what it would see after ``partition_for_<toolchain>``:

* a partition is a global function with ``Primitive=1``, ``Compiler=<name>``,
  ``global_symbol=<name>`` (and ``Inline=1``); its parameters are the values
  it reads from outside, constants stay inside;
* a composite inside it is a function literal with ``Composite=<label>`` and
  ``PartitionedFromPattern``, whose parameters are all of its inputs
  (constants included), called in place.

Everything is built in one pass over nodes in dataflow order, without
recursion.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from .._tvm import tvm
from tvm import relay

from .candidates import Candidate
from .search import partition_order
from .subgraph import IndexedGraph, bits
from .toolchains.base import FAST_MATH_OPS
from .toolchains.packed_call import lift_constants


def rebuild_node(graph: IndexedGraph, index: int, value: Dict[int, relay.Expr], fast: bool = False) -> relay.Expr:
    """Node ``index`` of ``graph`` with its inputs replaced by ``value[input]``
    (``fast``: its operator's fast-math form, :data:`~.toolchains.base.FAST_MATH_OPS`)."""
    node = graph.nodes[index]
    expr = node.expr
    if node.kind == "call":
        op = relay.op.get(FAST_MATH_OPS[node.op_name]) if fast else expr.op
        return relay.Call(op, [value[i] for i in node.inputs], expr.attrs, None, expr.span)
    if node.kind == "tuple":
        return relay.Tuple([value[i] for i in node.inputs], expr.span)
    if node.kind == "getitem":
        return relay.TupleGetItem(value[node.inputs[0]], expr.index)
    return expr


def _param(graph: IndexedGraph, index: int, name: str) -> relay.Var:
    return relay.var(name, type_annotation=graph.nodes[index].expr.checked_type)


def _body(graph: IndexedGraph, mask: int, value: Dict[int, relay.Expr], composites, prefix: str):
    """Fill ``value`` for the nodes of ``mask`` (composites as called function literals)."""
    comp_of: Dict[int, Tuple[str, int]] = {}
    for label, inner in composites:
        for i in bits(inner):
            comp_of[i] = (label, inner)
    done = 0
    for i in bits(mask):
        if i not in comp_of:
            value[i] = rebuild_node(graph, i, value)
            continue
        label, inner = comp_of[i]
        if i != max(bits(inner)):
            continue  # built with the composite's root, its last node
        inputs = graph.inputs_of(inner)
        inner_value = {j: _param(graph, j, f"FunctionVar_{done}_{k}") for k, j in enumerate(inputs)}
        for j in bits(inner):
            inner_value[j] = rebuild_node(graph, j, inner_value)
        pattern_ops = "".join(f"{n}_" for n in graph.op_names(inner))
        func = relay.Function([inner_value[j] for j in inputs], inner_value[i], graph.nodes[i].expr.checked_type)
        func = func.with_attr("Composite", label).with_attr("PartitionedFromPattern", pattern_ops)
        value[i] = relay.Call(func, [value[j] for j in inputs])
        done += 1


def extract(
    graph: IndexedGraph, mask: int, composites: Sequence[Tuple[str, int]] = (), prefix: str = "p",
    constants_as_params: bool = False,
) -> Tuple[relay.Function, List[int], List[int]]:
    """The nodes of ``mask`` as a function of the values they read from outside.

    Constants stay inside unless ``constants_as_params`` (used for cache
    keys: weights do not change latency).

    Returns
    -------
    (function, inputs, outputs)
        ``inputs`` are the node indices of the function's parameters (in
        order; constants read by the partition stay inside it), ``outputs``
        the nodes it returns (a tuple when there are several).

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> f = relay.Function([x], relay.nn.relu(relay.exp(x)))
    >>> g = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(f))["main"])
    >>> func, ins, outs = extract(g, 0b110)
    >>> ins, outs
    ([0], [2])
    """
    inputs = [i for i in graph.inputs_of(mask) if constants_as_params or graph.nodes[i].kind != "const"]
    value: Dict[int, relay.Expr] = {i: _param(graph, i, f"{prefix}_i{k}") for k, i in enumerate(inputs)}
    for i in graph.inputs_of(mask):
        value.setdefault(i, graph.nodes[i].expr)
    _body(graph, mask, value, composites, prefix)
    outputs = graph.outputs_of(mask)
    types = [graph.nodes[o].expr.checked_type for o in outputs]
    if len(outputs) == 1:
        body, ret_type = value[outputs[0]], types[0]
    else:
        body, ret_type = relay.Tuple([value[o] for o in outputs]), relay.TupleType(types)
    # Global functions need their result type: callers are typed before callees.
    return relay.Function([value[i] for i in inputs], body, ret_type), inputs, outputs


def external_function(func: relay.Function, compiler: str, symbol: str) -> relay.Function:
    """``func`` marked as a partition of ``compiler`` (as ``PartitionGraph`` marks them)."""
    func = func.with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    func = func.with_attr("Inline", tvm.tir.IntImm("int32", 1))
    func = func.with_attr("Compiler", compiler)
    return func.with_attr("global_symbol", symbol)


def candidate_module(graph: IndexedGraph, cand: Candidate, compiler: Optional[str]) -> tvm.IRModule:
    """A stand-alone module running candidate ``cand`` (how it is measured).

    For TVM (``compiler`` None) ``main`` is the candidate's operators; for a
    BYOC toolchain ``main`` calls the candidate as a partition of ``compiler``.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.transform.InferType()(
    ...     tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(relay.exp(x)))))["main"])
    >>> print(candidate_module(g, Candidate("tvm", 0b110, "f"), None)["main"].body.op.name)
    nn.relu
    """
    func, inputs, _ = extract(graph, cand.mask, cand.composites, prefix=f"{compiler or 'tvm'}_0")
    if compiler is None:
        return relay.transform.InferType()(tvm.IRModule.from_expr(_tensor_params(func)))
    symbol = f"tvmgen_default_{compiler}_main_0"
    mod = tvm.IRModule()
    gvar = relay.GlobalVar(symbol)
    mod[gvar] = external_function(func, compiler, symbol)
    params = [relay.var(f"input{k}", type_annotation=graph.nodes[i].expr.checked_type) for k, i in enumerate(inputs)]
    mod["main"] = relay.Function(params, relay.Call(gvar, params))
    return relay.transform.InferType()(mod)


def _tensor_params(func: relay.Function) -> relay.Function:
    """``func`` with each tuple-typed parameter split into one parameter per field.

    A TVM candidate may read a tuple built outside it (a lone ``concatenate``
    whose tuple is host glue); the graph executor cannot take a tuple as a
    model input, so the measured module takes the fields and builds the tuple
    itself (free: in the whole model TVM fuses it with its consumer).
    """
    params: List[relay.Var] = []
    binds: Dict[relay.Var, relay.Expr] = {}
    for param in func.params:
        ttype = param.type_annotation
        # Nested tuples stay (their build fails and the candidate costs inf, logged).
        if not isinstance(ttype, relay.TupleType) or any(isinstance(f, relay.TupleType) for f in ttype.fields):
            params.append(param)
            continue
        fields = [relay.var(f"{param.name_hint}_{n}", type_annotation=f) for n, f in enumerate(ttype.fields)]
        params.extend(fields)
        binds[param] = relay.Tuple(fields)
    return relay.Function(params, relay.bind(func.body, binds), func.ret_type) if binds else func


def partitioned_module(
    graph: IndexedGraph, chosen: Sequence[Candidate], compilers: Dict[str, Optional[str]],
    base: Optional[tvm.IRModule] = None, fast_nodes: int = 0,
) -> Tuple[tvm.IRModule, Dict[int, str]]:
    """``main`` with every chosen BYOC partition outlined to a global function.

    Partitions of TVM itself and host glue stay in ``main`` (``relay.build``
    fuses them); ``compilers`` maps toolchain names to their ``Compiler``
    value (None for TVM). Functions of ``base`` other than ``main`` are kept.
    The nodes of ``fast_nodes`` (partitions of a fast-math TVM toolchain:
    operators of :data:`~.toolchains.base.FAST_MATH_OPS`) get their fast-math
    operator, so fast math is chosen per partition, not for all of ``main``.

    Returns
    -------
    (IRModule, dict)
        The module and the global symbol of each outlined partition, by node set.
    """
    external = [c for c in chosen if not c.host and compilers.get(c.toolchain)]
    order = partition_order(graph, [c.mask for c in external])
    if order is None:
        raise RuntimeError("the chosen partitions depend on each other cyclically")
    by_mask = {c.mask: c for c in external}
    value: Dict[int, relay.Expr] = {}
    counters: Dict[str, int] = {}
    symbols: Dict[int, str] = {}
    mod = tvm.IRModule()
    if base is not None:
        for gv in base.get_global_vars():
            if gv.name_hint != "main":
                mod[gv] = base[gv]
    for mask in order:
        cand = by_mask.get(mask)
        if cand is None:
            (i,) = bits(mask)
            value[i] = rebuild_node(graph, i, value, bool(fast_nodes >> i & 1))
            continue
        compiler = compilers[cand.toolchain]
        k = counters.get(compiler, 0)
        counters[compiler] = k + 1
        symbol = f"tvmgen_default_{compiler}_main_{k}"
        symbols[mask] = symbol
        func, inputs, outputs = extract(graph, mask, cand.composites, prefix=f"{compiler}_{k}")
        gvar = relay.GlobalVar(symbol)
        mod[gvar] = external_function(func, compiler, symbol)
        call = relay.Call(gvar, [value[i] for i in inputs])
        if len(outputs) == 1:
            value[outputs[0]] = call
        else:
            for n, o in enumerate(outputs):
                value[o] = relay.TupleGetItem(call, n)
    main = graph.func
    mod["main"] = relay.Function(main.params, value[graph.output], main.ret_type, main.type_params, main.attrs)
    mod = relay.transform.InferType()(mod)
    # Large weights of graph-toolchain partitions are passed in, not embedded (packed_call.lift_constants).
    return lift_constants(mod), symbols
