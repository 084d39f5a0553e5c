"""``tuning.confirm_best``: the untuned config and the tuner's fastest measured again in turns, one chosen."""
from __future__ import annotations

import json
import time

import pytest
from tvm import autotvm

from tvm_tcutils import host_target
from tvm_tcutils import processes
from tvm_tcutils.tuning import (CONFIRM_MIN_TRIALS, CONFIRMED_KEY, PackageLocalRunner, applied_records,
                                checked_records, choose_confirmed, confirm_best, default_config_index,
                                extract_tasks, tune, valid_indexes, write_confirmed)


@pytest.fixture(scope="module")
def dense_task(int8_mlp):  # conftest's int8_mlp: the MLP quantized once for the session
    return extract_tasks(int8_mlp, {}, host_target())[0]


def _trial(task, index: int, seconds: float):
    return (autotvm.measure.MeasureInput(task.target, task, task.config_space.get(index)),
            autotvm.measure.MeasureResult((seconds,), 0, 0.0, time.time()))


def _history(task, fast: int, default: int):
    """Trials where ``fast`` looks far faster than the untuned config (as a trial measured by chance can)."""
    others = [i for i in valid_indexes(task.config_space) if i not in (fast, default)]
    rows = [_trial(task, default, 1.0), _trial(task, fast, 1e-9)]
    rows += [_trial(task, i, 2.0) for i in others[:CONFIRM_MIN_TRIALS]]
    return rows


@pytest.mark.parametrize("untuned,others,chosen", [
    ([2, 2, 2, 2, 2], {1: [1, 1, 1, 1, 3]}, 1),            # lost one round of five: still chosen
    ([2, 2, 2, 2, 2], {1: [1, 1, 1, 3, 3]}, None),         # lost two
    ([2, 2, 2, 2, 2], {1: [1, 1, 1, 1, 1], 2: [0.5, 0.5, 0.5, 0.5, 0.5]}, 2),  # the least median of the winners
    ([2, 2, 2, 2, 2], {1: [1, 1, 1, 1]}, None),            # failed a round
    ([1, 1, 1], {4: [1, 1, 1]}, None),                     # level is not faster
])
def test_choose_confirmed(untuned, others, chosen):
    assert choose_confirmed(untuned, others) == chosen


def test_confirm_best_measures_each_candidate_every_round_and_marks_one(dense_task, tmp_path):
    task = dense_task
    default = default_config_index(task)
    fast = next(i for i in valid_indexes(task.config_space) if i != default)
    rounds = 3
    # One build process (the default starts one per CPU, each importing TVM) for the three configurations.
    measure = autotvm.measure_option(builder=autotvm.LocalBuilder(n_parallel=1),
                                     runner=PackageLocalRunner(number=1, repeat=3, timeout=20))
    with processes.reaper():
        records = confirm_best(task, _history(task, fast, default), measure, rounds, default)
    indexes = [inp.config.index for inp, _ in records]
    assert indexes[0] == default and fast in indexes and len(set(indexes)) == len(indexes)
    assert all(len(res.costs) == rounds and min(res.costs) > 0 for _, res in records)
    chosen = [inp.config.index for inp, res in records if res.tcutils_chosen]
    assert len(chosen) == 1
    times = {inp.config.index: res.costs for inp, res in records}
    picked = choose_confirmed(times[default], {i: t for i, t in times.items() if i != default})
    assert chosen[0] == (default if picked is None else picked)

    # In the log: AutoTVM still reads every line; a build applies the confirmed choice, not the lucky trial.
    log = tmp_path / "tune.log"
    with open(log, "w") as handle:
        for inp, res in _history(task, fast, default):
            handle.write(autotvm.record.encode(inp, res) + "\n")
    write_confirmed(str(log), records, rounds)
    assert len(list(autotvm.record.load_from_file(str(log)))) == len(checked_records(str(log)))
    marks = [json.loads(line).get(CONFIRMED_KEY) for line in open(log)]
    assert sum(m is not None for m in marks) == len(records) and sum(bool(m and m["chosen"]) for m in marks) == 1
    with autotvm.apply_history_best(applied_records(str(log))) as best:
        assert best.query(task.target, task.workload).index == chosen[0]
    with autotvm.apply_history_best(str(log)) as plain:  # AutoTVM's own choice: the least single trial
        assert plain.query(task.target, task.workload).index == fast


def test_nothing_to_confirm(dense_task):
    task = dense_task
    default = default_config_index(task)
    fast = next(i for i in valid_indexes(task.config_space) if i != default)
    measure = {"builder": None, "runner": None}  # nothing may be measured
    assert confirm_best(task, _history(task, fast, default), measure, 1, default) == []  # one round
    assert confirm_best(task, _history(task, fast, default), measure, 5, None) == []  # no untuned point
    few = _history(task, fast, default)[:CONFIRM_MIN_TRIALS - 1]
    assert confirm_best(task, few, measure, 5, default) == []  # a quick look, not a tuning
    level = [_trial(task, default, 1e-10)] + _history(task, fast, default)[1:]
    assert confirm_best(task, level, measure, 5, default) == []  # the untuned one is the fastest already


@pytest.mark.parametrize("rounds", [-1, 1.5, True, "7"])
def test_confirm_rounds_must_be_a_count(rounds, tmp_path, int8_mlp):
    with pytest.raises(ValueError, match="confirm_rounds must be an int >= 0"):
        tune(int8_mlp, {}, host_target(), 2, str(tmp_path / "t.log"), confirm_rounds=rounds)
    assert not (tmp_path / "t.log").exists()
