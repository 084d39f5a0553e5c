"""The final answer (the mix only when it is faster with confidence), progress, time budgets and the report."""
from __future__ import annotations

import itertools
import math
import os
import sys
import time

import numpy as np
import pytest
import tvm

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import collage_test_codegen as test_codegen  # noqa: E402

from tvm_tcutils.collage import MockCostEstimator, partition  # noqa: E402
from tvm_tcutils.collage.driver import greedy_partition  # noqa: E402
from tvm_tcutils.collage.report import answer_line, candidate_line, report_lines  # noqa: E402
from tvm_tcutils.collage.validate import final_answer  # noqa: E402
from tvm_tcutils.measure import interleave_until, ratio  # noqa: E402

from conftest import build_and_run  # noqa: E402
from test_collage_driver import CrossingCosts, FusingWholeModel, elementwise_net, reference  # noqa: E402

#: Relative noise of fake timings: a cycle, so every test is deterministic.
NOISE = (1.0, 1.01, 0.99, 1.005, 0.995)


def fake(ms: float, scale: float = 1.0):
    """A timer of ``ms`` with a 1 % deterministic noise (times ``scale``), recording how often it was called."""
    noise = itertools.cycle(NOISE)

    def sample() -> float:
        sample.calls += 1
        return ms * (1 + scale * (next(noise) - 1))
    sample.calls = 0
    return sample


# ---------------------------------------------------------------------------
# The decision, with fake timers
# ---------------------------------------------------------------------------
def test_mix_clearly_faster_is_the_answer_after_the_first_test():
    timers = {"collage": fake(1.0), "tvm alone": fake(2.0), "ort alone": fake(1.5)}
    out = final_answer(timers, min_rounds=4, max_rounds=30)
    assert out.answer == "collage" and out.is_mix and out.best_single == "ort alone"
    assert out.stopped == "decided" and out.rounds == 4
    assert all(t.calls == 4 for t in timers.values())  # every competitor once per round
    assert out.ratio.value == pytest.approx(1.0 / 1.5) and out.ratio.high < 1
    assert "faster than ort alone with 95 % confidence" in out.reason


def test_overlapping_timings_keep_the_best_single_toolchain():
    # 5 % noise: the interval of two equal timings stays wider than the 1 % of equivalence.
    out = final_answer({"collage": fake(1.0, 5), "tvm alone": fake(1.0, 5), "ort alone": fake(3.0, 5)},
                       min_rounds=3, max_rounds=12)
    assert out.answer == "tvm alone" and not out.is_mix
    assert out.stopped == "rounds" and out.rounds == 12
    assert out.ratio.low <= 1 <= out.ratio.high
    assert "tvm alone is kept: the mix is not faster" in out.reason and "round limit" in out.reason


def test_a_mix_within_one_percent_of_the_best_single_stops_the_rounds_and_keeps_the_single():
    from tvm_tcutils.collage.validate import EQUIVALENCE

    timers = {"collage": fake(1.0), "openvino alone": fake(1.003), "tvm alone": fake(1.5)}
    out = final_answer(timers, min_rounds=5, max_rounds=40)
    assert out.answer == "openvino alone" and out.stopped == "decided" and out.rounds < 40
    assert 1 - EQUIVALENCE <= out.ratio.low <= 1 <= out.ratio.high
    assert "at best x0.99 of it" in out.reason and "cannot win by more" in out.reason
    # Without a mix the fastest single must still be separated from the second: no equivalence stop.
    out = final_answer({"openvino alone": fake(1.0), "ort alone": fake(1.003)}, mix=None, min_rounds=5,
                       max_rounds=12)
    assert out.stopped == "rounds" and out.rounds == 12


def test_a_mix_that_cannot_be_one_percent_faster_stops_the_rounds_however_much_slower_it_may_be():
    from tvm_tcutils.collage.validate import EQUIVALENCE

    # Noisier than the band: the interval's upper end stays far above x1.01 while its lower end has reached
    # x0.99, so more rounds could not make the mix the answer.
    out = final_answer({"collage": fake(1.01, 3), "openvino alone": fake(1.0)}, min_rounds=5, max_rounds=40)
    assert out.answer == "openvino alone" and out.stopped == "decided" and out.rounds < 40
    assert out.ratio.low >= 1 - EQUIVALENCE and out.ratio.high > 1 + EQUIVALENCE, out.ratio


