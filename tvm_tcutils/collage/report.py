"""Reports of a Collage result: the report (:func:`report_lines`) and the partition table.

The report has four parts: one table of the chosen partitions (toolchain,
estimated ms, operators) with the total estimated next to the whole module
measured; one line per toolchain naming the operators it cannot take; one line
per toolchain measured alone; one line for the answer and its ratio to the best
single toolchain, in words when the answer is a single toolchain.
"""
from __future__ import annotations

import math
from typing import List, Optional

from .driver import CollageResult
from .picture import to_dot, write_picture  # noqa: F401  (moved to picture.py; importable here for one release)


def _ms(value: Optional[float]) -> str:
    if value is None or math.isnan(value):
        return "-"
    return "failed" if math.isinf(value) else f"{value:.3f}"


def _thousands(n: int) -> str:
    return f"{n:,}"


#: What a line of the report says for each count the driver and estimators keep.
_COUNT_WORDS = (("cached", "from the cost cache"), ("measured", "measured"), ("predicted", "predicted"),
                ("failed", "failed"))


def candidate_line(result: CollageResult) -> str:
    """How many candidates there were and what became of them; ``costed`` is the progress bar's total.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> candidate_line(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False))
    "17 candidates: 0 host glue (free), 17 costed (the progress bar's total)"
    """
    counts = result.counts
    total = counts.get("candidates", result.candidates)
    costed = counts.get("costed", total)
    parts = [f"{_thousands(counts[key])} {words}" for key, words in _COUNT_WORDS if counts.get(key)]
    # A measuring estimator measures one structure once: candidates that share it are neither counted.
    shared = costed - sum(counts.get(key, 0) for key, _ in _COUNT_WORDS)
    if parts and shared > 0:
        parts.append(f"{_thousands(shared)} the same structure as another or not buildable here")
    detail = f": {', '.join(parts)}" if parts else ""
    return (f"{_thousands(total)} candidates: {_thousands(counts.get('host', total - costed))} host glue (free), "
            f"{_thousands(costed)} costed (the progress bar's total){detail}")


def partition_table(result: CollageResult, limit: int = 8, partitions: Optional[List] = None) -> List[str]:
    """Lines of a table of the chosen partitions (or of ``partitions``): index, toolchain, estimated ms,
    kilobytes crossing its border, what it computes in, function, ops.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> lines = partition_table(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0})))
    >>> lines[0].split()[:3]
    ['#', 'toolchain', 'est.']
    """
    lines = [f"{'#':>3}  {'toolchain':<13} {'est. ms':>9} {'border KB':>10}  {'runs in':<13} {'function':<34} ops"]
    for k, row in enumerate(result.partitions if partitions is None else partitions):
        ops = "+".join(row.ops[:limit]) + (f"+...({len(row.ops)} ops)" if len(row.ops) > limit else "")
        est = "-" if math.isnan(row.estimated_ms) else f"{row.estimated_ms:.4f}"
        border = "-" if math.isnan(row.border_kb) else f"{row.border_kb:.1f}"
        lines.append(f"{k:>3}  {row.toolchain:<13} {est:>9} {border:>10}  {row.precision:<13} "
                     f"{row.function or '(in main)':<34} {ops}")
    return lines


def crossing_line(partitions: List, measured_ms: Optional[float], tvm_name: str = "tvm") -> Optional[str]:
    """What crossing between toolchains cost the mix: its whole-model time less its partitions' estimates,
    per partition run outside TVM (None when the mix was not timed whole or has no such partition).

    Examples
    --------
    >>> from tvm_tcutils.collage.driver import Partition
    >>> rows = [Partition("tvm", ["nn.conv2d"], 1.0, None, "x", 8.0), Partition("ort", ["nn.relu"], 0.2, "f", "y", 4.0)]
    >>> print(crossing_line(rows, 1.5))
    crossings: 1 partition(s) outside tvm, 4.0 KB across the borders; measured whole - estimates = 0.300 ms
    (300 us per crossing partition)
    """
    external = [p for p in partitions if p.toolchain != tvm_name]
    estimated = sum(p.estimated_ms for p in partitions)
    if not external or measured_ms is None or not math.isfinite(measured_ms) or math.isnan(estimated):
        return None
    kb = sum(p.border_kb for p in external if not math.isnan(p.border_kb))
    gap = measured_ms - estimated
    return (f"crossings: {len(external)} partition(s) outside {tvm_name}, {kb:.1f} KB across the borders; "
            f"measured whole - estimates = {gap:.3f} ms\n({1000 * gap / len(external):.0f} us per crossing partition)")


