"""The dot-product kernels' tile loops, software-pipelined at ``target.build.llvm`` (dotprod.pipeline)."""
from __future__ import annotations

import contextlib
import re

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay, te, tir

import tvm_tcutils
from conftest import (
    build_and_run, dot_target, host_dot_target, requantized_conv, requantized_conv_inputs, small_conv_net,
    tvm_codegen, with_mattr,
)
from tvm_tcutils import registry
from tvm_tcutils.dotprod import hooks, pipeline
from tvm_tcutils.dotprod.topi.conv2d_nchwc import conv2d_nchwc_dot, schedule_conv2d_nchwc_dot

RNG = np.random.default_rng(11)
ZNVER4 = "llvm -mcpu=znver4"

#: (data shape NCHW16c, kernel shape, padding): 1x1 convs with 16..64 steps per tile, a 3x3 with 36,
#: an output width whose tile loop has two iterations only.
SHAPES = {
    "1x1_k64": ((1, 4, 8, 8, 16), (2, 4, 1, 1, 4, 16, 4), 0),
    "1x1_k256": ((1, 16, 4, 8, 16), (1, 16, 1, 1, 4, 16, 4), 0),
    "3x3_k16": ((1, 1, 6, 6, 16), (2, 1, 3, 3, 4, 16, 4), 1),
    "1x1_two_tiles": ((1, 1, 2, 4, 16), (1, 1, 1, 1, 4, 16, 4), 0),
}


def _requantized_conv(name: str, residual: bool):
    return requantized_conv(*SHAPES[name], residual)


def _lowered(name: str, residual: bool) -> tir.PrimFunc:
    with tvm.target.Target(ZNVER4):
        cfg, out, args = _requantized_conv(name, residual)
        return tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), args)["main"]


def test_build_hook_wraps_tvms_code_generator_and_unregister_restores_it():
    """After ``unregister()`` the same kernel compiles as TVM compiles it: no pipelined loop."""
    assert registry.replaced_func(hooks.BUILD_LLVM) is not None
    with tvm.target.Target(ZNVER4):
        cfg, out, args = _requantized_conv("1x1_k64", True)
        schedule = schedule_conv2d_nchwc_dot(cfg, [out])

    def share() -> float:
        asm = tvm.build(schedule, args, ZNVER4).get_source("asm")
        return min(_products_before_first_store(body) for body in _loop_bodies(asm)
                   if any(line.startswith("vpdpbusd") for line in body))
    assert share() < 0.5
    tvm_tcutils.unregister()
    try:
        assert share() > 0.75
    finally:
        tvm_tcutils.register()


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_tile_loop_pipelined(name, residual):
    func = _lowered(name, residual)
    new, count = pipeline.pipeline_epilogues(func)
    assert count == 1
    loops = []
    tir.stmt_functor.post_order_visit(new.body, lambda n: loops.append(n) if isinstance(n, tir.For) else None)
    steady = [loop for loop in loops if loop.loop_var.name.endswith("_steady")]
    assert len(steady) == 1
    # The steady loop covers all tiles but the first; its body stores the output among the products.
    original_tiles = {int(loop.extent) for loop in
                      [n for n in _loops(func) if _has_output_store(n) and _has_dot(n)]}
    assert int(steady[0].extent) + 1 in original_tiles
    order = _statement_kinds(steady[0].body)
    assert order.index("store") < len(order) - 1 - order[::-1].index("dot")  # a store before the last product


def _loops(func):
    found = []
    tir.stmt_functor.post_order_visit(func.body, lambda n: found.append(n) if isinstance(n, tir.For) else None)
    return found


def _has_dot(stmt) -> bool:
    return "vpdpbusd" in str(stmt)


def _has_output_store(stmt) -> bool:
    return "requantized" in str(stmt)


def _statement_kinds(stmt) -> list:
    kinds = []

    def visit(node):
        if isinstance(node, tir.BufferStore):
            kinds.append("dot" if _has_dot(node.value) else ("store" if "requantized" in node.buffer.name else "other"))
    tir.stmt_functor.post_order_visit(stmt, visit)
    return kinds


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_pipelined_kernel_bit_identical(name, residual):
    target = dot_target("vnni")
    with tvm.target.Target(target):
        cfg, out, args = _requantized_conv(name, residual)
        schedule = schedule_conv2d_nchwc_dot(cfg, [out])
        assert pipeline.pipeline_epilogues(tvm.lower(schedule, args)["main"])[1] == 1  # the rewrite applies
    inputs = requantized_conv_inputs(args, RNG)
    results = []
    for scope in (tvm_codegen, contextlib.nullcontext):
        with scope():
            func = tvm.build(schedule, args, target)
        arrays = [tvm.nd.array(x) for x in inputs] + [tvm.nd.empty([int(d) for d in out.shape], "int8")]
        func(*arrays)
        results.append(arrays[-1].numpy())
    np.testing.assert_array_equal(results[0], results[1])
    assert np.unique(results[1]).size > 16  # the epilogue's values, not a constant


