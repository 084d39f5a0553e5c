"""Partition rules, composed from small pieces.

A rule turns an :class:`~.subgraph.IndexedGraph` into candidate partitions
for one toolchain. The pieces:

* sources: :class:`PatternRule` (one dataflow pattern, with the BYOC
  predicate), :class:`OpPredicateRule` (``target.<name>`` operator
  predicates), :class:`FusionKindRule` (TVM's ``TOpPattern`` fusion kinds),
  :class:`HostGlueRule` (tuples and projections, free, left in ``main``);
* combinators: :class:`UnionRule`, :class:`CompositeRule` (label the
  candidates as composite functions), :class:`CombineRule` (unions of adjacent
  candidates, for graph-style toolchains), :class:`PrimitiveRule` (the
  candidates become partitions of the toolchain) and :class:`OnlyValidRule`
  (convex, within a maximum depth, composites with a single output).

:func:`pattern_table_rule` builds the union of composite rules of a BYOC
pattern table. Every rule's enumeration is iterative and bounded (depth and
count limits), so that it is linear in the graph for fixed limits.
"""
from __future__ import annotations

import logging
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set

from .._tvm import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from .candidates import Candidate
from .subgraph import IndexedGraph, bits, popcount

logger = logging.getLogger("tvm_tcutils.collage")

#: TVM's fusion kinds (``TOpPattern`` values, see ``relay.op.OpPattern``).
ELEMWISE, BROADCAST, INJECTIVE, COMM_REDUCE, OUT_ELEMWISE_FUSABLE, TUPLE, OPAQUE = 0, 1, 2, 3, 4, 7, 8

#: Ops that commute in their two arguments, as the pattern matcher allows.
_COMMUTATIVE = frozenset({"add", "multiply", "maximum", "minimum", "logical_and", "logical_or"})

#: Upper bound on the candidates one combining rule makes, so a pathological
#: graph cannot blow up the enumeration (a warning says when it is reached).
MAX_COMBINED = 50000


class PartitionRule:
    """Base class: ``candidates(graph, toolchain)`` returns candidate partitions."""

    name = "rule"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


# ---------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------
def _root_ops(pattern: dfp.DFPattern) -> Optional[Set[str]]:
    """Op names a match of ``pattern`` can be rooted at (None: any node)."""
    stack, names = [pattern], set()
    while stack:
        pat = stack.pop()
        if isinstance(pat, dfp.AltPattern):
            stack.extend([pat.left, pat.right])
        elif isinstance(pat, (dfp.AttrPattern, dfp.TypePattern, dfp.DataTypePattern, dfp.ShapePattern)):
            stack.append(pat.pattern)
        elif isinstance(pat, dfp.CallPattern) and isinstance(pat.op, dfp.ExprPattern) and isinstance(
            pat.op.expr, tvm.ir.Op
        ):
            names.add(pat.op.expr.name)
        else:
            return None
    return names


class _Unsupported(Exception):
    """A pattern kind the Python matcher leaves to TVM's matcher."""


def _plain(value):
    if isinstance(value, (tvm.tir.IntImm, tvm.tir.FloatImm)):
        return value.value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, (list, tuple, tvm.ir.container.Array)):
        return [_plain(v) for v in value]
    return value


def _attrs_match(pat: dfp.AttrPattern, expr: relay.Expr) -> bool:
    wanted = pat.attrs
    for key in wanted.keys():
        if isinstance(expr, relay.Call) and expr.attrs is not None and key in expr.attrs.keys():
            have = expr.attrs[key]
        elif isinstance(expr, tvm.ir.Op):
            have = expr.get_attr(key)
        else:
            raise _Unsupported(key)
        want = wanted[key]
        if isinstance(have, tvm.runtime.Object) and isinstance(want, tvm.runtime.Object) and not isinstance(
                have, (tvm.tir.IntImm, tvm.tir.FloatImm, tvm.ir.container.Array)):
            if not tvm.ir.structural_equal(have, want):
                return False
        elif _plain(have) != _plain(want):
            return False
    return True


