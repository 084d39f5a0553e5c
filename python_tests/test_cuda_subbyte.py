"""Element-wise int4/uint4 access in CUDA kernels (:mod:`tvm_tcutils.cuda_subbyte`).

TVM's CUDA code generator prints a scalar 4-bit load or store as the whole
32-bit word at ``index / 8``; the package rewrites such accesses to act on the
nibble. Checked here: the TIR rewrite (which accesses change, to what, and what
stays), the device functions' arithmetic (compiled for the CPU with stand-ins
for the two atomics), the hook around ``target.build.cuda`` (generated source
and machine code; needs the CUDA plugin), and, on a GPU, int4 tensors written
by one kernel and read by another.
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relay, tir
from tvm.script import tir as T

import tvm_tcutils
from tvm_tcutils import cuda, cuda_subbyte, registry

STATUS = cuda.status()
needs_plugin = pytest.mark.skipif(not STATUS["codegen"], reason=f"no CUDA code generation: {STATUS['reason']}")
needs_gpu = pytest.mark.skipif(not STATUS["device"], reason="no CUDA GPU")


def _calls(func: tir.PrimFunc) -> list:
    """(name, args) of every call_extern in ``func``."""
    found = []

    def visit(node):
        if isinstance(node, tir.Call) and node.op.same_as(tvm.ir.Op.get("tir.call_extern")):
            found.append((str(node.args[0].value), list(node.args[1:])))

    tir.stmt_functor.post_order_visit(func.body, visit)
    return found


def _rewritten(func: tir.PrimFunc) -> tir.PrimFunc:
    mod = tvm.IRModule({"main": func})
    return cuda_subbyte.lower_subbyte_access(mod)["main"]


@pytest.mark.parametrize("dtype,load", [("int4", "tcutils_load_s4"), ("uint4", "tcutils_load_u4")])
@pytest.mark.parametrize("scope,store", [("global", "tcutils_store4_atomic"), ("shared", "tcutils_store4_atomic"),
                                         ("local", "tcutils_store4")])
def test_scalar_loads_and_stores_act_on_the_nibble(dtype, load, scope, store):
    @T.prim_func
    def copy(a: T.handle, b: T.handle):
        A = T.match_buffer(a, (64,), dtype)
        B = T.match_buffer(b, (64,), dtype, scope=scope)
        for i in range(64):
            B[i] = A[i]

    before = copy.script()
    fixed = _rewritten(copy)
    assert copy.script() == before, "the input function must not change"
    assert cuda_subbyte.scalar_subbyte_accesses(copy) and not cuda_subbyte.scalar_subbyte_accesses(fixed)
    names = [name for name, _ in _calls(fixed)]
    assert names == [load, store]
    store_args = _calls(fixed)[1][1]
    assert store_args[0].same_as(fixed.buffer_map[fixed.params[1]].data)  # the buffer's own pointer


def _loop(name: str, buffers: dict, value_of) -> tir.PrimFunc:
    """``for i in range(16): out[i] = value_of(i, buffers)`` as a PrimFunc (TVMScript has no int4 literals)."""
    decl = {key: tir.decl_buffer((16,), dtype, key) for key, dtype in buffers.items()}
    i = tir.Var("i", "int32")
    body = tir.For(i, 0, 16, tir.ForKind.SERIAL, tir.BufferStore(decl["out"], value_of(i, decl), [i]))
    params = [tir.Var(f"{key}_handle", "handle") for key in decl]
    func = tir.PrimFunc(params, body, buffer_map=dict(zip(params, decl.values())))
    return func.with_attr("global_symbol", name)


@pytest.mark.parametrize("value", [-3, 7, -8, 0])
def test_casts_and_constants_wrap_to_four_bits_with_sign(value):
    fill = _loop("fill", {"a": "int32", "out": "int4"}, lambda i, b: tir.if_then_else(
        i < 8, tir.Cast("int4", tir.BufferLoad(b["a"], [i])), tir.IntImm("int4", value)))

    (name, args), = _calls(_rewritten(fill))[-1:]
    assert name == "tcutils_store4_atomic"
    chosen = args[2]
    assert isinstance(chosen, tir.Call)  # if_then_else of the two widened values
    wrapped, constant = chosen.args[1], chosen.args[2]
    assert str(wrapped.args[0].value) == "tcutils_wrap_s4"
    assert isinstance(constant, tir.IntImm) and constant.dtype == "int32" and int(constant.value) == value


def test_reads_feeding_arithmetic_are_widened_first():
    def value_of(i, b):
        load = tir.BufferLoad(b["a"], [i])
        return tir.Cast("int32", load) * 3 + tir.Cast("int32", tir.Max(load, tir.IntImm("uint4", 2)))

    widen = _loop("widen", {"a": "uint4", "out": "int32"}, value_of)

    fixed = _rewritten(widen)
    assert [name for name, _ in _calls(fixed)] == ["tcutils_load_u4", "tcutils_load_u4"]
    assert not cuda_subbyte.scalar_subbyte_accesses(fixed)


def test_whole_word_accesses_and_other_types_are_left_alone():
    @T.prim_func
    def vector(a: T.Buffer((64,), "int4"), b: T.Buffer((64,), "int4"), c: T.Buffer((8,), "int8")):
        for i in range(8):
            b[i * 8:i * 8 + 8] = a[i * 8:i * 8 + 8]
            c[i] = c[i] + T.int8(1)

    mod = tvm.IRModule({"vector": vector})
    assert cuda_subbyte.lower_subbyte_access(mod) is mod


def test_unknown_four_bit_arithmetic_is_refused_naming_the_kernel():
    shifted = _loop("shifted", {"a": "int4", "out": "int4"},
                    lambda i, b: tir.shift_right(tir.BufferLoad(b["a"], [i]), tir.IntImm("int4", 1)))

    with pytest.raises(ValueError, match="kernel shifted: 4-bit expression"):
        cuda_subbyte.lower_subbyte_access(tvm.IRModule({"shifted": shifted}))


def _compiler():
    return shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


@pytest.fixture(scope="module")
def helpers(tmp_path_factory):
    """The device functions compiled for the CPU, with one-thread stand-ins for CUDA's two atomics."""
    compiler = _compiler()
    if compiler is None:
        pytest.skip("no C++ compiler to build the device functions for the CPU")
    folder = tmp_path_factory.mktemp("subbyte")
    source = folder / "helpers.cc"
    source.write_text(
        "#define __device__\n#define __forceinline__ inline\n"
        "static unsigned atomicAnd(unsigned* a, unsigned v) { unsigned o = *a; *a &= v; return o; }\n"
        "static unsigned atomicOr(unsigned* a, unsigned v) { unsigned o = *a; *a |= v; return o; }\n"
        + cuda_subbyte.HELPERS
        + 'extern "C" int load_s4(const void* b, long long i) { return tcutils_load_s4(b, i); }\n'
        'extern "C" int load_u4(const void* b, long long i) { return tcutils_load_u4(b, i); }\n'
        'extern "C" void store_atomic(void* b, long long i, int v) { tcutils_store4_atomic(b, i, v); }\n'
        'extern "C" void store(void* b, long long i, int v) { tcutils_store4(b, i, v); }\n'
        'extern "C" int wrap_s4(int v) { return tcutils_wrap_s4(v); }\n'
    )
    library = folder / "helpers.so"
    subprocess.run([compiler, "-O1", "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
    lib = ctypes.CDLL(str(library))
    for name in ("load_s4", "load_u4", "store_atomic", "store"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_longlong] + ([ctypes.c_int] if "store" in name else [])
    return lib


def _packed(values: np.ndarray) -> np.ndarray:
    """Nibbles packed as TVM lays out int4 buffers: element i in bits 4 * (i % 8) of word i // 8."""
    nibbles = (values.astype(np.int64) & 15).reshape(-1, 8)
    return (nibbles << (4 * np.arange(8))).sum(axis=1).astype(np.uint32)


@pytest.mark.parametrize("store", ["store_atomic", "store"])
def test_device_functions_read_and_write_tvm_s_nibble_layout(helpers, store):
    rng = np.random.default_rng(0)
    values = rng.integers(-8, 8, size=64)
    words = _packed(values)
    pointer = words.ctypes.data
    assert [helpers.load_s4(pointer, i) for i in range(64)] == list(values)
    assert [helpers.load_u4(pointer, i) for i in range(64)] == list(values & 15)
    # Overwrite every third element; the neighbours in the same word must keep their value.
    new = values.copy()
    for i in range(0, 64, 3):
        new[i] = -values[i] - 1
        getattr(helpers, store)(pointer, i, int(new[i]))
    assert np.array_equal(words, _packed(new))
    assert [helpers.wrap_s4(v) for v in (7, 8, 15, 16, -9)] == [7, -8, -1, 0, 7]


def _cast_on_device(dtype: str) -> tvm.IRModule:
    """8-bit input -> ``dtype`` (one kernel) -> back to 8 bits (another kernel, fusion stopped between)."""
    storage = "int8" if dtype == "int4" else "uint8"
    x = relay.var("x", shape=(4, 100), dtype=storage)
    y = relay.cast(relay.annotation.stop_fusion(relay.cast(x, dtype)), storage)
    return tvm.IRModule.from_expr(relay.Function([x], y))


def _source(lib) -> str:
    return lib.get_lib().imported_modules[0].get_source()


@needs_plugin
def test_relay_builds_write_int4_tensors_through_the_helpers_and_unregister_restores_tvm():
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_cast_on_device("int4"), target="cuda -arch=sm_80")
    source = _source(lib)
    assert source.count(cuda_subbyte.HELPERS.strip().splitlines()[0]) == 1
    assert "tcutils_store4_atomic(T_cast" in source and "tcutils_load_s4(" in source
    kernels = cuda.sass(cuda.module_cubin(lib))
    writer = [name for name, code in kernels.items() if "ATOM" in code or "RED." in code]
    assert writer, "the kernel that writes the int4 tensor must update its words atomically"
    tvm_tcutils.unregister()
    try:
        with tvm.transform.PassContext(opt_level=3):
            plain = relay.build(_cast_on_device("int4"), target="cuda -arch=sm_80")
    finally:
        tvm_tcutils.register()
    assert "tcutils_" not in _source(plain)  # TVM's own code generator, as it was


@needs_plugin
def test_int4_tensor_core_conv_keeps_its_whole_word_copies_and_s4_mma():
    x = relay.var("x", shape=(8, 8, 8, 64), dtype="int8")
    w = relay.var("w", shape=(3, 3, 16, 64), dtype="int8")
    y = relay.nn.conv2d(relay.cast(x, "int4"), relay.cast(w, "int4"), padding=1, kernel_size=(3, 3),
                        data_layout="HWNC", kernel_layout="HWOI", out_dtype="int32")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(tvm.IRModule.from_expr(relay.Function([x, w], y)), target="cuda -arch=sm_80")
    kernels = cuda.sass(cuda.module_cubin(lib))
    conv = [code for name, code in kernels.items() if "conv2d" in name and "IMMA" in code]
    assert conv and all("IMMA.8832.S4.S4" in code and "ATOM" not in code and "RED." not in code for code in conv)
    assert "tcutils_store4_atomic(T_cast" in _source(lib)  # the casts that make its int4 inputs


@needs_gpu
@pytest.mark.parametrize("dtype", ["int4", "uint4"])
def test_int4_tensors_round_trip_between_kernels_on_the_gpu(dtype):
    storage, (low, high) = ("int8", (-8, 7)) if dtype == "int4" else ("uint8", (0, 15))
    values = np.random.default_rng(0).integers(low, high + 1, size=(4, 100)).astype(storage)
    arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_cast_on_device(dtype), target=f"cuda -arch={arch}")
    module = tvm.contrib.graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("x", values)
    module.run()
    np.testing.assert_array_equal(module.get_output(0).numpy(), values)


def test_registry_declares_the_build_hook_only_where_tvm_has_a_code_generator():
    names = {row.name for row in registry.registered() if row.kind == "packed_func"}
    assert ("target.build.cuda" in names) == STATUS["codegen"]


def test_casts_of_short_constant_expressions_fold_and_long_graphs_are_not_walked():
    weight = np.random.default_rng(0).integers(-8, 8, size=(2, 3, 4, 8)).astype("float32")
    chain = relay.transpose(relay.const(weight), (0, 2, 3, 1))  # a weight's layout change, as ConvertLayout makes
    folded = cuda_subbyte.fold_subbyte_cast(relay.cast(chain, "int4"))
    np.testing.assert_array_equal(cuda_subbyte.subbyte_values(folded.data), weight.transpose(0, 2, 3, 1))
    # Beyond the budget the expression is left to TVM: a layer's input graph is not walked whole per layer.
    long_chain = relay.const(weight)
    for _ in range(cuda_subbyte.CONSTANT_EXPRESSION_BUDGET):
        long_chain = relay.negative(relay.negative(long_chain))
    assert cuda_subbyte.fold_subbyte_cast(relay.cast(long_chain, "int4")) is None
