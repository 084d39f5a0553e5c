"""TVM's own lowering as a Collage toolchain.

Its partitions are the groups TVM's ``FuseOps`` could form, enumerated from
the operators' ``TOpPattern`` fusion kinds (:class:`~..rules.FusionKindRule`),
plus free host glue (tuples, projections). Partitions chosen for TVM stay in
``main``; ``relay.build`` fuses and lowers them (with the package's own
schedules where registered).

``tvm-fastmath`` is the same with TVM's ``FastMath`` rewrite: ``erf``,
``exp``, ``tanh`` and softmax become TVM's vectorizable approximations
(absolute error about 1e-6 on GELU and softmax outputs), which makes them
5-15x faster on CPUs where ``relay.build`` otherwise calls the C library
per element (``scripts/bench_collage_toolchains.py``). Named alone it lowers
all of ``main``; named beside ``tvm`` it is a choice per partition: its
candidates are the TVM candidates holding one of those operators, and the
partitions chosen for it are rewritten node by node (under an error budget,
see :mod:`~tvm_tcutils.collage.precision`).
"""
from __future__ import annotations

import dataclasses

from .base import Toolchain

#: Longest operator chain of a TVM candidate: an anchor (conv2d, dense) with a
#: short elementwise epilogue, as ``FuseOps`` typically makes them.
MAX_DEPTH = 4

TVM = Toolchain(
    name="tvm",
    compiler=None,
    fusion=True,
    max_depth=MAX_DEPTH,
    description="TVM's own lowering for the host (llvm), fused by TOpPattern kinds",
)

TVM_FASTMATH = dataclasses.replace(
    TVM,
    name="tvm-fastmath",
    fast_math=True,
    precision="f32 fast math",
    exact="tvm",
    description="TVM's own lowering with its FastMath rewrite (fast erf, exp, tanh, softmax)",
)
