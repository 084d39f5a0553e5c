"""Grouped int8 convs on the dot-product kernel: TOPI computes, the Relay hooks (per-group channel padding,
packing, the QNN legalization) and AutoTVM tuning, bit-exact against a numpy grouped conv."""
from __future__ import annotations

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay, te

from conftest import build_run_lib as _build_run, dot_target, each_value_once, host_dot_target

RNG = np.random.default_rng(11)


def grouped_conv_reference(data: np.ndarray, kernel: np.ndarray, groups: int, padding: int = 0, stride: int = 1,
                           data_zero: int = 0) -> np.ndarray:
    """int64 NCHW grouped conv of ``data - data_zero`` (padded with ``data_zero``) by an OIHW kernel."""
    (n, _, h, w), (out_c, cpg, k_h, k_w) = data.shape, kernel.shape
    opg = out_c // groups
    padded = np.pad(data.astype(np.int64) - data_zero, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    o_h, o_w = (h + 2 * padding - k_h) // stride + 1, (w + 2 * padding - k_w) // stride + 1
    out = np.zeros((n, out_c, o_h, o_w), np.int64)
    for g in range(groups):
        taps = kernel[g * opg:(g + 1) * opg].astype(np.int64)
        for i in range(k_h):
            for j in range(k_w):
                window = padded[:, g * cpg:(g + 1) * cpg, i:i + stride * o_h:stride, j:j + stride * o_w:stride]
                out[:, g * opg:(g + 1) * opg] += np.einsum("nchw,oc->nohw", window, taps[:, :, i, j])
    return out


def _ints(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


# --------------------------------------------------------------------------
# TOPI
# --------------------------------------------------------------------------
#: (groups, input channels a group, output channels a group, kernel, stride, padding) of packed convs.
PACKED_CASES = [(2, 16, 16, 3, 1, 1), (4, 32, 32, 1, 1, 0), (3, 8, 32, 3, 2, 1), (2, 48, 16, 5, 1, 2)]


@pytest.mark.parametrize("target_name", ["vnni", "avx2", "sse"])
@pytest.mark.parametrize("groups, cpg, opg, k, stride, pad", PACKED_CASES)
def test_packed_group_conv_matches_numpy(target_name, groups, cpg, opg, k, stride, pad):
    from tvm_tcutils.dotprod.isa import for_target
    from tvm_tcutils.dotprod.topi.conv2d_nchwc import group_conv2d_nchwc_dot, schedule_conv2d_nchwc_dot
    from tvm_tcutils.dotprod.topi.packing import channel_block

    target = dot_target(target_name)
    isa = for_target(target)
    lanes = isa.lanes
    if opg % lanes:
        pytest.skip(f"{opg} output channels a group are no whole {lanes}-lane blocks")
    size = 11
    data = _ints((1, groups * cpg, size, size), "uint8")
    kernel = _ints((groups * opg, cpg, k, k), "int8")
    ic_bn = channel_block(cpg, lanes)
    k_dtype = isa.conv_kernel_dtype("int8")
    g = isa.kernel_group(k_dtype)
    data_p = data.reshape(1, groups * cpg // ic_bn, ic_bn, size, size).transpose(0, 1, 3, 4, 2)
    kernel_p = (kernel.reshape(groups * opg // lanes, lanes, cpg // ic_bn, ic_bn // g, g, k, k)
                .transpose(0, 2, 5, 6, 3, 1, 4).astype(k_dtype))
    d, w = te.placeholder(data_p.shape, "uint8"), te.placeholder(kernel_p.shape, k_dtype)
    with tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = group_conv2d_nchwc_dot(cfg, d, w, stride, pad, 1, groups, "", "")
        func = tvm.build(schedule_conv2d_nchwc_dot(cfg, [out]), [d, w, out])
    result = tvm.nd.empty([int(x) for x in out.shape], "int32")
    func(tvm.nd.array(data_p), tvm.nd.array(np.ascontiguousarray(kernel_p)), result)
    got = result.numpy().transpose(0, 1, 4, 2, 3).reshape(1, groups * opg, *result.shape[2:4])
    np.testing.assert_array_equal(got, grouped_conv_reference(data, kernel, groups, pad, stride))
    assert cfg["tile_oc"].val <= opg // lanes and (opg // lanes) % cfg["tile_oc"].val == 0  # a tile: one group


def test_packed_group_conv_rejects_shapes_its_groups_do_not_split():
    from tvm_tcutils.dotprod.topi.conv2d_nchwc import group_conv2d_nchwc_dot

    d = te.placeholder((1, 3, 8, 8, 16), "uint8")
    with tvm.target.Target("llvm -mcpu=znver4"):
        with pytest.raises(ValueError, match="groups=2"):
            group_conv2d_nchwc_dot(autotvm.get_config(), d, te.placeholder((2, 1, 1, 1, 4, 16, 4), "int8"),
                                   1, 0, 1, 2, "", "")
        with pytest.raises(ValueError, match="does not match"):  # the kernel holds one group's chunks
            group_conv2d_nchwc_dot(autotvm.get_config(), te.placeholder((1, 4, 8, 8, 16), "uint8"),
                                   te.placeholder((2, 1, 1, 1, 4, 16, 4), "int8"), 1, 0, 1, 2, "", "")


def test_unpacked_group_conv_rejects_channels_legalization_would_pad():
    from tvm_tcutils.dotprod.topi.conv2d_nchwc import group_conv2d_nchw_dot

    with tvm.target.Target("llvm -mcpu=znver4"):
        with pytest.raises(ValueError, match="multiples of 4"):
            group_conv2d_nchw_dot(autotvm.get_config(), te.placeholder((1, 12, 8, 8), "uint8"),
                                  te.placeholder((64, 6, 1, 1), "int8"), 1, 0, 1, 2)


@pytest.mark.parametrize("channels, out_channels, groups, pays", [
    (136, 136, 4, True),    # ShuffleNet: 34 -> 36 in, 34 -> 48 out (x1.5)
    (24, 112, 4, True),     # its first grouped conv: 6 -> 8 in, 28 -> 32 out
    (96, 256, 2, True),     # AlexNet: no padding
    (128, 128, 32, False),  # ResNeXt-50 32x4d: 4 -> 16 out, x4
    (64, 64, 64, False),    # depthwise: its own kernel
    (64, 128, 64, False),   # depthwise with a multiplier
    (30, 60, 4, False),     # groups that do not split the channels
])
def test_group_padding_pays_only_for_moderate_padding(channels, out_channels, groups, pays):
    from tvm_tcutils.dotprod.isa import X86_VNNI
    from tvm_tcutils.dotprod.topi.conv2d_nchwc import group_padding_pays

    assert group_padding_pays(X86_VNNI, channels, out_channels, groups) is pays


# --------------------------------------------------------------------------
# Relay: nn.conv2d and qnn.conv2d
# --------------------------------------------------------------------------
def _grouped_net(channels, out_channels, groups, k, stride, dtype):
    x = relay.var("x", shape=(1, channels, 10, 10), dtype=dtype)
    kernel = _ints((out_channels, channels // groups, k, k), "int8")
    y = relay.nn.conv2d(x, relay.const(kernel), strides=stride, padding=k // 2, groups=groups,
                        channels=out_channels, kernel_size=k, out_dtype="int32")
    return relay.Function([x], y), kernel


def _ops(lib_or_mod, target, opt_level=3):
    with tvm.transform.PassContext(opt_level=opt_level, disabled_pass=["FuseOps"]):
        opt, _ = relay.optimize(tvm.IRModule.from_expr(lib_or_mod), target=target)
    calls = []
    relay.analysis.post_order_visit(opt["main"], lambda n: calls.append(n) if isinstance(n, relay.Call) and isinstance(
        n.op, tvm.ir.Op) else None)
    return calls


#: (channels, output channels, groups, kernel, stride): ShuffleNet's padded groups, AlexNet's whole ones.
RELAY_CASES = [(136, 136, 4, 1, 1), (24, 112, 4, 1, 1), (96, 256, 2, 5, 1), (64, 64, 2, 3, 2)]


@pytest.mark.parametrize("case, dtype, opt_level, target_name", each_value_once(
    RELAY_CASES, ["uint8", "int8"], [3, 2], ["vnni", "avx2", "sse"]))
def test_relay_group_conv_is_bit_exact_on_the_dot_product_kernel(case, dtype, opt_level, target_name):
    from tvm_tcutils.dotprod.isa import for_target

    channels, out_channels, groups, k, stride = case
    target = dot_target(target_name)
    lanes = for_target(target).lanes
    func, kernel = _grouped_net(channels, out_channels, groups, k, stride, dtype)
    data = _ints((1, channels, 10, 10), dtype)
    out, lib = _build_run(func, {"x": data}, target, opt_level)
    np.testing.assert_array_equal(out, grouped_conv_reference(data, kernel, groups, k // 2, stride))
    # The ISA's products (SSE's widened multiplies: LLVM picks pmulld or pmaddwd).
    products = {"vnni": ("vpdpbusd",), "avx2": ("vpmaddwd",), "sse": ("pmulld", "pmaddwd")}[target_name]
    asm = lib.get_lib().get_source("asm")
    assert any(product in asm for product in products)
    convs = [c for c in _ops(func, target, opt_level) if c.op.name.startswith("nn.co")]
    assert len(convs) == 1 and int(convs[0].attrs.groups) == groups
    assert convs[0].op.name == ("nn.contrib_conv2d_NCHWc" if opt_level == 3 else "nn.conv2d")
    cpg, opg = channels // groups, out_channels // groups
    padded = (groups * -(-cpg // 4) * 4, groups * -(-opg // lanes) * lanes)
    kernel_type = convs[0].args[1].checked_type
    assert int(np.prod([int(d) for d in kernel_type.shape])) == padded[1] * padded[0] // groups * k * k


def test_heavily_padded_and_depthwise_group_convs_stay_with_tvm():
    target = dot_target("vnni")
    for channels, out_channels, groups in ((128, 128, 32), (64, 64, 64)):
        func, kernel = _grouped_net(channels, out_channels, groups, 3, 1, "uint8")
        convs = [c for c in _ops(func, target) if "conv2d" in c.op.name]
        assert all(int(c.args[1].checked_type.shape[0]) in (out_channels, out_channels // 16) for c in convs)
        assert not any(c.op.name == "nn.contrib_conv2d_NCHWc" and int(c.attrs.groups) not in (1, channels)
                       and c.attrs.kernel_layout.endswith("4i") for c in convs)


@pytest.mark.parametrize("data_dtype, data_zero, padding", [("uint8", 121, 1), ("int8", -7, 0), ("uint8", 0, 1)])
def test_qnn_group_conv_takes_eight_bit_operands(data_dtype, data_zero, padding):
    # TVM's canonical form widens a grouped qnn.conv2d's operands to int32; the package's legalization keeps
    # them 8-bit (the zero point padded in, its kernel-sum term subtracted): the same sums.
    target = dot_target("vnni")
    x = relay.var("x", shape=(1, 136, 9, 9), dtype=data_dtype)
    kernel = _ints((136, 34, 3, 3), "int8")
    y = relay.qnn.op.conv2d(x, relay.const(kernel), relay.const(data_zero), relay.const(0), relay.const(0.05),
                            relay.const(np.full(136, 0.01, "float32")), kernel_size=(3, 3), channels=136,
                            groups=4, padding=(padding, padding), out_dtype="int32")
    func = relay.Function([x], y)
    data = _ints((1, 136, 9, 9), data_dtype)
    out, lib = _build_run(func, {"x": data}, target)
    np.testing.assert_array_equal(out, grouped_conv_reference(data, kernel, 4, padding, data_zero=data_zero))
    assert "vpdpbusd" in lib.get_lib().get_source("asm")
    with tvm.transform.PassContext(opt_level=3):
        legal = relay.qnn.transform.Legalize()(relay.transform.InferType()(tvm.IRModule.from_expr(func)))
    convs = [c for c in _ops(legal["main"], target) if c.op.name == "nn.conv2d" or "NCHWc" in c.op.name]
    assert convs and all(c.args[0].checked_type.dtype in ("uint8", "int8") for c in convs)


# --------------------------------------------------------------------------
# AutoTVM
# --------------------------------------------------------------------------
def test_group_conv_is_extracted_and_its_record_reaches_the_packed_build():
    from tvm_tcutils.dotprod.strategy import GROUP_CONV2D_NCHWC_TASK
    from tvm_tcutils.tuning import default_config_index, extract_tasks, valid_indexes

    target = dot_target("vnni")
    func, _ = _grouped_net(136, 136, 4, 1, 1, "uint8")
    mod = tvm.IRModule.from_expr(func)
    tasks = extract_tasks(mod, {}, target)
    assert [(t.name, t.args[5]) for t in tasks] == [("tcutils.group_conv2d_nchw_dot", 4)]
    task = tasks[0]
    assert [int(d) for d in task.args[0][1]] == [1, 144, 10, 10]  # 34 -> 36 channels a group
    fallback = task.config_space.get(default_config_index(task))
    tuned = next(c for c in (task.config_space.get(i) for i in valid_indexes(task.config_space))
                 if c.to_json_dict()["entity"] != fallback.to_json_dict()["entity"])
    record = (autotvm.measure.MeasureInput(task.target, task, tuned),
              autotvm.measure.MeasureResult((1e-4,), 0, 0.0, 0.0))
    # 36 channels a group: blocks of 12 (three a group), 48 outputs a group: 3 of 16 lanes.
    packed = autotvm.task.args_to_workload(
        [te.placeholder((1, 12, 10, 10, 12), "uint8"), te.placeholder((12, 3, 1, 1, 3, 16, 4), "int8"),
         (1, 1), (0, 0, 0, 0), (1, 1), 4, "NCHW12c", "NCHW16c", "int32"], GROUP_CONV2D_NCHWC_TASK)
    with autotvm.apply_history_best([record]) as context:
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target=target)
        built = context.query(tvm.target.Target(target), packed)
    assert not built.is_fallback and built.to_json_dict()["entity"] == tuned.to_json_dict()["entity"]


# --------------------------------------------------------------------------
# The build hook's vector lets
# --------------------------------------------------------------------------
def test_vector_lets_build_through_the_hook_and_not_through_tvms_codegen():
    # A padded group conv's epilogue: its int32 blocks unpacked, the padding sliced off, requantized and
    # packed again for the next conv. TVM's CSE binds the fused kernel's vector indices to lets and LLVM 22
    # refuses their debug information; the hook substitutes them (tvm_codegen(): TVM's own code generator,
    # where the build fails, as it does without the package).
    from conftest import tvm_codegen

    x = relay.var("x", shape=(1, 20, 14, 14, 16), dtype="int32")
    y = relay.reshape(relay.layout_transform(x, "NCHW16c", "NCHW"), (1, 4, 80, 14, 14))
    y = relay.reshape(relay.strided_slice(y, (0, 0, 0, 0, 0), (1, 4, 68, 14, 14)), (1, 272, 14, 14))
    y = relay.cast(relay.clip(relay.multiply(relay.cast(y, "float32"), relay.const(0.01)), 0, 255), "uint8")
    y = relay.layout_transform(relay.nn.pad(y, ((0, 0), (0, 0), (1, 1), (1, 2))), "NCHW", "NCHW16c")
    func = relay.Function([x], y)
    data = RNG.integers(0, 30000, (1, 20, 14, 14, 16)).astype("int32")
    target = host_dot_target()  # it runs: the host's own vector ISA
    out, _ = _build_run(func, {"x": data}, target)
    plain = data.transpose(0, 1, 4, 2, 3).reshape(1, 4, 80, 14, 14)[:, :, :68].reshape(1, 272, 14, 14)
    want = np.clip(plain.astype("float32") * np.float32(0.01), 0, 255).astype("uint8")
    want = np.pad(want, ((0, 0), (0, 0), (1, 1), (1, 2))).reshape(1, 17, 16, 16, 17).transpose(0, 1, 3, 4, 2)
    np.testing.assert_array_equal(out, want)
    with tvm_codegen(), pytest.raises(tvm.TVMError, match="dbg_declare"):
        _build_run(func, {"x": data}, target)


# --------------------------------------------------------------------------
# Hexagon HVX (emulated)
# --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_hexagon_group_conv_bit_exact_in_the_emulator(dtype):
    # HVX packs 32 output lanes: ShuffleNet's 34-channel groups become 64 out (36 in), still a dot product.
    from test_hexagon import _require_emulator
    from tvm_tcutils.dotprod import hexagon_model

    _require_emulator()
    func, kernel = _grouped_net(136, 136, 4, 1, 1, dtype)
    data = _ints((1, 136, 10, 10), dtype)
    out = hexagon_model.run_model(tvm.IRModule.from_expr(func), None, {"x": data}, timeout=300)
    np.testing.assert_array_equal(out[0], grouped_conv_reference(data, kernel, 4))


def test_group_conv_with_a_kernel_given_at_run_time_and_dilation():
    # A kernel parameter (not a constant): the int8 data's compensation sums it in the graph; dilation 2.
    target = dot_target("vnni")
    x = relay.var("x", shape=(1, 48, 12, 12), dtype="int8")
    w = relay.var("w", shape=(96, 12, 3, 3), dtype="int8")
    y = relay.nn.conv2d(x, w, padding=2, dilation=2, groups=4, channels=96, kernel_size=3, out_dtype="int32")
    data, kernel = _ints((1, 48, 12, 12), "int8"), _ints((96, 12, 3, 3), "int8")
    out, _ = _build_run(relay.Function([x, w], y), {"x": data, "w": kernel}, target)
    # Dilation 2 of a 3x3 kernel: the reference's 5x5 kernel with the odd taps zero.
    dilated = np.zeros((96, 12, 5, 5), "int8")
    dilated[:, :, ::2, ::2] = kernel
    np.testing.assert_array_equal(out, grouped_conv_reference(data, dilated, 4, padding=2))


def test_qnn_group_conv_with_a_kernel_zero_point_stays_with_tvm_and_exact():
    # A non-zero kernel zero point: the handler leaves the conv to TVM's canonical form (int32 operands).
    from tvm_tcutils.dotprod.qdq import legalize_group_conv2d

    target = dot_target("vnni")
    x = relay.var("x", shape=(1, 16, 6, 6), dtype="uint8")
    kernel = _ints((32, 4, 1, 1), "int8")
    y = relay.qnn.op.conv2d(x, relay.const(kernel), relay.const(5), relay.const(3), relay.const(0.05),
                            relay.const(0.01), kernel_size=(1, 1), channels=32, groups=4, out_dtype="int32")
    call = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))["main"].body
    with tvm.target.Target(target):
        assert legalize_group_conv2d(call.attrs, call.args, [a.checked_type for a in call.args]
                                     + [call.checked_type]) is None
    data = _ints((1, 16, 6, 6), "uint8")
    out, _ = _build_run(relay.Function([x], y), {"x": data}, target)
    want = grouped_conv_reference(data, kernel.astype(np.int64) - 3, 4, data_zero=5)
    np.testing.assert_array_equal(out, want)


def test_group_conv_kernel_in_the_reduce_range_takes_the_8bit_avx2_step():
    # A constant kernel within [-64, 64] on AVX2: the marked kernel of the reduce-range ISA (vpmaddubsw), exact.
    target = dot_target("avx2")
    x = relay.var("x", shape=(1, 136, 10, 10), dtype="uint8")
    kernel = RNG.integers(-64, 65, (136, 34, 3, 3)).astype("int8")
    func = relay.Function([x], relay.nn.conv2d(x, relay.const(kernel), padding=1, groups=4, channels=136,
                                               kernel_size=3, out_dtype="int32"))
    data = _ints((1, 136, 10, 10), "uint8")
    out, lib = _build_run(func, {"x": data}, target)
    np.testing.assert_array_equal(out, grouped_conv_reference(data, kernel, 4, padding=1))
    assert "vpmaddubsw" in lib.get_lib().get_source("asm")
    assert [c.attrs.kernel_layout for c in _ops(func, target) if "conv" in c.op.name] == ["OIHW1h1i8o4i"]
