#!/usr/bin/env python
"""Time the graph passes next to TVM 0.19's own versions, on deep chains and big models.

For each workload (a conv2d+relu chain of 500/2,000/10,000 layers, ResNet-152,
Inception-v3) it times, in this process, tvm_tcutils' ``count_layers``,
``recast``, ConvertLayout to HWNC under ``LayoutConfig`` and
``prepare_for_tensorcore``; and, in a child process without tvm_tcutils and with
a time cap, TVM's ``relay.analysis.count_layers``, ``relay.transform.recast``,
ConvertLayout under TVM's ``LayoutConfig``, and the manual workflow built from
those (the peer of ``prepare_for_tensorcore``). TVM's Python passes recurse,
so the child raises Python's recursion limit and runs them on a thread with a
1 GiB stack to give them their best chance. Ratios (TVM time / ours) come
from this one run, side by side. The harness is ``tvm_tcutils.bench.passes``;
the table is also written as JSON (``--json``).

Usage::

    PYTHONPATH=. python scripts/bench_passes.py [--cap SECONDS] [--workloads chain500 ...]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench import passes  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import cell, markdown  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cap", type=float, default=120.0, help="seconds each of TVM's passes may run (with loading)")
    parser.add_argument("--workloads", nargs="+", default=list(passes.WORKLOADS), choices=passes.WORKLOADS)
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    results = Results(__file__, argv, cap_s=args.cap)
    header = ["workload", "conv2d layers", "InferType (s)", "step", "tvm_tcutils (s)", "TVM 0.19 (s)", "TVM / ours"]
    print(markdown(header, []))
    for name in args.workloads:
        layers, infer, steps = passes.our_steps(name)
        for step in passes.STEPS:
            row = passes.compare_step(name, step, steps[step], args.cap)
            results.add(conv2d_layers=layers, infer_type_s=infer, **row)
            ratio = f"{row['tvm_over_ours']:.1f}x" if row["tvm_over_ours"] is not None else "-"
            cells = [name, layers, f"{infer:.2f}", step, f"{row['ours_s']:.2f}", cell(row["tvm_s"]), ratio]
            print(markdown(header, [cells]).splitlines()[-1], flush=True)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
