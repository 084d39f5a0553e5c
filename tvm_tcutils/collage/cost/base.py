"""The cost-estimator interface and what it is asked about."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Dict, Iterable, List, Optional, Sequence

from ..._tvm import tvm

from ..candidates import Candidate
from ..outline import candidate_module
from ..subgraph import IndexedGraph


@dataclasses.dataclass
class CostRequest:
    """One candidate to estimate: the candidate, its graph and its toolchain.

    The stand-alone module and the cache key are computed on first use.
    """

    graph: IndexedGraph
    candidate: Candidate
    toolchain: "object"  # a toolchains.base.Toolchain (not imported to keep layers apart)
    _module: Optional[tvm.IRModule] = None
    _key: Optional[str] = None
    #: The toolchain's :meth:`cache_tag`, when the caller computed it once for many requests.
    tag: Optional[str] = None

    @property
    def module(self) -> tvm.IRModule:
        """The candidate alone, as an IRModule built the toolchain's way."""
        if self._module is None:
            self._module = self.toolchain.rewrite(
                candidate_module(self.graph, self.candidate, self.toolchain.compiler))
        return self._module

    def release(self) -> None:
        """Drop the stand-alone module (computed again if asked for): sent to a worker, it is not needed here.

        Examples
        --------
        >>> req = CostRequest(None, None, None, _module="m"); req.release(); req._module is None
        True
        """
        self._module = None

    @property
    def key(self) -> str:
        """Cache key: structure (constants by shape only), input shapes and toolchain version.

        Made from the candidate's local signature (see
        :meth:`~..subgraph.IndexedGraph.local_signature`), which describes its
        stand-alone function completely -- operators, attributes, types, wiring,
        outside inputs (constants by type), outputs, composites -- so the key
        needs no extraction: tens of thousands of candidates (Inception-v3) are
        keyed in seconds. The same subgraph in another model gets the same key.
        """
        if self._key is None:
            signature = self.graph.local_signature(self.candidate.mask, self.candidate.composites)
            tag = self.tag if self.tag is not None else self.toolchain.cache_tag()
            digest = {"scheme": 2, "structure": repr(signature), "toolchain": tag}
            self._key = hashlib.sha256(json.dumps(digest, sort_keys=True).encode()).hexdigest()
        return self._key

    @property
    def ops(self) -> List[str]:
        """Operator names of the candidate, in dataflow order."""
        return self.graph.op_names(self.candidate.mask)


def cost_requests(graph: IndexedGraph, cands: Sequence[Candidate], indices: Sequence[int],
                  toolchains: Dict[str, "object"]) -> List[CostRequest]:
    """Requests for ``cands[k]`` for each ``k`` in ``indices``, each toolchain's cache tag computed once.

    The tag reads module versions, TVM's thread count and the environment; per candidate that was
    tens of thousands of lookups on Inception-v3.

    Examples
    --------
    >>> cost_requests(None, [], [], {})
    []
    """
    tags: Dict[str, str] = {}
    out = []
    for k in indices:
        toolchain = toolchains[cands[k].toolchain]
        if toolchain.name not in tags:
            tags[toolchain.name] = toolchain.cache_tag()
        out.append(CostRequest(graph, cands[k], toolchain, tag=tags[toolchain.name]))
    return out


class CostEstimator:
    """Base class of cost estimators (costs in milliseconds).

    Examples
    --------
    >>> class Flat(CostEstimator):
    ...     def estimate(self, requests):
    ...         return [1.0] * len(requests)
    >>> Flat().estimate([]), Flat().whole_model_timer()
    ([], None)
    """

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        """One cost per request (``inf``: the candidate cannot be used)."""
        raise NotImplementedError

    def search(self, graph, candidates, toolchains, deadline=None):
        """Estimators that interleave estimating and searching return ``(SearchResult, costs)``.

        The default (None) lets the driver estimate every candidate once with
        :meth:`estimate` and search after. ``deadline`` (a ``time.perf_counter()``
        value, from the driver's time budget) is when such an estimator should
        return its best answer so far.
        """
        return None

    def whole_model_timer(self):
        """What times whole partitioned modules when the driver validates a partitioning, or None.

        None (the default): costs are not times on this machine (a table, a
        model), so the sum of candidate costs is trusted. Measuring estimators
        return a :class:`~tvm_tcutils.collage.validate.WholeModelTimer` with
        their own target and settings.
        """
        return None

    def crossing_ms_per_kb(self, keys: Optional[Iterable[str]] = None) -> float:
        """What a crossing between TVM and another toolchain costs per kilobyte at the border, in ms,
        from the candidates ``keys`` (requests' :attr:`CostRequest.key`; None: all it has seen).

        TVM runs convolutions in blocked layouts (NCHWc): a tensor passed to or
        from another toolchain is transformed to or from NCHW on TVM's side,
        which no candidate's cost holds. 0 (the default): not known; the
        driver's validation learns crossings from whole models instead.
        """
        return 0.0

    def close(self) -> None:
        """Release worker processes or files (no-op by default)."""
