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


#: Layers of the default run: 3,000 nodes before recast and 7,500 after, far beyond the 400-frame
#: Python stack above (a recursion of even one frame per layer fails at 400 layers), so any
#: recursion over the graph still fails here. TVM's own InferType grows faster than linearly in the
#: depth (10 s of the 10,000-layer case's 16; 4,000 layers cost 3x as much as 1,500 and catch
#: nothing more), so the 50,000-node case (where relay.analysis.post_order_visit overflows the C
#: stack) runs under ``-m slow``.
DEPTHS = [1_500, pytest.param(10_000, marks=pytest.mark.slow)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("layers", DEPTHS)
def test_deep_layer_chain(shallow_python_stack, layers):
    mod = relay.transform.InferType()(conv_chain(layers))  # TVM's type inference: most of the time
    assert count_layers(mod, ["nn.conv2d"]) == layers
    assert count_layers(mod, ["nn.conv2d", "nn.relu"]) == 2 * layers
    out = recast(mod, "int8", "int32", skip_layers=[0, -1])
    assert count_layers(out, ["cast"]) == 3 * (layers - 2)
    assert count_layers(out, ["nn.conv2d"]) == layers
