"""Collage against single toolchains on whole models (the issue's success table).

For each model: every single toolchain of ``--baselines`` alone (TVM, TVM
with FastMath: their own lowering; onnxruntime, BLAS, OpenVINO f32 and bf16:
BYOC's greedy partitioning, ``partition_for_<toolchain>``-style, TVM for the
rest; one not usable here is left out with a printed note), and Collage's
answer (measured costs, or the learned estimator for ``--learned-only``)
compared with them by Collage's own final comparison
(``tvm_tcutils.bench.collage.final_table``, which calls
``tvm_tcutils.collage.validate.final_comparison``): every module built once in
this process, then timed in interleaved rounds (median of ``--repeat`` runs a
sample) until the 95 % interval of Collage / best single excludes 1, or
``--max-rounds`` / ``--budget`` ends. Then Collage's module saved and loaded
again (no new search) and the learned estimator's module, each against
Collage's in interleaved rounds. The load average is printed with each row,
with the search time and how many candidates each estimator measured (cache
misses).

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_models.py \\
        --models bert-tiny-onnx,squeezenet,mobilenet --learned-only squeezenet,mobilenet

Models in ``--learned-only`` (those whose fully measured search would take
too long) get only the learned estimator: their "collage" columns are its
result, and the measured-search columns show "-".

``encoder`` is a BERT-like encoder (4 layers, hidden 256, 4 heads, sequence
128) built in Relay the way an ONNX import shapes it; other names go to
``tvm_tcutils.load_model`` (zoo names with He-style weights, .onnx files).
The measured estimator's cache (``--cache-dir``) makes re-runs cheap (its
"measured" count says how many candidates were cache misses); the learned
estimator uses a fresh cache of its own per run so that its measurement count
and search time are those of a cold search. Whole models are timed by
``tvm_tcutils.measure`` (``tvm_tcutils.bench.competitors``); the rows also go
to JSON (``--json``), each variant's timing and its ratio to TVM alone with an
interval.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tvm  # noqa: E402

import tvm_tcutils  # noqa: E402
from tvm_tcutils import collage  # noqa: E402
from tvm_tcutils.bench import collage as bench  # noqa: E402
from tvm_tcutils.bench.competitors import (  # noqa: E402
    add_timing_arguments, compare, ratios, relay_module, timed_once, use_timing_arguments)
from tvm_tcutils.bench.models import load  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import aligned  # noqa: E402
from tvm_tcutils.models import save_model  # noqa: E402


def runner(mod, repeat: int, tuning_log=None):
    """A timer of one whole run (ms) of ``mod``, built once for this CPU (``host_target()``)."""
    return relay_module(mod, None, tvm_tcutils.host_target(), repeat=repeat, warmup=3, min_repeat_ms=50,
                        tuning_log=tuning_log)


def search(prepared, toolchains, estimator, inner):
    """Collage on ``prepared`` with ``estimator``; (result, seconds, "measured/candidates").

    The search's own final comparison is left to the benchmark (:func:`bench.final_table`), which
    times Collage's answer against every single toolchain of the table, not only those searched.
    """
    try:
        result, seconds = timed_once(lambda: collage.partition(prepared, None, toolchains, estimator,
                                                               compare_single=False))
    finally:
        inner.close()
    if estimator is not inner:  # the learned estimator: how its search/measure rounds ended
        print(f"  learned: {estimator.stats['rounds']} rounds, stopped by {estimator.stats['stop']}", flush=True)
    return result, seconds, f"{inner.stats['measured'] + inner.stats['failed']}/{result.candidates}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert-tiny-onnx,squeezenet1.0,mobilenet,mobilenet-v2-onnx,"
                                             "resnet-50,resnet-50-onnx,inception_v3")
    parser.add_argument("--toolchains", default="tvm,ort,blas", help="the toolchains Collage searches")
    parser.add_argument("--baselines", default=",".join(bench.BASELINES),
                        help="single toolchains timed next to Collage (each alone; left out with a note where "
                             "not usable here)")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "tcutils-collage-bench"))
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each whole model per round (median)")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of whole-model timing, at least")
    parser.add_argument("--max-rounds", type=int, default=40,
                        help="more rounds, until Collage / best single is separated from 1 at 95 %%")
    parser.add_argument("--budget", type=float, default=None, help="seconds of whole-model timing per model")
    parser.add_argument("--no-learned", action="store_true", help="skip the learned estimator")
    parser.add_argument("--learned-only", default="",
                        help="models searched only with the learned estimator (comma-separated)")
    parser.add_argument("--tuning-log", default=None,
                        help="AutoTVM log applied to every TVM build (costs and whole models), "
                             "e.g. from 'tvm-tcutils tune MODEL --dtype float32'")
    add_json_argument(parser, __file__)
    add_timing_arguments(parser)
    args = parser.parse_args(argv)
    use_timing_arguments(args)
    os.makedirs(args.cache_dir, exist_ok=True)  # the learned runs make their caches inside it
    toolchains = collage.resolve(args.toolchains)
    learned_only = set(filter(None, args.learned_only.split(",")))
    baselines = [name for name in args.baselines.split(",") if name]
    results = Results(__file__, argv, toolchains=args.toolchains, baselines=baselines, repeat=args.repeat,
                      rounds=args.rounds, max_rounds=args.max_rounds, budget_s=args.budget,
                      tuning_log=args.tuning_log, load_at_start=list(os.getloadavg()))
    rows, header = [], None
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name in args.models.split(","):
        mod, params = load(name)
        prepared = collage.prepare(mod, params)
        singles, notes = bench.baseline_modules(prepared, toolchains, baselines)
        if header is None:
            for note in notes:
                print(f"note: {note}", flush=True)
            results.settings["left_out"] = notes
            header = ["model", *[f"{label} ms" for label in singles], "collage ms", "answer",
                      "collage / best single [95 %]", "loaded / collage", "measured: search s", "measured"]
            if not args.no_learned:
                header += ["learned / collage", "learned: search s", "measured "]
            header += ["load avg"]
        row_search = ["-", "-"]
        if name not in learned_only:
            measured = collage.MeasuredCostEstimator(cache_dir=args.cache_dir, progress=True,
                                                     tuning_log=args.tuning_log)
            result, t_measured, count = search(prepared, toolchains, measured, measured)
            row_search = [f"{t_measured:.0f}", count]
        lresult = None
        if not args.no_learned or name in learned_only:
            inner = collage.MeasuredCostEstimator(
                cache_dir=tempfile.mkdtemp(prefix=f"learned-{name}-", dir=args.cache_dir), progress=True,
                tuning_log=args.tuning_log)
            lresult, t_learned, lcount = search(prepared, toolchains, collage.XGBoostCostEstimator(inner), inner)
            if name in learned_only:
                result = lresult
        # Collage's answer against every single toolchain: the library's final comparison, side by side.
        final = bench.final_table({"collage": result.mod, **singles}, repeat=args.repeat, rounds=args.rounds,
                                  max_rounds=args.max_rounds, budget_s=args.budget, tuning_log=args.tuning_log)
        # Saved and loaded again, the partitioned module must build to the same latency, no search.
        saved = os.path.join(args.cache_dir, f"{name}-collage.json")
        save_model(saved, result.mod)
        extras = {"collage": result.mod, "loaded": tvm_tcutils.load_model(saved)[0]}
        if lresult is not None and name not in learned_only:
            extras["learned"] = lresult.mod
        timed = compare({label: runner(v, args.repeat, args.tuning_log) for label, v in extras.items()}, args.rounds)
        over = ratios(timed, "collage")
        row = [name, *bench.final_cells(final, list(singles)), str(over["loaded"]), *row_search]
        if not args.no_learned:
            learned_cell = "(=collage)" if name in learned_only else str(over["learned"])
            row += [learned_cell, f"{t_learned:.0f}", lcount]
        row.append(f"{os.getloadavg()[0]:.2f}")
        rows.append(row)
        print("  ".join(row), flush=True)
        results.add(model=name, final=final.as_dict(), extras=timed, extras_over_collage=over,
                    table_row=dict(zip(header, row)), partitions=_count(result.partitions),
                    phases_s=dict(result.seconds))
        same = [label for label, v in singles.items() if tvm.ir.structural_equal(v, result.mod)]
        if same:  # then two columns time one partitioning: their gap is this machine's noise
            print(f"  {name}: Collage's partitioning is the same module as {same[0]}'s")
        print(f"  {name}: {final.reason}; {len(result.partitions)} partitions "
              f"({', '.join(f'{k} {v}' for k, v in sorted(_count(result.partitions).items()))}); "
              f"validation trials: {[(label, round(est, 2), round(ms, 2)) for label, est, ms in result.trials]}; "
              f"phases (s): {', '.join(f'{k} {v:.0f}' for k, v in result.seconds.items())}",
              flush=True)
    print()
    print(aligned(header, rows))
    print("<name> alone: that toolchain alone (TVM: its own lowering; others: BYOC's greedy partitioning, TVM for "
          "the rest); answer and collage / best single: Collage's final comparison (interleaved rounds until the "
          "95 % interval excludes 1, --max-rounds or --budget); loaded: Collage's module saved and loaded (no "
          "search); learned: the learned estimator's module; measured: candidates measured (cache misses) / "
          "candidates; load avg: 1-minute, after the row")
    results.write(args.json)
    return 0


def _count(partitions):
    counts = {}
    for part in partitions:
        counts[part.toolchain] = counts.get(part.toolchain, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
