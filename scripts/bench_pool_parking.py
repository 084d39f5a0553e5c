#!/usr/bin/env python
"""Mixed TVM/onnxruntime models with and without parking TVM's pool during onnxruntime calls.

TVM's pool workers spin between TVM operators (``TVM_THREAD_POOL_SPIN_COUNT``,
300,000 ``sched_yield`` calls by default), so while a compiled model calls into
onnxruntime, onnxruntime's threads share cores with spinning TVM workers. The
package's native helper ``tvm_tcutils.native.park_pool`` puts the workers to
sleep for calls whose previous run took at least ``TVM_TCUTILS_PARK_MIN_US``
(default 500 us). For each model a fixed mix (a rule by operator kind, applied
with ``MockCostEstimator``; not a search) is built once per variant in this
process and timed round-robin:

* ``no parking``: the bridge as it was (raw C callback);
* ``parking (default)`` (the package's threshold) and ``parking always`` (0 us);
* ``ORT greedy`` and ``TVM alone`` for reference.

With ``--spin-zero`` the script also runs itself in a child process with
``TVM_THREAD_POOL_SPIN_COUNT=0`` (read once per process, so it needs its own)
and prints that row: workers that never spin, the other way out, which slows
TVM's own operators.

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_pool_parking.py --spin-zero
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Sequence

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tvm  # noqa: E402

import tvm_tcutils  # noqa: E402
from tvm_tcutils import collage, native  # noqa: E402
from tvm_tcutils.collage.cost.mock import MockCostEstimator  # noqa: E402
from tvm_tcutils.collage.driver import greedy_partition  # noqa: E402
from tvm_tcutils.collage.toolchains import ort  # noqa: E402
from tvm_tcutils.collage.toolchains.packed_call import _PARK_MIN_US_DEFAULT  # noqa: E402

from bench_collage_models import interleaved_ms, runner  # noqa: E402

_CHEAP = 0.05
#: Mixes by operator kind: per-op costs (ms) that make the search send the named kinds to ORT.
MIXES = {
    # Convolutions (with their bias/activation) on onnxruntime; pooling, concatenation... on TVM.
    "convs-on-ort": {
        "ort": {"nn.conv2d": 1.0, "add": _CHEAP, "nn.relu": _CHEAP, "nn.bias_add": _CHEAP, "multiply": _CHEAP,
                "*": 9.0},
        "tvm": {"nn.conv2d": 3.0, "*": _CHEAP},
    },
    # The per-op-kind split of the encoder: GELU's erf, softmax and batch_matmul on onnxruntime.
    "attention-on-ort": {
        "ort": {"erf": 0.1, "nn.softmax": 0.1, "nn.batch_matmul": 0.1, "*": 9.0},
        "tvm": {"erf": 1.0, "nn.softmax": 1.0, "nn.batch_matmul": 1.0, "*": _CHEAP},
    },
}
DEFAULT_MODELS = "inception_v3:convs-on-ort,bert-tiny-onnx:attention-on-ort"
VARIANTS = ("no parking", "parking (default)", "parking always", "ORT greedy", "TVM alone")


def mix(mod, params, rule: str):
    """The module partitioned by ``MIXES[rule]`` (tvm and ort), and its partition counts."""
    estimator = MockCostEstimator(MIXES[rule], overhead={"ort": 0.2, "tvm": 0.2})
    result = collage.partition(mod, params, toolchains="tvm,ort", cost_estimator=estimator, validate_rounds=0)
    counts = {name: sum(p.toolchain == name for p in result.partitions) for name in ("tvm", "ort")}
    return result.mod, counts


def time_variants(model: str, rule: str, rounds: int, repeat: int, only_unparked: bool,
                  extra_us: Sequence[float] = ()) -> dict:
    mod, params = tvm_tcutils.load_model(model)
    mixed, counts = mix(mod, params, rule)
    raw = ort.TOOLCHAIN.run_function(park=False)
    wrap = native.get("tvm_tcutils.native.park_pool")
    calls = {"no parking": raw}
    if not only_unparked:
        calls.update({"parking (default)": wrap(raw, _PARK_MIN_US_DEFAULT), "parking always": wrap(raw, 0.0)})
        calls.update({f"parking >= {us:g}us": wrap(raw, us) for us in extra_us})
    timers = {}
    try:
        # Compiled code looks the packed function up at its first call and keeps it: each variant is
        # built and warmed up (``runner``) while its function is the registered one.
        for label, function in calls.items():
            tvm.register_func(ort.TOOLCHAIN.run_name, function, override=True)
            timers[label] = runner(mixed, repeat)
    finally:
        tvm.register_func(ort.TOOLCHAIN.run_name, ort.TOOLCHAIN.run_function(), override=True)
    timers["ORT greedy"] = runner(greedy_partition(mod, params, "ort"), repeat)
    timers["TVM alone"] = runner(mod, repeat)
    times = interleaved_ms(list(timers.values()), rounds)
    return {"partitions": counts, "ms": dict(zip(timers, times)), "load": os.getloadavg()[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"model:mix pairs, mixes: {', '.join(MIXES)} (default {DEFAULT_MODELS})")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--spin-zero", action="store_true",
                        help="also time the mix unparked in a child process with TVM_THREAD_POOL_SPIN_COUNT=0")
    parser.add_argument("--also-us", default="", help="more parking thresholds to time (us, comma-separated)")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # the child's output
    parser.add_argument("--only-unparked", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    pairs = [item.split(":") for item in args.models.split(",") if item]
    for pair in pairs:
        if len(pair) != 2 or pair[1] not in MIXES:
            parser.error(f"--models takes model:mix pairs with a mix of {', '.join(MIXES)}, got {':'.join(pair)!r}")
    if native.get("tvm_tcutils.native.park_pool") is None:
        raise SystemExit("the native helpers are not built: run scripts/build_native.sh")
    ok, reason = ort.available()
    if not ok:
        raise SystemExit(f"onnxruntime toolchain unavailable: {reason}")

    extra_us = [float(v) for v in args.also_us.split(",") if v]
    rows = {f"{m}:{r}": time_variants(m, r, args.rounds, args.repeat, args.only_unparked, extra_us) for m, r in pairs}
    if args.json:
        print(json.dumps(rows))
        return 0
    spin_zero = {}
    if args.spin_zero:
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--models", args.models, "--rounds", str(args.rounds),
             "--repeat", str(args.repeat), "--json", "--only-unparked"],
            capture_output=True, text=True, env={**os.environ, "TVM_THREAD_POOL_SPIN_COUNT": "0"},
        )
        if child.returncode != 0:
            raise SystemExit(f"the TVM_THREAD_POOL_SPIN_COUNT=0 run failed:\n{child.stderr[-3000:]}")
        spin_zero = json.loads(child.stdout.strip().splitlines()[-1])

    threads = os.environ.get("TVM_NUM_THREADS", "default")
    print(f"{tvm_tcutils.host_target()}, TVM_NUM_THREADS={threads}, median of {args.rounds} rounds (ms); "
          f"default parking threshold {_PARK_MIN_US_DEFAULT:g} us")
    variants = [*VARIANTS, *(f"parking >= {us:g}us" for us in extra_us)]
    header = ["model:mix", "partitions", *variants, "parked/unparked", "load"]
    if spin_zero:
        header[-2:-2] = ["spin=0: mix", "spin=0: TVM alone"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name, row in rows.items():
        ms = row["ms"]
        cells = [name, f"{row['partitions']['ort']} ORT + {row['partitions']['tvm']} TVM"]
        cells += [f"{ms[v]:.2f}" for v in variants]
        if spin_zero:
            other = spin_zero[name]["ms"]
            cells += [f"{other['no parking']:.2f}", f"{other['TVM alone']:.2f}"]
        cells += [f"x{ms['parking (default)'] / ms['no parking']:.3f}", f"{row['load']:.1f}"]
        print("| " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
