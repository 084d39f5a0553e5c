"""Costs from any Python callable on (candidate module, toolchain name)."""
from __future__ import annotations

import logging
import math
from typing import Callable, List, Sequence

from ..._tvm import tvm
from .base import CostEstimator, CostRequest

logger = logging.getLogger("tvm_tcutils.collage")


class CustomCostEstimator(CostEstimator):
    """Costs computed by ``fn(module, toolchain_name) -> float`` (milliseconds).

    ``module`` is the candidate alone (see
    :func:`~tvm_tcutils.collage.outline.candidate_module`). An exception or a
    non-finite, negative result makes the candidate unusable (``inf``) and is
    logged.

    Examples
    --------
    >>> est = CustomCostEstimator(lambda mod, tc: 1.0 if tc == "tvm" else 2.0)
    """

    def __init__(self, fn: Callable[[tvm.IRModule, str], float]):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        self.fn = fn

    def estimate(self, requests: Sequence[CostRequest]) -> List[float]:
        out = []
        for req in requests:
            try:
                cost = float(self.fn(req.module, req.toolchain.name))
            except Exception as err:  # noqa: BLE001  (the user's function: its failure costs the candidate, as documented)
                logger.warning("custom cost of %s on %s failed: %s", req.ops, req.toolchain.name, err)
                cost = math.inf
            out.append(cost if cost >= 0 else math.inf)
        return out
