"""Candidate partitions: a set of nodes that one toolchain would run as one unit.

Each toolchain's partition rule (see :mod:`.rules`) is applied once to the
indexed graph; :func:`enumerate_candidates` collects the results of all
toolchains, removes duplicates and orders them deterministically, so that the
search (:mod:`.search`) and every cost estimator see the same list.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Dict, List, Optional, Sequence, Tuple

from .subgraph import IndexedGraph, popcount

logger = logging.getLogger("tvm_tcutils.collage")


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate partition.

    Attributes
    ----------
    toolchain : str
        Name of the toolchain that would run it (``"tvm"`` for TVM itself).
    mask : int
        Its nodes, as a bitset over :class:`~.subgraph.IndexedGraph` indices.
    label : str
        Which rule made it (for example ``"dnnl.conv2d_relu"`` or ``"tvm.fused"``).
    composites : tuple of (str, int)
        Sub-sets wrapped as composite functions (``Composite=<label>``) inside
        the partition, as BYOC's ``MergeComposite`` makes them.
    host : bool
        Glue (tuples, projections) left in ``main`` at no cost.
    """

    toolchain: str
    mask: int
    label: str
    composites: Tuple[Tuple[str, int], ...] = ()
    host: bool = False

    @property
    def first(self) -> int:
        """Lowest node index (the search uses candidates at their first node)."""
        return (self.mask & -self.mask).bit_length() - 1

    def sort_key(self) -> Tuple:
        """Order of candidates (and so of ties in the search): by first node and size, and for
        the same nodes the form with the most composite functions first (what BYOC codegens expect)."""
        comp_nodes = sum(popcount(m) for _, m in self.composites)
        return (self.first, popcount(self.mask), self.mask, self.toolchain, -comp_nodes, self.label,
                self.composites)


def lowering_toolchain(toolchains: Sequence) -> Optional[object]:
    """The TVM toolchain that lowers ``main`` among ``toolchains``: the exact one, else any TVM one, else ``None``.

    (Here, below the toolchains in the import order, so the enumeration and
    :func:`~.toolchains.tvm_toolchain` share one rule.)

    Examples
    --------
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> [lowering_toolchain(resolve(names)).name for names in ("tvm,tvm-fastmath", "tvm-fastmath")]
    ['tvm', 'tvm-fastmath']
    """
    tvms = [tc for tc in toolchains if tc.is_tvm]
    return next((tc for tc in tvms if not getattr(tc, "lossy", False)), tvms[0] if tvms else None)


def enumerate_candidates(graph: IndexedGraph, toolchains: Sequence) -> List[Candidate]:
    """All candidates of all ``toolchains`` on ``graph``, each rule applied once.

    Parameters
    ----------
    graph : IndexedGraph
        The model's ``main`` function.
    toolchains : sequence of Toolchain
        Toolchains whose rules to apply (see :mod:`.toolchains`).

    Returns
    -------
    list of Candidate
        Without duplicates (same toolchain, nodes and composites), in the
        order of :meth:`Candidate.sort_key`.

    Examples
    --------
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> from tvm_tcutils.models import load_model
    >>> mod, _ = load_model("mlp")
    >>> cands = enumerate_candidates(IndexedGraph(mod["main"]), resolve(["tvm"]))
    >>> all(c.toolchain == "tvm" for c in cands)
    True
    """
    found: Dict[Tuple, Candidate] = {}
    # A second TVM toolchain (a fast-math mode beside the TVM that lowers main) offers only the
    # candidates it computes differently: elsewhere it is the same code at the same cost.
    lowering = lowering_toolchain(toolchains)
    for toolchain in toolchains:
        rule = toolchain.rule()
        produced = rule.candidates(graph, toolchain.name)
        if toolchain.is_tvm and lowering is not None and toolchain is not lowering:
            produced = [c for c in produced if not c.host and toolchain.changes(graph, c.mask)]
        logger.info("rule %s: %d candidates", rule.name, len(produced))
        for cand in produced:
            found.setdefault((cand.toolchain, cand.mask, cand.composites, cand.host), cand)
    return sorted(found.values(), key=Candidate.sort_key)
