"""The toolchains' section of the demo (see :mod:`tvm_tcutils.demo`)."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from ..._tvm import tvm
from ...demo import build_and_time, count_ops


def toolchains_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Toolchains: the model given to ONNX Runtime as a BYOC compiler (greedy partition)."""
    from . import blas, ort

    ok, reason = ort.available()
    lines = [f"tcutils_ort: {reason}; tcutils_blas: {blas.available()[1]}"]
    if not ok:
        return lines + ["ONNX Runtime toolchain skipped"]
    parted = ort.partition_for(mod, params)
    functions = [f for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs]
    ops = sum(count_ops(mod["main"]).values())
    claimed = sum(sum(count_ops(f).values()) for f in functions)
    outputs, build_s, ort_ms = build_and_time(parted, {})
    finite = all(np.isfinite(out).all() for out in outputs)
    return lines + [
        f"{claimed} of {ops} operator calls in {len(functions)} ONNX Runtime partition(s); build {build_s:.1f} s",
        f"latency {ort_ms:.2f} ms (median; TVM alone: see the baseline), outputs finite: {finite}",
    ]
