"""Workloads of the pass benchmark, importable WITHOUT the package (TVM and numpy only).

``scripts/bench_passes.py`` times TVM's own passes in a child process that
must not import ``tvm_tcutils`` (the package installs ConvertLayout hooks): the
child loads this file by path (``runpy.run_path``), so this module imports
nothing from the package and the package's ``__init__`` never runs there.

Examples
--------
>>> mod = workload("chain3")
>>> mod["main"].body.op.name
'nn.relu'
"""
from __future__ import annotations

from typing import Callable

WORKLOADS = ("chain500", "chain2000", "chain10000", "resnet-152", "inception_v3")
STEPS = ("count_layers", "recast", "convert_layout", "prepare")


def workload(name: str):
    """The untyped IRModule of a workload name: ``chain<N>`` (N conv2d+relu layers) or a TVM testing model."""
    import numpy as np
    import tvm
    from tvm import relay
    from tvm.relay import testing

    if name.startswith("chain"):
        layers = int(name[len("chain"):])
        x = relay.var("data", shape=(1, 32, 8, 8))
        weight = relay.const(np.full((32, 32, 3, 3), 1.0 / 288, dtype="float32"))
        y = x
        for _ in range(layers):
            y = relay.nn.relu(relay.nn.conv2d(y, weight, padding=(1, 1), channels=32, kernel_size=(3, 3)))
        return tvm.IRModule.from_expr(relay.Function([x], y))
    if name == "resnet-152":
        return testing.resnet.get_workload(num_layers=152)[0]
    if name == "inception_v3":
        return testing.inception_v3.get_workload()[0]
    raise ValueError(f"workload must be one of {WORKLOADS} or chain<N>, got {name!r}")


def best_of(run: Callable[[], object], seconds_of: Callable[[Callable[[], object]], float],
            again_below: float = 10.0) -> float:
    """Seconds ``run()`` takes: the better of two runs when the first is short (the machine is shared).

    ``seconds_of(run)`` times one call: :func:`tvm_tcutils.measure.time_callable`
    in the package, a plain clock in the child that cannot import it.

    Examples
    --------
    >>> best_of(lambda: None, lambda run: 0.5)
    0.5
    """
    first = seconds_of(run)
    return first if first >= again_below else min(first, seconds_of(run))
