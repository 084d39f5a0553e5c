"""prepare_for_tensorcore and the count-layers / prepare commands."""
import functools
import os
import warnings

import pytest
import tvm
from tvm import relay

from conftest import run_cli, small_conv_net
import tvm_tcutils
from tvm_tcutils import LayoutConfig, layer_table, load_model, prepare_for_tensorcore, recast
from tvm_tcutils.tensorcore._graph import layer_calls, resolve_ops


@functools.lru_cache(maxsize=None)
def loaded(name):
    """``load_model(name)``, once per module: the tests only read the module and its params."""
    return load_model(name)


def model(name):
    return loaded(name)[0]


def _convs(mod):
    return layer_calls(relay.transform.InferType()(mod), resolve_ops("nn.conv2d", "ops"))


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_auto_skips_exactly_the_layers_that_do_not_qualify(dtype):
    mod = model("resnet-18")
    prepared, skipped = prepare_for_tensorcore(mod, dtype)
    rows = layer_table(mod, ["nn.conv2d"], dtype=dtype)
    assert [(s.index, s.reason) for s in skipped] == [(r.index, r.reason) for r in rows if not r.qualifies]
    assert [s.index for s in skipped] == [0]
    assert "3 input channels" in skipped[0].reason
    for i, call in enumerate(_convs(prepared)):
        data_type = call.args[0].checked_type
        if i == 0:
            assert (str(call.attrs.data_layout), data_type.dtype) == ("NCHW", "float32")
        else:
            assert (str(call.attrs.data_layout), str(call.attrs.kernel_layout)) == ("HWNC", "HWOI")
            assert (data_type.dtype, call.checked_type.dtype) == (dtype, "int32")
    assert prepared["main"].ret_type == mod["main"].ret_type


@pytest.mark.parametrize("target,skipped_layout,want", [
    ("cuda -arch=sm_80", "auto", ("NHWC", "HWIO")), (None, "auto", ("NCHW", "OIHW")),
    ("cuda -arch=sm_80", "keep", ("NCHW", "OIHW")), (None, "NHWC", ("NHWC", "HWIO")),
])
def test_skipped_layers_go_to_nhwc_for_cuda_and_compute_the_same(target, skipped_layout, want):
    """A float NCHW stem runs on TVM's untuned CUDA NCHW schedule (38 ms on an H200, 1 ms in NHWC)."""
    import numpy as np

    mod, params = loaded("resnet-18")
    prepared, skipped = prepare_for_tensorcore(mod, "int8", target=target, skipped_layout=skipped_layout)
    convs = _convs(prepared)
    assert (str(convs[0].attrs.data_layout), str(convs[0].attrs.kernel_layout)) == want
    assert convs[0].args[0].checked_type.dtype == "float32" and [s.index for s in skipped] == [0]
    assert all(str(c.attrs.data_layout) == "HWNC" for c in convs[1:])
    if want[0] == "NHWC":
        # The stem's output, which the int8 layers then truncate: same as in NCHW (CPU builds).
        kept, _ = prepare_for_tensorcore(mod, "int8", skipped_layout="keep")
        outs = []
        x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype("float32")
        for variant in (kept, prepared):
            stem = _convs(variant)[0]
            func = relay.Function(relay.analysis.free_vars(stem), stem)
            if stem.attrs.data_layout == "NHWC":
                func = relay.Function(func.params, relay.transpose(func.body, (0, 3, 1, 2)))
            with tvm.transform.PassContext(opt_level=3):
                lib = relay.build(tvm.IRModule.from_expr(func), "llvm", params=params)
            module = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cpu()))
            module.set_input("data", x)
            module.run()
            outs.append(module.get_output(0).numpy())
        np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-4)


def test_skipped_layout_must_be_a_choice():
    with pytest.raises(ValueError, match="skipped_layout must be one of auto, NHWC, keep, got 'NCHW'"):
        prepare_for_tensorcore(model("resnet-18"), "int8", skipped_layout="NCHW")


def test_explicit_list_is_the_manual_workflow():
    mod = model("resnet-18")
    skip = [0, 5, -1]
    prepared, skipped = prepare_for_tensorcore(mod, "int8", skip_layers=skip)
    assert [s.index for s in skipped] == [0, 5, 20]
    with LayoutConfig(skip_layers=skip, num_layers=21), tvm.transform.PassContext(opt_level=3):
        manual = relay.transform.ConvertLayout({"nn.conv2d": ["HWNC", "default"]})(mod)
    manual = relay.transform.InferType()(recast(manual, "int8", "int32", skip_layers=skip))
    assert tvm.ir.structural_equal(prepared, manual)


