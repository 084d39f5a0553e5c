"""The dot-product conv2d / dense computes+schedules, built and run, bit-exact vs numpy."""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import autotvm, te
from tvm.topi.testing import conv2d_nchw_python, dilate_python

from conftest import DOT_TARGETS, dot_target, host_cpu_has
from tvm_tcutils.dotprod.isa import for_target
from tvm_tcutils.dotprod.topi import packing
from tvm_tcutils.dotprod.topi.conv2d_nchwc import (
    ROW_QUAD, conv2d_nchwc_dot, conv2d_rows_dot, schedule_conv2d_nchwc_dot,
)
from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot, schedule_dense_pack_dot

RNG = np.random.default_rng(7)


def _full_range(shape, dtype):
    info = np.iinfo(dtype)
    out = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    out.flat[:4] = info.max  # make sure the extreme products (where int16 saturates) occur
    return out


def conv_reference(data, kernel, stride, pad, dil):
    """int64 NCHW conv2d in numpy: one channel contraction per kernel tap (fast for deep layers)."""
    pad = (pad,) * 4 if isinstance(pad, int) else tuple(pad) * (2 if len(pad) == 2 else 1)
    top, left, bottom, right = pad
    padded = np.pad(data.astype("int64"), ((0, 0), (0, 0), (top, bottom), (left, right)))
    out_c, _, k_h, k_w = kernel.shape
    out_h = (padded.shape[2] - (k_h - 1) * dil - 1) // stride + 1
    out_w = (padded.shape[3] - (k_w - 1) * dil - 1) // stride + 1
    out = np.zeros((data.shape[0], out_c, out_h, out_w), "int64")
    for y in range(k_h):
        for x in range(k_w):
            patch = padded[:, :, y * dil: y * dil + stride * (out_h - 1) + 1: stride,
                           x * dil: x * dil + stride * (out_w - 1) + 1: stride]
            out += np.einsum("nchw,oc->nohw", patch, kernel[:, :, y, x].astype("int64"))
    return out


def test_conv_reference_matches_tvm_testing():
    data, kernel = _full_range((1, 5, 9, 8), "uint8"), _full_range((3, 5, 3, 3), "int8")
    ref = conv2d_nchw_python(data.astype("int64"), dilate_python(kernel.astype("int64"), (1, 1, 2, 2)), 2, 2)
    np.testing.assert_array_equal(conv_reference(data, kernel, 2, 2, 2), ref)


def _run_conv(target, shape, dtypes=("uint8", "int8"), fused=None, widened=True):
    """Pack, build, run; ``widened``: the kernel in the ISA's conv2d dtype (int16 pairs on AVX2)."""
    (n, c, h, w, o, k, stride, pad, dil) = shape
    isa = for_target(target)
    ic_bn, oc_bn = packing.channel_block(c, isa.lanes), isa.lanes
    data, kernel = _full_range((n, c, h, w), dtypes[0]), _full_range((o, c, k, k), dtypes[1])
    data_p = packing.pack_data_nchwc(data, ic_bn)
    kernel_p = packing.pack_kernel_for(isa, kernel, ic_bn) if widened else packing.pack_kernel_oihw(kernel, ic_bn, oc_bn)
    d = te.placeholder(data_p.shape, dtypes[0], name="d")
    kk = te.placeholder(kernel_p.shape, kernel_p.dtype.name, name="k")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, kk, stride, pad, dil, f"NCHW{ic_bn}c", f"NCHW{oc_bn}c")
        final = out if fused is None else te.compute(out.shape, lambda *i: fused(out(*i)), tag="elemwise")
        sched = schedule_conv2d_nchwc_dot(cfg, [final])
        func = tvm.build(sched, [d, kk, final], target=target)
    dev = tvm.cpu()
    result = tvm.nd.empty([int(x) for x in final.shape], final.dtype, dev)
    func(tvm.nd.array(data_p, dev), tvm.nd.array(kernel_p, dev), result)
    ref = conv_reference(data, kernel, stride, pad, dil)
    return packing.unpack_nchwc(result.numpy(), o), ref, func


