"""``tvm-tcutils tune``: AutoTVM (XGBTuner) tuning of a model's tasks, resumable from its log."""
from __future__ import annotations

import argparse

from . import _checks as checks
from . import _common as cli

#: Checked before any work (see commands._checks).
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--target", "target", checks.runnable_target),
    checks.Check("--trials", "trials", checks.at_least(1)),
    checks.Check("--confirm-rounds", "confirm_rounds", checks.at_least(0)),
    checks.Check("--log", "log", checks.new_or_log_file),
    *checks.RPC_CHECKS,
)

HELP = "tune a model's AutoTVM tasks (int8 dot-product templates included) with XGBTuner"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cli.add_model_argument(parser)
    cli.add_target_argument(parser)
    parser.add_argument("--trials", type=int, default=32, help="measurements per task, log included")
    parser.add_argument("--log", required=True, help="AutoTVM log file: appended to, and resumed from")
    parser.add_argument("--dtype", choices=["int8", "float32"], default="int8",
                        help="tune the int8-quantized model (default) or the float one")
    parser.add_argument("--templates", nargs="+", metavar="NAME",
                        help="tune only these AutoTVM templates' tasks (say, tcutils.conv2d_hwnc_tensorcore.cuda)")
    parser.add_argument("--confirm-rounds", type=int, default=7,
                        help="rounds in turns that measure a task's untuned config against the tuner's fastest "
                             "before one is chosen (0: the least single trial, AutoTVM's choice)")
    parser.add_argument("--no-progress", action="store_true", help="no per-task progress bar")
    cli.add_rpc_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .._tvm import host_target
    from ..dotprod.quantize import prepare
    from ..tuning import tune

    checks.validate(args, CHECKS)
    remote = cli.rpc_backend(args)
    mod, params = prepare(*cli.load_model_arg(args), args.dtype)

    def announce(index, total, task, todo):
        state = f"{todo} new trials" if todo else "done (in the log)"
        print(f"task {index + 1}/{total} {task.name}: {state}", flush=True)

    quiet = getattr(args, "verbosity", None) == "quiet"
    summary = tune(mod, params, args.target or host_target(), args.trials, args.log,
                   progress=not (args.no_progress or quiet),
                   on_task=announce, remote=remote, templates=args.templates, confirm_rounds=args.confirm_rounds)
    where = f" on RPC key {remote}" if remote else ""
    print(f"tuned {len(summary)} tasks{where}, {sum(n for _, n in summary)} new trials; log: {args.log}")
    return 0
