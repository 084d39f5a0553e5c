"""Collage's default search on real models, from an empty cache: time, answer, and quality.

For each model, in a process of its own (so no search inherits another's worker processes,
caches or loaded runtimes), ``collage.partition`` runs as a user calls it: default estimator
(staged: operators measured alone, joint candidates estimated from them, the search's picks
measured), validation and the final comparison with every toolchain alone, a new empty cost
cache. The row says how long it took, by phase, what it measured and estimated, and the answer
with its ratio to the fastest toolchain alone (the final comparison's interval).

With ``--full MODEL``, the same model is searched again measuring every candidate (its own
empty cache), and the staged answer is priced with those measurements against that search's
optimum (``tvm_tcutils.bench.collage_default.priced_against_full``); the staged estimates of
joint candidates made from the parts alone are compared with their measurements
(``estimate_error``).

Usage::

    PYTHONPATH=. python scripts/bench_collage_default.py \\
        --models light_inception_v1 light_squeezenet resnet-50-onnx mobilenet-v2-onnx bert-tiny-onnx \\
        --full light_squeezenet

``light_<name>`` models are the onnx package's own test models (``onnx/backend/test/data/light``),
converted to opset 13. Rows go to ``docs/benchmarks/data/bench_collage_default.json`` (``--json``).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402


def child(args) -> int:
    """One search in this process; its row goes to ``args.out`` as JSON."""
    from tvm_tcutils.bench.collage_default import search_row

    row = search_row(args.child, args.toolchains, args.cache_dir, args.estimator,
                     error_budget=None if args.error_budget == "none" else float(args.error_budget),
                     answer_path=args.answer)
    with open(args.out, "w") as handle:
        json.dump(row, handle)
    return 0


def run_child(model: str, estimator: str, cache_dir: str, args, error_budget: str = "none",
              answer: str = "") -> dict:
    """:func:`child` in a new interpreter; its row (or an error row when it failed). ``answer``: where the
    child saves its answer's module."""
    out = os.path.join(cache_dir, "row.json")
    command = [sys.executable, os.path.abspath(__file__), "--child", model, "--estimator", estimator,
               "--cache-dir", cache_dir, "--out", out, "--toolchains", args.toolchains,
               "--error-budget", error_budget, "--answer", answer]
    try:
        proc = subprocess.run(command, timeout=args.timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"model": model, "estimator": estimator, "error": f"took more than {args.timeout:g} s"}
    if proc.returncode != 0 or not os.path.exists(out):
        return {"model": model, "estimator": estimator, "error": (proc.stderr or "").strip().splitlines()[-1:]}
    with open(out) as handle:
        return json.load(handle)


def describe(row: dict) -> str:
    """One printed line of a search row."""
    if "error" in row:
        return f"{row['model']} ({row['estimator']}): FAILED {row['error']}"
    ratio = row.get("answer_vs_best_single")
    other = row.get("ratio_of", row["best_single"])
    vs = f"x{ratio[0]:.3f} [{ratio[1]:.3f}, {ratio[2]:.3f}] of {other}" if ratio else "not compared"
    counts = row["counts"]
    from tvm_tcutils.bench.collage_default import layer_summary

    layers = layer_summary(row.get("layers", []))
    per_layer = "; ".join(f"{name}: fastest on {v['fastest_on']} of {v['layers']} layers, {v['sum_ms']:.3f} ms "
                          f"summed" for name, v in layers.items())
    minima = next(iter(layers.values()))["best_per_layer_ms"] if layers else None
    return (f"{row['model']} ({row['estimator']}): {row['seconds']:.0f} s {row['phases']}; "
            f"{counts.get('candidates')} candidates, {counts.get('measured', 0)} measured; answer {row['answer']} "
            f"({vs}){' PARTIAL' if row['partial'] else ''}"
            + (f"\n  layers alone: {per_layer}; best per layer {minima:.3f} ms" if layers else ""))


def budgets(args) -> int:
    """``--error-budgets``: each model searched once per budget, the first from an empty cache, the others
    reusing its measurements (only the error checks and the final comparison are new)."""
    from tvm_tcutils.bench import collage_default as bench

    for budget in args.error_budgets:
        if budget != "none":
            float(budget)  # a bad budget fails here, before any search
    results = Results(__file__, None, toolchains=args.toolchains, error_budgets=args.error_budgets,
                      cache="one cost cache per model, shared by its searches (the first starts empty)")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="collage-precision-") as cache:
            for budget in args.error_budgets:
                row = run_child(model, "staged", cache, args, budget)
                print(describe(row), f"error budget {budget}: errors {row.get('errors')}",
                      *(f"\n  {step}" for step in row.get("budget_steps", [])), flush=True)
                results.add(**row)
                results.write(args.json)
    print(bench.precision_markdown(results.rows))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["light_squeezenet"])
    parser.add_argument("--full", nargs="*", default=[], help="models also searched measuring every candidate")
    parser.add_argument("--toolchains", default="tvm,ort,openvino")
    parser.add_argument("--timeout", type=float, default=7200, help="seconds a search may take before it is stopped")
    parser.add_argument("--error-budgets", nargs="+", default=None, metavar="BUDGET",
                        help="search each model once per error budget ('none' or a relative error), in turns "
                             "sharing one cost cache per model, instead of the default search")
    parser.add_argument("--error-budget", default="none", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--estimator", default="staged", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--answer", default="", help=argparse.SUPPRESS)
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    if args.child:
        return child(args)
    from tvm_tcutils.bench import collage_default as bench

    unknown = [m for m in args.full if m not in args.models]
    if unknown:
        parser.error(f"--full {unknown}: not among --models")
    if args.error_budgets:
        return budgets(args)
    results = Results(__file__, argv, toolchains=args.toolchains, cache="a new empty cost cache per search")
    for model in args.models:
        with tempfile.TemporaryDirectory(prefix="collage-answers-") as answers:
            staged_answer = os.path.join(answers, "staged.json") if model in args.full else ""
            with tempfile.TemporaryDirectory(prefix="collage-default-") as cache:
                row = run_child(model, "staged", cache, args, answer=staged_answer)
            print(describe(row), flush=True)
            results.add(**row)
            results.write(args.json)
            if model not in args.full or "error" in row:
                continue
            full_answer = os.path.join(answers, "full.json")
            with tempfile.TemporaryDirectory(prefix="collage-full-") as full_cache:
                full = run_child(model, "measured", full_cache, args, answer=full_answer)
                print(describe(full), flush=True)
                if "error" not in full:
                    full["priced"] = bench.priced_against_full(model, args.toolchains, full_cache, row["chosen"])
                    full["estimate_error"] = bench.estimate_error(model, args.toolchains, full_cache)
                    print(f"  staged answer priced by the full search's measurements: {full['priced']}")
                    print(f"  staged estimates from parts vs measured: {full['estimate_error']}", flush=True)
            if "error" not in full:
                # The two answers timed in turns in one process (each search's own timings are in
                # two processes, which on these VMs differ by more than the goal's 3 %).
                full["answers_side_by_side"] = bench.answers_side_by_side(
                    {"staged": staged_answer, "measured": full_answer})
                print(f"  staged answer / measure-everything answer, side by side: "
                      f"{full['answers_side_by_side']}", flush=True)
            results.add(**full)
            results.write(args.json)
    print(bench.markdown(results.rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
