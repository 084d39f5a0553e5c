"""Relay hooks of the int8 dot-product schedules: whole models, bit-exact vs TVM's generic build."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay

from conftest import build_run_lib as _build_run, dot_target, dot_target_runs, run_python, small_conv_net

RNG = np.random.default_rng(3)
HEXAGON = "hexagon -mcpu=hexagonv66 -mattr=+hvxv66,+hvx-length128b"


def _rand(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _odd_net(data_dtype: str, const_weights: bool = True):
    """conv(17 -> 24, stride 2) -> requantize-like epilogue -> conv 1x1 (24 -> 40, dilation) -> dense (10)."""
    x = relay.var("x", shape=(1, 17, 14, 14), dtype=data_dtype)
    params = {}

    def weight(name, shape):
        value = _rand(shape, "int8")
        if const_weights:
            return relay.const(value)
        params[name] = value
        return relay.var(name, shape=shape, dtype="int8")

    y = relay.nn.conv2d(x, weight("w1", (24, 17, 3, 3)), strides=(2, 2), padding=(1, 1), channels=24,
                        kernel_size=(3, 3), out_dtype="int32")
    y = relay.cast(relay.clip(relay.right_shift(y, relay.const(9)), -128, 127), "int8")
    y = relay.nn.conv2d(y, weight("w2", (40, 24, 3, 3)), padding=(2, 2), dilation=(2, 2), channels=40,
                        kernel_size=(3, 3), out_dtype="int32")
    y = relay.cast(relay.clip(relay.right_shift(y, relay.const(10)), -128, 127), "int8")
    y = relay.nn.dense(relay.reshape(y, (1, -1)), weight("w3", (10, 40 * 7 * 7)), out_dtype="int32")
    mod = tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(y), y))
    inputs = {"x": _rand((1, 17, 14, 14), data_dtype), **params}
    return relay.transform.InferType()(mod), inputs


def _quantized_net():
    """relay.quantize of a small float conv net (int8 data and weights, shift/clip requantize).

    ``weight_scale="max"``: TVM 0.19's default "power2" calibration calls ``np.math``, gone in NumPy 2.
    """
    mod = small_conv_net(channels=16, size=16)
    params = {}
    with relay.quantize.qconfig(
        calibrate_mode="global_scale", global_scale=8.0, skip_conv_layers=[], weight_scale="max"
    ):
        qmod = relay.quantize.quantize(mod, params)
    inputs = {"data": RNG.standard_normal((1, 16, 16, 16)).astype("float32")}
    return qmod, inputs


def _qnn_net():
    """qnn.quantize -> qnn.conv2d (3x3, 1x1 stride 2, int8 with zero points) + requantize -> qnn.dense."""
    x = relay.var("x", shape=(1, 32, 14, 14), dtype="float32")
    y = relay.qnn.op.quantize(x, relay.const(0.05), relay.const(3), out_dtype="int8")

    def qconv(inp, cin, cout, k, stride, in_scale, out_scale, in_zp):
        w_scale = RNG.uniform(0.002, 0.01, cout).astype("float32")
        out = relay.qnn.op.conv2d(
            inp, relay.const(_rand((cout, cin, k, k), "int8")), relay.const(in_zp), relay.const(0),
            relay.const(in_scale), relay.const(w_scale), kernel_size=(k, k), channels=cout,
            strides=(stride, stride), padding=(k // 2, k // 2), out_dtype="int32",
        )
        out = relay.nn.bias_add(out, relay.const(RNG.integers(-5000, 5000, cout).astype("int32")))
        return relay.qnn.op.requantize(out, relay.const(in_scale * w_scale), relay.const(0),
                                       relay.const(out_scale), relay.const(-2), axis=1, out_dtype="int8")

    y = qconv(y, 32, 64, 3, 1, 0.05, 0.1, 3)
    y = qconv(y, 64, 64, 1, 2, 0.1, 0.08, -2)
    y = relay.qnn.op.dense(relay.reshape(y, (1, -1)), relay.const(_rand((16, 64 * 7 * 7), "int8")),
                           relay.const(-2), relay.const(0), relay.const(0.08), relay.const(0.004),
                           units=16, out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.08 * 0.004), relay.const(0), relay.const(0.5),
                                relay.const(1), out_dtype="int8")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    return mod, {"x": RNG.standard_normal((1, 32, 14, 14)).astype("float32") * 3}


def _qnn_whole_op():
    """onnxruntime's QLinearConv in Relay: u8 NCHW in, qnn.conv2d + requantize, u8 NCHW out.

    The packed conv sits between two standalone 8-bit layout transforms (the byte-shuffle schedule).
    """
    x = relay.var("x", shape=(1, 32, 8, 8), dtype="uint8")
    y = relay.qnn.op.conv2d(x, relay.const(_rand((48, 32, 3, 3), "int8")), relay.const(7), relay.const(0),
                            relay.const(0.05), relay.const(0.01), kernel_size=(3, 3), channels=48,
                            padding=(1, 1), out_dtype="int32")
    y = relay.qnn.op.requantize(y, relay.const(0.05 * 0.01), relay.const(0), relay.const(0.6), relay.const(5),
                                out_dtype="uint8")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    return mod, {"x": _rand((1, 32, 8, 8), "uint8")}


def _rgb_stem_net(k: int = 7, size: int = 29, stride: int = 2, dtype: str = "uint8"):
    """An 8-bit RGB image through a ``k x k`` stem (3 -> 32) and a 3x3 conv (32 -> 16)."""
    x = relay.var("x", shape=(1, 3, size, size), dtype=dtype)
    y = relay.nn.conv2d(x, relay.const(_rand((32, 3, k, k), "int8")), strides=stride, padding=(k // 2, k // 2),
                        channels=32, kernel_size=(k, k), out_dtype="int32")
    y = relay.cast(relay.clip(relay.right_shift(y, relay.const(10)), 0, 255), "uint8")
    y = relay.nn.conv2d(y, relay.const(_rand((16, 32, 3, 3), "int8")), padding=(1, 1), channels=16,
                        kernel_size=(3, 3), out_dtype="int32")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], y)))
    return mod, {"x": _rand((1, 3, size, size), dtype)}


MODELS = {
    "qnn": _qnn_net,
    "qnn_whole_op": _qnn_whole_op,
    "odd_int8": lambda: _odd_net("int8"),
    "odd_uint8": lambda: _odd_net("uint8"),
    "odd_int8_weights_as_inputs": lambda: _odd_net("int8", const_weights=False),
    "quantized": _quantized_net,
    "rgb_stem": _rgb_stem_net,  # the last output's second quad reads a column past the padded image
    "rgb_stem_s4": lambda: _rgb_stem_net(size=32, stride=4),  # the last two padded columns are never read
    "rgb_stem_int8": lambda: _rgb_stem_net(dtype="int8"),  # shifted to u8, compensated: same sums
}

_REFERENCE = """
import json, sys, numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
assert "tvm_tcutils" not in sys.modules
root = sys.argv[1] if len(sys.argv) > 1 else {root!r}
for name in json.load(open(root + "/names.json")):
    mod = tvm.ir.load_json(open(f"{{root}}/{{name}}.json").read())
    inputs = dict(np.load(f"{{root}}/{{name}}_in.npz"))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm")
    run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input(**inputs)
    run.run()
    np.save(f"{{root}}/{{name}}_ref.npy", run.get_output(0).numpy())
