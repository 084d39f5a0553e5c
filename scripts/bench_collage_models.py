"""Collage against single toolchains on whole models (the issue's success table).

For each model: TVM alone, BYOC's greedy partitioning for each other
toolchain (``partition_for_<toolchain>``-style: MergeComposite, AnnotateTarget,
MergeCompilerRegions, PartitionGraph), Collage with measured costs (its
module also saved and loaded again, no new search) and Collage with the
learned (XGBoost) estimator. Every whole-model variant is built once in this
process and then timed round-robin over ``--rounds`` rounds (same threads,
median of ``--repeat`` runs each round, the median of rounds is reported), so
the ratios printed are measured side by side in one run; the load average is
printed with each row. Also printed: the search time and how many candidates
each estimator measured (cache misses).

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
from tvm_tcutils.bench.competitors import compare, ratios, relay_module, timed_once  # noqa: E402
from tvm_tcutils.bench.models import load  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.bench.table import aligned  # noqa: E402
from tvm_tcutils.collage.driver import greedy_partition  # noqa: E402
from tvm_tcutils.models import save_model  # noqa: E402


def runner(mod, repeat: int, tuning_log=None):
    """A timer of one whole run (ms) of ``mod``, built once for this CPU (``host_target()``)."""
    return relay_module(mod, None, tvm_tcutils.host_target(), repeat=repeat, warmup=3, min_repeat_ms=50,
                        tuning_log=tuning_log)


def search(prepared, toolchains, estimator, inner):
    """Collage on ``prepared`` with ``estimator``; (result, seconds, "measured/candidates")."""
    try:
        # The library defaults: validation also times each single toolchain's answer.
        result, seconds = timed_once(lambda: collage.partition(prepared, None, toolchains, estimator))
    finally:
        inner.close()
    if estimator is not inner:  # the learned estimator: how its search/measure rounds ended
        print(f"  learned: {estimator.stats['rounds']} rounds, stopped by {estimator.stats['stop']}", flush=True)
    return result, seconds, f"{inner.stats['measured'] + inner.stats['failed']}/{result.candidates}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="bert-tiny-onnx,squeezenet1.0,mobilenet,mobilenet-v2-onnx,"
                                             "resnet-50,resnet-50-onnx,inception_v3")
    parser.add_argument("--toolchains", default="tvm,ort,blas")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "tcutils-collage-bench"))
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each whole model per round (median)")
    parser.add_argument("--rounds", type=int, default=5, help="round-robin rounds of whole-model timing")
    parser.add_argument("--no-learned", action="store_true", help="skip the learned estimator")
    parser.add_argument("--learned-only", default="",
                        help="models searched only with the learned estimator (comma-separated)")
    parser.add_argument("--tuning-log", default=None,
                        help="AutoTVM log applied to every TVM build (costs and whole models), "
                             "e.g. from 'tvm-tcutils tune MODEL --dtype float32'")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    os.makedirs(args.cache_dir, exist_ok=True)  # the learned runs make their caches inside it
    toolchains = collage.resolve(args.toolchains)
    others = [tc for tc in toolchains if not tc.is_tvm and tc.buildable()]
    learned_only = set(filter(None, args.learned_only.split(",")))
    # TVM alone and the TVM rest of each greedy partitioning, lowered as the search's TVM toolchain lowers them.
    tvm_tc = collage.tvm_toolchain(toolchains)
    header = ["model", "tvm ms"] + [f"{tc.name} greedy" for tc in others] + [
        "collage ms", "loaded ms", "vs best", "measured: search s", "measured"]
    if not args.no_learned:
        header += ["learned ms", "vs coll.", "learned: search s", "measured "]
    header += ["load avg"]
    results = Results(__file__, argv, toolchains=args.toolchains, repeat=args.repeat, rounds=args.rounds,
                      tuning_log=args.tuning_log, load_at_start=list(os.getloadavg()))
    rows = []
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    for name in args.models.split(","):
        mod, params = load(name)
        prepared = collage.prepare(mod, params)
        labels = ["tvm alone"] + [f"{tc.name} greedy" for tc in others]
        variants = [tvm_tc.rewrite(prepared)] + [greedy_partition(prepared, None, tc, tvm_tc) for tc in others]
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
        # Saved and loaded again, the partitioned module must build to the same latency, no search.
        saved = os.path.join(args.cache_dir, f"{name}-collage.json")
        save_model(saved, result.mod)
        labels += ["collage", "loaded"]
        variants += [result.mod, tvm_tcutils.load_model(saved)[0]]
        if lresult is not None and name not in learned_only:
            labels.append("learned")
            variants.append(lresult.mod)
        timed = compare({label: runner(v, args.repeat, args.tuning_log) for label, v in zip(labels, variants)},
                        args.rounds)
        times = [timed[label].median_ms for label in labels]
        tvm_ms, greedy = times[0], times[1:1 + len(others)]
        collage_ms, loaded_ms = times[1 + len(others)], times[2 + len(others)]
        best_single = min([tvm_ms, *greedy])
        row = [name, f"{tvm_ms:.2f}", *[f"{g:.2f}" for g in greedy], f"{collage_ms:.2f}", f"{loaded_ms:.2f}",
               f"{collage_ms / best_single:.3f}", *row_search]
        if not args.no_learned:
            if name in learned_only:
                row += ["(=collage)", "-", f"{t_learned:.0f}", lcount]
            else:
                row += [f"{times[-1]:.2f}", f"{times[-1] / collage_ms:.3f}", f"{t_learned:.0f}", lcount]
        row.append(f"{os.getloadavg()[0]:.2f}")
        rows.append(row)
        print("  ".join(row), flush=True)
        results.add(model=name, timings=timed, over_tvm=ratios(timed, "tvm alone"), vs_best=collage_ms / best_single,
                    table_row=dict(zip(header, row)), partitions=_count(result.partitions),
                    phases_s=dict(result.seconds))
        same = [label for label, v in zip(labels[:1 + len(others)], variants) if tvm.ir.structural_equal(v, result.mod)]
        if same:  # then the columns time one partitioning twice: their gap is this machine's noise
            print(f"  {name}: Collage's partitioning is the same module as {same[0]}'s")
        print(f"  {name}: {len(result.partitions)} partitions "
              f"({', '.join(f'{k} {v}' for k, v in sorted(_count(result.partitions).items()))}); "
              f"validation trials: {[(label, round(est, 2), round(ms, 2)) for label, est, ms in result.trials]}; "
              f"side by side: {[(label, round(ms, 2)) for label, _, ms in result.side_by_side]}; "
              f"phases (s): {', '.join(f'{k} {v:.0f}' for k, v in result.seconds.items())}",
              flush=True)
    print()
    print(aligned(header, rows))
    print("vs best: Collage / best single toolchain (TVM alone or a greedy BYOC partitioning); "
          "loaded: Collage's module saved and loaded (no search); "
          "vs coll.: learned / measured Collage; measured: candidates measured (cache misses) / candidates; "
          "whole models built once, timed round-robin, median of rounds; load avg: 1-minute, after the row")
    results.write(args.json)
    return 0


def _count(partitions):
    counts = {}
    for part in partitions:
        counts[part.toolchain] = counts.get(part.toolchain, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())