def test_pipelined_asm_interleaves_epilogue_with_products():
    """In the compiled tile loop, the first 8-bit store comes after most of the products without the
    rewrite (each register's epilogue waits for its last product) and within the first half with it."""
    with tvm.target.Target(ZNVER4):
        cfg, out, args = _requantized_conv("1x1_k64", True)
        schedule = schedule_conv2d_nchwc_dot(cfg, [out])
    share = {}
    for label, scope in (("plain", tvm_codegen), ("pipelined", contextlib.nullcontext)):
        with scope():
            asm = tvm.build(schedule, args, ZNVER4).get_source("asm")
        share[label] = min(_products_before_first_store(body) for body in _loop_bodies(asm)
                           if any(line.startswith("vpdpbusd") for line in body))
    assert share["plain"] > 0.75 and share["pipelined"] < 0.5, share


def _products_before_first_store(body: list) -> float:
    """Share of a loop's vpdpbusd that come before its first 8-bit vector store (1.0 without stores): a
    vector's bytes (``vmovdq* %xmm``, ``vpmov* %zmm``) or 2-4 vectors' packed ones (``%ymm``, ``%zmm``)."""
    products = [k for k, line in enumerate(body) if line.startswith("vpdpbusd")]
    stores = [k for k, line in enumerate(body)
              if re.match(r"(vmovdq\w*\s+%[xyz]mm\d+|vpmov\w+\s+%zmm\d+), .*\(", line)]
    if not stores:
        return 1.0
    return sum(k < stores[0] for k in products) / len(products)


def _loop_bodies(asm: str):
    lines = [line.strip() for line in asm.split("\n")]
    labels = {line[:-1]: k for k, line in enumerate(lines) if re.match(r"^\.LBB\d+_\d+:$", line)}
    for k, line in enumerate(lines):
        jump = re.match(r"j\w+\s+(\.LBB\d+_\d+)$", line)
        if jump and labels.get(jump.group(1), k) < k:
            yield [x for x in lines[labels[jump.group(1)] + 1:k + 1] if x and not x.startswith(".")]


def test_float_kernel_untouched():
    """A float product with an epilogue computed at its tile loop has no dot-product intrinsic: kept."""
    x, w = te.placeholder((16, 32), name="x"), te.placeholder((64, 32), name="w")
    k = te.reduce_axis((0, 32), name="k")
    y = te.compute((16, 64), lambda i, j: te.sum(x[i, k] * w[j, k], axis=k), name="y")
    z = te.compute((16, 64), lambda i, j: te.max(y[i, j], 0.0), name="z")
    s = te.create_schedule(z.op)
    i, j = s[z].op.axis
    jo, ji = s[z].split(j, 16)
    s[y].compute_at(s[z], jo)
    mod = tvm.lower(s, [x, w, z])
    assert pipeline.pipeline_module(mod).same_as(mod)


def test_float_model_machine_code_unchanged():
    """A float model's compiled code is the same with the build hook as with TVM's own generator."""
    mod = small_conv_net()
    code = []
    for scope in (contextlib.nullcontext, tvm_codegen):
        with scope():
            with tvm.transform.PassContext(opt_level=3):
                code.append(relay.build(mod, target=ZNVER4).get_lib().get_source("asm"))
    assert "vfmadd" in code[0] and code[0] == code[1]


def test_a_module_without_products_skips_the_rewrites_and_one_with_them_does_not(monkeypatch):
    """The build hook walks a module's functions only where one calls a product instruction: a float
    model's kernels go straight to TVM's code generator; an int8 conv's still get every rewrite."""
    from tvm_tcutils.dotprod import prefetch, rounding, tile_epilogue

    walked = []
    for module, name in ((tile_epilogue, "interleave_module"), (prefetch, "prefetch_module"),
                         (pipeline, "pipeline_module")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda mod, *a, _o=original, _n=name: walked.append(_n) or _o(mod, *a))
    original_rounding = rounding.rounding_module
    monkeypatch.setattr(rounding, "rounding_module",
                        lambda mod, *a: walked.append("rounding_module") or original_rounding(mod, *a))
    with tvm.transform.PassContext(opt_level=3):
        relay.build(small_conv_net(), target=ZNVER4)
    assert walked == []
    data = relay.var("data", shape=(1, 32, 8, 8), dtype="uint8")
    weight = relay.const(np.ones((32, 32, 3, 3), "int8"))
    conv = relay.nn.conv2d(data, weight, padding=1, kernel_size=3, channels=32, out_dtype="int32")
    with tvm.transform.PassContext(opt_level=3):
        relay.build(tvm.IRModule.from_expr(relay.Function([data], conv)), target=ZNVER4)
    assert set(walked) == {"interleave_module", "prefetch_module", "pipeline_module", "rounding_module"}


def test_loops_outside_the_guards_untouched():
    func = _lowered("1x1_k64", True)
    assert pipeline.pipeline_epilogues(func, max_steps=8) == (func, 0)  # 16 product steps
    aliased = func.with_attr("tir.noalias", False)
    assert pipeline.pipeline_epilogues(aliased)[1] == 0


