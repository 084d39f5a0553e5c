"""What ``tvm-tcutils bench`` times for int8 is the whole quantized model, computed.

The zoo MLP's int8 build runs in about a tenth of its fp32 build's time (VNNI dense
against TVM's untuned fp32 dense): such a ratio is only believable if the timed module
computes the quantized model's output, which this checks against TVM's interpreter.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relay

from tvm_tcutils.dotprod.quantize import prepare
from tvm_tcutils.measure import Timer
from tvm_tcutils.models import random_inputs


def test_timed_int8_module_computes_the_quantized_model(mlp_model):
    mod, params = mlp_model
    qmod, qparams = prepare(mod, params, "int8")
    inputs = random_inputs(mod, params)
    timer = Timer(qmod, qparams, repeat=1, warmup=0, inputs=inputs)  # as the command builds and times it
    assert timer.sample() > 0
    got = timer.outputs()[0]
    expected = relay.create_executor("debug", mod=qmod, target="llvm", device=tvm.cpu()).evaluate()(
        inputs["data"]).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    # A module that ignores its input would give the same output for another one.
    timer.runner.set_input("data", -inputs["data"])
    timer.runner.run()
    assert not np.allclose(timer.outputs()[0], got)
