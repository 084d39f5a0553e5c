"""int8 batch_matmul on x86 (issue 22): the package's rows, their numerics, and float left alone."""
from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tvm
from tvm import autotvm, relay, te

from conftest import each_value_once, host_dot_target, run_python
from tvm_tcutils.dotprod.topi import batch_matmul as bmm

RNG = np.random.default_rng(5)


def _rand(shape, dtype):
    info = np.iinfo(dtype)
    return RNG.integers(info.min, info.max + 1, shape).astype(dtype)


def _selected(x_dtype, y_dtype, target, shape=(2, 4, 64, 32)):
    b, m, k, n = shape
    x = relay.var("x", shape=(b, m, k), dtype=x_dtype)
    y = relay.var("y", shape=(b, n, k), dtype=y_dtype)
    call = relay.nn.batch_matmul(x, y, out_dtype="int32")
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x, y], call)))
    call = mod["main"].body
    with tvm.target.Target(target):
        impl, _ = relay.backend.te_compiler.select_implementation(
            call.op, call.attrs, [te.placeholder(a.checked_type.shape, a.checked_type.dtype) for a in call.args],
            call.checked_type, tvm.target.Target(target))
    return impl.name


@pytest.mark.parametrize("target, pair, expected", [
    ("llvm -mcpu=cascadelake", ("uint8", "int8"), "batch_matmul_dot.tcutils"),
    ("llvm -mcpu=cascadelake", ("uint8", "uint8"), "batch_matmul_dot.tcutils"),  # y's sign bit flipped
    ("llvm -mcpu=cascadelake", ("int8", "int8"), "batch_matmul_dot.tcutils"),
    ("llvm -mcpu=skylake-avx512", ("uint8", "int8"), "batch_matmul_dot.tcutils"),
    ("llvm -mcpu=core-avx2", ("int8", "int8"), "batch_matmul_dot.tcutils"),
    ("llvm", ("uint8", "int8"), "batch_matmul_int8.x86"),  # no dot-product ISA: TVM's own (exact there)
])
def test_int8_batch_matmul_takes_the_package_rows(target, pair, expected):
    assert _selected(*pair, target) == expected


def test_float_batch_matmul_keeps_tvm_implementation():
    assert _selected("float32", "float32", "llvm -mcpu=cascadelake") == "batch_matmul.x86"


_TRANSPOSES = [(False, True), (False, False), (True, True)]
_PAIRS = [("uint8", "int8"), ("int8", "uint8"), ("uint8", "uint8"), ("int8", "int8")]
_BATCHES = [(2, 2), (1, 3)]
_KS = [21, 24, 64]  # 24: x read where it is; 64: row sums on vpsadbw (AVX-512)


