"""What Collage needs to know about a toolchain.

A :class:`Toolchain` names a way of running part of a model: TVM's own
lowering (``compiler`` is None) or a BYOC-style compiler reached through an
external codegen ``relay.ext.<compiler>``. It says where the toolchain's
partition rules come from (a pattern table, ``target.<name>`` operator
predicates, TVM's fusion kinds), how deep its partitions may be, and whether
it is available here (with the reason when it is not).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
from typing import Optional, Sequence, Tuple

import numpy as np

from ..._tvm import pool_size, tvm
from tvm import relay

from .. import rules



#: What TVM's ``FastMath`` rewrite turns into its approximation (exact op -> fast op); the
#: same table lowers fast-math partitions node by node inside ``main``
#: (:func:`~tvm_tcutils.collage.outline.partitioned_module`).
FAST_MATH_OPS = {"exp": "fast_exp", "erf": "fast_erf", "tanh": "fast_tanh", "nn.softmax": "nn.fast_softmax"}


def fast_math_nodes(graph, mask: int) -> int:
    """The nodes of ``mask`` whose operator has a fast-math form (a bitset over ``graph``'s indices)."""
    found = 0
    for i in range(mask.bit_length()):
        if mask >> i & 1 and graph.nodes[i].kind == "call" and graph.nodes[i].op_name in FAST_MATH_OPS:
            found |= 1 << i
    return found


#: Bumped when the package changes how a toolchain's code runs, so that costs cached before
#: (measured with the old code) are not reused: 2 = packed toolchains called through a raw C
#: callback (about 19 us less per call than TVM's generic Python callback); 3 = onnxruntime
#: runs with as many threads as TVM's pool unless told otherwise; 4 = TVM candidates are priced
#: without the layout transforms at their inputs and outputs (they cancel inside a TVM region);
#: 5 = TVM is timed with ``TVM_NUM_THREADS`` set (:func:`tvm_tcutils._tvm.settle_thread_count`);
#: 6 = TVM's int8 products run on AMX tiles where the host has them (the host target now names the
#: tile features a generic CPU model hid; ``TCUTILS_AMX`` in TVM's tags); 7 = a measuring worker
#: replaced after it grew (or died) is pinned to the core it frees (before, its successor ran on another
#: worker's core: the costs both timed then came out up to x2).
COST_REVISION = 7

#: The environment variable that turns the package's AMX tile kernels off (``dotprod.amx.ENV``; named
#: here, not imported: capabilities do not import each other).
TILES_ENV = "TCUTILS_AMX"

@dataclasses.dataclass(frozen=True)
class Toolchain:
    """A toolchain Collage can give partitions to.

    Parameters
    ----------
    name : str
        Short name used on the command line (``tvm``, ``ort``, ``dnnl``).
    compiler : str or None
        Value of the ``Compiler`` attribute of its partitions (its external
        codegen is ``relay.ext.<compiler>``); None for TVM itself.
    pattern_table : str, optional
        Name of the BYOC pattern table holding its patterns.
    patterns : tuple, optional
        Pattern-table entries given directly (``(label, pattern)`` or
        ``(label, pattern, predicate)``), for toolchains described in code.
    op_predicates : str, optional
        ``<name>`` of ``target.<name>`` operator predicates that claim single ops.
    fusion : bool
        Rules come from TVM's fusion kinds (TVM itself).
    combine : bool
        Graph-style toolchain: adjacent claimed pieces are combined into
        bigger partitions (up to ``max_depth``); library-style otherwise.
    max_depth : int
        Longest chain of operators in one partition.
    greedy_regions : bool
        Graph style only: also offer each maximal region of claimed operators
        (what BYOC's greedy partitioning makes), whatever its depth.
    requires : tuple of str
        Python modules that must be importable for the toolchain to work.
    description : str
        One line for listings.
    fast_math : bool
        TVM only: its operators are lowered with TVM's ``FastMath`` rewrite
        (``exp``, ``erf``, ``tanh`` and ``nn.softmax`` as TVM's fast
        approximations, what ``relay.build`` does at ``opt_level=4``); see
        :meth:`rewrite`.
    precision : str
        What its partitions compute in, for reports (``"f32"``, ``"bf16"``,
        ``"f32 fast math"``).
    exact : str or None
        For a faster, less precise mode of another toolchain: that
        toolchain's name (``openvino-bf16`` -> ``openvino``). Collage places
        such a toolchain per partition under the user's error budget
        (:mod:`~tvm_tcutils.collage.precision`).
    runs_onnx_file : bool
        It can run a whole ONNX file as one partition: the final comparison then also times it on the
        user's own file (``partition(..., original=path)``), as the user would run it.

    Examples
    --------
    >>> tc = Toolchain("dnnl", "dnnl", pattern_table="dnnl")
    >>> tc.is_tvm
    False
    """

    name: str
    compiler: Optional[str]
    pattern_table: Optional[str] = None
    patterns: Optional[Tuple] = None
    op_predicates: Optional[str] = None
    fusion: bool = False
    combine: bool = False
    max_depth: int = 4
    greedy_regions: bool = True
    requires: Tuple[str, ...] = ()
    description: str = ""
    fast_math: bool = False
    precision: str = "f32"
    exact: Optional[str] = None
    runs_onnx_file: bool = False

    @property
    def is_tvm(self) -> bool:
        """Whether this is TVM's own lowering (partitions stay in ``main``)."""
        return self.compiler is None

    def rewrite(self, mod: tvm.IRModule) -> tvm.IRModule:
        """``mod`` as this toolchain lowers its TVM part: with ``FastMath`` when ``fast_math``.

        Applied to every TVM candidate before it is measured and to the
        partitioned module Collage returns, so that a later ``relay.build`` at
        ``opt_level=3`` builds the code that was costed. Functions of other
        toolchains (``Compiler`` attribute) are left as they are.

        Examples
        --------
        >>> x = relay.var("x", shape=(8,))
        >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.erf(x)))
        >>> "fast_erf" in str(Toolchain("tvm-fastmath", None, fast_math=True).rewrite(mod)["main"])
        True
        """
        if not (self.is_tvm and self.fast_math):
            return mod
        return relay.transform.FastMath()(mod)

    @property
    def lossy(self) -> bool:
        """Whether this is a less precise mode of another toolchain (see ``exact``)."""
        return self.exact is not None

    def changes(self, graph, mask: int) -> bool:
        """Whether this toolchain computes the nodes ``mask`` of ``graph`` differently from its exact twin.

        A fast-math TVM toolchain changes only candidates holding an operator of
        :data:`FAST_MATH_OPS`; elsewhere it is TVM itself (so, beside ``tvm`` in one
        search, it offers just those). Every other toolchain changes what it runs.

        Examples
        --------
        >>> from tvm_tcutils.collage.subgraph import IndexedGraph
        >>> x = relay.var("x", shape=(8,))
        >>> g = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
        ...     relay.Function([x], relay.nn.relu(relay.exp(x)))))["main"])
        >>> fast = Toolchain("tvm-fastmath", None, fast_math=True)
        >>> fast.changes(g, 0b010), fast.changes(g, 0b100)
        (True, False)
        """
        if not (self.is_tvm and self.fast_math):
            return True
        return bool(fast_math_nodes(graph, mask))

    def availability(self) -> Tuple[bool, str]:
        """``(True, "")`` when usable for the search, else ``(False, reason)``.

        Examples
        --------
        >>> Toolchain("x", "x", requires=("no_such_module_xyz",)).availability()
        (False, 'needs the Python module no_such_module_xyz')
        """
        for module in self.requires:
            if importlib.util.find_spec(module) is None:
                return False, f"needs the Python module {module}"
        if self.is_tvm:
            return True, ""
        if self.pattern_table and relay.op.contrib.get_pattern_table(self.pattern_table) is None:
            return False, f"no pattern table {self.pattern_table!r} is registered"
        if not (self.pattern_table or self.patterns or self.op_predicates):
            return False, "has no source of partition rules"
        return True, ""

    def buildable(self) -> bool:
        """Whether partitions can be built here (TVM, or ``relay.ext.<compiler>`` registered)."""
        if self.is_tvm:
            return True
        return tvm.get_global_func(f"relay.ext.{self.compiler}", allow_missing=True) is not None

    def rule(self) -> rules.PartitionRule:
        """The toolchain's partition rule, composed from its sources.

        Examples
        --------
        >>> Toolchain("dnnl", "dnnl", pattern_table="dnnl").rule().name.startswith("only_valid(primitive(")
        True
        """
        if self.is_tvm:
            source = rules.UnionRule([rules.FusionKindRule(self.max_depth), rules.QuantizedRegionRule(),
                                      rules.HostGlueRule()])
            return rules.OnlyValidRule(source, self.max_depth)
        sources = []
        if self.pattern_table:
            entries = relay.op.contrib.get_pattern_table(self.pattern_table) or []
            sources.append(rules.pattern_table_rule(self.pattern_table, entries))
        if self.patterns:
            sources.append(rules.pattern_table_rule(self.name, self.patterns))
        if self.op_predicates:
            sources.append(rules.OpPredicateRule(self.op_predicates))
        if not sources:
            raise ValueError(f"toolchain {self.name!r} has no source of partition rules")
        rule: rules.PartitionRule = sources[0] if len(sources) == 1 else rules.UnionRule(sources)
        if self.combine:
            rule = rules.CombineRule(rule, self.max_depth, maximal=self.greedy_regions)
        return rules.OnlyValidRule(rules.PrimitiveRule(rule), self.max_depth, allow_tuple_outputs=False)

    def cache_tag(self) -> str:
        """Identifies the toolchain's version in cost-cache keys."""
        versions = []
        for module in self.requires:
            try:
                versions.append(f"{module}-{importlib.import_module(module).__version__}")
            except (ImportError, AttributeError):  # not installed, or a module without a version
                versions.append(module)
        if self.is_tvm:  # the same target builds tile or vector kernels as the environment says
            versions += [f"{TILES_ENV}={os.environ[TILES_ENV]}"] if os.environ.get(TILES_ENV) else []
        return "/".join([self.name, self.compiler or "tvm", tvm.__version__, f"r{COST_REVISION}", *versions,
                         _thread_settings()])


#: The environment variables that set a toolchain's thread budget (else: TVM's pool size).
THREAD_VARIABLES = ("TVM_TCUTILS_ORT_THREADS", "TVM_TCUTILS_OPENVINO_THREADS", "TVM_TCUTILS_BLAS_THREADS")


def thread_budget(variable: str) -> int:
    """A runtime's threads: the positive integer in environment variable ``variable``, else TVM's pool size.

    One thread budget for the whole model: TVM's default pool can be smaller than
    another runtime's default (TVM takes one thread on a 2-vCPU VM where onnxruntime
    takes two), and toolchains costed with different budgets would be compared unfairly.

    Examples
    --------
    >>> import os
    >>> os.environ["TCUTILS_EXAMPLE_THREADS"] = "3"; thread_budget("TCUTILS_EXAMPLE_THREADS")
    3
    >>> os.environ["TCUTILS_EXAMPLE_THREADS"] = "many"; thread_budget("TCUTILS_EXAMPLE_THREADS")
    Traceback (most recent call last):
    ...
    ValueError: TCUTILS_EXAMPLE_THREADS must be a positive integer, got 'many'
    >>> del os.environ["TCUTILS_EXAMPLE_THREADS"]; thread_budget("TCUTILS_EXAMPLE_THREADS") >= 1
    True
    """
    value = os.environ.get(variable, "")
    if value:
        if not value.isdigit() or int(value) < 1:
            raise ValueError(f"{variable} must be a positive integer, got {value!r}")
        return int(value)
    return pool_size()


def _thread_settings() -> str:
    """The thread budgets a measured cost depends on (TVM's pool, what the toolchains read, and
    whether their calls park TVM's pool)."""
    from .packed_call import parking

    pool = pool_size()
    extra = [f"{name}={os.environ[name]}" for name in THREAD_VARIABLES if os.environ.get(name)]
    return ",".join([f"threads={pool}", *extra, parking()])


def relative_error(got: Sequence[np.ndarray], want: Sequence[np.ndarray]) -> float:
    """The largest ``||got - want|| / ||want||`` over a model's outputs (2-norms over all elements).

    An output whose reference is all zeros counts its absolute norm.

    Examples
    --------
    >>> want = [np.array([3.0, 4.0]), np.zeros(2)]
    >>> relative_error([np.array([3.0, 4.5]), np.zeros(2)], want)
    0.1
    """
    if len(got) != len(want):
        raise ValueError(f"relative_error: {len(got)} outputs against {len(want)}")
    worst = 0.0
    for a, b in zip(got, want):
        a, b = np.asarray(a, dtype="float64"), np.asarray(b, dtype="float64")
        if a.shape != b.shape:
            raise ValueError(f"relative_error: output of shape {a.shape} against {b.shape}")
        norm = float(np.linalg.norm(b))
        worst = max(worst, float(np.linalg.norm(a - b)) / (norm if norm > 0 else 1.0))
    return round(worst, 12)
