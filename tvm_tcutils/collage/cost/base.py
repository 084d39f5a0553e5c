"""The cost-estimator interface and what it is asked about."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import List, Optional, Sequence

from ..._tvm import tvm
from tvm import relay

from ..candidates import Candidate
from ..outline import candidate_module, extract
from ..subgraph import IndexedGraph, shape_signature


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

    @property
    def module(self) -> tvm.IRModule:
        """The candidate alone, as an IRModule built the toolchain's way."""
        if self._module is None:
            self._module = candidate_module(self.graph, self.candidate, self.toolchain.compiler)
        return self._module

    @property
    def key(self) -> str:
        """Cache key: structure (constants by shape only), input shapes and toolchain version.

        Candidates with the same local signature (the same subgraph elsewhere in
        the model) share it: it is computed once per signature and toolchain.
        """
        if self._key is None:
            memo_key = (self.graph.local_signature(self.candidate.mask, self.candidate.composites),
                        self.toolchain.cache_tag())
            self._key = self.graph.key_memo.get(memo_key)
            if self._key is None:
                self._key = self.graph.key_memo[memo_key] = self.full_key()
        return self._key

    def full_key(self) -> str:
        """:attr:`key` computed from the extracted function itself (no memo)."""
        func, _, _ = extract(self.graph, self.candidate.mask, self.candidate.composites,
                             constants_as_params=True)
        func = relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"]
        digest = {
            "hash": int(tvm.ir.structural_hash(func, map_free_vars=True)) & (2**64 - 1),
            "text": hashlib.sha1(func.astext(show_meta_data=False).encode()).hexdigest(),
            "shapes": shape_signature(func),
            "toolchain": self.toolchain.cache_tag(),
            "composites": [label for label, _ in self.candidate.composites],
        }
        return hashlib.sha256(json.dumps(digest, sort_keys=True).encode()).hexdigest()

    @property
    def ops(self) -> List[str]:
        """Operator names of the candidate, in dataflow order."""
        return self.graph.op_names(self.candidate.mask)


class CostEstimator:
    """Base class of cost estimators (costs in milliseconds)."""

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        """One cost per request (``inf``: the candidate cannot be used)."""
        raise NotImplementedError

    def search(self, graph, candidates, toolchains):
        """Estimators that interleave estimating and searching return ``(SearchResult, costs)``.

        The default (None) lets the driver estimate every candidate once with
        :meth:`estimate` and search after.
        """
        return None

    def measure_whole(self, mod: tvm.IRModule) -> Optional[float]:
        """End-to-end latency (ms) of a whole partitioned module, or None if this estimator does not time."""
        return None

    def measure_wholes(self, mods: Sequence[tvm.IRModule], rounds: int = 5) -> Optional[List[float]]:
        """Latencies (ms) of several whole modules timed side by side (round-robin), or None.

        Timed in turns, so that a drift of the machine's load during the
        timing affects them all alike.
        """
        return None

    def close(self) -> None:
        """Release worker processes or files (no-op by default)."""