def _kernel_cases():
    """Every (kernel, k, pair) once by default, with a (transposes, batches) that rotates so that every two
    of the five parameters meet in every combination of their values (24 cases); the rest of the full
    product (144 cases) under -m slow."""
    cases = []
    for ki, kernel in enumerate(["dot", "exact"]):
        for kk, k in enumerate(_KS):
            for pi, pair in enumerate(_PAIRS):
                default = (pi + 2 * kk + 3 * ki) % 6
                for c in range(6):
                    transpose, batches = _TRANSPOSES[c % 3], _BATCHES[c // 3]
                    cases.append(pytest.param(
                        *transpose, pair, batches, kernel, k,
                        id=f"{k}-{kernel}-batches{c // 3}-pair{pi}-{transpose[0]}-{transpose[1]}",
                        marks=[] if c == default else [pytest.mark.slow]))
    return cases


@pytest.mark.parametrize("transpose_a, transpose_b, pair, batches, kernel, k", _kernel_cases())
def test_batch_matmul_kernels_are_exact(transpose_a, transpose_b, pair, batches, kernel, k):
    target = tvm.target.Target(host_dot_target())
    m, n = 3, 19
    x_np = _rand((batches[0],) + ((k, m) if transpose_a else (m, k)), pair[0])
    y_np = _rand((batches[1],) + ((n, k) if transpose_b else (k, n)), pair[1])
    x, y = te.placeholder(x_np.shape, pair[0], "x"), te.placeholder(y_np.shape, pair[1], "y")
    from tvm_tcutils.dotprod.isa import for_target

    if kernel == "dot" and bmm.stored_pair(for_target(target), *pair) is None:
        pytest.skip(f"the host's ISA takes no {pair} batch_matmul")
    with target:
        if kernel == "dot":
            cfg = autotvm.get_config()
            out = bmm.batch_matmul_dot(cfg, x, y, None, "int32", transpose_a, transpose_b)
            s = bmm.schedule_batch_matmul_dot(cfg, [out])
        else:
            out = bmm.batch_matmul_exact(x, y, None, "int32", transpose_a, transpose_b)
            s = bmm.schedule_batch_matmul_exact([out])
        func = tvm.build(s, [x, y, out], target)
    res = tvm.nd.empty([int(d) for d in out.shape], "int32")
    func(tvm.nd.array(x_np), tvm.nd.array(y_np), res)
    xs = x_np.transpose(0, 2, 1) if transpose_a else x_np
    ys = y_np if transpose_b else y_np.transpose(0, 2, 1)
    ref = np.einsum("bmk,bnk->bmn", xs.astype(np.int64), ys.astype(np.int64)).astype("int32")
    np.testing.assert_array_equal(res.numpy(), ref)


# N a whole number of lanes (no padded columns); K = 128: the flip correction's row sums on vpsadbw (AVX-512)
@pytest.mark.parametrize("pair, shape, epilogue", each_value_once(
    [("uint8", "int8"), ("uint8", "uint8"), ("int8", "int8")], [(7, 32, 24), (5, 48, 21), (3, 32, 128), (4, 16, 64)],
    [False, True]))
def test_whole_lane_batch_matmul_is_exact_with_and_without_an_epilogue(pair, shape, epilogue):
    from tvm_tcutils.dotprod.isa import for_target

    m, n, k = shape

    target = tvm.target.Target(host_dot_target())
    if bmm.stored_pair(for_target(target), *pair) is None:
        pytest.skip(f"the host's ISA takes no {pair} batch_matmul")
    x_np, y_np = _rand((2, m, k), pair[0]), _rand((2, n, k), pair[1])
    x, y = te.placeholder(x_np.shape, pair[0], "x"), te.placeholder(y_np.shape, pair[1], "y")
    with target:
        cfg = autotvm.get_config()
        out = bmm.batch_matmul_dot(cfg, x, y)
        if epilogue:  # what a fused requantize looks like to the schedule: injective ops after the product
            out = te.compute(out.shape, lambda *i: out(*i) * 3 - 7, name="epilogue", tag="injective")
        s = bmm.schedule_batch_matmul_dot(cfg, [out])
        func = tvm.build(s, [x, y, out], target)
    res = tvm.nd.empty((2, m, n), "int32")
    func(tvm.nd.array(x_np), tvm.nd.array(y_np), res)
    ref = np.einsum("bmk,bnk->bmn", x_np.astype(np.int64), y_np.astype(np.int64))
    np.testing.assert_array_equal(res.numpy(), (ref * 3 - 7 if epilogue else ref).astype("int32"))


@pytest.mark.parametrize("pair", [("uint8", "int8"), ("uint8", "uint8")])
@pytest.mark.parametrize("n, k, words", [(32, 128, True), (16, 64, True), (32, 24, False), (19, 128, False)])
def test_y_is_packed_in_register_transposes_where_whole_blocks_of_it_are(pair, n, k, words):
    # 16 rows x 64 bytes of y at a time, transposed in 512-bit registers by word and pair unpacks and
    # quarter picks (VNNI), no index-register permutes; other shapes keep the element-wise pack. Exactness:
    # the test above (K = 128 and 64 take this path).
    x, y = te.placeholder((2, 3, k), pair[0], "x"), te.placeholder((2, n, k), pair[1], "y")
    target = tvm.target.Target("llvm -mcpu=znver4")
    with target:
        cfg = autotvm.get_config()
        out = bmm.batch_matmul_dot(cfg, x, y)
        s = bmm.schedule_batch_matmul_dot(cfg, [out])
        asm = tvm.build(s, [x, y, out], target).get_source("asm")
    pack = bmm.find_op([out], bmm.WORDS_TAG) if words else None
    assert (pack is not None) == words
    unpacks = re.search(r"vpunpck[lh]dq\s+.*zmm", asm) and re.search(r"vshufi(32x4|64x2)\s+.*zmm", asm)
    assert bool(unpacks) == words
    assert not re.search(r"vperm[it]2(d|q)\s+.*zmm", asm)


@pytest.mark.parametrize("n, per_tile", [(128, True), (19, False)])
def test_a_whole_lane_product_is_consumed_tile_by_tile(n, per_tile):
    """With N a whole number of lanes the product lives one tile at a time (in L1), consumed in the same loop;
    otherwise (padded columns) it is a whole buffer sliced by a second pass."""
    import re

    from tvm_tcutils.dotprod.isa import for_target

    target = tvm.target.Target(host_dot_target())
    lanes = for_target(target).lanes
    x, y = te.placeholder((2, 16, 64), "uint8", "x"), te.placeholder((2, n, 64), "int8", "y")
    with target:
        cfg = autotvm.get_config()
        out = bmm.batch_matmul_dot(cfg, x, y)
        lowered = str(tvm.lower(bmm.schedule_batch_matmul_dot(cfg, [out]), [x, y, out]))
    count, vector = re.search(r'batch_matmul_dot = T.allocate\(\[(\d+)\], "int32(?:x(\d+))?"', lowered).groups()
    elements = int(count) * int(vector or 1)
    tile = cfg["tile_m"].val * cfg["tile_nb"].val * lanes
    n_padded = -(-n // lanes) * lanes
    assert elements == (tile if per_tile else 2 * 16 * n_padded)
    if per_tile:  # from 1024 bytes TVM takes it from the workspace per tile, out of the registers
        from tvm_tcutils.dotprod.topi.common import STACK_ALLOCA_BYTES

        assert elements * 4 < STACK_ALLOCA_BYTES


@pytest.mark.parametrize("pair", [("uint8", "int8"), ("uint8", "uint8"), ("int8", "int8")])
def test_vnni_batch_matmul_is_tensorized(pair):
    x = relay.var("x", shape=(2, 4, 64), dtype=pair[0])
    y = relay.var("y", shape=(2, 32, 64), dtype=pair[1])
    mod = tvm.IRModule.from_expr(relay.Function([x, y], relay.nn.batch_matmul(x, y, out_dtype="int32")))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target="llvm -mcpu=cascadelake")
    assert "vpdpbusd" in lib.get_lib().get_source("asm")


_FLOAT_PROGRAM = r"""
import hashlib, json, sys
if sys.argv[1] == "with":
    import tvm_tcutils  # noqa: F401
import numpy as np, tvm
from tvm import relay
from tvm.contrib import graph_executor
rng = np.random.default_rng(0)
x = relay.var("x", shape=(2, 6, 24))
y = relay.nn.batch_matmul(x, relay.const(rng.standard_normal((2, 20, 24)).astype("float32")))
y = relay.nn.batch_matmul(relay.nn.relu(y), relay.var("z", shape=(2, 20, 16)), transpose_b=False)
y = relay.nn.dense(relay.reshape(y, (12, 16)), relay.const(rng.standard_normal((10, 16)).astype("float32")))
mod = tvm.IRModule.from_expr(relay.Function(relay.analysis.free_vars(y), y))
inputs = {"x": rng.standard_normal((2, 6, 24)).astype("float32"),
          "z": rng.standard_normal((2, 20, 16)).astype("float32")}
result = {}
for target in ("llvm", "llvm -mcpu=cascadelake", "llvm -mcpu=core-avx2"):
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    entry = {"graph": hashlib.sha256(lib.get_graph_json().encode()).hexdigest(),
             "asm": hashlib.sha256(lib.get_lib().get_source("asm").encode()).hexdigest()}
    if target == "llvm":
        run = graph_executor.GraphModule(lib["default"](tvm.cpu()))
        run.set_input(**inputs)
        run.run()
        entry["out"] = run.get_output(0).numpy().ravel().tolist()
    result[target] = entry
print(json.dumps(result))
"""


@pytest.mark.timeout(600)
def test_float_dense_and_batch_matmul_compile_the_same_with_and_without_the_package():
    def run(mode):
        # "with": forked from the tests' fork server (the package imported, every hook installed, as the
        # program's own import does); "without" in a fresh interpreter that never imports the package.
        proc = run_python(_FLOAT_PROGRAM.replace("sys.argv[1]", repr(mode)), timeout=500, fresh=mode == "without")
        assert proc.returncode == 0, proc.stderr[-2000:]
        return json.loads(proc.stdout.strip().splitlines()[-1])

    with ThreadPoolExecutor(2) as pool:
        without, with_package = pool.map(run, ("without", "with"))
    assert without == with_package
