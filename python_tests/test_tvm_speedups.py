"""The suite's TVM speed-up keeps TVM's answers (python_tests/_tvm_speedups.py)."""
from __future__ import annotations

import tvm.support
from tvm.relay.backend import te_compiler

from _tvm_speedups import cache_libinfo


def test_cached_libinfo_is_tvms_build_map():
    cache_libinfo()
    cache_libinfo()  # idempotent: still one copy
    live = {str(k): str(v) for k, v in tvm.support.libinfo().items()}
    assert {str(k): str(v) for k, v in te_compiler.libinfo().items()} == live
    assert te_compiler.libinfo() is te_compiler.libinfo()
    assert te_compiler.libinfo()["INDEX_DEFAULT_I64"] == live["INDEX_DEFAULT_I64"]
