"""What Relay fuses after a tensor-core GEMM, folded into the GEMM's kernel (tvm_tcutils.tensorcore.topi.epilogue).

The folding rewrites a kernel's stores, whatever the kernel: here it is checked
on plain CPU kernels (run, bit-exact against numpy), then on the package's CUDA
kernels through ``relay.build`` (one kernel per fused layer, 8-bit stores, the
tensor-core instructions and no local memory in its SASS). The GPU runs of the
fused layers are in test_mma_conv2d.py, test_mma_gemm.py and test_wgmma_gemm.py.
"""
from __future__ import annotations

import re

import numpy as np
import pytest
import tvm
from tvm import relay, te, tir, topi
from tvm.script import tir as T

from conftest import needs_cuda_codegen, sass_opcodes
from tvm_tcutils import cuda, registry
from tvm_tcutils.tensorcore import strategy
from tvm_tcutils.tensorcore.topi import epilogue, mma_gemm


def _plain_gemm(m: int, n: int, k: int, rows: int):
    """A CPU GEMM kernel in the package's extern form: ``rows >= m`` rows computed (as whole block tiles
    would), sums kept in a local accumulator and stored once, as the tensor-core kernels do."""
    @T.prim_func
    def gemm(a: T.Buffer((m, k), "int8"), b: T.Buffer((n, k), "int8"), c: T.Buffer((rows, n), "int32")):
        for i, j in T.grid(rows, n):
            acc = T.decl_buffer((1,), "int32", scope="local")
            acc[0] = 0
            for r in range(k):
                acc[0] = acc[0] + T.Cast("int32", a[T.min(i, m - 1), r]) * T.Cast("int32", b[j, r])
            c[i, j] = acc[0]

    return gemm


def _run(out: te.Tensor, args, arrays):
    sched = te.create_schedule(out.op)
    func = tvm.build(sched, [*args, out], "llvm")
    result = tvm.nd.array(np.full([int(s) for s in out.shape], 77, out.dtype))
    func(*(tvm.nd.array(a) for a in arrays), result)
    return result.numpy()


@pytest.mark.parametrize("m, n, k, rows", [(6, 10, 8, 6), (5, 16, 12, 8), (1, 3, 4, 16)])
def test_a_requantize_chain_folds_into_the_kernel_bit_exact(m, n, k, rows):
    rng = np.random.default_rng(m * n)
    x, w = te.placeholder((m, k), "int8", name="x"), te.placeholder((n, k), "int8", name="w")
    bias = te.placeholder((n,), "int32", name="bias")
    scale = te.placeholder((1, n), "float32", name="scale")
    residual = te.placeholder((m, n), "int8", name="residual")
    # Relay lowers a scalar constant to a computation of no axes (inlined here).
    shift = te.compute((), lambda: tir.const(2, "int32"), name="compile_engine_const")
    sums = mma_gemm.extern_op(_plain_gemm(m, n, k, rows), x, w, "plain", out_shape=(m, n))
    steps = [lambda t: topi.add(t, bias), lambda t: topi.right_shift(t, shift),
             lambda t: topi.multiply(topi.cast(t, "float32"), scale), topi.round,
             lambda t: topi.cast(topi.clip(t, -128, 127), "int8"),
             lambda t: topi.cast(topi.add(topi.cast(t, "int32"), topi.cast(residual, "int32")), "int16")]
    out = sums
    for step in steps:
        out = epilogue.fold(step(out))
        assert out is not None and out.op.tag == "tcutils_plain"
    assert [t.op.name for t in out.op.input_tensors] == ["x", "w", "bias", "scale", "residual"]
    assert out.dtype == "int16"

    xa, wa = rng.integers(-128, 128, (m, k)).astype("int8"), rng.integers(-128, 128, (n, k)).astype("int8")
    ba = rng.integers(-3000, 3000, n).astype("int32")
    sa = rng.uniform(0.001, 0.05, (1, n)).astype("float32")
    ra = rng.integers(-128, 128, (m, n)).astype("int8")
    acc = (xa.astype(np.int64) @ wa.T.astype(np.int64) + ba) >> 2
    requantized = np.clip(np.round(acc.astype(np.float32) * sa), -128, 127).astype(np.int8)
    want = (requantized.astype(np.int32) + ra).astype(np.int16)
    np.testing.assert_array_equal(_run(out, [x, w, bias, scale, residual], [xa, wa, ba, sa, ra]), want)


def test_rows_past_the_output_are_not_stored():
    m, n, k, rows = 3, 4, 4, 8
    x, w = te.placeholder((m, k), "int8", name="x"), te.placeholder((n, k), "int8", name="w")
    out = mma_gemm.extern_op(_plain_gemm(m, n, k, rows), x, w, "plain", out_shape=(m, n))
    xa, wa = np.ones((m, k), "int8"), np.arange(n * k, dtype="int8").reshape(n, k)
    # The output buffer is exactly (m, n): a store past it would corrupt memory or crash, not be compared.
    np.testing.assert_array_equal(_run(out, [x, w], [xa, wa]), xa.astype(np.int32) @ wa.T.astype(np.int32))
    stores = []
    tir.stmt_functor.post_order_visit(out.op.body, lambda node: stores.append(node)
                                      if isinstance(node, tir.IfThenElse) else None)
    assert len(stores) == 1 and str(m * n) in str(stores[0].condition)


