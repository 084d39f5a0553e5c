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

The harness is ``tvm_tcutils.bench.toolchains``; results also go to JSON (``--json``).

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

import tvm_tcutils  # noqa: E402
from tvm_tcutils import native  # noqa: E402
from tvm_tcutils.bench import toolchains as bench  # noqa: E402
from tvm_tcutils.bench.competitors import add_timing_arguments, compare, use_timing_arguments  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import markdown  # noqa: E402
from tvm_tcutils.collage.toolchains import ort  # noqa: E402
from tvm_tcutils.collage.toolchains.packed_call import _PARK_MIN_US_DEFAULT  # noqa: E402
from tvm_tcutils.measure import ratio  # noqa: E402

MIXES = bench.MIXES
DEFAULT_MODELS = "inception_v3:convs-on-ort,bert-tiny-onnx:attention-on-ort"
VARIANTS = ("no parking", "parking (default)", "parking always", "ORT greedy", "TVM alone")


def time_variants(model: str, rule: str, rounds: int, repeat: int, only_unparked: bool,
                  extra_us: Sequence[float] = ()) -> dict:
    mod, params = tvm_tcutils.load_model(model)
    mixed, counts = bench.mix(mod, params, rule)
    thresholds = {} if only_unparked else {
        "parking (default)": _PARK_MIN_US_DEFAULT, "parking always": 0.0,
        **{f"parking >= {us:g}us": us for us in extra_us}}
    timed = compare(bench.parking_timers(mod, params, mixed, repeat, thresholds), rounds)
    return {"partitions": counts, "timings": timed, "ms": {k: t.median_ms for k, t in timed.items()},
            "load": os.getloadavg()[0]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=DEFAULT_MODELS,
                        help=f"model:mix pairs, mixes: {', '.join(MIXES)} (default {DEFAULT_MODELS})")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--spin-zero", action="store_true",
                        help="also time the mix unparked in a child process with TVM_THREAD_POOL_SPIN_COUNT=0")
    parser.add_argument("--also-us", default="", help="more parking thresholds to time (us, comma-separated)")
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)  # the spin=0 child: JSON on stdout
    args = parser.parse_args(argv)
    use_timing_arguments(args)
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
    rows = {f"{m}:{r}": time_variants(m, r, args.rounds, args.repeat, args.child, extra_us) for m, r in pairs}
    if args.child:
        print(json.dumps({name: {"ms": row["ms"]} for name, row in rows.items()}))
        return 0
    spin_zero = {}
    if args.spin_zero:
        child = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--models", args.models, "--rounds", str(args.rounds),
             "--repeat", str(args.repeat), "--child"],
            capture_output=True, text=True, env={**os.environ, "TVM_THREAD_POOL_SPIN_COUNT": "0"},
        )
        if child.returncode != 0:
            raise SystemExit(f"the TVM_THREAD_POOL_SPIN_COUNT=0 run failed:\n{child.stderr[-3000:]}")
        spin_zero = json.loads(child.stdout.strip().splitlines()[-1])

    threads = os.environ.get("TVM_NUM_THREADS", "default")
    results = Results(__file__, argv, rounds=args.rounds, repeat=args.repeat, tvm_num_threads=threads,
                      park_min_us_default=_PARK_MIN_US_DEFAULT)
    print(f"{tvm_tcutils.host_target()}, TVM_NUM_THREADS={threads}, median of {args.rounds} rounds (ms); "
          f"default parking threshold {_PARK_MIN_US_DEFAULT:g} us")
    variants = [*VARIANTS, *(f"parking >= {us:g}us" for us in extra_us)]
    header = ["model:mix", "partitions", *variants, "parked/unparked", "load"]
    if spin_zero:
        header[-2:-2] = ["spin=0: mix", "spin=0: TVM alone"]
    table = []
    for name, row in rows.items():
        ms = row["ms"]
        parked = ratio(row["timings"]["parking (default)"], row["timings"]["no parking"])
        cells = [name, f"{row['partitions']['ort']} ORT + {row['partitions']['tvm']} TVM"]
        cells += [f"{ms[v]:.2f}" for v in variants]
        if spin_zero:
            other = spin_zero[name]["ms"]
            cells += [f"{other['no parking']:.2f}", f"{other['TVM alone']:.2f}"]
        cells += [f"x{parked.value:.3f}", f"{row['load']:.1f}"]
        table.append(cells)
        results.add(model_mix=name, partitions=row["partitions"], timings=row["timings"], parked_over_unparked=parked,
                    spin_zero_ms=spin_zero.get(name, {}).get("ms"), load=row["load"])
    print(markdown(header, table))
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
