"""AutoTVM tuning of the dot-product templates (XGBTuner, resumable log) and the tune / bench commands."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay, te

from conftest import host_dot_target, run_cli, small_conv_net
from tvm_tcutils.dotprod.isa import for_target
from tvm_tcutils.dotprod.topi.packing import channel_block
from tvm_tcutils import measure, tuning
from tvm_tcutils.dotprod import quantize
from tvm_tcutils.models import save_model


def test_tune_resume_and_apply_history_best(int8_conv_tuning, tmp_path):
    target = host_dot_target()
    isa = for_target(target)
    lanes, block = isa.lanes, channel_block(16, isa.lanes)
    k_dtype = isa.conv_kernel_dtype("int8")  # int16 pairs on AVX2
    group = isa.kernel_group(k_dtype)
    # The quantized data is int8; legalize shifts it to uint8 where the ISA has no i8 x i8 form (VNNI).
    data_dtype = "int8" if isa.variant("int8", "int8") is not None else "uint8"
    # The first session (2 trials on a fresh log) is conftest's, shared with test_tuning_log.py; its summary
    # and log are checked here. Resuming works on a copy: the shared log stays as tuned.
    mod, clean, first = int8_conv_tuning
    params = {}
    log = str(tmp_path / "tune.log")
    shutil.copyfile(clean, log)
    assert [name for name, _ in first] == ["tcutils.conv2d_nchw_dot"] and first[0][1] == 2
    records = list(autotvm.record.load_from_file(log))
    assert len(records) == 2 and all(res.error_no == 0 for _, res in records)
    # Resuming: the log already holds the trials.
    assert tuning.tune(mod, params, target, trials=2, log=log, progress=False) == [("tcutils.conv2d_nchw_dot", 0)]

    with autotvm.apply_history_best(log) as ctx:
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(mod, target=target, params=params)
        # The alter-layout hook carried the tuned config over to the packed op's workload.
        packed = autotvm.task.args_to_workload(
            [te.placeholder((1, 16 // block, 8, 8, block), data_dtype),
             te.placeholder((16 // lanes, 16 // block, 3, 3, block // group, lanes, group), k_dtype),
             (1, 1), (1, 1, 1, 1), (1, 1), f"NCHW{block}c", f"NCHW{lanes}c", "int32"],
            "tcutils.conv2d_nchwc_dot",
        )
        cfg = ctx.query(tvm.target.Target(target), packed)
    assert not cfg.is_fallback
    best = min(records, key=lambda r: np.mean(r[1].costs))[0].config
    assert cfg.to_json_dict()["entity"] == best.to_json_dict()["entity"]
    # The tuned schedule computes what the fallback one does (int8: bit for bit).
    _, tuned = measure.latency_ms(lib, mod, params, repeat=1)
    _, untuned = measure.latency_ms(measure.build(mod, params, target), mod, params, repeat=1)
    np.testing.assert_array_equal(tuned, untuned)


def test_bad_arguments():
    with pytest.raises(ValueError, match="dtype must be one of"):
        quantize.prepare(None, {}, "int4")
    with pytest.raises(ValueError, match="trials"):
        tuning.tune(None, {}, "llvm", 0, "x.log")
    with pytest.raises(FileNotFoundError, match="tuning log"):
        measure.build(small_conv_net(), {}, "llvm", "/nonexistent/x.log")


@pytest.mark.slow  # 12 s (the CI budget): tune runs through the tracker in test_rpc.py, logs in test_tuning_log.py
def test_tune_and_bench_commands(tmp_path):
    target = host_dot_target()  # the commands' default target
    model, log = str(tmp_path / "net.json"), str(tmp_path / "net.log")
    save_model(model, small_conv_net(channels=16, size=8))
    proc = run_cli("tune", model, "--trials", "1", "--log", log)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "task 1/1 tcutils.conv2d_nchw_dot: 1 new trials" in proc.stdout
    assert "tuned 1 tasks, 1 new trials" in proc.stdout and "Progress: (1/1)" in proc.stdout
    # A 1 ms budget ends the timing after a round or two of the fifty asked for, and the report says so.
    proc = run_cli("bench", model, "--dtype", "int8", "--log", log, "--repeat", "50", "--time-budget", "0.001")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"net.json int8 on {target}:" in proc.stdout and "speedup x" in proc.stdout
    done = re.search(r"\(median of (\d+), the time budget ended after (\d+) of 50 rounds\)", proc.stdout)
    assert done and done.group(1) == done.group(2) and int(done.group(1)) < 50, proc.stdout
    bad = run_cli("tune", model, "--trials", "0", "--log", log)
    assert bad.returncode == 2 and "--trials must be at least 1" in bad.stderr


def test_tune_command_passes_templates_on(monkeypatch, tmp_path):
    # The command's --templates reaches tuning.tune (whose own tests check what it does with them).
    import argparse

    from tvm_tcutils.commands import tune as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["mlp", "--log", str(tmp_path / "t.log"), "--templates", "a.x", "b.y"])
    seen = {}
    monkeypatch.setattr(tuning, "tune", lambda *a, **k: seen.update(k) or [])
    assert command.run(args) == 0 and seen["templates"] == ["a.x", "b.y"]
