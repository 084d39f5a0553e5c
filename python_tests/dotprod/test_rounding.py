"""Roundings back to float as llvm.nearbyint in the dot-product kernels' epilogues (dotprod.rounding)."""
from __future__ import annotations


import numpy as np
import pytest

import tvm
from tvm import te, tir

import tvm_tcutils
from conftest import (ROUNDING_SHIFT, amx_runs_here, codegen_and_hook_builds, dot_target, host_cpu_has,
                      requantized_conv, tvm_codegen)
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


def _narrowing_kernel(dtype: str, offset: int, vectorized: bool):
    """``dtype(reinterpret_int32(x + S1) + (offset - bits(S1)))`` (S1: the 128-shifted constant)."""
    x = te.placeholder(VALUES.shape, "float32", "x")
    shift = rounding.SHIFTS[1]
    y = te.compute(x.shape, lambda i: (tir.reinterpret("int32", x[i] + tir.const(shift, "float32"))
                                       + tir.const(offset - _bits(shift), "int32")).astype(dtype), name="y")
    schedule = te.create_schedule(y.op)
    if vectorized:
        _, inner = schedule[y].split(y.op.axis[0], LANES)
        schedule[y].vectorize(inner)
    return tvm.lower(schedule, [x, y])


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
@pytest.mark.parametrize("offset", [0, 256, -128, 3])
@pytest.mark.parametrize("vectorized", [True, False])
def test_direct_narrowing_keeps_every_8bit_value(dtype, offset, vectorized):
    mod = _narrowing_kernel(dtype, offset, vectorized)
    func, count = rounding.narrow_directly(mod["main"])
    assert count == 1 and str(rounding.SHIFTS[1]) not in func.script()

    def run(module):
        with tvm_codegen():
            built = tvm.build(module, target=tvm_tcutils.host_target())
        out = tvm.nd.empty(VALUES.shape, dtype)
        built(tvm.nd.array(VALUES), out)
        return out.numpy()

    after = run(tvm.IRModule({"main": func}))
    np.testing.assert_array_equal(after, run(mod))
    expected = ((np.rint(VALUES).astype(np.int64) + offset) & 0xFF).astype(np.uint8).view(dtype)
    np.testing.assert_array_equal(after, expected)


def test_narrowing_leaves_float_casts_and_the_first_shift_alone():
    x = te.placeholder((LANES,), "float32", "x")
    for name, (shift, dtype) in {"float": (rounding.SHIFTS[1], "float32"), "first": (rounding.SHIFTS[0], "uint8"),
                                 "int16": (rounding.SHIFTS[1], "int16")}.items():
        y = te.compute(x.shape, lambda i: (tir.reinterpret("int32", x[i] + tir.const(shift, "float32"))
                                           - tir.const(_bits(shift), "int32")).astype(dtype), name="y")
        func = tvm.lower(te.create_schedule(y.op), [x, y])["main"]
        assert rounding.narrow_directly(func) == (func, 0), name


AMX_TARGET = "llvm -mcpu=sapphirerapids"


def _tile_conv_with_both_roundings():
    """An AMX conv whose epilogue rounds back to float (a QDQ residual add) and then to 8 bits with the
    128-shifted constant, as the QDQ legalization writes a zero point of 0."""
    from tvm import autotvm
    from tvm_tcutils.dotprod.topi.conv2d_amx import conv2d_nchwc_amx, schedule_conv2d_nchwc_amx

    data = te.placeholder((1, 1, 4, 32, 64), "uint8", "data")
    kernel = te.placeholder((1, 1, 1, 1, 16, 64, 4), "int8", "kernel")
    other = te.placeholder((1, 1, 4, 32, 64), "uint8", "other")
    shifts = rounding.SHIFTS

    def bit_round(value, shift, offset):
        return tir.reinterpret("int32", value + tir.const(shift, "float32")) + tir.const(offset - _bits(shift), "int32")

    with tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        conv = conv2d_nchwc_amx(cfg, data, kernel, 1, 0, 1, "NCHW64c", "NCHW64c")

        def epilogue(*i):
            value = te.max(te.min(conv(*i).astype("float32") * tir.const(3e-4, "float32"), 127.0), -128.0)
            value = bit_round(value, shifts[0], 0).astype("float32") * 0.5 + other(*i).astype("float32") * 0.25
            return bit_round(te.max(te.min(value, 255.0), 0.0), shifts[1], 0).astype("uint8")

        out = te.compute(conv.shape, epilogue, name="requantized", tag="elemwise")
        schedule = schedule_conv2d_nchwc_amx(cfg, [out])
    return tvm.lower(schedule, [data, kernel, other, out])


