"""Relay-level wiring of the tensor-core kernels for CUDA (strategy, legalize, alter-op, AutoTVM).

The HWNC models are prepared with the package's ``prepare_for_tensorcore``;
TVM's own tools (``ConvertLayout`` to HWNC under ``LayoutConfig(skip_layers=[0])``
and ``relay.transform.recast``, the workflow of apache/tvm#6748) serve as the
oracle of one test. No CUDA code is generated: strategy selection, Relay passes
and AutoTVM task extraction need none.
"""
import collections
import logging
import types

import numpy as np
import pytest
import tvm
from tvm import autotvm, relay, te
from tvm.relay.testing import resnet

import tvm_tcutils
from tvm_tcutils import cuda_subbyte
from tvm_tcutils import registry
from tvm_tcutils.tensorcore import strategy as tc
from tvm_tcutils.tensorcore import rules
from tvm_tcutils.tensorcore.topi import conv2d_hwnc

SM80 = "cuda -arch=sm_80"
CONV2D = relay.op.get("nn.conv2d")


def prepare_hwnc(mod, dtype):
    """HWNC layout and ``dtype`` for every conv2d that qualifies (the package's preparation, 'auto')."""
    prepared, skipped = tvm_tcutils.prepare_for_tensorcore(mod, dtype, "int32")
    assert [layer.index for layer in skipped] == [0]  # ResNet's 3-channel stem
    return prepared


def tvm_prepare_hwnc(mod, dtype, skip_layers=(0,)):
    """The same with TVM's own passes (apache/tvm#6748), skipping ``skip_layers``: the oracle."""
    with relay.transform.LayoutConfig(skip_layers=list(skip_layers)):
        with tvm.transform.PassContext(opt_level=3):
            mod = relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)
    mod = relay.transform.recast(mod, dtype, "int32", skip_layers=list(skip_layers))
    return relay.transform.InferType()(mod)


@pytest.fixture(scope="module")
def resnet50():
    """ResNet-50 (batch 8, 64x64 images: the same layer kinds, smaller activations)."""
    return resnet.get_workload(num_layers=50, batch_size=8, image_shape=(3, 64, 64))


@pytest.fixture(scope="module")
def resnet50_hwnc(resnet50):
    """``{dtype: (prepared ResNet-50, its tc.implementations rows for sm_80)}``: prepared once per dtype
    for the tests below, which only read them (neither the preparation nor the rows mutate anything)."""
    prepared = {dtype: prepare_hwnc(resnet50[0], dtype) for dtype in ("int4", "int8")}
    return {dtype: (mod, tc.implementations(mod, SM80)) for dtype, mod in prepared.items()}


@pytest.fixture(scope="module")
def resnet18():
    """ResNet-18 (batch 8, 64x64 images), for AutoTVM's task extraction: 20 HWNC layers, 11 of them distinct."""
    return resnet.get_workload(num_layers=18, batch_size=8, image_shape=(3, 64, 64))


def _calls(expr, op_name):
    found = []
    relay.analysis.post_order_visit(
        expr, lambda n: found.append(n) if isinstance(n, relay.Call) and getattr(n.op, "name", "") == op_name else None
    )
    return found


def _select(call, target):
    inputs = [te.placeholder([int(v) for v in a.checked_type.shape], a.checked_type.dtype) for a in call.args]
    with tvm.target.Target(target):
        impl, outs = relay.backend.te_compiler.select_implementation(
            call.op, call.attrs, inputs, call.checked_type, tvm.target.Target(target)
        )
    return impl.name, outs


def _workload_key(call):
    data, kernel = (tuple(int(v) for v in a.checked_type.shape) for a in call.args)
    attrs = call.attrs
    return data, kernel, tuple(attrs.strides), tuple(attrs.padding), tuple(attrs.dilation)


