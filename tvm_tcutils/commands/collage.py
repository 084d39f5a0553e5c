"""``tvm-tcutils collage``: partition a model across toolchains by cost, report and save it."""
from __future__ import annotations

import argparse
from typing import List

from . import _checks as checks
from ._common import CommandError


def _fraction(value: float, option: str, args: argparse.Namespace) -> None:
    """The value lies strictly between 0 and 1 (a confidence).

    Examples
    --------
    >>> _fraction(1.0, "--confidence", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --confidence must lie strictly between 0 and 1 (e.g. 0.95), got 1.0
    """
    if not 0 < value < 1:
        raise CommandError(f"{option} must lie strictly between 0 and 1 (e.g. 0.95), got {value}")


def _with_error_budget(path: str, option: str, args: argparse.Namespace) -> None:
    """Sample inputs only mean something with an error budget.

    Examples
    --------
    >>> _with_error_budget("x.npz", "--sample-inputs", argparse.Namespace(error_budget=None))
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --sample-inputs needs --error-budget (the error is measured on them)
    """
    if getattr(args, "error_budget", None) is None:
        raise CommandError(f"{option} needs --error-budget (the error is measured on them)")


#: Checked before any work (see commands._checks); every search here measures costs, so
#: toolchains must be buildable.
CHECKS = (
    *checks.MODEL_CHECKS,
    checks.Check("--toolchains", "toolchains", checks.measured_toolchains),
    checks.Check("--max-depth", "max_depth", checks.max_depths),
    checks.Check("--target", "target", checks.runnable_target),
    checks.Check("-o", "output", checks.model_output),
    checks.Check("--dot", "dot", checks.picture_output),
    checks.Check("--log", "log", checks.appendable_file),
    checks.Check("--tuning-log", "tuning_log", checks.existing_log),
    checks.Check("--cache-dir", "cache_dir", checks.cache_directory),
    checks.Check("--workers", "workers", checks.at_least(1)),
    checks.Check("--repeat", "repeat", checks.at_least(1)),
    checks.Check("--timeout", "timeout", checks.positive),
    checks.Check("--confidence", "confidence", _fraction),
    checks.Check("--compare-budget", "compare_budget", checks.positive),
    checks.Check("--time-budget", "time_budget", checks.positive),
    checks.Check("--error-budget", "error_budget", checks.at_least(0)),
    checks.Check("--sample-inputs", "sample_inputs", _with_error_budget),
    checks.Check("--sample-inputs", "sample_inputs", checks.npz_file),
    *checks.RPC_CHECKS,
)

HELP = "partition a model across TVM, ONNX Runtime, BLAS (and BYOC toolchains) at minimum latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._common import add_model_argument, add_rpc_arguments, add_target_argument

    add_model_argument(parser)
    # MODEL may be left out with --list.
    next(action for action in parser._actions if action.dest == "model").nargs = "?"
    parser.add_argument("--list", action="store_true",
                        help="list the toolchains known here (installed / buildable / patterns only) and exit")
    parser.add_argument("--toolchains", default=None,
                        help="comma-separated toolchains (default: tvm,ort,blas where installed); "
                             "an unknown name lists those usable here")
    parser.add_argument("--max-depth", default="",
                        help="longest operator chain per partition, e.g. 'ort=6,tvm=3' "
                             "(defaults: tvm 4, ort 4, blas 2)")
    parser.add_argument("-o", "--output", help="write the partitioned module (.json/.relay) here")
    parser.add_argument("--dot", help="write the partitioned graph as Graphviz (.dot, or .svg/.png with Graphviz)")
    parser.add_argument("--force", action="store_true", help="replace existing -o / --dot files")
    parser.add_argument("--estimator", choices=list(ESTIMATORS), default="staged",
                        help="staged (default): measure each operator alone, estimate bigger candidates from "
                             "their parts and measure those the search picks; measured: measure every "
                             "candidate (hours on an Inception-size model); learned: XGBoost on a sample, "
                             "measure where it can change the answer")
    parser.add_argument("--cache-dir", default=None, help="cost cache directory (default ~/.cache/tvm-tcutils/collage)")
    # None: the library's default (MeasuredCostEstimator's auto_workers), which the CLI had kept at 1 (half
    # the measuring on 2 CPUs: DenseNet-121's search 430 s against 191-294 through the library).
    parser.add_argument("--workers", type=int, default=None,
                        help="measuring worker processes (default: as many as the timing's threads fit in this "
                             "machine's CPUs side by side, each pinned to its own: 2 on 2 CPUs at 1 thread)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per candidate build and run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per candidate (median)")
    parser.add_argument("--no-compare", action="store_true",
                        help="time nothing whole: no validation, no comparison with each toolchain alone "
                             "(the answer is the search's mix, as estimated)")
    parser.add_argument("--confidence", type=float, default=0.95,
                        help="the mix is the answer only if faster than every toolchain alone with this "
                             "confidence (default 0.95)")
    parser.add_argument("--compare-budget", type=float, default=60.0,
                        help="seconds of interleaved timing for the final comparison (default 60)")
    parser.add_argument("--time-budget", type=float, default=DEFAULT_TIME_BUDGET_S,
                        help="seconds for the whole run (default %(default)g); when it ends, the best valid "
                             "partitioning found so far is the answer, marked partial in the report")
    parser.add_argument("--error-budget", type=float, default=None,
                        help="with lossy toolchains (openvino-bf16, tvm-fastmath beside tvm): the largest "
                             "relative error of the outputs against the exact model the answer may have; "
                             "lossy partitions are given up until it holds")
    parser.add_argument("--sample-inputs", default=None,
                        help="an .npz of input name -> array the error is measured on (default: seeded random)")
    parser.add_argument("--log", help="append one line per measurement to this file")
    parser.add_argument("--retry-failed", action="store_true",
                        help="measure again the candidates the cost cache holds as failed (otherwise after a day)")
    parser.add_argument("--tuning-log", default=None,
                        help="AutoTVM log for TVM's candidates (from 'tvm-tcutils tune MODEL --dtype float32')")
    add_target_argument(parser, "target of TVM's builds and measurements")
    add_rpc_arguments(parser)