# (N, C, H, W, O, K, stride, pad, dilation): ResNet-50 layers and odd ones.
CONV_SHAPES = {
    "r50_3x3_56": (1, 64, 56, 56, 64, 3, 1, 1, 1),
    "r50_3x3_14_s2": (1, 256, 28, 28, 256, 3, 2, 1, 1),
    "r50_1x1_7": (1, 2048, 7, 7, 512, 1, 1, 0, 1),
    "r50_1x1_28_s2": (1, 256, 56, 56, 128, 1, 2, 0, 1),
    "stem_7x7_c3": (1, 3, 30, 30, 64, 7, 2, 3, 1),
    "c17_o17": (1, 17, 9, 11, 17, 3, 1, 1, 1),
    "dilation2": (1, 32, 16, 16, 48, 3, 1, 2, 2),
    "asym_pad": (1, 8, 10, 10, 16, 3, 2, (0, 1, 2, 0), 1),
    "padded_1x1_s2": (1, 8, 9, 9, 16, 1, 2, 1, 1),
}


@pytest.mark.parametrize("target_name", ["vnni", "vnni_zen5"])
@pytest.mark.parametrize("name", sorted(CONV_SHAPES))
def test_conv2d_vnni_bit_exact(name, target_name):
    out, ref, _ = _run_conv(dot_target(target_name), CONV_SHAPES[name])
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("name", ["r50_3x3_14_s2", "r50_1x1_28_s2", "stem_7x7_c3", "c17_o17", "dilation2",
                                  "asym_pad", "padded_1x1_s2"])
def test_conv2d_avx2_bit_exact(name):
    out, ref, _ = _run_conv(dot_target("avx2"), CONV_SHAPES[name])
    np.testing.assert_array_equal(out, ref)


@pytest.mark.parametrize("name", ["r50_1x1_28_s2", "c17_o17"])
def test_conv2d_avx2_takes_an_8bit_kernel_too(name):
    # The packed conv2d on AVX2 also accepts the 8-bit OIHW[x]i[y]o4i kernel (a graph packed for
    # another ISA), widening it per step; the widened int16 kernel's result is the same.
    out, ref, func = _run_conv(dot_target("avx2"), CONV_SHAPES[name], widened=False)
    np.testing.assert_array_equal(out, ref)
    assert "vpshufb" in func.get_source("asm")


@pytest.mark.parametrize("k_dtype,group,shuffles", [("int16", 2, False), ("int8", 4, True)])
def test_avx2_conv_step_reads_a_widened_kernel_as_is(k_dtype, group, shuffles):
    # With the kernel packed as int16 pairs, the step has no byte shuffles left: only broadcasts,
    # vpmaddwd and adds (the shuffles and their masks cost ~20 % on ResNet-50 layers).
    d = te.placeholder((1, 2, 8, 8, 8), "uint8", name="d")
    k = te.placeholder((2, 2, 3, 3, 8 // group, 8, group), k_dtype, name="k")
    with tvm.target.Target("llvm -mcpu=core-avx2"):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, k, 1, 1, 1, "NCHW8c", "NCHW8c")
        script = tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), [d, k, out]).script()
    assert script.count("llvm.x86.avx2.pmadd.wd") >= 2
    assert ("T.Shuffle" in script) == shuffles


@pytest.mark.parametrize("target_name", ["avx2", "sse"])
@pytest.mark.parametrize("dtypes", [("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8"), ("uint8", "int8")])
def test_conv2d_fallbacks_every_signedness(target_name, dtypes):
    out, ref, _ = _run_conv(dot_target(target_name), CONV_SHAPES["c17_o17"], dtypes)
    np.testing.assert_array_equal(out, ref)


def test_conv2d_vnni_swapped_operands():
    out, ref, _ = _run_conv(dot_target("vnni"), CONV_SHAPES["c17_o17"], ("int8", "uint8"))
    np.testing.assert_array_equal(out, ref)


def test_conv2d_fused_epilogue_vectorized():
    target = dot_target("vnni")
    requant = lambda x: te.max(te.min((x >> 9) + 3, 127), -128).astype("int8")  # noqa: E731
    out, ref, func = _run_conv(target, CONV_SHAPES["c17_o17"], fused=requant)
    np.testing.assert_array_equal(out, np.clip((ref >> 9) + 3, -128, 127).astype("int8"))
    assert "vpdpbusd" in func.get_source("asm")


