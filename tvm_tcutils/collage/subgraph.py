"""An indexed dataflow graph of a Relay function, with node sets as bitsets.

Collage reasons about sub-graphs of ``main``: which operators a candidate
partition holds, whether it is convex, how deep it is, which values cross its
boundary. :class:`IndexedGraph` numbers the nodes of a dataflow function in
post-order (every node after its inputs), so that a set of nodes is a plain
Python ``int`` whose bit ``i`` stands for node ``i``; union, intersection and
overlap tests are then single integer operations.

The graph is built iteratively from ``relay.analysis.post_order_visit`` (C++),
so deep models never hit Python's recursion limit, and everything here is
linear in the size of the graph (the descendant/ancestor masks cost one
big-integer ``or`` per edge).
"""
from __future__ import annotations

import dataclasses
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from .._tvm import tvm
from tvm import relay

#: Node kinds. Only "call", "tuple" and "getitem" nodes must be covered by a partition;
#: "var" and "const" nodes are free inputs.
COVERED_KINDS = ("call", "tuple", "getitem")


@dataclasses.dataclass
class Node:
    """One node of an :class:`IndexedGraph`."""

    index: int
    expr: relay.Expr
    kind: str
    inputs: Tuple[int, ...]
    outputs: List[int] = dataclasses.field(default_factory=list)
    #: The operator's name for calls, else the kind (``tuple``, ``var``...); kept
    #: here because reading it from the expression crosses into C++ each time.
    op_name: str = ""

    def __post_init__(self):
        if not self.op_name:
            self.op_name = self.expr.op.name if self.kind == "call" else self.kind


def bits(mask: int) -> Iterator[int]:
    """Indices of the set bits of ``mask``, lowest first.

    Examples
    --------
    >>> list(bits(0b10110))
    [1, 2, 4]
    """
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


def popcount(mask: int) -> int:
    """Number of set bits of ``mask``.

    Examples
    --------
    >>> popcount(0b1011)
    3
    """
    return bin(mask).count("1")


def mask_of(indices: Iterable[int]) -> int:
    """The bitset holding ``indices``.

    Examples
    --------
    >>> mask_of([0, 2])
    5
    """
    mask = 0
    for index in indices:
        mask |= 1 << index
    return mask


