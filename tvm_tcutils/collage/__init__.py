"""Collage: cost-driven partitioning of a Relay model across TVM and other toolchains.

The flow: rules (:mod:`.rules`, from pattern tables, operator predicates and
TVM's fusion kinds) -> candidates (:mod:`.candidates`) -> costs
(:mod:`.cost`) -> search (:mod:`.search`, shortest path over covered nodes)
-> validation, whole models timed (:mod:`.validate`) -> partitioned IRModule
(:mod:`.outline`, :mod:`.driver`) -> any Relay executor builds it.

Example
-------
>>> from tvm_tcutils import collage, load_model
>>> mod, params = load_model("mlp")
>>> result = collage.partition(mod, params, toolchains="tvm",
...                            cost_estimator=collage.MockCostEstimator({"tvm": 1.0}))
>>> lib = collage.build_partitioned(result.mod)
"""
from __future__ import annotations

from .cost import CostEstimator, CustomCostEstimator, MockCostEstimator  # noqa: F401
from .driver import (  # noqa: F401
    CollagePartitioner, CollageResult, Partition, ProgressUpdate, build, build_partitioned, partition, prepare,
)
from .toolchains import Toolchain, available, resolve, tvm_toolchain  # noqa: F401
from .validate import FinalAnswer, final_answer, final_comparison  # noqa: F401


def __getattr__(name):
    if name in ("MeasuredCostEstimator", "StagedCostEstimator", "XGBoostCostEstimator"):
        from . import cost

        return getattr(cost, name)
    raise AttributeError(name)
