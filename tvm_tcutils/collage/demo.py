"""The Collage section of the demo (see :mod:`tvm_tcutils.demo`)."""
from __future__ import annotations

from typing import Dict, List

from .._tvm import tvm
from ..demo import build_and_time


def collage_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Collage: measured partitioning across the installed toolchains (on the MLP: measuring a CNN takes minutes)."""
    from .. import collage
    from ..models import load_model
    from .report import partition_table

    toolchains = collage.resolve(None)
    small, small_params = load_model("mlp")
    estimator = collage.MeasuredCostEstimator(repeat=3, progress=False)
    try:
        result = collage.partition(small, small_params, toolchains, estimator)
    finally:
        estimator.close()
    _, _, measured = build_and_time(result.mod, {})
    lines = [
        f"toolchains: {', '.join(tc.name for tc in toolchains)}; {result.candidates} candidates "
        f"({estimator.stats['measured']} measured, {estimator.stats['cached']} from the cache), "
        f"search {result.seconds['search'] * 1e3:.1f} ms",
        *partition_table(result),
        f"estimated {result.estimated_ms:.3f} ms (TVM alone {result.single_toolchain_ms['tvm']:.3f} ms), "
        f"measured {measured:.3f} ms",
    ]
    return lines
