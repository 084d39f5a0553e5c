"""Dot-product ISA descriptions: target selection, variants, and LLVM intrinsic signatures."""
from __future__ import annotations

import pytest

import tvm

from conftest import run_python
from tvm_tcutils import _tvm
from tvm_tcutils.dotprod.isa import HEXAGON_HVX, ISAS, X86_AVX2, X86_VNNI, by_name, for_target, x86_vnni
from tvm_tcutils.dotprod.topi.intrinsics import dot_product_intrin


@pytest.mark.parametrize(
    "target,expected",
    [
        ("llvm -mcpu=znver4", "x86_vnni"),
        ("llvm -mcpu=cascadelake", "x86_vnni"),
        ("llvm -mattr=+avx512vnni", "x86_vnni"),
        ("llvm -mcpu=skylake-avx512", "x86_avx2"),
        ("llvm -mcpu=core-avx2", "x86_avx2"),
        ("llvm -mcpu=nehalem", "x86_sse"),
        ("llvm -mcpu=sandybridge", "x86_sse"),
        ("llvm", None),
        ("llvm -mtriple=aarch64-linux-gnu", None),
    ],
)
def test_for_target(target, expected):
    isa = for_target(target)
    assert (isa.name if isa else None) == expected


def test_hexagon_target_and_lanes():
    assert for_target(tvm.target.hexagon("v66")) is HEXAGON_HVX
    assert [(i.name, i.lanes, i.vector_bytes) for i in ISAS] == [
        ("hexagon_hvx", 32, 128), ("x86_vnni", 16, 64), ("x86_avx2", 8, 32), ("x86_sse", 4, 16)
    ]


def test_variants_and_operand_order():
    assert X86_VNNI.variant("int8", "int8") is None  # legalize shifts these to u8 x i8
    assert X86_VNNI.variant("int8", "uint8").swap and not X86_VNNI.variant("uint8", "int8").swap
    assert len(X86_AVX2.variants) == 4 and len(HEXAGON_HVX.variants) == 4
    assert HEXAGON_HVX.variant("int8", "int8").intrinsic == "llvm.hexagon.V6.vrmpybv.acc.128B"


def test_vnni_operand_types_follow_llvm_version():
    assert x86_vnni.operand_types(21) == ("int32x16", "int32x16", "int32x16")
    assert x86_vnni.operand_types(22) == ("int32x16", "int8x64", "int8x64")


def test_errors_name_the_choices():
    with pytest.raises(ValueError, match="x86_vnni"):
        by_name("sse")
    with pytest.raises(ValueError, match="native pairs"):
        dot_product_intrin(X86_VNNI, "int8", "int8")
    with pytest.raises(ValueError, match="mode must be one of"):
        dot_product_intrin(X86_VNNI, "uint8", "int8", mode="asm")
    with pytest.raises(ValueError, match="no C helper"):
        dot_product_intrin(X86_VNNI, "uint8", "int8", mode="extern")


_DECLARES = """
import tvm
from tvm import te, autotvm
from tvm_tcutils.dotprod.isa import for_target
from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot, schedule_dense_pack_dot
for target in ("llvm -mcpu=znver4", "llvm -mcpu=core-avx2"):
    lanes = for_target(target).lanes
    d = te.placeholder((1, 64), "uint8"); w = te.placeholder((2, 16, lanes, 4), "int8")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, w)
        lib = tvm.build(schedule_dense_pack_dot(cfg, [out]), [d, w, out], target=target)
    print([l.split(" #")[0] for l in lib.get_source("ll").splitlines() if l.startswith("declare") and "x86" in l])
"""