class IndexedGraph:
    """The dataflow nodes of a Relay function, numbered in post-order.

    Parameters
    ----------
    func : relay.Function
        A type-checked dataflow function (calls of operators, tuples, tuple
        projections, variables and constants). Calls of functions or global
        functions, ``let`` and ``if`` are rejected with a ``ValueError``:
        Collage runs on a model before any other partitioning.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> f = relay.Function([x], relay.nn.relu(relay.add(x, x)))
    >>> g = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(f))["main"])
    >>> [n.op_name for n in g.nodes]
    ['var', 'add', 'nn.relu']
    """

    def __init__(self, func: relay.Function):
        if not isinstance(func, relay.Function):
            raise TypeError(f"func must be a relay.Function, got {type(func).__name__}")
        self.func = func
        self.nodes: List[Node] = []
        self._index: Dict[relay.Expr, int] = {}
        for param in func.params:
            self._add(param, "var", ())
        relay.analysis.post_order_visit(func.body, self._visit)
        self.output = self._index[func.body]
        for node in self.nodes:
            for i in sorted(set(node.inputs)):
                self.nodes[i].outputs.append(node.index)
        self._tuple_typed: Dict[int, bool] = {}
        self._signatures: Optional[List[tuple]] = None
        self.covered_mask = mask_of(n.index for n in self.nodes if n.kind in COVERED_KINDS)
        self._closures()

    # -- construction -------------------------------------------------------
    def _add(self, expr: relay.Expr, kind: str, inputs: Tuple[int, ...]) -> None:
        if expr in self._index:
            return
        index = len(self.nodes)
        self._index[expr] = index
        self.nodes.append(Node(index, expr, kind, inputs))

    def _visit(self, expr: relay.Expr) -> None:
        if isinstance(expr, tvm.ir.Op):
            return
        if isinstance(expr, relay.Var):
            self._add(expr, "var", ())
        elif isinstance(expr, relay.Constant):
            self._add(expr, "const", ())
        elif isinstance(expr, relay.Call):
            if not isinstance(expr.op, tvm.ir.Op):
                raise ValueError(
                    "mod: Collage partitions a dataflow graph of operator calls; found a call of "
                    f"{type(expr.op).__name__} (run Collage before any other partitioning or fusion)"
                )
            self._add(expr, "call", tuple(self._index[a] for a in expr.args))
        elif isinstance(expr, relay.Tuple):
            self._add(expr, "tuple", tuple(self._index[f] for f in expr.fields))
        elif isinstance(expr, relay.TupleGetItem):
            self._add(expr, "getitem", (self._index[expr.tuple_value],))
        else:
            raise ValueError(
                f"mod: Collage supports dataflow graphs only; found a {type(expr).__name__} node"
            )

    def _closures(self) -> None:
        count = len(self.nodes)
        self.descendants = [0] * count
        self.ancestors = [0] * count
        for node in reversed(self.nodes):
            mask = 0
            for out in node.outputs:
                mask |= (1 << out) | self.descendants[out]
            self.descendants[node.index] = mask
        for node in self.nodes:
            mask = 0
            for i in node.inputs:
                mask |= (1 << i) | self.ancestors[i]
            self.ancestors[node.index] = mask

    # -- queries ----------------------------------------------------------
    def __len__(self) -> int:
        return len(self.nodes)

    def index_of(self, expr: relay.Expr) -> int:
        """Index of ``expr`` (a node of this graph)."""
        return self._index[expr]

    def contains(self, expr: relay.Expr) -> bool:
        """Whether ``expr`` is a node of this graph."""
        return expr in self._index

    def reach(self, mask: int) -> Tuple[int, int]:
        """(descendants, ancestors) of the nodes in ``mask``, ``mask`` excluded."""
        down = up = 0
        for i in bits(mask):
            down |= self.descendants[i]
            up |= self.ancestors[i]
        return down & ~mask, up & ~mask

    def is_convex(self, mask: int) -> bool:
        """Whether no path leaves ``mask`` and comes back into it.

        Examples
        --------
        >>> x = relay.var("x", shape=(2,))
        >>> a = relay.exp(x); b = relay.negative(a); c = relay.add(a, b)
        >>> g = IndexedGraph(relay.Function([x], c))
        >>> g.is_convex(mask_of([1, 3])), g.is_convex(mask_of([1, 2, 3]))
        (False, True)
        """
        down, up = self.reach(mask)
        return not (down & up)

    def depth(self, mask: int) -> int:
        """Number of call nodes on the longest path inside ``mask``."""
        depth: Dict[int, int] = {}
        best = 0
        for i in bits(mask):
            node = self.nodes[i]
            inner = max((depth[j] for j in node.inputs if j in depth), default=0)
            depth[i] = inner + (1 if node.kind == "call" else 0)
            best = max(best, depth[i])
        return best

    def local_signature(self, mask: int, composites: Sequence[Tuple[str, int]] = ()) -> tuple:
        """What the stand-alone function of ``mask`` is made of, position-independent.

        Two node sets with equal signatures extract (see :func:`.outline.extract`)
        to structurally equal functions: the same operators, attributes and types
        wired the same way, the same outside values in the same order, the same
        outputs and composites. Computed from per-node data read once, so that
        cost-cache keys need no extraction (tens of thousands of candidates on
        Inception-v3 are keyed in seconds).

        Examples
        --------
        >>> x = relay.var("x", shape=(2,))
        >>> f = relay.Function([x], relay.exp(relay.exp(x)))
        >>> g = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(f))["main"])
        >>> g.local_signature(0b010) == g.local_signature(0b100)
        True
        """
        node_sigs = self._node_signatures()
        members = list(bits(mask))
        position = {i: k for k, i in enumerate(members)}
        outside = {j: k for k, j in enumerate(self.inputs_of(mask))}
        body = tuple(
            (node_sigs[i], tuple(("m", position[j]) if j in position else ("x", outside[j])
                                 for j in self.nodes[i].inputs))
            for i in members
        )
        return (
            body,
            tuple(node_sigs[j][-1] for j in outside),
            tuple(position[o] for o in self.outputs_of(mask)),
            tuple((label, tuple(position[i] for i in bits(inner))) for label, inner in composites),
        )

    def _node_signatures(self) -> List[tuple]:
        """Per node: kind, operator, attributes' structural hash, tuple index, type (read once)."""
        if self._signatures is None:
            sigs = []
            for node in self.nodes:
                expr = node.expr
                attrs = 0
                if node.kind == "call" and expr.attrs is not None:
                    attrs = int(tvm.ir.structural_hash(expr.attrs))
                index = expr.index if node.kind == "getitem" else -1
                sigs.append((node.kind, node.op_name, attrs, index, str(expr.checked_type)))
            self._signatures = sigs
        return self._signatures

    def inputs_of(self, mask: int) -> List[int]:
        """Nodes outside ``mask`` feeding it, in index order (each once)."""
        seen = 0
        for i in bits(mask):
            for j in self.nodes[i].inputs:
                seen |= 1 << j
        return list(bits(seen & ~mask))

    def outputs_of(self, mask: int) -> List[int]:
        """Nodes of ``mask`` whose value is used outside it (or is the function result)."""
        outs = []
        for i in bits(mask):
            node = self.nodes[i]
            if i == self.output or any(not (mask >> o) & 1 for o in node.outputs):
                outs.append(i)
        return outs

    def neighbours(self, mask: int) -> int:
        """Covered nodes adjacent to ``mask`` (producers and consumers), outside it."""
        near = 0
        for i in bits(mask):
            node = self.nodes[i]
            for j in node.inputs:
                near |= 1 << j
            for j in node.outputs:
                near |= 1 << j
        return near & ~mask & self.covered_mask

    def is_tuple_typed(self, index: int) -> bool:
        """Whether node ``index`` has a tuple type (remembered: reading types crosses into C++)."""
        known = self._tuple_typed.get(index)
        if known is None:
            known = isinstance(self.nodes[index].expr.checked_type, relay.TupleType)
            self._tuple_typed[index] = known
        return known

    def op_names(self, mask: int) -> List[str]:
        """Operator names of the call nodes of ``mask``, in index order."""
        return [self.nodes[i].op_name for i in bits(mask) if self.nodes[i].kind == "call"]

    def describe(self, mask: int, limit: int = 6) -> str:
        """A short text naming the operators of ``mask`` (for tables and logs)."""
        names = self.op_names(mask) or [self.nodes[i].op_name for i in bits(mask)]
        text = "+".join(names[:limit])
        return text + (f"+...({len(names)})" if len(names) > limit else "")


def checked_main(mod: tvm.IRModule) -> relay.Function:
    """``mod["main"]`` after type inference (``mod`` itself is not changed)."""
    if not isinstance(mod, tvm.IRModule):
        raise TypeError(f"mod must be a tvm.IRModule, got {type(mod).__name__}")
    if "main" not in [gv.name_hint for gv in mod.get_global_vars()]:
        raise ValueError("mod has no 'main' function")
    return relay.transform.InferType()(mod)["main"]