def test_auto_on_branchy_models_and_depthwise():
    mod = model("mobilenet")
    prepared, skipped = prepare_for_tensorcore(mod, "int8")
    rows = layer_table(mod, ["nn.conv2d"], dtype="int8")
    assert {s.index for s in skipped} == {r.index for r in rows if not r.qualifies}
    assert sum("groups=" in s.reason for s in skipped) == 13
    hwnc = [i for i, c in enumerate(_convs(prepared)) if str(c.attrs.data_layout) == "HWNC"]
    assert hwnc == [r.index for r in rows if r.qualifies]


def test_pad_fraction_moves_layers_in_and_out():
    mod = small_conv_net(channels=24)  # int4 pads 24 input channels to 32: +33% work
    assert [s.index for s in prepare_for_tensorcore(mod, "int4", pad_fraction=0.3).skipped] == [0, 1]
    assert prepare_for_tensorcore(mod, "int4", pad_fraction=0.5).skipped == []


def test_input_is_not_modified():
    # TVM's ConvertLayout and InferType re-annotate nodes the output shares with
    # the input (with the same types), so compare the IR, not the JSON bytes.
    mod = model("squeezenet1.1")
    snapshot = tvm.ir.load_json(tvm.ir.save_json(mod))
    main = mod["main"]
    prepare_for_tensorcore(mod, "int4")
    assert mod["main"].same_as(main)
    assert tvm.ir.structural_equal(mod, snapshot)
    assert tvm.ir.structural_equal(relay.transform.InferType()(mod), relay.transform.InferType()(snapshot))


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(dtype="float16"), ValueError, r"dtype must be one of \['int4', 'int8', 'uint4', 'uint8'\]"),
        (dict(out_dtype="int33x"), ValueError, "out_dtype"),
        (dict(skip_layers="none"), ValueError, "'auto' or a list"),
        (dict(skip_layers=[2]), ValueError, "out of range"),
        (dict(skip_layers=["0"]), TypeError, "skip_layers"),
    ],
)
def test_bad_input(kwargs, error, words):
    with pytest.raises(error, match=words):
        prepare_for_tensorcore(small_conv_net(), **kwargs)


def test_not_a_module_or_not_type_correct():
    with pytest.raises(TypeError, match="IRModule"):
        prepare_for_tensorcore(small_conv_net()["main"])
    x = relay.var("x", shape=(1, 3, 8, 8))
    bad = tvm.IRModule.from_expr(relay.nn.conv2d(x, relay.var("w", shape=(4, 5, 3, 3))))
    with pytest.raises(ValueError, match="mod does not type-check"):
        prepare_for_tensorcore(bad)


def test_count_layers_command():
    result = run_cli("count-layers", "resnet-18", "--ops", "nn.conv2d")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:2] == ["layer", "op"]
    assert len(lines) == 1 + 21 + 1
    assert "no: 3 input channels" in lines[1]
    assert lines[-1].startswith("21 layers of nn.conv2d; 20 qualify")


def test_prepare_command_saves_a_loadable_model(tmp_path):
    out = tmp_path / "r18.json"
    result = run_cli("prepare", "resnet-18", "--dtype", "int4", "-o", str(out))
    assert result.returncode == 0, result.stderr
    assert "layer 0: 3 input channels" in result.stdout
    loaded, params = load_model(str(out))
    expected, _ = prepare_for_tensorcore(model("resnet-18"), "int4")
    assert tvm.ir.structural_equal(loaded, expected)
    assert params and os.path.exists(tmp_path / "r18.params")


@pytest.mark.parametrize(
    "args, words",
    [
        (["resnet-18", "--dtype", "int4", "--skip-layers", "99"], "out of range"),
        (["resnet-18", "--dtype", "float16"], "invalid choice"),
        (["no-such-model", "--dtype", "int8"], "unknown model"),
        (["resnet-18", "--skip-layers", "a,b"], "--skip-layers"),
    ],
)
def test_prepare_command_errors_write_nothing(tmp_path, args, words):
    out = tmp_path / "out.json"
    result = run_cli("prepare", *args, "-o", str(out))
    assert result.returncode == 2
    assert words in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_count_layers_command_rejects_unknown_ops():
    result = run_cli("count-layers", "mlp", "--ops", "nn.dens")
    assert result.returncode == 2 and "did you mean nn.dense" in result.stderr


