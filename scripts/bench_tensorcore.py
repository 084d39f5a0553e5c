#!/usr/bin/env python
"""Benchmark: tvm-tcutils' HWNC tensor-core conv2d against TVM's own, side by side on one GPU.

For every distinct HWNC layer of ResNet-50 (batch 8 by default) both
implementations are built with the same settings (untuned fallback configs, or
``--trials`` AutoTVM trials each with the same tuner), run on the local GPU in
the same process, and the median latencies and their ratio are printed (and
written as JSON, ``--json``). The harness is ``tvm_tcutils.bench.tensorcore``.

TVM's template writes its packed output layout and leaves unpacking to
others; ours includes the unpacking to HWNC, so the comparison is conservative
for tvm-tcutils.

Needs TVM's CUDA code generator and an NVIDIA GPU with integer tensor cores
(sm_75+ for int4, sm_72+ for int8); without them it prints why and exits 0.

Usage::

    PYTHONPATH=. python scripts/bench_tensorcore.py --dtype int4 --batch 8 [--trials 200]
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402
import tvm  # noqa: E402
from tvm import autotvm  # noqa: E402

from tvm_tcutils.bench import tensorcore as bench  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.measure import ratio  # noqa: E402
from tvm_tcutils.tensorcore.topi import conv2d_hwnc, wmma  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["int4", "int8"], default="int8")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--trials", type=int, default=0, help="AutoTVM trials per task and implementation")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    caps = tvm_tcutils.capabilities()
    if not caps["cuda_codegen"] or not caps["cuda_device"]:
        missing = "TVM's CUDA code generator" if not caps["cuda_codegen"] else "an NVIDIA GPU"
        print(f"skipped: this benchmark needs {missing}; nothing was measured")
        return 0
    arch = int(str(tvm.cuda(0).compute_version).replace(".", ""))
    if arch < wmma.MIN_ARCH[args.dtype]:
        print(f"skipped: {args.dtype} tensor cores need sm_{wmma.MIN_ARCH[args.dtype]}+, this GPU is sm_{arch}")
        return 0
    if args.dtype == "int4":
        print("note: int4 inputs are uninitialized int4 NDArrays (NumPy has no int4); timings only")
    results = Results(__file__, argv, dtype=args.dtype, batch=args.batch, trials=args.trials, arch=arch)
    rng = np.random.default_rng(0)
    print(f"{'layer (data, kernel)':<44} {'TVM ms':>9} {'tcutils ms':>10} {'TVM/tcutils':>11}")
    ratios = []
    for workload in bench.layers(args.dtype, args.batch):
        task_args = workload[1:]
        ours = autotvm.task.create(conv2d_hwnc.TASK, task_args, bench.cuda_target())
        theirs = autotvm.task.create(bench.TVM_TASK, task_args, bench.cuda_target())
        shapes = [task_args[0][1], task_args[1][1]]
        if args.dtype == "int8":
            arrays = [rng.integers(-128, 128, size=s).astype("int8") for s in shapes]
        else:
            arrays = [tvm.nd.empty(s, "int4") for s in shapes]
        t_theirs = bench.time_task(theirs, args.trials, arrays)
        t_ours = bench.time_task(ours, args.trials, arrays)
        r = ratio(t_theirs, t_ours)
        ratios.append(r.value)
        results.add(data=list(shapes[0]), kernel=list(shapes[1]), tvm=t_theirs, ours=t_ours, tvm_over_ours=r)
        print(f"{str((tuple(shapes[0]), tuple(shapes[1]))):<44} {t_theirs.median_ms:9.3f} {t_ours.median_ms:10.3f} "
              f"{r.value:11.2f}")
    geomean = float(np.exp(np.mean(np.log(ratios))))
    results.settings["geomean_tvm_over_ours"] = geomean
    print(f"geometric mean TVM/tcutils: {geomean:.2f} (>1: tcutils faster)")
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
