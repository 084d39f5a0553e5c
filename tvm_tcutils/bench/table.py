"""Printed tables of benchmark rows: Markdown (pasted into docs) or right-aligned columns (terminals)."""
from __future__ import annotations

from typing import Mapping, Sequence

from ..measure import Ratio


def markdown(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table.

    Examples
    --------
    >>> print(markdown(["a", "b"], [[1, "x"], [2, "y"]]))
    | a | b |
    |---|---|
    | 1 | x |
    | 2 | y |
    """
    lines = ["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(str, row)) + " |" for row in rows]
    return "\n".join(lines)


def aligned(header: Sequence[str], rows: Sequence[Sequence[object]], gap: str = "  ") -> str:
    """Columns right-aligned to their widest cell; short rows leave their last columns empty.

    Examples
    --------
    >>> print(aligned(["model", "ms"], [["mlp", "0.02"], ["resnet-50", "12.5"]]))
        model    ms
          mlp  0.02
    resnet-50  12.5
    """
    cells = [[str(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[k]) for r in cells if k < len(r)]) for k, h in enumerate(header)]
    lines = [gap.join(str(h).rjust(w) for h, w in zip(header, widths))]
    lines += [gap.join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)


def cell(value: object, digits: int = 2) -> str:
    """A number with ``digits`` decimals; anything else (a reason, ``None``) as text or ``-``.

    Examples
    --------
    >>> cell(1.23456), cell(float("nan")), cell(None), cell("stopped")
    ('1.23', '-', '-', 'stopped')
    """
    if value is None or (isinstance(value, float) and value != value):
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def timings_markdown(rows: Sequence[Mapping], ratios: Mapping[str, str], group: str = "threads") -> str:
    """The Markdown table of JSON rows that hold ``timings`` and ratio sets (``Results`` rows of
    :func:`~tvm_tcutils.bench.int8.bench_e2e` and the like): one line per contender.

    ``ratios`` maps a row's ratio key to its column title (``{"vs_ort_qdq": "vs ORT QDQ"}``);
    ``group`` is the row field shown first (the thread count). The spread is +- half the
    interquartile range, as :class:`~tvm_tcutils.measure.Timing` prints it.

    Examples
    --------
    >>> row = {"threads": 1, "timings": {"a": {"median_ms": 2.0, "spread": 0.01}},
    ...        "vs_b": {"a": {"value": 0.5, "low": 0.45, "high": 0.55, "confidence": 0.95}}}
    >>> print(timings_markdown([row], {"vs_b": "vs b"}))
    | threads | contender | median ms (spread) | vs b [95 % interval] |
    |---|---|---|---|
    | 1 | a | 2.000 (+-0.5 %) | x0.500 [0.450, 0.550] |
    """
    header = [group, "contender", "median ms (spread)", *(f"{title} [95 % interval]" for title in ratios.values())]
    lines = []
    for row in rows:
        for name, timing in row["timings"].items():
            # +- half the interquartile range, as Timing prints it.
            cells = [f"{timing['median_ms']:.3f} (+-{50 * timing['spread']:.1f} %)"]
            cells += [str(Ratio(**row[key][name])) for key in ratios]
            lines.append([row[group], name, *cells])
    return markdown(header, lines)


def columns_markdown(rows: Sequence[Mapping], label: str, ratios: str, baseline: str) -> str:
    """A wide Markdown table of JSON rows: one line per row (``row[label]``), one column per contender,
    each cell the median ms and its ratio to ``baseline`` (``row[ratios]``, below 1: faster).

    Examples
    --------
    >>> row = {"kind": "dense", "timings": {"tvm": {"median_ms": 0.3}, "ort": {"median_ms": 0.6}},
    ...        "over_tvm": {"tvm": {"value": 1.0}, "ort": {"value": 2.0}}}
    >>> print(columns_markdown([row], "kind", "over_tvm", "tvm"))
    | kind | tvm ms | ort ms (/ tvm) |
    |---|---|---|
    | dense | 0.300 | 0.600 (x2.00) |
    """
    columns = list(dict.fromkeys(name for row in rows for name in row["timings"]))
    header = [label, *(f"{c} ms" if c == baseline else f"{c} ms (/ {baseline})" for c in columns)]
    lines = []
    for row in rows:
        cells = [row[label]]
        for column in columns:
            timing = row["timings"].get(column)
            if not timing or not timing.get("median_ms") or timing["median_ms"] == float("inf"):
                cells.append("-")
            elif column == baseline:
                cells.append(f"{timing['median_ms']:.3f}")
            else:
                cells.append(f"{timing['median_ms']:.3f} (x{row[ratios][column]['value']:.2f})")
        lines.append(cells)
    return markdown(header, lines)
