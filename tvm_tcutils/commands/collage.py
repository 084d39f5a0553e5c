"""``tvm-tcutils collage``: partition a model across toolchains by cost, report and save it."""
from __future__ import annotations

import argparse
import math
from typing import List, Optional

from . import _checks as checks

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
)

HELP = "partition a model across TVM, ONNX Runtime, BLAS (and BYOC toolchains) at minimum latency"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ._common import add_model_argument

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
    parser.add_argument("--estimator", choices=["measured", "learned"], default="measured",
                        help="measure every candidate, or learn from some (XGBoost) and measure the rest "
                             "only where they can change the answer")
    parser.add_argument("--cache-dir", default=None, help="cost cache directory (default ~/.cache/tvm-tcutils/collage)")
    parser.add_argument("--workers", type=int, default=1, help="measuring worker processes")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per candidate build and run")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per candidate (median)")
    parser.add_argument("--no-compare", action="store_true",
                        help="skip measuring the whole model for each single toolchain")
    parser.add_argument("--log", help="append one line per measurement to this file")
    parser.add_argument("--retry-failed", action="store_true",
                        help="measure again the candidates the cost cache holds as failed (otherwise after a day)")
    parser.add_argument("--tuning-log", default=None,
                        help="AutoTVM log for TVM's candidates (from 'tvm-tcutils tune MODEL --dtype float32')")
    parser.add_argument("--target", default=None,
                        help="target of TVM's builds and measurements (default: this CPU, e.g. 'llvm -mcpu=znver4')")


def _fmt(ms: Optional[float]) -> str:
    if ms is None:
        return "n/a"
    return "failed" if not math.isfinite(ms) else f"{ms:.3f}"


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


def run(args: argparse.Namespace) -> int:
    from ._common import CommandError, load_model_arg
    from ..collage import driver, report
    from ..collage.cost.measured import MeasuredCostEstimator
    from ..collage.toolchains import resolve, tvm_toolchain, with_max_depth
    from ..models import save_model

    if args.list:
        print("\n".join(toolchain_lines()))
        return 0
    if args.model is None:
        raise CommandError("collage: name a MODEL (or use --list to see the toolchains)")
    checks.validate(args, CHECKS)
    toolchains = with_max_depth(resolve(args.toolchains), args.max_depth)
    mod, params = load_model_arg(args)
    measured = MeasuredCostEstimator(cache_dir=args.cache_dir, workers=args.workers, timeout=args.timeout,
                                     repeat=args.repeat, log_file=args.log, target=args.target,
                                     tuning_log=args.tuning_log, retry_failed=args.retry_failed,
                                     progress=False if getattr(args, "verbosity", None) == "quiet" else None)
    estimator = measured
    if args.estimator == "learned":
        from ..collage.cost.learned import XGBoostCostEstimator

        estimator = XGBoostCostEstimator(measured)
    try:
        result = driver.partition(mod, params, toolchains, estimator)
    finally:
        measured.close()
    print(f"Collage on {args.model}: toolchains {', '.join(tc.name for tc in toolchains)}; "
          f"{result.candidates} candidates, {result.states} search states; "
          + ", ".join(f"{k} {v:.2f} s" for k, v in result.seconds.items()))
    for line in report.partition_table(result):
        print(line)
    if args.output:
        save_model(args.output, result.mod)
        print(f"wrote {args.output}")
    if args.dot:
        print(f"wrote {report.write_picture(result, args.dot)}")

    if result.trials:
        print("validation (whole models built and timed; the fastest is kept):")
        for label, est, ms in result.trials:
            print(f"  {label:<36} estimated {_fmt(est):>9} ms  measured {_fmt(ms):>9} ms")
    if result.side_by_side:
        print("validation, the distinct ones timed again side by side (round-robin):")
        for label, est, ms in result.side_by_side:
            print(f"  {label:<36} estimated {_fmt(est):>9} ms  measured {_fmt(ms):>9} ms")
    rows: List[tuple] = [("collage", result.estimated_ms, result.mod)]
    tvm_tc = tvm_toolchain(toolchains)
    for tc in toolchains:
        if tc.is_tvm:
            rows.append((f"{tc.name} alone", result.single_toolchain_ms.get(tc.name), tc.rewrite(result.prepared)))
            continue
        greedy = driver.greedy_partition(result.prepared, None, tc, tvm_tc) if tc.buildable() else None
        rows.append((f"{tc.name} (+tvm)", result.single_toolchain_ms.get(tc.name), greedy))
    timed = [k for k, (_, _, module) in enumerate(rows) if module is not None]
    times = [None] * len(rows)
    if not args.no_compare:
        try:
            found = measured.whole_model_timer().time_side_by_side([rows[k][2] for k in timed]) or []
        finally:
            measured.close()
        for k, ms in zip(timed, found):
            times[k] = ms
    print(f"{'':<14} {'estimated ms':>13} {'measured ms':>12}")
    for (name, est, _), ms in zip(rows, times):
        print(f"{name:<14} {_fmt(est):>13} {_fmt(ms):>12}")
    print("estimated: Collage's search restricted to those toolchains; measured: the whole models built and "
          "timed side by side (single toolchains: BYOC's greedy partitioning)")
    return 0
