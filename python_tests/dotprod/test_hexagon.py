"""Hexagon HVX: the vrmpy schedules lowered (TIR) and executed under qemu-hexagon, bit-exact vs numpy."""
from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

import tvm
from tvm import autotvm, te

from tvm_tcutils.dotprod import hexagon as hexagon_emulation
from tvm_tcutils.dotprod.isa import HEXAGON_HVX
from tvm_tcutils.dotprod.topi import packing
from tvm_tcutils.dotprod.topi.conv2d_nchwc import conv2d_nchwc_dot, schedule_conv2d_nchwc_dot
from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot, schedule_dense_pack_dot
from test_kernels import conv_reference

RNG = np.random.default_rng(11)
HEXAGON = tvm.target.hexagon("v66")
LANES = HEXAGON_HVX.lanes
VARIANTS = [(v.data_dtype, v.kernel_dtype) for v in HEXAGON_HVX.variants]


def _rand(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _conv(shape, dtypes, mode):
    n, c, h, w, o, k, stride, pad, dil = shape
    ic_bn = packing.channel_block(c, LANES)
    data, kernel = _rand((n, c, h, w), dtypes[0]), _rand((o, c, k, k), dtypes[1])
    data_p, kernel_p = packing.pack_data_nchwc(data, ic_bn), packing.pack_kernel_oihw(kernel, ic_bn, LANES)
    d = te.placeholder(data_p.shape, dtypes[0], name="data")
    kk = te.placeholder(kernel_p.shape, dtypes[1], name="kernel")
    with HEXAGON:
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, kk, stride, pad, dil, "", "")
        sched = schedule_conv2d_nchwc_dot(cfg, [out], mode=mode)
    return sched, [d, kk, out], [data_p, kernel_p], conv_reference(data, kernel, stride, pad, dil), o


def _loops_around(stmt, intrinsic):
    """For each store calling LLVM ``intrinsic``: the names of its enclosing loops (explicit stack)."""
    wanted = int(tvm.target.codegen.llvm_lookup_intrinsic_id(intrinsic))

    def calls_it(node):
        hits = []
        tvm.tir.stmt_functor.post_order_visit(
            node, lambda e: hits.append(e) if isinstance(e, tvm.tir.Call)
            and e.op.name == "tir.call_llvm_pure_intrin" and int(e.args[0]) == wanted else None
        )
        return bool(hits)

    found, stack = [], [(stmt, ())]
    while stack:
        node, loops = stack.pop()
        if isinstance(node, tvm.tir.For):
            stack.append((node.body, loops + (node.loop_var.name,)))
        elif isinstance(node, tvm.tir.SeqStmt):
            stack.extend((child, loops) for child in node.seq)
        elif isinstance(node, tvm.tir.BufferStore):
            if calls_it(node):
                found.append(loops)
        elif isinstance(getattr(node, "body", None), tvm.tir.Stmt):
            stack.append((node.body, loops))
    return found


@pytest.mark.parametrize("dtypes", VARIANTS)
def test_lowered_conv_calls_vrmpy_in_reduction_loops(dtypes):
    sched, args, _, _, _ = _conv((1, 64, 8, 8, 64, 3, 1, 1, 1), dtypes, "llvm")
    func = tvm.lower(sched, args)["main"]
    intrinsic = HEXAGON_HVX.variant(*dtypes).intrinsic
    assert intrinsic in func.script()
    nests = _loops_around(func.body, intrinsic)
    assert nests, "no vrmpy call found"
    # Inside the window and input-channel reduction loops, no per-lane loop left.
    assert all({"kh", "kw", "ic_f"} <= set(loops) for loops in nests)


def test_lowered_dense_calls_vrmpy():
    d, w = te.placeholder((2, 256), "uint8"), te.placeholder((4, 64, LANES, 4), "int8")
    with HEXAGON:
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, w)
        script = tvm.lower(schedule_dense_pack_dot(cfg, [out]), [d, w, out]).script()
    assert "llvm.hexagon.V6.vrmpybusv.acc.128B" in script