def _conv_module(dshape, kshape, dtype, layout="HWNC", kernel_layout="HWOI", padding=1, const_kernel=True):
    x = relay.var("x", shape=dshape, dtype=dtype)
    rng = np.random.default_rng(0)
    if const_kernel:
        w = relay.const(rng.integers(-8, 8, size=kshape).astype(dtype if "int4" not in dtype else "int8"))
        if "int4" in dtype:
            w = relay.cast(w, dtype)
        params = [x]
    else:
        w = relay.var("w", shape=kshape, dtype=dtype)
        params = [x, w]
    y = relay.nn.conv2d(x, w, padding=padding, kernel_size=kshape[:2] if kernel_layout.startswith("HW") else kshape[2:],
                        data_layout=layout, kernel_layout=kernel_layout, out_dtype="int32")
    return relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function(params, y)))


def _legalize(mod, target=SM80):
    with tvm.target.Target(target):
        return relay.transform.InferType()(relay.transform.Legalize()(mod))


# --------------------------------------------------------------------------
# Strategy selection on ResNet-50.
# --------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_resnet50_hwnc_layers_select_tensorcore_and_first_layer_does_not(resnet50_hwnc, dtype):
    mod, _ = resnet50_hwnc[dtype]
    convs = _calls(mod["main"], "nn.conv2d")
    assert len(convs) == 53
    names = collections.Counter()
    for index, call in enumerate(convs):
        name, _ = _select(call, SM80)
        names[name] += 1
        if index == 0:
            assert call.attrs.data_layout == "NCHW" and call.args[0].checked_type.dtype == "float32"
            assert name != tc.CONV2D_IMPL and "tensorcore" not in name, name
        else:
            assert call.attrs.data_layout == "HWNC" and call.args[0].checked_type.dtype == dtype
            assert name == tc.CONV2D_IMPL, (index, name)
    assert names[tc.CONV2D_IMPL] == 52


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_tvm_own_preparation_gives_the_same_strategy_choices(resnet50, resnet50_hwnc, dtype):
    """Oracle: TVM's LayoutConfig/ConvertLayout/recast workflow, skipping the stem, picks the same per layer."""
    _, rows = resnet50_hwnc[dtype]  # the package's preparation, rows from tc.implementations
    theirs = tvm_prepare_hwnc(resnet50[0], dtype)
    assert len(rows) == 54 and rows[-1][0] == "nn.dense"
    assert rows == tc.implementations(theirs, SM80)
    assert sum(row[3] == tc.CONV2D_IMPL for row in rows) == 52


def test_autotvm_extracts_one_task_per_distinct_hwnc_layer(resnet18, resnet50_hwnc):
    # ResNet-18, not ResNet-50: the extraction lowers every layer of the model (26 s for ResNet-50's 53
    # layers on 2 cores, 6 s for ResNet-18's 21). ResNet-18's HWNC layers repeat just as well (20 layers,
    # 11 distinct: 3x3 and 1x1, strided or not), which is what one task per distinct layer needs.
    mod = prepare_hwnc(resnet18[0], "int4")
    layers = [_workload_key(c) for c in _calls(mod["main"], "nn.conv2d") if c.attrs.data_layout == "HWNC"]
    hwnc = set(layers)
    # Without params the weights stay inputs: the same tasks, without minutes of constant folding.
    tasks = autotvm.task.extract_from_program(mod["main"], target=SM80, params=None, ops=(CONV2D,))
    ours = [t for t in tasks if t.name == conv2d_hwnc.TASK]
    assert len(layers) == 20 and len(ours) == len(hwnc) == 11
    assert {(t.args[0][1], t.args[1][1]) for t in ours} == {(k[0], k[1]) for k in hwnc}
    assert all("HWNC" not in t.name and "hwnc" not in t.name for t in tasks if t not in ours)
    spaces = [(task.args, task.config_space) for task in ours]
    # ResNet-50's 19 distinct HWNC workloads (its bottleneck 1x1 layers included) get such config spaces
    # too: the extraction creates each task from its workload, as autotvm.task.create does here.
    workloads = {row[4] for row in resnet50_hwnc["int4"][1] if row[3] == tc.CONV2D_IMPL}
    assert len(workloads) == 19
    spaces += [(w[1:], autotvm.task.create(w[0], w[1:], SM80).config_space) for w in sorted(workloads)]
    for args, space in spaces:
        assert len(space) >= 64, (args, len(space))
        assert {"wmma_m", "tile_rows", "tile_cols", "chunk"} <= set(space.space_map)


