"""The HWNC tensor-core qualification rules."""
import pytest

from tvm_tcutils.tensorcore_rules import WMMA_SHAPES, hwnc_conv2d_qualifies


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
