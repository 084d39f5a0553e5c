"""Compatibility shims between TVM 0.19 and the current onnx / onnxruntime.

TVM 0.19's ONNX importer and Relay-to-ONNX exporter read ``onnx.mapping``,
which onnx 1.19+ removed. :func:`ensure_onnx_mapping` puts back the few tables
TVM uses, computed from ``onnx.helper``'s own type conversion functions, so
both directions work with whichever onnx is installed. This is the only place
that patches a third-party module.

:func:`numpy_first_folding` (around ``tvm_tcutils.load_model``'s ONNX import) has TVM's importer fold the
constant casts, slices and concatenations of each node in numpy (exactly) instead of compiling a kernel
for each: the same module, imported 2-6x faster.

``import tvm_tcutils`` calls :func:`install_onnx_shim`: the tables go in when
onnx is imported (right away if it already is), so that a user's own
``relay.frontend.from_onnx`` works too, while importing the package neither
imports onnx (about 0.2 s) nor needs it installed.

:func:`install_onnx_converters` (also at ``import tvm_tcutils``) adds the
package's converters for the ONNX ops TVM 0.19 imports wrongly or not at all
(:mod:`tvm_tcutils.onnx_quantize_dynamic`: onnxruntime's dynamic quantization)
to the table TVM's importer looks operators up in.
"""
from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import re
import sys
import threading
import types
from typing import Optional

import numpy as np

#: Highest ONNX IR version the supported onnxruntime releases load.
MAX_ORT_IR_VERSION = 10


def ensure_onnx_mapping():
    """Make ``onnx.mapping`` importable (no-op when onnx still has it).

    Returns
    -------
    module
        The ``onnx`` module.

    Examples
    --------
    >>> onnx = ensure_onnx_mapping()
    >>> onnx.mapping.TENSOR_TYPE_TO_NP_TYPE[onnx.TensorProto.FLOAT].name
    'float32'
    """
    import numpy as np
    import onnx

    if hasattr(onnx, "mapping") and hasattr(onnx.mapping, "TENSOR_TYPE_TO_NP_TYPE"):
        return onnx
    mapping = types.ModuleType("onnx.mapping")
    tensor_to_np = {}
    for tensor_type in onnx.TensorProto.DataType.values():
        try:
            np_type = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor_type))
        except (KeyError, TypeError):  # UNDEFINED (KeyError) and types numpy cannot represent
            continue
        tensor_to_np[tensor_type] = np_type
    np_to_tensor = {}
    for tensor_type, np_type in tensor_to_np.items():
        # The first (canonical) onnx type wins for numpy dtypes that several
        # onnx types map to, as the old table did.
        np_to_tensor.setdefault(np_type, tensor_type)
    mapping.TENSOR_TYPE_TO_NP_TYPE = tensor_to_np
    mapping.NP_TYPE_TO_TENSOR_TYPE = np_to_tensor
    mapping.TENSOR_TYPE_TO_STORAGE_TENSOR_TYPE = {t: t for t in tensor_to_np}
    onnx.mapping = mapping
    sys.modules["onnx.mapping"] = mapping
    return onnx


