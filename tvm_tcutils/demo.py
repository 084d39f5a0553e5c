"""The demo: each capability contributes one section, run in order on one model.

A section is a function ``(name, mod, params) -> list of report lines`` that
lives with its capability; :data:`SECTIONS` names them as ``"module:function"``
so that this module imports none of them until the demo runs.
"""
from __future__ import annotations

import importlib
from typing import Callable, Dict, List

import numpy as np

from ._tvm import tvm
from tvm import relay

from .measure import build_and_time

Section = Callable[[str, tvm.IRModule, Dict], List[str]]


def count_ops(func: relay.Function) -> Dict[str, int]:
    """Number of calls to each primitive op in ``func`` (composite bodies included).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> count_ops(load_model("mlp")[0]["main"])["nn.dense"]
    3
    """
    ops: Dict[str, int] = {}

    def count(node):
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            ops[node.op.name] = ops.get(node.op.name, 0) + 1

    relay.analysis.post_order_visit(func, count)
    return ops


def baseline_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """Baseline: the model as TVM alone compiles it for the CPU."""
    ops = count_ops(mod["main"])
    top = ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:4])
    outputs, build_s, ms = build_and_time(mod, params)
    finite = all(np.isfinite(out).all() for out in outputs)
    return [
        f"{name}: {sum(ops.values())} operator calls ({top}, ...)",
        f"TVM build for this CPU {build_s:.1f} s, latency {ms:.2f} ms (median), outputs finite: {finite}",
    ]


#: Demo sections, in the order they run. Capabilities append theirs.
SECTIONS: List[str] = [
    "tvm_tcutils.demo:baseline_section",
    "tvm_tcutils.tensorcore.demo:prepare_section",
    "tvm_tcutils.tensorcore.demo:tensorcore_section",
    "tvm_tcutils.collage.demo:toolchains_section",
    "tvm_tcutils.dotprod.demo:int8_dot_product_section",
    "tvm_tcutils.collage.demo:collage_section",
]


def _resolve(spec: str) -> Section:
    module, _, func = spec.partition(":")
    return getattr(importlib.import_module(module), func)


def run_demo(name: str, mod: tvm.IRModule, params: Dict) -> int:
    """Run every section of :data:`SECTIONS` and print the report.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> run_demo("mlp", *load_model("mlp"))  # doctest: +SKIP
    0
    """
    print(f"tvm-tcutils demo on {name}")
    for section in map(_resolve, SECTIONS):
        title = (section.__doc__ or section.__name__).strip().splitlines()[0].lstrip("_")
        print(f"== {title}")
        for line in section(name, mod, params):
            print(f"   {line}")
    return 0
