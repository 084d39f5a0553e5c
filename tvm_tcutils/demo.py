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


def _toolchains(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Toolchains: the model given to ONNX Runtime as a BYOC compiler (greedy partition)."""
    from .collage.toolchains import blas, ort

    ok, reason = ort.available()
    lines = [f"tcutils_ort: {reason}; tcutils_blas: {blas.available()[1]}"]
    if not ok:
        return lines + ["ONNX Runtime toolchain skipped"]
    parted = ort.partition_for(mod, params)
    functions = [f for _, f in parted.functions.items() if f.attrs is not None and "Compiler" in f.attrs]
    ops, claimed = _count_ops(mod["main"]), sum(_count_ops(f) for f in functions)
    outputs, build_s, ort_ms = build_and_time(parted, {})
    finite = all(np.isfinite(out).all() for out in outputs)
    return lines + [
        f"{claimed} of {ops} operator calls in {len(functions)} ONNX Runtime partition(s); build {build_s:.1f} s",
        f"latency {ort_ms:.2f} ms (median; TVM alone: see the baseline), outputs finite: {finite}",
    ]


def _count_ops(func) -> int:
    count = [0]

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            count[0] += 1

    relay.analysis.post_order_visit(func, visit)
    return count[0]


#: Demo sections, in the order they run. Capabilities append theirs.
SECTIONS: List[Section] = [_baseline, _toolchains]


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
