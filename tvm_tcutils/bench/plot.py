"""A bar chart of a benchmark's results: its ratios (or timings) per row, intervals as error bars.

Uses matplotlib, an optional extra (``pip install tvm-tcutils[plot]``). The
chart shows one group of bars per row of the results (named by the row's
text fields, such as the model), one bar per ratio column, with the ratio's
confidence interval as its error bar and a line at 1; results with no ratios
show their timings (median ms, with the spread), and results with neither
their floating-point numbers. The title names the
benchmark, the machine and the date.
"""
from __future__ import annotations

import json
import os
from typing import Dict, List, Mapping, Tuple, Union

from ._json import jsonable

#: File formats a plot can be written in (by the output's extension).
FORMATS = (".png", ".svg", ".pdf")

INSTALL = "pip install tvm-tcutils[plot]"


def check_plot_path(path: str) -> str:
    """``path`` when a plot can be written there (known extension, existing folder, matplotlib), else ValueError.

    Examples
    --------
    >>> check_plot_path("ratios.jpg")
    Traceback (most recent call last):
    ...
    ValueError: --plot ratios.jpg: cannot write '.jpg'; use one of .png, .svg, .pdf
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in FORMATS:
        raise ValueError(f"--plot {path}: cannot write {ext!r}; use one of {', '.join(FORMATS)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"--plot {path}: directory {folder} does not exist or is not writable")
    if os.path.isdir(path):
        raise ValueError(f"--plot {path}: is a directory; give a file name")
    try:
        _pyplot()
    except ValueError as err:
        raise ValueError(f"--plot {path}: {err}") from None
    return path


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise ValueError(f"plots need matplotlib, which is not installed: {INSTALL}") from None
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt

    return plt


def _load(results: Union[str, os.PathLike, Mapping]) -> Mapping:
    if isinstance(results, Mapping):
        return results
    if isinstance(results, (str, os.PathLike)):
        with open(results) as handle:
            return json.load(handle)
    raise TypeError(f"results must be a results dict or the path of its JSON, got {type(results).__name__}")


def _is_ratio(value) -> bool:
    return isinstance(value, Mapping) and {"value", "low", "high"} <= value.keys()


def _is_timing(value) -> bool:
    return isinstance(value, Mapping) and "median_ms" in value


def _is_number(value) -> bool:
    return isinstance(value, float)  # measurements; integers are counts and settings


def series(payload: Mapping) -> Tuple[str, List[str], Dict[str, List[Tuple[float, float, float]]]]:
    """What a plot shows: ``(kind, row labels, {column: [(value, low, high) per row]})``.

    ``kind`` is ``"ratio"`` when rows hold ratios, else ``"ms"`` when they
    hold timings, else ``"value"`` (their floating-point numbers, with no
    interval); a row without a column's value has ``nan`` there.

    Examples
    --------
    >>> rows = [{"model": "mlp", "speedup": {"value": 2.0, "low": 1.8, "high": 2.2, "confidence": 0.95}}]
    >>> series({"rows": rows})
    ('ratio', ['mlp'], {'speedup': [(2.0, 1.8, 2.2)]})
    """
    rows = payload.get("rows") or []
    for kind, test in (("ratio", _is_ratio), ("ms", _is_timing), ("value", _is_number)):
        columns = sorted({key for row in rows for key, value in row.items() if test(value)})
        if columns:
            break
    else:
        raise ValueError("the results have nothing to plot: no ratios, timings or floating-point numbers "
                         "in their rows")
    labels = [" ".join(str(v) for v in row.values() if isinstance(v, str)) or f"row {k}"
              for k, row in enumerate(rows)]
    nan = float("nan")
    data: Dict[str, List[Tuple[float, float, float]]] = {}
    for column in columns:
        points = []
        for row in rows:
            value = row.get(column)
            if kind == "ratio" and _is_ratio(value) and value["value"] is not None:
                points.append((value["value"], value["low"], value["high"]))
            elif kind == "ms" and _is_timing(value) and value["median_ms"] is not None:
                half = value["median_ms"] * (value.get("spread") or 0.0) / 2
                points.append((value["median_ms"], value["median_ms"] - half, value["median_ms"] + half))
            elif kind == "value" and _is_number(value):
                points.append((value, value, value))
            else:
                points.append((nan, nan, nan))
        data[column] = points
    return kind, labels, data


def _title(payload: Mapping) -> str:
    machine = payload.get("machine") or {}
    where = ", ".join(str(part) for part in (machine.get("cpu"), machine.get("cores") and
                                             f"{machine['cores']} cores") if part)
    date = str(payload.get("date") or machine.get("date") or "")[:16].replace("T", " ")
    return " - ".join(part for part in (payload.get("script", "benchmark"), where, date) if part)


def plot(results: Union[str, os.PathLike, Mapping], out_path: str) -> str:
    """Draw ``results`` (a results dict or its JSON file) as a bar chart in ``out_path``; return the path.

    Examples
    --------
    >>> import os, tempfile
    >>> from tvm_tcutils.measure import Timing, ratio
    >>> from tvm_tcutils.bench.results import Results
    >>> res = Results("bench_example", [])
    >>> a, b = Timing((1.0, 1.1, 0.9)), Timing((2.0, 2.2, 1.8))
    >>> res.add(model="mlp", ours=a, theirs=b, speedup=ratio(b, a))
    >>> path = os.path.join(tempfile.mkdtemp(), "speedup.png")
    >>> plot(res.payload(), path) == path and os.path.getsize(path) > 0  # doctest: +SKIP
    True
    """
    payload = jsonable(_load(results))
    check_plot_path(out_path)
    kind, labels, data = series(payload)
    plt = _pyplot()
    width = 0.8 / len(data)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.2 * len(labels) * max(1, len(data)) ** 0.5), 3.5))
    try:
        for k, (column, points) in enumerate(data.items()):
            xs = [i + (k - (len(data) - 1) / 2) * width for i in range(len(labels))]
            values = [p[0] for p in points]
            errors = [[p[0] - p[1] for p in points], [p[2] - p[0] for p in points]]
            ax.bar(xs, values, width, yerr=None if kind == "value" else errors, capsize=3, label=column)
        if kind == "ratio":
            ax.axhline(1.0, color="gray", linewidth=0.8, linestyle="--")
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center")
        what = {"ratio": "ratio (interval as error bar)", "ms": "median ms (spread as error bar)",
                "value": "value"}[kind]
        ax.set_ylabel(f"{next(iter(data))}: {what}" if len(data) == 1 else what)
        ax.set_title(_title(payload), fontsize=9)
        if len(data) > 1:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out_path)
    finally:
        plt.close(fig)
    return out_path
