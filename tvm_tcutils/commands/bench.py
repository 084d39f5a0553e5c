"""``tvm-tcutils bench``: latency of a model built with the package's schedules, vs fp32 TVM."""
from __future__ import annotations

import argparse
import contextlib

from . import _checks as checks
from . import _common as cli

#: Runs per sample: each of the ``--repeat`` rounds samples the median of this many runs of each build.
_RUNS_PER_ROUND = 3

#: Checked before any work (see commands._checks).
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--target", "target", checks.runnable_target),
    checks.Check("--repeat", "repeat", checks.at_least(1)),
    checks.Check("--time-budget", "time_budget", checks.positive),
    checks.Check("--log", "log", checks.existing_log),
    checks.Check("--plot", "plot", checks.plot_output),
    *checks.RPC_CHECKS,
)

#: Options that have no meaning for an emulated run (it is profiled, not timed, and runs here).
_NOT_EMULATED = (("--plot", "plot"), ("--log", "log"), ("--time-budget", "time_budget"),
                 ("--rpc-tracker", "rpc_tracker"), ("--rpc-key", "rpc_key"))


def _node_choice(value: str, option: str, args: argparse.Namespace) -> None:
    from ..dotprod.hexagon_model import NODE_CHOICES  # with --emulate only: the CLI starts without TVM's C route

    checks.one_of(NODE_CHOICES, why="it names the nodes to record")(value, option, args)


#: Checked before any work with ``--emulate``.
EMULATE_CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--target", "target", checks.emulated_hexagon_target),
    checks.Check("--dtype", "dtype", checks.one_of(("int8",), why="--emulate runs integer models")),
    checks.Check("--timeout", "timeout", checks.positive),
    checks.Check("--per-node", "per_node", _node_choice),
    *(checks.Check(option, dest, checks.not_with("--emulate")) for option, dest in _NOT_EMULATED),
)

HELP = "build a model (int8 by default: dot-product schedules) and time it against TVM's fp32 build"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_model_argument(parser)
    cli.add_target_argument(parser)
    parser.add_argument("--dtype", choices=["int8", "float32"], default="int8", help="precision to build")
    parser.add_argument("--log", help="AutoTVM log from 'tvm-tcutils tune' to apply")
    parser.add_argument("--repeat", type=int, default=10,
                        help="rounds of timing, the builds in turns (median reported)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the fp32 TVM build")
    parser.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                        help="stop timing after the round that ends past this many seconds (fewer rounds)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar while timing")
    parser.add_argument("--plot", metavar="PATH",
                        help="draw the timings (or, with the baseline, the speedup) as a bar chart "
                             "(.png/.svg/.pdf; needs matplotlib)")
    parser.add_argument("--emulate", action="store_true",
                        help="with --target hexagon: build for Hexagon HVX (C), run under qemu-hexagon and print "
                             "an instruction profile against TVM's plain schedules (no times), outputs checked "
                             "bit for bit against the x86 build")
    parser.add_argument("--timeout", type=float, default=3000, metavar="SECONDS",
                        help="with --emulate: seconds each emulated run may take (default %(default)s)")
    parser.add_argument("--per-node", nargs="?", const="auto", default=None, metavar="NODES",
                        help="with --emulate: also record the nodes' values on Hexagon and x86 and name the first "
                             "node that differs (NODES: auto (default), boundaries or all; see "
                             "dotprod.hexagon_model.differential_run)")
    cli.add_rpc_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._tvm import host_target
    from ..dotprod.quantize import is_quantized, prepare
    from ..measure import Timer, interleave, ratio

    if args.emulate:
        return _emulate(args)
    if args.per_node is not None:
        raise cli.CommandError("--per-node needs --emulate (it compares an emulated Hexagon run with x86 "
                               "node by node)")
    checks.validate(args, CHECKS)
    remote = cli.rpc_backend(args)
    target = args.target or host_target()  # code for another CPU may not run here (SIGILL)
    float_mod, float_params = cli.load_model_arg(args)
    mod, params = prepare(float_mod, float_params, args.dtype)
    if not args.no_baseline and is_quantized(float_mod):
        # A quantizer's int8 file has no float model in it to compare with.
        print(f"{args.model} is already quantized: built as it is, without a float32 baseline")
        args.no_baseline = True
    # Remotely, both builds run on one server (the same device), in one session.
    with remote.one_server() if remote else contextlib.nullcontext():
        timers = {args.dtype: Timer(mod, params, target, repeat=_RUNS_PER_ROUND, tuning_log=args.log,
                                    backend=remote)}
        if not args.no_baseline:
            timers["baseline"] = Timer(float_mod, float_params, target, repeat=_RUNS_PER_ROUND, backend=remote)
        # In turns, one sample of each per round: a drift of the machine's load hits both builds alike.
        quiet = args.no_progress or getattr(args, "verbosity", None) == "quiet"
        timed = interleave({name: timer.sample for name, timer in timers.items()}, rounds=args.repeat,
                           progress=False if quiet else None, time_budget_s=args.time_budget)
        where = f" (RPC server {timers[args.dtype].where}, key {remote.key})" if remote else ""
        for timer in timers.values():
            timer.close()
    ours = timed[args.dtype]
    rounds = len(ours.samples_ms)
    cut = f", the time budget ended after {rounds} of {args.repeat} rounds" if rounds < args.repeat else ""
    print(f"{args.model} {args.dtype} on {target}{where}: {ours.median_ms:.3f} ms (median of {rounds}{cut})")
    if not args.no_baseline:
        base = timed["baseline"]
        speedup = ratio(base, ours)
        print(f"{args.model} float32 (TVM) on {target}: {base.median_ms:.3f} ms; speedup x{speedup.value:.2f} "
              f"[{speedup.low:.2f}, {speedup.high:.2f}] ({100 * speedup.confidence:.0f} % interval)")
    if args.plot:
        _plot(args, timed, target)
    return 0


