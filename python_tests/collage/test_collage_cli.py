"""``tvm-tcutils collage`` end to end on a small model."""
from __future__ import annotations

import json
import os

import pytest

from conftest import run_cli

import tvm_tcutils


def test_collage_cli_partitions_saves_and_draws(tmp_path):
    out = tmp_path / "partitioned.json"
    dot = tmp_path / "partitions.dot"
    proc = run_cli("collage", "mlp", "--toolchains", "tvm", "-o", str(out), "--dot", str(dot),
                   "--cache-dir", str(tmp_path / "cache"), "--repeat", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any(line.split()[:2] == ["#", "toolchain"] for line in lines)
    assert any("nn.dense" in line and " tvm " in line for line in lines)
    collage_row = next(line for line in lines if line.startswith("collage "))
    tvm_row = next(line for line in lines if line.startswith("tvm alone"))
    est, measured = map(float, collage_row.split()[1:3])
    assert est > 0 and measured > 0
    assert float(tvm_row.split()[2]) > 0
    mod, _ = tvm_tcutils.load_model(str(out))
    assert mod["main"].checked_type.ret_type.shape[-1] == 10
    text = dot.read_text()
    assert text.startswith("digraph collage") and "nn.dense" in text and "cluster_" in text
    assert os.path.isfile(tmp_path / "cache" / "costs.jsonl")


@pytest.mark.parametrize("toolchains, message", [
    ("tvm,nosuch", "unknown toolchain 'nosuch'; available:"),
])
def test_collage_cli_bad_toolchain(toolchains, message):
    proc = run_cli("collage", "mlp", "--toolchains", toolchains)
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr


def test_collage_cli_missing_tuning_log(tmp_path):
    proc = run_cli("collage", "mlp", "--toolchains", "tvm", "--tuning-log", str(tmp_path / "none.log"))
    assert proc.returncode == 2
    assert "--tuning-log" in proc.stderr and "none.log" in proc.stderr and "Traceback" not in proc.stderr


def test_collage_cli_retry_failed_measures_cached_failures_again(tmp_path):
    cache, log = tmp_path / "cache", tmp_path / "measured.log"
    common = ["collage", "mlp", "--toolchains", "tvm", "--cache-dir", str(cache), "--repeat", "1", "--no-compare"]
    assert run_cli(*common).returncode == 0
    # Every cached cost becomes a fresh failure, as a crashed or timed-out candidate leaves it.
    path = cache / "costs.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert records
    path.write_text("".join(json.dumps(dict(r, ms=None, error="worker killed by signal 9")) + "\n" for r in records))
    proc = run_cli(*common, "--log", str(log))
    assert proc.returncode != 0 or not log.exists() or log.read_text() == ""  # failures kept: nothing measured
    proc = run_cli(*common, "--log", str(log), "--retry-failed")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(log.read_text().splitlines()) >= len(records) > 0
