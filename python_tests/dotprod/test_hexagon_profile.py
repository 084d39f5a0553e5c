"""Instruction profiles on emulated Hexagon (profile_model): counts, per-node split, package vs plain TVM."""
from __future__ import annotations

import numpy as np
import pytest

from tvm import relay

import tvm_tcutils
from tvm_tcutils.dotprod import hexagon_model, hexagon_profile
from tvm_tcutils.dotprod.hexagon_profile import Counts, NodeProfile, Profile
from test_hexagon import _require_emulator
from test_hexagon_model import _qnn_cnn, _x86


# ---------------------------------------------------------------- no emulator needed
def test_macs_of_convs_and_dense_in_plain_and_packed_layouts():
    x = relay.var("x", shape=(1, 16, 12, 12), dtype="uint8")
    w = relay.var("w", shape=(32, 8, 3, 3), dtype="int8")  # grouped: 8 input channels per output
    conv = relay.nn.conv2d(x, w, kernel_size=(3, 3), groups=2, channels=32, out_dtype="int32")
    assert hexagon_profile.macs(relay.Function([x, w], conv)) == 32 * 10 * 10 * 8 * 9
    packed = relay.var("p", shape=(1, 1, 14, 14, 16), dtype="uint8")
    kernel = relay.var("k", shape=(2, 1, 3, 3, 4, 32, 4), dtype="int8")  # OIHW4i32o4i: 64 outputs, 16 inputs
    nchwc = relay.nn.contrib_conv2d_nchwc(packed, kernel, channels=64, kernel_size=(3, 3), data_layout="NCHW16c",
                                          kernel_layout="OIHW4i32o4i", out_layout="NCHW32c", out_dtype="int32")
    assert hexagon_profile.macs(relay.Function([packed, kernel], nchwc)) == 64 * 12 * 12 * 16 * 9
    a = relay.var("a", shape=(3, 40), dtype="int8")
    b = relay.var("b", shape=(7, 40), dtype="int8")
    assert hexagon_profile.macs(relay.Function([a, b], relay.nn.dense(a, b, out_dtype="int32"))) == 3 * 7 * 40
    assert hexagon_profile.macs(relay.Function([a], relay.cast(a, "int32"))) == 0
    assert [hexagon_profile.ideal_vrmpy(m) for m in (0, 1, 128, 129)] == [0, 1, 1, 2]


def test_profile_arithmetic_and_table():
    nodes = [NodeProfile("conv", 1280, Counts(50, 120, 10)), NodeProfile("pad", 0, Counts(20, 30, 0))]
    prof = Profile([], Counts(75, 160, 10), nodes, model_macs=1000)
    assert prof.runner == Counts(5, 10, 0) and prof.macs == 1280 and prof.ideal_vrmpy == 8
    table = hexagon_profile.format_table(prof, Profile([], Counts(400, 900, 0), nodes, 1000)).splitlines()
    assert table[3].split()[-2:] == ["20", "30"]  # the pad node, matched by position
    assert table[0].split()[:2] == ["node", "MACs"] and table[-1].split() == ["total", "1000", "75", "160", "10", "8",
                                                                             "400", "900"]


def test_plain_target_and_hook_switch_restore_the_hooks():
    assert str(hexagon_profile.plain_target(None)).strip() == "c -keys=cpu"
    with pytest.raises(ValueError, match="C-source Hexagon target"):
        hexagon_profile.plain_target("llvm")
    # Other hooks (a test's own, registered by other test files in this process) may be installed too.
    before = set(tvm_tcutils.registered())
    assert ("qnn.quantize", "FTVMQnnLegalize") in {(r.name, r.attr) for r in before}
    with pytest.raises(KeyError):
        with hexagon_profile.package_hooks(False):
            assert ("qnn.quantize", "FTVMQnnLegalize") not in {(r.name, r.attr) for r in tvm_tcutils.registered()}
            raise KeyError("inside")
    assert set(tvm_tcutils.registered()) == before


def test_symbol_address_needs_an_elf32_file(tmp_path):
    path = tmp_path / "not_elf"
    path.write_bytes(b"#!/bin/sh\n")
    with pytest.raises(ValueError, match="not a 32-bit little-endian ELF file"):
        hexagon_profile.symbol_address(str(path), hexagon_model.MARK_SYMBOL)


def test_missing_tools_fail_before_building(monkeypatch):
    monkeypatch.setattr(hexagon_profile, "missing_tools", lambda: ["qemu"])
    monkeypatch.setattr(hexagon_model, "_build_c", lambda *a: pytest.fail("built without the tools"))
    with pytest.raises(RuntimeError, match="instruction profile needs qemu .*apt-get install"):
        hexagon_profile.profile_model(_qnn_cnn(), inputs=[np.zeros((1, 16, 12, 12), "uint8")])
    with pytest.raises(RuntimeError, match="needs qemu"):
        hexagon_profile.plugin_path()
    with pytest.raises(TypeError, match="package_schedules must be a bool"):
        hexagon_profile.profile_model(_qnn_cnn(), inputs=[], package_schedules="no")