def test_budget_end_keeps_the_best_single_toolchain_with_the_reason():
    ticks = itertools.count()  # one second per clock reading
    out = final_answer({"collage": fake(1.0, 5), "tvm alone": fake(1.0, 5)}, budget_s=5, min_rounds=2,
                       max_rounds=100, clock=lambda: float(next(ticks)))
    assert out.answer == "tvm alone" and out.stopped == "budget" and out.rounds < 100
    assert "the time budget ended" in out.reason


def test_mix_slower_says_the_single_toolchain_is_fastest():
    out = final_answer({"collage": fake(2.0), "ort alone": fake(1.0), "tvm alone": fake(4.0)}, min_rounds=3)
    assert out.answer == "ort alone" and out.stopped == "decided"
    assert out.reason.startswith("ort alone is fastest; no mix beats it")


def test_a_failing_competitor_is_left_out():
    def broken():
        raise RuntimeError("cannot run")
    out = final_answer({"collage": fake(1.0), "ort alone": broken, "tvm alone": fake(2.0)}, min_rounds=3)
    assert out.answer == "collage" and out.best_single == "tvm alone"
    assert out.timings["ort alone"].samples_ms == ()


def test_without_a_mix_the_fastest_single_toolchain_wins():
    out = final_answer({"tvm alone": fake(2.0), "ort alone": fake(1.0)}, mix=None, min_rounds=3)
    assert out.answer == "ort alone" and out.mix is None and out.ratio.value == pytest.approx(0.5)
    assert "ort alone is fastest" in out.reason


@pytest.mark.parametrize("kwargs, message", [
    (dict(confidence=1.0), "confidence must lie in (0, 1)"),
    (dict(mix="nosuch"), "mix: 'nosuch' is not one of the timers"),
    (dict(min_rounds=5, max_rounds=2), "need 1 <= min_rounds <= max_rounds"),
])
def test_final_answer_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        final_answer({"collage": fake(1.0), "tvm alone": fake(2.0)}, **kwargs)


def test_interleave_until_takes_turns_and_reports_rounds():
    order, rounds = [], []
    timers = {name: (lambda name=name: order.append(name) or 1.0) for name in "abc"}
    out = interleave_until(timers, lambda t: ratio(t["a"], t["b"]).separated, min_rounds=2, max_rounds=3,
                           on_round=rounds.append)
    assert order == list("abc") * 3 and rounds == [1, 2, 3] and out.stopped == "rounds"


# ---------------------------------------------------------------------------
# Through the driver: a fake whole-model timer that samples
# ---------------------------------------------------------------------------
class Sampling:
    """A validation timer whose ``sampler`` gives noisy samples of its estimator's whole-model time."""

    def __init__(self, estimator, delay_s: float = 0.0):
        self.estimator, self.delay_s = estimator, delay_s

    def time(self, mod):
        time.sleep(self.delay_s)
        return self.estimator.measure_whole(mod)

    def time_side_by_side(self, mods, rounds=5):
        return None

    def sampler(self, mod):
        return fake(self.estimator.measure_whole(mod))


class SamplingCosts(CrossingCosts):
    delay_s = 0.0

    def whole_model_timer(self):
        return Sampling(self, self.delay_s)


class SamplingFusing(FusingWholeModel):
    def whole_model_timer(self):
        return Sampling(self)


class ColdValidation(FusingWholeModel):
    """Validation's one timing of each model misses the greedy region's fusion; the interleaved rounds see it."""

    def whole_model_timer(self):
        timer = Sampling(self)
        timer.time = lambda mod: CrossingCosts.measure_whole(self, mod)
        return timer


TOOLCHAINS = ["tvm", test_codegen.toolchain()]
ISOLATED = {"tvm": {"add": 0.1, "*": 3.0}, "tcutils_test": 0.5}
INPUTS = {"x": np.random.default_rng(1).standard_normal((4, 8)).astype("float32")}


def phases(updates):
    """Phases in order of first appearance, and each phase's updates."""
    out = {}
    for update in updates:
        out.setdefault(update.phase, []).append(update)
    return out


