"""The package's relay.quantize route (``tvm-tcutils bench --dtype int8`` on a float model)."""
from __future__ import annotations

import pytest
import tvm

import tvm_tcutils
from tvm_tcutils.dotprod.quantize import prepare, quantize_int8


@pytest.mark.parametrize("quantize", [lambda mod, params: quantize_int8(mod, params),
                                      lambda mod, params: prepare(mod, params, "int8")[0]],
                         ids=["quantize_int8", "prepare"])
def test_quantizing_leaves_the_callers_module_and_params_as_they_were(quantize):
    # TVM's relay.quantize assigns the module it is given a new main with the parameters bound: a
    # session-wide test model quantized once lost its parameters for every later test.
    mod, params = tvm_tcutils.load_model("mlp")
    before, names = tvm.ir.load_json(tvm.ir.save_json(mod)), sorted(params)
    qmod = quantize(mod, params)
    assert [p.name_hint for p in qmod["main"].params] == ["data"]
    assert tvm.ir.structural_equal(mod, before) and sorted(params) == names