class _ShimmingLoader(importlib.abc.Loader):
    """onnx's own loader, followed by :func:`ensure_onnx_mapping` once the package has run."""

    def __init__(self, loader: importlib.abc.Loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        ensure_onnx_mapping()

    def __getattr__(self, name: str):
        # Resource and source queries (get_data, is_package, ...) are the real loader's.
        return getattr(self._loader, name)


class OnnxMappingFinder(importlib.abc.MetaPathFinder):
    """Finds ``onnx`` where Python would, and makes its import also put back ``onnx.mapping``."""

    #: Marks the finder across ``importlib.reload`` of this module (a new class object each time).
    tcutils_onnx_shim = True

    def find_spec(self, name, path, target=None):
        if name != "onnx":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None  # not installed: Python's own ModuleNotFoundError, unchanged
        spec.loader = _ShimmingLoader(spec.loader)
        return spec


def install_onnx_shim() -> None:
    """Make ``onnx.mapping`` available whenever onnx is (or gets) imported; idempotent.

    Examples
    --------
    >>> install_onnx_shim()
    >>> import onnx
    >>> from onnx.mapping import TENSOR_TYPE_TO_NP_TYPE
    >>> TENSOR_TYPE_TO_NP_TYPE[onnx.TensorProto.INT8].name
    'int8'
    """
    if sys.modules.get("onnx") is not None:  # None: marked unimportable
        ensure_onnx_mapping()
        return
    if not any(getattr(finder, "tcutils_onnx_shim", False) for finder in sys.meta_path):
        sys.meta_path.insert(0, OnnxMappingFinder())


def dropout_for_inference(inputs, attrs, params):
    """ONNX ``Dropout`` at inference: its data, unchanged.

    TVM 0.19 converts ``Dropout`` by its opset-7 attribute ``ratio``; from opset 12 ``ratio`` and
    ``training_mode`` are inputs and TVM's converter fails ("expected float but got Object") on
    every model converted to a newer opset. A model that asks for training mode is refused.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> dropout_for_inference([x, relay.const(0.5)], {}, {}) is x
    True
    """
    from tvm import relay

    training = inputs[2] if len(inputs) > 2 else None
    if isinstance(training, relay.Constant) and bool(training.data.numpy()):
        raise ValueError("Dropout: training_mode=True is not an inference model; export it in eval mode")
    if training is not None and not isinstance(training, relay.Constant):
        raise ValueError("Dropout: training_mode must be a constant (an inference model has it False)")
    return inputs[0]


#: ONNX op type -> converter, for ops TVM 0.19's importer converts wrongly or not at all.
IMPORTER_GAPS = {"Dropout": dropout_for_inference}


def install_onnx_converters() -> None:
    """Make TVM's ONNX importer use the package's converters (:data:`onnx_quantize_dynamic.CONVERTERS`,
    :data:`IMPORTER_GAPS`); idempotent.

    TVM 0.19's ``relay.frontend.onnx`` builds its operator table anew in
    ``_get_convert_map(opset)`` for each node; that function is wrapped so that the
    table it returns holds the package's converters in place of TVM's for the same
    op types. Everything else is TVM's.

    Examples
    --------
    >>> install_onnx_converters()
    >>> from tvm.relay.frontend import onnx as frontend
    >>> frontend._get_convert_map(17)["MatMulInteger"].__module__
    'tvm_tcutils.onnx_quantize_dynamic'
    """
    from tvm.relay.frontend import onnx as frontend

    from .onnx_quantize_dynamic import CONVERTERS

    converters = {**CONVERTERS, **IMPORTER_GAPS}
    original = frontend._get_convert_map
    # The original across re-installs and importlib.reload of either module.
    original = getattr(original, "tcutils_original", original)

    def convert_map(opset):
        table = original(opset)
        table.update(converters)
        return table

    convert_map.tcutils_original = original
    convert_map.__doc__ = original.__doc__
    frontend._get_convert_map = convert_map


def install_cached_libinfo() -> None:
    """Let TVM's Relay lowering read the loaded libtvm's build facts once per process; idempotent.

    TVM 0.19's ``te_compiler.get_shape`` calls ``tvm.support.libinfo()`` for every dimension of every
    operator it lowers, and each call converts a map of some 200 build flags from C++ entry by entry
    (about 4 ms): a conv's output shape costs 17 ms, and ``FoldConstant``, which lowers a kernel for
    each call on constants, pays it again each time (a third of a weight layout transform's fold).
    The facts of the loaded library do not change, so the lowering module reads a copy of the first
    answer. Everything else calls TVM's own ``libinfo``.

    Examples
    --------
    >>> install_cached_libinfo()
    >>> from tvm.relay.backend import te_compiler
    >>> import tvm.support
    >>> te_compiler.libinfo() == tvm.support.libinfo()
    True
    """
    from tvm.relay.backend import te_compiler

    original = getattr(te_compiler.libinfo, "tcutils_original", te_compiler.libinfo)
    first: dict = {}

    def libinfo():
        if not first:
            first.update(original())
        return dict(first)  # a copy: a caller's change stays its own, as with TVM's

    libinfo.tcutils_original = original
    libinfo.__doc__ = original.__doc__
    te_compiler.libinfo = libinfo


def _cast(value, attrs):
    dtype = np.dtype(str(attrs.dtype))
    source = value.dtype
    # Integer to integer (wrapping as LLVM's truncation does), integer to float (round to nearest, as
    # sitofp) and float to float: numpy computes what the compiled kernel does. Float to integer is left
    # to TVM (out-of-range conversions differ).
    if source.kind in "iub" and dtype.kind in "iuf" or source.kind == "f" and dtype.kind == "f":
        return value.astype(dtype)
    return None


def _strided_slice(value, attrs):
    from tvm.topi.testing import strided_slice_python

    ints = lambda values: None if values is None else [int(v) for v in values]  # noqa: E731
    return strided_slice_python(value, ints(attrs.begin), ints(attrs.end), ints(attrs.strides),
                                str(attrs.slice_mode), ints(attrs.axes))


def _float_op(op):
    """``op`` on float32 values of one dtype (IEEE, correctly rounded in numpy as in the one-op kernel TVM
    compiles to fold it, without fast math); None for other dtypes (integer division and overflow differ)."""
    def fold(args, attrs):
        if any(a.dtype != np.float32 for a in args):
            return None
        # inf and nan as IEEE gives them, silently, as TVM's compiled fold does: no numpy warning for the
        # user's constants.
        with np.errstate(all="ignore"):
            return np.asarray(op(*args), dtype=np.float32)
    return fold


def _expand_dims(value, attrs):
    axis, count = int(attrs.axis), int(attrs.num_newaxis)
    axis = axis if axis >= 0 else axis + value.ndim + 1
    return value.reshape(value.shape[:axis] + (1,) * count + value.shape[axis:])


def _layout_axes(layout: str):
    """``[(axis, factor)]`` of a TVM layout string (``"OIHW16i"`` -> ``[("O", 0), ..., ("i", 16)]``) with
    ``(primal axes, {primal axis: factor})``, or None where a primal axis is split twice or a sub-axis has
    no primal axis (forms left to TVM)."""
    tokens = re.findall(r"(\d*)([A-Za-z])", layout)
    if "".join(f + a for f, a in tokens) != layout:
        return None
    axes = [(a, int(f or 0)) for f, a in tokens]
    primal = [a for a, _ in axes if a.isupper()]
    subs = {}
    for axis, factor in axes:
        if axis.islower():
            if axis.upper() in subs or axis.upper() not in primal or factor <= 0:
                return None
            subs[axis.upper()] = factor
        elif factor:
            return None
    if len(set(primal)) != len(primal):
        return None
    return axes, primal, subs


def _layout_transform(value, attrs):
    """``layout_transform`` in numpy: the value unsplit to its primal axes, then split and ordered as the
    destination asks (a permutation: exact). None where TVM would pad (a factor not dividing its axis)."""
    src, dst = _layout_axes(str(attrs.src_layout)), _layout_axes(str(attrs.dst_layout))
    if src is None or dst is None or value.ndim != len(src[0]) or set(src[1]) != set(dst[1]):
        return None
    (src_axes, src_primal, src_subs), (dst_axes, dst_primal, dst_subs) = src, dst
    names = [a for a, _ in src_axes]
    order, extents = [], []
    for axis in src_primal:  # each primal axis's outer then inner part, merged
        order.append(names.index(axis))
        extent = value.shape[names.index(axis)]
        if axis in src_subs:
            inner = names.index(axis.lower())
            order.append(inner)
            extent *= value.shape[inner]
        extents.append(extent)
    full = value.transpose(order).reshape(extents).transpose([src_primal.index(a) for a in dst_primal])
    split, labels = [], []
    for axis, extent in zip(dst_primal, full.shape):
        factor = dst_subs.get(axis)
        if factor is None:
            split.append(extent), labels.append(axis)
        elif extent % factor:
            return None
        else:
            split.extend((extent // factor, factor)), labels.extend((axis, axis.lower()))
    return np.ascontiguousarray(full.reshape(split).transpose([labels.index(a) for a, _ in dst_axes]))


#: Ops on constants that TVM folds by compiling a kernel each -- its ONNX importer (a QDQ file's zero-point
#: casts, shape slices and concatenations: 540 LLVM builds for bert-tiny, 1,612 for BERT-base) and its
#: ``FoldConstant`` after ``SimplifyInference`` (each batch norm's ``sqrt``, ``divide``, ``multiply``...:
#: DenseNet-121's 120 took 56 s in Collage's preparation) -- and their exact numpy forms:
#: ``(args' values, attrs) -> value``, or None to leave the call to TVM.
NUMPY_FOLDS = {
    "cast": lambda args, attrs: _cast(args[0], attrs),
    "strided_slice": lambda args, attrs: _strided_slice(args[0], attrs),
    "concatenate": lambda args, attrs: np.concatenate(args, axis=int(attrs.axis)),
    "maximum": lambda args, attrs: np.maximum(*args) if args[0].dtype == args[1].dtype else None,
    "minimum": lambda args, attrs: np.minimum(*args) if args[0].dtype == args[1].dtype else None,
    "add": _float_op(np.add),
    "subtract": _float_op(np.subtract),
    "multiply": _float_op(np.multiply),
    "divide": _float_op(np.divide),
    "negative": _float_op(np.negative),
    "sqrt": _float_op(np.sqrt),
    "expand_dims": lambda args, attrs: _expand_dims(args[0], attrs),
    # FoldScaleAxis squeezes each folded scale to the weight's output-channel axis (DenseNet-121: 240).
    "squeeze": lambda args, attrs: np.squeeze(
        args[0], axis=None if attrs.axis is None else tuple(int(a) for a in attrs.axis)),
    # AlterOpLayout packs each conv's weights and bias into the kernel's blocked layout; relay.build's next
    # FoldConstant compiled each (DenseNet-121: 121 weights, 123 biases, 19 s a build of the model).
    "layout_transform": lambda args, attrs: _layout_transform(args[0], attrs),
    # ONNX's ConstantOfShape (weights stored as one value, as in the onnx package's light models: 836 in
    # DenseNet-121, a kernel built for each: its import 58 -> 12 s). Another dtype than the value's is a
    # cast: TVM's to define.
    "full": lambda args, attrs: _full(args[0], attrs),
}


def _full(value: np.ndarray, attrs) -> Optional[np.ndarray]:
    """``full`` of a scalar constant to ``attrs.shape``, where its dtype is the value's (else None)."""
    dtype = str(attrs.dtype) if attrs.dtype is not None else ""
    if attrs.shape is None or value.ndim != 0 or dtype not in ("", "void", str(value.dtype)):
        return None
    return np.full([int(d) for d in attrs.shape], value, dtype=value.dtype)


#: Ops whose adjacent steps by constants merge into one: ``(x op c1) op c2`` is ``x op (c1 op c2)``, as TVM's
#: ``SimplifyExpr`` rewrites it in ``relay.build`` -- where it folds each ``c1 op c2`` by compiling it
#: (DenseNet-121's conv biases and batch-norm shifts: 121 builds, 10 s a build of the model).
MERGED_STEPS = ("add", "multiply")


def _merged_step(call, op_name: str):
    """``x op (c1 op c2)`` for ``call`` = ``(x op c1) op c2`` (either operand order) of float32 constants
    ``c1``, ``c2`` and a non-constant ``x``; None otherwise."""
    import tvm
    from tvm import relay

    def split(expr):  # (the non-constant operand, the constant) of a step by a constant, else None
        if not (isinstance(expr, relay.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == op_name):
            return None
        a, b = expr.args
        if isinstance(b, relay.Constant) and not isinstance(a, relay.Constant):
            return a, b
        if isinstance(a, relay.Constant) and not isinstance(b, relay.Constant):
            return b, a
        return None

    outer = split(call)
    inner = split(outer[0]) if outer is not None else None
    if inner is None:
        return None
    (x, c1), c2 = inner, outer[1]
    value = NUMPY_FOLDS[op_name]([c1.data.numpy(), c2.data.numpy()], None)
    if value is None:
        return None
    return relay.Call(call.op, [x, relay.const(value, dtype=str(value.dtype))], call.attrs, call.type_args, call.span)


def _constant_args(call):
    """The values of ``call``'s arguments (a tuple's fields for ``concatenate``) if all are constants."""
    from tvm import relay

    args = list(call.args)
    if call.op.name == "concatenate":
        if len(args) != 1 or not isinstance(args[0], relay.Tuple):
            return None
        args = list(args[0].fields)
    if not all(isinstance(a, relay.Constant) for a in args):
        return None
    return [a.data.numpy() for a in args]


def fold_constant_numpy_first(node, mod=None, *, whole: bool = False, merge_steps: bool = False,
                              numpy_only: bool = False):
    """TVM's ``fold_constant`` as its ONNX importer calls it after each node, with the node's new calls of
    :data:`NUMPY_FOLDS` on constants folded in numpy first.

    TVM folds a call on constants by compiling it (LLVM) and running it: a scalar zero point's cast
    costs a kernel build. Those calls are folded here, exactly, without one; what remains (shapes of
    typed tensors, other ops) goes to TVM's fold as before, so the imported module is the same. Earlier
    nodes are folded already (the importer tags each with a span after its fold; the walk stops there);
    ``whole``: walk all of ``node`` (a model's body, every node tagged), as a pass before ``FoldConstant``.
    ``merge_steps``: also merge adjacent steps by constants (:data:`MERGED_STEPS`), which ``relay.build``
    would merge by compiling each (the result is then no longer the importer's module). ``numpy_only``:
    return the node after the numpy folds, without TVM's (for a ``FoldConstant`` that runs next anyway).

    Examples
    --------
    >>> import numpy as np, tvm
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(3,), dtype="int32")
    >>> expr = relay.add(x, relay.cast(relay.const(np.array([1, 2, 3], "int8")), "int32"))
    >>> folded = fold_constant_numpy_first(expr)
    >>> tvm.ir.structural_equal(folded, relay.transform.FoldConstantExpr(expr, tvm.IRModule()))
    True
    """
    import tvm
    from tvm import relay
    from tvm.relay import expr as _expr

    if mod is None:
        mod = tvm.IRModule()
        done = {}
        stack = [(node, False)]
        while stack:  # post order over the untagged part (iterative: models are deep)
            expr, expanded = stack.pop()
            if expr in done:
                continue
            tagged = not whole and expr is not node and getattr(expr, "span", None) is not None
            if tagged or not isinstance(expr, (relay.Call, relay.Tuple, relay.TupleGetItem)):
                done[expr] = expr
                continue
            children = (list(expr.args) if isinstance(expr, relay.Call) else list(expr.fields)
                        if isinstance(expr, relay.Tuple) else [expr.tuple_value])
            if not expanded:
                stack.append((expr, True))
                stack.extend((child, False) for child in children if child not in done)
                continue
            new = [done[child] for child in children]
            if all(a.same_as(b) for a, b in zip(new, children)):
                rebuilt = expr
            elif isinstance(expr, relay.Call):
                rebuilt = _expr.CallWithFields(expr, expr.op, new, expr.attrs, expr.type_args, None, expr.span)
            elif isinstance(expr, relay.Tuple):
                rebuilt = _expr.TupleWithFields(expr, new, None, expr.span)
            else:
                rebuilt = _expr.TupleGetItemWithFields(expr, new[0], expr.index, None, expr.span)
            fold = NUMPY_FOLDS.get(rebuilt.op.name) if isinstance(rebuilt, relay.Call) and isinstance(
                rebuilt.op, tvm.ir.Op) else None
            values = _constant_args(rebuilt) if fold is not None else None
            value = fold(values, rebuilt.attrs) if values is not None else None
            if value is not None:
                value = np.array(value)  # relay.const alone would make int64 int32 and float64 float32
                rebuilt = relay.const(value, dtype=str(value.dtype))
            elif merge_steps and isinstance(rebuilt, relay.Call) and isinstance(rebuilt.op, tvm.ir.Op) \
                    and rebuilt.op.name in MERGED_STEPS:
                rebuilt = _merged_step(rebuilt, rebuilt.op.name) or rebuilt
            done[expr] = rebuilt
        node = done[node]
        if numpy_only:
            return node
    return relay.transform.FoldConstantExpr(node, mod)


def numpy_folds_after_alter_layout():
    """A pass instrument for a ``relay.build``'s ``PassContext``: before each ``FoldConstant`` that follows
    ``AlterOpLayout``, the calls on constants that :data:`NUMPY_FOLDS` computes exactly (the layout
    transforms and expand_dims AlterOpLayout put on each conv's weights and bias) are folded in numpy, so
    that ``FoldConstant`` finds them folded instead of compiling a kernel for each. The built module is
    the same (tested: graph, parameters and outputs).

    ``relay.build`` hands the module to each pass after its instruments' ``run_before_pass``; the
    instrument updates that module's functions in place (TVM offers no other way into the middle of
    ``relay.build``'s pipeline).

    Examples
    --------
    >>> import tvm
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(1, 16, 8, 8)); w = relay.const(np.ones((16, 16, 3, 3), "float32"))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.conv2d(x, w, padding=1, kernel_size=3, channels=16)))
    >>> with tvm.transform.PassContext(opt_level=3, instruments=[numpy_folds_after_alter_layout()]):
    ...     lib = relay.build(mod, target="llvm -mcpu=znver4")
    >>> lib.get_graph_json().startswith("{")
    True
    """
    import tvm
    from tvm import relay

    @tvm.instrument.pass_instrument
    class NumpyFoldsAfterAlterLayout:
        def __init__(self):
            self.altered = False

        def enter_pass_ctx(self):
            self.altered = False

        def run_after_pass(self, mod, info):
            if info.name == "AlterOpLayout":
                self.altered = True

        def run_before_pass(self, mod, info):
            if info.name != "FoldConstant" or not self.altered:
                return
            changed = {}
            for var, func in mod.functions.items():
                if isinstance(func, relay.Function):
                    body = fold_constant_numpy_first(func.body, whole=True, numpy_only=True)
                    if not body.same_as(func.body):
                        changed[var] = relay.Function(func.params, body, None, func.type_params, func.attrs,
                                                      func.span)
            if changed:  # typed as the passes expect, then in place
                functions = {var: changed.get(var, func) for var, func in mod.functions.items()}
                typed = relay.transform.InferType()(tvm.IRModule(functions, mod.type_definitions))
                for var in changed:
                    mod.update_func(var, typed[var.name_hint])

    return NumpyFoldsAfterAlterLayout()


_FOLDING = threading.Lock()
_folding_depth = 0


@contextlib.contextmanager
def numpy_first_folding():
    """Inside, TVM's ONNX importer folds each node with :func:`fold_constant_numpy_first` (the same module,
    imported several times faster: onnxruntime's QDQ BERT-base 129 s -> see docs/benchmarks); TVM's own
    ``fold_constant`` is put back on leaving. ``tvm_tcutils.load_model`` imports ONNX files so; a user's own
    ``relay.frontend.from_onnx`` outside it is TVM's as it is.

    Examples
    --------
    >>> from tvm.relay.frontend import onnx as frontend
    >>> with numpy_first_folding():
    ...     frontend.fold_constant is fold_constant_numpy_first
    True
    >>> frontend.fold_constant is fold_constant_numpy_first
    False
    """
    from tvm.relay.frontend import onnx as frontend

    global _folding_depth
    with _FOLDING:
        if _folding_depth == 0:
            numpy_first_folding.tvm_fold = frontend.fold_constant
            frontend.fold_constant = fold_constant_numpy_first
        _folding_depth += 1
    try:
        yield
    finally:
        with _FOLDING:
            _folding_depth -= 1
            if _folding_depth == 0:
                frontend.fold_constant = numpy_first_folding.tvm_fold


def onnx_model_for_ort(model):
    """Return ``model`` with an IR version the installed onnxruntime accepts.

    Examples
    --------
    >>> import onnx
    >>> m = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    >>> onnx_model_for_ort(m).ir_version <= MAX_ORT_IR_VERSION
    True
    """
    if model.ir_version <= MAX_ORT_IR_VERSION:
        return model
    fixed = type(model)()
    fixed.CopyFrom(model)
    fixed.ir_version = MAX_ORT_IR_VERSION
    return fixed
