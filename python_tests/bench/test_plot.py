"""Bar charts of benchmark results (tvm_tcutils.bench.plot) and the --plot options that ask for them."""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys

import pytest

from tvm_tcutils.bench import plot as plotting
from tvm_tcutils.bench import results
from tvm_tcutils.commands import _checks as checks
from tvm_tcutils.commands import bench as bench_command
from tvm_tcutils.commands._common import CommandError
from tvm_tcutils.measure import Timing, ratio

HAS_MATPLOTLIB = importlib.util.find_spec("matplotlib") is not None
needs_matplotlib = pytest.mark.skipif(not HAS_MATPLOTLIB, reason="matplotlib is not installed (the plot extra)")


def small_results(argv=()) -> results.Results:
    res = results.Results("bench_example", list(argv))
    fast, slow = Timing((1.0, 1.1, 0.9, 1.0)), Timing((2.0, 2.2, 1.8, 2.0))
    res.add(model="mlp", ours=fast, theirs=slow, speedup=ratio(slow, fast))
    res.add(model="resnet-18", ours=slow, theirs=slow, speedup=ratio(slow, slow))
    return res


def test_series_prefers_ratios_then_timings():
    payload = results.jsonable(small_results().payload())
    kind, labels, data = plotting.series(payload)
    assert (kind, labels, list(data)) == ("ratio", ["mlp", "resnet-18"], ["speedup"])
    value, low, high = data["speedup"][0]
    assert value == pytest.approx(2.0) and low <= value <= high
    for row in payload["rows"]:
        del row["speedup"]
    kind, _, data = plotting.series(payload)
    assert kind == "ms" and sorted(data) == ["ours", "theirs"]
    median, low, high = data["theirs"][0]
    assert median == pytest.approx(2.0) and high - low == pytest.approx(2.0 * Timing((2.0, 2.2, 1.8)).spread / 2)


def test_nothing_to_plot_and_bad_input():
    assert plotting.series({"rows": [{"model": "mlp", "seconds": 3.0, "layers": 2}]}) == (
        "value", ["mlp"], {"seconds": [(3.0, 3.0, 3.0)]})
    with pytest.raises(ValueError, match="nothing to plot"):
        plotting.series({"rows": [{"model": "mlp", "layers": 2}]})
    with pytest.raises(TypeError, match="results must be"):
        plotting.plot(42, "out.png")


@pytest.mark.parametrize("path, message", [("chart.jpg", "cannot write '.jpg'"),
                                           ("/no/such/dir/chart.png", "does not exist")])
def test_bad_plot_paths_fail_fast(path, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        plotting.check_plot_path(path)
    with pytest.raises(CommandError, match=f"--plot {path}: .*{message}"):
        checks.validate(argparse.Namespace(plot=path), bench_command.CHECKS)
    parser = argparse.ArgumentParser()
    results.add_json_argument(parser, "bench_example")
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--plot", path])
    assert stop.value.code == 2


def test_missing_matplotlib_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # "import matplotlib" then raises ImportError
    with pytest.raises(ValueError, match=r"pip install tvm-tcutils\[plot\]"):
        plotting.check_plot_path(str(tmp_path / "chart.png"))


@needs_matplotlib
@pytest.mark.parametrize("name, magic", [("chart.png", b"\x89PNG"), ("chart.svg", b"<?xml")])
def test_plot_writes_a_chart(name, magic, tmp_path):
    res = small_results()
    json_path = res.write(str(tmp_path / "r.json"))
    out = plotting.plot(json_path, str(tmp_path / name))
    with open(out, "rb") as handle:
        assert handle.read(5).startswith(magic)
    if name.endswith(".svg"):
        svg = open(out).read()
        assert "bench_example" in svg and json.load(open(json_path))["date"][:10] in svg


@needs_matplotlib
def test_results_write_draws_the_plot_of_its_command_line(tmp_path):
    chart = tmp_path / "speedup.png"
    res = small_results(["--rounds", "2", "--plot", str(chart)])
    res.write(str(tmp_path / "r.json"))
    assert chart.stat().st_size > 0
