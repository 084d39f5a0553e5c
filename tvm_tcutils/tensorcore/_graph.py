"""Shared plumbing of the graph passes: argument checks, layer numbering, typing.

Layer numbering (the one definition every pass uses)
----------------------------------------------------
The layers of a set of ops are the calls to those ops, numbered in dataflow
order from the inputs: the order of a post-order walk of the function (each
call after all of its arguments, arguments left to right). That is the order
in which ``relay.transform.ConvertLayout`` visits calls, so the indices of
``count_layers``, ``layer_table``, ``recast``, ``LayoutConfig`` and
``prepare_for_tensorcore`` all name the same call. In a module, ``main`` is
numbered first and the other Relay functions follow in name order.

TVM's numbering (``numbering="tvm"``, for scripts ported from TVM)
-----------------------------------------------------------------
TVM 0.19's ``relay.analysis.count_layers`` and ``relay.transform.recast``
number the layers of ``main`` by depth from the output instead: a walk from
the output (operands left to right, each node at its first visit) keeps a
depth that each layer raises by one; ``count_layers`` returns the deepest
depth and ``recast`` calls a layer ``count - 1 - depth before it``. How the
depth is set back after each operand differs between the two (see
:func:`_tvm_walk`). Parallel layers therefore share an index, and some
indices name no layer. TVM's ``LayoutConfig`` numbers ``nn.conv2d`` calls
in ConvertLayout's visit order, like the default numbering, but on one count
that never restarts. :data:`NUMBERINGS` lists the schemes; the
``numbering="tvm"`` results equal TVM's (the tests compare them on models
and on random graphs).

Every walk here is :func:`post_order` or an explicit-stack walk in the same
order: ``relay.analysis.post_order_visit`` recurses in C++ and overflows the
native stack near 50,000 chained nodes. So no pass recurses, and all are
linear in the size of the graph.
"""
from __future__ import annotations

import dataclasses
import difflib
import numbers
from typing import Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .._tvm import tvm
from tvm import relay

ExprOrMod = Union[relay.Expr, tvm.IRModule]

#: Data types accepted where the API takes one (TVM knows more, but these are
#: the ones a Relay tensor can be cast to and computed in).
_INT_BITS = (1, 4, 8, 16, 32, 64)
_FLOAT_BITS = (16, 32, 64)


def resolve_ops(ops: Union[str, Iterable[str]], arg: str) -> Tuple[tvm.ir.Op, ...]:
    """Check op names and return the ops, raising ValueError/TypeError naming ``arg``."""
    if isinstance(ops, str):
        ops = [ops]
    try:
        names = list(ops)
    except TypeError:
        raise TypeError(f"{arg} must be a list of op names such as ['nn.conv2d'], got {ops!r}") from None
    if not names:
        raise ValueError(f"{arg} is empty; give op names such as ['nn.conv2d']")
    known = None
    resolved = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"{arg} must hold op names (str), got {name!r}")
        try:
            resolved.append(tvm.ir.Op.get(name))
        except tvm.TVMError:
            known = known or list(tvm.ir.Op.list_op_names())
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"did you mean {', '.join(close)}?" if close else "e.g. nn.conv2d, qnn.conv2d, nn.dense"
            raise ValueError(f"{arg}: {name!r} is not a registered Relay operator; {hint}") from None
    return tuple(resolved)


def check_dtype(dtype: str, arg: str) -> str:
    """Return ``dtype`` if it names a scalar type tensors can have, else ValueError naming ``arg``."""
    valid = (
        "bool, int1..int64/uint1..uint64 with "
        f"{'/'.join(map(str, _INT_BITS))} bits, float16/32/64, bfloat16"
    )
    if not isinstance(dtype, str):
        raise TypeError(f"{arg} must be a dtype string ({valid}), got {dtype!r}")
    try:
        parsed = tvm.runtime.DataType(dtype)
    except (ValueError, tvm.TVMError):
        parsed = None
    ok = parsed is not None and parsed.lanes == 1 and str(parsed) == dtype and (
        dtype == "bool"
        or (parsed.type_code in (0, 1) and parsed.bits in _INT_BITS)
        or (parsed.type_code == 2 and parsed.bits in _FLOAT_BITS)
        or dtype == "bfloat16"
    )
    if not ok:
        raise ValueError(f"{arg}: {dtype!r} is not a data type TVM can compute in; valid: {valid}")
    return dtype


Functions = List[Tuple[Optional[tvm.ir.GlobalVar], relay.Expr]]