def test_tile_kernels_round_with_nearbyint_and_narrow_directly_on_tile_targets():
    mod = _tile_conv_with_both_roundings()
    assert rounding.pipeline.product_isas(mod["main"].body) == frozenset({"x86_amx"})
    func, rounded = rounding.round_to_float(mod["main"])
    assert rounded == 1 and rounding.narrow_directly(func)[1] == 1
    on_tiles = rounding.rounding_module(mod, AMX_TARGET)["main"].script()
    assert "nearbyint" in on_tiles and str(rounding.SHIFTS[1]) not in on_tiles
    # Without a tile engine or AVX-512BW in the target only the rounding back to float changes; AVX-512BW
    # alone (Zen 4) narrows as the tile targets do.
    elsewhere = rounding.rounding_module(mod, "llvm -mcpu=znver4 -mattr=-avx512bw")["main"].script()
    assert "nearbyint" in elsewhere and str(rounding.SHIFTS[1]) in elsewhere
    assert rounding.rounding_module(mod, "llvm -mcpu=znver4")["main"].script() == on_tiles
    asm = tvm.build(mod, target=AMX_TARGET).get_source("asm")
    assert "vrndscaleps" in asm and "tdpbusd" in asm
    # The 8-bit results of the tile targets' epilogues narrow by packs; elsewhere (or without AVX-512BW,
    # which every CPU with tiles has) they do not.
    assert "packuswb" in on_tiles and "packuswb" not in elsewhere
    no_bw = rounding.rounding_module(mod, AMX_TARGET + " -mattr=-avx512bw")["main"].script()
    assert "packuswb" not in no_bw and str(rounding.SHIFTS[1]) not in no_bw


def test_tile_conv_through_the_build_hook_narrows_by_packs_bit_identically():
    """The tile conv above built with the package's hook (every rewrite) and with TVM's generator: the
    same bytes where AMX runs, and the machine code narrows with the packs, not ``vpmovdb``."""
    mod = _tile_conv_with_both_roundings()
    hooked = tvm.build(mod, target=AMX_TARGET)
    asm = hooked.get_source("asm")
    assert "vpackuswb" in asm and "vpackssdw" in asm and "vcvtps2dq" in asm and "vpmovdb" not in asm
    # The residual sum is bounded (two 8-bit values scaled), so the packs saturate it alone: each vector
    # keeps the intermediate clamp's vminps / vmaxps pair and loses the final clamp's vminps.
    assert asm.count("vminps") == asm.count("vmaxps") == asm.count("vcvtps2dq") > 0
    amx_runs_here()
    with tvm_codegen():
        plain = tvm.build(mod, target=AMX_TARGET)
    args = [RNG.integers(0, 256, (1, 1, 4, 32, 64)).astype("uint8"),
            RNG.integers(-128, 128, (1, 1, 1, 1, 16, 64, 4)).astype("int8"),
            RNG.integers(0, 256, (1, 1, 4, 32, 64)).astype("uint8")]
    outs = []
    for built in (plain, hooked):
        out = tvm.nd.empty((1, 1, 4, 32, 64), "uint8")
        built(*[tvm.nd.array(a) for a in args], out)
        outs.append(out.numpy())
    np.testing.assert_array_equal(outs[1], outs[0])
    assert len(np.unique(outs[1])) > 16  # not all saturated


