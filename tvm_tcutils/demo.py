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


def _int8_dot_product(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """int8 dot-product conv2d: the model's first 3x3 layer, u8 x i8, bit-exact and timed."""
    from tvm.topi.testing import conv2d_nchw_python

    from .isa import for_target

    cpu = tvm.target.codegen.llvm_get_system_cpu()
    target = f"llvm -mcpu={cpu}"
    isa = for_target(target)
    if isa is None:
        return [f"host CPU {cpu} has no VNNI / AVX2 dot product: skipped"]
    convs = []
    relay.analysis.post_order_visit(
        relay.transform.InferType()(mod)["main"],
        lambda n: convs.append(n) if isinstance(n, relay.Call) and getattr(n.op, "name", "") == "nn.conv2d"
        and int(n.attrs.groups) == 1 and tuple(int(k) for k in n.attrs.kernel_size) == (3, 3) else None,
    )
    if not convs:
        return [f"{name} has no 3x3 conv2d: skipped"]
    call = convs[0]
    data_shape = [int(d) for d in call.args[0].checked_type.shape]
    kernel_shape = [int(d) for d in call.args[1].checked_type.shape]
    strides, padding = [int(v) for v in call.attrs.strides], [int(v) for v in call.attrs.padding]
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, data_shape).astype("uint8")
    kernel = rng.integers(-128, 128, kernel_shape).astype("int8")
    x = relay.var("x", shape=data_shape, dtype="uint8")
    y = relay.nn.conv2d(x, relay.const(kernel), strides=strides, padding=padding,
                        channels=kernel_shape[0], kernel_size=(3, 3), out_dtype="int32")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target=target)
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(x=data)
    runner.run()
    out = runner.get_output(0).numpy()
    exact = np.array_equal(out, conv2d_nchw_python(data.astype("int64"), kernel.astype("int64"), strides, padding))
    seconds = np.median(runner.module.time_evaluator("run", tvm.cpu(), number=1, repeat=5)().results)
    gops = 2 * out.size * kernel_shape[1] * 9 / seconds / 1e9
    return [
        f"{isa.name} ({isa.lanes} lanes) on {target}: conv {data_shape} x {kernel_shape} stride {strides}",
        f"bit-exact vs numpy: {exact}; {gops:.0f} GOPS (layout transforms included, untuned)",
    ]


#: Demo sections, in the order they run. Capabilities append theirs.
SECTIONS: List[Section] = [_baseline, _int8_dot_product]


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