class _Matcher:
    """Matches a dataflow pattern at one node and collects the matched nodes.

    TVM's own matcher (``DFPattern.match``) indexes the whole graph upstream of
    the node on every call, which makes scanning a large model quadratic; this
    one only walks the pattern. The same pattern node must match the same
    expression everywhere (as in TVM); ``AltPattern`` and commutative calls
    backtrack. Pattern kinds it does not know raise :class:`_Unsupported`.
    """

    def __init__(self, graph: IndexedGraph):
        self.graph = graph

    def match(self, pat: dfp.DFPattern, expr: relay.Expr) -> Optional[int]:
        bound: Dict = {}
        mask = self._match(pat, expr, bound)
        return mask

    def _match(self, pat, expr, bound) -> Optional[int]:
        if pat in bound:
            return 0 if bound[pat].same_as(expr) else None
        mask = self._new(pat, expr, bound)
        if mask is not None:
            bound[pat] = expr
        return mask

    def _bit(self, expr) -> int:
        return 1 << self.graph.index_of(expr) if self.graph.contains(expr) else 0

    def _new(self, pat, expr, bound) -> Optional[int]:
        if isinstance(pat, dfp.WildcardPattern):
            return 0
        if isinstance(pat, dfp.ExprPattern):
            target = pat.expr
            if isinstance(target, tvm.ir.Op):
                return 0 if isinstance(expr, tvm.ir.Op) and expr.name == target.name else None
            return 0 if target.same_as(expr) or tvm.ir.structural_equal(target, expr) else None
        if isinstance(pat, dfp.ConstantPattern):
            return 0 if isinstance(expr, relay.Constant) else None
        if isinstance(pat, dfp.VarPattern):
            ok = isinstance(expr, relay.Var) and (not pat.name_hint or pat.name_hint == expr.name_hint)
            return 0 if ok else None
        if isinstance(pat, dfp.AltPattern):
            trial = dict(bound)
            mask = self._match(pat.left, expr, trial)
            if mask is None:
                trial = dict(bound)
                mask = self._match(pat.right, expr, trial)
            if mask is not None:
                bound.update(trial)
            return mask
        if isinstance(pat, dfp.AttrPattern):
            mask = self._match(pat.pattern, expr, bound)
            return mask if mask is not None and _attrs_match(pat, expr) else None
        if isinstance(pat, dfp.DataTypePattern):
            mask = self._match(pat.pattern, expr, bound)
            ok = mask is not None and isinstance(expr.checked_type, relay.TensorType) and \
                str(expr.checked_type.dtype) == str(pat.dtype)
            return mask if ok else None
        if isinstance(pat, dfp.ShapePattern):
            mask = self._match(pat.pattern, expr, bound)
            ok = mask is not None and isinstance(expr.checked_type, relay.TensorType) and \
                _plain(list(expr.checked_type.shape)) == _plain(list(pat.shape))
            return mask if ok else None
        if isinstance(pat, dfp.TypePattern):
            mask = self._match(pat.pattern, expr, bound)
            return mask if mask is not None and tvm.ir.structural_equal(expr.checked_type, pat.type) else None
        if isinstance(pat, dfp.CallPattern):
            if not isinstance(expr, relay.Call) or self._match(pat.op, expr.op, bound) is None:
                return None
            return self._args(pat, expr, bound)
        if isinstance(pat, dfp.TuplePattern):
            if not isinstance(expr, relay.Tuple):
                return None
            return self._seq(pat.fields, expr.fields, bound, self._bit(expr))
        if isinstance(pat, dfp.TupleGetItemPattern):
            if not isinstance(expr, relay.TupleGetItem) or pat.index not in (-1, expr.index):
                return None
            inner = self._match(pat.tuple, expr.tuple_value, bound)
            return None if inner is None else inner | self._bit(expr)
        raise _Unsupported(type(pat).__name__)

    def _seq(self, pats, exprs, bound, mask) -> Optional[int]:
        if pats is None:
            return mask
        if len(pats) != len(exprs):
            return None
        for p, e in zip(pats, exprs):
            inner = self._match(p, e, bound)
            if inner is None:
                return None
            mask |= inner
        return mask

    def _args(self, pat, expr, bound) -> Optional[int]:
        own = self._bit(expr)
        pats = list(pat.args) if pat.args is not None else None
        trial = dict(bound)
        mask = self._seq(pats, list(expr.args), trial, own)
        if mask is None and pats is not None and len(pats) == 2 and isinstance(expr.op, tvm.ir.Op) \
                and expr.op.name in _COMMUTATIVE:
            trial = dict(bound)
            mask = self._seq(pats, list(expr.args)[::-1], trial, own)
        if mask is not None:
            bound.update(trial)
        return mask