def test_vrmpy_signature_matches_llvm_declaration(tmp_path):
    # Build the HVX TIR as LLVM IR (x86 host: the IR is made, never run) in a subprocess: a call whose
    # types differ from LLVM's declaration would abort LLVM.
    code = """
import tvm
from tvm import te, autotvm
from tvm_tcutils.dotprod.topi.conv2d_nchwc import conv2d_nchwc_dot, schedule_conv2d_nchwc_dot
d = te.placeholder((1, 1, 4, 4, 32), "uint8"); k = te.placeholder((1, 1, 1, 1, 8, 32, 4), "int8")
with tvm.target.hexagon("v66"):
    cfg = autotvm.get_config()
    out = conv2d_nchwc_dot(cfg, d, k, 1, 0, 1, "", "")
    mod = tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), [d, k, out])
print([l for l in tvm.build(mod, target="llvm").get_source("ll").splitlines() if "declare" in l and "vrmpy" in l])
"""
    from conftest import run_python

    proc = run_python(code, fresh=False)  # forked from the fork server: an LLVM abort ends only that child
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "<32 x i32> @llvm.hexagon.V6.vrmpybusv.acc.128B(<32 x i32>, <32 x i32>, <32 x i32>)" in proc.stdout


_INSTALL_TRIED = []


def _require_emulator():
    # One install attempt per session (scripts/test.sh already tries before the run).
    if hexagon_emulation.missing_tools() and not _INSTALL_TRIED:
        _INSTALL_TRIED.append(True)
        script = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "install_hexagon_tools.sh")
        subprocess.run(["bash", script], capture_output=True, timeout=900)
    missing = hexagon_emulation.missing_tools()
    if missing:
        pytest.skip(f"Hexagon emulation tools missing: {missing} (apt-get install qemu-user clang-16 lld-16 failed)")


EMULATED_CONVS = {
    "r50_3x3_28": ((1, 128, 28, 28, 128, 3, 1, 1, 1), ("uint8", "int8")),
    "r50_1x1_s2": ((1, 256, 28, 28, 128, 1, 2, 0, 1), ("uint8", "int8")),
    "stem_7x7_c3_s2": ((1, 3, 32, 32, 64, 7, 2, 3, 1), ("uint8", "int8")),
    "c17_dil2_i8i8": ((1, 17, 11, 9, 17, 3, 1, 2, 2), ("int8", "int8")),
    "u8u8": ((1, 32, 8, 8, 32, 3, 1, 1, 1), ("uint8", "uint8")),
    "i8u8_swapped": ((1, 32, 8, 8, 40, 3, 2, 1, 1), ("int8", "uint8")),
}


@pytest.mark.parametrize("name", sorted(EMULATED_CONVS))
def test_conv2d_runs_bit_exact_under_qemu_hexagon(name):
    _require_emulator()
    shape, dtypes = EMULATED_CONVS[name]
    sched, args, inputs, ref, out_c = _conv(shape, dtypes, "extern")
    out = hexagon_emulation.run(sched, args, inputs)
    np.testing.assert_array_equal(packing.unpack_nchwc(out, out_c), ref)


@pytest.mark.parametrize("m,k,n", [(1, 2048, 1000), (3, 36, 40)])
def test_dense_runs_bit_exact_under_qemu_hexagon(m, k, n):
    _require_emulator()
    data, weight = _rand((m, k), "uint8"), _rand((n, k), "int8")
    data_p, weight_p = packing.pad_dense_data(data), packing.pack_dense_weight(weight, LANES)
    d, w = te.placeholder(data_p.shape, "uint8"), te.placeholder(weight_p.shape, "int8")
    with HEXAGON:
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, w)
        sched = schedule_dense_pack_dot(cfg, [out], mode="extern")
    res = hexagon_emulation.run(sched, [d, w, out], [data_p, weight_p])
    np.testing.assert_array_equal(res[:, :n], data.astype("int64") @ weight.astype("int64").T)


def test_emulator_rejects_mismatched_inputs():
    _require_emulator()
    sched, args, inputs, _, _ = _conv((1, 4, 4, 4, 32, 1, 1, 0, 1), ("uint8", "int8"), "extern")
    with pytest.raises(ValueError, match="shape/dtype"):
        hexagon_emulation.run(sched, args, [inputs[0].astype("int8"), inputs[1]])
