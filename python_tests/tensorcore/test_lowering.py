"""Every tensor-core template lowers to WMMA TIR that fits sm_75, sm_80 and sm_90 (no GPU needed).

For each template (conv2d HWNC and dense; int4 and int8 with each WMMA shape
that fits) the fallback config and a random sample of the config space are
instantiated for ``cuda -arch=sm_80`` and lowered with ``tvm.lower``. The
lowered TIR must

* call ``tvm_load_matrix_sync`` (both operands), ``tvm_mma_sync``,
  ``tvm_fill_fragment`` and ``tvm_store_matrix_sync``;
* stage both operands through ``shared`` allocations, copied with vectors of
  at least 32 bits (CUDA has no scalar 4-bit type);
* bind ``blockIdx.x/y`` and ``threadIdx.x/y/z`` with 32 lanes per warp;
* pass ``tvm.tir.analysis.verify_gpu_code`` with the per-block limits below.

GPU limits (per thread block, CUDA programming guide, "Technical
Specifications per Compute Capability"; TVM's own target tags
``nvidia/geforce-rtx-2080-ti`` (sm_75), ``nvidia/nvidia-a100`` (sm_80) and
``nvidia/nvidia-h100`` (sm_90a) carry the same shared-memory and thread numbers,
which the first test checks):

=========  ===================  =======  ===========================  ==============
arch       static shared/block  threads  threadIdx x / y / z          vector access
=========  ===================  =======  ===========================  ==============
sm_75      48 KB (64 KB dyn.)   1024     1024 / 1024 / 64             16 bytes
sm_80      48 KB (163 KB dyn.)  1024     1024 / 1024 / 64             16 bytes
sm_90      48 KB (227 KB dyn.)  1024     1024 / 1024 / 64             16 bytes
=========  ===================  =======  ===========================  ==============

The kernels allocate shared memory statically, so 48 KB is the limit on all
three; the larger dynamic opt-in sizes do not apply.
"""
import numpy as np
import pytest
import tvm
from tvm import autotvm, te

import tvm_tcutils  # noqa: F401  (registers the templates)
from tvm_tcutils.tensorcore import rules
from tvm_tcutils.tensorcore.topi import conv2d_hwnc, dense, tiled_mma, wmma

KB = 1024
GPU_LIMITS = {
    arch: {
        "max_shared_memory_per_block": 48 * KB,
        "max_threads_per_block": 1024,
        "max_thread_x": 1024,
        "max_thread_y": 1024,
        "max_thread_z": 64,
        "max_vector_bytes": 16,
        "max_vthread": 1,
    }
    for arch in ("sm_75", "sm_80", "sm_90")
}
TVM_TAGS = {"sm_75": "nvidia/geforce-rtx-2080-ti", "sm_80": "nvidia/nvidia-a100", "sm_90": "nvidia/nvidia-h100"}
TARGET = "cuda -arch=sm_80"
SAMPLES = 8

# (dtype, data HWNC, kernel HWOI, stride, padding, dilation)
CONV_CASES = [
    ("int4", (14, 14, 8, 64), (3, 3, 64, 64), 1, 1, 1),
    ("int4", (7, 7, 16, 128), (1, 1, 256, 128), 2, 0, 1),
    ("int8", (14, 14, 32, 64), (3, 3, 64, 64), 1, 1, 1),  # all three int8 shapes fit
    ("int8", (9, 9, 8, 32), (3, 3, 32, 32), 1, 2, 2),
]
# (dtype, batch, in, out)
DENSE_CASES = [("int4", 8, 256, 64), ("int8", 32, 128, 96), ("uint8", 16, 64, 32)]


def _conv_task(dtype, dshape, kshape, stride, pad, dil):
    data = te.placeholder(dshape, dtype, name="data")
    kernel = te.placeholder(kshape, dtype, name="kernel")
    args = (data, kernel, (stride, stride), (pad,) * 4, (dil, dil), "int32")
    return autotvm.task.create(conv2d_hwnc.TASK, args=args, target=TARGET)


def _dense_task(dtype, batch, in_features, out_features):
    data = te.placeholder((batch, in_features), dtype, name="data")
    weight = te.placeholder((out_features, in_features), dtype, name="weight")
    return autotvm.task.create(dense.TASK, args=(data, weight, "int32"), target=TARGET)


