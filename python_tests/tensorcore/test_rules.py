"""The HWNC tensor-core qualification rules."""
import pytest
import tvm

from tvm_tcutils.tensorcore.rules import (
    DEFAULT_PAD_FRACTION, EMULATED_DTYPES, INT4_EMULATED_FROM_ARCH, WMMA_SHAPES, MissingArchError, fitting_shapes,
    hwnc_conv2d_qualifies, max_pad_fraction, pad_limit, unsupported_reason,
)


@pytest.mark.parametrize(
    "batch, in_ch, out_ch, dtype, tile",
    [
        (8, 32, 8, "int4", (8, 8, 32)),
        (8, 64, 256, "uint4", (8, 8, 32)),
        (16, 16, 16, "int8", (16, 16, 16)),
        (8, 16, 32, "int8", (8, 32, 16)),
        (32, 16, 8, "uint8", (32, 8, 16)),
    ],
)
def test_exact_tiles_qualify_without_padding(batch, in_ch, out_ch, dtype, tile):
    verdict = hwnc_conv2d_qualifies(batch, in_ch, out_ch, dtype, pad_fraction=0.0)
    assert verdict and verdict.reason == ""
    assert verdict.wmma_shape == tile
    assert verdict.padded == (batch, in_ch, out_ch)
    assert verdict.pad_fraction == 0.0


@pytest.mark.parametrize("batch", [1, 3, 7])
def test_batch_alone_never_disqualifies(batch):
    verdict = hwnc_conv2d_qualifies(batch, 64, 64, "int4", pad_fraction=0.0)
    assert verdict
    assert verdict.padded[0] == 8


def test_int8_prefers_the_tile_without_channel_padding():
    # 8 output channels: only 32x8x16 avoids padding them.
    verdict = hwnc_conv2d_qualifies(1, 16, 8, "int8", pad_fraction=0.0)
    assert verdict.wmma_shape == (32, 8, 16) and verdict.padded == (32, 16, 8)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(groups=2), "groups=2"),
        (dict(out_dtype="int16"), "accumulates in int16"),
        (dict(kernel_layout="HWIO"), "HWNC/HWOI"),
        (dict(data_layout="NCHW", kernel_layout="OIHW"), "layout NCHW/OIHW"),
    ],
)
def test_each_rule_says_why_not(kwargs, words):
    verdict = hwnc_conv2d_qualifies(8, 64, 64, "int8", **kwargs)
    assert not verdict
    assert words in verdict.reason


def test_float_dtype_names_the_valid_types():
    verdict = hwnc_conv2d_qualifies(8, 64, 64, "float16")
    assert not verdict and "float16" in verdict.reason and "int4" in verdict.reason


def test_pad_fraction_is_the_channel_padding_tolerance():
    # int4 with 48 input channels pads to 64: one third more work.
    assert not hwnc_conv2d_qualifies(1, 48, 64, "int4", pad_fraction=0.3)
    allowed = hwnc_conv2d_qualifies(1, 48, 64, "int4", pad_fraction=0.34)
    assert allowed and allowed.padded == (8, 64, 64)
    assert allowed.pad_fraction == pytest.approx(1 / 3)
    first_resnet_layer = hwnc_conv2d_qualifies(1, 3, 64, "int4")
    assert first_resnet_layer.reason == "3 input channels would be padded to 32 (+967% work > 100% allowed)"


@pytest.mark.parametrize("dtype", sorted(WMMA_SHAPES))
def test_output_channel_rule(dtype):
    # 4 output channels fit no tile; padding to 8 doubles the work.
    assert not hwnc_conv2d_qualifies(8, 64, 4, dtype, pad_fraction=0.5)


@pytest.mark.parametrize(
    "args, kwargs",
    [((0, 64, 64, "int4"), {}), ((1, -1, 64, "int4"), {}), ((1, 64, 64.0, "int4"), {}),
     ((1, 64, 64, "int4"), {"pad_fraction": -0.1})],
)
def test_bad_sizes_raise(args, kwargs):
    with pytest.raises(ValueError):
        hwnc_conv2d_qualifies(*args, **kwargs)


def test_default_pad_fraction_is_the_package_setting():
    # 48 -> 64 input channels: +33% work.
    assert hwnc_conv2d_qualifies(8, 48, 64, "int4")  # default 1.0
    with pad_limit(0.25):
        verdict = hwnc_conv2d_qualifies(8, 48, 64, "int4")
        assert not verdict and verdict.reason.endswith("(+33% work > 25% allowed)")
        assert hwnc_conv2d_qualifies(8, 48, 64, "int4", pad_fraction=0.5)  # an explicit value wins
    assert max_pad_fraction() == DEFAULT_PAD_FRACTION == 1.0


