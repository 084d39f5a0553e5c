"""Test-harness speed-ups that do not change what TVM computes.

TVM 0.19's ``te_compiler.get_shape`` calls ``tvm.support.libinfo()`` for every
dimension of every operator it lowers, and each call copies TVM's whole build
map over the FFI: about a fifth of a ResNet-18 ``relay.build`` on this VM. The
map is fixed when ``libtvm`` is built, so the suite's processes (pytest's, the
fork server's, the int8 sweep's workers) read it once. ``import tvm_tcutils`` does
the same for users (``_compat.install_cached_libinfo``); this one also serves the
suite's processes that run TVM without the package (the bare-TVM oracles).
"""
from __future__ import annotations


def cache_libinfo() -> None:
    """Make ``te_compiler`` read ``libinfo`` from one copy taken now (idempotent)."""
    import tvm.support
    from tvm.relay.backend import te_compiler

    if getattr(te_compiler.libinfo, "_tcutils_cached", False):
        return
    info = dict(tvm.support.libinfo().items())

    def libinfo() -> dict:
        return info

    libinfo._tcutils_cached = True  # type: ignore[attr-defined]
    te_compiler.libinfo = libinfo