def test_demo_section_reports_skipped_layers_and_equal_outputs():
    from tvm_tcutils.demo import SECTIONS
    from tvm_tcutils.tensorcore.demo import prepare_section

    assert f"{prepare_section.__module__}:{prepare_section.__name__}" in SECTIONS
    lines = prepare_section("small", small_conv_net(channels=32), {})
    assert lines[0].startswith("prepare_for_tensorcore(int4): 2 conv2d layers to HWNC/int4 in ")
    assert lines[0].endswith(", 0 skipped")
    assert float(lines[-1].split("max |diff| ")[1].split()[0]) < 1e-4
    lines = prepare_section("small", small_conv_net(channels=4), {})
    assert lines[0].endswith(", 2 skipped")
    assert lines[1] == (
        "  skipped layer 0: 4 input channels would be padded to 32 and 4 output channels would be padded to 8 "
        "(+1500% work > 100% allowed)"
    )


@pytest.mark.parametrize("dtype", ["int4", "uint4"])
@pytest.mark.parametrize("target", ["cuda -arch=sm_90", "cuda -arch=sm_100", tvm.target.Target("cuda -arch=sm_90a")])
def test_int4_for_sm_90_and_newer_is_refused_before_any_work(dtype, target, monkeypatch):
    from tvm_tcutils.tensorcore import prepare as prepare_module

    def no_work(*args, **kwargs):
        raise AssertionError("prepare_for_tensorcore looked at the model before refusing")

    monkeypatch.setattr(prepare_module, "typed", no_work)
    with pytest.raises(ValueError) as caught:
        prepare_for_tensorcore(model("resnet-18"), dtype, target=target)
    message = str(caught.value)
    assert message.startswith(f"prepare_for_tensorcore(dtype={dtype!r}) for target {str(target)!r}: "
                              f"{dtype} on sm_90 and newer")
    assert "no 4-bit MMA instruction" in message and "slower than int8 on an H200" in message
    assert "prepare with dtype='int8'" in message
    # With explicit skips too.
    with pytest.raises(ValueError, match="sm_90 and newer"):
        prepare_for_tensorcore(model("resnet-18"), dtype, skip_layers=[0, 1], target=target)


def test_int4_layer_table_for_sm_90_says_no_with_the_reason():
    rows = layer_table(model("resnet-18"), ["nn.conv2d"], target="cuda -arch=sm_90")
    assert not any(row.qualifies for row in rows)
    for row in rows:  # the stem too: the target's rules come before the padding
        assert row.reason.startswith("int4 on sm_90 and newer (target has sm_90): no 4-bit MMA instruction")
        assert str(row).endswith(f"no: {row.reason}")
    # int8 for the same target, and int4 for sm_89: as without a target, but the stem.
    for dtype, target in (("int8", "cuda -arch=sm_90"), ("int4", "cuda -arch=sm_89")):
        rows = layer_table(model("resnet-18"), ["nn.conv2d"], dtype=dtype, target=target)
        assert [row.index for row in rows if not row.qualifies] == [0]


@pytest.mark.parametrize("dtype, target", [("int8", "cuda -arch=sm_90"), ("int4", "cuda -arch=sm_80")])
def test_the_target_changes_nothing_where_the_tensor_cores_are_allowed(dtype, target):
    mod = model("resnet-18")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prepared, skipped = prepare_for_tensorcore(mod, dtype, target=target)
    assert [s.index for s in skipped] == [0]
    # Nothing but the skipped layers' layout (NHWC for a CUDA target).
    plain = prepare_for_tensorcore(mod, dtype, skipped_layout="NHWC")
    assert plain.skipped == skipped and tvm.ir.structural_equal(plain.mod, prepared)


@pytest.mark.parametrize("target, words", [
    ("cuda -arch=sm_70", "int8 tensor cores need sm_72 or newer, target has sm_70"),
    ("llvm", "is not cuda"),
    ("cuda", "sm_50 is what TVM assumes when the target has no -arch"),  # no GPU here: TVM's default arch
])
def test_a_target_without_these_tensor_cores_skips_every_layer(target, words):
    if target == "cuda" and tvm_tcutils.capabilities()["cuda_device"]:
        pytest.skip("a GPU is attached: TVM takes its arch for a plain 'cuda' target")
    mod = small_conv_net(channels=32)
    prepared, skipped = prepare_for_tensorcore(mod, "int8", target=target, skipped_layout="keep")
    assert [s.index for s in skipped] == [0, 1] and all(words in s.reason for s in skipped)
    assert tvm.ir.structural_equal(prepared, relay.transform.InferType()(mod))


def test_target_must_be_a_target():
    with pytest.raises(TypeError, match="target must be a target string"):
        prepare_for_tensorcore(small_conv_net(), "int8", target=80)