def test_dense_selects_tensorcore_when_tiles_fit():
    def dense_call(batch, dtype):
        x = relay.var("x", shape=(batch, 64), dtype=dtype)
        w = relay.var("w", shape=(32, 64), dtype=dtype)
        mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.nn.dense(x, w, out_dtype="int32")))
        return _calls(mod["main"], "nn.dense")[0]

    assert _select(dense_call(16, "int8"), SM80)[0] == tc.DENSE_IMPL
    assert _select(dense_call(8, "int4"), SM80)[0] == tc.DENSE_IMPL
    assert _select(dense_call(3, "int8"), SM80)[0] != tc.DENSE_IMPL  # batch 3 fits no tile
    assert _select(dense_call(16, "int8"), "cuda -arch=sm_70")[0] != tc.DENSE_IMPL  # no int8 tensor cores


# --------------------------------------------------------------------------
# Alter-op: the constant kernel is packed at compile time.
# --------------------------------------------------------------------------
def _optimized_convs(mod, target=SM80, params=None):
    with tvm.transform.PassContext(opt_level=3):
        opt, _ = relay.optimize(mod, target=target, params=params)
    rows = []
    for node in _all_calls(opt["main"]):
        convs = _calls(node.op, "nn.conv2d") if isinstance(node.op, relay.Function) else []
        if convs:
            # The fused function's argument that feeds the kernel parameter.
            params = list(node.op.params)
            kernel = convs[0].args[1]
            rows.append((convs[0].attrs, node.args[params.index(kernel)] if kernel in params else kernel))
    return rows


def _all_calls(expr):
    found = []
    relay.analysis.post_order_visit(expr, lambda n: found.append(n) if isinstance(n, relay.Call) else None)
    return found


@pytest.mark.parametrize("dtype,batch,layout", [("int8", 16, "HWOI16o16i"), ("int8", 8, "HWOI32o16i"),
                                                 ("uint8", 8, "HWOI32o16i")])
def test_alter_op_packs_constant_kernel_once(dtype, batch, layout):
    mod = _conv_module((8, 8, batch, 64), (3, 3, 64, 64), dtype)
    rows = _optimized_convs(mod)
    assert len(rows) == 1
    attrs, kernel = rows[0]
    assert attrs.kernel_layout == layout
    # The packed kernel is a folded constant: no packing runs per inference.
    assert isinstance(kernel, relay.Constant), type(kernel)
    kshape = tuple(kernel.data.shape)
    assert len(kshape) == 6 and kshape[:2] == (3, 3) and kshape[2] * kshape[4] == 64


@pytest.mark.parametrize("dtype,cin", [("int4", 64), ("uint4", 64), ("int4", 60)])
def test_four_bit_constant_kernels_are_folded_right_and_packed_by_the_kernel(dtype, cin):
    """TVM's CPU code generator, which FoldConstant runs, misplaces 4-bit values past the first 16: the
    legalization folds the cast (and the channel padding) in NumPy, and alter-op leaves the layout alone."""
    mod = _conv_module((8, 8, 8, cin), (3, 3, 64, cin), dtype)
    cast = _calls(mod["main"], "cast")[0]
    want = cast.args[0].data.numpy().astype(np.int64) & 15
    if dtype == "int4":
        want = np.where(want >= 8, want - 16, want)
    with tc.pad_limit(0.5):
        rows = _optimized_convs(mod)
    attrs, kernel = rows[0]
    assert attrs.kernel_layout == "HWOI"
    assert isinstance(kernel, relay.Constant) and str(kernel.data.dtype) == dtype
    got = cuda_subbyte.subbyte_values(kernel.data)
    assert got.shape == (3, 3, 64, 64)
    np.testing.assert_array_equal(got[..., :cin], want)
    assert not got[..., cin:].any()  # zero padding


