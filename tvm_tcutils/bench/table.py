"""Printed tables of benchmark rows: Markdown (pasted into docs) or right-aligned columns (terminals)."""
from __future__ import annotations

from typing import Sequence


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
