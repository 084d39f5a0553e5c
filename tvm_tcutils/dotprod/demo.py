"""The int8 dot-product section of the demo (see :mod:`tvm_tcutils.demo`)."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from .._tvm import host_target, tvm
from tvm import relay

from ..measure import Timer


def int8_dot_product_section(name: str, mod: tvm.IRModule, params: Dict) -> List[str]:
    """int8 dot-product conv2d: the model's first 3x3 layer, u8 x i8, bit-exact and timed."""
    from tvm.topi.testing import conv2d_nchw_python

    from .isa import for_target

    target = host_target()
    isa = for_target(target)
    if isa is None:
        return [f"host CPU ({target}) has no VNNI / AVX2 dot product: skipped"]
    convs = []
    relay.analysis.post_order_visit(
        relay.transform.InferType()(mod)["main"],
        lambda n: convs.append(n) if isinstance(n, relay.Call) and getattr(n.op, "name", "") == "nn.conv2d"
        and int(n.attrs.groups) == 1 and tuple(int(k) for k in n.attrs.kernel_size) == (3, 3) else None,
    )
    if not convs:
        return [f"{name} has no 3x3 conv2d: skipped"]
    call = convs[0]
    data_shape = [int(d) for d in call.args[0].checked_type.shape]
    kernel_shape = [int(d) for d in call.args[1].checked_type.shape]
    strides, padding = [int(v) for v in call.attrs.strides], [int(v) for v in call.attrs.padding]
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, data_shape).astype("uint8")
    kernel = rng.integers(-128, 128, kernel_shape).astype("int8")
    x = relay.var("x", shape=data_shape, dtype="uint8")
    y = relay.nn.conv2d(x, relay.const(kernel), strides=strides, padding=padding,
                        channels=kernel_shape[0], kernel_size=(3, 3), out_dtype="int32")
    timer = Timer(tvm.IRModule.from_expr(relay.Function([x], y)), None, target, repeat=5, warmup=1, inputs={"x": data})
    out = timer.outputs()[0]
    exact = np.array_equal(out, conv2d_nchw_python(data.astype("int64"), kernel.astype("int64"), strides, padding))
    seconds = timer().median_ms / 1e3
    gops = 2 * out.size * kernel_shape[1] * 9 / seconds / 1e9
    return [
        f"{isa.name} ({isa.lanes} lanes) on {target}: conv {data_shape} x {kernel_shape} stride {strides}",
        f"bit-exact vs numpy: {exact}; {gops:.0f} GOPS (layout transforms included, untuned)",
    ]