def _plot(args: argparse.Namespace, timed: dict, target: str) -> None:
    """The bar chart of this run: the speedup over fp32 TVM, or the timing alone without a baseline."""
    import sys

    from ..bench.plot import plot
    from ..bench.results import Results
    from ..measure import ratio

    results = Results("bench", target=target, dtype=args.dtype, repeat=args.repeat)
    results.command = ["tvm-tcutils", *sys.argv[1:]]  # the title and the record name the command, not a script
    if "baseline" in timed:
        results.add(model=args.model, speedup=ratio(timed["baseline"], timed[args.dtype]))
    else:
        results.add(model=args.model, **{args.dtype: timed[args.dtype]})
    print(f"wrote {plot(results.payload(), args.plot)}")


def _emulate(args: argparse.Namespace) -> int:
    """``--emulate``: the model's int8 build profiled under qemu-hexagon; 1 when an output check fails."""
    import time

    from ..dotprod import hexagon_profile
    from ..models import random_inputs

    checks.validate(args, EMULATE_CHECKS)
    target = checks.hexagon_target(args.target)
    start = time.time()
    mod, params, notes = hexagon_profile.integer_model(*cli.load_model_arg(args))
    inputs = random_inputs(mod, params)
    print(f"{args.model}: {'; '.join(notes)} ({time.time() - start:.0f} s)", flush=True)
    plain = str(hexagon_profile.plain_target(target)).strip()
    print(f"building for {target} and running under qemu-hexagon"
          + ("" if args.no_baseline else f", then TVM's plain schedules ({plain})")
          + " (an instruction profile, not a device time)", flush=True)
    start = time.time()
    compared = hexagon_profile.compare_builds(mod, params, inputs, timeout=args.timeout, target=target,
                                              plain=not args.no_baseline)
    print(hexagon_profile.format_table(compared.package, compared.plain))
    print(f"{args.model} on emulated {target} ({time.time() - start:.0f} s):\n{compared.summary()}")
    if args.per_node is not None:
        from ..dotprod import hexagon_model

        start = time.time()
        report = hexagon_model.differential_run(mod, params, inputs, timeout=args.timeout, target=target,
                                                nodes=args.per_node)
        print(f"per node ({args.per_node}, {time.time() - start:.0f} s): {report.summary()}")
    elif not compared.equals_x86:
        print("rerun with --per-node to name the first node that differs")
    return 0 if compared.bit_exact else 1
