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


class _Unexpected(Exception):
    """The annotated module is not shaped as :func:`outline_annotated` expects (TVM's pass then runs)."""


def _annotation(expr: relay.Expr, name: str) -> bool:
    return isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def _post_order(root: relay.Expr, children) -> List[relay.Expr]:
    """Nodes reachable from ``root`` through ``children(node)``, each after its children (iterative: BERT-base's
    graph is deeper than Python's recursion limit)."""
    order, seen, stack = [], set(), [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(children(node)) if child not in seen)
    return order


def _children(expr: relay.Expr) -> List[relay.Expr]:
    if isinstance(expr, relay.Call):
        return list(expr.args)  # a composite function called is an operator here: its body is not visited
    if isinstance(expr, relay.Tuple):
        return list(expr.fields)
    if isinstance(expr, relay.TupleGetItem):
        return [expr.tuple_value]
    if isinstance(expr, (relay.Var, relay.Constant, relay.Function)) or isinstance(expr, tvm.ir.Op):
        return []
    raise _Unexpected(f"{type(expr).__name__} in main")


def _rebuild(expr: relay.Expr, new: Dict[relay.Expr, relay.Expr]) -> relay.Expr:
    if isinstance(expr, relay.Call):
        return relay.Call(expr.op, [new[a] for a in expr.args], expr.attrs, expr.type_args, expr.span)
    if isinstance(expr, relay.Tuple):
        return relay.Tuple([new[f] for f in expr.fields], expr.span)
    if isinstance(expr, relay.TupleGetItem):
        return relay.TupleGetItem(new[expr.tuple_value], expr.index)
    return expr


def outline_annotated(mod: tvm.IRModule) -> tvm.IRModule:
    """``PartitionGraph`` of a module BYOC's ``AnnotateTarget`` and ``MergeCompilerRegions`` annotated: each
    region outlined to a global function of its compiler, called from ``main``.

    The same partitions as TVM's pass (its first and last steps are TVM's own: tuple flattening, default
    annotations removed, names mangled): each region's inputs become parameters in the order its
    ``compiler_begin`` annotations are met, constant inputs are bound into the function, several outputs
    leave it as a tuple. TVM's pass re-infers the whole module after outlining each region: quadratic, 22 s
    for bert-tiny's 121 regions and 395 s for BERT-base's 361 (dynamic quantization: onnxruntime takes the
    integer products, TVM the rest); this infers types once. A module of another shape goes to TVM's pass.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,))
    >>> begin = lambda e: relay.annotation.compiler_begin(e, "ccompiler")
    >>> end = lambda e: relay.annotation.compiler_end(e, "ccompiler")
    >>> body = relay.exp(end(relay.add(begin(x), begin(relay.const(1.0)))))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], body)))
    >>> out = outline_annotated(mod)
    >>> sorted(gv.name_hint for gv in out.get_global_vars())
    ['main', 'tvmgen_default_ccompiler_main_0']
    >>> [p.name_hint for p in out["tvmgen_default_ccompiler_main_0"].params]  # the constant is bound inside
    ['ccompiler_0_i0']
    """
    tvm_pass = relay.transform.PartitionGraph()
    steps = list(getattr(tvm_pass, "passes", ()))
    names = [p.info.name for p in steps]
    if names != ["FlattenNestedTuples", "RemoveDefaultAnnotations", "PartitionGraph", "NameMangleExtFuncs",
                 "InferType"]:
        return tvm_pass(mod)  # another TVM: its own pass, whatever it costs
    before = relay.transform.InferType()(tvm.transform.Sequential(steps[:2])(mod))
    try:
        outlined = _outline_regions(before)
    except _Unexpected:
        return tvm_pass(mod)
    return tvm.transform.Sequential(steps[3:])(outlined)


