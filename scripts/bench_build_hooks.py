#!/usr/bin/env python
"""What the package's ``target.build.llvm`` rewrites, the stem's row form and the dense tile order are worth on a model.

The model (a zoo name, default ``resnet-50-onnx``; its onnxruntime-quantized file for ``--route``) is built
with plain ``relay.build`` once per variant:

* ``hooks``: as the package builds it (``dotprod.prefetch``, then ``dotprod.pipeline``, then TVM's LLVM
  code generator);
* ``no prefetch``: the same with ``dotprod.prefetch`` left out;
* ``no rounding``: the same with ``dotprod.rounding`` left out;
* ``no row form``: the same with every conv channel-blocked (``dotprod.strategy.ROWS_ISAS`` empty: an RGB
  stem's channels padded to 4 instead of its kernel rows to whole quads);
* ``rows outer``: the same with the int8 dense tiles walked row tile by row tile
  (``dotprod.topi.dense_pack.COLUMNS_OUTER_ISAS`` empty: a token matrix reads the whole weight once per row tile);
* ``TVM codegen``: TVM's own ``target.build.llvm`` (neither rewrite);
* ``tuned``: as ``hooks``, under the best configurations of ``--tuning-log`` (``tvm-tcutils tune``'s log).

The three run at one thread (``TVM_NUM_THREADS=1``, set here: one process is fair only at one thread)
and take turns over ``--rounds`` rounds: end to end (:func:`tvm_tcutils.bench.competitors.relay_module`),
and each kernel timed inside a run of the whole network by TVM's profiler (every other kernel has gone
through the caches in between, as in a real run; with ``--hot`` each kernel run 10 times on its own
instead), summed by output plane (``56x56``, ``7x7``, ...) or, with ``--group kernel``, by kernel function.
Outputs are checked equal first. Speedups: the other build's median over ``hooks``'s, with its 95 %
bootstrap interval (:func:`tvm_tcutils.bench.competitors.ratios`).

    PYTHONPATH=. python scripts/bench_build_hooks.py --rounds 15
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

os.environ.setdefault("TVM_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402
from tvm.contrib.debugger import debug_executor  # noqa: E402
from tvm_tcutils import registry  # noqa: E402
from tvm_tcutils.bench.competitors import compare, ratios, relay_module  # noqa: E402
from tvm_tcutils.bench.int8_models import ROUTES, feed_of, model_files  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.dotprod import hooks, pipeline, prefetch, rounding, strategy  # noqa: E402
from tvm_tcutils.dotprod.topi import dense_pack  # noqa: E402
from tvm_tcutils.measure import Timing, hot_kernel_seconds  # noqa: E402


#: Builds with one of the package's rewrites left out: module, setting, the value that turns it off.
LEFT_OUT = {
    "no prefetch": (prefetch, "MIN_BYTES", float("inf")),
    "no rounding": (rounding, "MEASURED_ISAS", frozenset()),
    "no row form": (strategy, "ROWS_ISAS", frozenset()),
    "rows outer": (dense_pack, "COLUMNS_OUTER_ISAS", frozenset()),
}
VARIANTS = ("hooks", *LEFT_OUT, "TVM codegen", "tuned")


@contextlib.contextmanager
def _variant(name: str, tuning_log: str = None):
    if name == "tuned":  # the package's build under an AutoTVM log's best configurations
        from tvm import autotvm

        from tvm_tcutils.tuning import applied_records

        with autotvm.apply_history_best(applied_records(tuning_log)):
            yield
    elif name == "TVM codegen":
        with registry.overriding_func(hooks.BUILD_LLVM, registry.replaced_func(hooks.BUILD_LLVM)):
            yield
    elif name in LEFT_OUT:
        module, setting, off = LEFT_OUT[name]
        saved = getattr(module, setting)
        setattr(module, setting, off)
        try:
            yield
        finally:
            setattr(module, setting, saved)
    else:
        yield


def _groups(graph_json: str, by: str) -> list:
    """The group of each kernel call, in the order the profiler reports them: its output plane (``HxW``)
    for ``by="plane"``, its function's name (less TVM's ``tvmgen_default_fused_`` prefix) for ``"kernel"``."""
    graph = json.loads(graph_json)
    shapes, ptr = graph["attrs"]["shape"][1], graph["node_row_ptr"]
    groups = []
    for index, node in enumerate(graph["nodes"]):
        if node["op"] != "tvm_op":
            continue
        if by == "kernel":
            groups.append(node["attrs"]["func_name"].replace("tvmgen_default_fused_", ""))
        else:
            shape = shapes[ptr[index]]
            groups.append(f"{shape[2]}x{shape[3]}" if len(shape) >= 4 else "other")
    return groups


def _profiled(lib, feed: dict, hot: bool = False, by: str = "plane"):
    """A timer of one network run under TVM's profiler: returns {group: summed kernel ms} (groups:
    :func:`_groups`). ``hot``: each kernel run ``HOT_NUMBER`` times in a row instead (``run_individual``:
    its data and weights in cache)."""
    module = debug_executor.create(lib.get_graph_json(), lib.get_lib(), tvm.cpu(),
                                   dump_root=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tcutils_profile"))
    module.load_params(tvm.runtime.save_param_dict(lib.get_params()))
    for name, value in feed.items():
        module.set_input(name, value)
    planes = _groups(lib.get_graph_json(), by)

    def durations() -> list:
        if hot:
            return [s * 1e3 for s in hot_kernel_seconds(module, lib.get_graph_json(), HOT_NUMBER)]
        return [call["Duration (us)"].microseconds / 1e3 for call in module.profile().calls]

    def run() -> dict:
        ms = durations()
        if len(ms) != len(planes):
            raise RuntimeError(f"the profiler reported {len(ms)} calls for {len(planes)} kernels")
        sums: dict = {}
        for plane, value in zip(planes, ms):
            sums[plane] = sums.get(plane, 0.0) + value
        sums["all kernels"] = sum(ms)
        return sums
    return run


#: Runs of each kernel per sample with ``--hot``.
HOT_NUMBER = 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet-50-onnx", help="a zoo model with an ONNX file (default %(default)s)")
    parser.add_argument("--route", default="qdq", choices=[r for r in ROUTES if r != "fp32"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS[1:], default=None,
                        help="the builds to compare with hooks (default: all; tuned only with --tuning-log)")
    parser.add_argument("--tuning-log", help="AutoTVM log of the variant tuned (tvm-tcutils tune's)")
    parser.add_argument("--hot", action="store_true",
                        help="time each kernel run repeatedly on its own (hot caches) instead of inside a run of the "
                             "whole network")
    parser.add_argument("--group", choices=("plane", "kernel"), default="plane",
                        help="sum the kernels by output plane (default) or list each kernel function")
    parser.add_argument("--target", default=None, help="the LLVM target to build for (default: this CPU's); "
                        "it must run here")
    parser.add_argument("--isas", nargs="+", default=None, metavar="ISA",
                        help="the dot-product ISAs whose kernels get the measured-only rewrites (prefetch, "
                             "rounding) in the builds that have them, to measure them on another ISA "
                             "(default: each rewrite's MEASURED_ISAS)")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.variants is None:
        args.variants = [v for v in VARIANTS[1:] if v != "tuned" or args.tuning_log]
    if "tuned" in args.variants and not args.tuning_log:
        parser.error("--variants tuned needs --tuning-log LOG")
    if args.tuning_log and not os.path.isfile(args.tuning_log):
        parser.error(f"--tuning-log: no such file {args.tuning_log!r}")
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the intervals come from the per-round ratios)")
    if args.isas is not None:
        known = {isa.name for isa in pipeline.DOT_INTRINSICS.values()}
        unknown = sorted(set(args.isas) - known)
        if unknown:
            parser.error(f"--isas: unknown {unknown}; choose from {sorted(known)}")
        prefetch.MEASURED_ISAS = rounding.MEASURED_ISAS = frozenset(args.isas)
    if args.target is not None:
        try:
            if tvm.target.Target(args.target).kind.name != "llvm":
                parser.error(f"--target: an llvm target that runs on this CPU, got {args.target!r}")
        except (ValueError, tvm.TVMError) as err:
            parser.error(f"--target: not a TVM target ({str(err).splitlines()[-1]})")
    if os.environ["TVM_NUM_THREADS"] != "1":
        parser.error("TVM_NUM_THREADS must be 1: the builds share this process, which is fair at one thread only")
    path = model_files(args.model, [args.route])[args.route]
    feed = feed_of(path)
    mod, params = tvm_tcutils.load_model(path)
    target = args.target or tvm_tcutils.host_target()
    variants = ("hooks", *args.variants)
    libs = {}
    for name in variants:
        with _variant(name, args.tuning_log), tvm.transform.PassContext(opt_level=3):
            libs[name] = relay.build(mod, target=target, params=params)
    outputs = {}
    for name, lib in libs.items():
        runner = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
        runner.set_input(**feed)
        runner.run()
        outputs[name] = runner.get_output(0).numpy()
    for name, out in outputs.items():
        if not np.array_equal(outputs["hooks"], out):
            raise SystemExit(f"{name!r}: outputs differ from hooks': the rewrites must not change results")
    end_to_end = compare({name: relay_module(mod, lib=libs[name], inputs=feed, repeat=3) for name in variants},
                         args.rounds)
    profilers = {name: _profiled(libs[name], feed, args.hot, args.group) for name in variants}
    samples: dict = {name: {} for name in variants}
    for round_index in range(args.rounds):
        order = variants if round_index % 2 == 0 else variants[::-1]
        for name in order:
            for plane, ms in profilers[name]().items():
                samples[name].setdefault(plane, []).append(ms)
    results = Results(__file__, argv, model=args.model, route=args.route, rounds=args.rounds, target=target,
                      tvm_num_threads=1, kernels="hot" if args.hot else "in the network's run", group=args.group,
                      rewritten_isas=sorted(prefetch.MEASURED_ISAS | rounding.MEASURED_ISAS),
                      tuning_log=args.tuning_log)
    print(f"{args.model} ({args.route}), {target}, 1 thread, {args.rounds} rounds in turns")
    width = 14 if args.group == "plane" else 60
    print(f"{'part':{width}s} " + " ".join(f"{name + ' ms':>16s}" for name in variants)
          + " " + " ".join(f"{'x vs ' + name:>22s}" for name in variants[1:]))
    parts = [("end to end", {name: end_to_end[name] for name in variants})]
    order = (lambda p: (p == "all kernels", p == "other", -_area(p))) if args.group == "plane" else \
        (lambda p: (p == "all kernels", -float(np.median(samples["hooks"][p]))))
    _merge_unshared(samples)
    for plane in sorted(samples["hooks"], key=order):
        parts.append((plane, {name: Timing(tuple(samples[name][plane])) for name in variants}))
    for part, timings in parts:
        speedups = ratios(timings, "hooks")
        print(f"{part[-width:]:{width}s} " + " ".join(f"{timings[name].median_ms:16.3f}" for name in variants) + " "
              + " ".join(f"{speedups[name].value:9.3f} [{speedups[name].low:.3f}, {speedups[name].high:.3f}]"
                         for name in variants[1:]))
        results.add(part=part, **{name: timings[name] for name in variants},
                    **{f"speedup_vs_{name.replace(' ', '_')}": speedups[name] for name in variants[1:]})
    results.write(args.json)
    return 0


#: The part that sums the kernels one build names differently from another (a variant that changes which
#: ops a kernel fuses changes its name).
UNSHARED = "kernels not in every build"


def _merge_unshared(samples: dict) -> None:
    """Sum, per build and round, the groups that not every build has into :data:`UNSHARED` (in place)."""
    shared = set.intersection(*(set(groups) for groups in samples.values()))
    if all(set(groups) == shared for groups in samples.values()):
        return
    for groups in samples.values():
        apart = [groups.pop(group) for group in sorted(set(groups) - shared)]
        rounds = len(groups["all kernels"])
        groups[UNSHARED] = [float(sum(values)) for values in zip(*apart)] if apart else [0.0] * rounds


def _area(plane: str) -> int:
    try:
        height, width = plane.split("x")
        return int(height) * int(width)
    except ValueError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
