#!/usr/bin/env python
"""How far apart AutoTVM's measurements of one configuration land while a model is tuned.

``tvm_tcutils.tuning.tune`` measures each task's untuned configuration first; here the same configuration is
measured again at the start of the second and third batches (a few trials later, same server, same
settings), so each task's log holds three measurements of it beside the tuner's own trials. The spread of
the three is the noise a single trial carries: when it exceeds the configs' differences, the tuner picks
by noise.

    PYTHONPATH=. python scripts/probe_tuning_noise.py --model resnet-18-onnx --target "llvm -mcpu=core-avx2" \\
        --json docs/benchmarks/data/probe_tuning_noise_r18_avx2.json

``--no-flush`` measures on cached weights; run it under ``taskset -c N`` to keep every process on one CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

os.environ.setdefault("TVM_NUM_THREADS", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm_tcutils  # noqa: E402
from tvm_tcutils import tuning  # noqa: E402
from tvm_tcutils.bench.int8_models import ROUTES, model_files  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.dotprod.quantize import prepare  # noqa: E402

#: Batches (0 = the first) that start with the untuned configuration again.
REPEAT_BATCHES = (1, 2)


class _DefaultAgain(tuning._DefaultFirst):
    """The package's tuner, measuring the untuned configuration again at the start of :data:`REPEAT_BATCHES`."""

    def __init__(self, task, default, **kwargs):
        super().__init__(task, default, **kwargs)
        self._again, self._batches = default, 0

    def next_batch(self, batch_size):
        index, self._batches = self._batches, self._batches + 1
        out = super().next_batch(batch_size)
        if index in REPEAT_BATCHES and self._again is not None:
            out = [self.space.get(self._again)] + out[:max(batch_size - 1, 0)]
        return out


class _NoFlush(tuning.PackageLocalRunner):
    """The package's local runner with AutoTVM's cache flush off."""

    def __init__(self, *args, **kwargs):
        kwargs["enable_cpu_cache_flush"] = False
        super().__init__(*args, **kwargs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet-18-onnx", help="a zoo model with an ONNX file")
    parser.add_argument("--route", default="qdq", choices=[r for r in ROUTES if r != "fp32"])
    parser.add_argument("--target", default=None, help="LLVM target (default: this CPU's); it must run here")
    parser.add_argument("--trials", type=int, default=6, help="trials a task, the repeats included")
    parser.add_argument("--no-flush", action="store_true",
                        help="measure without flushing the weights' caches first (tune's CPU runner flushes them)")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.trials < 2 * (max(REPEAT_BATCHES) + 1):
        parser.error(f"--trials must be at least {2 * (max(REPEAT_BATCHES) + 1)} (the repeats need their batches)")
    target = args.target or tvm_tcutils.host_target()
    mod, params = prepare(*tvm_tcutils.load_model(model_files(args.model, [args.route])[args.route]), "int8")
    saved = tuning._DefaultFirst, tuning.PackageLocalRunner
    tuning._DefaultFirst = _DefaultAgain
    if args.no_flush:
        tuning.PackageLocalRunner = _NoFlush
    try:
        with tempfile.TemporaryDirectory() as folder:
            log = os.path.join(folder, "probe.log")
            tuning.tune(mod, params, target, args.trials, log, progress=False)
            rows = [json.loads(line) for line in open(log)]
    finally:
        tuning._DefaultFirst, tuning.PackageLocalRunner = saved
    results = Results(__file__, argv, model=args.model, route=args.route, target=target, trials=args.trials,
                      tvm_num_threads=os.environ["TVM_NUM_THREADS"], weights_flushed=not args.no_flush,
                      cpus=sorted(os.sched_getaffinity(0)))
    by_task: dict = {}
    for row in rows:
        by_task.setdefault(json.dumps(row["input"][2]), []).append(row)
    print(f"{args.model} ({args.route}), {target}: the untuned config measured three times a task, us")
    for workload, records in by_task.items():
        default = records[0]["config"]["index"]
        us = [1e6 * sum(r["result"][0]) / len(r["result"][0]) for r in records if r["config"]["index"] == default]
        others = [1e6 * sum(r["result"][0]) / len(r["result"][0]) for r in records if r["config"]["index"] != default]
        spread = max(us) / min(us)
        print(f"{workload[:60]:60s} " + " ".join(f"{u:8.1f}" for u in us) + f"   max/min x{spread:.2f}")
        results.add(workload=json.loads(workload), untuned_us=us, untuned_max_over_min=spread, other_trials_us=others)
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
