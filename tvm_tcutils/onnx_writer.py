"""The one ONNX writer: build an ONNX graph node by node and serialise it as a checked model.

Everything in the package that writes ONNX builds it here: the ONNX zoo models
made in code (:mod:`tvm_tcutils.models`: ``bert-tiny-onnx``,
``resnet-50-onnx``, ``mobilenet-v2-onnx``) and the Relay -> ONNX exporter of
the ONNX Runtime toolchain
(:mod:`tvm_tcutils.collage.toolchains.relay_to_onnx`). One set of rules
therefore holds for both:

* names are ``hint_N`` with one counter for nodes and initializers, so no two
  values share a name;
* constants are initializers only, never graph inputs (onnxruntime folds and
  fuses initializers, not inputs); initializers no node reads are left out;
* opset :data:`OPSET` (``LayerNormalization``, ``Softmax`` on any axis);
* the IR version is capped so the supported onnxruntime releases load it;
* the model passes ``onnx.checker`` before it is returned.

Examples
--------
>>> g = OnnxGraph("double")
>>> g.input("x", "float32", [2])
>>> y = g.node("Mul", ["x", g.const([2.0, 2.0], "two", "float32")])
>>> g.output(y, "float32", [2])
>>> model = g.model()
>>> [n.op_type for n in model.graph.node], [t.name for t in model.graph.initializer]
(['Mul'], ['two_1'])
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import numpy as np

from ._compat import MAX_ORT_IR_VERSION, ensure_onnx_mapping

#: The ONNX opset the package writes.
OPSET = 17


def onnx_dtype(dtype) -> int:
    """The ONNX element type of a numpy or Relay dtype.

    Examples
    --------
    >>> import onnx
    >>> onnx_dtype("float32") == onnx.TensorProto.FLOAT
    True
    """
    return ensure_onnx_mapping().helper.np_dtype_to_tensor_dtype(np.dtype(str(dtype)))


class OnnxGraph:
    """An ONNX graph under construction.

    Parameters
    ----------
    name : str
        The graph's name.

    Attributes
    ----------
    nodes, initializers, inputs, outputs : list
        The graph's parts, in the order they were added.
    """

    def __init__(self, name: str = "tvm_tcutils"):
        self.onnx = ensure_onnx_mapping()
        self.name = name
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list = []
        self.outputs: list = []
        self._count = 0

    def fresh(self, hint: str) -> str:
        """A new value name, ``hint_N``.

        Examples
        --------
        >>> g = OnnxGraph(); g.fresh("w"), g.fresh("relu")
        ('w_1', 'relu_2')
        """
        self._count += 1
        return f"{hint}_{self._count}"

    def node(self, op_type: str, inputs: Sequence[str], outputs: Optional[Sequence[str]] = None, **attrs) -> str:
        """Add a node (``outputs`` default: one fresh name); returns its first output's name.

        Examples
        --------
        >>> OnnxGraph().node("Relu", ["x"])
        'relu_1'
        """
        outputs = list(outputs) if outputs else [self.fresh(op_type.lower())]
        self.nodes.append(self.onnx.helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs[0]

    def const(self, value, hint: str = "const", dtype=None) -> str:
        """Add an initializer holding ``value`` (as ``dtype``); returns its name.

        Examples
        --------
        >>> g = OnnxGraph(); g.const([1, 2], "shape", np.int64)
        'shape_1'
        >>> g.initializers[0].dims
        [2]
        """
        name = self.fresh(hint)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def value_info(self, name: str, dtype, shape: Sequence[int]):
        """A typed, shaped value (for graph inputs and outputs)."""
        return self.onnx.helper.make_tensor_value_info(name, onnx_dtype(dtype), [int(d) for d in shape])

    def input(self, name: str, dtype, shape: Sequence[int]) -> None:
        """Declare a graph input."""
        self.inputs.append(self.value_info(name, dtype, shape))

    def output(self, name: str, dtype, shape: Sequence[int]) -> None:
        """Declare a graph output."""
        self.outputs.append(self.value_info(name, dtype, shape))

    def model(self, max_ir_version: int = MAX_ORT_IR_VERSION, producer: str = "tvm_tcutils"):
        """The checked ``onnx.ModelProto`` (initializers no node reads left out).

        ``max_ir_version`` caps the IR version for the runtimes that will load it.
        """
        onnx = self.onnx
        used = {name for node in self.nodes for name in node.input} | {out.name for out in self.outputs}
        initializers: List = [tensor for tensor in self.initializers if tensor.name in used]
        model = onnx.helper.make_model(
            onnx.helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, initializers),
            opset_imports=[onnx.helper.make_opsetid("", OPSET)],
            producer_name=producer,
        )
        model.ir_version = min(model.ir_version, max_ir_version)
        onnx.checker.check_model(model)
        return model
