"""Collage against single toolchains on whole models (the issue's success table).

For each model: TVM alone, BYOC's greedy partitioning for each other
toolchain (``partition_for_<toolchain>``-style: MergeComposite, AnnotateTarget,
MergeCompilerRegions, PartitionGraph), Collage with measured costs and
Collage with the learned (XGBoost) estimator. Every whole model is built and
timed in the same worker process (same threads, median of repeats), the
variants round-robin over ``--rounds`` rounds (the median is reported), so
the ratios printed are measured side by side in one run. Also printed: the
search time (candidates measured or predicted) and how many candidates each
estimator measured.

    TVM_NUM_THREADS=2 PYTHONPATH=. python scripts/bench_collage_models.py \\
        --models encoder,resnet-50,mobilenet,squeezenet1.0,inception_v3 --toolchains tvm,ort,blas

``encoder`` is a BERT-like encoder (4 layers, hidden 256, 4 heads, sequence
128) built in Relay the way an ONNX import shapes it; other names go to
``tvm_tcutils.load_model`` (zoo names with He-style weights, .onnx files).
The measured estimator's cache (``--cache-dir``) makes re-runs cheap; the
learned estimator uses a cache of its own so that its measurement count is
honest.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TOPHUB_LOCATION", "NONE")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import tvm  # noqa: E402

import tvm_tcutils  # noqa: E402
from tvm_tcutils import collage  # noqa: E402
from tvm_tcutils.collage.cost.learned import XGBoostCostEstimator  # noqa: E402
from tvm_tcutils.collage.cost.measured import MeasuredCostEstimator, WorkerPool  # noqa: E402
from tvm_tcutils.collage.driver import greedy_partition  # noqa: E402
from tvm_tcutils.models import save_model  # noqa: E402


def load(name: str):
    if name == "encoder":
        from bench_collage_search import encoder

        return encoder(4, hidden=256, heads=4, seq=128), {}
    return tvm_tcutils.load_model(name)


def whole_ms(pool: WorkerPool, mod, repeat: int) -> float:
    [result] = pool.run([(tvm.ir.save_json(mod), "llvm", repeat, 3, 50)])
    return math.inf if result.get("ms") is None else float(result["ms"])


def interleaved_ms(pool: WorkerPool, mods, repeat: int, rounds: int):
    """Median over ``rounds`` of each module's latency, the modules timed in turn each round.

    The machine's load drifts; timing the variants round-robin keeps the ratios fair.
    """
    times = [[] for _ in mods]
    for _ in range(rounds):
        for k, mod in enumerate(mods):
            times[k].append(whole_ms(pool, mod, repeat))
    return [float(np.median(t)) for t in times]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="encoder,resnet-50,mobilenet,squeezenet1.0,inception_v3")
    parser.add_argument("--toolchains", default="tvm,ort,blas")
    parser.add_argument("--cache-dir", default=os.path.join(tempfile.gettempdir(), "tcutils-collage-bench"))
    parser.add_argument("--repeat", type=int, default=20, help="timed runs of each whole model (median)")
    parser.add_argument("--rounds", type=int, default=3, help="round-robin rounds of whole-model timing")
    parser.add_argument("--no-learned", action="store_true", help="skip the learned estimator")
    args = parser.parse_args(argv)
    toolchains = collage.resolve(args.toolchains)
    others = [tc for tc in toolchains if not tc.is_tvm and tc.buildable()]
    pool = WorkerPool(1, 1800.0)
    header = ["model", "tvm ms"] + [f"{tc.name} greedy" for tc in others] + [
        "collage ms", "loaded ms", "vs best", "search s", "measured"]
    if not args.no_learned:
        header += ["learned ms", "vs coll.", "search s", "measured"]
    rows = []
    try:
        for name in args.models.split(","):
            mod, params = load(name)
            prepared = collage.prepare(mod, params)
            variants = [prepared] + [greedy_partition(prepared, None, tc) for tc in others]

            measured = MeasuredCostEstimator(cache_dir=args.cache_dir, progress=True)
            start = time.perf_counter()
            result = collage.partition(prepared, None, toolchains, measured, compare_single=False)
            t_measured = time.perf_counter() - start
            measured.close()
            # Saved and loaded again, the partitioned module must build to the same latency, no search.
            saved = os.path.join(args.cache_dir, f"{name}-collage.json")
            save_model(saved, result.mod)
            variants += [result.mod, tvm_tcutils.load_model(saved)[0]]
            if not args.no_learned:
                inner = MeasuredCostEstimator(cache_dir=os.path.join(args.cache_dir, f"learned-{name}"),
                                              progress=True)
                start = time.perf_counter()
                lresult = collage.partition(prepared, None, toolchains, XGBoostCostEstimator(inner),
                                            compare_single=False)
                t_learned = time.perf_counter() - start
                inner.close()
                variants.append(lresult.mod)
            times = interleaved_ms(pool, variants, args.repeat, args.rounds)
            tvm_ms, greedy = times[0], times[1:1 + len(others)]
            collage_ms, loaded_ms = times[1 + len(others)], times[2 + len(others)]
            best_single = min([tvm_ms, *greedy])
            row = [name, f"{tvm_ms:.2f}", *[f"{g:.2f}" for g in greedy], f"{collage_ms:.2f}", f"{loaded_ms:.2f}",
                   f"{collage_ms / best_single:.3f}", f"{t_measured:.0f}",
                   f"{measured.stats['measured'] + measured.stats['failed']}/{result.candidates}"]
            if not args.no_learned:
                learned_ms = times[-1]
                row += [f"{learned_ms:.2f}", f"{learned_ms / collage_ms:.3f}", f"{t_learned:.0f}",
                        f"{inner.stats['measured'] + inner.stats['failed']}/{lresult.candidates}"]
            rows.append(row)
            print("  ".join(row), flush=True)
    finally:
        pool.close()
    widths = [max(len(h), *(len(r[k]) for r in rows if k < len(r))) for k, h in enumerate(header)]
    print()
    print("  ".join(h.rjust(w) for h, w in zip(header, widths)))
    for row in rows:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
    print("vs best: Collage / best single toolchain (TVM alone or a greedy BYOC partitioning); "
          "loaded: Collage's module saved and loaded (no search); "
          "vs coll.: learned / measured Collage; measured: candidates measured (cache misses) / candidates; "
          "whole models timed round-robin, median of rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
