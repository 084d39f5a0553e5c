"""Cost estimators: how long a candidate partition runs on its toolchain (milliseconds).

Every estimator takes a list of :class:`CostRequest` and returns one cost per
request; ``inf`` marks a candidate that cannot be used (it failed to build or
run). Estimators:

* :class:`~.mock.MockCostEstimator`: a table of per-operator costs (tests);
* :class:`~.custom.CustomCostEstimator`: any callable on (module, toolchain);
* :class:`~.measured.MeasuredCostEstimator`: build and time each candidate in
  worker processes (:mod:`.workers`), with a persistent on-disk cache
  (:mod:`.store`);
* :class:`~.staged.StagedCostEstimator` (the default): measure each operator
  alone, estimate joint candidates from their parts, measure what the search picks;
* :class:`~.learned.XGBoostCostEstimator`: measure some, predict the rest.

Estimators only estimate; the driver validates a chosen partitioning whole
(:mod:`tvm_tcutils.collage.validate`) with the timer an estimator offers
(:meth:`CostEstimator.whole_model_timer`).
"""
from __future__ import annotations

from .base import CostEstimator, CostRequest
from .custom import CustomCostEstimator
from .mock import MockCostEstimator

__all__ = ["CostEstimator", "CostRequest", "CustomCostEstimator", "MockCostEstimator",
           "MeasuredCostEstimator", "StagedCostEstimator", "XGBoostCostEstimator"]


def __getattr__(name):
    # The measuring estimators pull in multiprocessing and xgboost: load them on first use.
    if name == "MeasuredCostEstimator":
        from .measured import MeasuredCostEstimator

        return MeasuredCostEstimator
    if name == "StagedCostEstimator":
        from .staged import StagedCostEstimator

        return StagedCostEstimator
    if name == "XGBoostCostEstimator":
        from .learned import XGBoostCostEstimator

        return XGBoostCostEstimator
    raise AttributeError(name)
