"""The shared benchmark harness (tvm_tcutils.bench): JSON results, timing in turns, TVM-vs-TVM ratios."""
from __future__ import annotations

import argparse
import json
import os

import pytest

from tvm_tcutils.bench import competitors, results, table
from tvm_tcutils.bench.competitors import add_timing_arguments, compare, timing_settings
from tvm_tcutils.measure import Timing, interleave


def test_results_json_has_machine_command_date_and_rows(tmp_path):
    res = results.Results("bench_example", ["--rounds", "3"], rounds=3)
    timing = Timing((1.0, 2.0, 3.0))
    res.add(model="mlp", ours=timing, missing=float("nan"))
    path = res.write(str(tmp_path / "deep" / "bench_example.json"))
    data = json.loads(open(path).read())
    assert data["command"] == ["scripts/bench_example.py", "--rounds", "3"]
    assert data["date"] == data["machine"]["date"] and data["machine"]["cores"] >= 1
    assert data["settings"] == {"rounds": 3}
    row = data["rows"][0]
    assert row["ours"]["median_ms"] == 2.0 and row["ours"]["samples_ms"] == [1.0, 2.0, 3.0]
    assert row["missing"] is None  # strict JSON: no NaN
    assert os.listdir(tmp_path / "deep") == ["bench_example.json"]  # no temporary file left


def test_json_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "r.json"
    results.write_json(str(path), {"old": 1})
    with pytest.raises(TypeError):
        results.write_json(str(path), {"bad": object()})
    assert json.loads(path.read_text()) == {"old": 1}  # the previous file survives a failed write
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


def test_default_path_is_under_docs_benchmarks_data():
    assert results.default_path("scripts/bench_int8.py").endswith(
        os.path.join("docs", "benchmarks", "data", "bench_int8.json"))


def test_compare_times_contenders_in_turns_and_keeps_missing_ones():
    calls = []

    def timer(name, ms):
        return lambda: calls.append(name) or ms

    timed = competitors.compare({"a": timer("a", 1.0), "none": None, "b": timer("b", 2.0)}, rounds=3)
    assert calls == ["a", "b"] * 3
    assert timed["a"].median_ms == 1.0 and timed["b"].median_ms == 2.0
    assert list(timed) == ["a", "none", "b"] and timed["none"].samples_ms == ()


def test_settled_pauses_and_warms_before_each_sample():
    calls = []
    sample = competitors.settled(lambda: calls.append(1) or 3.0, pause_s=0)
    assert sample() == 3.0 and len(calls) == 2


def test_tvm_vs_tvm_on_mlp_gives_ratio_near_one_with_interval(mlp_model):
    mod, params = mlp_model
    timed = competitors.compare({"first": competitors.relay_module(mod, params, repeat=5, min_repeat_ms=5),
                                 "second": competitors.relay_module(mod, params, repeat=5, min_repeat_ms=5)},
                                rounds=7)
    r = competitors.ratios(timed, "second")["first"]
    assert r.low <= r.value <= r.high
    # One module timed twice: only the machine's noise separates them (a shared 2-core VM).
    assert 0.5 < r.value < 2.0


def test_tables_line_up():
    assert table.aligned(["a", "bb"], [["xxx", 1]]).splitlines() == ["  a  bb", "xxx   1"]
    assert table.markdown(["a"], [[1]]).splitlines()[-1] == "| 1 |"


def _without_openvino(monkeypatch):
    from tvm_tcutils.collage.toolchains import openvino

    monkeypatch.setattr(openvino, "_installed", lambda: False)


def test_single_toolchains_missing_here_are_left_out_with_a_note(monkeypatch):
    from tvm_tcutils.bench import collage as bench_collage
    from tvm_tcutils.bench import toolchains as bench_toolchains

    _without_openvino(monkeypatch)
    usable, notes = bench_toolchains.usable_singles(("blas", "openvino", "ov-bf16"))
    assert usable == ["blas"]
    assert [n.split(" ")[0] for n in notes] == ["openvino", "openvino-bf16"] and all("not installed" in n for n in notes)
    found, notes = bench_collage.usable_toolchains(["tvm", "openvino", "nosuch"])
    assert [tc.name for tc in found] == ["tvm"]
    assert notes[0].startswith("openvino left out: ") and "not installed" in notes[0]
    assert notes[1].startswith("nosuch left out: no such toolchain")


def test_collage_table_cells_come_from_the_final_answer():
    from tvm_tcutils.bench.collage import final_cells
    from tvm_tcutils.collage.validate import final_answer

    slow = iter([3.0, 3.2, 2.8] * 10)
    out = final_answer({"collage": lambda: 1.0, "tvm alone": lambda: next(slow), "ort alone": lambda: 2.0},
                       min_rounds=3, max_rounds=3)
    cells = final_cells(out, ["tvm alone", "ort alone", "blas alone"])
    assert cells[:4] == ["3.00", "2.00", "-", "1.00"]  # medians; blas was not timed
    assert cells[4] == "collage" and cells[5].startswith("x0.500 [")  # against the best single, ort


def _clock(step: float = 1.0):
    ticks = iter(range(10_000))
    return lambda: step * next(ticks)


