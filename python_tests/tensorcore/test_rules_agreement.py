"""One meaning of "qualifies": prepare_for_tensorcore's 'auto' skips exactly what the strategy keeps off tensor cores.

For every conv2d layer of ResNet-18/50 at batch 8 and batch 1 (and a small
net whose channels need padding, at several pad limits): layer ``i`` is skipped
by ``prepare_for_tensorcore(skip_layers="auto")`` <=> the strategy picks no
tensor-core implementation for layer ``i`` of the prepared model
(:func:`tvm_tcutils.tensorcore.strategy.implementations`, after legalization,
for ``cuda -arch=sm_80``).
"""
import pytest
from tvm.relay.testing import resnet

from conftest import small_conv_net
from tvm_tcutils import prepare_for_tensorcore
from tvm_tcutils.tensorcore import strategy as tc

SM80 = "cuda -arch=sm_80"


def _agreement(mod, dtype):
    """(skipped indices, indices the strategy leaves off tensor cores), over the conv2d layers."""
    prepared, skipped = prepare_for_tensorcore(mod, dtype)
    rows = tc.implementations(prepared, SM80, ops=("nn.conv2d",))
    assert all(row[0] == "nn.conv2d" for row in rows)
    return {s.index for s in skipped}, {i for i, row in enumerate(rows) if row[3] != tc.CONV2D_IMPL}, len(rows)


def _agreement_cases():
    """Half of the 2 x 2 x 2 product by default, where every two of (layers, batch, dtype) meet in all four
    combinations (ResNet-50's bottleneck 1x1 layers with both batches and both dtypes); the other half
    (a repeat of the same layer kinds with the other third parameter) under -m slow."""
    return [pytest.param(layers, batch, dtype, id=f"{layers}-{batch}-{dtype}",
                         marks=[] if (layers == 50) == ((batch == 8) == (dtype == "int8")) else [pytest.mark.slow])
            for layers in (50, 18) for batch in (8, 1) for dtype in ("int4", "int8")]


@pytest.mark.parametrize("layers, batch, dtype", _agreement_cases())
def test_auto_skips_exactly_what_the_strategy_keeps_off_tensor_cores(layers, batch, dtype):
    # 64x64 images: the layer kinds of the 224x224 model with smaller activations.
    mod, _ = resnet.get_workload(num_layers=layers, batch_size=batch, image_shape=(3, 64, 64))
    skipped, fallback, count = _agreement(mod, dtype)
    assert count == {50: 53, 18: 21}[layers]
    assert skipped == fallback == {0}  # the 3-channel stem; the batch (1 -> padded) never disqualifies


@pytest.mark.parametrize("limit,expect_skipped", [(0.0, {0, 1}), (0.3, {0, 1}), (0.5, set()), (None, set())])
def test_the_pad_setting_moves_both_together(limit, expect_skipped):
    mod = small_conv_net(channels=24)  # int4 pads 24 input channels to 32: +33% work
    if limit is None:  # the default setting
        skipped, fallback, _ = _agreement(mod, "int4")
    else:
        with tc.pad_limit(limit):
            skipped, fallback, _ = _agreement(mod, "int4")
    assert skipped == fallback == expect_skipped