@pytest.mark.parametrize("target,shape", [
    ("llvm -mcpu=core-avx2", ((1, 8, 8, 16, 8), (8, 8, 1, 1, 2, 8, 4), 0)),  # AVX2: 16 registers
    (ZNVER4, ((1, 4, 7, 14, 16), (4, 4, 1, 1, 4, 16, 4), 0)),  # a 2 x 7-pixel tile: 14 registers
])
def test_tiles_too_large_to_double_untouched(target, shape, monkeypatch):
    """Two blocks of accumulators must fit half the ISA's registers (pipelined, AVX2's 8-register
    tiles spilled and ran up to 1.9x slower)."""
    monkeypatch.setitem(SHAPES, "case", shape)
    with tvm.target.Target(target):
        cfg, out, args = _requantized_conv("case", False)
        func = tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), args)["main"]
    assert "llvm.x86" in func.script()  # a dot-product kernel, with its intrinsic
    assert pipeline.pipeline_epilogues(func)[1] == 0
    assert pipeline.pipeline_epilogues(func.with_attr("tir.noalias", True))[1] == 0


def test_int32_output_untouched():
    """A conv ending in its int32 accumulators (the tile's stores copy them) keeps its loop: nothing to
    overlap, and unrolled products only raise register pressure (2x slower measured)."""
    data, kernel = te.placeholder((1, 6, 8, 8, 16), "uint8"), te.placeholder((2, 6, 1, 1, 4, 16, 4), "int8")
    with tvm.target.Target(ZNVER4):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_dot(cfg, data, kernel, 1, 0, 1, "NCHW16c", "NCHW16c")
        func = tvm.lower(schedule_conv2d_nchwc_dot(cfg, [out]), [data, kernel, out])["main"]
    assert "vpdpbusd" in func.script() and len(_loops(func)) > 2
    assert pipeline.pipeline_epilogues(func)[1] == 0


def test_epilogue_writing_what_the_products_read_is_not_moved():
    """A tile loop whose epilogue stores into the conv's data (in place) keeps its order."""
    func = _lowered("1x1_k64", False)
    data, out = func.buffer_map[func.params[0]], func.buffer_map[func.params[-1]]

    def post(node):
        if node.buffer.data.same_as(out.data):
            target = tir.decl_buffer(node.buffer.shape, "int8", data=data.data, name="in_place")
            return tir.BufferStore(target, node.value, node.indices)
        return None
    in_place = func.with_body(tir.stmt_functor.ir_transform(func.body, None, post, ["tir.BufferStore"]))
    assert pipeline.pipeline_epilogues(in_place)[1] == 0


def _residual_block(cin: int = 64, cout: int = 64, hw: int = 8):
    """QDQ relay of a 1x1 conv whose requantized result is added to the block's 8-bit input."""
    dq = lambda q, s, z: relay.qnn.op.dequantize(q, relay.const(np.float32(s)), relay.const(z))  # noqa: E731
    qz = lambda v, s, z: relay.qnn.op.quantize(v, relay.const(np.float32(s)), relay.const(z),  # noqa: E731
                                               out_dtype="uint8")
    x = relay.var("x", shape=(1, cin, hw, hw), dtype="uint8")
    w = RNG.integers(-127, 128, (cout, cin, 1, 1)).astype("int8")
    scales = RNG.uniform(0.002, 0.01, cout).astype("float32")
    weight = relay.qnn.op.dequantize(relay.const(w), relay.const(scales), relay.const(np.zeros(cout, "int32")),
                                     axis=0)
    main = qz(relay.nn.conv2d(dq(x, 0.04, 3), weight, channels=cout, kernel_size=(1, 1)), 0.0228, 130)
    out = qz(relay.add(dq(main, 0.0228, 130), dq(x, 0.04, 3)), 0.0612, 0)
    return tvm.IRModule.from_expr(relay.Function([x], out)), RNG.integers(0, 256, (1, cin, hw, hw)).astype("uint8")


def test_plain_relay_build_of_a_residual_block_same_output(monkeypatch):
    # The VNNI kernels' pipelining is what is tested: on a CPU with AMX this conv would take the tiles.
    target = with_mattr(host_dot_target(), "-amx-tile", "-amx-int8")
    mod, data = _residual_block()
    counted = []
    real = pipeline.pipeline_epilogues

    def counting(func, max_steps=pipeline.MAX_STEPS):
        new, count = real(func, max_steps)
        counted.append(count)
        return new, count
    monkeypatch.setattr(pipeline, "pipeline_epilogues", counting)
    outputs = []
    for scope in (tvm_codegen, contextlib.nullcontext):
        with scope():
            outputs.append(build_and_run(mod, inputs={"x": data}, target=target)[0])
    np.testing.assert_array_equal(outputs[0], outputs[1])
    if target.startswith("llvm") and "vnni" in tvm_tcutils.dotprod.isa.for_target(target).name:
        assert sum(counted) >= 1