def test_conv2d_epilogue_store_is_a_vector():
    d = te.placeholder((1, 1, 8, 8, 16), "uint8")
    k = te.placeholder((1, 1, 3, 3, 4, 16, 4), "int8")
    with tvm.target.Target("llvm -mcpu=znver4"):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, k, 1, 1, 1, "NCHW16c", "NCHW16c")
        final = te.compute(out.shape, lambda *i: (out(*i) >> 3).astype("int8"), tag="elemwise")
        script = tvm.lower(schedule_conv2d_nchwc_dot(cfg, [final]), [d, k, final]).script()
    assert 'T.Cast("int8x16", T.shift_right(' in script  # 16 lanes per store, straight from the accumulator


def test_conv2d_emits_vnni_instruction():
    _, _, func = _run_conv(dot_target("vnni"), CONV_SHAPES["dilation2"])
    asm = func.get_source("asm")
    assert "vpdpbusd" in asm and "zmm" in asm


def test_avx2_fallback_does_not_saturate():
    # All-255 data x all-127 kernel: every vpmaddubsw pair would clip at 32767.
    target = dot_target("avx2")
    data = np.full((1, 8, 4, 4), 255, "uint8")
    kernel = np.full((8, 8, 1, 1), 127, "int8")
    ic_bn = 8
    d = te.placeholder((1, 1, 4, 4, 8), "uint8")
    k = te.placeholder((1, 1, 1, 1, 4, 8, 2), "int16")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, d, k, 1, 0, 1, "NCHW8c", "NCHW8c")
        func = tvm.build(schedule_conv2d_nchwc_dot(cfg, [out]), [d, k, out], target=target)
    res = tvm.nd.empty((1, 1, 4, 4, 8), "int32")
    kernel_p = packing.pack_kernel_oihw(kernel, 8, 8, group=2, dtype="int16")
    func(tvm.nd.array(packing.pack_data_nchwc(data, ic_bn)), tvm.nd.array(kernel_p), res)
    assert (res.numpy() == 255 * 127 * 8).all()
    assert "vpmaddubsw" not in func.get_source("asm")


@pytest.mark.parametrize("pad", [0, 1])
def test_avx2_conv_widens_its_data_once(pad):
    # On AVX2 the data is widened to int16 in one pass (fused with the padding copy), so each step
    # reads its two data words with a broadcast; VNNI keeps 8-bit data and no extra pass.
    def lowered(target):
        lanes = for_target(target).lanes
        d = te.placeholder((1, 2, 8, 8, 16), "uint8", name="d")
        k = te.placeholder((16 // lanes, 2, 3, 3, 4, lanes, 4), "int8", name="k")
        with tvm.target.Target(target):
            cfg = autotvm.get_config()
            out = conv2d_nchwc_dot(cfg, d, k, 1, pad, 1, "NCHW16c", f"NCHW{lanes}c")
            return tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), [d, k, out]).script()

    avx2, vnni = lowered("llvm -mcpu=core-avx2"), lowered("llvm -mcpu=znver4")
    assert 'data_wide = T.allocate([' in avx2 and '"int16"' in avx2
    assert "data_pad" not in avx2  # the padding is computed inside the widening pass
    assert avx2.count("T.Broadcast(T.reinterpret(\"int32\"") >= 2
    assert "data_wide" not in vnni and ("data_pad" in vnni) == bool(pad)


