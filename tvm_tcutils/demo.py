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


def _tensorcore(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Tensor cores: int4/int8 HWNC layers on WMMA kernels for cuda -arch=sm_80 (strategy and AutoTVM)"""
    from tvm import autotvm

    from .strategy import tensorcore

    lines = []
    batch = 8  # the smallest batch every int4/int8 WMMA shape tiles
    try:
        func = mod["main"]
        data = func.params[0]
        shape = [int(v) for v in data.checked_type.shape]
        new_data = relay.var(data.name_hint, shape=[batch] + shape[1:], dtype=data.checked_type.dtype)
        body = relay.bind(func.body, {data: new_data})
        mod = relay.transform.InferType()(
            tvm.IRModule.from_expr(relay.Function([new_data] + list(func.params[1:]), body))
        )
        lines.append(f"{name} re-batched from {shape[0]} to {batch}")
    except Exception as err:  # models with a hard-coded batch keep theirs
        lines.append(f"{name} keeps its batch ({type(err).__name__}); layers that do not fit go to NHWC")
    for dtype in ("int4", "int8"):
        # TVM's own preparation passes (apache/tvm#6748); the first layer stays float NCHW.
        with relay.transform.LayoutConfig(skip_layers=[0]):
            with tvm.transform.PassContext(opt_level=3):
                hwnc = relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)
        hwnc = relay.transform.recast(hwnc, dtype, "int32", skip_layers=[0])
        rows = tensorcore.implementations(hwnc, "cuda -arch=sm_80", ops=("nn.conv2d",))
        ours = [row for row in rows if row[3] == tensorcore.CONV2D_IMPL]
        others = sorted({row[3] for row in rows if row[3] != tensorcore.CONV2D_IMPL})
        workloads = {row[4] for row in ours}
        sizes = [len(autotvm.task.create(w[0], w[1:], "cuda -arch=sm_80").config_space) for w in workloads]
        lines.append(
            f"{dtype}: {len(ours)}/{len(rows)} conv2d layers on {tensorcore.CONV2D_IMPL}, others on "
            f"{', '.join(others) or '-'}; {len(workloads)} AutoTVM tasks, config spaces "
            f"{min(sizes, default=0)}-{max(sizes, default=0)}"
        )
    return lines


#: Demo sections, in the order they run. Capabilities append theirs.
SECTIONS: List[Section] = [_baseline, _tensorcore]


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
