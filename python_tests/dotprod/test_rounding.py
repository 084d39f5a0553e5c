"""Roundings back to float as llvm.nearbyint in the dot-product kernels' epilogues (dotprod.rounding)."""
from __future__ import annotations


import numpy as np
import pytest

import tvm
from tvm import te, tir

import tvm_tcutils
from conftest import ROUNDING_SHIFT, codegen_and_hook_builds, dot_target, requantized_conv, tvm_codegen
from tvm_tcutils.dotprod import rounding
from tvm_tcutils.dotprod.topi.conv2d_nchwc import schedule_conv2d_nchwc_dot

RNG = np.random.default_rng(11)
LANES = 16

#: Values around every kind of case the bit form handles: ties either way, both signs, the ends of
#: its range (|x| < 2**22 - 128), and plain random floats.
VALUES = np.concatenate([
    np.arange(-8.5, 8.5, 0.25), [0.0, -0.0, 0.49999997, -0.49999997, 254.5, 255.5, -128.5, -127.5],
    [2**22 - 129.5, -(2**22 - 129.5), 2**21 + 0.5, -(2**21 + 0.5)],
    RNG.uniform(-3e5, 3e5, 300), RNG.normal(0, 40, 300)]).astype("float32")
VALUES = np.resize(VALUES, (VALUES.size + LANES - 1) // LANES * LANES)


def _bits(value: float) -> int:
    return int(np.array(value, "float32").view("int32"))


def _kernel(shift: float, offset: int, vectorized: bool):
    """``float32(reinterpret_int32(x + shift) + (offset - bits(shift)))``, i.e. ``rint(x) + offset``."""
    x = te.placeholder(VALUES.shape, "float32", "x")
    constant = tir.const(offset - _bits(shift), "int32")
    y = te.compute(x.shape, lambda i: (tir.reinterpret("int32", x[i] + tir.const(shift, "float32"))
                                       + constant).astype("float32"), name="y")
    schedule = te.create_schedule(y.op)
    if vectorized:
        _, inner = schedule[y].split(y.op.axis[0], LANES)
        schedule[y].vectorize(inner)
    return tvm.lower(schedule, [x, y]), x, y


def _run(mod) -> np.ndarray:
    with tvm_codegen():  # TVM's own generator: only the rewrite under test differs
        func = tvm.build(mod, target=tvm_tcutils.host_target())
    out = tvm.nd.empty(VALUES.shape, "float32")
    func(tvm.nd.array(VALUES), out)
    return out.numpy()


@pytest.mark.parametrize("shift", rounding.SHIFTS)
@pytest.mark.parametrize("offset", [0, 3, -128, 200])
@pytest.mark.parametrize("vectorized", [True, False])
def test_bit_rounding_to_float_becomes_nearbyint_with_the_same_values(shift, offset, vectorized):
    mod, _, _ = _kernel(shift, offset, vectorized)
    func, count = rounding.round_to_float(mod["main"])
    assert count == 1
    assert "tir.reinterpret" not in str(func.body) and "nearbyint" in func.script()
    before, after = _run(mod), _run(tvm.IRModule({"main": func}))
    np.testing.assert_array_equal(after, before)
    np.testing.assert_array_equal(after, np.rint(VALUES) + np.float32(offset))  # numpy: half to even


def test_other_forms_are_left_alone():
    x = te.placeholder((LANES,), "float32", "x")
    forms = {  # a shift the bit form does not use; the bits cast to an integer type; float bits of x itself
        "shift": lambda i: (tir.reinterpret("int32", x[i] + tir.const(3.0, "float32"))
                            - tir.const(_bits(3.0), "int32")).astype("float32"),
        "int": lambda i: (tir.reinterpret("int32", x[i] + tir.const(ROUNDING_SHIFT, "float32"))
                          - tir.const(_bits(ROUNDING_SHIFT), "int32")).astype("int8"),
        "no add": lambda i: tir.reinterpret("int32", x[i]).astype("float32"),
    }
    for name, body in forms.items():
        y = te.compute(x.shape, body, name="y")
        func = tvm.lower(te.create_schedule(y.op), [x, y])["main"]
        assert rounding.round_to_float(func) == (func, 0), name


def _residual_conv(target: str):
    with tvm.target.Target(target):
        cfg, out, args = requantized_conv((1, 4, 4, 8, 16), (4, 4, 1, 1, 4, 16, 4), 0, residual=True,
                                          rounded_first=True)
        return out, args, schedule_conv2d_nchwc_dot(cfg, [out])


def test_only_kernels_of_measured_isas_change():
    for target, changed in (("llvm -mcpu=znver4", 1), ("llvm -mcpu=core-avx2", 0)):
        out, args, schedule = _residual_conv(target)
        mod = tvm.lower(schedule, args)
        assert rounding.round_to_float(mod["main"])[1] == 1  # the form is there on both
        assert (not rounding.rounding_module(mod).same_as(mod)) == bool(changed), target


def test_residual_conv_bit_identical_through_the_build_hook():
    """Through the build hook (prefetch, rounding, pipelining, TVM's code generator): the same output as
    TVM's own generator, and the machine code rounds with ``vrndscaleps``."""
    target = dot_target("vnni")
    _, args, schedule = _residual_conv(target)
    _, asm = codegen_and_hook_builds(schedule, args, target, RNG)
    assert "vrndscaleps" not in asm[0] and "vrndscaleps" in asm[1]