def _sums(shape=(4, 8)) -> te.Tensor:
    x, w = te.placeholder((shape[0], 4), "int8", name="x"), te.placeholder((shape[1], 4), "int8", name="w")
    return mma_gemm.extern_op(_plain_gemm(shape[0], shape[1], 4, shape[0]), x, w, "plain")


@pytest.mark.parametrize("make, reason", [
    (lambda s: topi.transpose(s), "its shape"),
    (lambda s: te.compute(s.shape, lambda i, j: s[i, (j + 1) % 8]), "other coordinates"),
    (lambda s: topi.sum(s, axis=1, keepdims=True), "not element-wise"),
    (lambda s: te.compute(s.shape, lambda i, j: s[i, j] + _sums()[i, j]), "two GEMMs"),
    (lambda s: topi.add(te.placeholder((4, 8), "int32"), 1), "reads no GEMM"),
], ids=["transpose", "shifted", "reduction", "two-gemms", "no-gemm"])
def test_what_cannot_fold_is_left_as_it_was_and_says_why(make, reason):
    sums = _sums()
    body = sums.op.body
    out = make(sums)
    assert reason in epilogue.why_not(out)
    assert epilogue.fold(out) is None
    assert sums.op.body.same_as(body)  # the GEMM's op is never changed in place


def test_a_kernel_reading_its_own_output_back_is_not_folded():
    @T.prim_func
    def accumulate(a: T.Buffer((2, 2), "int8"), b: T.Buffer((2, 2), "int8"), c: T.Buffer((2, 2), "int32")):
        for i, j in T.grid(2, 2):
            c[i, j] = 0
            for r in range(2):
                c[i, j] = c[i, j] + T.Cast("int32", a[i, r]) * T.Cast("int32", b[j, r])

    sums = mma_gemm.extern_op(accumulate, te.placeholder((2, 2), "int8"), te.placeholder((2, 2), "int8"), "acc")
    body = sums.op.body
    with pytest.raises(ValueError, match="other than by storing"):
        epilogue.fold(topi.add(sums, 1))
    assert sums.op.body.same_as(body)


def test_coordinates_unravel_row_major():
    offset = tir.Var("e", "int32")
    coords = epilogue.coordinates(offset, (3, 5, 2))
    for e in (0, 7, 29):
        got = [tvm.arith.Analyzer().simplify(tir.stmt_functor.substitute(c, {offset: e})) for c in coords]
        assert [int(g) for g in got] == list(np.unravel_index(e, (3, 5, 2)))


# --------------------------------------------------------------------------
# relay.build for CUDA: the package's GEMMs and their epilogues as one kernel.
# --------------------------------------------------------------------------
def _conv(data_shape, channels: int, dtype: str) -> tvm.IRModule:
    w = np.random.default_rng(0).integers(-128, 128, (3, 3, channels, data_shape[3])).astype("int8")
    data = relay.var("x", shape=data_shape, dtype=dtype)
    out = relay.nn.conv2d(data, relay.const(w), padding=(1, 1), channels=channels, kernel_size=(3, 3),
                          data_layout="HWNC", kernel_layout="HWOI", out_dtype="int32")
    out = relay.add(out, relay.const(np.arange(channels, dtype="int32")))
    out = relay.cast(relay.clip(relay.right_shift(out, relay.const(9)), -128, 127), "int8")
    residual = relay.var("r", shape=(*data_shape[:3], channels), dtype="int8")
    out = relay.cast(relay.clip(relay.add(relay.cast(out, "int32"), relay.cast(residual, "int32")), -128, 127), "int8")
    return tvm.IRModule.from_expr(relay.Function([data, residual], out))


def _dense(m: int, n: int, k: int, dtype: str) -> tvm.IRModule:
    w = np.random.default_rng(1).integers(-128, 128, (n, k)).astype("int8")
    data = relay.var("x", shape=(m, k), dtype=dtype)
    out = relay.add(relay.nn.dense(data, relay.const(w), out_dtype="int32"), relay.const(np.arange(n, dtype="int32")))
    out = relay.cast(out, "float32") * relay.const(np.linspace(0.001, 0.01, n).astype("float32"))
    return tvm.IRModule.from_expr(relay.Function([data], relay.cast(relay.clip(relay.round(out), -128, 127), "int8")))


def _batch_matmul(b: int, m: int, n: int, k: int) -> tvm.IRModule:
    x = relay.var("x", shape=(b, m, k), dtype="uint8")
    y = relay.var("y", shape=(b, n, k), dtype="uint8")
    out = relay.nn.batch_matmul(x, y, out_dtype="int32", transpose_b=True)
    return tvm.IRModule.from_expr(relay.Function([x, y], relay.cast(
        relay.clip(relay.right_shift(out, relay.const(7)), 0, 255), "uint8")))


