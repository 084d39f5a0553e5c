"""Buffers an onnxruntime I/O binding refers to outlive every run through it.

An ``IOBinding`` made by the toolchain's session holds raw buffer addresses only: a
binding that outlives its arrays writes its output into whatever the allocator puts
there next (``scripts/bench_packed_call.py`` crashed so, in its "onnxruntime alone" step).
"""
from __future__ import annotations

import textwrap

import numpy as np
import pytest
import tvm

from conftest import run_python
from tvm_tcutils.bench.toolchains import elementwise_chain
from tvm_tcutils.collage.toolchains import ort
from tvm_tcutils.collage.toolchains.packed_call import byoc_partition
from tvm_tcutils.measure import build, graph_module, outputs

pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")

#: Fresh arrays take the memory of the arrays just freed; a run through a stale binding changes them.
_SENTINELS = """
import gc
import numpy as np
import tvm
gc.collect()
sentinels = [tvm.nd.array(np.full((1, 256), 7.0, "float32")) for _ in range(64)]
"""


def test_ort_alone_timer_keeps_its_buffers():
    # Before the fix the timer's input and output were freed when it was returned: the next
    # arrays took their memory and the session's output (7 - 0.01) landed in one of them.
    # The chain runs first, as in the script (the timer used to take a session the chain loaded).
    code = textwrap.dedent("""
        import numpy as np
        from tvm_tcutils.bench.toolchains import elementwise_chain, ort_alone_timer
        from tvm_tcutils.collage.toolchains import ort
        from tvm_tcutils.collage.toolchains.packed_call import byoc_partition
        from tvm_tcutils.measure import build, graph_module
        lib = build(byoc_partition(elementwise_chain(2), ort.COMPILER, merge=False))
        graph_module(lib, {"x": np.ones((1, 256), "float32")}).run()
        timer = ort_alone_timer(repeat=1, min_ms=0.0)
    """) + _SENTINELS + textwrap.dedent("""
        for _ in range(3):
            assert timer() > 0
        changed = sorted({float(v) for s in sentinels for v in s.numpy().ravel()} - {7.0})
        print("changed", changed)
        assert not changed, changed
    """)
    done = run_python(code, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_compiled_module_runs_on_new_buffers_after_its_executor_is_freed():
    # The session caches a binding per set of buffer addresses: a second executor (new
    # buffers) must get its own binding, and the first one's freed buffers stay untouched.
    lib = build(byoc_partition(elementwise_chain(2), ort.COMPILER, merge=False))
    x = np.linspace(-1.0, 1.0, 256, dtype="float32").reshape(1, 256)
    expected = np.maximum(x - 0.01, 0.0)
    first = graph_module(lib, {"x": x})
    first.run()
    np.testing.assert_allclose(outputs(first)[0], expected, rtol=1e-6)
    del first
    sentinels = [tvm.nd.array(np.full((1, 256), 7.0, "float32")) for _ in range(64)]
    second = graph_module(lib, {"x": 2 * x})
    second.run()
    np.testing.assert_allclose(outputs(second)[0], np.maximum(2 * x - 0.01, 0.0), rtol=1e-6)
    assert all((s.numpy() == 7.0).all() for s in sentinels)