def precision_lines(result: CollageResult) -> List[str]:
    """The error budget's lines: each mix checked (what it gave up, its error) and each lossy toolchain alone.

    Empty without an error budget.

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> precision_lines(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False,
    ...                           error_budget=0.01))
    ['error budget 0.01: no lossy toolchain among the toolchains, nothing to check']
    """
    if result.error_budget is None:
        return []
    head = f"error budget {result.error_budget:g}"
    if not result.errors:
        return [f"{head}: no lossy toolchain among the toolchains, nothing to check"]
    lines = [f"{head} (relative error of the outputs against the exact model, on the sample inputs):"]
    lines += [f"  {step}" for step in result.budget_steps]
    for name, error in result.errors.items():
        if name == "collage":
            continue
        verdict = "within" if error <= result.error_budget else "over: left out of the comparison"
        lines.append(f"  {name}: error {error:.3g} ({verdict})")
    return lines


def _estimate_note(result: CollageResult) -> List[str]:
    """The total line under the table, and why an estimate and a measurement differ."""
    estimated = sum(p.estimated_ms for p in result.partitions)
    if math.isnan(estimated):  # a single toolchain's whole-model build: no per-partition estimates
        return [f"     total: measured whole {_ms(result.measured_ms)} ms (a whole-model build: no per-partition "
                "estimates)"]
    line = f"     total: estimated {_ms(estimated)} ms, measured whole {_ms(result.measured_ms)} ms"
    if result.measured_ms is None or not math.isfinite(result.measured_ms):
        return [line]
    gap = result.measured_ms / estimated - 1 if estimated > 0 else math.inf
    if abs(gap) <= 0.1:
        return [line]
    return [line + f" ({100 * gap:+.0f} %)",
            "     estimates are each partition measured alone, summed; measured is the whole module, which adds "
            "the crossings between toolchains and fuses across partition borders"]


def unreachable_lines(result: CollageResult, limit: int = 6) -> List[str]:
    """One line per toolchain naming the operators none of its candidates takes (what kept it from a
    region, and from the whole model alone), with their counts.

    Examples
    --------
    >>> import dataclasses
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> result = partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False)
    >>> unreachable_lines(dataclasses.replace(result, unreachable={"ort": {"nn.lrn": 2}}))
    ['operators ort cannot take (TVM runs them): nn.lrn x2']
    """
    lines = []
    for name, ops in result.unreachable.items():
        listed = [f"{op} x{count}" for op, count in list(ops.items())[:limit]]
        more = f", ... ({len(ops) - limit} more)" if len(ops) > limit else ""
        lines.append(f"operators {name} cannot take (TVM runs them): {', '.join(listed)}{more}")
    return lines


def _single_lines(result: CollageResult, skipped: str) -> List[str]:
    final = result.final
    if final is None:
        if not result.single_toolchain_ms:
            return [f"toolchains alone: not timed ({skipped})"]
        lines = [f"toolchains alone: not timed ({skipped}); estimates of the search restricted to each "
                 "(with TVM for the rest):"]
        lines += [f"  {name + ' alone':<22} est. {_ms(ms):>9} ms" for name, ms in result.single_toolchain_ms.items()]
        return lines
    lines = [f"toolchains alone, each whole model timed in {final.rounds} interleaved rounds with the answer "
             f"({final.seconds:.1f} s):"]
    for name, timing in final.timings.items():
        if name == final.mix:
            continue
        measured = f"{_ms(timing.median_ms)} ms (+-{50 * timing.spread:.1f} %)" if timing.samples_ms else "failed"
        best = "  <- fastest alone" if name == final.best_single else ""
        lines.append(f"  {name:<22} measured {measured}{best}")
    lines += [f"  {name:<22} not timed: {why}" for name, why in result.left_out.items()]
    return lines


