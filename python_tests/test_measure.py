"""The one measuring module: how it prepares TVM's runtime before it times."""
from __future__ import annotations


import numpy as np
import pytest

import tvm
from tvm import relay

_PROBE = """
import os
import tvm
from tvm_tcutils.measure import Timer
from tvm_tcutils.models import load_model
before = os.environ.get("TVM_NUM_THREADS")
Timer(*load_model("mlp"), repeat=1, warmup=0)()
print(before, os.environ.get("TVM_NUM_THREADS"), tvm.get_global_func("runtime.NumThreads")())
"""


def _probe(**env: str) -> list:
    from conftest import run_python

    # Forked from the tests' fork server: TVM and the package are imported there, but TVM's thread pool never
    # started (it starts on the first parallel call, reading the environment then), so the child's pool is
    # sized from the child's own environment, as a fresh interpreter's is.
    unset = tuple(k for k in ("TVM_NUM_THREADS", "OMP_NUM_THREADS") if k not in env)
    proc = run_python(_PROBE, env=env, timeout=120, fresh=False, unset=unset)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.split()[-3:]


def test_timing_sets_tvm_num_threads_to_the_pool_tvm_chose():
    # Unset, TVM re-counts the CPUs on every parallel call; the size written is the pool's own.
    before, after, pool = _probe()
    assert before == "None" and after == pool and int(pool) >= 1


@pytest.mark.parametrize("env, expected", [
    ({"TVM_NUM_THREADS": "1"}, ["1", "1", "1"]),
    ({"OMP_NUM_THREADS": "1"}, ["None", "None", "1"]),
])
def test_a_thread_count_the_user_set_is_kept(env, expected):
    assert _probe(**env) == expected


def test_hot_kernel_seconds_answers_for_each_kernel_in_graph_order(tmp_path):
    from tvm.contrib.debugger import debug_executor
    from tvm_tcutils.measure import hot_kernel_seconds

    x = relay.var("x", shape=(64, 256))
    # A small kernel, then a large one, fusion stopped between them: two kernels, in this order.
    y = relay.annotation.stop_fusion(relay.add(x, relay.const(1.0)))
    y = relay.nn.dense(y, relay.const(np.ones((512, 256), "float32")))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], y)), target="llvm")
    # A dump folder of its own: without one the debug executor leaves a temporary folder behind.
    module = debug_executor.create(lib.get_graph_json(), lib.get_lib(), tvm.cpu(), dump_root=str(tmp_path))
    module.set_input(**lib.get_params())
    module.set_input("x", np.ones((64, 256), "float32"))
    seconds = hot_kernel_seconds(module, lib.get_graph_json(), 3)
    assert len(seconds) == 2 and all(s > 0 for s in seconds)
    assert seconds[1] > seconds[0]  # the dense (8 MFLOP) after the add
