"""``tvm-tcutils bench``: latency of a model built with the package's schedules, vs fp32 TVM."""
from __future__ import annotations

import argparse

from .. import cli

HELP = "build a model (int8 by default: dot-product schedules) and time it against TVM's fp32 build"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_model_argument(parser)
    parser.add_argument("--target", default=None,
                        help="TVM target (default: this CPU's, tvm_tcutils.host_target(), e.g. 'llvm -mcpu=znver4')")
    parser.add_argument("--dtype", choices=["int8", "float32"], default="int8", help="precision to build")
    parser.add_argument("--log", help="AutoTVM log from 'tvm-tcutils tune' to apply")
    parser.add_argument("--repeat", type=int, default=10, help="timed runs (median reported)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fp32 TVM build")


def run(args: argparse.Namespace) -> int:
    from .._tvm import host_target
    from ..dotprod.quantize import prepare
    from ..measure import build, latency_ms

    if args.repeat < 1:
        raise cli.CommandError(f"--repeat must be at least 1, got {args.repeat}")
    target = args.target or host_target()  # code for another CPU may not run here (SIGILL)
    float_mod, float_params = cli.load_model_arg(args)
    mod, params = prepare(float_mod, float_params, args.dtype)
    ms, _ = latency_ms(build(mod, params, target, args.log), mod, params, args.repeat)
    print(f"{args.model} {args.dtype} on {target}: {ms:.3f} ms (median of {args.repeat})")
    if not args.no_baseline:
        base_ms, _ = latency_ms(build(float_mod, float_params, target), float_mod, float_params, args.repeat)
        print(f"{args.model} float32 (TVM) on {target}: {base_ms:.3f} ms; speedup x{base_ms / ms:.2f}")
    return 0