def answer_line(result: CollageResult, skipped: Optional[str] = None) -> str:
    """The answer, in words, with its ratio to the best single toolchain and the interval.

    ``skipped``: why there was no final comparison (default ``result.not_compared``).

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> answer_line(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False))
    "answer: Collage's mix (not compared with the toolchains alone: only one toolchain: nothing to compare)"
    """
    final = result.final
    if final is None:
        return f"answer: Collage's mix (not compared with the toolchains alone: {skipped or result.not_compared})"
    level = "" if final.ratio is None else f" at {100 * final.ratio.confidence:.0f} %"
    if final.is_mix:
        return (f"answer: Collage's mix, x{final.ratio.value:.3f} of {final.best_single} "
                f"[{final.ratio.low:.3f}, {final.ratio.high:.3f}]{level}: {final.reason}")
    interval = "" if final.ratio is None else f"[{final.ratio.low:.3f}, {final.ratio.high:.3f}]{level}"
    if final.mix is None:  # the mix was one toolchain alone: the singles were compared among themselves
        ratio = "" if final.ratio is None else f"; x{final.ratio.value:.3f} of the next fastest {interval}"
        return f"answer: {final.answer} (Collage's mix is a toolchain alone). {final.reason}{ratio}"
    ratio = "" if final.ratio is None else f"; mix / {final.best_single}: x{final.ratio.value:.3f} {interval}"
    return f"answer: {final.answer}. {final.reason}{ratio}"


def report_lines(result: CollageResult, skipped: Optional[str] = None) -> List[str]:
    """The Collage report: candidates, the chosen partitions, each toolchain alone, the answer.

    ``skipped`` says why the toolchains alone were not timed, when they were
    not (default ``result.not_compared``; the command line names its option).

    Examples
    --------
    >>> from tvm_tcutils.collage import MockCostEstimator, partition
    >>> from tvm_tcutils.models import load_model
    >>> mod, params = load_model("mlp")
    >>> lines = report_lines(partition(mod, params, "tvm", MockCostEstimator({"tvm": 1.0}), progress=False))
    >>> lines[-1]
    "answer: Collage's mix (not compared with the toolchains alone: only one toolchain: nothing to compare)"
    """
    lines = [candidate_line(result) + f"; {_thousands(result.states)} search states"]
    if result.crossing_ms_per_kb > 0:
        lines.append(f"crossings priced at {result.crossing_ms_per_kb * 1024:.3f} ms per MB at a border with "
                     "TVM (its layout transforms there, measured with its candidates)")
    if result.partial:
        lines.append(f"PARTIAL: {result.partial_reason}; this is the best valid partitioning found by then")
    title = "Collage's mix" if result.answer == "collage" else result.answer
    lines.append(f"chosen partitions ({title}):")
    lines += partition_table(result)
    lines += _estimate_note(result)
    lines += precision_lines(result)
    tvm_name = next((p.toolchain for p in result.mix_partitions if p.function is None), "tvm")
    if result.answer != "collage" and result.mix_partitions:
        # Why the mix lost: its partitions, their estimates and what crossing cost it.
        estimated = sum(p.estimated_ms for p in result.mix_partitions)
        lines.append(f"Collage's mix (not the answer): estimated {_ms(estimated)} ms, measured whole "
                     f"{_ms(result.mix_measured_ms)} ms")
        lines += partition_table(result, partitions=result.mix_partitions)
    crossing = crossing_line(result.mix_partitions, result.mix_measured_ms, tvm_name)
    if crossing:
        lines += crossing.splitlines()
    lines += [f"validation: the re-searched mix ({label}) estimated {_ms(estimated)} ms was not built: {rival} "
              f"measured {_ms(ms)} ms" for label, estimated, rival, ms in result.not_built]
    lines += unreachable_lines(result)
    lines += _single_lines(result, skipped or result.not_compared)
    lines.append(answer_line(result, skipped))
    return lines