def matched_nodes(pattern: dfp.DFPattern, expr: relay.Expr, graph: IndexedGraph) -> Optional[int]:
    """Nodes of ``graph`` matched by the non-wildcard parts of ``pattern`` at ``expr``.

    Returns None when ``pattern`` does not match at ``expr``. Pattern kinds
    whose matched nodes cannot be told apart (dominator, function, if, let)
    are checked by TVM's matcher and, when they match, claim the root only.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,))
    >>> g = IndexedGraph(relay.Function([x], relay.nn.relu(relay.exp(x))))
    >>> pat = dfp.is_op("nn.relu")(dfp.is_op("exp")(dfp.wildcard()))
    >>> matched_nodes(pat, g.nodes[-1].expr, g)
    6
    """
    try:
        mask = _Matcher(graph).match(pattern, expr)
    except _Unsupported:
        mask = (1 << graph.index_of(expr)) if pattern.match(expr) else None
    if mask is None:
        return None
    return mask & graph.covered_mask or None


class PatternRule(PartitionRule):
    """Every match of one dataflow pattern whose predicate accepts it.

    Parameters
    ----------
    pattern : DFPattern
        The pattern, as in a BYOC pattern table.
    predicate : callable, optional
        ``predicate(matched_root_expr) -> bool`` (the table's check function);
        a predicate that raises rejects the match.
    """

    def __init__(self, pattern: dfp.DFPattern, predicate: Optional[Callable] = None, name: str = "pattern"):
        self.pattern = pattern
        self.predicate = predicate
        self.name = name
        self._roots = _root_ops(pattern)

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        out = []
        for node in graph.nodes:
            if node.kind not in ("call", "tuple", "getitem"):
                continue
            if self._roots is not None and (node.kind != "call" or node.op_name not in self._roots):
                continue
            mask = matched_nodes(self.pattern, node.expr, graph)
            if mask is None or not _accepts(self.predicate, node.expr, self.name):
                continue
            out.append(Candidate(toolchain, mask, self.name))
        return out


def _accepts(predicate: Optional[Callable], expr: relay.Expr, name: str) -> bool:
    if predicate is None:
        return True
    try:
        return bool(predicate(expr))
    except Exception as err:  # noqa: BLE001  (a BYOC predicate's bug rejects the match, not the search)
        logger.debug("predicate of %s raised %s; match rejected", name, err)
        return False


class OpPredicateRule(PartitionRule):
    """Single operator calls accepted by the ``target.<compiler>`` op attribute."""

    def __init__(self, compiler: str):
        self.attr = f"target.{compiler}"
        self.name = f"{compiler}.op_predicate"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        out, cache = [], {}
        for node in graph.nodes:
            if node.kind != "call":
                continue
            op = node.expr.op
            if op.name not in cache:
                cache[op.name] = op.get_attr(self.attr)
            check = cache[op.name]
            if check is not None and _accepts(check, node.expr, self.name):
                out.append(Candidate(toolchain, 1 << node.index, f"{self.attr}.{op.name}"))
        return out


def fusion_kind(node) -> int:
    """TVM's fusion kind (``TOpPattern``) of a node; opaque when unknown."""
    if node.kind == "tuple":
        return TUPLE
    if node.kind != "call":
        return OPAQUE
    kind = node.expr.op.get_attr("TOpPattern")
    return OPAQUE if kind is None else int(kind)


def _may_follow(group_kind: int, consumer_kind: int) -> Optional[int]:
    """Kind of a fused group after adding a consumer, or None if TVM would not fuse it.

    Out-elementwise-fusable anchors (conv2d, dense) and reductions take an
    elementwise/broadcast epilogue; injective groups take injective ops and
    one reduction.
    """
    if consumer_kind <= BROADCAST and group_kind in (OUT_ELEMWISE_FUSABLE, COMM_REDUCE):
        return group_kind
    if group_kind <= INJECTIVE and consumer_kind <= INJECTIVE:
        return max(group_kind, consumer_kind)
    if group_kind <= INJECTIVE and consumer_kind == COMM_REDUCE:
        return COMM_REDUCE
    return None


