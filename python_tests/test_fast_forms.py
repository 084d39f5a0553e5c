"""Fast forms of float ops whose results are quantized to 8 bits right after (``tvm_tcutils.fast_forms``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relay

from tvm_tcutils.fast_forms import fast_chain

from conftest import build_and_run, op_names


def _attention(heads: int = 2, seq: int = 16, dim: int = 8):
    """scores -> softmax -> probabilities x V -> transpose -> reshape: what an encoder's context is."""
    q = relay.var("q", shape=(heads, seq, dim))
    k = relay.var("k", shape=(heads, seq, dim))
    v = relay.var("v", shape=(heads, dim, seq))
    scores = relay.multiply(relay.nn.batch_matmul(q, k), relay.const(1 / np.sqrt(dim), "float32"))
    context = relay.nn.batch_matmul(relay.nn.softmax(scores, axis=-1), v)
    return [q, k, v], relay.reshape(relay.transpose(context, (1, 0, 2)), (seq, heads * dim))


def test_chain_reaches_the_softmax_behind_attention_product():
    params, context = _attention()
    fast = fast_chain(context)
    assert "nn.fast_softmax" in op_names(fast) and "nn.softmax" not in op_names(fast)
    assert "nn.softmax" in op_names(context)  # the input expression is not changed
    rng = np.random.default_rng(0)
    inputs = {p.name_hint: rng.standard_normal([int(d) for d in p.type_annotation.shape]).astype("float32")
              for p in params}
    exact, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, context)), inputs=inputs)
    approx, = build_and_run(tvm.IRModule.from_expr(relay.Function(params, fast)), inputs=inputs)
    # Far below an 8-bit step of the context's range.
    assert np.abs(approx - exact).max() < 1e-5 * np.abs(exact).max()


@pytest.mark.parametrize("stop", ["nn.dense", "mean"])
def test_chain_stops_at_otherop_names(stop):
    x = relay.var("x", shape=(4, 8))
    soft = relay.nn.softmax(x, axis=-1)
    after = relay.nn.dense(soft, relay.var("w", shape=(8, 8))) if stop == "nn.dense" else relay.mean(soft, axis=-1)
    assert fast_chain(after).same_as(after)