def _outline_regions(mod: tvm.IRModule) -> tvm.IRModule:
    main = mod["main"]
    order = _post_order(main.body, _children)
    begin_name, end_name = "annotation.compiler_begin", "annotation.compiler_end"
    # Regions: the nodes between each compiler_end and the compiler_begin annotations above it; two ends that
    # reach a common node belong to one region.
    parent: Dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: Dict[relay.Expr, int] = {}
    ends = [node for node in order if _annotation(node, end_name)]
    for k, end in enumerate(ends):
        parent[k] = k
        stack = [end.args[0]]
        while stack:
            node = stack.pop()
            if _annotation(node, begin_name):
                owner.setdefault(node, k)
                parent[find(owner[node])] = find(k)
                continue
            if _annotation(node, end_name) or isinstance(node, relay.Var):
                raise _Unexpected("a region reads another region or a parameter without compiler_begin")
            if node in owner:
                parent[find(owner[node])] = find(k)
                continue
            owner[node] = k
            stack.extend(_children(node))
    regions: Dict[int, List[relay.Call]] = {}
    for k, end in enumerate(ends):
        regions.setdefault(find(k), []).append(end)
    inputs: Dict[int, List[relay.Call]] = {root: [] for root in regions}
    for node in order:  # begins in post order: the order TVM's pass meets them
        if _annotation(node, begin_name) and node in owner:
            inputs[find(owner[node])].append(node)

    region_of_end = {end: find(k) for k, end in enumerate(ends)}
    out = tvm.IRModule({gv: func for gv, func in mod.functions.items() if gv.name_hint != "main"},
                       dict(mod.type_definitions.items()))
    # Outer nodes and whole regions in an order where each comes after what it reads (a region reads the
    # sources of its compiler_begin annotations, possibly other regions' outputs): regions are convex, so
    # there is one. A region's outputs can be met in main's post order before all of its inputs are.
    def unit(expr: relay.Expr):
        return ("region", region_of_end[expr]) if _annotation(expr, end_name) else expr

    deps: Dict[object, List[object]] = {}
    for node in order:
        if _annotation(node, end_name) or _annotation(node, begin_name) or node in owner:
            continue
        deps[node] = [unit(child) for child in _children(node)]
    for root, begins in inputs.items():
        deps[("region", root)] = [unit(begin.args[0]) for begin in begins]
    users: Dict[object, List[object]] = {key: [] for key in deps}
    waiting = {}
    for key, needs in deps.items():
        needs = [need for need in dict.fromkeys(needs) if need in deps]
        waiting[key] = len(needs)
        for need in needs:
            users[need].append(key)
    ready = [key for key in deps if waiting[key] == 0]
    new: Dict[relay.Expr, relay.Expr] = {}
    number = 0
    while ready:
        key = ready.pop()
        if isinstance(key, tuple):
            root = key[1]
            outputs = regions[root]
            call, slots = _region_call(str(outputs[0].attrs.compiler), number, outputs, inputs[root], new, out)
            number += 1
            items = {slot: call if max(slots) == 0 else relay.TupleGetItem(call, slot) for slot in set(slots)}
            for end, slot in zip(outputs, slots):
                new[end] = items[slot]
        else:
            new[key] = _rebuild(key, new)
        for user in users[key]:
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if any(count for count in waiting.values()):
        raise _Unexpected("the regions read each other in a cycle")
    out["main"] = relay.Function(main.params, new[main.body], main.ret_type, main.type_params, main.attrs)
    return relay.transform.InferType()(out)


def _outer(begin: relay.Call) -> relay.Expr:
    """What a compiler_begin annotates, past any annotations stacked on it."""
    expr = begin.args[0]
    while _annotation(expr, "annotation.compiler_begin") or _annotation(expr, "annotation.compiler_end"):
        expr = expr.args[0]
    return expr


def _region_call(compiler: str, number: int, ends: List[relay.Call], begins: List[relay.Call],
                 new: Dict[relay.Expr, relay.Expr], out: tvm.IRModule) -> Tuple[relay.Expr, List[int]]:
    """The region's function added to ``out``, the call of it from ``main`` (its arguments from ``new``) and
    the output each of ``ends`` reads."""
    params: List[relay.Var] = []
    args: List[relay.Expr] = []
    inner: Dict[relay.Expr, relay.Expr] = {}
    by_source: Dict[relay.Expr, relay.Expr] = {}
    for begin in begins:
        source = _outer(begin)
        if source not in by_source:
            if isinstance(source, relay.Constant):
                by_source[source] = source  # bound into the function, as TVM's pass binds constants
            else:
                var = relay.var(f"{compiler}_{number}_i{len(params)}", type_annotation=begin.checked_type)
                params.append(var)
                args.append(new[begin.args[0]])
                by_source[source] = var
        inner[begin] = by_source[source]
    for node in _post_order(relay.Tuple([end.args[0] for end in ends]), _region_children):
        if node not in inner:
            inner[node] = _rebuild(node, inner)
    # Two compiler_end annotations of one expression (read twice outside) are one output, as in TVM's pass.
    produced = list(dict.fromkeys(end.args[0] for end in ends))
    fields = [inner[expr] for expr in produced]
    types = [expr.checked_type for expr in produced]
    # Typed in full: main is inferred against the functions' declared types.
    if len(fields) == 1:
        func = relay.Function(params, fields[0], types[0])
    else:
        func = relay.Function(params, relay.Tuple(fields), relay.TupleType(types))
    optimize = tvm.get_global_func(f"relay.ext.{compiler}.optimize", allow_missing=True)
    if optimize is not None:
        func = optimize(relay.transform.InferType()(tvm.IRModule.from_expr(func)))["main"]
    symbol = f"{compiler}_main_{number}"
    gvar = relay.GlobalVar(symbol)
    out[gvar] = external_function(func, compiler, symbol)
    return relay.Call(gvar, args), [produced.index(end.args[0]) for end in ends]


def _region_children(expr: relay.Expr) -> List[relay.Expr]:
    """A region's nodes stop at its compiler_begin annotations (the tuple of outputs is only a root)."""
    if _annotation(expr, "annotation.compiler_begin"):
        return []
    return _children(expr)
