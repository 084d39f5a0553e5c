"""The demo's toolchains section on the small MLP."""
from __future__ import annotations

import pytest

from tvm_tcutils.collage.demo import op_calls, toolchains_section

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def test_toolchains_section_reports_partition_and_latency(mlp_model):
    lines = toolchains_section("mlp", *mlp_model)
    assert lines[0].startswith("tcutils_ort: onnxruntime ")
    # Every operator of the MLP (dense, bias_add, relu, softmax, batch_flatten) converts: one partition.
    ops = op_calls(mlp_model[0]["main"])
    assert lines[1].startswith(f"{ops} of {ops} operator calls in 1 ONNX Runtime partition(s)")
    assert "outputs finite: True" in lines[2]


def test_op_calls_counts_what_the_demo_counts():
    from tvm_tcutils import demo
    from tvm_tcutils.models import load_model

    func = load_model("mlp")[0]["main"]
    assert op_calls(func) == sum(demo.count_ops(func).values())
