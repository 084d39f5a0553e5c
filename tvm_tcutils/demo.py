"""The demo: each capability contributes one section, run in order on one model.

A section is a function ``(name, mod, params) -> list of report lines``;
capabilities add theirs to :data:`SECTIONS`.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import numpy as np

from ._tvm import tvm
from tvm import relay
from tvm.contrib import graph_executor

from .models import random_inputs

Section = Callable[[str, tvm.IRModule, Dict], List[str]]


def build_and_time(mod: tvm.IRModule, params: Dict, target: str = "llvm", repeat: int = 5):
    """Build ``mod`` for ``target``, run it on random inputs and time it.

    Returns
    -------
    (outputs, build_seconds, median_ms)

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> outs, build_s, ms = build_and_time(mod, params)
    >>> outs[0].shape
    (1, 10)
    """
    start = time.perf_counter()
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    build_seconds = time.perf_counter() - start
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**random_inputs(mod, params))
    runner.run()
    outputs = [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]
    timer = runner.module.time_evaluator("run", tvm.cpu(), number=1, repeat=repeat)
    return outputs, build_seconds, float(np.median(timer().results) * 1e3)


def _baseline(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Baseline: the model as TVM alone compiles it for the CPU."""
    ops: Dict[str, int] = {}

    def count(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ops[node.op.name] = ops.get(node.op.name, 0) + 1

    relay.analysis.post_order_visit(mod["main"], count)
    top = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:4])
    outputs, build_s, ms = build_and_time(mod, params)
    finite = all(np.isfinite(out).all() for out in outputs)
    return [
        f"{name}: {sum(ops.values())} operator calls ({top}, ...)",
        f"TVM llvm build {build_s:.1f} s, latency {ms:.2f} ms (median), outputs finite: {finite}",
    ]


def _collage(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Collage: measured partitioning across the installed toolchains (on the MLP: measuring a CNN takes minutes)."""
    from . import collage
    from .collage.report import partition_table
    from .models import load_model

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


#: Demo sections, in the order they run. Capabilities append theirs.
SECTIONS: List[Section] = [_baseline, _collage]


def run_demo(name: str, mod: tvm.IRModule, params: Dict) -> int:
    """Run every section of :data:`SECTIONS` and print the report.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> run_demo("mlp", *load_model("mlp"))  # doctest: +SKIP
    0
    """
    print(f"tvm-tcutils demo on {name}")
    for section in SECTIONS:
        title = (section.__doc__ or section.__name__).strip().splitlines()[0].lstrip("_")
        print(f"== {title}")
        for line in section(name, mod, params):
            print(f"   {line}")
    return 0
