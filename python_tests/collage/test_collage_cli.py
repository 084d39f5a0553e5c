"""``tvm-tcutils collage`` end to end on a small model."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from conftest import build_and_run, run_cli

import tvm_tcutils


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory):
    """``collage mlp --toolchains tvm`` into an empty cost cache, written and drawn: (folder, its run).

    The cache it fills is the retry test's starting point too (read-only: that test copies it). One measuring
    worker (``--workers 1``, as the retry test): the second worker of the default pool is an interpreter start
    more, and what these tests check does not depend on it (test_cli.py checks the default's choice)."""
    tmp_path = tmp_path_factory.mktemp("collage_cli")
    proc = run_cli("collage", "mlp", "--toolchains", "tvm", "-o", str(tmp_path / "partitioned.json"),
                   "--dot", str(tmp_path / "partitions.dot"), "--cache-dir", str(tmp_path / "cache"), "--repeat", "2",
                   "--workers", "1")
    return tmp_path, proc


def test_collage_cli_partitions_saves_and_draws(partitioned):
    tmp_path, proc = partitioned
    out = tmp_path / "partitioned.json"
    dot = tmp_path / "partitions.dot"
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert sum(1 for line in lines if line.split()[:2] == ["#", "toolchain"]) == 1  # one table
    assert any("nn.dense" in line and " tvm " in line for line in lines)
    total = next(line for line in lines if line.strip().startswith("total: estimated"))
    assert "measured whole" in total and "failed" not in total
    # One toolchain: nothing to compare (the final comparison's own tests are in test_collage_final.py), said so.
    assert any(line.startswith("toolchains alone: not timed (only one toolchain: nothing to compare)")
               for line in lines)
    assert "answer: Collage's mix (not compared with the toolchains alone: only one toolchain" in proc.stdout
    costed = next(line for line in lines if " candidates: " in line)
    assert "costed (the progress bar's total)" in costed
    # The written module reloads and gives the model's outputs.
    mod, params = tvm_tcutils.load_model(str(out))
    model, model_params = tvm_tcutils.load_model("mlp")
    inputs = tvm_tcutils.models.random_inputs(model, model_params)
    np.testing.assert_allclose(build_and_run(mod, params, inputs)[0], build_and_run(model, model_params, inputs)[0],
                               rtol=1e-5, atol=1e-6)
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


def test_collage_cli_retry_failed_measures_cached_failures_again(partitioned, tmp_path):
    # The cache of the first run (every candidate of the MLP measured, test above), copied.
    cache, log = tmp_path / "cache", tmp_path / "measured.log"
    shutil.copytree(partitioned[0] / "cache", cache)
    common = ["collage", "mlp", "--toolchains", "tvm", "--cache-dir", str(cache), "--repeat", "1", "--no-compare",
              "--workers", "1"]
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
    # --no-compare times nothing whole, and says so.
    assert "validate" not in proc.stdout.splitlines()[0] and "compare" not in proc.stdout.splitlines()[0]
    assert "toolchains alone: not timed (--no-compare)" in proc.stdout
    assert "answer: Collage's mix (not compared with the toolchains alone: --no-compare)" in proc.stdout
