"""``import tvm_tcutils`` makes TVM 0.19's ONNX importer work with the installed onnx (issue 22).

TVM 0.19 reads ``onnx.mapping``, which onnx 1.19+ removed; the package puts it
back when onnx gets imported (:func:`tvm_tcutils._compat.install_onnx_shim`),
without importing onnx itself. Each check runs in a fresh interpreter, since
the order of the imports is what is tested.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest

from conftest import counted_relay_builds, run_python

pytest.importorskip("onnx")

_MODEL = r"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

def matmul_model():
    w = numpy_helper.from_array(np.arange(12, dtype="float32").reshape(4, 3) / 10, "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], initializer=[w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
"""

_FROM_ONNX = r"""
from tvm import relay
mod, params = relay.frontend.from_onnx(matmul_model(), {"x": (2, 4)})
print("OK", mod["main"].checked_type.ret_type)
"""


def _run(code: str):
    proc = run_python(code, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.timeout(300)
def test_from_onnx_works_after_import_tvm_tcutils():
    out = _run("import tvm_tcutils, onnx\n" + _MODEL + _FROM_ONNX)
    assert "OK Tensor[(2, 3), float32]" in out


@pytest.mark.timeout(300)
def test_from_onnx_works_when_onnx_was_imported_first():
    out = _run("import onnx, tvm_tcutils\n" + _MODEL + _FROM_ONNX)
    assert "OK Tensor[(2, 3), float32]" in out


@pytest.mark.timeout(300)
def test_import_does_not_import_onnx_nor_need_it():
    # onnx unimportable (None in sys.modules): the package still imports, and so would not load it.
    code = (
        "import sys\n"
        "import tvm_tcutils\n"
        "assert 'onnx' not in sys.modules, 'import tvm_tcutils imported onnx'\n"
        "sys.modules['onnx'] = None\n"
        "import importlib, tvm_tcutils._compat as c\n"
        "c.install_onnx_shim()\n"
        "try:\n"
        "    import onnx\n"
        "except ImportError:\n"
        "    print('NO ONNX')\n"
    )
    assert "NO ONNX" in _run(code)


@pytest.mark.timeout(600)
def test_qlinearmatmul_3d_int8_imports_builds_and_matches_onnxruntime():
    # The attention matmul of quantized transformers: TVM's own VNNI path aborted on it (exit 134).
    pytest.importorskip("onnxruntime")
    code = r"""
import numpy as np, onnx, onnxruntime as ort, tvm, tvm_tcutils
from onnx import TensorProto, helper
from tvm import relay
from tvm.contrib import graph_executor
from tvm_tcutils._compat import onnx_model_for_ort

rng = np.random.default_rng(0)
a = rng.integers(-128, 128, (2, 5, 36)).astype("int8")
b = rng.integers(-128, 128, (2, 36, 20)).astype("int8")
consts = [helper.make_tensor(name, dt, [], [val]) for name, dt, val in [
    ("a_s", TensorProto.FLOAT, 0.02), ("a_z", TensorProto.INT8, 3), ("b_s", TensorProto.FLOAT, 0.01),
    ("b_z", TensorProto.INT8, 0), ("y_s", TensorProto.FLOAT, 0.5), ("y_z", TensorProto.INT8, -2)]]
node = helper.make_node("QLinearMatMul", ["a", "a_s", "a_z", "b", "b_s", "b_z", "y_s", "y_z"], ["y"])
graph = helper.make_graph([node], "g",
    [helper.make_tensor_value_info("a", TensorProto.INT8, a.shape),
     helper.make_tensor_value_info("b", TensorProto.INT8, b.shape)],
    [helper.make_tensor_value_info("y", TensorProto.INT8, [2, 5, 20])], initializer=consts)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
ref = ort.InferenceSession(onnx_model_for_ort(model).SerializeToString(),
                           providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})[0]
mod, params = relay.frontend.from_onnx(model, {"a": a.shape, "b": b.shape})
for target in ("llvm -mcpu=cascadelake", "llvm -mcpu=skylake-avx512", tvm_tcutils.host_target()):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    if target != tvm_tcutils.host_target():
        continue  # built without abort; this CPU may not run it
    run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    run.set_input(a=a, b=b)
    run.run()
    diff = np.abs(run.get_output(0).numpy().astype(int) - ref.astype(int))
    assert diff.max() <= 1, diff.max()
print("OK")
"""
    assert "OK" in _run(code)


def _dropout_model(training=None, outputs=1):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.array(0.5, "float32"), "ratio")]
    names = ["x", "ratio"]
    if training is not None:
        inits.append(numpy_helper.from_array(np.array(training), "training"))
        names.append("training")
    outs = ["y", "mask"][:outputs]
    graph = helper.make_graph(
        [helper.make_node("Dropout", names, outs), helper.make_node("Relu", ["y"], ["z"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("training, outputs", [(None, 1), (False, 1), (False, 2)])
def test_opset13_dropout_imports_as_identity(training, outputs):
    import numpy as np
    from tvm import relay

    import tvm_tcutils  # noqa: F401  (installs the converters)

    mod, params = relay.frontend.from_onnx(_dropout_model(training, outputs), freeze_params=True)
    assert "dropout" not in mod.astext()
    x = np.array([[-1, 2, -3, 4], [5, -6, 7, -8]], "float32")
    out = relay.create_executor("graph", mod=mod).evaluate()(x).numpy()
    np.testing.assert_array_equal(out, np.maximum(x, 0))


def test_dropout_in_training_mode_is_refused():
    from tvm import relay

    import tvm_tcutils  # noqa: F401

    with pytest.raises(ValueError, match="training_mode=True is not an inference model"):
        relay.frontend.from_onnx(_dropout_model(True), freeze_params=True)


def _qdq_attention_file(path) -> str:
    """A QDQ file as quantizers write one: zero points cast, 3-D MatMuls whose batch shapes the importer
    computes from constants (slices, maxima, concatenations)."""
    import numpy as np

    from tvm_tcutils.onnx_writer import OnnxGraph

    rng = np.random.default_rng(5)
    g = OnnxGraph("qdq_attention")
    g.input("x", "float32", [2, 8, 16])

    def qdq(name, scale, zero):
        q = g.node("QuantizeLinear", [name, g.const(np.float32(scale), "s"), g.const(np.uint8(zero), "z")])
        return g.node("DequantizeLinear", [q, g.const(np.float32(scale), "s"), g.const(np.uint8(zero), "z")])

    w = g.node("DequantizeLinear", [g.const(rng.integers(-127, 128, (16, 16)).astype("int8"), "w"),
                                    g.const(np.float32(0.02), "ws"), g.const(np.int8(0), "wz")])
    q = qdq(g.node("MatMul", [qdq("x", 0.05, 120), w]), 0.1, 128)
    k = qdq(g.node("Transpose", [q], perm=[0, 2, 1]), 0.1, 128)
    g.output(g.node("MatMul", [q, k]), "float32", [2, 8, 8])
    with open(path, "wb") as handle:
        handle.write(g.model().SerializeToString())
    return str(path)


def _light_style_file(path) -> str:
    """Convs whose weights are ONNX ConstantOfShape nodes (as in the onnx package's light models), a split
    with an output left unused, and a reshape to a shape computed from integer constants."""
    import onnx

    from tvm_tcutils.onnx_writer import OnnxGraph

    g = OnnxGraph("light_style")
    g.input("x", "float32", [1, 4, 6, 6])
    y = "x"
    for k, value in enumerate((0.1, -0.05, 0.02)):
        w = g.node("ConstantOfShape", [g.const(np.array([4, 4, 3, 3], "int64"), "shape")],
                   value=onnx.numpy_helper.from_array(np.array([value], "float32")))
        y = g.node("Relu", [g.node("Conv", [y, w], pads=[1, 1, 1, 1])])
    first = g.node("Split", [y, g.const(np.array([2, 2], "int64"), "split")], outputs=["a", "b"], axis=1)
    # Integer arithmetic on constants: numpy's rounding is not TVM's, so TVM's fold computes it.
    target = g.node("Add", [g.const(np.array([1, -2], "int64"), "a"), g.const(np.array([0, 1], "int64"), "b")])
    flat = g.node("Reshape", [first, target])
    g.output(flat, "float32", [1, 72])
    with open(path, "wb") as handle:
        handle.write(g.model().SerializeToString())
    return str(path)


@pytest.mark.parametrize("make, ours, theirs_at_least", [
    # Casts, slices and concatenations of constants (1,612 builds for onnxruntime's QDQ BERT-base).
    (_qdq_attention_file, 0, 30),
    # ConstantOfShape fills (DenseNet-121 light: 836, its import 58 -> 12 s); integer arithmetic on
    # constants stays TVM's: one build.
    (_light_style_file, 1, 4),
])
def test_load_model_folds_constants_in_numpy_to_the_same_module(tmp_path, make, ours, theirs_at_least):
    # TVM's importer compiles a kernel for each fold; load_model folds those in numpy: the same module.
    import onnx
    import tvm
    from tvm import relay

    import tvm_tcutils
    from tvm_tcutils import _compat

    path = make(tmp_path / "model.onnx")
    with counted_relay_builds() as builds:
        mine, _ = tvm_tcutils.load_model(path)
        mine_builds = len(builds)
        theirs, _ = relay.frontend.from_onnx(onnx.load(path), freeze_params=True)
    assert tvm.ir.structural_equal(mine, theirs, map_free_vars=True)
    assert mine_builds == ours and len(builds) - mine_builds >= theirs_at_least, (mine_builds, len(builds))
    from tvm.relay.frontend import onnx as frontend
    assert frontend.fold_constant is not _compat.fold_constant_numpy_first  # TVM's again after the import


#: Floats whose arithmetic rounds: tiny, huge, subnormal, signed zero, and random ones.
_FLOATS = np.concatenate([[1e-38, 3e38, 1e-45, -0.0, 7.0, 1.0 / 3.0],
                          np.random.default_rng(5).normal(0, 3, 10)]).astype("float32")


@pytest.mark.parametrize("name, values, attrs", [
    ("cast", [np.array([-128, 0, 127], "int8")], dict(dtype="int32")),
    ("cast", [np.array([-1, 300], "int32")], dict(dtype="uint8")),  # wraps, as the kernel does
    ("cast", [np.array([16777217], "int64")], dict(dtype="float32")),  # rounds to nearest
    ("cast", [np.array([0.1], "float64")], dict(dtype="float32")),
    ("strided_slice", [np.arange(24, dtype="int64").reshape(2, 3, 4)], dict(begin=[1, -2], end=[2, 3], strides=[1, 1],
                                                                          axes=[0, 2])),
    ("strided_slice", [np.arange(10, dtype="int64")], dict(begin=[8], end=[1], strides=[-3])),
    ("concatenate", [np.array([1, 2], "int64"), np.array([3], "int64")], dict(axis=0)),
    ("maximum", [np.array([1, 5], "int64"), np.array([4, 2], "int64")], {}),
    ("minimum", [np.array([1.5, -0.0], "float32"), np.array([0.5, 0.0], "float32")], {}),
    # A batch norm's scale and shift as SimplifyInference writes them, broadcast, with awkward values.
    *[(op, [_FLOATS, np.array([[1e-5], [3.0], [-0.0]], "float32")], {})
      for op in ("add", "subtract", "multiply", "divide")],
    ("divide", [np.array(1.0, "float32"), _FLOATS], {}),
    ("sqrt", [np.abs(_FLOATS)], {}),
    ("sqrt", [np.array([-1.0, 0.0, 2.0], "float32")], {}),
    ("negative", [_FLOATS], {}),
    ("expand_dims", [_FLOATS], dict(axis=-1, num_newaxis=2)),
    ("expand_dims", [np.array(2.0, "float32")], dict(axis=0, num_newaxis=1)),
    ("squeeze", [_FLOATS.reshape(1, 16, 1, 1)], dict(axis=[0, 2, 3])),
    ("squeeze", [_FLOATS.reshape(16, 1, 1)], dict(axis=[-1])),
    ("squeeze", [_FLOATS.reshape(1, 16, 1)], {}),
    # ONNX ConstantOfShape, as TVM's importer writes it.
    ("full", [np.array(-0.0, "float32")], dict(shape=[2, 3, 1])),
    ("full", [np.array(7, "int64")], dict(shape=[4])),
    ("full", [np.array(1e-45, "float32")], dict(shape=[3], dtype="float32")),
    # AlterOpLayout's packings of conv weights and biases, and their inverses and re-blockings.
    *[("layout_transform", [np.random.default_rng(len(src + dst)).normal(size=shape).astype("float32")],
       dict(src_layout=src, dst_layout=dst))
      for shape, src, dst in [((32, 48, 3, 3), "OIHW", "OIHW16i16o"), ((1, 32, 5, 5), "NCHW", "NCHW16c"),
                              ((1, 2, 5, 5, 16), "NCHW16c", "NCHW"), ((1, 8, 5, 5, 4), "NCHW4c", "NCHW16c"),
                              ((32, 48, 3, 3), "OIHW", "HWIO"), ((2, 5, 5, 32), "NHWC", "NCHW8c"),
                              ((32, 48, 1, 1), "OIHW", "OIHW3i8o"), ((1, 64, 1, 1), "NCHW", "NCHW16c")]],
])
def test_numpy_folds_equal_tvms_fold(name, values, attrs):
    import tvm
    from tvm import relay

    from tvm_tcutils._compat import fold_constant_numpy_first

    consts = [relay.const(v, dtype=str(v.dtype)) for v in values]
    if name == "concatenate":
        expr = relay.concatenate(consts, **attrs)
    elif name == "cast":
        expr = relay.cast(consts[0], **attrs)
    elif name == "strided_slice":
        expr = relay.strided_slice(consts[0], **attrs)
    elif name == "full":
        expr = relay.full(consts[0], **attrs)
    elif name in ("expand_dims", "squeeze", "layout_transform"):
        expr = getattr(relay, name)(consts[0], **attrs)
    else:
        expr = getattr(relay, name)(*consts)
    with warnings.catch_warnings():  # inf / nan values folded silently, as TVM's fold gives them
        warnings.simplefilter("error")
        ours = fold_constant_numpy_first(expr)
    theirs = relay.transform.FoldConstantExpr(expr, tvm.IRModule())
    assert isinstance(ours, relay.Constant) and ours.data.dtype == theirs.data.dtype
    assert ours.data.shape == theirs.data.shape
    np.testing.assert_array_equal(ours.data.numpy(), theirs.data.numpy())


@pytest.mark.parametrize("shape, src, dst", [
    ((30, 48, 3, 3), "OIHW", "OIHW16i16o"),  # 30 output channels in blocks of 16: TVM pads
    ((32, 48, 3, 3), "OIHW", "OIHW4i16o4i"),  # an axis split twice
])
def test_layout_transforms_numpy_cannot_copy_are_left_to_tvms_fold(shape, src, dst):
    import types

    from tvm_tcutils._compat import NUMPY_FOLDS

    value = np.ones(shape, "float32")
    assert NUMPY_FOLDS["layout_transform"]([value], types.SimpleNamespace(src_layout=src, dst_layout=dst)) is None


def _conv_net_with_biases():
    import tvm
    from tvm import relay

    rng = np.random.default_rng(3)
    x = relay.var("x", shape=(1, 3, 16, 16))
    y = x
    for i, (cin, cout, k) in enumerate([(3, 32, 3), (32, 32, 1), (32, 48, 3), (48, 30, 3)]):
        w = relay.const(rng.normal(size=(cout, cin, k, k)).astype("float32"))
        b = relay.const(rng.normal(size=(cout,)).astype("float32"))
        y = relay.nn.relu(relay.nn.bias_add(relay.nn.conv2d(y, w, padding=k // 2, kernel_size=k, channels=cout), b))
    return tvm.IRModule.from_expr(relay.Function([x], y)), rng.normal(size=(1, 3, 16, 16)).astype("float32")


def test_numpy_folds_after_alter_layout_build_the_same_module_without_compiling_constants():
    # AlterOpLayout packs every conv's weights and bias; the FoldConstant after it compiled a kernel for each.
    # With the instrument that FoldConstant finds them folded, and relay.build's graph, parameters and outputs
    # are the same, byte for byte.
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    import tvm_tcutils
    from tvm_tcutils._compat import numpy_folds_after_alter_layout

    mod, x = _conv_net_with_biases()
    target = tvm_tcutils.host_target()

    @tvm.instrument.pass_instrument
    class ConstantCalls:  # calls on constants left for the FoldConstant after AlterOpLayout
        def __init__(self):
            self.altered, self.counts = False, []

        def run_after_pass(self, m, info):
            self.altered |= info.name == "AlterOpLayout"

        def run_before_pass(self, m, info):
            if info.name == "FoldConstant" and self.altered:
                found = []
                relay.analysis.post_order_visit(m["main"], lambda e: found.append(1) if isinstance(
                    e, relay.Call) and e.args and all(isinstance(a, relay.Constant) for a in e.args) else None)
                self.counts.append(len(found))

    built = {}
    for name, first in (("tvm", []), ("numpy", [numpy_folds_after_alter_layout()])):
        spy = ConstantCalls()
        with tvm.transform.PassContext(opt_level=3, instruments=first + [spy]):
            lib = relay.build(mod, target=target)
        runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        runner.set_input("x", x)
        runner.run()
        params = {k: v.numpy() for k, v in lib.get_params().items()}
        built[name] = (lib.get_graph_json(), params, runner.get_output(0).numpy(), spy.counts)
    (graph, params, out, counts), (graph2, params2, out2, counts2) = built["tvm"], built["numpy"]
    assert counts[-1] >= 8 and counts2 == [0]  # 4 weights and 4 biases
    assert graph == graph2 and params.keys() == params2.keys()
    for key in params:
        assert params[key].tobytes() == params2[key].tobytes(), key
    assert out.tobytes() == out2.tobytes()


def test_a_fill_of_another_dtype_than_its_value_is_left_to_tvms_fold():
    import types

    from tvm_tcutils._compat import NUMPY_FOLDS

    value = np.array(1.5, "float32")  # into int32: a cast, TVM's to define
    assert NUMPY_FOLDS["full"]([value], types.SimpleNamespace(shape=[2], dtype="int32")) is None
    assert NUMPY_FOLDS["full"]([np.ones(2, "float32")], types.SimpleNamespace(shape=[2], dtype="")) is None


def test_integer_arithmetic_is_left_to_tvms_fold():
    # Integer division rounds toward zero in TVM and down in numpy; overflow is TVM's to define.
    from tvm_tcutils._compat import NUMPY_FOLDS

    values = [np.array([-7, 7], "int32"), np.array([2, 2], "int32")]
    assert all(NUMPY_FOLDS[op](values, None) is None for op in ("add", "subtract", "multiply", "divide"))


def test_relay_lowering_reads_tvms_build_facts_once_per_process(monkeypatch):
    # TVM's te_compiler asks libinfo() for every dimension it lowers (2-4 ms each, a map converted entry by
    # entry); the package's wrapper (installed by `import tvm_tcutils`) keeps the first answer.
    import tvm
    import tvm.support
    from tvm import relay
    from tvm.relay.backend import te_compiler

    from tvm_tcutils._compat import install_cached_libinfo

    calls = []

    def counted():
        calls.append(1)
        return tvm.support.libinfo()

    monkeypatch.setattr(te_compiler, "libinfo", counted)
    install_cached_libinfo()
    assert te_compiler.libinfo.tcutils_original is counted
    x = relay.var("x", shape=(1, 8, 4, 4))
    for k in range(2):
        mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.relu(x) + relay.const(float(k))))
        relay.build(mod, target="llvm")
    assert len(calls) == 1
    assert te_compiler.libinfo() == tvm.support.libinfo() and te_compiler.libinfo() is not te_compiler.libinfo()
    install_cached_libinfo()  # idempotent: TVM's (here the counted) function stays the one read
    assert te_compiler.libinfo.tcutils_original is counted