def _tir_summary(func: tvm.tir.PrimFunc) -> dict:
    """Builtin calls, allocation scopes and thread extents of a lowered function."""
    calls, scopes, threads, lanes = {}, set(), {}, set()

    def visit(node):
        if isinstance(node, tvm.tir.Call) and isinstance(node.op, tvm.ir.Op):
            calls[node.op.name] = calls.get(node.op.name, 0) + 1
            if node.op.name == "tir.tvm_load_matrix_sync":
                calls[f"load:{node.args[-1].value}"] = 1
        elif isinstance(node, tvm.tir.BufferStore) and node.buffer.scope() == "shared":
            vector = tvm.runtime.DataType(node.value.dtype)
            lanes.add(vector.lanes * vector.bits // 8)
        elif isinstance(node, tvm.tir.Allocate):
            scopes.add(node.buffer_var.type_annotation.storage_scope)
        elif isinstance(node, tvm.tir.AttrStmt) and node.attr_key == "thread_extent":
            name = node.node.thread_tag
            threads[name] = max(threads.get(name, 0), int(node.value))

    tvm.tir.stmt_functor.post_order_visit(func.body, visit)
    return {"calls": calls, "scopes": scopes, "threads": threads, "shared_store_bytes": lanes}


def _lower(task, config):
    with tvm.target.Target(TARGET):
        sched, args = task.instantiate(config)
        return tvm.lower(sched, args)["main"]


def _configs(task):
    """The fallback config and a fixed random sample of the space."""
    indices = np.random.default_rng(len(task.config_space)).choice(
        len(task.config_space), size=min(SAMPLES, len(task.config_space)), replace=False
    )
    fallback = autotvm.task.space.FallbackConfigEntity()
    return [("fallback", fallback)] + [(int(i), task.config_space.get(int(i))) for i in indices]


def _check_lowered(func, config):
    summary = _tir_summary(func)
    calls = summary["calls"]
    for builtin in ("tvm_fill_fragment", "tvm_mma_sync", "tvm_store_matrix_sync"):
        assert calls.get(f"tir.{builtin}"), f"{builtin} missing for {config}"
    assert calls.get("load:row_major") and calls.get("load:col_major"), f"A/B fragment loads missing for {config}"
    assert {"shared", "wmma.matrix_a", "wmma.matrix_b", "wmma.accumulator"} <= summary["scopes"], summary
    # Shared-memory copies are whole-word vectors (no scalar 4-bit accesses).
    assert summary["shared_store_bytes"] and min(summary["shared_store_bytes"]) >= 4, summary
    threads = summary["threads"]
    assert threads.get("threadIdx.x") in (tiled_mma.WARP_SIZE, tiled_mma.UNPACK_THREADS)
    assert {"blockIdx.x", "blockIdx.y", "threadIdx.y", "threadIdx.z"} <= set(threads), threads
    for arch, limits in GPU_LIMITS.items():
        assert tvm.tir.analysis.verify_gpu_code(func, limits), f"{config} exceeds {arch} limits {limits}"


def test_documented_limits_match_tvm_target_tags():
    for arch, tag in TVM_TAGS.items():
        target = tvm.target.Target(tag)
        assert str(target.attrs["arch"]).startswith(arch)
        assert int(target.attrs["max_shared_memory_per_block"]) == GPU_LIMITS[arch]["max_shared_memory_per_block"]
        assert int(target.attrs["max_threads_per_block"]) == GPU_LIMITS[arch]["max_threads_per_block"]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-{c[1]}x{c[2]}-s{c[3]}p{c[4]}d{c[5]}")
def test_conv2d_templates_lower_to_wmma_within_gpu_limits(case):
    task = _conv_task(*case)
    space = task.config_space
    fits = rules.fitting_shapes(case[0], case[1][2], case[1][3], case[2][2])
    assert [e.val for e in space.space_map["wmma_m"].entities] == [s.m for s in fits]
    assert len(space) > 8, space
    for index, config in _configs(task):
        _check_lowered(_lower(task, config), index)


@pytest.mark.parametrize("case", DENSE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_dense_templates_lower_to_wmma_within_gpu_limits(case):
    task = _dense_task(*case)
    assert len(task.config_space) > 8
    for index, config in _configs(task):
        func = _lower(task, config)
        _check_lowered(func, index)
        assert "blockIdx.z" not in _tir_summary(func)["threads"]  # no spatial axes in dense


def test_every_wmma_shape_is_used_by_some_config():
    """The ``wmma_m`` knob really switches the intrinsic shape (m, n, k args of the calls)."""
    task = _conv_task(*CONV_CASES[2])
    seen = set()
    for index in range(len(task.config_space)):
        config = task.config_space.get(index)
        m = config["wmma_m"].val
        if m in {s[0] for s in seen}:
            continue
        func = _lower(task, config)
        found = set()

        def visit(node):
            if isinstance(node, tvm.tir.Call) and getattr(node.op, "name", "") == "tir.tvm_load_matrix_sync":
                found.add(tuple(int(a) for a in node.args[1:4]))

        tvm.tir.stmt_functor.post_order_visit(func.body, visit)
        seen |= found
    assert seen == {(s.m, s.n, s.k) for s in wmma.WMMA_SHAPES["int8"]}


def test_fallback_schedule_of_a_resnet_layer_is_moderate():
    """Untuned: 4 warps (128 threads) and well under the shared-memory limit."""
    task = _conv_task("int4", (14, 14, 32, 256), (3, 3, 256, 256), 1, 1, 1)
    func = _lower(task, autotvm.task.space.FallbackConfigEntity())
    threads = _tir_summary(func)["threads"]
    assert threads["threadIdx.y"] * threads["threadIdx.z"] == 4
    assert tvm.tir.analysis.verify_gpu_code(func, dict(GPU_LIMITS["sm_75"], max_shared_memory_per_block=8 * KB))
    # The check is live: a limit below the staged tiles (2 x 4 tiles x chunk 2 x 128 B each) fails.
    assert not tvm.tir.analysis.verify_gpu_code(func, dict(GPU_LIMITS["sm_75"], max_shared_memory_per_block=1 * KB))
    assert not tvm.tir.analysis.verify_gpu_code(func, dict(GPU_LIMITS["sm_75"], max_threads_per_block=64))