def _clamped_narrowing(vectors: int, dtype: str, low: float, high: float, offset: int, gaps: bool = False):
    """Rows of ``vectors`` 16-lane stores of ``dtype(round(clamp(x, low, high)) + offset)`` (the first
    shift's bit form, as :func:`rounding.narrow_directly` leaves it); ``gaps``: the innermost loop runs
    over the rows, so its stores are a row apart."""
    shape = (3, vectors * LANES)
    x = te.placeholder(shape, "float32", "x")
    shift = rounding.SHIFTS[0]

    def byte(r, i):
        clamped = te.max(te.min(x[r, i], tir.const(high, "float32")), tir.const(low, "float32"))
        bits = tir.reinterpret("int32", clamped + tir.const(shift, "float32"))
        return (bits + tir.const(offset - _bits(shift), "int32")).astype(dtype)

    y = te.compute(shape, byte, name="y")
    schedule = te.create_schedule(y.op)
    outer, inner = schedule[y].split(y.op.axis[1], LANES)
    if gaps:
        schedule[y].reorder(outer, y.op.axis[0], inner)
    schedule[y].vectorize(inner)
    return tvm.lower(schedule, [x, y]), shape


#: Loop extents (vectors per row) across the groups of 4 and 2 and an odd last vector.
PACKED_EXTENTS = [2, 3, 4, 7, 8]


@pytest.mark.parametrize("vectors", PACKED_EXTENTS)
@pytest.mark.parametrize("dtype, low, high, offset", [("uint8", 0.0, 255.0, 0), ("int8", -128.0, 127.0, 0),
                                                       ("uint8", -128.0, 127.0, 128), ("int8", -3.0, 252.0, -125)])
def test_packed_narrowing_keeps_every_8bit_value(vectors, dtype, low, high, offset):
    mod, shape = _clamped_narrowing(vectors, dtype, low, high, offset)
    func, count = rounding.narrow_by_packs(mod["main"])
    assert count == 1
    script = func.script()
    # One byte pack per group of 4 or 2 vectors; a last odd vector keeps its cast.
    assert script.count("packuswb" if dtype == "uint8" else "packsswb") == vectors // 4 + vectors % 4 // 2
    assert script.count(f"T.Cast(\"{dtype}x16\"") == vectors % 2
    if not host_cpu_has("avx512bw"):
        pytest.skip("this CPU has no avx512bw: the packed code cannot run here")
    values = np.resize(np.concatenate([VALUES, [3e10, -3e10, np.float32(2**31), -np.float32(2**31)]]),
                       shape).astype("float32")

    def run(module):
        with tvm_codegen():
            built = tvm.build(module, target=tvm_tcutils.host_target())
        out = tvm.nd.empty(shape, dtype)
        built(tvm.nd.array(values), out)
        return out.numpy()

    after = run(tvm.IRModule({"main": func}))
    np.testing.assert_array_equal(after, run(mod))
    np.testing.assert_array_equal(after, (np.clip(np.rint(values), low, high) + offset).astype(dtype))


def _bounded_narrowing(vectors: int, dtype: str, scale: float, bias: float):
    """Rows of ``dtype(round(clamp(a * scale + b * 0.75 + bias)))`` of two 8-bit inputs, clamped to the
    type's range (the first shift's bit form): a QDQ residual add's bounded sum."""
    shape = (3, vectors * LANES)
    a, b = te.placeholder(shape, "uint8", "a"), te.placeholder(shape, "uint8", "b")
    low, high = (0.0, 255.0) if dtype == "uint8" else (-128.0, 127.0)
    shift = rounding.SHIFTS[0]

    def byte(r, i):
        y = a[r, i].astype("float32") * tir.const(scale, "float32") + b[r, i].astype("float32") * 0.75 + bias
        clamped = te.max(te.min(y, tir.const(high, "float32")), tir.const(low, "float32"))
        return (tir.reinterpret("int32", clamped + tir.const(shift, "float32")) - _bits(shift)).astype(dtype)

    y = te.compute(shape, byte, name="y")
    schedule = te.create_schedule(y.op)
    schedule[y].vectorize(schedule[y].split(y.op.axis[1], LANES)[1])
    return tvm.lower(schedule, [a, b, y]), shape