def test_interleave_stops_at_its_budget_after_a_whole_round_and_reports_each_round():
    calls, seen = [], []
    timers = {"a": lambda: calls.append("a") or 1.0, "b": lambda: calls.append("b") or 2.0}
    out = interleave(timers, 10, time_budget_s=2.5, clock=_clock(), progress=seen.append)
    # The budget is looked at between rounds: every started round ends with both samples.
    assert calls == ["a", "b"] * 3 and [len(t.samples_ms) for t in out.values()] == [3, 3]
    assert [(u.phase, u.done, u.total) for u in seen] == [("time", k, 10) for k in (1, 2, 3)]
    # A spent budget still gives one round.
    assert len(interleave(timers, 10, time_budget_s=0)["a"].samples_ms) == 1


@pytest.mark.parametrize("bad", [-1, "10", float("nan")])
def test_interleave_bad_budget(bad):
    with pytest.raises(ValueError, match="time_budget_s"):
        interleave({"a": lambda: 1.0}, 3, time_budget_s=bad)


def test_timing_settings_reach_every_compare_of_a_script():
    seen = []
    with timing_settings(progress=seen.append, time_budget_s=0):
        first = compare({"a": lambda: 1.0, "b": None}, rounds=4)
        explicit = compare({"a": lambda: 1.0}, rounds=4, time_budget_s=1e9, progress=False)
    after = compare({"a": lambda: 1.0}, rounds=4)
    assert len(first["a"].samples_ms) == 1 and first["b"].samples_ms == ()
    assert len(explicit["a"].samples_ms) == 4 and len(after["a"].samples_ms) == 4
    assert [(u.done, u.total) for u in seen] == [(1, 4)]


def test_script_timing_arguments():
    parser = argparse.ArgumentParser()
    add_timing_arguments(parser)
    assert parser.parse_args([]).time_budget is None
    for bad in ("0", "-3", "soon"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--time-budget", bad])


def test_two_answers_are_built_and_timed_side_by_side(tmp_path, mlp_model, monkeypatch):
    from tvm_tcutils import measure
    from tvm_tcutils.bench.collage_default import answers_side_by_side
    from tvm_tcutils.collage.driver import prepare
    from tvm_tcutils.models import save_model

    class QuickTimer(measure.Timer):
        """The benchmark's Timer with runs of at least 1 ms instead of 100 ms: its 6 samples (2 answers x 3
        rounds) of the MLP took 0.5 s each of busy timing; what is checked (both built, timed in 3 rounds,
        a ratio inside its interval) does not depend on that floor."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "min_repeat_ms": 1})

    monkeypatch.setattr(measure, "Timer", QuickTimer)
    mod = prepare(*mlp_model)  # parameters bound, as result.mod has them
    paths = {name: str(tmp_path / f"{name}.json") for name in ("staged", "measured")}
    for path in paths.values():
        save_model(path, mod)
    out = answers_side_by_side(paths, rounds=3)
    assert set(out["ms"]) == {"staged", "measured"} and all(ms > 0 for ms in out["ms"].values())
    value, low, high = out["ratio"]
    assert low <= value <= high and out["rounds"] == 3
    with pytest.raises(ValueError, match="two answers"):
        answers_side_by_side({"staged": paths["staged"]})


@pytest.mark.parametrize("model, has_file", [("light_squeezenet", True), ("mlp", False)])
def test_a_benchmark_search_times_the_runtimes_on_the_users_file_where_there_is_one(tmp_path, monkeypatch, model,
                                                                                      has_file):
    import tvm_tcutils.collage
    from tvm_tcutils.bench.collage_default import original_file, search_row

    seen = {}

    def stop(*args, **kwargs):  # the arguments a user's search gets, then no search
        seen.update(kwargs)
        raise RuntimeError("stopped before searching")

    monkeypatch.setattr(tvm_tcutils.collage, "partition", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        search_row(model, "tvm", str(tmp_path))
    assert seen["original"] == original_file(model) and (seen["original"] is not None) == has_file


def test_encoder_ops_peak_takes_its_turn_with_every_row():
    # A peak measured once, in a quiet spell of a shared machine, made products timed in a noisy one read at
    # 0.55 of it; the loop now runs in the same turns, with its own operation count, and the table divides by it.
    from tvm_tcutils.bench import int8

    calls = []

    def timer(name, ms):
        return lambda: (calls.append(name), ms)[1]

    out = int8.gops({"ours untuned": timer("ours", 2.0), int8.PEAK_IN_TURNS: timer("peak", 1.0)}, 1e-3, 3,
                    gop_of={int8.PEAK_IN_TURNS: 4e-3})
    assert calls == ["ours", "peak"] * 3
    assert out == {"ours untuned": 0.5, int8.PEAK_IN_TURNS: 4.0}
    row = {"layer": "p", "threads": 1, "peak_gops": 1.0, "gops": {"ours untuned": 0.5, int8.PEAK_IN_TURNS: 4.0}}
    assert int8.encoder_ops_markdown({"rows": [row]}).splitlines()[-1].startswith("| p | 1 | 0 | 12.5% |")
    del row["gops"][int8.PEAK_IN_TURNS]  # a JSON of an earlier run: the peak measured before
    assert "| 50.0% |" in int8.encoder_ops_markdown({"rows": [row]})
