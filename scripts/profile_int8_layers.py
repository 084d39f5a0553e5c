#!/usr/bin/env python
"""Where the time of a quantized CNN goes, layer by layer: tvm-tcutils (plain relay.build) and OpenVINO, 1 thread.

A profile, not a race: it says which layers one runtime spends more on than the other (the end-to-end
ratios come from ``scripts/bench_int8_models.py``). The model's onnxruntime-quantized QDQ file (a zoo name,
as ``bench_int8_models.py`` caches it) runs in both, one thread each, in alternating rounds:

* tvm-tcutils: each fused kernel run on its own, ``HOT_NUMBER`` times in a row (TVM's debug executor,
  ``run_individual``: its inputs and weights in cache), or with ``--in-run`` inside whole runs (the debug
  executor's profiler, each kernel's median over ``--runs`` runs: weights and activations where a real run
  leaves them, as OpenVINO's side is);
* OpenVINO: every node's time inside whole inferences (``PERF_COUNT``, the executable graph's
  ``execTimeMcs``), averaged over ``--runs`` inferences per round.

Each runtime's times are grouped by kind (``conv``: every kernel with a convolution in it; ``other``) and
output shape (channels x height x width), medians over the rounds; totals are the sums. Both at one thread
(``TVM_NUM_THREADS=1``, OpenVINO's ``INFERENCE_NUM_THREADS=1``), so neither runtime's threads run while the
other is timed.

    PYTHONPATH=. python scripts/profile_int8_layers.py --model resnet-18-onnx --rounds 3 \
        --json docs/benchmarks/data/profile_int8_layers_r18.json
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile

os.environ["TVM_NUM_THREADS"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (installs the hooks)
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib.debugger import debug_executor  # noqa: E402
from tvm_tcutils.bench.int8 import is_quantized  # noqa: E402
from tvm_tcutils.bench.int8_models import feed_of, model_files  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.measure import hot_kernel_seconds  # noqa: E402

#: Runs of each kernel in a row (TVM's ``run_individual``).
HOT_NUMBER = 20


def _shape_key(shape) -> str:
    dims = [int(d) for d in shape]
    if len(dims) == 5:  # NCHW{b}c
        dims = [dims[0], dims[1] * dims[4], dims[2], dims[3]]
    return "x".join(str(d) for d in dims[1:]) if len(dims) >= 2 else str(dims)


def in_run_seconds(module, runs: int):
    """Seconds of each fused kernel (graph order) inside whole runs: medians over ``runs`` profiled runs."""
    samples = [[call["Duration (us)"].microseconds * 1e-6 for call in module.profile().calls] for _ in range(runs)]
    return [float(np.median(column)) for column in zip(*samples)]


def tvm_profile(path: str, feed, dump_root: str, in_run: int = 0):
    """``([(kind, shape key)] of each fused kernel, a function returning their seconds)``: hot, or inside
    ``in_run`` whole runs where it is not 0; the debug executor writes under ``dump_root`` (left to itself
    it leaves a temporary folder behind)."""
    mod, params = tvm_tcutils.load_model(path)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=tvm_tcutils.host_target(), params=params)
    graph_json = lib.get_graph_json()
    graph = json.loads(graph_json)
    module = debug_executor.create(graph_json, lib.get_lib(), tvm.cpu(), dump_root=dump_root)
    module.set_input(**lib.get_params())
    module.set_input(**feed)
    shapes = graph["attrs"]["shape"][1]
    offsets = graph["node_row_ptr"]
    ops = [(i, node) for i, node in enumerate(graph["nodes"]) if node["op"] == "tvm_op"]

    return [("conv" if "conv2d" in node["attrs"]["func_name"] else "other", _shape_key(shapes[offsets[i]]))
            for i, node in ops], (lambda: in_run_seconds(module, in_run)) if in_run else (
                lambda: hot_kernel_seconds(module, graph_json, HOT_NUMBER))


def openvino_profile(path: str, feed, runs: int):
    """A function returning ``[(kind, shape key, us)]`` per executed node, averaged over ``runs`` inferences."""
    import openvino as ov

    compiled = ov.Core().compile_model(path, "CPU", {
        "INFERENCE_NUM_THREADS": 1, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1, "PERF_COUNT": True})
    request = compiled.create_infer_request()
    for _ in range(10):
        request.infer(feed)

    def run():
        totals = collections.defaultdict(float)
        for _ in range(runs):
            request.infer(feed)
            for info in request.get_profiling_info():
                totals[info.node_name] += info.real_time.total_seconds() * 1e6
        rows = []
        for op in compiled.get_runtime_model().get_ordered_ops():
            name = op.get_friendly_name()
            if name in totals and totals[name] > 0:
                kind = "conv" if op.get_rt_info()["layerType"].astype(str) == "Convolution" else "other"
                rows.append((kind, _shape_key(op.get_output_partial_shape(0).to_shape()), totals[name] / runs))
        return rows
    return run


def grouped(rows) -> dict:
    """``{(kind, shape): (count, us)}``."""
    out = collections.defaultdict(lambda: [0, 0.0])
    for kind, shape, us in rows:
        out[(kind, shape)][0] += 1
        out[(kind, shape)][1] += us
    return {key: tuple(value) for key, value in out.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet-18-onnx",
                        help="zoo name or light_<name> (its QDQ file), a float .onnx file (quantized here) "
                        "or a QDQ .onnx file")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of both profiles (median)")
    parser.add_argument("--runs", type=int, default=100, help="OpenVINO inferences per round")
    parser.add_argument("--in-run", action="store_true",
                        help="tcutils' kernels timed inside whole runs (--runs of them a round), not hot")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.runs < 1:
        parser.error(f"--rounds and --runs must be >= 1, got {args.rounds} and {args.runs}")
    path = args.model if is_quantized(args.model) else model_files(args.model, ["qdq"])["qdq"]
    feed = feed_of(path)
    samples = {"tcutils": [], "OpenVINO": []}
    with tempfile.TemporaryDirectory(prefix="tcutils_profile_") as dump_root:
        kernels, tvm_run = tvm_profile(path, feed, dump_root, args.runs if args.in_run else 0)
        ov_run = openvino_profile(path, feed, args.runs)
        for _ in range(args.rounds):  # alternating: both see the same machine state
            samples["OpenVINO"].append(grouped(ov_run()))
            samples["tcutils"].append(grouped([(kind, shape, seconds * 1e6) for (kind, shape), seconds in
                                               zip(kernels, tvm_run())]))
    table = {}
    for runtime, rounds in samples.items():
        for key in set().union(*rounds):
            counts = {r[key][0] for r in rounds if key in r}
            table.setdefault(key, {})[runtime] = (max(counts), float(np.median([r.get(key, (0, 0.0))[1]
                                                                                  for r in rounds])))
    results = Results(__file__, argv, model=args.model, path=path, rounds=args.rounds, runs=args.runs,
                      hot_number=0 if args.in_run else HOT_NUMBER, in_run=args.in_run, threads=1)
    print(f"{args.model} QDQ, 1 thread, us (median of {args.rounds} rounds; tcutils "
          f"{'inside whole runs' if args.in_run else 'hot'}); ratio = OpenVINO / tcutils")
    totals = collections.defaultdict(float)
    for (kind, shape), cells in sorted(table.items(), key=lambda item: (item[0][0], -item[1].get(
            "tcutils", (0, 0.0))[1])):
        ours, theirs = cells.get("tcutils", (0, 0.0)), cells.get("OpenVINO", (0, 0.0))
        totals[("tcutils", kind)] += ours[1]
        totals[("OpenVINO", kind)] += theirs[1]
        ratio = theirs[1] / ours[1] if ours[1] and theirs[1] else float("nan")
        results.add(kind=kind, output=shape, tcutils_kernels=ours[0], tcutils_us=ours[1],
                    openvino_nodes=theirs[0], openvino_us=theirs[1], openvino_over_tcutils=ratio)
        print(f"  {kind:<5} {shape:<14} tcutils {ours[0]:2d} x {ours[1]:8.1f}   OpenVINO {theirs[0]:2d} x "
              f"{theirs[1]:8.1f}   x{ratio:.2f}")
    for kind in ("conv", "other"):
        print(f"  total {kind:<5}: tcutils {totals[('tcutils', kind)]:8.1f} us, OpenVINO "
              f"{totals[('OpenVINO', kind)]:8.1f} us")
    results.settings["totals_us"] = {f"{runtime} {kind}": value for (runtime, kind), value in totals.items()}
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