@pytest.mark.parametrize("dtype,k", [("int4", 64), ("int4", 60), ("uint4", 60)])
def test_four_bit_constant_dense_weights_are_folded_right_also_when_tvm_pads_them(dtype, k):
    """The dense legalization folds the cast in NumPy; TVM's own then pads K to 32 (60 -> 64), also in NumPy."""
    rng = np.random.default_rng(0)
    low, high = (-8, 7) if dtype == "int4" else (0, 15)
    weight = rng.integers(low, high + 1, size=(32, k)).astype("int8" if dtype == "int4" else "uint8")
    x = relay.var("x", shape=(16, k), dtype=str(weight.dtype))
    y = relay.nn.dense(relay.cast(x, dtype), relay.cast(relay.const(weight), dtype), out_dtype="int32")
    with tvm.transform.PassContext(opt_level=3):
        opt, _ = relay.optimize(tvm.IRModule.from_expr(relay.Function([x], y)), target=SM80)
    consts = []
    relay.analysis.post_order_visit(opt["main"], lambda n: consts.append(n) if isinstance(n, relay.Constant) else None)
    (kernel,) = [c for c in consts if str(c.data.dtype) == dtype]
    got = cuda_subbyte.subbyte_values(kernel.data)
    assert got.shape == (32, -(-k // 32) * 32)
    np.testing.assert_array_equal(got[:, :k], weight)
    assert not got[:, k:].any()


def test_alter_op_leaves_a_non_constant_kernel_alone_with_a_log(caplog):
    mod = _conv_module((8, 8, 8, 64), (3, 3, 64, 64), "int8", const_kernel=False)
    with caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        rows = _optimized_convs(mod)
    assert rows[0][0].kernel_layout == "HWOI"
    assert "not a constant" in caplog.text and "params" in caplog.text
    # Still the tensor-core implementation, packing inside the kernel.
    conv = _calls(mod["main"], "nn.conv2d")[0]
    assert _select(conv, SM80)[0] == tc.CONV2D_IMPL


# --------------------------------------------------------------------------
# Legalize: padding to tiles, or the NHWC path with a reason.
# --------------------------------------------------------------------------
def test_legalize_pads_channels_when_cheap_and_keeps_the_output_type(caplog):
    mod = _conv_module((6, 6, 8, 60), (3, 3, 30, 60), "int8")  # in 60 -> 64, out 30 -> 32
    with caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        legal = _legalize(mod)
    assert legal["main"].ret_type == mod["main"].ret_type
    conv = _calls(legal["main"], "nn.conv2d")[0]
    assert conv.attrs.data_layout == "HWNC"
    assert tuple(conv.args[0].checked_type.shape)[2:] == (8, 64)
    assert int(conv.attrs.channels) == 32
    assert _calls(legal["main"], "strided_slice") and _calls(legal["main"], "nn.pad")
    assert _select(conv, SM80)[0] == tc.CONV2D_IMPL
    assert "zero-padded" in caplog.text


def test_legalized_padding_computes_the_same_convolution():
    """Pad + conv + slice equals the original conv (both run as NCHW on the CPU)."""
    mod = _conv_module((5, 5, 8, 60), (3, 3, 30, 60), "int8")
    legal = _legalize(mod)
    x = np.random.default_rng(1).integers(-128, 128, size=(5, 5, 8, 60)).astype("int8")
    outs = []
    for m in (mod, legal):
        with tvm.transform.PassContext(opt_level=3):
            m = relay.transform.ConvertLayout({"nn.conv2d": ["NCHW", "OIHW"]})(m)
        outs.append(relay.create_executor("graph", mod=m, target="llvm").evaluate()(x).numpy())
    np.testing.assert_array_equal(outs[0], outs[1])


@pytest.mark.parametrize("dtype,batch,cin,cout", [("int8", 16, 64, 16), ("int8", 32, 16, 8), ("int4", 8, 32, 8)])
def test_legalize_leaves_fitting_layers_unpadded(dtype, batch, cin, cout):
    """TVM's own CUDA legalization would pad int8 16x64->16 to 32 output channels; ours keeps it."""
    mod = _conv_module((6, 6, batch, cin), (3, 3, cout, cin), dtype)
    legal = _legalize(mod)
    if dtype == "int4":  # the same layer, its constant kernel's cast folded (in NumPy)
        assert not _calls(legal["main"], "cast") and not _calls(legal["main"], "nn.pad")
        assert legal["main"].ret_type == mod["main"].ret_type
        assert isinstance(_calls(legal["main"], "nn.conv2d")[0].args[1], relay.Constant)
    else:
        assert tvm.ir.structural_equal(legal, mod)
    assert _select(_calls(legal["main"], "nn.conv2d")[0], SM80)[0] == tc.CONV2D_IMPL


def test_legalize_moves_expensive_padding_to_nhwc_and_says_why(caplog):
    mod = _conv_module((6, 6, 8, 60), (3, 3, 30, 60), "int8")
    with tc.pad_limit(0.0), caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        legal = _legalize(mod)
    assert legal["main"].ret_type == mod["main"].ret_type
    (conv,) = _calls(legal["main"], "nn.conv2d")
    assert conv.attrs.data_layout == "NHWC"
    assert "max_pad_fraction=0" in caplog.text and "NHWC" in caplog.text
    name, _ = _select(conv, SM80)
    assert name != tc.CONV2D_IMPL


def test_pad_limit_scope_and_setting():
    assert tc.max_pad_fraction() == tc.DEFAULT_PAD_FRACTION
    with tc.pad_limit(0.5):
        assert tc.max_pad_fraction() == 0.5
        with tc.pad_limit(0):
            assert tc.max_pad_fraction() == 0
        assert tc.max_pad_fraction() == 0.5
    assert tc.max_pad_fraction() == tc.DEFAULT_PAD_FRACTION
    for bad in (-0.1, "0.3", None, float("nan")):
        with pytest.raises(ValueError, match="max_pad_fraction"):
            tc.set_max_pad_fraction(bad)


# --------------------------------------------------------------------------
# Bad input and delegation.
# --------------------------------------------------------------------------
def test_float16_hwnc_goes_to_nhwc_with_a_reason(caplog):
    x = relay.var("x", shape=(8, 8, 8, 64), dtype="float16")
    w = relay.var("w", shape=(3, 3, 64, 64), dtype="float16")
    y = relay.nn.conv2d(x, w, padding=1, kernel_size=(3, 3), data_layout="HWNC", kernel_layout="HWOI")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, w], y)))
    with caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        legal = _legalize(mod)
    (conv,) = _calls(legal["main"], "nn.conv2d")
    assert conv.attrs.data_layout == "NHWC"
    assert "float16 has no integer tensor-core type" in caplog.text
    assert _select(conv, SM80)[0] != tc.CONV2D_IMPL