def test_emitted_calls_match_llvm_declarations():
    # In a subprocess: a call with the wrong operand types aborts LLVM. Forked from the tests' fork server
    # (TVM and the package imported once): an abort still ends only that child.
    proc = run_python(_DECLARES, fresh=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    acc, a, b = (f"<{tvm.DataType(t).lanes} x i{tvm.DataType(t).bits}>"
                 for t in x86_vnni.operand_types(_tvm.llvm_version()))
    assert f"declare {acc} @llvm.x86.avx512.vpdpbusd.512({acc}, {a}, {b})" in proc.stdout
    assert "declare <8 x i32> @llvm.x86.avx2.pmadd.wd(<16 x i16>, <16 x i16>)" in proc.stdout


def test_avx2_products_go_straight_into_the_accumulator():
    # The regrouping shuffles belong to the operands (shared across a register tile), not to
    # each step's products: a step is acc + vpmaddwd + vpmaddwd.
    from tvm import tir

    acc, data, kernel = tir.Var("acc", "int32x8"), tir.Var("d", "uint8x32"), tir.Var("k", "int8x32")
    step = X86_AVX2.emit(X86_AVX2.variant("uint8", "int8"), acc, data, kernel)
    assert isinstance(step, tir.Add) and isinstance(step.a, tir.Add) and step.a.a.same_as(acc)
    for product in (step.a.b, step.b):
        assert isinstance(product, tir.Call) and product.op.name == "tir.call_llvm_pure_intrin"
        assert product.dtype == "int32x8"


@pytest.mark.parametrize("data_dtype,kernel_dtype", [("uint8", "int8"), ("int8", "int8"), ("int8", "uint8")])
def test_avx2_widening_stays_inside_128_bit_halves(data_dtype, kernel_dtype):
    # vpshufb only moves bytes within a 128-bit half; a shuffle that crosses halves costs LLVM a
    # vpermq / vpmovsxbw round trip per operand (half the speed of the step on znver3).
    from tvm import tir

    acc = tir.Var("acc", "int32x8")
    data, kernel = tir.Var("d", f"{data_dtype}x32"), tir.Var("k", f"{kernel_dtype}x32")
    step = X86_AVX2.emit(X86_AVX2.variant(data_dtype, kernel_dtype), acc, data, kernel)
    shuffles = []
    tir.stmt_functor.post_order_visit(step, lambda n: shuffles.append(n) if isinstance(n, tir.Shuffle) else None)
    assert len(shuffles) == 4  # two product pairs x (data, kernel)
    for shuffle in shuffles:
        sources = [int(i) for i in shuffle.indices]
        assert len(sources) == 32
        for position, source in enumerate(sources):
            assert source >= 32 or source // 16 == position // 16, (position, source)


def test_reduce_range_isa_is_chosen_per_layer_not_per_target():
    from tvm_tcutils.dotprod.isa import RANGE_ISAS, X86_AVX2_U8S7

    assert X86_AVX2_U8S7 in RANGE_ISAS and X86_AVX2_U8S7 not in ISAS  # never a target's ISA
    assert by_name("x86_avx2_u8s7") is X86_AVX2_U8S7
    assert [(v.data_dtype, v.kernel_dtype) for v in X86_AVX2_U8S7.variants] == [("uint8", "int8")]


def test_reduce_range_step_is_pmaddubsw_widened_by_pmaddwd_with_ones():
    import numpy as np
    from tvm import autotvm, te, tir

    from tvm_tcutils.dotprod.isa import X86_AVX2_U8S7
    from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot, schedule_dense_pack_dot
    from tvm_tcutils.dotprod.topi.packing import pack_dense_weight

    acc, data, kernel = tir.Var("acc", "int32x8"), tir.Var("d", "uint8x32"), tir.Var("k", "int8x32")
    step = X86_AVX2_U8S7.emit(X86_AVX2_U8S7.variant("uint8", "int8"), acc, data, kernel)
    assert isinstance(step, tir.Add) and step.a.same_as(acc)
    lookup = tvm.target.codegen.llvm_lookup_intrinsic_id
    widen, pairs = step.b, step.b.args[2]
    assert int(widen.args[0]) == lookup("llvm.x86.avx2.pmadd.wd") and widen.args[3].value.value == 1
    assert int(pairs.args[0]) == lookup("llvm.x86.avx2.pmadd.ub.sw") and pairs.dtype == "int16x16"
    # The call matches LLVM's declaration (a wrong signature aborts LLVM).
    w = pack_dense_weight(np.zeros((8, 64), "int8"), 8, marked=True)
    d, wp = te.placeholder((1, 64), "uint8"), te.placeholder(w.shape, "int8")
    with tvm.target.Target("llvm -mcpu=core-avx2"):
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, wp)
        lib = tvm.build(schedule_dense_pack_dot(cfg, [out]), [d, wp, out], target="llvm -mcpu=core-avx2")
    assert "declare <16 x i16> @llvm.x86.avx2.pmadd.ub.sw(<32 x i8>, <32 x i8>)" in lib.get_source("ll")
