#!/usr/bin/env python
"""What one call into a library-style Collage toolchain (onnxruntime) costs inside a compiled model.

A chain of ``--ops`` small elementwise ops (add a constant, relu on a 1x256 tensor), each its own
``tcutils_ort`` partition, is built once and timed with the graph executor, side by side in one
process, in turns over ``--rounds`` rounds (``tvm_tcutils.measure``; each sample lasts at least
``--min-ms``):

* ``C callback``: ``tvm_tcutils.ort.run`` registered as the package registers it (a raw C callback
  that reads the ``DLTensor`` addresses from TVM's argument array);
* ``Python callback``: the same function registered through TVM's generic Python callback
  (``tvm.register_func(name, TOOLCHAIN.run)``), which the package used before;
* ``native module``: the C callback called by the native plugin's partition module
  (``tcutils_packed_call``) instead of a compiled wrapper function, where the plugin is built;
* ``TVM alone``: the same chain compiled by TVM (one fused kernel), the floor.

Per call = (chain time - TVM alone) / ops. ``onnxruntime alone`` is one partition's session run
from Python through the same I/O binding, without TVM, for reference. The harness is
``tvm_tcutils.bench.toolchains``; results also go to JSON (``--json``).

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_packed_call.py
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402
from tvm_tcutils.bench import toolchains as bench  # noqa: E402
from tvm_tcutils.bench.competitors import add_timing_arguments, compare, use_timing_arguments  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.collage.toolchains import ort  # noqa: E402
from tvm_tcutils.measure import ratio  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=20, help="ops in the chain, each its own ORT partition")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--min-ms", type=int, default=20, help="least duration of one timing (many runs)")
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    use_timing_arguments(args)
    ok, reason = ort.available()
    if not ok:
        raise SystemExit(f"onnxruntime toolchain unavailable: {reason}")
    timed = compare(bench.packed_call_timers(args.ops, args.min_ms), args.rounds)
    us = {label: t.median_ms * 1e3 for label, t in timed.items()}
    threads = os.environ.get("TVM_NUM_THREADS", "default")
    results = Results(__file__, argv, ops=args.ops, rounds=args.rounds, tvm_num_threads=threads)
    print(f"{args.ops} ORT partitions in a chain, {tvm_tcutils.host_target()}, TVM_NUM_THREADS={threads}, "
          f"median of {args.rounds} rounds")
    print(f"{'variant':18s} {'chain us':>10s} {'per call us':>12s}")
    per_call = {label: (us[label] - us["TVM alone"]) / args.ops for label in us}
    for label in [v for v in ("TVM alone", "C callback", "native module", "Python callback") if v in us]:
        print(f"{label:18s} {us[label]:10.1f} {per_call[label]:12.1f}")
        results.add(variant=label, chain=timed[label], per_call_us=per_call[label])
    alone_us = bench.ort_alone_timer()() * 1e3
    print(f"onnxruntime alone (one partition's run_with_iobinding from Python): {alone_us:.1f} us")
    print(f"per-call cost, Python callback / C callback: x{per_call['Python callback'] / per_call['C callback']:.2f}")
    results.add(variant="onnxruntime alone", us=alone_us)
    results.settings["python_over_c_chain"] = ratio(timed["Python callback"], timed["C callback"])
    if "native module" in timed:
        native = per_call["native module"] / per_call["C callback"]
        print(f"per-call cost, native module / compiled wrapper: x{native:.2f}")
        results.settings["native_over_compiled_chain"] = ratio(timed["native module"], timed["C callback"])
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