def _kernels(lib) -> dict:
    """{kernel name: its parameters} of a CUDA build's source."""
    source = lib.get_lib().imported_modules[0].get_source()
    return dict(re.findall(r"__global__ void __launch_bounds__\(\d+\) (\w+)\(([^)]*)\)", source))


@needs_cuda_codegen
@pytest.mark.parametrize("arch, mod, out, imma", [
    ("sm_80", lambda: _conv((14, 14, 8, 64), 64, "uint8"), "signed char", "IMMA.16832.U8.S8"),  # whole blocks
    # The largest fallback tile (4x4 fragments a warp: 128 accumulators a thread) with a residual.
    ("sm_90", lambda: _conv((56, 56, 8, 64), 256, "int8"), "signed char", "IMMA.16832.S8.S8"),
    ("sm_90", lambda: _conv((7, 7, 8, 64), 128, "int8"), "signed char", "IMMA.16832.S8.S8"),  # rows past the end
    ("sm_86", lambda: _dense(128, 256, 512, "uint8"), "signed char", "IMMA.16832.U8.S8"),
    ("sm_90", lambda: _dense(128, 768, 768, "int8"), "signed char", "IGMMA"),
    ("sm_89", lambda: _batch_matmul(4, 128, 128, 64), "uchar", "IMMA.16832.U8.U8"),
], ids=["conv-sm80", "conv-large-tile-sm90", "conv-padded-rows-sm90", "dense-mma-sm86", "dense-wgmma-sm90", "batch_matmul-sm89"])
def test_relay_build_makes_each_layer_one_kernel(monkeypatch, arch, mod, out, imma):
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({arch}))
    monkeypatch.setattr(strategy, "WGMMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod(), target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"))
    ((name, params),) = _kernels(lib).items()  # the GEMM and its epilogue: one kernel, no int32 round trip
    assert params.split(",")[0].startswith(out), params
    ((sass_name, ops),) = sass_opcodes(lib.get_lib()).items()
    assert any(op.startswith(imma) for op in ops), sorted(ops)
    # The stores stay unrolled with the epilogue in them (nvcc's `#pragma unroll`), so the accumulators
    # stay in registers: no stack, no local memory.
    assert not ops["LDL"] and not ops["STL"]
    ((_, resources),) = cuda.resources(cuda.module_cubin(lib.get_lib())).items()
    assert resources.stack == 0 and resources.local == 0, resources


def _typed_add(shape) -> relay.Call:
    x = relay.var("x", shape=shape, dtype="int32")
    func = relay.Function([x], relay.add(x, relay.const(np.ones(shape[-1:], "int32"))))
    return relay.transform.InferType()(tvm.IRModule.from_expr(func))["main"].body


@pytest.mark.parametrize("target, reads_gemm, folded", [
    ("cuda -arch=sm_80", True, True), ("cuda -arch=sm_80", False, False), ("llvm", True, False)])
def test_the_lowering_hook_folds_only_a_cuda_op_on_a_gemm_of_the_package(monkeypatch, target, reads_gemm, folded):
    from tvm.relay.backend import te_compiler

    from tvm_tcutils.tensorcore import hooks

    call = _typed_add((4, 8))
    data = _sums() if reads_gemm else te.placeholder((4, 8), "int32")
    inputs = [data, te.placeholder((8,), "int32", name="bias")]
    ours = hooks._lower_call(call, inputs, tvm.target.Target(target))
    tvms = te_compiler.lower_call(call, inputs, tvm.target.Target(target))
    assert isinstance(ours.outputs[0].op, te.ExternOp) is folded
    assert ours.implementation.name == tvms.implementation.name
    if not folded:  # TVM's own computation, unchanged
        assert ours.outputs[0].op.tag == tvms.outputs[0].op.tag and ours.outputs[0].op.name == tvms.outputs[0].op.name
        assert tvm.ir.structural_equal(ours.outputs[0].op.body, tvms.outputs[0].op.body, map_free_vars=True)
    # Unregistered (TVM may still call it: it keeps the function it found first), it folds nothing.
    monkeypatch.setattr(registry, "replaced_func", lambda name: None)
    assert isinstance(hooks._lower_call(call, inputs, tvm.target.Target(target)).outputs[0].op, te.ComputeOp)


@needs_cuda_codegen
def test_a_fold_that_fails_leaves_the_layer_as_two_kernels_and_says_so(monkeypatch, caplog):
    def broken(out):
        raise ValueError("a kernel form the folding does not know")

    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_80"}))
    monkeypatch.setattr(epilogue, "fold", broken)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(_dense(128, 256, 512, "int8"), target=tvm.target.Target("cuda -arch=sm_80", host="llvm"))
    kernels = _kernels(lib)
    assert len(kernels) == 2 and any(params.startswith("int*") for params in kernels.values()), kernels
    assert "its epilogue stays a kernel of its own (a kernel form the folding does not know)" in caplog.text