@pytest.mark.parametrize("vectors", [2, 4, 7])
@pytest.mark.parametrize("dtype, scale, bias", [("uint8", 1.5, -100.0), ("int8", -2.25, 130.5), ("uint8", 7e6, 0.0)])
def test_bounded_sums_narrow_by_packs_without_the_clamp(vectors, dtype, scale, bias):
    """The packs alone saturate a sum bounded well inside int32 (its ``min`` left out); a sum that may pass
    :data:`rounding.UNCLAMPED_LIMIT` keeps it. Every 8-bit value as numpy's clamp and rounding give it."""
    mod, shape = _bounded_narrowing(vectors, dtype, scale, bias)
    func, count = rounding.narrow_by_packs(mod["main"])
    assert count == 1
    packed = [line for line in func.script().splitlines() if "packssdw" in line]
    bounded = 255 * abs(scale) + 255 * 0.75 + abs(bias) < rounding.UNCLAMPED_LIMIT
    assert packed and all(("T.min(" in line) != bounded for line in packed), packed
    if not host_cpu_has("avx512bw"):
        pytest.skip("this CPU has no avx512bw: the packed code cannot run here")
    rng = np.random.default_rng(vectors)
    inputs = [rng.integers(0, 256, shape).astype("uint8") for _ in range(2)]
    for x in inputs:  # both ends of the sum
        x[0, :2] = 255, 0

    def run(module):
        with tvm_codegen():
            built = tvm.build(module, target=tvm_tcutils.host_target())
        out = tvm.nd.empty(shape, dtype)
        built(*[tvm.nd.array(x) for x in inputs], out)
        return out.numpy()

    after = run(tvm.IRModule({"main": func}))
    np.testing.assert_array_equal(after, run(mod))
    y = (inputs[0].astype("float32") * np.float32(scale) + inputs[1].astype("float32") * np.float32(0.75)
         + np.float32(bias))
    info = np.iinfo(dtype)
    np.testing.assert_array_equal(after, np.clip(np.rint(y), info.min, info.max).astype(dtype))
    assert {info.min, info.max} <= set(np.unique(after).tolist())  # both ends saturated


def test_float_bounds_of_the_epilogues_forms():
    x, r = tir.Var("x", "float32"), tir.Var("r", "uint8")
    clamped = te.max(te.min(x * 0.01, tir.const(125.0)), tir.const(-130.0))
    nearbyint = tvm.target.codegen.llvm_lookup_intrinsic_id("llvm.nearbyint")
    fmuladd = tvm.target.codegen.llvm_lookup_intrinsic_id("llvm.fmuladd")
    rounded = tir.call_llvm_pure_intrin("float32", nearbyint, tir.const(1, "uint32"), clamped * 0.4)
    fused = tir.call_llvm_pure_intrin("float32", fmuladd, tir.const(3, "uint32"), r.astype("float32"),
                                      tir.const(2.0, "float32"), rounded)
    assert rounding.float_bounds(rounded) == (-52, 50)
    assert rounding.float_bounds(fused) == (-52.0, 560.0)
    assert rounding.float_bounds(tir.Select(x > 0, fused, tir.const(-1e3, "float32"))) == (-1e3, 560.0)
    # Unbounded: float loads, int32 accumulators past the limit once scaled, inf - inf.
    assert rounding.float_bounds(x + 1.0) == (-np.inf, np.inf)
    acc = tir.Var("acc", "int32").astype("float32") * 2.0
    assert max(map(abs, rounding.float_bounds(acc))) > rounding.UNCLAMPED_LIMIT
    assert rounding.float_bounds(x - x) == (-np.inf, np.inf)
    assert rounding.float_bounds(x * 0.0) == (0.0, 0.0)


def test_packed_narrowing_leaves_other_stores_alone():
    cases = {
        "clamp narrower than the type": _clamped_narrowing(2, "uint8", 0.0, 200.0, 0)[0],
        "clamp shifted off the type's range": _clamped_narrowing(2, "uint8", 0.0, 255.0, 1)[0],
        "stores a row apart": _clamped_narrowing(2, "uint8", 0.0, 255.0, 0, gaps=True)[0],
        "too many vectors": _clamped_narrowing(rounding.MAX_PACKED_VECTORS + 1, "uint8", 0.0, 255.0, 0)[0],
        "the second shift": _narrowing_kernel("uint8", 0, True),
    }
    for name, mod in cases.items():
        func = mod["main"]
        assert rounding.narrow_by_packs(func) == (func, 0), name
