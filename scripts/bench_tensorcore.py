"""Benchmark: tvm-tcutils' HWNC tensor-core conv2d against TVM's own, side by side on one GPU.

For every distinct HWNC layer of ResNet-50 (batch 8 by default) both
implementations are built with the same settings (untuned fallback configs, or
``--trials`` AutoTVM trials each with the same tuner), run on the local GPU in
the same process, and the median latencies and their ratio are printed.

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
import tempfile

import numpy as np


import tvm_tcutils  # noqa: E402
import tvm  # noqa: E402
from tvm import autotvm  # noqa: E402
from tvm.relay.testing import resnet  # noqa: E402

from tvm_tcutils.strategy import tensorcore  # noqa: E402
from tvm_tcutils.tensorcore.topi import conv2d_hwnc, wmma  # noqa: E402

TVM_TASK = "conv2d_HWNCnc_tensorcore.cuda"


def _layers(dtype: str, batch: int):
    mod, _ = resnet.get_workload(num_layers=50, batch_size=batch)
    mod, _ = tvm_tcutils.prepare_for_tensorcore(mod, dtype, "int32")  # skips the 3-channel stem
    return sorted({row[4] for row in tensorcore.implementations(mod, _target(), ("nn.conv2d",))
                   if row[3] == tensorcore.CONV2D_IMPL}, key=str)


def _target() -> str:
    return "cuda -arch=sm_" + str(tvm.cuda(0).compute_version).replace(".", "")


def _config(task, trials: int):
    """The fallback config, or the best of ``trials`` AutoTVM measurements (same tuner for both)."""
    if trials <= 0:
        return autotvm.task.space.FallbackConfigEntity()
    log = tempfile.NamedTemporaryFile(suffix=".log", delete=False).name
    tuner = autotvm.tuner.XGBTuner(task, loss_type="rank")
    measure = autotvm.measure_option(builder=autotvm.LocalBuilder(), runner=autotvm.LocalRunner(number=20))
    tuner.tune(n_trial=min(trials, len(task.config_space)), measure_option=measure,
               callbacks=[autotvm.callback.log_to_file(log)])
    return autotvm.task.ApplyHistoryBest(log).query(tvm.target.Target(_target()), task.workload)


def _time(task, trials: int, arrays) -> float:
    target = tvm.target.Target(_target())
    with target:
        sched, tensors = task.instantiate(_config(task, trials))
        func = tvm.build(sched, tensors, target)
    dev = tvm.cuda(0)
    # AutoTVM lists the output first, then the inputs in traversal order: match inputs by shape.
    args = [tvm.nd.empty([int(v) for v in tensors[0].shape], tensors[0].dtype, dev)]
    for tensor in tensors[1:]:
        (array,) = [a for a in arrays if tuple(a.shape) == tuple(int(v) for v in tensor.shape)]
        args.append(tvm.nd.array(array, dev) if isinstance(array, np.ndarray) else array.copyto(dev))
    return float(np.median(func.time_evaluator(func.entry_name, dev, number=50, repeat=5)(*args).results) * 1e3)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=["int4", "int8"], default="int8")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--trials", type=int, default=0, help="AutoTVM trials per task and implementation")
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
    rng = np.random.default_rng(0)
    print(f"{'layer (data, kernel)':<44} {'TVM ms':>9} {'tcutils ms':>10} {'TVM/tcutils':>11}")
    ratios = []
    for workload in _layers(args.dtype, args.batch):
        task_args = workload[1:]
        ours = autotvm.task.create(conv2d_hwnc.TASK, task_args, _target())
        theirs = autotvm.task.create(TVM_TASK, task_args, _target())
        shapes = [task_args[0][1], task_args[1][1]]
        if args.dtype == "int8":
            arrays = [rng.integers(-128, 128, size=s).astype("int8") for s in shapes]
        else:
            arrays = [tvm.nd.empty(s, "int4") for s in shapes]
        ms_theirs = _time(theirs, args.trials, arrays)
        ms_ours = _time(ours, args.trials, arrays)
        ratios.append(ms_theirs / ms_ours)
        print(f"{str((tuple(shapes[0]), tuple(shapes[1]))):<44} {ms_theirs:9.3f} {ms_ours:10.3f} {ratios[-1]:11.2f}")
    print(f"geometric mean TVM/tcutils: {float(np.exp(np.mean(np.log(ratios)))):.2f} (>1: tcutils faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