def relay_functions(expr_or_mod: ExprOrMod, arg: str = "expr_or_mod") -> Functions:
    """``[(global_var or None, expr)]``: main first, then other Relay functions by name."""
    if isinstance(expr_or_mod, tvm.IRModule):
        pairs = [(gv, fn) for gv, fn in expr_or_mod.functions.items() if isinstance(fn, relay.Function)]
        return sorted(pairs, key=lambda pair: (pair[0].name_hint != "main", pair[0].name_hint))
    if isinstance(expr_or_mod, relay.Expr):
        return [(None, expr_or_mod)]
    raise TypeError(f"{arg} must be a tvm.IRModule or a relay.Expr, got {type(expr_or_mod).__name__}")


_CHILDREN = {
    relay.Call: lambda n: [n.op, *n.args],
    relay.Tuple: lambda n: list(n.fields),
    relay.TupleGetItem: lambda n: [n.tuple_value],
    relay.Function: lambda n: [*n.params, n.body],
    relay.Let: lambda n: [n.value, n.var, n.body],
    relay.If: lambda n: [n.cond, n.true_branch, n.false_branch],
    relay.RefCreate: lambda n: [n.value],
    relay.RefRead: lambda n: [n.ref],
    relay.RefWrite: lambda n: [n.ref, n.value],
    relay.Match: lambda n: [n.data, *(clause.rhs for clause in n.clauses)],
}
"""Sub-expressions of each node kind, in the order TVM's ExprVisitor visits them."""
_LEAVES = (relay.Var, relay.Constant, tvm.ir.Op, tvm.ir.GlobalVar, relay.Constructor)
_CHILDREN.update({kind: lambda n: () for kind in _LEAVES})


def _children(node) -> list:
    children = _CHILDREN.get(type(node))
    if children is None:  # a subclass of a known kind
        children = next((fn for kind, fn in _CHILDREN.items() if isinstance(node, kind)), lambda n: ())
    return children(node)


def post_order(expr: relay.Expr) -> Iterator[relay.Expr]:
    """Every node of ``expr`` once, each after its sub-expressions (as ``post_order_visit``).

    Examples
    --------
    >>> x = relay.var("x")
    >>> [type(n).__name__ for n in post_order(relay.nn.relu(x))]
    ['Op', 'Var', 'Call']
    """
    seen = set()
    stack = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        key = node.handle.value
        if expanded:
            yield node
            continue
        if key in seen:
            continue
        seen.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)))


def function_layers(
    expr_or_mod: ExprOrMod, ops: Sequence[tvm.ir.Op]
) -> List[Tuple[Optional[tvm.ir.GlobalVar], relay.Expr, List[relay.Call]]]:
    """Per Relay function, its calls to ``ops`` in layer order (numbering continues across functions)."""
    wanted = {node_key(op) for op in ops}  # ops are singletons: compare addresses
    result = []
    for global_var, expr in relay_functions(expr_or_mod):
        calls = [node for node in post_order(expr) if type(node) is relay.Call and node_key(node.op) in wanted]
        result.append((global_var, expr, calls))
    return result


def layer_calls(expr_or_mod: ExprOrMod, ops: Sequence[tvm.ir.Op]) -> List[relay.Call]:
    """The calls to ``ops`` in layer order (see the module docstring)."""
    return [call for _, _, calls in function_layers(expr_or_mod, ops) for call in calls]


#: Per numbered function: its global var (None for an expression), the function
#: and its layers in dataflow order, each with its index.
Numbered = List[Tuple[Optional[tvm.ir.GlobalVar], relay.Expr, List[Tuple[relay.Call, int]]]]


def _chain_layers(expr_or_mod: ExprOrMod, ops: Sequence[tvm.ir.Op]) -> Tuple[int, Numbered]:
    numbered, first = [], 0
    for global_var, expr, calls in function_layers(expr_or_mod, ops):
        numbered.append((global_var, expr, [(call, first + i) for i, call in enumerate(calls)]))
        first += len(calls)
    return first, numbered


def _tvm_walk(expr: relay.Expr, wanted: FrozenSet[int], for_recast: bool) -> Tuple[int, Dict[int, int]]:
    """Replay the depth counter of TVM's layer visitors; the deepest depth and each layer's depth before it.

    A pre-order walk from the output, operands left to right, each node taken
    at its first visit, with one depth counter that a layer raises by one
    and a call sets back after each of its operands: to the depth before the
    call for ``recast``, which also walks into the called function; to the
    raised depth for ``count_layers``, which does not. Nothing else sets it
    back, so a layer in a tuple field raises the depth of the next fields.
    The stack holds nodes to visit and, as ``(None, depth)``, set-backs.
    """
    seen, before, deepest, depth = set(), {}, 0, 0
    stack: list = [(expr, 0)]
    while stack:
        node, restore = stack.pop()
        if node is None:
            depth = restore
            continue
        key = node_key(node)
        if key in seen:
            continue
        seen.add(key)
        if type(node) is not relay.Call:
            stack.extend((child, 0) for child in reversed(_children(node)))
            continue
        if node_key(node.op) in wanted:
            before[key] = depth
            depth += 1
            deepest = max(deepest, depth)
        back = before.get(key, depth) if for_recast else depth
        steps = [(node.op, 0)] if for_recast else []
        for arg in node.args:
            steps += [(arg, 0), (None, back)]
        stack.extend(reversed(steps))
    return deepest, before


