"""Optimality cross-check: the same cost function gives the same total as TVM 0.19's CollagePartition.

TVM's pass can only use BYOC target kinds registered in this build, which is
``example_target_hook`` alone, so the BYOC side is a pattern table registered
under that name (through a throw-away ``tvm_tcutils.registry.Registry``);
every entry carries a predicate, because 2-tuples hit an arity bug in TVM's
Python wrapper. TVM prints its total ("Estimated overall cost is ...us") on
stderr, read here with ``capfd``.
"""
from __future__ import annotations

import dataclasses
import re

import pytest
import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

import tvm_tcutils
from tvm_tcutils import registry
from tvm_tcutils.collage import CustomCostEstimator, partition, prepare
from tvm_tcutils.bench.models import encoder
from tvm_tcutils.collage.toolchains import TVM, Toolchain

from conftest import small_conv_net

HOOK = "example_target_hook"
ARITY = {"nn.dense": 2, "add": 2, "multiply": 2, "exp": 1, "nn.relu": 1, "nn.bias_add": 2, "nn.softmax": 1,
         "nn.batch_matmul": 2, "reshape": 1, "transpose": 1, "erf": 1, "divide": 2, "nn.conv2d": 2, "mean": 1,
         "subtract": 2, "sqrt": 1, "power": 2}
PER_OP = {"tvm": {"nn.dense": 3.0, "nn.conv2d": 4.0, "nn.batch_matmul": 3.0, "*": 1.0},
          HOOK: {"nn.dense": 2.0, "nn.conv2d": 5.0, "exp": 0.5, "nn.softmax": 0.4, "*": 1.5}}
OVERHEAD = {"tvm": 0.25, HOOK: 1.0}


def _patterns():
    return [(f"{HOOK}.{name}", dfp.is_op(name)(*[dfp.wildcard() for _ in range(arity)]), lambda e: True)
            for name, arity in ARITY.items()]


def cost_ms(mod: tvm.IRModule, toolchain: str) -> float:
    """Per-partition overhead plus a per-operator cost, counting every op call in the module."""
    ops = []
    for func in mod.functions.values():
        relay.analysis.post_order_visit(
            func, lambda e: ops.append(e.op.name) if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None)
    table = PER_OP[toolchain]
    return OVERHEAD[toolchain] + sum(table.get(op, table["*"]) for op in ops)


def _tvm_seconds(mod, target):
    return 1e-3 * cost_ms(mod, "tvm" if target.kind.name == "llvm" else HOOK)


@pytest.fixture(scope="module")
def hook_registered():
    reg = registry.Registry()
    reg.add(registry.pattern_table(HOOK, _patterns), registry.packed_func("tvm_tcutils.test.collage_cost", _tvm_seconds))
    reg.register()
    yield
    reg.unregister()


def _tvm_collage_ms(mod, depth, capfd) -> float:
    targets = [tvm.target.Target("llvm"), tvm.target.Target(HOOK)]
    config = {"relay.collage.tvm_max_depth": depth, "relay.collage.byoc_max_depth": depth}
    with tvm.transform.PassContext(config=config):
        compilation = tvm.target.make_compilation_config(tvm.transform.PassContext.current(), targets)
        estimator = relay.collage.CustomCostEstimator("tvm_tcutils.test.collage_cost")
        relay.transform.CollagePartition(compilation, estimator)(mod)
    found = re.findall(r"Estimated overall cost is ([0-9.]+)us", capfd.readouterr().err)
    assert found, "TVM's CollagePartition did not report its total"
    return float(found[-1]) / 1000.0


MODELS = {
    "mlp": lambda: prepare(*tvm_tcutils.load_model("mlp")),
    "conv": lambda: prepare(small_conv_net()),
    "encoder": lambda: encoder(1, hidden=32, heads=2, seq=8),
}


@pytest.mark.parametrize("model, depth, mixed", [
    ("mlp", 1, True), ("mlp", 2, True), ("mlp", 3, True), ("conv", 1, False), ("conv", 3, False),
    ("encoder", 1, True),
])
def test_same_total_cost_as_tvm_collage(hook_registered, capfd, model, depth, mixed):
    mod = MODELS[model]()
    ours = partition(
        mod, None,
        [dataclasses.replace(TVM, max_depth=depth),
         # TVM's rules have no maximal-region candidates: leave ours out to compare like with like.
         Toolchain(HOOK, HOOK, pattern_table=HOOK, combine=True, max_depth=depth, greedy_regions=False)],
        CustomCostEstimator(cost_ms), compare_single=False,
    )
    assert ours.estimated_ms == pytest.approx(_tvm_collage_ms(mod, depth, capfd), abs=1e-6)
    # Where the hook's cheap ops appear the best answer mixes toolchains (the conv net has none).
    assert any(p.toolchain == HOOK for p in ours.partitions) == mixed
