"""Deep graphs: no Python recursion, linear work (times are measured in scripts/bench_passes.py)."""
import sys

import pytest
from tvm import relay

from conftest import conv_chain
from tvm_tcutils import LayoutConfig, count_layers, recast
from tvm_tcutils.passes._graph import layer_calls, resolve_ops


@pytest.fixture
def shallow_python_stack():
    """A Python stack far shallower than the graph: any recursion over the graph fails."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.timeout(240)
def test_ten_thousand_layer_chain(shallow_python_stack):
    layers = 10_000
    mod = relay.transform.InferType()(conv_chain(layers))  # TVM's type inference: the costly step
    assert count_layers(mod, ["nn.conv2d"]) == layers
    assert count_layers(mod, ["nn.conv2d", "nn.relu"]) == 2 * layers
    out = recast(mod, "int8", "int32", skip_layers=[0, -1])
    calls = layer_calls(out, resolve_ops("nn.conv2d", "ops"))
    assert len(calls) == layers
    casted = [str(c.attrs.out_dtype) == "int32" for c in calls]
    assert casted[0] is False and casted[-1] is False and all(casted[1:-1])
    with LayoutConfig(skip_layers=[1, layers - 2]) as config:
        config_seen = config  # ConvertLayout itself is TVM's (measured in the benchmark); count here
    assert config_seen.skip_layers == {1, layers - 2}