def _tvm_layers(expr_or_mod: ExprOrMod, ops: Sequence[tvm.ir.Op]) -> Tuple[int, Numbered]:
    functions = relay_functions(expr_or_mod)
    if isinstance(expr_or_mod, tvm.IRModule):
        functions = [(gv, fn) for gv, fn in functions if gv.name_hint == "main"]
        if not functions:
            raise ValueError("numbering='tvm' numbers the layers of main, and the module has no Relay main")
    global_var, expr = functions[0]
    wanted = frozenset(node_key(op) for op in ops)
    count, _ = _tvm_walk(expr, wanted, for_recast=False)
    _, depth = _tvm_walk(expr, wanted, for_recast=True)
    # recast's walk may meet layers that count_layers' does not (in called functions): depth > count.
    calls = [node for node in post_order(expr) if type(node) is relay.Call and node_key(node.op) in wanted]
    return count, [(global_var, expr, [(call, count - 1 - depth[node_key(call)]) for call in calls])]


@dataclasses.dataclass(frozen=True)
class Numbering:
    """A layer numbering scheme: what it means and how it numbers a graph."""

    meaning: str
    layers: Callable[[ExprOrMod, Sequence[tvm.ir.Op]], Tuple[int, Numbered]]


#: The values of the passes' ``numbering`` argument (see the module docstring).
NUMBERINGS: Dict[str, Numbering] = {
    "chain": Numbering(
        "every call its own index, in dataflow order from the inputs, across all functions of a module",
        _chain_layers,
    ),
    "tvm": Numbering(
        "TVM 0.19's: main only; count_layers and recast by depth from the output (parallel layers share "
        "an index), LayoutConfig by nn.conv2d calls on one count that never restarts",
        _tvm_layers,
    ),
}


def check_numbering(numbering: str, arg: str = "numbering") -> str:
    """Return ``numbering`` if it names a scheme of :data:`NUMBERINGS`, else ValueError/TypeError naming ``arg``.

    Examples
    --------
    >>> check_numbering("tvm")
    'tvm'
    >>> check_numbering("depth")
    Traceback (most recent call last):
    ...
    ValueError: numbering: 'depth' is not a layer numbering; valid: 'chain', 'tvm'
    """
    valid = ", ".join(map(repr, NUMBERINGS))
    if not isinstance(numbering, str):
        raise TypeError(f"{arg} must be one of {valid}, got {numbering!r}")
    if numbering not in NUMBERINGS:
        raise ValueError(f"{arg}: {numbering!r} is not a layer numbering; valid: {valid}")
    return numbering


def numbered_layers(expr_or_mod: ExprOrMod, ops: Sequence[tvm.ir.Op], numbering: str = "chain") -> Tuple[int, Numbered]:
    """The number of layers and, per numbered function, its layers with their indices.

    ``numbering`` must be checked (:func:`check_numbering`). Under ``"tvm"``
    the number is TVM's ``count_layers``, not the number of calls.

    Examples
    --------
    >>> x, w = relay.var("x", shape=(1, 4, 8, 8)), relay.var("w", shape=(4, 4, 1, 1))
    >>> conv = relay.nn.conv2d(x, w)
    >>> diamond = relay.add(relay.nn.conv2d(conv, w), relay.nn.conv2d(conv, w))
    >>> for numbering in NUMBERINGS:
    ...     count, [(_, _, layers)] = numbered_layers(diamond, resolve_ops("nn.conv2d", "ops"), numbering)
    ...     print(numbering, count, [index for _, index in layers])
    chain 3 [0, 1, 2]
    tvm 2 [0, 1, 1]
    """
    relay_functions(expr_or_mod)  # type check of the argument
    return NUMBERINGS[numbering].layers(expr_or_mod, ops)


def node_key(node: tvm.runtime.Object) -> int:
    """Identity of a node (its address), for dictionaries keyed by node."""
    return node.handle.value