@pytest.mark.parametrize("layout,kernel_layout,dshape,kshape", [
    ("NHWC", "HWIO", (8, 8, 8, 64), (3, 3, 64, 64)),
    ("NCHW", "OIHW", (8, 64, 8, 8), (64, 64, 3, 3)),
])
def test_other_layouts_are_left_to_tvm(layout, kernel_layout, dshape, kshape):
    mod = _conv_module(dshape, kshape, "int8", layout=layout, kernel_layout=kernel_layout)
    ours = _legalize(mod)
    name, _ = _select(_calls(ours["main"], "nn.conv2d")[0], SM80)
    assert name != tc.CONV2D_IMPL
    registry.unregister()
    try:
        theirs = _legalize(mod)
        name_theirs, _ = _select(_calls(theirs["main"], "nn.conv2d")[0], SM80)
    finally:
        registry.register()
    assert tvm.ir.structural_equal(ours, theirs)
    assert name == name_theirs


def test_target_without_tensor_cores_goes_to_nhwc_and_hints_at_arch(caplog):
    mod = _conv_module((6, 6, 8, 64), (3, 3, 64, 64), "int4")
    with caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        legal = _legalize(mod, target="cuda")  # TVM fills in sm_50 without a GPU
    assert _calls(legal["main"], "nn.conv2d")[0].attrs.data_layout == "NHWC"
    assert "-arch" in caplog.text and "sm_75" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="tvm_tcutils.tensorcore"):
        _legalize(mod, target="cuda -arch=sm_72")  # int8 would do, int4 not
    assert "int4 tensor cores need sm_75 or newer, target has sm_72" in caplog.text


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
@pytest.mark.parametrize("shape", [(8, 64, 64), (1, 60, 30)], ids=["fits", "padded"])
def test_int4_for_sm_90_is_a_value_error_not_the_nhwc_path(dtype, shape):
    # The rules refuse int4 there, and TVM's CUDA conv2d has no 4-bit path to move the layer to (an int4
    # NHWC conv2d aborts TVM 0.19's build, or fails in its winograd transform): legalization says so.
    batch, cin, cout = shape
    mod = _conv_module((6, 6, batch, cin), (3, 3, cout, cin), dtype)
    with pytest.raises(ValueError) as caught:
        _legalize(mod, target="cuda -arch=sm_90")
    message = str(caught.value)
    assert f"{dtype}: {dtype} on sm_90 and newer (target has sm_90): no 4-bit MMA instruction" in message
    assert "TVM's CUDA conv2d has no" in message and "dtype='int8'" in message
    legal = _legalize(mod, target="cuda -arch=sm_89")  # the same layer for Ada: the package's kernel
    assert all(conv.attrs.data_layout == "HWNC" for conv in _calls(legal["main"], "nn.conv2d"))
    legal = _legalize(_conv_module((6, 6, batch, cin), (3, 3, cout, cin), "int8"), target="cuda -arch=sm_90")
    assert all(conv.attrs.data_layout == "HWNC" for conv in _calls(legal["main"], "nn.conv2d"))  # int8: as before


