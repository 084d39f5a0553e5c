"""Damaged AutoTVM logs: tuning resumes and builds use what is readable (issue 20)."""
from __future__ import annotations

import json
import logging

import pytest

from tvm import autotvm

from conftest import host_dot_target, run_cli, small_conv_net
from tvm_tcutils import measure, tuning
from tvm_tcutils.models import save_model


@pytest.fixture(scope="module")
def tuned(int8_conv_tuning):
    """An int8 one-conv model and a clean two-record log of it (conftest's session, shared with
    ``test_tuning_cli.py``; every test here damages or tunes on a copy, never the log itself)."""
    mod, log, _ = int8_conv_tuning
    with open(log) as handle:
        lines = handle.read().splitlines()
    assert len(lines) == 2
    return mod, log, lines


def _damaged(tmp_path, lines, extra: bytes) -> str:
    path = tmp_path / "damaged.log"
    path.write_bytes(("\n".join(lines) + "\n").encode() + extra)
    return str(path)


def _out_of_space(line: str) -> str:
    row = json.loads(line)
    row["config"]["entity"][0][2] = [999] * len(row["config"]["entity"][0][2]) \
        if isinstance(row["config"]["entity"][0][2], list) else 999
    return json.dumps(row)


DAMAGE = {
    "cut last line": lambda lines: lines[1][: len(lines[1]) // 2].encode(),
    "not utf-8": lambda lines: b"\xff\xfe\x00garbage\n",
    "json list": lambda lines: b"[1, 2, 3]\n",
    "json number": lambda lines: b"42\n",
    "wrong field types": lambda lines: json.dumps({"input": 5, "config": "x", "result": None}).encode() + b"\n",
    "unknown knob kind": lambda lines: lines[0].replace('"sp"', '"zz"').replace('"ot"', '"zz"').encode() + b"\n",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_log_keeps_readable_records_and_names_the_file(tuned, tmp_path, caplog, kind):
    _, _, lines = tuned
    path = _damaged(tmp_path, lines, DAMAGE[kind](lines))
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.tuning"):
        records = tuning.read_log(path)
    assert len(records) == 2
    assert any(path in rec.getMessage() and "skipped 1" in rec.getMessage() for rec in caplog.records)


def test_tune_resumes_after_a_cut_last_line(tuned, tmp_path):
    mod, _, lines = tuned
    path = _damaged(tmp_path, lines, DAMAGE["cut last line"](lines))
    summary = tuning.tune(mod, {}, host_dot_target(), trials=3, log=path, progress=False, measure_number=1)
    assert summary == [("tcutils.conv2d_nchw_dot", 1)]  # two recorded trials count, one new
    assert len(tuning.read_log(path)) == 3


def test_out_of_space_knobs_are_left_out_before_building(tuned, tmp_path, caplog):
    mod, _, lines = tuned
    path = tmp_path / "knobs.log"
    path.write_text(_out_of_space(lines[0]) + "\n" + lines[1] + "\n")
    assert len(tuning.read_log(str(path))) == 2
    with caplog.at_level(logging.WARNING, logger="tvm_tcutils.tuning"):
        kept = tuning.checked_records(str(path))
    assert len(kept) == 1 and json.loads(json.dumps(kept[0][0].config.to_json_dict())) == json.loads(lines[1])["config"]
    assert any("config space" in rec.getMessage() for rec in caplog.records)
    # Building under the log applies the valid record and finishes.
    lib = measure.build(mod, {}, host_dot_target(), str(path))
    assert lib.get_graph_json()


def test_bench_command_with_a_damaged_log_warns_and_runs(tuned, tmp_path):
    _, log, lines = tuned
    model = str(tmp_path / "net.json")
    save_model(model, small_conv_net(channels=16, size=8))
    damaged = _damaged(tmp_path, lines, b"{not json\n")
    proc = run_cli("bench", model, "--dtype", "int8", "--log", damaged, "--repeat", "1", "--no-baseline")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "damaged.log" in proc.stderr and "skipped 1" in proc.stderr


def test_clean_log_reads_like_autotvm(tuned):
    _, log, _ = tuned
    ours = [(str(i.target), i.task.workload, i.config.index) for i, _ in tuning.read_log(log)]
    theirs = [(str(i.target), i.task.workload, i.config.index) for i, _ in autotvm.record.load_from_file(log)]
    assert ours == theirs and len(tuning.checked_records(log)) == len(ours)
