"""The benchmark models: the zoo and ONNX models of :mod:`tvm_tcutils.models`, and ``encoder``.

:func:`load` is how every benchmark turns a name into a model: ``encoder``
(a BERT-like encoder built here in Relay, 4 layers, hidden 256, 4 heads,
sequence 128) or any :func:`tvm_tcutils.models.load_model` name (zoo names
with realistic He-style weights, ``.onnx`` files...).

Examples
--------
>>> mod, params = load("mlp")
>>> operator_count(mod) > 0, operator_count(encoder(1, seq=16)) > 60
(True, True)
"""
from __future__ import annotations

from typing import Dict, Tuple

import numpy as np

from .._tvm import tvm
from tvm import relay

from ..models import load_model


def encoder(layers: int, hidden: int = 256, heads: int = 4, seq: int = 128):
    """A BERT-like encoder in Relay, shaped like an ONNX import (random constant weights).

    3-D activations, every MatMul as reshape/dense/reshape plus a bias add,
    attention through reshapes and batch_matmul, layer norm and GELU
    decomposed into elementwise ops and reductions: about 70 operators a layer.
    """
    rng = np.random.default_rng(0)
    d = hidden // heads

    def const(*shape):
        return relay.const((rng.standard_normal(shape) * 0.05).astype("float32"))

    def linear(x, n_in, n_out):
        y = relay.nn.dense(relay.reshape(x, (seq, n_in)), const(n_out, n_in))
        return relay.add(relay.reshape(y, (1, seq, n_out)), const(n_out))

    def layer_norm(x):
        mean = relay.mean(x, axis=-1, keepdims=True)
        centered = relay.subtract(x, mean)
        var = relay.mean(relay.power(centered, relay.const(2.0)), axis=-1, keepdims=True)
        norm = relay.divide(centered, relay.sqrt(relay.add(var, relay.const(1e-5))))
        return relay.add(relay.multiply(norm, const(hidden)), const(hidden))

    def gelu(x):
        erf = relay.erf(relay.divide(x, relay.const(1.4142135623730951)))
        return relay.multiply(relay.multiply(x, relay.add(erf, relay.const(1.0))), relay.const(0.5))

    def split_heads(x, perm):
        return relay.transpose(relay.reshape(x, (1, seq, heads, d)), perm)

    x = relay.var("x", shape=(1, seq, hidden), dtype="float32")
    mask = const(1, 1, 1, seq)
    h = x
    for _ in range(layers):
        q = relay.reshape(split_heads(linear(h, hidden, hidden), (0, 2, 1, 3)), (heads, seq, d))
        k = relay.reshape(split_heads(linear(h, hidden, hidden), (0, 2, 1, 3)), (heads, seq, d))
        v = relay.reshape(split_heads(linear(h, hidden, hidden), (0, 2, 3, 1)), (heads, d, seq))
        scores = relay.reshape(relay.nn.batch_matmul(q, k), (1, heads, seq, seq))
        scores = relay.add(relay.divide(scores, relay.const(float(np.sqrt(d)))), mask)
        probs = relay.reshape(relay.nn.softmax(scores, axis=-1), (heads, seq, seq))
        ctx = relay.reshape(relay.nn.batch_matmul(probs, v), (1, heads, seq, d))
        ctx = relay.reshape(relay.transpose(ctx, (0, 2, 1, 3)), (1, seq, hidden))
        h = layer_norm(relay.add(linear(ctx, hidden, hidden), h))
        ff = linear(gelu(linear(h, hidden, 4 * hidden)), 4 * hidden, hidden)
        h = layer_norm(relay.add(ff, h))
    mod = tvm.IRModule.from_expr(relay.Function([x], h))
    return relay.transform.InferType()(mod)


def operator_count(mod) -> int:
    """Operator calls in ``main``."""
    count = [0]
    relay.analysis.post_order_visit(
        mod["main"], lambda e: count.__setitem__(0, count[0] + isinstance(e, relay.Call)))
    return count[0]



def load(name: str) -> Tuple[tvm.IRModule, Dict]:
    """A benchmark model and its parameters by name: ``encoder`` or a :func:`~tvm_tcutils.models.load_model` name.

    Examples
    --------
    >>> load("mlp")[0]["main"].params[0].name_hint
    'data'
    """
    if name == "encoder":
        return encoder(4, hidden=256, heads=4, seq=128), {}
    return load_model(name)


def conv_layers(mod: tvm.IRModule, kernels=(1, 3)) -> list:
    """Distinct ``(C, H, W, O, K, stride, pad)`` of a model's convs with a kernel size in ``kernels``, in order.

    Examples
    --------
    >>> conv_layers(load("resnet-18")[0])[0]
    (64, 56, 56, 64, 3, 1, 1)
    """
    mod = relay.transform.InferType()(mod)
    layers: list = []

    def visit(node) -> None:
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op) and node.op.name == "nn.conv2d":
            _, c, h, w = (int(x) for x in node.args[0].checked_type.shape)
            o, _, k, _ = (int(x) for x in node.args[1].checked_type.shape)
            key = (c, h, w, o, k, int(node.attrs.strides[0]), int(node.attrs.padding[0]))
            if k in kernels and key not in layers:
                layers.append(key)

    relay.analysis.post_order_visit(mod["main"], visit)
    return layers