def test_missing_arch_error_says_to_add_it():
    fake = types.SimpleNamespace(attrs={}, kind=types.SimpleNamespace(name="cuda"))
    if tvm_tcutils.capabilities()["cuda_device"]:
        pytest.skip("a local GPU answers the arch question")
    with pytest.raises(rules.MissingArchError, match=r"-arch=sm_80"):
        rules.target_arch(fake)
    assert rules.target_arch(tvm.target.Target("cuda -arch=sm_90a")) == 90
    with pytest.raises(ValueError, match="sm_XY"):  # TVM itself rejects such targets; a stand-in
        rules.target_arch(types.SimpleNamespace(attrs={"arch": "sm_eighty"}, kind=fake.kind))


# --------------------------------------------------------------------------
# relay.build with a tuned config, down to the CUDA code generator.
# --------------------------------------------------------------------------
@tvm.instrument.pass_instrument
class _CaptureTIR:
    """Keeps the TIR module as it enters host/device splitting (after all lowering)."""

    def __init__(self):
        self.mods = []

    def run_before_pass(self, mod, info):
        if info.name == "tir.SplitHostDevice":
            self.mods.append(mod)


def test_relay_build_with_a_tuned_config_lowers_wmma_until_codegen():
    mod = _conv_module((8, 8, 16, 64), (3, 3, 64, 64), "int8")
    target = tvm.target.Target(SM80)
    (task,) = [t for t in autotvm.task.extract_from_program(mod["main"], target=target, params={})
               if t.name == conv2d_hwnc.TASK]
    space = task.config_space
    # Not what the fallback picks (16x16x16; with 8x32x16 one warp holding both column tiles).
    tuned = space.get(next(i for i in range(len(space))
                           if space.get(i)["wmma_m"].val == 8 and space.get(i)["tile_cols"].size[1] == 2))
    record = (autotvm.measure.MeasureInput(target, task, tuned), autotvm.measure.MeasureResult((1e-4,), 0, 1.0, 0.0))
    capture = _CaptureTIR()
    with autotvm.task.ApplyHistoryBest([record]):
        # The tuned WMMA shape (8x32x16) decides the kernel packing.
        assert _optimized_convs(mod)[0][0].kernel_layout == "HWOI32o16i"
        with tvm.transform.PassContext(opt_level=3, instruments=[capture]):
            try:
                relay.build(mod, target=target)
            except tvm.error.TVMError as err:
                if tvm_tcutils.capabilities()["cuda_codegen"] or "target.build.cuda is not enabled" not in str(err):
                    raise
    seen = collections.Counter()

    def visit(node):
        if isinstance(node, tvm.tir.Call) and isinstance(node.op, tvm.ir.Op):
            seen[node.op.name] += 1
        elif isinstance(node, tvm.tir.AttrStmt) and node.attr_key == "thread_extent":
            seen[f"{node.node.thread_tag}={int(node.value)}"] += 1

    for lowered in capture.mods:
        for func in lowered.functions.values():
            tvm.tir.stmt_functor.post_order_visit(func.body, visit)
            for buf in getattr(func, "buffer_map", {}).values():
                if len(buf.shape) == 6:
                    seen["packed_kernel_param"] += 1
    assert seen["tir.tvm_mma_sync"] and seen["tir.tvm_load_matrix_sync"] and seen["tir.tvm_store_matrix_sync"]
    assert seen["packed_kernel_param"] == 1
    # The tuned config reached the compute of the re-laid-out workload too.
    assert seen["threadIdx.z=2"] and not seen["threadIdx.z=1"], seen


