"""Test-only external codegens for Collage tests (imported by tests and by measuring workers).

* ``tcutils_test``: a tiny real codegen: inlines the composites of a
  partition, lowers it with TVM's TE lowering (``lower_to_primfunc``) and
  builds it for llvm under the partition's global symbol. It runs any
  partition of injective / elementwise / reduction ops.
* ``tcutils_test_abort``: aborts the process (like an LLVM assertion).
* ``tcutils_test_hang``: never returns.
* ``tcutils_test_chatty``: writes 1 MiB to stderr and stdout, then builds like ``tcutils_test``.
* ``tcutils_test_spawn_hang``: starts a sleeping child process (its pid
  written to the file ``$TCUTILS_TEST_GRANDCHILD``), then never returns.

And one measuring-worker task, ``leave_cycle`` (:data:`~tvm_tcutils.collage.cost.workers.TASKS`): it leaves
``mb`` MiB in a reference cycle, as a large candidate's buffers are left in cycles of TVM objects.

They are declared as hooks and installed through a throw-away
``tvm_tcutils.registry.Registry``, the package's one way into TVM's registries.
"""
from __future__ import annotations

import os
import time

import tvm
from tvm import relay
from tvm.relay import dataflow_pattern as dfp

from tvm_tcutils import registry
from tvm_tcutils.collage.cost import workers
from tvm_tcutils.collage.toolchains import Toolchain


class _InlineComposites(relay.ExprMutator):
    def visit_call(self, call):
        args = [self.visit(a) for a in call.args]
        if isinstance(call.op, relay.Function):
            body = self.visit(call.op.body)
            return relay.bind(body, dict(zip(call.op.params, args)))
        return relay.Call(self.visit(call.op), args, call.attrs, call.type_args, call.span)


def _codegen(func):
    symbol = str(func.attrs["global_symbol"])
    body = _InlineComposites().visit(func.body)
    plain = relay.Function(func.params, body)
    plain = relay.transform.InferType()(tvm.IRModule.from_expr(plain))["main"]
    plain = plain.with_attr("Primitive", tvm.tir.IntImm("int32", 1))
    target = tvm.target.Target("llvm")
    prim = relay.backend.te_compiler.lower_to_primfunc(plain, target)
    return tvm.build(tvm.IRModule({symbol: prim.with_attr("global_symbol", symbol)}), target=target)


def _abort(func):
    os.abort()


def _hang(func):
    time.sleep(3600)


def _chatty(func):
    # More than a pipe holds (64 KiB): a worker whose stderr is not read blocks here.
    for fd in (2, 1):
        os.write(fd, b"x" * (1 << 20))
    return _codegen(func)


def _spawn_hang(func):
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    with open(os.environ["TCUTILS_TEST_GRANDCHILD"], "w") as handle:
        handle.write(str(child.pid))
    time.sleep(3600)


HOOKS = [
    registry.packed_func("relay.ext.tcutils_test", _codegen),
    registry.packed_func("relay.ext.tcutils_test_abort", _abort),
    registry.packed_func("relay.ext.tcutils_test_hang", _hang),
    registry.packed_func("relay.ext.tcutils_test_chatty", _chatty),
    registry.packed_func("relay.ext.tcutils_test_spawn_hang", _spawn_hang),
]
_REGISTRY = registry.Registry()
_REGISTRY.add(*HOOKS)
_REGISTRY.register()


def _leave_cycle(mb: int) -> dict:
    import numpy as np

    held = {"data": np.ones(mb << 20, np.uint8)}  # touched: resident
    held["self"] = held
    return {"ms": 1.0}


workers.TASKS.setdefault("leave_cycle", _leave_cycle)


ELEMENTWISE = {"add": 2, "multiply": 2, "nn.relu": 1, "exp": 1, "tanh": 1, "subtract": 2, "negative": 1}


def elementwise_patterns(prefix, ops=None):
    """Single-op patterns for the elementwise ops the test codegen runs."""
    return tuple(
        (f"{prefix}.{name}", dfp.is_op(name)(*[dfp.wildcard() for _ in range(ELEMENTWISE[name])]))
        for name in (ops or ELEMENTWISE)
    )


def toolchain(compiler="tcutils_test", name=None, combine=True, max_depth=3, ops=None):
    """A toolchain for ``compiler`` claiming elementwise ops (all, or ``ops``)."""
    return Toolchain(name or compiler, compiler, patterns=elementwise_patterns(compiler, ops),
                     combine=combine, max_depth=max_depth)
