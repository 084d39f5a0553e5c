"""Deep graphs: no Python recursion, no native stack overflow (times: scripts/bench_passes.py)."""
import sys

import pytest
from tvm import relay

from conftest import conv_chain
from tvm_tcutils import count_layers, recast


@pytest.fixture
def shallow_python_stack():
    """A Python stack far shallower than the graph: any recursion over the graph fails."""
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(400)
    try:
        yield
    finally:
        sys.setrecursionlimit(limit)


@pytest.mark.timeout(300)
def test_ten_thousand_layer_chain(shallow_python_stack):
    layers = 10_000
    mod = relay.transform.InferType()(conv_chain(layers))  # TVM's type inference: most of the time
    assert count_layers(mod, ["nn.conv2d"]) == layers
    assert count_layers(mod, ["nn.conv2d", "nn.relu"]) == 2 * layers
    out = recast(mod, "int8", "int32", skip_layers=[0, -1])
    # 50,000 chained nodes: relay.analysis.post_order_visit overflows the C stack here.
    assert count_layers(out, ["cast"]) == 3 * (layers - 2)
    assert count_layers(out, ["nn.conv2d"]) == layers