@pytest.mark.parametrize("hw,oc", [(56, 64), (28, 128), (15, 64), (13, 32), (7, 512)])
def test_fallback_tiles_fit_the_register_budget(hw, oc):
    # VNNI keeps two output-channel blocks per tile (each broadcast word feeds two instructions);
    # AVX2's two-register operands leave room for fewer accumulators, and no tile may spill.
    for target in ("llvm -mcpu=znver4", "llvm -mcpu=core-avx2"):
        isa = for_target(target)
        lanes = isa.lanes
        d = te.placeholder((1, 4, hw, hw, 16), "uint8")
        k_dtype = isa.conv_kernel_dtype("int8")
        group = isa.kernel_group(k_dtype)
        k = te.placeholder((oc // lanes, 4, 3, 3, 16 // group, lanes, group), k_dtype)
        with tvm.target.Target(target):
            cfg = autotvm.get_config()
            conv2d_nchwc_dot(cfg, d, k, 1, 1, 1, "NCHW16c", f"NCHW{lanes}c")
        tile_oc, tile_ow, tile_oh = cfg["tile_oc"].val, cfg["tile_ow"].val, cfg["tile_oh"].val
        accumulators = tile_oc * tile_ow * tile_oh
        assert accumulators <= isa.accumulator_budget(tile_oc), (target, tile_oc, tile_ow, tile_oh)
        if isa.operand_registers == 1:  # one block where two would leave one pixel: 13 is prime
            assert tile_oc == (1 if hw == 13 else 2)
        # VNNI's fallback takes a 2x2 pixel block where the output has one (measured faster than
        # filling the budget); odd planes fill the budget (7x7, 13x13: a whole row).
        if isa.conv_tile_pixels and hw % 2 == 0:
            assert (tile_ow, tile_oh) == (2, 2)
        elif isa.conv_tile_pixels and hw in (7, 13):
            assert tile_ow == hw
        if not isa.conv_tile_pixels and hw != 13:  # AVX2: the widest row its budget holds (13: one pixel)
            assert tile_ow * tile_oh > 1


def _fallback_tile(target: str, hw: int, ic: int, kernel: int):
    d = te.placeholder((1, ic // 16, hw, hw, 16), "uint8")
    k = te.placeholder((4, ic // 16, kernel, kernel, 4, 16, 4), "int8")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        conv2d_nchwc_dot(cfg, d, k, 1, kernel // 2, 1, "NCHW16c", "NCHW16c")
    return cfg["tile_oc"].val, cfg["tile_oh"].val, cfg["tile_ow"].val


@pytest.mark.parametrize("hw,ic,kernel,zen4,zen5", [
    (56, 64, 3, (2, 2, 2), (2, 1, 7)),
    (56, 256, 1, (2, 2, 2), (2, 1, 7)),
    (14, 1024, 1, (2, 2, 2), (2, 1, 7)),
    (7, 512, 3, (2, 1, 7), (2, 1, 7)),
    (56, 64, 1, (2, 2, 2), (2, 2, 2)),   # a reduction of 64 bytes keeps the small block everywhere
    (32, 128, 3, (2, 2, 2), (2, 2, 4)),  # no 5-7-pixel block: the next that fits (16 accumulators)
    (10, 128, 3, (2, 2, 2), (2, 1, 5)),  # Zen 5 needs 5 pixels: a 5x1 row where the output has one
    # 13 is prime and above the 12 pixels two blocks may hold: a row of one block, not one pixel of two
    # (GoogLeNet's 13x13 1x1 convs: the whole model 12.3 -> 10.7 ms on Zen 4).
    (13, 256, 1, (1, 1, 13), (1, 1, 13)),
    # No 2x2 block in 55 x 55: the smallest larger block it has, 5 x 1 (the widest row, 11, ran SqueezeNet's
    # 16-channel convs at half the speed: 150 against 280 GOPS on Zen 4).
    (55, 16, 1, (2, 1, 5), (2, 1, 5)),
    (55, 64, 3, (2, 1, 5), (2, 1, 5)),
])
def test_fallback_tile_follows_the_cpus_instructions_in_flight(monkeypatch, hw, ic, kernel, zen4, zen5):
    # The tile covers the vpdpbusd the CPU keeps in flight: Zen 4's 4 (measured: one a cycle, latency 4) fit
    # VNNI's own 2 blocks x 2x2 pixels; Zen 5's ~9 (two a cycle) take 14 accumulators (the probe_conv_tiles
    # grid's best). The CPU's name plays no part: the same target with each fact, and a CPU with none stated
    # that does not run here gets the ISA's own block.
    from tvm_tcutils.dotprod.cpu_facts import CHAINS_ENV

    for chains, expected in (("4", zen4), ("9.2", zen5)):
        monkeypatch.setenv(CHAINS_ENV, chains)
        for cpu in ("znver4", "znver5", "icelake-server"):
            assert _fallback_tile(f"llvm -mcpu={cpu}", hw, ic, kernel) == expected, (chains, cpu)
    monkeypatch.setenv(CHAINS_ENV, "0")  # unknown
    assert _fallback_tile("llvm -mcpu=znver5", hw, ic, kernel) == zen4


@pytest.mark.parametrize("m,n,tile", [(128, 256, (3, 4)), (128, 1024, (3, 4)), (128, 768, (4, 3)), (1, 1008, (1, 9))])
def test_dense_fallback_tile_is_the_same_on_zen5(m, n, tile):
    # Unlike conv2d's. A token matrix gets 12 accumulators (LATENCY_CHAINS) where 4 rows leave fewer: 3 rows by
    # 4 blocks, as 4 x 4 (16: the stack bound) ran faster alone and made bert-tiny 40 % slower end to end.
    from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot

    def tile_of(target):
        with tvm.target.Target(target):
            cfg = autotvm.get_config()
            dense_pack_dot(cfg, te.placeholder((m, 256), "uint8"), te.placeholder((n // 16, 64, 16, 4), "int8"))
        return cfg["tile_m"].val, cfg["tile_nb"].val

    assert tile_of("llvm -mcpu=znver4") == tile_of("llvm -mcpu=znver5") == tile


@pytest.mark.parametrize("m,n", [(128, 256), (128, 768), (37, 512), (8, 64)])
def test_fused_dense_tile_stays_under_the_stack_bound(m, n):
    # A fused epilogue makes the dense a per-tile buffer; from 1024 bytes TVM allocates it from the workspace
    # per tile and the accumulators leave the registers. Rows need not divide M (the last tile is guarded).
    import re

    from tvm_tcutils.dotprod.topi.common import STACK_ALLOCA_BYTES
    from tvm_tcutils.dotprod.topi.dense_pack import dense_pack_dot, schedule_dense_pack_dot

    rng = np.random.default_rng(m)
    data = te.placeholder((m, 256), "uint8", "data")
    weight = te.placeholder((n // 16, 64, 16, 4), "int8", "weight")
    target = tvm.target.Target(DOT_TARGETS["vnni"][0])
    with target:
        cfg = autotvm.get_config()
        dense = dense_pack_dot(cfg, data, weight)
        out = te.compute(dense.shape, lambda i, j: (dense[i, j] >> 3).astype("int8"), name="epilogue")
        s = schedule_dense_pack_dot(cfg, [out])
        lowered = str(tvm.lower(s, [data, weight, out]))
        count, vector = re.search(r'dense_pack_dot = T.allocate\(\[(\d+)\], "int32(?:x(\d+))?"', lowered).groups()
        assert int(count) * int(vector or 1) * 4 < STACK_ALLOCA_BYTES
        if not host_cpu_has(DOT_TARGETS["vnni"][1]):
            return  # the structure above is checked anywhere; running the code needs VNNI
        f = tvm.build(s, [data, weight, out], target)
    a = rng.integers(0, 256, (m, 256)).astype("uint8")
    w = rng.integers(-128, 128, (n, 256)).astype("int8")
    w_p = w.reshape(n // 16, 16, 64, 4).transpose(0, 2, 1, 3)
    result = tvm.nd.empty((m, n), "int8")
    f(tvm.nd.array(a), tvm.nd.array(np.ascontiguousarray(w_p)), result)
    expected = ((a.astype("int32") @ w.astype("int32").T) >> 3).astype("int8")
    np.testing.assert_array_equal(result.numpy(), expected)


def test_widened_data_only_where_the_isa_takes_it():
    from tvm_tcutils.dotprod.isa import X86_AVX2, X86_VNNI
    from tvm_tcutils.dotprod.topi.intrinsics import dot_product_intrin

    with pytest.raises(ValueError, match="takes no widened data"):
        dot_product_intrin(X86_VNNI, "uint8", "int8", "llvm", True)
    assert dot_product_intrin(X86_AVX2, "uint8", "int8", "llvm", True) is not None


@pytest.mark.parametrize("target_name", ["vnni", "vnni_zen5", "avx2", "sse"])
@pytest.mark.parametrize("m,k,n", [(1, 2048, 1000), (3, 30, 17), (24, 64, 100), (128, 256, 256)])
def test_dense_bit_exact(target_name, m, k, n):
    target = dot_target(target_name)
    lanes = for_target(target).lanes
    data, weight = _full_range((m, k), "uint8"), _full_range((n, k), "int8")
    bias = RNG.integers(-(2**20), 2**20, n).astype("int32")
    weight_p, data_p = packing.pack_dense_weight(weight, lanes), packing.pad_dense_data(data)
    d = te.placeholder(data_p.shape, "uint8")
    w = te.placeholder(weight_p.shape, "int8")
    b = te.placeholder((weight_p.shape[0] * lanes,), "int32")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, w, b)
        func = tvm.build(schedule_dense_pack_dot(cfg, [out]), [d, w, b, out], target=target)
    res = tvm.nd.empty([int(x) for x in out.shape], "int32")
    bias_p = np.pad(bias, (0, int(b.shape[0]) - n))
    func(tvm.nd.array(data_p), tvm.nd.array(weight_p), tvm.nd.array(bias_p), res)
    ref = data.astype("int64") @ weight.astype("int64").T + bias
    np.testing.assert_array_equal(res.numpy()[:, :n], ref)


@pytest.mark.parametrize("target_name,outer", [("vnni", "j"), ("avx2", "i")])
def test_dense_tiles_walk_column_blocks_outermost_on_vnni(target_name, outer):
    # A token matrix's row tiles take turns on each block of weights (read once, not once per row tile);
    # AVX2 (measured level to slower that way) keeps its row tiles outermost.
    target = dot_target(target_name)
    lanes = for_target(target).lanes
    d, w = te.placeholder((128, 768), "uint8"), te.placeholder((3072 // lanes, 192, lanes, 4), "int8")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = dense_pack_dot(cfg, d, w)
        lowered = tvm.lower(schedule_dense_pack_dot(cfg, [out]), [d, w, out])
    loops = []
    tvm.tir.stmt_functor.post_order_visit(
        lowered["main"].body,
        lambda node: loops.append(node) if isinstance(node, tvm.tir.For) and node.kind == tvm.tir.ForKind.PARALLEL
        else None)
    assert len(loops) == 1
    row_tiles, column_tiles = 128 // cfg["tile_m"].val, 3072 // lanes // cfg["tile_nb"].val
    fused = "j_outer_i_outer_fused" if outer == "j" else "i_outer_j_outer_fused"
    assert loops[0].loop_var.name.replace(".", "_") == fused
    assert int(loops[0].extent) == row_tiles * column_tiles
    # The weight block of an iteration: iteration // row tiles (columns outer), iteration % column tiles.
    assert (f"{fused} // {row_tiles}" if outer == "j" else f"{fused} % {column_tiles}") in str(lowered)


# (N, C, H, W, O, KH, KW, stride): convs of few channels in the row form (data already padded).
ROWS_SHAPES = {
    "stem_7x7_c3_s2": (1, 3, 36, 38, 64, 7, 7, 2),
    "gray_3x3": (2, 1, 11, 13, 16, 3, 3, 1),
    "c2_5x3_s_2x1": (1, 2, 12, 15, 32, 5, 3, (2, 1)),
}


@pytest.mark.parametrize("target_name,instruction", [("vnni", "vpdpbusd"), ("avx2", "vpmaddwd")])
@pytest.mark.parametrize("name", sorted(ROWS_SHAPES))
def test_conv2d_rows_bit_exact(name, target_name, instruction):
    n, c, h, w, o, k_h, k_w, stride = ROWS_SHAPES[name]
    target = dot_target(target_name)
    isa = for_target(target)
    k_dtype = isa.conv_kernel_dtype("int8")
    lanes, group = isa.lanes, isa.kernel_group(k_dtype)
    data, kernel = _full_range((n, c, h, w), "uint8"), _full_range((o, c, k_h, k_w), "int8")
    quads = -(-k_w // ROW_QUAD)
    # OIHW{L}o{g}w: the kernel row zero-padded to whole quads, L output channels then g taps innermost
    # (VNNI: 16 and 4; AVX2: 8 and pairs of int16).
    rows = np.zeros((o, c, k_h, quads * ROW_QUAD), "int8")
    rows[..., :k_w] = kernel
    packed = rows.reshape(o // lanes, lanes, c, k_h, quads * ROW_QUAD // group, group).transpose(0, 2, 3, 4, 1, 5)
    packed = packed.astype(k_dtype)
    d, kk = te.placeholder(data.shape, "uint8", name="d"), te.placeholder(packed.shape, k_dtype, name="k")
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_rows_dot(cfg, d, kk, stride, 0, 1)
        func = tvm.build(schedule_conv2d_nchwc_dot(cfg, [out]), [d, kk, out], target=target)
    result = tvm.nd.empty([int(x) for x in out.shape], "int32")
    func(tvm.nd.array(data), tvm.nd.array(np.ascontiguousarray(packed)), result)
    s_h, s_w = (stride, stride) if isinstance(stride, int) else stride
    # The quads past the kernel's last tap read columns the reference never reads: widen its input.
    wide = np.pad(data, ((0, 0), (0, 0), (0, 0), (0, quads * ROW_QUAD - k_w)))
    ref = conv_reference(wide, rows, 1, 0, 1)[:, :, ::s_h, ::s_w]
    np.testing.assert_array_equal(packing.unpack_nchwc(result.numpy(), o), ref[:, :, :result.shape[2], :result.shape[3]])
    assert result.shape[2:4] == ((h - k_h) // s_h + 1, (w - quads * ROW_QUAD) // s_w + 1)
    assert instruction in func.get_source("asm")


def test_bad_inputs_raise_clear_errors():
    with tvm.target.Target("llvm -mcpu=znver4"):
        cfg = autotvm.get_config()
        with pytest.raises(ValueError, match="native pairs"):
            conv2d_nchwc_dot(cfg, te.placeholder((1, 1, 4, 4, 4), "int8"),
                             te.placeholder((1, 1, 1, 1, 1, 16, 4), "int8"), 1, 0, 1, "", "")
        with pytest.raises(ValueError, match="OIHW"):
            conv2d_nchwc_dot(cfg, te.placeholder((1, 4, 4, 4), "uint8"),
                             te.placeholder((1, 1, 1, 1, 1, 16, 4), "int8"), 1, 0, 1, "", "")
        with pytest.raises(ValueError, match="lanes"):
            conv2d_nchwc_dot(cfg, te.placeholder((1, 1, 4, 4, 4), "uint8"),
                             te.placeholder((1, 1, 1, 1, 1, 8, 4), "int8"), 1, 0, 1, "", "")
        with pytest.raises(ValueError, match="native pairs"):  # VNNI takes no widened kernel
            conv2d_nchwc_dot(cfg, te.placeholder((1, 1, 4, 4, 4), "uint8"),
                             te.placeholder((1, 1, 1, 1, 2, 16, 2), "int16"), 1, 0, 1, "", "")
        with pytest.raises(ValueError, match="padding must be 0"):  # the row form takes padded data
            conv2d_rows_dot(cfg, te.placeholder((1, 3, 9, 9), "uint8"),
                            te.placeholder((1, 3, 3, 1, 16, 4), "int8"), 1, 1, 1)
        with pytest.raises(ValueError, match=r"\(O/L, C, KH, KW/g, L, g\)"):
            conv2d_rows_dot(cfg, te.placeholder((1, 3, 9, 9), "uint8"),
                            te.placeholder((1, 1, 3, 1, 16, 4), "int8"), 1, 0, 1)
        with pytest.raises(ValueError, match="OIHW16o4w"):
            conv2d_rows_dot(cfg, te.placeholder((1, 3, 9, 9), "uint8"),
                            te.placeholder((1, 3, 3, 2, 16, 2), "int8"), 1, 0, 1)
    with tvm.target.Target("llvm -mcpu=core-avx2"):
        with pytest.raises(ValueError, match=r"\(O/B, 1, KH, KW, 2, B, 2\)"):  # int16 kernels come in pairs
            conv2d_nchwc_dot(autotvm.get_config(), te.placeholder((1, 1, 4, 4, 4), "uint8"),
                             te.placeholder((1, 1, 1, 1, 1, 8, 4), "int16"), 1, 0, 1, "", "")
    with tvm.target.Target("llvm"):
        with pytest.raises(ValueError, match="no 4-way dot-product"):
            dense_pack_dot(autotvm.get_config(), te.placeholder((1, 4), "uint8"),
                           te.placeholder((1, 1, 16, 4), "int8"))