assert "tvm_tcutils" not in sys.modules
"""


def _wanted_models(session) -> set:
    """The models this session's tests read references of (the sweep's selected ones whose target runs on
    this CPU, and odd_int8)."""
    wanted = {"odd_int8"}
    for item in session.items:
        if getattr(item, "originalname", None) == "test_int8_model_bit_exact_vs_tvm_generic" and \
                item.get_closest_marker("skip") is None and \
                dot_target_runs(item.callspec.params["target_name"]):
            wanted.add(item.callspec.params["name"])
    return wanted


@pytest.fixture(scope="module")
def references(request, tmp_path_factory):
    """Each model the session's tests read, its inputs and TVM's own plain-llvm output computed in a process
    without the package."""
    root = str(tmp_path_factory.mktemp("dotprod_refs"))
    wanted = _wanted_models(request.session)
    models = {name: build() for name, build in MODELS.items() if name in wanted}
    for name, (mod, inputs) in models.items():
        with open(f"{root}/{name}.json", "w") as f:
            f.write(tvm.ir.save_json(mod))
        np.savez(f"{root}/{name}_in.npz", **inputs)
    with open(f"{root}/names.json", "w") as f:
        json.dump(sorted(models), f)
    proc = run_python(_REFERENCE.format(root=root), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {name: (mod, inputs, np.load(f"{root}/{name}_ref.npy")) for name, (mod, inputs) in models.items()}


#: Models every target runs by default (int8 data legalized to u8, and onnxruntime's QLinearConv between
#: byte shuffles); VNNI runs the others too but for ``SLOW_ON_VNNI``. The other (model, AVX2/SSE) pairs run
#: under -m slow: the same kernels as the default pairs of their target, on the models the VNNI row checks.
EVERY_TARGET = ("odd_int8", "qnn_whole_op", "rgb_stem")

#: Under -m slow on VNNI too (CI time): u8 data is what qnn_whole_op's convs read, and the stem's stride 4
#: is rgb_stem's kernel with a longer step (its cut to the columns read: test_rgb_stem_reduces_kernel_rows_in_quads).
SLOW_ON_VNNI = ("odd_uint8", "rgb_stem_s4")


def _model_targets():
    def default(target, name):
        return name in EVERY_TARGET or (target == "vnni" and name not in SLOW_ON_VNNI)

    return [pytest.param(target, name, id=f"{target}-{name}", marks=[] if default(target, name) else [pytest.mark.slow])
            for target in ("vnni", "avx2", "sse") for name in sorted(MODELS)]


@pytest.mark.parametrize("target_name, name", _model_targets())
def test_int8_model_bit_exact_vs_tvm_generic(references, target_name, name):
    target = dot_target(target_name)  # skips first: no reference is computed for a target that cannot run here
    mod, inputs, ref = references[name]
    out, lib = _build_run(mod, inputs, target)
    np.testing.assert_array_equal(out, ref)
    if target_name == "vnni":
        assert "vpdpbusd" in lib.get_lib().get_source("asm")


def test_int8_model_opt_level2_uses_unpacked_templates(references):
    # Without AlterOpLayout the plain nn.conv2d / nn.dense rows pack inside the kernel.
    mod, inputs, ref = references["odd_int8"]
    out, lib = _build_run(mod, inputs, dot_target("vnni"), opt_level=2)
    np.testing.assert_array_equal(out, ref)
    assert "vpdpbusd" in lib.get_lib().get_source("asm")


def _optimized(mod, target, fuse=True):
    with tvm.transform.PassContext(opt_level=3, disabled_pass=[] if fuse else ["FuseOps"]):
        opt, _ = relay.optimize(mod, target=target)
    return opt


def _calls(mod):
    calls = []
    relay.analysis.post_order_visit(
        mod["main"], lambda n: calls.append(n) if isinstance(n, relay.Call) and isinstance(n.op, tvm.ir.Op) else None
    )
    return calls


def test_vnni_graph_is_packed_with_folded_layouts():
    mod, _ = _odd_net("int8")
    calls = _calls(_optimized(mod, "llvm -mcpu=znver4", fuse=False))
    convs = [c for c in calls if c.op.name == "nn.contrib_conv2d_NCHWc"]
    # 17 -> 20 channels (block 4), 24 channels (block 12); 16 output lanes.
    assert sorted(c.attrs.kernel_layout for c in convs) == ["OIHW1i16o4i", "OIHW3i16o4i"]
    assert all(isinstance(c.args[1], relay.Constant) for c in convs)  # kernel transforms folded
    dense = [c for c in calls if c.op.name == "nn.contrib_dense_pack"]
    assert [d.attrs.weight_layout for d in dense] == ["NC16n4c"] and isinstance(dense[0].args[1], relay.Constant)
    assert not any(c.op.name in ("nn.conv2d", "nn.dense") for c in calls)  # no second convolution
    assert all(c.args[0].checked_type.dtype == "uint8" for c in convs + dense)


def _convs(mod, target, opt_level=3, disabled=()):
    with tvm.transform.PassContext(opt_level=opt_level, disabled_pass=["FuseOps", *disabled]):
        opt, _ = relay.optimize(mod, target=target)
    return [c for c in _calls(opt) if c.op.name in ("nn.conv2d", "nn.contrib_conv2d_NCHWc")]


def test_rgb_stem_reduces_kernel_rows_in_quads():
    # 7x7 taps of 3 planes: 3 x 2 quads a kernel row instead of 7 taps of 4 channels (one a zero pad);
    # the image keeps its 3 planes (no channel pad, no layout transform) and the kernel folds.
    stem, conv = _convs(_rgb_stem_net()[0], "llvm -mcpu=znver4")
    assert (stem.op.name, stem.attrs.kernel_layout, stem.attrs.out_layout) == ("nn.conv2d", "OIHW16o4w", "NCHW16c")
    assert [int(d) for d in stem.args[0].checked_type.shape] == [1, 3, 35, 36]  # 29 + 3 + 3, one column more
    assert isinstance(stem.args[0], relay.Call) and stem.args[0].op.name == "nn.pad"
    assert [int(d) for d in stem.checked_type.shape] == [1, 2, 15, 15, 16]
    cut = _convs(_rgb_stem_net(size=32, stride=4)[0], "llvm -mcpu=znver4")[0]
    assert [int(d) for d in cut.args[0].checked_type.shape] == [1, 3, 38, 36]  # cut to the columns read
    assert [int(d) for d in cut.checked_type.shape] == [1, 2, 8, 8, 16]
    shifted = _convs(_rgb_stem_net(dtype="int8")[0], "llvm -mcpu=znver4")[0]  # int8 data, shifted to u8
    assert shifted.attrs.kernel_layout == "OIHW16o4w" and shifted.args[0].checked_type.dtype == "uint8"
    # AVX2 takes its kernels widened, in pairs of taps: int16, 8 output channels, the cast folded too.
    avx2 = _convs(_rgb_stem_net()[0], "llvm -mcpu=core-avx2")[0]
    assert (avx2.attrs.kernel_layout, avx2.attrs.out_layout) == ("OIHW8o2w", "NCHW8c")
    assert isinstance(avx2.args[1], relay.Constant) and avx2.args[1].data.shape == (4, 3, 7, 4, 8, 2)
    assert avx2.args[1].data.dtype == "int16"
    assert isinstance(stem.args[1], relay.Constant) and stem.args[1].data.shape == (2, 3, 7, 2, 16, 4)
    assert not stem.args[1].data.numpy()[:, :, :, 1, :, 3].any()  # the eighth tap of each row is zero
    assert conv.op.name == "nn.contrib_conv2d_NCHWc"


@pytest.mark.parametrize("target,opt_level,k,disabled", [
    ("llvm -mcpu=znver4", 3, 3, ()),                  # 3 planes x 1 quad = 3 x 4 channels: no fewer products
    ("llvm -mcpu=znver4", 2, 7, ()),                  # no AlterOpLayout to pack it: the plain template pads
    ("llvm -mcpu=znver4", 3, 7, ("AlterOpLayout",)),  # the same, disabled by the user
    ("llvm -mcpu=nehalem", 3, 7, ()),                 # measured on VNNI and AVX2 only
])
def test_rgb_stem_keeps_channel_blocks_elsewhere(target, opt_level, k, disabled):
    stem = _convs(_rgb_stem_net(k)[0], target, opt_level, disabled)[0]
    packed = opt_level == 3 and not disabled
    assert int(stem.args[0].checked_type.shape[1]) == (1 if packed else 4)  # NCHW4c blocks / 4 channels
    assert stem.attrs.kernel_layout != "OIHW16o4w"


def _stem_workloads(isa):
    """AutoTVM workloads of ``_rgb_stem_net``'s stem: its channel-padded conv and its row form."""
    from tvm_tcutils.dotprod.strategy import CONV2D_NCHW_TASK, CONV2D_ROWS_TASK

    k_dtype = isa.conv_kernel_dtype("int8")
    group = isa.kernel_group(k_dtype)
    padded = autotvm.task.args_to_workload(
        [tvm.te.placeholder((1, 4, 29, 29), "uint8"), tvm.te.placeholder((32, 4, 7, 7), "int8"),
         (2, 2), (3, 3, 3, 3), (1, 1), "int32"], CONV2D_NCHW_TASK)
    # 29x29 padded by 3 on a side (35x35), one column more for the last output's second quad.
    rows = autotvm.task.args_to_workload(
        [tvm.te.placeholder((1, 3, 35, 36), "uint8"),
         tvm.te.placeholder((32 // isa.lanes, 3, 7, 8 // group, isa.lanes, group), k_dtype),
         (2, 2), (0, 0, 0, 0), (1, 1), "int32"], CONV2D_ROWS_TASK)
    return padded, rows


def _record(task, config, seconds=1e-4):
    import time

    return (autotvm.measure.MeasureInput(task.target, task, config),
            autotvm.measure.MeasureResult((seconds,), 0, 0.0, time.time()))


def _other_tile(space, than):
    """A config of ``space`` whose tiles differ from ``than``'s."""
    from tvm_tcutils.tuning import valid_indexes

    configs = (space.get(i) for i in valid_indexes(space))
    return next(c for c in configs if c["tile_ow"].val != than["tile_ow"].val and c["tile_oh"].val > 1)


def _built_config(mod, target, records, workload):
    with autotvm.apply_history_best(records) as context:
        with tvm.transform.PassContext(opt_level=3):
            relay.build(mod, target=target)
        return context.query(tvm.target.Target(target), workload)


@pytest.mark.parametrize("target_name,data_dtype", [("vnni", "uint8"), ("vnni", "int8"), ("avx2", "uint8")])
def test_rgb_stem_is_extracted_and_tuned_in_the_row_form_the_build_runs(target_name, data_dtype):
    # AutoTVM extracts with AlterOpLayout off, where the stem is padded to 4 channels; the build packs it
    # in the row form, so the extracted task is the row form's (a config of the padded conv made the
    # AVX2 stem 15 % slower) and its record reaches the build.
    from tvm_tcutils.dotprod.isa import for_target
    from tvm_tcutils.tuning import default_config_index, extract_tasks

    target = dot_target(target_name)
    padded, rows = _stem_workloads(for_target(target))
    mod, _ = _rgb_stem_net(dtype=data_dtype)
    tasks = extract_tasks(mod, {}, target)
    workloads = [t.workload for t in tasks]
    assert rows in workloads and padded not in workloads
    assert all(int(t.args[0][1][1]) != 4 for t in tasks)  # no 4-channel conv task left
    stem = tasks[workloads.index(rows)]
    fallback = stem.config_space.get(default_config_index(stem))
    tuned = _other_tile(stem.config_space, fallback)
    carried = _built_config(mod, target, [_record(stem, tuned)], rows)
    assert not carried.is_fallback and carried.to_json_dict()["entity"] == tuned.to_json_dict()["entity"]


def test_rgb_stem_row_form_keeps_its_own_record_and_takes_an_old_logs_padded_one():
    # Logs from before the row form was extracted hold the padded conv's task: its config still carries
    # to the row form, but never over a record of the row form itself.
    from tvm_tcutils.dotprod.isa import for_target

    target = dot_target("vnni")
    padded, rows = _stem_workloads(for_target(target))
    mod, _ = _rgb_stem_net()
    old = autotvm.task.create(padded[0], padded[1:], target)
    new = autotvm.task.create(rows[0], rows[1:], target)
    old_cfg = _other_tile(old.config_space, old.config_space.get(0))
    new_cfg = _other_tile(new.config_space, old_cfg)
    assert new_cfg.to_json_dict()["entity"] != old_cfg.to_json_dict()["entity"]
    for records, want in (([_record(old, old_cfg)], old_cfg),
                          ([_record(old, old_cfg, 1e-5), _record(new, new_cfg)], new_cfg)):
        got = _built_config(mod, target, records, rows)
        assert got.to_json_dict()["entity"] == want.to_json_dict()["entity"]


def test_extraction_of_a_real_four_channel_conv_keeps_its_task():
    # Only stems that take the row form swap their task: a conv with 4 input channels keeps its own.
    from tvm_tcutils.tuning import extract_tasks

    x = relay.var("x", shape=(1, 4, 29, 29), dtype="uint8")
    w = relay.const(np.random.default_rng(0).integers(-8, 8, (32, 4, 7, 7)).astype("int8"))
    conv = relay.nn.conv2d(x, w, strides=(2, 2), padding=(3, 3), channels=32, kernel_size=(7, 7),
                           out_dtype="int32")
    tasks = extract_tasks(tvm.IRModule.from_expr(relay.Function([x], conv)), {}, dot_target("vnni"))
    assert [(t.name, int(t.args[0][1][1])) for t in tasks] == [("tcutils.conv2d_nchw_dot", 4)]


@pytest.mark.parametrize("const_weights", [True, False])
def test_avx2_graph_packs_a_widened_folded_kernel(const_weights):
    # AVX2's conv2d takes its kernel as int16 pairs: the cast folds into the constant with the
    # layout transform (no run-time widening); a kernel given as a parameter is widened in the graph.
    mod, inputs = _odd_net("int8", const_weights)
    calls = _calls(_optimized(mod, dot_target("avx2"), fuse=False))
    convs = [c for c in calls if c.op.name == "nn.contrib_conv2d_NCHWc"]
    assert sorted(c.attrs.kernel_layout for c in convs) == ["OIHW2i8o2i", "OIHW4i8o2i"]  # blocks 4 and 8
    assert all(c.args[1].checked_type.dtype == "int16" for c in convs)
    assert all(isinstance(c.args[1], relay.Constant) for c in convs) == const_weights
    dense = [c for c in calls if c.op.name == "nn.contrib_dense_pack"]
    assert [d.attrs.weight_layout for d in dense] == ["NC8n4c"] and dense[0].args[1].checked_type.dtype == "int8"


def test_extract_tasks_finds_templates():
    mod, _ = _odd_net("int8")
    for target in ("llvm -mcpu=znver4", HEXAGON):
        tasks = autotvm.task.extract_from_program(mod, {}, target=target)
        names = sorted(t.name for t in tasks)
        assert names == ["tcutils.conv2d_nchw_dot", "tcutils.conv2d_nchw_dot", "tcutils.dense_dot"], (target, names)


def test_hexagon_hooks_produce_packed_graph_with_right_numerics(references):
    mod, inputs, ref = references["odd_int8"]
    with tvm.target.Target(HEXAGON), tvm.transform.PassContext(opt_level=3):
        packed = tvm.transform.Sequential([
            relay.transform.InferType(), relay.transform.Legalize(), relay.transform.AlterOpLayout(),
            relay.transform.FoldConstant(),
        ])(mod)
    calls = _calls(packed)
    convs = [c for c in calls if c.op.name == "nn.contrib_conv2d_NCHWc"]
    assert sorted(c.attrs.kernel_layout for c in convs) == ["OIHW5i32o4i", "OIHW6i32o4i"]
    # HVX multiplies i8 x i8 natively: no shift, no compensation.
    assert all(c.args[0].checked_type.dtype == "int8" for c in convs)
    assert not any(c.op.name == "bitwise_xor" for c in calls)
    assert [c.attrs.weight_layout for c in calls if c.op.name == "nn.contrib_dense_pack"] == ["NC32n4c"]
    # The hexagon graph's numerics, run through the (all-signedness) AVX2 kernels.
    out, _ = _build_run(packed, inputs, dot_target("avx2"))
    np.testing.assert_array_equal(out, ref)


def test_legalize_delegates_what_it_does_not_handle():
    from tvm_tcutils.dotprod import strategy as dp

    x = relay.var("x", shape=(1, 8, 8, 8), dtype="int8")
    w = relay.var("w", shape=(8, 8, 3, 3), dtype="int8")
    grouped = relay.nn.conv2d(x, relay.var("g", shape=(8, 4, 3, 3), dtype="int8"), groups=2, out_dtype="int32")
    fp = relay.nn.conv2d(relay.var("f", shape=(1, 8, 8, 8)), relay.var("k", shape=(8, 8, 3, 3)))
    for call in (grouped, fp, relay.nn.conv2d(x, w, out_dtype="int32")):
        call = relay.transform.InferType()(tvm.IRModule.from_expr(call))["main"].body
        types = [a.checked_type for a in call.args] + [call.checked_type]
        with tvm.target.Target("llvm"):  # no dot-product ISA
            assert dp.legalize_conv2d(call.attrs, call.args, types) is None
        if call is not grouped and types[0].dtype == "float32":
            with tvm.target.Target("llvm -mcpu=znver4"):
                assert dp.legalize_conv2d(call.attrs, call.args, types) is None


def test_qnn_requantize_fused_into_packed_conv():
    mod, _ = _qnn_net()
    opt = _optimized(mod, "llvm -mcpu=znver4")
    fused = []

    def collect(node):
        if isinstance(node, relay.Function) and node.attrs and "Primitive" in node.attrs:
            ops = []
            relay.analysis.post_order_visit(
                node,
                lambda n: ops.append(n.op.name) if isinstance(n, relay.Call) and isinstance(n.op, tvm.ir.Op) else None,
            )
            fused.append(ops)

    relay.analysis.post_order_visit(opt["main"], collect)
    convs = [ops for ops in fused if "nn.contrib_conv2d_NCHWc" in ops]
    assert len(convs) == 2
    # Each conv's group ends in the requantize (clip + cast to int8), in the conv's packed layout.
    assert all("clip" in ops and ops[-1] in ("cast", "add") and "layout_transform" not in ops for ops in convs)
    assert not any("qnn" in op for ops in fused for op in ops)
    assert any("nn.contrib_dense_pack" in ops and "clip" in ops for ops in fused)


def _transform_impl(target: str, shape, dtype: str, src: str = "NCHW", dst: str = "NCHW8c") -> str:
    from tvm import te
    from tvm.relay.backend import te_compiler

    x = relay.var("x", shape=shape, dtype=dtype)
    call = relay.layout_transform(x, src, dst)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], call)))
    call = mod["main"].body
    with tvm.target.Target(target):
        impl, _ = te_compiler.select_implementation(
            call.op, call.attrs, [te.placeholder(shape, dtype)], call.checked_type, tvm.target.Target(target))
    return impl.name