# ---------------------------------------------------------------- under qemu-hexagon
def test_plugin_is_built_once_into_the_cache(tmp_path):
    _require_emulator()
    path = hexagon_profile.plugin_path(str(tmp_path))
    mtime = tmp_path.joinpath(path).stat().st_mtime_ns
    assert hexagon_profile.plugin_path(str(tmp_path)) == path and tmp_path.joinpath(path).stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir()] == [path.rsplit("/", 1)[-1]]  # no temporary files left


@pytest.fixture(scope="module")
def profiles():
    _require_emulator()
    data = np.random.default_rng(3).integers(0, 256, (1, 16, 12, 12)).astype("uint8")
    package = hexagon_profile.profile_model(_qnn_cnn(), inputs=[data], timeout=120)
    plain = hexagon_profile.profile_model(_qnn_cnn(), inputs=[data], timeout=120, package_schedules=False)
    return data, package, plain


def test_both_builds_bit_exact_and_counts_add_up(profiles):
    data, package, plain = profiles
    ref = _x86(_qnn_cnn(), {"x": data})[0]
    for prof in (package, plain):
        np.testing.assert_array_equal(prof.outputs[0], ref)
        assert all(n.counts.packets > 0 and n.counts.instructions >= n.counts.packets for n in prof.nodes)
        # The nodes hold all but the runner's own few packets (reading the input, writing the output).
        assert 0 < prof.runner.packets < 0.001 * prof.total.packets and prof.runner.vrmpy == 0
        assert prof.model_macs == 32 * 12 * 12 * 16 * 9 + 40 * 6 * 6 * 32 * 9 + 10 * 40 * 6 * 6
    assert tvm_tcutils.registered()  # the plain build put the hooks back


def test_package_convs_use_ideal_vrmpy_and_fewer_instructions_than_plain_tvm(profiles):
    _, package, plain = profiles
    convs = [n for n in package.nodes if "conv2d" in n.name]
    plain_convs = [n for n in plain.nodes if "conv2d" in n.name]
    assert len(convs) == len(plain_convs) == 2
    # Every MAC (padded channels included) goes through vrmpy, 128 at a time; the plain build has none.
    assert all(n.counts.vrmpy == n.ideal_vrmpy > 0 for n in convs)
    assert package.total.vrmpy == sum(n.ideal_vrmpy for n in package.nodes) >= package.ideal_vrmpy
    assert plain.total.vrmpy == 0
    for ours, theirs in zip(convs, plain_convs):
        assert ours.counts.packets * 3 < theirs.counts.packets
        assert ours.counts.instructions * 3 < theirs.counts.instructions
    assert package.total.packets * 3 < plain.total.packets


def test_integer_model_strips_softmax_and_quantizes_without_changing_the_input(mlp_model):
    mod, params = mlp_model
    before = mod.astext()
    qmod, qparams, notes = hexagon_profile.integer_model(mod, params)
    assert mod.astext() == before and qparams is None
    assert "softmax" in notes[-1] and "nn.softmax" not in qmod.astext() and "nn.softmax" in before
    assert "int8" in qmod.astext()


# Under -m slow: the same two emulated builds of this CNN as the ``profiles`` fixture (bit-exact, packets
# compared: the two tests above), and compare_builds itself runs by default under the bench command
# (test_cli.py::test_bench_emulate_profiles_hexagon_bit_exactly: bit-identical to x86 and to the plain build).
@pytest.mark.slow
def test_compare_builds_of_a_cnn_is_bit_exact_with_fewer_packets():
    _require_emulator()
    data = np.random.default_rng(4).integers(0, 256, (1, 16, 12, 12)).astype("uint8")
    compared = hexagon_profile.compare_builds(_qnn_cnn(), inputs={"x": data}, timeout=120)
    assert compared.bit_exact and compared.equals_x86 and compared.equals_plain
    assert compared.plain.total.packets > 3 * compared.package.total.packets
    assert "bit-identical to the x86" in compared.summary(width=1000)


def test_compare_builds_checks_plain_before_building():
    data = np.random.default_rng(4).integers(0, 256, (1, 16, 12, 12)).astype("uint8")
    with pytest.raises(TypeError, match="plain must be a bool"):
        hexagon_profile.compare_builds(_qnn_cnn(), inputs={"x": data}, plain="yes")
