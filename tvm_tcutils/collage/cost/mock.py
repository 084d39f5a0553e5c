"""A deterministic cost table, for tests and for searching toolchains that cannot be built here."""
from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Union

from .base import CostEstimator, CostRequest


class MockCostEstimator(CostEstimator):
    """Costs from a table: a per-partition overhead plus a cost per operator.

    Parameters
    ----------
    costs : mapping of toolchain name to (float or mapping of op name to float)
        Per-operator cost (ms) of each toolchain: one number for every
        operator, or a table by operator name where ``"*"`` is the default
        (missing with no default: the candidate is unusable, ``inf``).
    overhead : mapping of toolchain name to float, optional
        Cost added once per partition (the price of crossing to a toolchain).

    Examples
    --------
    >>> est = MockCostEstimator({"tvm": {"nn.dense": 2.0, "*": 0.5}}, overhead={"tvm": 0.1})
    >>> est.cost_of("tvm", ["nn.dense", "add"])
    2.6
    """

    def __init__(self, costs: Mapping[str, Union[float, Mapping[str, float]]],
                 overhead: Optional[Mapping[str, float]] = None):
        if not isinstance(costs, Mapping):
            raise TypeError(f"costs must be a mapping of toolchain name to costs, got {type(costs).__name__}")
        self.costs: Dict = {k: (dict(v) if isinstance(v, Mapping) else float(v)) for k, v in costs.items()}
        self.overhead = dict(overhead or {})
        self.calls = 0

    def cost_of(self, toolchain: str, ops: Sequence[str]) -> float:
        """Cost of running ``ops`` as one partition of ``toolchain``."""
        table = self.costs.get(toolchain)
        if table is None:
            return math.inf
        total = self.overhead.get(toolchain, 0.0)
        for op in ops:
            total += table if isinstance(table, float) else table.get(op, table.get("*", math.inf))
        return round(total, 9)

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        self.calls += len(requests)
        return [self.cost_of(r.toolchain.name, r.ops) for r in requests]
