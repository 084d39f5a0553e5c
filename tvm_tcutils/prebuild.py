"""What a module goes through before TVM builds it, or extracts tuning tasks from it.

A capability may register a rewrite under the packed function
``tcutils.prebuild`` (the int8 capability's: QDQ regions of quantized models
become integer ops on targets with a dot-product instruction). The core calls
it by name, so it imports no capability, and in one place, so that what is
tuned (``tvm-tcutils tune``) is what is built and timed (``measure.build``,
``bench``, Collage).

Examples
--------
>>> from tvm_tcutils.models import load_model
>>> mod, params = load_model("mlp")
>>> calls_op(mod, "nn.dense"), calls_op(mod, "qnn.quantize")
(True, False)
>>> prepare(mod, params, "llvm")[0] is mod   # nothing quantized: built as it is
True
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

from ._tvm import tvm
from tvm import relay

#: The packed function a capability registers to rewrite a module before it is built.
PREBUILD_FUNC = "tcutils.prebuild"

#: Node kind -> its sub-expressions, for :func:`calls_op`'s walk.
_CHILDREN = (
    (relay.Call, lambda e: [*e.args, e.op]),
    (relay.Function, lambda e: [e.body]),
    (relay.Tuple, lambda e: list(e.fields)),
    (relay.TupleGetItem, lambda e: [e.tuple_value]),
    (relay.Let, lambda e: [e.value, e.body]),
    (relay.If, lambda e: [e.cond, e.true_branch, e.false_branch]),
)


def calls_op(mod: tvm.IRModule, name: str) -> bool:
    """Whether ``mod``'s ``main`` calls the operator ``name`` anywhere.

    An explicit stack, not ``relay.analysis.post_order_visit``: that recurses in
    C++ and overflows the native stack on very deep graphs, and this runs before
    every build.
    """
    stack, seen = [mod["main"]], set()
    while stack:
        expr = stack.pop()
        if expr in seen:
            continue
        seen.add(expr)
        if isinstance(expr, relay.Call) and getattr(expr.op, "name", "") == name:
            return True
        for kind, children in _CHILDREN:
            if isinstance(expr, kind):
                stack.extend(children(expr))
                break
    return False


def prepare(mod: tvm.IRModule, params: Optional[Dict], target: str) -> Tuple[tvm.IRModule, Optional[Dict]]:
    """``(mod, params)`` as TVM should build them for ``target``: through ``tcutils.prebuild`` when a
    capability registered it and the module quantizes (``qnn.quantize``), else unchanged.

    The rewrite reads quantized weights as constants, so ``params`` are bound
    into the module first (and None is returned for them).
    """
    prebuild = tvm.get_global_func(PREBUILD_FUNC, allow_missing=True)
    if prebuild is None or not calls_op(mod, "qnn.quantize"):
        return mod, params
    if params:
        bound = tvm.IRModule(dict(mod.functions.items()), dict(mod.type_definitions.items()))
        bound["main"] = relay.build_module.bind_params_by_name(mod["main"], params)
        mod, params = bound, None
    return prebuild(mod, str(target)), params