def test_batch_padding_is_not_counted_as_work():
    verdict = hwnc_conv2d_qualifies(1, 60, 30, "int8", pad_fraction=0.15)
    # Channels 60x30 -> 64x32 (+13.8%); the tile with the least batch padding among those.
    assert verdict and verdict.wmma_shape == (8, 32, 16) and verdict.padded == (8, 64, 32)
    assert verdict.pad_fraction == pytest.approx(64 * 32 / (60 * 30) - 1)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(kernel_dtype="int4"), "data int8 and kernel int4 differ"),
        (dict(target="llvm"), "is not cuda"),
        (dict(target="cuda -arch=sm_70"), "int8 tensor cores need sm_72 or newer, target has sm_70"),
    ],
)
def test_kernel_type_and_target_rules(kwargs, words):
    if "target" in kwargs:
        kwargs["target"] = tvm.target.Target(kwargs["target"])
    verdict = hwnc_conv2d_qualifies(8, 64, 64, "int8", **kwargs)
    assert not verdict and words in verdict.reason
    assert hwnc_conv2d_qualifies(8, 64, 64, "int8", target=tvm.target.Target("cuda -arch=sm_72"))


def test_fitting_shapes_are_the_exact_tiles_in_preference_order():
    assert fitting_shapes("int8", 32, 16, 32) == ((16, 16, 16), (32, 8, 16), (8, 32, 16))
    assert fitting_shapes("int8", 8, 16, 8) == ()
    assert fitting_shapes("float16", 16, 16, 16) == ()


@pytest.mark.parametrize("arch", ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_120"])
@pytest.mark.parametrize("dtype", sorted(WMMA_SHAPES))
def test_int4_from_sm_90_on_does_not_qualify(dtype, arch):
    # No 4-bit MMA instruction from sm_90 on (8-bit MMA after unpacking; tensorcore/test_sass.py checks the
    # SASS), and int4 layers ran slower than int8 ones on an H200: int4/uint4 layers do not qualify.
    target = tvm.target.Target(f"cuda -arch={arch}")
    verdict = hwnc_conv2d_qualifies(8, 64, 64, dtype, target=target)
    number = int(arch[3:].rstrip("a"))
    refused = dtype in EMULATED_DTYPES and number >= INT4_EMULATED_FROM_ARCH
    assert bool(verdict) == (not refused)
    if refused:
        assert verdict.reason == (
            f"{dtype} on sm_90 and newer (target has sm_{number}): no 4-bit MMA instruction "
            "(emulated on 8-bit MMA: int4 layers ran slower than int8 on an H200, docs/benchmarks/tensorcore.md); "
            "use int8"
        )
        assert verdict.wmma_shape is None and verdict.padded is None
    else:
        assert verdict.reason == ""
    assert unsupported_reason(dtype, target) == verdict.reason


def test_the_int4_refusal_needs_a_cuda_target_and_comes_before_padding():
    assert hwnc_conv2d_qualifies(8, 64, 64, "int4")  # no target: the layer alone
    assert unsupported_reason("int4", None) == unsupported_reason("int4", tvm.target.Target("llvm")) == ""
    assert not hwnc_conv2d_qualifies(8, 64, 64, "int4", target=tvm.target.Target("llvm"))  # not cuda, as before
    # A layer that padding would also disqualify is refused for the target first.
    verdict = hwnc_conv2d_qualifies(8, 48, 64, "int4", pad_fraction=0.1, target=tvm.target.Target("cuda -arch=sm_90"))
    assert verdict.reason.startswith("int4 on sm_90 and newer")
    # An arch below int4's minimum keeps its own reason.
    old = hwnc_conv2d_qualifies(8, 64, 64, "int4", target=tvm.target.Target("cuda -arch=sm_72"))
    assert old.reason == "int4 tensor cores need sm_75 or newer, target has sm_72"


def test_the_int4_refusal_needs_an_arch():
    import types

    import tvm_tcutils
    if tvm_tcutils.capabilities()["cuda_device"]:
        pytest.skip("a local GPU answers the arch question")
    fake = types.SimpleNamespace(attrs={}, kind=types.SimpleNamespace(name="cuda"))
    with pytest.raises(MissingArchError, match="-arch=sm_80"):
        unsupported_reason("int4", fake)
    assert unsupported_reason("int8", fake) == ""  # int8 has no arch limit of this kind