class FusionKindRule(PartitionRule):
    """The groups TVM's ``FuseOps`` could form: every call, grown by its fusable consumers.

    Parameters
    ----------
    max_depth : int
        Longest chain of operators in a group.
    max_size : int
        Most operators in a group.
    """

    def __init__(self, max_depth: int = 4, max_size: int = 8):
        self.max_depth = max_depth
        self.max_size = max_size
        self.name = f"fusion_kinds(depth<={max_depth})"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        kinds = [fusion_kind(n) for n in graph.nodes]
        out = []
        for seed in graph.nodes:
            if seed.kind != "call":
                continue
            start = 1 << seed.index
            seen = {start}
            todo = [(start, kinds[seed.index])]
            while todo:
                mask, kind = todo.pop()
                out.append(Candidate(toolchain, mask, "tvm.fused" if mask != start else f"tvm.{seed.op_name}"))
                if kind == OPAQUE or popcount(mask) >= self.max_size:
                    continue
                for i in bits(mask):
                    for j in graph.nodes[i].outputs:
                        if (mask >> j) & 1 or graph.nodes[j].kind != "call":
                            continue
                        new_kind = _may_follow(kind, kinds[j])
                        grown = mask | (1 << j)
                        if new_kind is None or grown in seen:
                            continue
                        seen.add(grown)
                        if graph.depth(grown) <= self.max_depth and graph.is_convex(grown):
                            todo.append((grown, new_kind))
        return out


#: Label of :class:`QuantizedRegionRule`'s candidates (exempt from the depth limit, like maximal regions).
QUANTIZED = "quantized_region"

#: Operators a quantized region is built around.
_QUANTIZED_ANCHORS = frozenset({"nn.conv2d", "nn.dense", "nn.batch_matmul", "nn.matmul"})


class QuantizedRegionRule(PartitionRule):
    """A QDQ model's 8-bit layers: ``qnn.dequantize`` inputs -> conv/dense/matmul -> epilogue -> ``qnn.quantize``.

    In a quantizer's QDQ file every layer is float arithmetic between a ``DequantizeLinear`` and a
    ``QuantizeLinear``; only when the whole region is one partition can a toolchain run it in 8 bits
    (TVM's build with the package's integer rewrite, onnxruntime's QLinearConv). TVM's fusion kinds
    never group them (``qnn`` ops are opaque to ``FuseOps``), and their depth passes the usual limit,
    so this rule offers each such region whole. The epilogue is the anchor's single-consumer chain of
    elementwise and broadcast calls (bias, activation, a residual add whose other operand is a
    dequantize, taken in too) ending at a ``qnn.quantize``; a region that does not end there is none.

    Examples
    --------
    >>> import numpy as np
    >>> x = relay.var("x", shape=(1, 8), dtype="uint8")
    >>> w = relay.const(np.ones((4, 8), "int8"))
    >>> scale, zero = relay.const(0.1), relay.const(0)
    >>> dense = relay.nn.dense(relay.qnn.op.dequantize(x, scale, zero), relay.qnn.op.dequantize(w, scale, zero))
    >>> out = relay.qnn.op.quantize(relay.nn.relu(dense), scale, zero, out_dtype="uint8")
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], out)))["main"])
    >>> [graph.op_names(c.mask) for c in QuantizedRegionRule().candidates(graph, "tvm")]
    [['qnn.dequantize', 'qnn.dequantize', 'nn.dense', 'nn.relu', 'qnn.quantize']]
    """

    name = "quantized_regions"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        out = []
        for node in graph.nodes:
            if node.kind != "call" or node.op_name not in _QUANTIZED_ANCHORS:
                continue
            mask = self._dequantized_inputs(graph, node.index)
            if mask is None:
                continue
            mask |= 1 << node.index
            current = node.index
            while True:
                consumers = graph.nodes[current].outputs
                if len(consumers) != 1 or current == graph.output:
                    break
                nxt = graph.nodes[consumers[0]]
                if nxt.kind != "call":
                    break
                if nxt.op_name == "qnn.quantize":
                    region = mask | (1 << nxt.index)
                    if graph.is_convex(region):
                        out.append(Candidate(toolchain, region, QUANTIZED))
                    break
                if fusion_kind(nxt) > BROADCAST:
                    break
                others = [i for i in nxt.inputs if i != current and not (mask >> i) & 1]
                extra = 0
                for i in others:
                    other = graph.nodes[i]
                    if other.kind == "call" and other.op_name == "qnn.dequantize":
                        extra |= 1 << i
                    elif other.kind != "const":
                        extra = None
                        break
                if extra is None:
                    break
                mask |= extra | (1 << nxt.index)
                current = nxt.index
        return out

    @staticmethod
    def _dequantized_inputs(graph: IndexedGraph, index: int) -> Optional[int]:
        """The ``qnn.dequantize`` calls feeding node ``index`` (constants allowed), or None if another feeds it."""
        mask = 0
        for i in graph.nodes[index].inputs:
            node = graph.nodes[i]
            if node.kind == "call" and node.op_name == "qnn.dequantize":
                mask |= 1 << i
            elif node.kind != "const":
                return None
        return mask or None


