"""``tvm-tcutils bench``: latency of a model built with the package's schedules, vs fp32 TVM."""
from __future__ import annotations

import argparse

from . import _checks as checks
from . import _common as cli

#: Runs per sample: each of the ``--repeat`` rounds samples the median of this many runs of each build.
_RUNS_PER_ROUND = 3

#: Checked before any work (see commands._checks).
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--target", "target", checks.runnable_target),
    checks.Check("--repeat", "repeat", checks.at_least(1)),
    checks.Check("--log", "log", checks.existing_log),
)

HELP = "build a model (int8 by default: dot-product schedules) and time it against TVM's fp32 build"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_model_argument(parser)
    parser.add_argument("--target", default=None,
                        help="TVM target (default: this CPU's, tvm_tcutils.host_target(), e.g. 'llvm -mcpu=znver4')")
    parser.add_argument("--dtype", choices=["int8", "float32"], default="int8", help="precision to build")
    parser.add_argument("--log", help="AutoTVM log from 'tvm-tcutils tune' to apply")
    parser.add_argument("--repeat", type=int, default=10,
                        help="rounds of timing, the builds in turns (median reported)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fp32 TVM build")


def run(args: argparse.Namespace) -> int:
    from .._tvm import host_target
    from ..dotprod.quantize import prepare
    from ..measure import Timer, interleave, ratio

    checks.validate(args, CHECKS)
    target = args.target or host_target()  # code for another CPU may not run here (SIGILL)
    float_mod, float_params = cli.load_model_arg(args)
    mod, params = prepare(float_mod, float_params, args.dtype)
    timers = {args.dtype: Timer(mod, params, target, repeat=_RUNS_PER_ROUND, tuning_log=args.log).sample}
    if not args.no_baseline:
        timers["baseline"] = Timer(float_mod, float_params, target, repeat=_RUNS_PER_ROUND).sample
    # In turns, one sample of each per round: a drift of the machine's load hits both builds alike.
    timed = interleave(timers, rounds=args.repeat)
    ours = timed[args.dtype]
    print(f"{args.model} {args.dtype} on {target}: {ours.median_ms:.3f} ms (median of {args.repeat})")
    if not args.no_baseline:
        base = timed["baseline"]
        speedup = ratio(base, ours)
        print(f"{args.model} float32 (TVM) on {target}: {base.median_ms:.3f} ms; speedup x{speedup.value:.2f} "
              f"[{speedup.low:.2f}, {speedup.high:.2f}] ({100 * speedup.confidence:.0f} % interval)")
    return 0
