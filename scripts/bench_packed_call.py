#!/usr/bin/env python
"""What one call into a library-style Collage toolchain (onnxruntime) costs inside a compiled model.

A chain of ``--ops`` small elementwise ops (add a constant, relu on a 1x256 tensor), each its own
``tcutils_ort`` partition, is built once and timed with the graph executor, side by side in one
process, in turns over ``--rounds`` rounds:

* ``C callback``: ``tvm_tcutils.ort.run`` registered as the package registers it (a raw C callback
  that reads the ``DLTensor`` addresses from TVM's argument array);
* ``Python callback``: the same function registered through TVM's generic Python callback
  (``tvm.register_func(name, TOOLCHAIN.run)``), which the package used before;
* ``TVM alone``: the same chain compiled by TVM (one fused kernel), the floor.

Per call = (chain time - TVM alone) / ops. ``onnxruntime alone`` is one partition's session run
from Python through the same I/O binding, without TVM, for reference.

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_packed_call.py
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402
import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib import graph_executor  # noqa: E402

from tvm_tcutils.collage.toolchains import ort  # noqa: E402
from tvm_tcutils.collage.toolchains.packed_call import _address, byoc_partition  # noqa: E402


def chain(ops: int) -> tvm.IRModule:
    x = relay.var("x", shape=(1, 256))
    y = x
    for _ in range(ops // 2):
        y = relay.nn.relu(relay.add(y, relay.const(np.full((1, 256), -0.01, "float32"))))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def executor(mod: tvm.IRModule):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target())
    run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input("x", np.random.default_rng(0).standard_normal((1, 256)).astype("float32"))
    run.run()
    return run


def time_run(run, number: int) -> float:
    return float(run.module.time_evaluator("run", tvm.cpu(), number=number, repeat=1)().mean)


def register(fast: bool) -> None:
    function = ort.TOOLCHAIN.run_function() if fast else ort.TOOLCHAIN.run
    tvm.register_func(ort.TOOLCHAIN.run_name, function, override=True)


def ort_alone_us(repeat: int = 2000) -> float:
    key = next(iter(ort.TOOLCHAIN._states))
    state = ort.TOOLCHAIN._states[key]
    a = tvm.nd.array(np.ones((1, 256), "float32"))
    out = tvm.nd.empty((1, 256))
    binding = state.binding([_address(a)], [_address(out)])
    for _ in range(100):
        state.session.run_with_iobinding(binding)
    start = time.perf_counter()
    for _ in range(repeat):
        state.session.run_with_iobinding(binding)
    return (time.perf_counter() - start) / repeat * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20, help="ops in the chain, each its own ORT partition")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--number", type=int, default=200, help="runs per timing")
    args = parser.parse_args(argv)
    ok, reason = ort.available()
    if not ok:
        raise SystemExit(f"onnxruntime toolchain unavailable: {reason}")
    mod = chain(args.ops)
    parted = byoc_partition(mod, ort.COMPILER, merge=False)
    runs = {"TVM alone": executor(mod)}
    # Compiled code looks a packed function up once, at its first call, and keeps it: each variant
    # gets its own build, run once while its registration is in place.
    try:
        for label, fast in (("Python callback", False), ("C callback", True)):
            register(fast)
            runs[label] = executor(parted)
    finally:
        register(True)
    times = {label: [] for label in runs}
    for _ in range(args.rounds):
        for label, run in runs.items():
            times[label].append(time_run(run, args.number))
    median = {label: float(np.median(values)) * 1e6 for label, values in times.items()}
    threads = os.environ.get("TVM_NUM_THREADS", "default")
    print(f"{args.ops} ORT partitions in a chain, {tvm_tcutils.host_target()}, TVM_NUM_THREADS={threads}, "
          f"median of {args.rounds} rounds")
    print(f"{'variant':18s} {'chain us':>10s} {'per call us':>12s}")
    for label in ("TVM alone", "C callback", "Python callback"):
        per_call = (median[label] - median["TVM alone"]) / args.ops if label != "TVM alone" else 0.0
        print(f"{label:18s} {median[label]:10.1f} {per_call:12.1f}")
    fast = (median["C callback"] - median["TVM alone"]) / args.ops
    slow = (median["Python callback"] - median["TVM alone"]) / args.ops
    print(f"onnxruntime alone (one partition's run_with_iobinding from Python): {ort_alone_us():.1f} us")
    print(f"per-call cost, Python callback / C callback: x{slow / fast:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
