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

import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from tvm import relay

from ..files import cache_dir, write_atomically
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



#: The onnx package's own small-weight test models (``onnx/backend/test/data/light``), by short name.
_LIGHT_DIR = ("backend", "test", "data", "light")

#: Where the converted light models are kept (``$TVM_TCUTILS_CACHE`` overrides the parent).
LIGHT_CACHE = cache_dir("light")

#: Opset the light models are converted to before import (they ship at opset 8/9).
LIGHT_OPSET = 13


def light_model_names() -> List[str]:
    """Short names (``squeezenet``, ``inception_v1``...) of the onnx package's light test models.

    Examples
    --------
    >>> "inception_v1" in light_model_names()
    True
    """
    import onnx

    folder = os.path.join(os.path.dirname(onnx.__file__), *_LIGHT_DIR)
    if not os.path.isdir(folder):
        return []
    return sorted(name[len("light_"):-len(".onnx")] for name in os.listdir(folder)
                  if name.startswith("light_") and name.endswith(".onnx"))


def light_model(name: str, cache_dir: Optional[str] = None, weights: str = "filled") -> str:
    """Path of the onnx package's ``light_<name>.onnx`` converted to opset :data:`LIGHT_OPSET` (cached).

    ``weights``: ``"filled"``, the file's own (each weight one value repeated,
    made by a ``ConstantOfShape``: the package keeps the files small so); or
    ``"random"``, every such weight an initializer drawn by its role (He-normal
    conv and dense weights, small biases, batch-norm statistics near 1 and 0),
    as a trained model's are and as quantizers need to see them (one repeated
    value gives every channel the same scale), with the weights no longer
    listed among the graph's inputs.

    Raises
    ------
    ValueError
        For a name that is not one of :func:`light_model_names`, or another ``weights``.

    Examples
    --------
    >>> light_model("banana")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: model 'light_banana' is not one of the onnx package's light models: ...
    """
    import onnx
    from onnx import version_converter

    if weights not in LIGHT_WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(LIGHT_WEIGHTS)}, got {weights!r}")
    names = light_model_names()
    if name not in names:
        raise ValueError(f"model 'light_{name}' is not one of the onnx package's light models: "
                         f"{', '.join('light_' + n for n in names)}")
    folder = cache_dir or LIGHT_CACHE
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"light_{name}_opset{LIGHT_OPSET}.onnx")
    if not os.path.exists(path):
        source = os.path.join(os.path.dirname(onnx.__file__), *_LIGHT_DIR, f"light_{name}.onnx")
        converted = version_converter.convert_version(onnx.load(source), LIGHT_OPSET)
        write_atomically(path, converted.SerializeToString())
    if weights == "filled":
        return path
    random_path = os.path.join(folder, f"light_{name}_opset{LIGHT_OPSET}_random.onnx")
    if not os.path.exists(random_path):
        write_atomically(random_path, with_random_weights(onnx.load(path)).SerializeToString())
    return random_path


#: What :func:`light_model` can give a light model as weights.
LIGHT_WEIGHTS = ("filled", "random")


def _weight_values(rng: np.random.Generator, shape: Tuple[int, ...], consumers: Sequence[Tuple[str, int, dict]],
                   fill: np.ndarray) -> np.ndarray:
    """Random values for a weight of ``shape`` read by ``consumers`` ``(op, input index, attributes)``."""
    if not consumers:
        return np.broadcast_to(fill, shape).copy()
    op, index, attrs = consumers[0]
    if op in ("Conv", "Gemm", "MatMul") and index == 1:
        if op == "Conv":
            fan_in = int(np.prod(shape[1:]))
        elif op == "Gemm":
            fan_in = shape[1] if attrs.get("transB", 0) else shape[0]
        else:
            fan_in = shape[0]
        return rng.normal(0.0, np.sqrt(2.0 / max(fan_in, 1)), shape)
    # A batch norm's scale and variance, and a decomposed one's scale (its Mul).
    if (op == "BatchNormalization" and index in (1, 4)) or op == "Mul":
        return rng.uniform(0.5, 1.5, shape)
    return rng.normal(0.0, 0.1, shape)  # biases, batch-norm means and shifts


def with_random_weights(model, seed: int = 0):
    """A copy of ``model`` whose ``ConstantOfShape`` weights are random initializers (see :func:`light_model`)
    and whose graph inputs are only the ones a caller feeds.

    A weight feeding an ``Unsqueeze`` (a batch norm decomposed into ``Mul`` and ``Add``) is drawn for
    the ``Unsqueeze``'s reader.

    Examples
    --------
    >>> import onnx
    >>> from onnx import helper
    >>> shape = helper.make_tensor("w__SHAPE", onnx.TensorProto.INT64, [4], [8, 3, 3, 3])
    >>> graph = helper.make_graph(
    ...     [helper.make_node("ConstantOfShape", ["w__SHAPE"], ["w"]), helper.make_node("Conv", ["x", "w"], ["y"])],
    ...     "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
    ...     [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [shape])
    >>> weighted = with_random_weights(helper.make_model(graph))
    >>> [n.op_type for n in weighted.graph.node], [(i.name, list(i.dims)) for i in weighted.graph.initializer]
    (['Conv'], [('w', [8, 3, 3, 3])])
    """
    import onnx
    from onnx import numpy_helper

    from ..models import onnx_graph_inputs

    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    rng = np.random.default_rng(seed)
    initializers = {init.name: init for init in graph.initializer}
    readers: Dict[str, list] = {}
    for node in graph.node:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        for index, name in enumerate(node.input):
            readers.setdefault(name, []).append((node, index, attrs))

    def consumers(name: str) -> list:
        found = []
        for node, index, attrs in readers.get(name, []):
            if node.op_type == "Unsqueeze" and index == 0:
                found += consumers(node.output[0])
            else:
                found.append((node.op_type, index, attrs))
        return found

    made, kept = [], []
    for node in graph.node:
        shape = initializers.get(node.input[0]) if node.op_type == "ConstantOfShape" and node.input else None
        if shape is None:
            kept.append(node)
            continue
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        fill = numpy_helper.to_array(value) if value is not None else np.zeros(1, "float32")
        dims = tuple(int(d) for d in numpy_helper.to_array(shape))
        values = _weight_values(rng, dims, consumers(node.output[0]), fill)
        made.append(numpy_helper.from_array(values.astype(fill.dtype), node.output[0]))
    used = {name for node in kept for name in node.input}
    inputs = onnx_graph_inputs(graph)
    del graph.node[:]
    graph.node.extend(kept)
    remaining = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(remaining + made)
    del graph.input[:]
    graph.input.extend(inputs)
    # Before IR version 4 every initializer had to be a graph input; opset 13 is IR version 7's.
    model.ir_version = max(model.ir_version, 7)
    return model


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
