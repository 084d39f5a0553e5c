"""Benchmark results as JSON, written next to the printed table.

One file per run: the command line, where it ran (:func:`tvm_tcutils.measure.machine`,
which includes the date), free-form settings and the rows. A row is a dict;
:class:`~tvm_tcutils.measure.Timing` and :class:`~tvm_tcutils.measure.Ratio`
values become their ``as_dict()`` (medians, spreads, samples; ratios with their
interval). The file is written atomically (a temporary file in the same folder,
then ``os.replace``), so a reader never sees half a file and an interrupted run
leaves the previous one.

Examples
--------
>>> import json, os, tempfile
>>> from tvm_tcutils.measure import Timing, ratio
>>> res = Results("bench_example", ["--rounds", "2"])
>>> a, b = Timing((1.0, 1.1)), Timing((2.0, 2.2))
>>> res.add(model="mlp", ours=a, theirs=b, ratio=ratio(a, b))
>>> path = res.write(os.path.join(tempfile.mkdtemp(), "out.json"))
>>> data = json.load(open(path))
>>> data["rows"][0]["ours"]["median_ms"], data["command"][-2:]
(1.05, ['--rounds', '2'])
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile  # noqa: F401  (the examples use it)
from typing import Dict, List, Optional, Sequence

from ..files import write_atomically
from ._json import jsonable  # noqa: F401  (results.jsonable: part of this module's API)
from .plot import check_plot_path, plot

#: Where a script's JSON goes unless ``--json`` says otherwise: ``docs/benchmarks/data/<script>.json``.
DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                        "docs", "benchmarks", "data")


def default_path(script: str) -> str:
    """``docs/benchmarks/data/<script>.json`` of this checkout.

    Examples
    --------
    >>> default_path("bench_passes").endswith(os.path.join("docs", "benchmarks", "data", "bench_passes.json"))
    True
    """
    return os.path.join(DATA_DIR, f"{os.path.splitext(os.path.basename(script))[0]}.json")


def add_json_argument(parser, script: str) -> None:
    """``--json PATH`` (default :func:`default_path` of ``script``) and ``--plot PATH`` on an ``argparse`` parser.

    ``--plot`` is checked as it is parsed (:func:`~.plot.check_plot_path`);
    :meth:`Results.write` draws the chart when the command line has it.

    Examples
    --------
    >>> import argparse
    >>> p = argparse.ArgumentParser(); add_json_argument(p, "bench_x")
    >>> p.parse_args(["--json", "r.json"]).json
    'r.json'
    """
    parser.add_argument("--json", default=default_path(script), metavar="PATH",
                        help="write the results as JSON here (default %(default)s)")
    # Checked as the arguments are parsed: a bad path or missing matplotlib fails before the work.
    parser.add_argument("--plot", type=_plot_path, metavar="PATH",
                        help="also draw the results as a bar chart here (.png/.svg/.pdf; needs matplotlib)")


def _plot_path(text: str) -> str:
    try:
        return check_plot_path(text)
    except ValueError as err:
        # argparse names the option itself: "argument --plot: <reason>".
        raise argparse.ArgumentTypeError(str(err).removeprefix(f"--plot {text}: ")) from None


def _plot_option(argv: Sequence[str]) -> Optional[str]:
    """The ``--plot PATH`` of a command line (see :func:`add_json_argument`), or None."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--plot")
    return parser.parse_known_args(list(argv))[0].plot


def write_json(path: str, payload: dict) -> str:
    """Write ``payload`` to ``path`` atomically (temporary file, then ``os.replace``); return ``path``.

    Examples
    --------
    >>> p = os.path.join(tempfile.mkdtemp(), "sub", "x.json")
    >>> write_json(p, {"a": 1}) == p and json.load(open(p))
    {'a': 1}
    """
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    text = json.dumps(jsonable(payload), indent=1, allow_nan=False) + "\n"  # a bad value fails before any write
    return write_atomically(path, text.encode())


class Results:
    """The rows of one benchmark run, with what they depend on.

    Parameters
    ----------
    script : str
        The benchmark's name (``bench_passes``).
    argv : sequence of str, optional
        Its arguments (default ``sys.argv[1:]``).
    settings : dict, optional
        Anything else a reader needs (rounds, thread count, toolchains...).
    """

    def __init__(self, script: str, argv: Optional[Sequence[str]] = None, **settings):
        from ..measure import machine

        self.script = os.path.splitext(os.path.basename(script))[0]
        argv = sys.argv[1:] if argv is None else list(argv)
        self.command: List[str] = [f"scripts/{self.script}.py", *argv]
        self.machine = machine()
        self.settings: Dict[str, object] = dict(settings)
        self.rows: List[dict] = []

    def add(self, **row) -> None:
        """Append one row (keyword arguments)."""
        self.rows.append(row)

    def payload(self) -> dict:
        """The JSON document: ``script``, ``command``, ``date``, ``machine``, ``settings``, ``rows``."""
        return {"script": self.script, "command": self.command, "date": self.machine["date"],
                "machine": self.machine, "settings": self.settings, "rows": self.rows}

    def write(self, path: Optional[str] = None) -> str:
        """Write the JSON (default :func:`default_path`), say where on stderr, return the path.

        With ``--plot PATH`` on the command line, the bar chart is drawn there too.
        """
        path = path or default_path(self.script)
        write_json(path, self.payload())
        print(f"results: {path}", file=sys.stderr)
        plot_path = _plot_option(self.command[1:])
        if plot_path:
            try:
                print(f"plot: {plot(self.payload(), plot_path)}", file=sys.stderr)
            except ValueError as err:  # nothing to plot (yet): the results themselves are written
                print(f"plot: not drawn: {err}", file=sys.stderr)
        return path
