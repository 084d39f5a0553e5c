"""The demo's toolchains section on the small MLP."""
from __future__ import annotations

import pytest

from tvm_tcutils import demo

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def test_toolchains_section_reports_partition_and_latency(mlp_model):
    lines = demo._toolchains("mlp", *mlp_model)
    assert lines[0].startswith("tcutils_ort: onnxruntime ")
    # Every operator of the MLP (dense, bias_add, relu, softmax, batch_flatten) converts: one partition.
    ops = demo._count_ops(mlp_model[0]["main"])
    assert lines[1].startswith(f"{ops} of {ops} operator calls in 1 ONNX Runtime partition(s)")
    assert "outputs finite: True" in lines[2]
