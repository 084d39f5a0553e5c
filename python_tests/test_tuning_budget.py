"""``tuning.tune``'s time budget and progress callback (no measuring: the budget is spent before)."""
from __future__ import annotations

import pytest

from tvm_tcutils import host_target, load_model
from tvm_tcutils.progress import ProgressUpdate, Reporter
from tvm_tcutils.tuning import _BudgetEnded, _TrialCounter, tune


def test_spent_budget_tunes_nothing_and_leaves_the_log_alone(tmp_path, int8_mlp):
    log = tmp_path / "int8.log"
    log.write_text("")
    summary = tune(int8_mlp, {}, host_target(), 4, str(log), progress=False, time_budget_s=0)
    assert [name for name, _ in summary] == ["tcutils.dense_dot"] * 3
    assert all(trials == 0 for _, trials in summary) and log.read_text() == ""


def test_trial_counter_reports_progress_and_stops_past_the_deadline():
    seen = []
    counter = _TrialCounter("tune t", 8, Reporter(seen.append), deadline=None)
    counter(None, [1, 2, 3], [1, 2, 3])
    assert counter.trials == 3 and seen[-1].done == 3 and seen[-1].total == 8 and seen[-1].phase == "tune t"
    assert isinstance(seen[-1], ProgressUpdate)
    late = _TrialCounter("tune t", 8, Reporter(False), deadline=0.0)
    with pytest.raises(_BudgetEnded):
        late(None, [1], [1])
    assert late.trials == 1  # the batch is counted (and, ordered after log_to_file, logged) first


def test_bad_time_budget(tmp_path):
    with pytest.raises(ValueError, match="time_budget_s"):
        tune(load_model("mlp")[0], {}, host_target(), 4, str(tmp_path / "x.log"), time_budget_s=-1)