def _staged(measured):
    from ..collage.cost.staged import StagedCostEstimator

    return StagedCostEstimator(measured)


def _learned(measured):
    from ..collage.cost.learned import XGBoostCostEstimator

    return XGBoostCostEstimator(measured)


#: ``--estimator`` choices: name -> what wraps the measuring estimator.
ESTIMATORS = {"staged": _staged, "measured": lambda measured: measured, "learned": _learned}

#: Seconds a search may take unless ``--time-budget`` says otherwise (the answer so far, marked partial).
DEFAULT_TIME_BUDGET_S = 900.0


def _status(toolchain) -> str:
    """``installed, buildable``, ``installed, patterns only`` (searchable, its codegen is missing), or
    ``missing: <reason>``."""
    ok, reason = toolchain.availability()
    if not ok:
        return f"missing: {reason}"
    return "installed, buildable" if toolchain.buildable() else "installed, patterns only"


def toolchain_lines() -> List[str]:
    """The ``collage --list`` table: every known toolchain, its status here and what it is.

    Examples
    --------
    >>> lines = toolchain_lines()
    >>> lines[0].split()
    ['toolchain', 'status', 'description']
    >>> [line for line in lines if line.startswith("tvm ")][0].split()[1:3]
    ['installed,', 'buildable']
    """
    from ..collage.toolchains import known

    rows = [(name, _status(tc), tc.description) for name, tc in known().items()]
    width = max(len(name) for name, _, _ in rows) + 2
    status_width = max((len(status) for _, status, _ in rows if not status.startswith("missing")), default=0) + 2
    lines = [f"{'toolchain':<{width}}{'status':<{status_width}}description"]
    for name, status, description in rows:
        if status.startswith("missing"):  # the reason is long: it gets the line's end
            lines.append(f"{name:<{width}}{status}")
        else:
            lines.append(f"{name:<{width}}{status:<{status_width}}{description}")
    return lines


def _sample_inputs(path):
    """The arrays of an ``.npz`` file (checked by :func:`~._checks.npz_file`), or None."""
    if path is None:
        return None
    import numpy as np

    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def _original(model: str):
    """The user's ONNX file, which the final comparison also times each ONNX runtime on; else None."""
    import os

    return os.path.abspath(model) if model.lower().endswith(".onnx") and os.path.isfile(model) else None


def run(args: argparse.Namespace) -> int:
    from ._common import load_model_arg, rpc_backend
    from ..collage import driver, picture, report
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..collage.toolchains import resolve, with_max_depth
    from ..models import save_model

    if args.list:
        print("\n".join(toolchain_lines()))
        return 0
    if args.model is None:
        raise CommandError("collage: name a MODEL (or use --list to see the toolchains)")
    checks.validate(args, CHECKS)
    toolchains = with_max_depth(resolve(args.toolchains), args.max_depth)
    mod, params = load_model_arg(args)
    quiet = getattr(args, "verbosity", None) == "quiet"
    # The driver's progress counts every candidate (cached ones too): the estimator's own bar stays off.
    measured = MeasuredCostEstimator(cache_dir=args.cache_dir, workers=args.workers, timeout=args.timeout,
                                     repeat=args.repeat, log_file=args.log, target=args.target,
                                     tuning_log=args.tuning_log, retry_failed=args.retry_failed, progress=False,
                                     remote=rpc_backend(args))
    estimator = ESTIMATORS[args.estimator](measured)
    try:
        result = driver.partition(mod, params, toolchains, estimator, compare_single=not args.no_compare,
                                  validate_rounds=0 if args.no_compare else 2, progress=False if quiet else None,
                                  time_budget_s=args.time_budget, confidence=args.confidence,
                                  compare_budget_s=args.compare_budget, error_budget=args.error_budget,
                                  sample_inputs=_sample_inputs(args.sample_inputs), original=_original(args.model))
    finally:
        measured.close()
    print(f"Collage on {args.model}: toolchains {', '.join(tc.name for tc in toolchains)}; "
          + ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items()))
    for line in report.report_lines(result, skipped="--no-compare" if args.no_compare else None):
        print(line)
    if args.output:
        save_model(args.output, result.mod)
        print(f"wrote {args.output}" + (" (partial: the time budget ended)" if result.partial else ""))
    if args.dot:
        mix_only = "" if result.answer == "collage" else f" (it shows Collage's mix; the answer is {result.answer})"
        print(f"wrote {picture.write_picture(result, args.dot)}{mix_only}")
    return 0