@pytest.mark.parametrize("target,shape,dtype,src,dst,expected", [
    ("llvm -mcpu=core-avx2", (1, 64, 8, 8), "uint8", "NCHW", "NCHW8c", "layout_transform_bytes.tcutils"),
    ("llvm -mcpu=znver4", (1, 4, 8, 8, 16), "int8", "NCHW16c", "NCHW", "layout_transform_bytes.tcutils"),
    ("llvm -mcpu=core-avx2", (1, 64, 8, 8), "float32", "NCHW", "NCHW8c", "layout_transform.generic"),
    ("llvm -mcpu=core-avx2", (1, 64, 7, 7), "uint8", "NCHW", "NCHW8c", "layout_transform_bytes.tcutils"),
    ("llvm -mcpu=core-avx2", (1, 64, 37, 37), "uint8", "NCHW", "NCHW8c", "layout_transform_bytes.tcutils"),
    ("llvm -mcpu=core-avx2", (1, 8, 8, 8, 8), "uint8", "NCHW8c", "NCHW16c", "layout_transform.generic"),
    ("llvm", (1, 64, 8, 8), "uint8", "NCHW", "NCHW8c", "layout_transform.generic"),
    (HEXAGON, (1, 64, 8, 8), "uint8", "NCHW", "NCHW32c", "layout_transform.generic"),
])
def test_layout_transform_row_takes_only_8bit_channel_blocks_on_x86(target, shape, dtype, src, dst, expected):
    assert _transform_impl(target, shape, dtype, src, dst) == expected


def test_whole_op_graph_uses_byte_shuffle_transforms():
    # Both u8 transforms around the packed conv are standalone and take the byte-shuffle row.
    mod, _ = _qnn_whole_op()
    opt = _optimized(mod, "llvm -mcpu=core-avx2", fuse=False)
    transforms = [c for c in _calls(opt) if c.op.name == "layout_transform"]
    assert sorted((c.attrs.src_layout, c.attrs.dst_layout) for c in transforms) == [
        ("NCHW", "NCHW8c"), ("NCHW8c", "NCHW")]
    for call in transforms:
        shape = [int(v) for v in call.args[0].checked_type.shape]
        assert call.args[0].checked_type.dtype == "uint8"
        assert _transform_impl("llvm -mcpu=core-avx2", shape, "uint8", call.attrs.src_layout,
                               call.attrs.dst_layout) == "layout_transform_bytes.tcutils"
