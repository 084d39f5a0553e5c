"""Collage's sections of the demo (see :mod:`tvm_tcutils.demo`): the toolchains, then the partitioner.

Both time through :func:`tvm_tcutils.measure.build_and_time`, like the rest
of the demo; this module imports no other capability and not the demo itself.
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .._tvm import tvm
from ..measure import build_and_time
from tvm import relay


def op_calls(func: relay.Function) -> int:
    """How many calls to primitive operators ``func`` makes (composite bodies included).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> op_calls(load_model("mlp")[0]["main"]) > 3
    True
    """
    calls = []
    relay.analysis.post_order_visit(
        func, lambda node: calls.append(1) if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op)
        else None)
    return len(calls)


def toolchains_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Toolchains: the model given to ONNX Runtime as a BYOC compiler (greedy partition).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> toolchains_section("mlp", *load_model("mlp"))[0].startswith("tcutils_ort: ")
    True
    """
    from .toolchains import blas, ort

    ok, reason = ort.available()
    lines = [f"tcutils_ort: {reason}; tcutils_blas: {blas.available()[1]}"]
    if not ok:
        return lines + ["ONNX Runtime toolchain skipped"]
    parted = ort.partition_for(mod, params)
    functions = [f for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs]
    ops = op_calls(mod["main"])
    claimed = sum(op_calls(f) for f in functions)
    outputs, build_s, ort_ms = build_and_time(parted, {})
    finite = all(np.isfinite(out).all() for out in outputs)
    return lines + [
        f"{claimed} of {ops} operator calls in {len(functions)} ONNX Runtime partition(s); build {build_s:.1f} s",
        f"latency {ort_ms:.2f} ms (median; TVM alone: see the baseline), outputs finite: {finite}",
    ]


def collage_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Collage: measured partitioning across the installed toolchains (on the MLP: measuring a CNN takes minutes).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> collage_section("mlp", *load_model("mlp"))[-1].startswith("estimated ")  # doctest: +SKIP
    True
    """
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
