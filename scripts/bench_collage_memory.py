"""Peak resident memory of the whole process tree of a measured Collage search, per model.

Each model is searched by a child process (``python -m tvm_tcutils collage
MODEL --estimator measured --workers N --cache-dir FRESH``, a fresh cache so
that every candidate is measured); the resident set sizes of the child and all
its descendants (measuring workers included) are summed from ``/proc`` every
``--interval`` seconds and the largest sum is reported, with the number of
candidates measured (lines of the search's ``--log``) and whether the run
finished within ``--limit`` seconds (if not, the peak reached until then).

    PYTHONPATH=. python scripts/bench_collage_memory.py --models vgg-16,resnet-50,bert-tiny-onnx \\
        --toolchains tvm,ort --workers 1 --timeout 60
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.collage_memory import collage_command, measured_count, run_sampled  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import aligned  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="vgg-16,resnet-50,bert-tiny-onnx")
    parser.add_argument("--toolchains", default="tvm,ort")
    parser.add_argument("--workers", type=int, default=1, help="measuring worker processes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per candidate build and run")
    parser.add_argument("--limit", type=float, default=1500.0,
                        help="seconds one search may run before it is stopped (its peak so far is reported)")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between RSS samples")
    parser.add_argument("--compare", action="store_true",
                        help="also time each single toolchain's answer whole (the search's --no-compare is "
                             "passed otherwise; validation of Collage's own answer runs either way)")
    parser.add_argument("--keep-logs", default=None, help="keep each child's output and measurement log here")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    results = Results(__file__, argv, toolchains=args.toolchains, workers=args.workers, timeout=args.timeout,
                      limit_s=args.limit, compare=args.compare)
    header = ["model", "peak tree RSS GiB", "search process GiB", "measured", "seconds", "finished"]
    rows = []
    for model in args.models.split(","):
        scratch = tempfile.mkdtemp(prefix=f"collage-memory-{model}-")
        log_dir = args.keep_logs or scratch
        os.makedirs(log_dir, exist_ok=True)
        measure_log = os.path.join(log_dir, f"{model}-measured.log")
        if os.path.exists(measure_log):
            os.remove(measure_log)
        command = collage_command(model, args.toolchains, args.workers, os.path.join(scratch, "cache"),
                                  args.timeout, ["--log", measure_log] + ([] if args.compare else ["--no-compare"]))
        run = run_sampled(command, args.interval, args.limit, log_path=os.path.join(log_dir, f"{model}.out"))
        finished = run.returncode == 0 and not run.timed_out
        count = measured_count(measure_log)
        row = [model, f"{run.peak_gib:.2f}", f"{run.peak_root_bytes / 2 ** 30:.2f}", str(count), f"{run.seconds:.0f}",
               "yes" if finished else ("stopped at --limit" if run.timed_out else f"exit {run.returncode}")]
        rows.append(row)
        print("  ".join(row), flush=True)
        if not finished and not run.timed_out:
            print(run.output_tail, file=sys.stderr)
        results.add(model=model, peak_tree_rss_bytes=run.peak_bytes, peak_tree_rss_gib=round(run.peak_gib, 3),
                    peak_search_process_bytes=run.peak_root_bytes,
                    measured=count, seconds=round(run.seconds, 1), finished=finished, timed_out=run.timed_out,
                    returncode=run.returncode)
        shutil.rmtree(scratch, ignore_errors=True)
    print()
    print(aligned(header, rows))
    print(f"peak tree RSS: the search process and all its descendants (search process: itself alone), "
          f"sampled every {args.interval} s; "
          f"measured: candidates measured (fresh cache); toolchains {args.toolchains}, workers {args.workers}")
    results.write(args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