def test_driver_returns_the_mix_when_faster_and_reports_progress():
    updates = []
    result = partition(elementwise_net(), None, TOOLCHAINS, SamplingCosts(ISOLATED, {}, crossing_ms=0.0),
                       progress=updates.append)
    # Mix 7.6 ms (exp, tanh, multiply in the test toolchain) against the greedy region's 8 ms and TVM's 15.1 ms.
    assert result.answer == "collage" and result.final.is_mix and not result.partial
    assert result.final.best_single == "tcutils_test alone" and result.final.ratio.high < 1
    assert result.measured_ms == pytest.approx(7.6, rel=0.02)
    np.testing.assert_allclose(build_and_run(result.mod, inputs=INPUTS)[0], reference(elementwise_net(), INPUTS),
                               rtol=1e-5, atol=1e-6)
    # Progress: phases in order, done monotone and bounded by a total that does not change within a phase.
    by_phase = phases(updates)
    assert list(by_phase) == ["enumerate", "estimate", "search", "validate", "compare"]
    for ups in by_phase.values():
        assert [u.done for u in ups] == sorted(u.done for u in ups)
        assert len({u.total for u in ups}) == 1 and all(0 <= u.done <= u.total for u in ups)
    assert [u.elapsed for u in updates] == sorted(u.elapsed for u in updates)
    assert by_phase["estimate"][-1].done == by_phase["estimate"][-1].total == result.counts["costed"]
    assert by_phase["compare"][-1].done == result.final.rounds
    # The report: the candidate count is the progress bar's total; the answer with its ratio and interval.
    assert f"{result.counts['costed']} costed (the progress bar's total)" in candidate_line(result)
    line = answer_line(result)
    assert line.startswith("answer: Collage's mix, x0.9") and "of tcutils_test alone [0.9" in line
    lines = report_lines(result)
    assert sum(1 for ln in lines if ln.strip().split()[:1] == ["#"]) == 1  # one table
    assert any(ln.strip().startswith("tvm alone") and "measured 15.1" in ln for ln in lines)
    assert any(ln.strip().startswith("tcutils_test alone") and "<- fastest alone" in ln for ln in lines)


def test_driver_returns_the_single_toolchain_when_no_mix_beats_it():
    mod = elementwise_net()
    result = partition(mod, None, TOOLCHAINS, ColdValidation(ISOLATED, {}, crossing_ms=0.0))
    # Whole, the one greedy region runs at half its isolated cost (7 ms): faster than the mix (7.6 ms).
    assert result.trials[0][0] == "collage" and result.final.mix == "collage"
    assert result.answer == "tcutils_test alone" and not result.final.is_mix
    assert tvm.ir.structural_equal(result.mod, greedy_partition(mod, None, test_codegen.toolchain()),
                                   map_free_vars=True)
    assert [p.toolchain for p in result.partitions] == ["tvm", "tcutils_test"]
    assert all(math.isnan(p.estimated_ms) for p in result.partitions)
    assert answer_line(result).startswith("answer: tcutils_test alone. tcutils_test alone is fastest; no mix beats it")
    assert "chosen partitions (tcutils_test alone):" in report_lines(result)


def test_each_toolchain_alone_is_timed_once_in_the_final_comparison():
    mod = elementwise_net()
    result = partition(mod, None, TOOLCHAINS, SamplingFusing(ISOLATED, {}, crossing_ms=0.0))
    # Validation times the search's mixes only; each toolchain alone (the greedy region: 7 ms whole) is
    # built and timed once, side by side with the mix, in the final comparison.
    assert [label for label, _, _ in result.trials] == ["collage"]
    assert set(result.final.timings) == {"collage", "tvm alone", "tcutils_test alone"}
    assert result.answer == "tcutils_test alone"
    assert tvm.ir.structural_equal(result.mod, greedy_partition(mod, None, test_codegen.toolchain()),
                                   map_free_vars=True)
    assert all(math.isnan(p.estimated_ms) for p in result.partitions)
    # The mix that lost stays in the result and the report, with its estimates, borders and crossing cost.
    assert [p.toolchain for p in result.mix_partitions].count("tcutils_test") == 3
    # Each [4, 8] float32 tensor is 0.125 KB: a unary partition moves one in and one out.
    assert result.mix_measured_ms == pytest.approx(7.6)
    assert [p.border_kb for p in result.mix_partitions if p.toolchain == "tcutils_test"] == [0.25] * 3
    lines = report_lines(result)
    assert "Collage's mix (not the answer): estimated 7.600 ms, measured whole 7.600 ms" in lines
    assert any(ln.startswith("crossings: 3 partition(s) outside tvm, 0.8 KB across the borders") for ln in lines)