class HostGlueRule(PartitionRule):
    """Tuples and tuple projections, left in ``main`` at no cost."""

    name = "host_glue"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        return [
            Candidate(toolchain, 1 << n.index, f"host.{n.kind}", host=True)
            for n in graph.nodes
            if n.kind in ("tuple", "getitem")
        ]


# ---------------------------------------------------------------------------
# Combinators
# ---------------------------------------------------------------------------
class UnionRule(PartitionRule):
    """All candidates of all sub-rules."""

    def __init__(self, rules: Sequence[PartitionRule]):
        self.rules = list(rules)
        self.name = "union(" + ", ".join(r.name for r in self.rules) + ")"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        out: List[Candidate] = []
        for rule in self.rules:
            out.extend(rule.candidates(graph, toolchain))
        return out


class CompositeRule(PartitionRule):
    """The sub-rule's candidates, each wrapped as a composite function named ``label``."""

    def __init__(self, label: str, rule: PartitionRule):
        self.label = label
        self.rule = rule
        self.name = f"composite({label})"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        return [
            Candidate(toolchain, c.mask, self.label, ((self.label, c.mask),))
            for c in self.rule.candidates(graph, toolchain)
        ]


#: Label of the maximal regions :class:`CombineRule` adds; :class:`OnlyValidRule`
#: exempts them from the depth limit.
MAXIMAL = "maximal_region"


class CombineRule(PartitionRule):
    """Unions of adjacent sub-rule candidates (graph-style toolchains such as TensorRT or ORT).

    Starting from the sub-rule's candidates (plus tuples and projections next
    to them), adds one adjacent piece at a time while the union stays convex
    and within ``max_depth``; each union is kept once. It also adds the
    maximal regions, whatever their depth: each connected set of claimed
    nodes, as BYOC's greedy ``MergeCompilerRegions`` would make it, so that the
    greedy partitioning is always among the choices (Collage then never
    estimates worse than it).
    """

    def __init__(self, rule: PartitionRule, max_depth: int, limit: int = MAX_COMBINED, maximal: bool = True):
        self.rule = rule
        self.max_depth = max_depth
        self.limit = limit
        self.maximal = maximal
        self.name = f"combine({rule.name}, depth<={max_depth})"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        base = self.rule.candidates(graph, toolchain)
        pieces: Dict[int, List[Candidate]] = {}
        for cand in base:
            for i in bits(cand.mask):
                pieces.setdefault(i, []).append(cand)
        for node in graph.nodes:
            if node.kind in ("tuple", "getitem") and not pieces.get(node.index):
                pieces[node.index] = [Candidate(toolchain, 1 << node.index, "glue")]
        seen = {(c.mask, c.composites) for c in base}
        out = list(base)
        frontier = list(base)
        while frontier and len(out) < self.limit:
            nxt = []
            for cand in frontier:
                for j in bits(graph.neighbours(cand.mask)):
                    for piece in pieces.get(j, ()):
                        if piece.mask & cand.mask:
                            continue
                        merged = Candidate(
                            toolchain, cand.mask | piece.mask, "combined",
                            tuple(sorted(cand.composites + piece.composites, key=lambda c: c[1])),
                        )
                        key = (merged.mask, merged.composites)
                        if key in seen:
                            continue
                        seen.add(key)
                        if graph.depth(merged.mask) <= self.max_depth and graph.is_convex(merged.mask):
                            nxt.append(merged)
            out.extend(nxt)
            frontier = nxt
        if len(out) >= self.limit:
            logger.warning("%s: stopped at %d candidates (limit)", self.name, self.limit)
        if self.maximal:
            out.extend(c for c in _maximal_regions(graph, toolchain, base, pieces)
                       if (c.mask, c.composites) not in seen)
        # A union made only of glue is not worth a partition.
        return [c for c in out if any(graph.nodes[i].kind == "call" for i in bits(c.mask))]