def resolve_skip_layers(
    skip_layers: Optional[Iterable[int]], num_layers: Optional[int], arg: str = "skip_layers"
) -> FrozenSet[int]:
    """Check layer indices and turn negative ones into positions.

    With ``num_layers`` None (unknown), negative indices are an error.
    """
    if skip_layers is None:
        return frozenset()
    if isinstance(skip_layers, (str, bytes)) or not isinstance(skip_layers, Iterable):
        raise TypeError(f"{arg} must be a list of layer indices (int), got {skip_layers!r}")
    resolved = set()
    for index in skip_layers:
        if isinstance(index, bool) or not isinstance(index, numbers.Integral):
            raise TypeError(f"{arg} must hold layer indices (int), got {index!r}")
        index = int(index)
        if num_layers is None:
            if index < 0:
                raise ValueError(f"{arg}: negative index {index} needs the number of layers (num_layers=)")
        elif not -num_layers <= index < num_layers:
            raise ValueError(
                f"{arg}: layer {index} is out of range; the graph has {num_layers} layers "
                f"(valid: {-num_layers}..{num_layers - 1})" if num_layers else
                f"{arg}: layer {index} is out of range; the graph has no matching layers"
            )
        resolved.add(index % num_layers if num_layers else index)
    return frozenset(resolved)


def _is_typed(expr: relay.Expr) -> bool:
    # InferType may leave a type on the Function node of the module it was given
    # and none on the body, so a function counts as typed only with its body.
    nodes = (expr, expr.body) if isinstance(expr, relay.Function) else (expr,)
    try:
        for node in nodes:
            node.checked_type
    except ValueError:
        return False
    return True


def typed(expr_or_mod: ExprOrMod, arg: str = "expr_or_mod") -> ExprOrMod:
    """The input with types: itself when already type-checked, else a type-checked copy.

    Raises ValueError naming ``arg`` when it does not type-check. Type
    inference runs only when needed because it is the costliest step on deep
    graphs.
    """
    functions = relay_functions(expr_or_mod, arg)
    if all(_is_typed(fn) for _, fn in functions):
        return expr_or_mod
    # InferType records types on the Function and GlobalVar nodes it is given, in
    # place: give it fresh ones (sharing the bodies) so that the input stays as it was.
    try:
        if isinstance(expr_or_mod, tvm.IRModule):
            return relay.transform.InferType()(_fresh_module(expr_or_mod, functions))
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(_fresh(expr_or_mod)))
    except tvm.TVMError as err:
        raise ValueError(f"{arg} does not type-check: {first_error_line(err)}") from None
    main = mod["main"]
    return main if isinstance(expr_or_mod, relay.Function) else main.body


def _fresh(expr: relay.Expr) -> relay.Expr:
    if isinstance(expr, relay.Function):
        return relay.Function(expr.params, expr.body, expr.ret_type, expr.type_params, expr.attrs, expr.span)
    return expr


def _fresh_module(mod: tvm.IRModule, functions) -> tvm.IRModule:
    calls_globals = any(
        isinstance(node, tvm.ir.GlobalVar) for _, function in functions for node in post_order(function)
    )
    if calls_globals:  # functions refer to each other: only a deep copy keeps that consistent
        return tvm.ir.load_json(tvm.ir.save_json(mod))
    others = {gv: fn for gv, fn in mod.functions.items() if not isinstance(fn, relay.Function)}
    others.update({tvm.ir.GlobalVar(gv.name_hint): _fresh(fn) for gv, fn in functions})
    attrs = {str(key): mod.attrs[key] for key in mod.attrs.keys()} if mod.attrs else None
    return tvm.IRModule(others, dict(mod.type_definitions.items()), attrs)


def first_error_line(err: BaseException) -> str:
    """The sentence of a TVM error that says what went wrong."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    errors = [line for line in lines if "rror" in line]
    return (errors[-1] if errors else (lines[0] if lines else type(err).__name__))[:300]


def replace_attrs(attrs: tvm.ir.Attrs, **changes) -> tvm.ir.Attrs:
    """A copy of op attributes with some fields changed."""
    values = {str(key): attrs[key] for key in attrs.keys()}
    values.update(changes)
    return tvm.ir.make_node(attrs.type_key, **values)


class AttrsReplacer:
    """:func:`replace_attrs` made once per distinct (attributes, changes).

    Reading attributes field by field costs tens of FFI calls; deep models
    repeat a few distinct attribute values thousands of times, so a structural
    hash finds the copy made before. At most ``limit`` copies are kept.
    """

    def __init__(self, limit: int = 4096):
        self._made: Dict[tuple, list] = {}
        self._limit = limit

    def __call__(self, attrs: tvm.ir.Attrs, **changes) -> tvm.ir.Attrs:
        if len(self._made) > self._limit:
            self._made.clear()
        bucket = self._made.setdefault((tvm.ir.structural_hash(attrs), tuple(sorted(changes.items()))), [])
        for original, replaced in bucket:
            if tvm.ir.structural_equal(original, attrs):
                return replaced
        replaced = replace_attrs(attrs, **changes)
        bucket.append((attrs, replaced))
        return replaced