class Prebuilding(Sampling):
    """A timer whose sampler records what the driver asks it to build early, and when."""

    def __init__(self, estimator):
        super().__init__(estimator)
        self.calls = []
        timer = self

        class Sampler:
            def __call__(self, mod):
                return Sampling.sampler(timer, mod)

            def prebuild(self, modules):
                timer.calls.append(("prebuild", sorted(modules)))

        self.sampler = Sampler()

    def time(self, mod):
        self.calls.append(("time", None))
        return super().time(mod)


class SamplingPrebuilt(FusingWholeModel):
    def whole_model_timer(self):
        self.timer = getattr(self, "timer", None) or Prebuilding(self)
        return self.timer


def test_the_comparisons_rivals_start_building_before_validation():
    # The comparison's whole models build on the second core while validation builds its mixes.
    # First the mix validation times and what is quick to make (TVM alone), then every rival once the
    # BYOC toolchains' greedy partitionings are made (the sampler starts only those not started yet).
    est = SamplingPrebuilt(ISOLATED, {}, crossing_ms=0.0)
    result = partition(elementwise_net(), None, TOOLCHAINS, est)
    rivals = sorted(set(result.final.timings) - {"collage"})
    assert len(rivals) == 2 and len(result.trials) >= 1
    assert est.timer.calls[:3] == [("prebuild", ["collage"]), ("prebuild", ["tvm alone"]), ("prebuild", rivals)]
    assert [kind for kind, _ in est.timer.calls[3:]] == ["time"] * len(result.trials)
    # With an error budget the lossy rivals are checked first: nothing is built early.
    est = SamplingPrebuilt(ISOLATED, {}, crossing_ms=0.0)
    partition(elementwise_net(), None, TOOLCHAINS, est, error_budget=1.0, sample_inputs=INPUTS)
    assert not any(kind == "prebuild" for kind, _ in est.timer.calls)


def test_time_budget_during_estimation_returns_tvm_alone_marked_partial():
    mod = elementwise_net()
    updates = []
    result = partition(mod, None, TOOLCHAINS, MockCostEstimator({"tvm": 1.0, "tcutils_test": 0.1}),
                       time_budget_s=1e-9, progress=updates.append)
    assert result.partial and "ended while estimating (0 of" in result.partial_reason
    assert "so TVM alone" in result.partial_reason and result.not_compared == "the time budget ended"
    assert all(p.toolchain == "tvm" for p in result.partitions)
    assert phases(updates)["estimate"][-1].done == 0  # nothing was costed
    lines = report_lines(result)
    assert lines[1].startswith("PARTIAL: the time budget of 1e-09 s ended while estimating")
    # Valid and buildable: the model's outputs.
    np.testing.assert_allclose(build_and_run(result.mod, inputs=INPUTS)[0], reference(mod, INPUTS),
                               rtol=1e-5, atol=1e-6)
    unhurried = partition(mod, None, TOOLCHAINS, MockCostEstimator({"tvm": 1.0, "tcutils_test": 0.1}),
                          time_budget_s=600)
    assert not unhurried.partial and any(p.toolchain == "tcutils_test" for p in unhurried.partitions)


def test_time_budget_during_validation_keeps_the_best_timed_so_far():
    est = SamplingCosts(ISOLATED, {}, crossing_ms=0.0)
    # Each whole model "takes" 1.5 s to time; the budget ends during the first (enumerating, estimating
    # and searching this net take about 0.2 s: a budget of 0.1 s ended before validation on a slow VM).
    est.delay_s = 1.5
    result = partition(elementwise_net(), None, TOOLCHAINS, est, time_budget_s=1.0)
    assert result.partial and "ended while validating" in result.partial_reason
    assert result.final is None and result.not_compared == "the time budget ended"
    assert 1 <= len(result.trials) <= 2 and result.answer == "collage"
    np.testing.assert_allclose(build_and_run(result.mod, inputs=INPUTS)[0], reference(elementwise_net(), INPUTS),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(progress="bar"), TypeError, "progress must be a callable"),
    (dict(time_budget_s=0), ValueError, "time_budget_s"),
    (dict(confidence=1.5), ValueError, "confidence must lie in"),
])
def test_partition_bad_progress_budget_confidence(mlp_model, kwargs, error, message):
    with pytest.raises(error, match=message):
        partition(*mlp_model, "tvm", MockCostEstimator({"tvm": 1.0}), **kwargs)