def _maximal_regions(graph: IndexedGraph, toolchain: str, base: List[Candidate], pieces) -> List[Candidate]:
    """Connected, convex sets of claimed nodes, composites chosen largest first without overlap."""
    chosen: List[Candidate] = []
    taken = 0
    for cand in sorted(base, key=lambda c: (-popcount(c.mask), c.sort_key())):
        if not cand.mask & taken:
            chosen.append(cand)
            taken |= cand.mask
    glue = 0
    for i, found in pieces.items():
        if any(p.label == "glue" for p in found):
            glue |= 1 << i
    claimed = taken | glue
    out = []
    seen = 0
    for start in bits(claimed):
        if (seen >> start) & 1:
            continue
        region, todo = 0, [start]
        while todo:
            i = todo.pop()
            if (region >> i) & 1:
                continue
            region |= 1 << i
            todo.extend(bits(graph.neighbours(1 << i) & claimed & ~region))
        seen |= region
        composites = tuple(sorted(((label, m) for c in chosen if c.mask & region for label, m in c.composites),
                                  key=lambda c: c[1]))
        if popcount(region & ~glue) > 1 and graph.is_convex(region):
            out.append(Candidate(toolchain, region, MAXIMAL, composites))
    return out


class PrimitiveRule(PartitionRule):
    """The sub-rule's candidates as partitions of the toolchain (outlined, ``Primitive=1``)."""

    def __init__(self, rule: PartitionRule):
        self.rule = rule
        self.name = f"primitive({rule.name})"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        return [Candidate(toolchain, c.mask, c.label, c.composites, c.host)
                for c in self.rule.candidates(graph, toolchain)]


class OnlyValidRule(PartitionRule):
    """Keeps candidates that are convex, within ``max_depth`` and whose composites have one output.

    Parameters
    ----------
    rule : PartitionRule
        The rule whose candidates to filter.
    max_depth : int
        Longest chain of operators allowed in one partition.
    allow_tuple_outputs : bool
        Whether a partition may read or export a tuple-typed value (TVM
        itself can; external codegens get flat tensors only).
    """

    def __init__(self, rule: PartitionRule, max_depth: int, allow_tuple_outputs: bool = True):
        self.rule = rule
        self.max_depth = max_depth
        self.allow_tuple_outputs = allow_tuple_outputs
        self.name = f"only_valid({rule.name})"

    def candidates(self, graph: IndexedGraph, toolchain: str) -> List[Candidate]:
        return [c for c in self.rule.candidates(graph, toolchain) if self.valid(graph, c)]

    def valid(self, graph: IndexedGraph, cand: Candidate) -> bool:
        if not cand.mask or cand.mask & ~graph.covered_mask:
            return False
        if not cand.host and cand.label not in (MAXIMAL, QUANTIZED) and graph.depth(cand.mask) > self.max_depth:
            return False
        if not graph.is_convex(cand.mask):
            return False
        for _, inner in cand.composites:
            if len(graph.outputs_of(inner)) != 1:
                return False
        if not self.allow_tuple_outputs:
            for i in graph.outputs_of(cand.mask) + graph.inputs_of(cand.mask):
                if graph.is_tuple_typed(i):
                    return False
        return True


def pattern_table_rule(table_name: str, entries: Iterable) -> PartitionRule:
    """The union of one composite rule per entry of a BYOC pattern table.

    ``entries`` holds ``(label, pattern)`` or ``(label, pattern, predicate)``
    tuples, as ``relay.op.contrib.get_pattern_table`` returns them.

    Examples
    --------
    >>> from tvm.relay.op.contrib import get_pattern_table
    >>> rule = pattern_table_rule("dnnl", get_pattern_table("dnnl"))
    >>> rule.name.startswith("union(composite(dnnl.")
    True
    """
    rules = []
    for entry in entries:
        label, pattern = entry[0], entry[1]
        predicate = entry[2] if len(entry) > 2 else None
        rules.append(CompositeRule(label, PatternRule(pattern, predicate, name=label)))
    if not rules:
        raise ValueError(f"pattern table {table_name!r} is empty")
    return UnionRule(rules)