def test_implementations_reports_per_layer_after_legalization_without_mutating():
    mod = _conv_module((6, 6, 8, 60), (3, 3, 30, 60), "int8")  # padded by legalization
    before = mod.astext()
    rows = tc.implementations(mod, SM80, ops=("nn.conv2d",))
    assert mod.astext() == before
    ((op, layout, dtype, name, workload),) = rows
    assert (op, layout, dtype, name) == ("nn.conv2d", "HWNC", "int8", tc.CONV2D_IMPL)
    assert workload[0] == conv2d_hwnc.TASK and workload[1][1] == (6, 6, 8, 64)
    with tc.pad_limit(0):
        assert tc.implementations(mod, SM80, ops=("nn.conv2d",))[0][1] == "NHWC"
    with pytest.raises(TypeError, match="ops must be"):
        tc.implementations(mod, SM80, ops="nn.conv2d")


def test_demo_section_reports_tensorcore_layers(resnet18_model):
    from conftest import small_conv_net
    from tvm_tcutils.demo import SECTIONS
    from tvm_tcutils.tensorcore.demo import tensorcore_section

    assert f"{tensorcore_section.__module__}:{tensorcore_section.__name__}" in SECTIONS
    lines = tensorcore_section("resnet-18", *resnet18_model)
    assert lines[0] == "resnet-18 re-batched from 1 to 8"
    for line, dtype in zip(lines[1:], ("int4", "int8")):
        # The 3-channel stem is skipped by prepare_for_tensorcore and stays on TVM's float NCHW schedule.
        assert line.startswith(f"{dtype}: 20/21 conv2d layers on {tc.CONV2D_IMPL}, others on conv2d_nchw.cuda;")
        assert "; 11 AutoTVM tasks" in line and line.endswith("prepare_for_tensorcore skipped [0]")
    lines = tensorcore_section("small", small_conv_net(channels=32), {})
    assert lines[0] == "small re-batched from 1 to 8"
    assert lines[1].startswith(f"int4: 2/2 conv2d layers on {tc.CONV2D_IMPL}, others on -; 1 AutoTVM tasks")