def test_final_comparison_lets_a_sampler_build_all_modules_its_own_way():
    from tvm_tcutils.collage.validate import final_comparison

    class Builder:
        def __call__(self, module):
            raise AssertionError("build_all builds them")

        def build_all(self, modules):
            return {name: (RuntimeError("does not build") if value == "broken" else (lambda v=value: float(v)))
                    for name, value in modules.items()}

    modules = {"collage": 1.0, "a alone": 2.0, "b alone": "broken"}
    out = final_comparison(modules, "collage", Builder(), min_rounds=2, max_rounds=2)
    assert list(out.timings) == list(modules) and out.answer == "collage"
    assert out.timings["b alone"].samples_ms == () and out.timings["a alone"].median_ms == 2.0


def test_the_report_names_a_re_searched_mix_validation_did_not_build():
    import dataclasses

    result = partition(elementwise_net(), None, TOOLCHAINS, SamplingFusing(ISOLATED, {}, crossing_ms=0.0))
    assert result.not_built == [] and not any("was not built" in ln for ln in report_lines(result))
    skipped = dataclasses.replace(result, not_built=[("collage, 300 us per crossing", 9.5, "tvm alone", 7.25)])
    assert "validation: the re-searched mix (collage, 300 us per crossing) estimated 9.500 ms was not built: " \
        "tvm alone measured 7.250 ms" in report_lines(skipped)


def test_an_answer_that_is_a_toolchains_maximal_region_is_timed_once_as_that_toolchain_alone(monkeypatch):
    from tvm import relay

    import tvm_tcutils.collage.driver as driver_module

    mod = elementwise_net()
    # Crossings dear: the search's answer is the test toolchain's greedy partitioning itself. Its BYOC module
    # stands for it in the comparison: no "collage" contender timed beside the same partitioning, even where
    # the search's own outline of it is not structurally BYOC's (on DenseNet-121 it is not; here a copy at
    # the end makes it differ).
    outline = driver_module.outline_chosen

    def differing(*args, **kwargs):
        out, symbols = outline(*args, **kwargs)
        out = tvm.IRModule(dict(out.functions))
        main = out["main"]
        out["main"] = relay.Function(main.params, relay.copy(main.body), main.ret_type, main.type_params,
                                     main.attrs)
        return relay.transform.InferType()(out), symbols

    monkeypatch.setattr(driver_module, "outline_chosen", differing)
    result = partition(mod, None, TOOLCHAINS, SamplingCosts(ISOLATED, {}, crossing_ms=5.0), progress=False)
    assert result.answer == "tcutils_test alone"
    assert "collage" not in result.final.timings and result.final.mix is None
    assert set(result.final.timings) == {"tvm alone", "tcutils_test alone"}
    assert tvm.ir.structural_equal(result.mod, greedy_partition(mod, None, test_codegen.toolchain()),
                                   map_free_vars=True)


def test_a_mix_with_one_partition_outside_tvm_is_timed_by_the_comparison_only():
    # Each call into the test toolchain dear: the search's mix is its one greedy region. Re-searched with a
    # learned crossing cost it could only come back or give way to TVM alone, both timed in the comparison:
    # validation builds nothing (a mix of three partitions is validated: see above).
    est = SamplingCosts(ISOLATED, {"tcutils_test": 2.0}, crossing_ms=0.0)
    result = partition(elementwise_net(), None, TOOLCHAINS, est, progress=False)
    assert [p.toolchain for p in result.mix_partitions].count("tcutils_test") == 1
    assert result.trials == [] and "validate" not in result.seconds and result.mix_measured_ms is None
    assert result.final is not None and set(result.final.timings) == {"tvm alone", "tcutils_test alone"}
    # Two partitions outside TVM are validated first.
    est = SamplingCosts(ISOLATED, {"tcutils_test": 0.1}, crossing_ms=0.0)
    result = partition(elementwise_net(), None, TOOLCHAINS, est, progress=False)
    assert [p.toolchain for p in result.mix_partitions].count("tcutils_test") > 1
    assert result.trials[0][0] == "collage" and result.seconds["validate"] >= 0
