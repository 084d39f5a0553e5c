"""AMX tile kernels: the reference form bit-exact on any x86, the machine code on every build, the real
kernels bit-exact where this CPU has AMX, the permission and fallback rules, and the Relay route."""
from __future__ import annotations

import contextlib
import re
import warnings

import numpy as np
import pytest

from tvm_tcutils._tvm import tvm
from tvm import autotvm, relay, te

from tvm_tcutils.dotprod import amx
from tvm_tcutils.dotprod.isa import X86_AMX, tile_isa
from tvm_tcutils.dotprod.topi.batch_matmul_amx import batch_matmul_amx, schedule_batch_matmul_amx
from tvm_tcutils.dotprod.topi.common import requantized
from tvm_tcutils.dotprod.topi.conv2d_amx import conv2d_nchwc_amx, schedule_conv2d_nchwc_amx
from tvm_tcutils.dotprod.topi.dense_amx import applicable, dense_pack_amx, schedule_dense_pack_amx
from tvm_tcutils.dotprod.topi.tiles import reference_tiles

from conftest import amx_runs_here, host_dot_target, run_python, with_mattr

#: A CPU with AMX, to compile for on any host (never run where this CPU lacks it).
AMX_TARGET = "llvm -mcpu=sapphirerapids"

#: (M, N, K): one tile; rows past a full step (tail configuration); odd M under and over a step; 3 weight
#: blocks (a one-block step); several K steps.
SHAPES = [(16, 16, 64), (20, 64, 128), (50, 48, 64), (33, 32, 192), (128, 96, 256), (17, 32, 64)]

#: Every sign pair the tiles multiply natively.
PAIRS = [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8")]

_RANGE = {"uint8": (0, 256), "int8": (-128, 128)}


def _packed(weight: np.ndarray) -> np.ndarray:
    n, k = weight.shape
    return weight.reshape(n // 16, 16, k // 4, 4).transpose(0, 2, 1, 3).copy()


def _build_dense(target: str, m: int, n: int, k: int, pair=("uint8", "int8"), epilogue=False, reference=False):
    data = te.placeholder((m, k), pair[0], name="data")
    weight = te.placeholder((n // 16, k // 4, 16, 4), pair[1], name="weight")
    with (reference_tiles() if reference else contextlib.nullcontext()), tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = dense_pack_amx(cfg, data, weight)
        args = [data, weight]
        if epilogue:
            out = requantized(out, (1,))
            args += list(out.op.input_tensors[1:])
        sched = schedule_dense_pack_amx(cfg, [out])
        return tvm.build(sched, args + [out], target), out


def _run_dense(func, out, m, n, k, pair, epilogue, seed=0):
    rng = np.random.default_rng(seed)
    data = rng.integers(*_RANGE[pair[0]], (m, k)).astype(pair[0])
    weight = rng.integers(*_RANGE[pair[1]], (n, k)).astype(pair[1])
    exact = data.astype(np.int64) @ weight.astype(np.int64).T
    inputs = [data, _packed(weight)]
    if epilogue:
        bias = rng.integers(-2000, 2000, n).astype("int32")
        scale = rng.uniform(2e-4, 1e-3, n).astype("float32")
        inputs += [bias, scale]
        value = (exact + bias).astype(np.float32) * scale
        exact = np.clip(np.rint(value), 0, 255).astype("uint8")
    result = tvm.nd.empty((m, n), out.dtype)
    func(*[tvm.nd.array(x) for x in inputs], result)
    return result.numpy(), exact


@pytest.fixture(scope="module")
def reference_target():
    return with_mattr(host_dot_target(), "+amx-tile", "+amx-int8")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("epilogue", [False, True], ids=["int32", "requantized"])
def test_reference_form_dense_is_bit_exact(reference_target, shape, epilogue):
    func, out = _build_dense(reference_target, *shape, epilogue=epilogue, reference=True)
    assert "tdpbusd" not in func.get_source("asm")  # plain code: runs on this CPU, AMX or not
    got, expected = _run_dense(func, out, *shape, ("uint8", "int8"), epilogue)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}x{p[1]}")
def test_reference_form_takes_every_sign_pair(reference_target, pair):
    func, out = _build_dense(reference_target, 48, 32, 128, pair, reference=True)
    got, expected = _run_dense(func, out, 48, 32, 128, pair, False)
    np.testing.assert_array_equal(got, expected)


def _bodies(asm: str) -> dict:
    """Function name -> assembly (each parallel body is a function of its own)."""
    starts = [(m.start(), m.group(1)) for m in re.finditer(r"^([A-Za-z_]\w*):", asm, re.M)]
    return {name: asm[s:e] for (s, name), (e, _) in zip(starts, starts[1:] + [(len(asm), "")])}


@pytest.mark.parametrize("pair, instruction", [(("uint8", "int8"), "tdpbusd"), (("int8", "int8"), "tdpbssd"),
                                               (("uint8", "uint8"), "tdpbuud")])
def test_machine_code_uses_tiles_with_a_configuration_in_every_parallel_body(pair, instruction):
    # 50 rows: two full 32-row steps would need 64; one full step, then an 18-row tail configuration.
    func, _ = _build_dense(AMX_TARGET, 50, 64, 256, pair)
    asm = func.get_source("asm")
    parallel = {name: body for name, body in _bodies(asm).items() if "_compute_" in name}
    assert parallel, "the strips run in TVM's thread pool"
    for name, body in parallel.items():
        # The full step's configuration, the tail's, and the caller's loaded back (stored first).
        assert body.count("ldtilecfg") == 3 and body.count("sttilecfg") == 1, name
        assert instruction in body and "tileloadd" in body and "tilestored" in body, name
    # A step of 2 x 2 tiles: 4 products per K step in each configuration (loops may be unrolled).
    assert asm.count(instruction) >= 8 and asm.count(instruction) % 4 == 0
    # Tiles are never spilled: every tile store goes to the output's strip, not the stack (LLVM addresses
    # its spill slots from %rsp; %rbp is a general register here).
    stores = [line for line in asm.splitlines() if "tilestored" in line]
    assert stores and not [line for line in stores if "%rsp" in line]
    assert "syscall" in asm  # the first run asks Linux for the tile state


@pytest.mark.parametrize("k, points", [(256, 4), (64, 1)])
def test_weight_tiles_of_the_next_reduction_point_are_prefetched(k, points):
    # Tile registers are not renamed: only a prefetch fetches the next point's weights while this one's
    # products run. A step of 2 x 2 tiles asks for 16 rows of each of its 2 weight tiles, in the full
    # step's configuration and in the tail's (more where LLVM unrolls the points); a one-point reduction
    # loads its weights once and asks for nothing.
    func, _ = _build_dense(AMX_TARGET, 50, 64, k)
    per_point = 2 * X86_AMX.rows
    for name, body in _bodies(func.get_source("asm")).items():
        if "_compute_" in name:
            count = body.count("prefetcht0")
            assert (count >= 2 * per_point and count % per_point == 0) if points > 1 else count == 0, name


def test_dense_that_does_not_fill_tiles_says_why():
    assert applicable(X86_AMX, 128, 96, (4, 24, 16, 4), "uint8", "int8").startswith("K=96")
    assert "no int8 x int16" in applicable(X86_AMX, 128, 64, (4, 16, 16, 4), "int8", "int16")
    assert applicable(None, 128, 64, (4, 16, 16, 4), "uint8", "int8") == "the target has no tile engine"
    with tvm.target.Target(AMX_TARGET), pytest.raises(ValueError, match="tile depth 64"):
        dense_pack_amx(autotvm.get_config(), te.placeholder((32, 96), "uint8"),
                       te.placeholder((2, 24, 16, 4), "int8"))
    with tvm.target.Target("llvm -mcpu=znver4"), pytest.raises(ValueError, match="no usable AMX"):
        dense_pack_amx(autotvm.get_config(), te.placeholder((32, 64), "uint8"),
                       te.placeholder((2, 16, 16, 4), "int8"))


@pytest.mark.parametrize("shape", SHAPES[:4], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("pair", PAIRS[:2], ids=lambda p: f"{p[0]}x{p[1]}")
def test_real_tiles_are_bit_exact_where_the_cpu_has_amx(shape, pair):
    target = amx_runs_here()
    func, out = _build_dense(target, *shape, pair, epilogue=pair == PAIRS[0])
    assert "tdp" in func.get_source("asm")
    got, expected = _run_dense(func, out, *shape, pair, pair == PAIRS[0], seed=5)
    np.testing.assert_array_equal(got, expected)


def test_decision_rules():
    both = frozenset({"amx_tile", "amx_int8", "avx512_vnni"})
    assert amx.decide(both, None, lambda: 0) == amx.AmxState(True, True, "tile state granted to this process")
    refused = amx.decide(both, None, lambda: 22)
    assert not refused.usable and "errno 22" in refused.reason
    asked = []
    assert not amx.decide(both, "off", lambda: asked.append(1) or 0).usable and not asked  # not even asked
    assert amx.decide(frozenset({"amx_tile"}), None, lambda: 0) == amx.AmxState(
        False, False, "this CPU reports no amx_tile and amx_int8")


def _dense_module(k: int) -> tvm.IRModule:
    data = relay.var("data", shape=(64, k), dtype="uint8")
    weight = relay.const(np.random.default_rng(1).integers(-128, 128, (64, k)).astype("int8"))
    out = relay.nn.dense(data, weight, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([data], out))


def _built_asm(mod, target) -> str:
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target).get_lib().get_source("asm")


def test_relay_build_puts_a_filling_dense_on_tiles_and_keeps_the_rest_on_vnni():
    assert "tdpbusd" in _built_asm(_dense_module(128), AMX_TARGET)
    narrow = _built_asm(_dense_module(100), AMX_TARGET)  # K=100 pads to 104: not a tile depth
    assert "tdpbusd" not in narrow and "vpdpbusd" in narrow


def test_a_refused_tile_state_builds_vnni_with_one_warning(monkeypatch):
    monkeypatch.setattr(amx, "state", lambda: amx.AmxState(True, False, "refused in this test"))
    monkeypatch.setattr(amx, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _built_asm(_dense_module(128), AMX_TARGET)
        second = _built_asm(_dense_module(192), AMX_TARGET)
    assert tile_isa(AMX_TARGET) is None
    assert "tdpbusd" not in first + second and "vpdpbusd" in first and "vpdpbusd" in second
    messages = [str(w.message) for w in caught if "AMX" in str(w.message)]
    assert len(messages) == 1 and "refused in this test" in messages[0] and "VNNI" in messages[0]


#: CPUID answers of a CPU with tile palette 1 of 8 tiles x 16 rows x 64 bytes (leaf 0x1D), as Sapphire
#: and Emerald Rapids report it.
_CPUID_OK = {(0, 0): (0x20, 0, 0, 0), (0x1D, 0): (1, 0, 0, 0), (0x1D, 1): (0x04002000, 0x00080040, 16, 0)}


@pytest.mark.parametrize("answers, reason", [
    ({}, ""),
    ({(0, 0): (0x1A, 0, 0, 0)}, "no tile leaf 0x1D (highest leaf 0x1A)"),
    ({(0x1D, 0): (0, 0, 0, 0)}, "lists no tile palette 1 (its highest is 0)"),
    ({(0x1D, 1): (0x04002000, 0x00040040, 16, 0)}, "has 4 tiles of 16 x 64 bytes; the kernels need 8"),
    ({(0x1D, 1): (0x04002000, 0x00080040, 8, 0)}, "has 8 tiles of 8 x 64 bytes"),
], ids=["palette-1", "no-leaf", "no-palette", "4-tiles", "8-rows"])
def test_the_cpuid_tile_palette_must_hold_the_kernels_tiles(answers, reason):
    answers = {**_CPUID_OK, **answers}
    problem = amx.palette_problem(lambda leaf, sub: answers[(leaf, sub)])
    assert reason in problem and bool(problem) == bool(reason)
    state = amx.decide(frozenset(amx.CPU_FLAGS), None, lambda: 0, lambda: problem)
    assert state.usable == (not reason) and (not reason or reason in state.reason)


def test_this_cpus_palette_is_read_where_it_has_amx():
    if not amx.state().host_has:
        pytest.skip(f"no AMX on this CPU ({amx.state().reason})")
    assert amx.cpuid(0x1D, 0)[0] >= X86_AMX.palette and amx.palette_problem() == ""


def test_the_environment_turns_tiles_off(monkeypatch):
    monkeypatch.setenv(amx.ENV, "0")
    monkeypatch.setattr(amx, "_warned", set())
    amx.refresh()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert tile_isa(AMX_TARGET) is None
    finally:
        monkeypatch.delenv(amx.ENV)
        amx.refresh()


def test_relay_dense_on_real_tiles_matches_numpy():
    target = amx_runs_here()
    mod = _dense_module(192)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    assert "tdpbusd" in lib.get_lib().get_source("asm")
    data = np.random.default_rng(2).integers(0, 256, (64, 192)).astype("uint8")
    weight = mod["main"].body.args[1].data.numpy()
    from tvm_tcutils import measure

    runner = measure.graph_module(lib, {"data": data})
    runner.run()
    np.testing.assert_array_equal(runner.get_output(0).numpy(), data.astype(np.int64) @ weight.astype(np.int64).T)


def test_host_target_keeps_the_tiles_a_generic_cpu_model_hides():
    # An Emerald Rapids VM's CPUID model is generic (LLVM: rocketlake, no AMX): host_target() must add them.
    target = amx_runs_here()
    assert tile_isa(target) is not None


#: (batch, M, K, N, transpose_a, transpose_b): a tail configuration, a one-block step (N = 48), x stored
#: transposed, y stored (K, N).
BMM_SHAPES = [(2, 20, 64, 32, False, True), (3, 48, 128, 48, False, True), (2, 32, 64, 32, True, True),
              (2, 33, 64, 16, False, False)]


def _bmm(target: str, shape, pair, reference: bool, seed: int = 0):
    b, m, k, n, ta, tb = shape
    x_shape, y_shape = ((b, k, m) if ta else (b, m, k)), ((b, n, k) if tb else (b, k, n))
    x, y = te.placeholder(x_shape, pair[0], name="x"), te.placeholder(y_shape, pair[1], name="y")
    with (reference_tiles() if reference else contextlib.nullcontext()), tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = batch_matmul_amx(cfg, x, y, transpose_a=ta, transpose_b=tb)
        func = tvm.build(schedule_batch_matmul_amx(cfg, [out]), [x, y, out], target)
    rng = np.random.default_rng(seed)
    xv = rng.integers(*_RANGE[pair[0]], x_shape).astype(pair[0])
    yv = rng.integers(*_RANGE[pair[1]], y_shape).astype(pair[1])
    lhs = xv.transpose(0, 2, 1) if ta else xv
    rhs = yv if tb else yv.transpose(0, 2, 1)
    result = tvm.nd.empty((b, m, n), "int32")
    func(tvm.nd.array(xv), tvm.nd.array(yv), result)
    return func, result.numpy(), np.einsum("bmk,bnk->bmn", lhs.astype(np.int64), rhs.astype(np.int64))


@pytest.mark.parametrize("shape", BMM_SHAPES, ids=lambda s: "x".join(map(str, s[:4])) + f"-{s[4]:d}{s[5]:d}")
@pytest.mark.parametrize("pair", [("uint8", "uint8"), ("int8", "uint8")], ids=lambda p: f"{p[0]}x{p[1]}")
def test_reference_form_batch_matmul_is_bit_exact(reference_target, shape, pair):
    _, got, expected = _bmm(reference_target, shape, pair, reference=True)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", BMM_SHAPES, ids=lambda s: "x".join(map(str, s[:4])) + f"-{s[4]:d}{s[5]:d}")
def test_real_batch_matmul_is_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _bmm(amx_runs_here(), shape, ("uint8", "uint8"), reference=False, seed=3)
    assert "tdpbuud" in func.get_source("asm")  # u8 x u8 native: no sign flip, no correction
    np.testing.assert_array_equal(got, expected)


def test_relay_batch_matmul_of_activations_goes_to_tiles():
    x = relay.var("x", shape=(4, 128, 64), dtype="uint8")
    y = relay.var("y", shape=(4, 128, 64), dtype="uint8")
    mod = tvm.IRModule.from_expr(relay.Function([x, y], relay.nn.batch_matmul(x, y, out_dtype="int32")))
    asm = _built_asm(mod, AMX_TARGET)
    assert "tdpbuud" in asm and "ldtilecfg" in asm
    odd = relay.var("z", shape=(4, 128, 48), dtype="uint8")  # K = 48: not a tile depth
    mod = tvm.IRModule.from_expr(relay.Function([odd, y], relay.nn.batch_matmul(
        odd, relay.strided_slice(y, [0, 0, 0], [4, 128, 48]), out_dtype="int32")))
    assert "tdpbuud" not in _built_asm(mod, AMX_TARGET)


#: (channels, height, width, out channels, kernel, stride, pad): a 3x3 row under one step (8 pixels), a
#: flat 1x1 (its 6 rows of 20 one run of 120 pixels: steps and a tail), a strided 3x3 to 128 channels, a
#: strided 1x1 across a wide row (a step and a tail), a flat 1x1 over a 7x7 plane (49 pixels: 32 + 16 + 1);
#: short rows at stride 1 as one wide run (wide_run): a 3x3 conv's 7x7 plane (4 tiles of 16 for 7 rows, a
#: row of zeros added under the image), an unpadded 3x3 (a padding stage for that row alone), a 5x5.
CONV_SHAPES = [(64, 8, 8, 64, 3, 1, 1), (128, 6, 20, 64, 1, 1, 0), (64, 9, 11, 128, 3, 2, 1),
               (128, 4, 40, 64, 1, 2, 0), (128, 7, 7, 128, 1, 1, 0),
               (128, 7, 7, 128, 3, 1, 1), (64, 5, 9, 64, 3, 1, 0), (64, 6, 6, 64, 5, 1, 2)]


def _conv_reference(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    _, _, h, wd = x.shape
    _, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad))).astype(np.int64)
    oh, ow = (h + 2 * pad - kh) // stride + 1, (wd + 2 * pad - kw) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow), np.int64)
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(np.int64))
    return out


def _requantized_reference(exact: np.ndarray, rng) -> tuple:
    """``(uint8 result, [bias, scale])``: an ``NCHW64c`` int32 conv output as :func:`requantized` ends it,
    with random per-channel inputs."""
    blocks = exact.shape[1]
    bias = rng.integers(-3000, 3000, (blocks, 64)).astype("int32")
    scale = rng.uniform(1e-4, 5e-4, (blocks, 64)).astype("float32")
    value = (exact + bias[None, :, None, None, :]).astype(np.float32) * scale[None, :, None, None, :]
    return np.clip(np.rint(value), 0, 255).astype("uint8"), [bias, scale]


def _ran(func, out: te.Tensor, inputs: list, exact: np.ndarray, epilogue_rng=None) -> tuple:
    """``(func, its output, the expected output)``: ``func`` run on ``inputs`` (and, given the generator of
    a requantize epilogue, its random bias and scale) against the ``NCHW64c`` int32 result ``exact``."""
    expected = exact
    if epilogue_rng is not None:
        expected, extra = _requantized_reference(exact, epilogue_rng)
        inputs = inputs + extra
    result = tvm.nd.empty([int(d) for d in out.shape], out.dtype)
    func(*[tvm.nd.array(v) for v in inputs], result)
    return func, result.numpy(), expected


def _conv(target: str, shape, reference: bool, epilogue: bool = False, seed: int = 0):
    c, h, wd, o, k, stride, pad = shape
    data = te.placeholder((1, c // 64, h, wd, 64), "uint8", name="data")
    kernel = te.placeholder((o // 64, c // 64, k, k, 16, 64, 4), "int8", name="kernel")
    with (reference_tiles() if reference else contextlib.nullcontext()), tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_amx(cfg, data, kernel, stride, pad, 1, "NCHW64c", "NCHW64c")
        args = [data, kernel]
        if epilogue:
            out = requantized(out, (1, 4))
            args += list(out.op.input_tensors[1:])
        func = tvm.build(schedule_conv2d_nchwc_amx(cfg, [out]), args + [out], target)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (1, c, h, wd)).astype("uint8")
    w = rng.integers(-128, 128, (o, c, k, k)).astype("int8")
    inputs = [x.reshape(1, c // 64, 64, h, wd).transpose(0, 1, 3, 4, 2).copy(),
              w.reshape(o // 64, 64, c // 64, 16, 4, k, k).transpose(0, 2, 5, 6, 3, 1, 4).copy()]
    exact = _conv_reference(x, w, stride, pad)
    return _ran(func, out, inputs, exact.reshape(1, o // 64, 64, *exact.shape[2:]).transpose(0, 1, 3, 4, 2),
                rng if epilogue else None)


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: "c{}-{}x{}-o{}-k{}s{}p{}".format(*s))
def test_reference_form_conv2d_is_bit_exact(reference_target, shape):
    _, got, expected = _conv(reference_target, shape, reference=True, epilogue=shape[1] in (5, 7, 8))
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", CONV_SHAPES, ids=lambda s: "c{}-{}x{}-o{}-k{}s{}p{}".format(*s))
def test_real_conv2d_is_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _conv(amx_runs_here(), shape, reference=False, epilogue=shape[1] in (5, 7, 8), seed=4)
    assert "tdpbusd" in func.get_source("asm")
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape, wide", [((128, 7, 7, 128, 3, 1, 1), True), ((64, 5, 9, 64, 3, 1, 0), True),
                                         ((256, 14, 14, 128, 3, 1, 1), False), ((64, 9, 11, 128, 3, 2, 1), False)])
def test_short_rows_at_stride_one_run_wide(shape, wide):
    c, h, w, o, k, stride, pad = shape
    data = te.placeholder((1, c // 64, h, w, 64), "uint8", name="data")
    kernel = te.placeholder((o // 64, c // 64, k, k, 16, 64, 4), "int8", name="kernel")
    with tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_amx(cfg, data, kernel, stride, pad, 1, "NCHW64c", "NCHW64c")
        text = tvm.lower(schedule_conv2d_nchwc_amx(cfg, [out]), [data, kernel, out]).script()
    padded = out.op.input_tensors[0]
    assert ("wide_run" in text) == wide
    # The wide task's last tile reads a row past the plane: the padding stage adds it under the image.
    rows_past = int(padded.shape[2]) - (h + 2 * pad) if padded.op.name == "data_pad" else 0
    assert rows_past == (1 if wide else 0)


@pytest.mark.parametrize("hw", [7, 14, 28])
def test_flat_convs_read_their_data_unpadded(hw):
    # A 1x1 conv's short rows run as one flat run that ends at the data's end: no padding stage (which
    # would copy the whole input inside the conv's kernel).
    data = te.placeholder((1, 2, hw, hw, 64), "uint8", name="data")
    kernel = te.placeholder((2, 2, 1, 1, 16, 64, 4), "int8", name="kernel")
    with tvm.target.Target(AMX_TARGET):
        out = conv2d_nchwc_amx(autotvm.get_config(), data, kernel, 1, 0, 1, "NCHW64c", "NCHW64c")
    assert out.op.input_tensors[0].same_as(data)


def test_conv_machine_code_configures_each_row_task():
    data = te.placeholder((1, 2, 6, 40, 64), "uint8", name="data")  # 40 pixels: a 32-pixel step, an 8-pixel tail
    kernel = te.placeholder((1, 2, 1, 1, 16, 64, 4), "int8", name="kernel")
    with tvm.target.Target(AMX_TARGET):
        cfg = autotvm.get_config()
        out = conv2d_nchwc_amx(cfg, data, kernel, 1, 0, 1, "NCHW64c", "NCHW64c")
        asm = tvm.build(schedule_conv2d_nchwc_amx(cfg, [out]), [data, kernel, out], AMX_TARGET).get_source("asm")
    parallel = {name: body for name, body in _bodies(asm).items() if "_compute_" in name}
    # Full step + tail, then the caller's configuration back.
    assert parallel and all(body.count("ldtilecfg") == 3 for body in parallel.values())
    assert not [line for line in asm.splitlines() if "tilestored" in line and "%rsp" in line]


def _conv_module() -> tvm.IRModule:
    rng = np.random.default_rng(0)
    x = relay.var("x", shape=(1, 64, 14, 14), dtype="uint8")
    w1 = relay.const(rng.integers(-128, 128, (128, 64, 3, 3)).astype("int8"))
    w2 = relay.const(rng.integers(-128, 128, (64, 128, 1, 1)).astype("int8"))
    y = relay.nn.conv2d(x, w1, padding=(1, 1), out_dtype="int32", channels=128, kernel_size=(3, 3))
    y = relay.cast(relay.clip(relay.right_shift(y, relay.const(12)), 0, 255), "uint8")
    y = relay.nn.conv2d(y, w2, out_dtype="int32", channels=64, kernel_size=(1, 1), strides=(2, 2))
    return tvm.IRModule.from_expr(relay.Function([x], y))


def test_relay_convs_with_whole_64_channel_blocks_go_to_tiles():
    asm = _built_asm(_conv_module(), AMX_TARGET)
    assert "tdpbusd" in asm and "vpdpbusd" not in asm


def test_relay_convs_on_real_tiles_match_the_vnni_build():
    target = amx_runs_here()
    from tvm_tcutils import measure

    x = np.random.default_rng(1).integers(0, 256, (1, 64, 14, 14)).astype("uint8")
    outputs = []
    for build_target in (target, with_mattr(target, "-amx-tile", "-amx-int8")):
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(_conv_module(), target=build_target)
        runner = measure.graph_module(lib, {"x": x})
        runner.run()
        outputs.append(runner.get_output(0).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert np.unique(outputs[0]).size > 100


def test_a_tuned_vnni_record_does_not_take_a_tile_dense_back(tmp_path):
    # TVM prefers an implementation with a tuned record over a higher plevel: a VNNI log (what tuning a
    # model extracts) must not send the tile dense back to VNNI.
    from tvm.autotvm.measure import MeasureInput, MeasureResult
    from tvm.autotvm.record import encode
    from tvm_tcutils.dotprod.strategy import DENSE_PACK_TASK

    target = tvm.target.Target(AMX_TARGET)
    args = (te.placeholder((64, 128), "uint8"), te.placeholder((4, 32, 16, 4), "int8"), None, "int32")
    task = autotvm.task.create(DENSE_PACK_TASK, args=args, target=target)
    log = tmp_path / "vnni.log"
    log.write_text(encode(MeasureInput(target, task, task.config_space.get(0)),
                          MeasureResult((1e-9,), 0, 0.1, 0.0)) + "\n")
    with autotvm.apply_history_best(str(log)):
        asm = _built_asm(_dense_module(128), AMX_TARGET)
    assert "tdpbusd" in asm


#: (height, width, out channels, kernel, stride): a 7x7 RGB stem at stride 2 (rows of 8 pixels) and a 3x3 one
#: at stride 1 (a 32-pixel step and a tail).
STEM_SHAPES = [(13, 29, 64, 7, 2), (10, 40, 128, 3, 1)]


def _stem(target: str, shape, reference: bool, seed: int = 0, epilogue: bool = False):
    from tvm_tcutils.dotprod.topi.conv2d_amx import conv2d_stem_amx, schedule_conv2d_stem_amx

    h, w, o, k, s = shape
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    wp = (ow - 1) * s + 16  # whole tile rows of taps
    data = te.placeholder((1, h, wp, 4), "uint8", name="data")
    kernel = te.placeholder((o // 64, k, 16, 64, 4), "int8", name="kernel")
    with (reference_tiles() if reference else contextlib.nullcontext()), tvm.target.Target(target):
        cfg = autotvm.get_config()
        out = conv2d_stem_amx(cfg, data, kernel, s, 0, 1, "NHWC", "OHW64oI", "NCHW64c")
        args = [data, kernel]
        if epilogue:
            out = requantized(out, (1, 4))
            args += list(out.op.input_tensors[1:])
        func = tvm.build(schedule_conv2d_stem_amx(cfg, [out]), args + [out], target)
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 256, (1, 3, h, w)).astype("uint8")
    wt = rng.integers(-128, 128, (o, 3, k, k)).astype("int8")
    image = np.zeros((1, h, wp, 4), "uint8")
    image[0, :, :min(w, wp), :3] = x[0].transpose(1, 2, 0)[:, :wp]
    taps = np.zeros((o, k, 16, 4), "int8")
    taps[:, :, :k, :3] = wt.transpose(0, 2, 3, 1)
    blocked = taps.reshape(o // 64, 64, k, 16, 4).transpose(0, 2, 3, 1, 4).copy()
    exact = _conv_reference(x, wt, s, 0)
    return _ran(func, out, [image, blocked], exact.reshape(1, o // 64, 64, oh, ow).transpose(0, 1, 3, 4, 2),
                rng if epilogue else None)


@pytest.mark.parametrize("shape", STEM_SHAPES, ids=lambda s: "{}x{}-o{}-k{}s{}".format(*s))
def test_reference_form_stem_is_bit_exact(reference_target, shape):
    _, got, expected = _stem(reference_target, shape, reference=True)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("shape", STEM_SHAPES, ids=lambda s: "{}x{}-o{}-k{}s{}".format(*s))
def test_real_stem_is_bit_exact_where_the_cpu_has_amx(shape):
    func, got, expected = _stem(amx_runs_here(), shape, reference=False, seed=6)
    assert "tdpbusd" in func.get_source("asm")
    np.testing.assert_array_equal(got, expected)


def _stem_module(dtype: str, size: int = 30) -> tvm.IRModule:
    x = relay.var("x", shape=(1, 3, size, size), dtype=dtype)
    w = relay.const(np.random.default_rng(0).integers(-128, 128, (64, 3, 7, 7)).astype("int8"))
    y = relay.nn.conv2d(x, w, strides=(2, 2), padding=(3, 3), out_dtype="int32", channels=64, kernel_size=(7, 7))
    y = relay.cast(relay.clip(relay.right_shift(y, relay.const(10)), 0, 255), "uint8")
    return tvm.IRModule.from_expr(relay.Function([x], y))


def test_relay_rgb_stem_goes_to_tiles():
    # 16 x 16: the same tile program as 30 x 30 (14 tdpbusd, 21 tile loads) in a quarter of the build time.
    asm = _built_asm(_stem_module("uint8", size=16), AMX_TARGET)
    assert "tdpbusd" in asm and "vpdpbusd" not in asm


@pytest.mark.parametrize("dtype", ["uint8", "int8"])  # int8: shifted to u8, the compensation subtracted
def test_relay_rgb_stem_on_real_tiles_matches_the_vnni_build(dtype):
    target = amx_runs_here()
    from tvm_tcutils import measure

    low, high = (0, 256) if dtype == "uint8" else (-128, 128)
    x = np.random.default_rng(2).integers(low, high, (1, 3, 30, 30)).astype(dtype)
    outputs = []
    for build_target in (target, with_mattr(target, "-amx-tile", "-amx-int8")):
        with tvm.transform.PassContext(opt_level=3):
            lib = relay.build(_stem_module(dtype), target=build_target)
        runner = measure.graph_module(lib, {"x": x})
        runner.run()
        outputs.append(runner.get_output(0).numpy())
    np.testing.assert_array_equal(outputs[0], outputs[1])
    assert np.unique(outputs[0]).size > 100


_ORT_THEN_TILES = """
import numpy as np, onnxruntime as ort, tvm, tvm_tcutils
from onnx import helper, TensorProto, numpy_helper
from tvm import relay
from tvm_tcutils import measure
rng = np.random.default_rng(0)
a = rng.integers(0, 256, (128, 256)).astype("uint8"); b = rng.integers(-128, 128, (256, 256)).astype("int8")
graph = helper.make_graph([helper.make_node("MatMulInteger", ["a", "b"], ["y"])], "g",
                          [helper.make_tensor_value_info("a", TensorProto.UINT8, [128, 256])],
                          [helper.make_tensor_value_info("y", TensorProto.INT32, None)],
                          initializer=[numpy_helper.from_array(b, "b")])
options = ort.SessionOptions(); options.intra_op_num_threads = 1
sess = ort.InferenceSession(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
                            options, providers=["CPUExecutionProvider"])
expected = a.astype(np.int64) @ b.astype(np.int64)
assert np.array_equal(sess.run(None, {"a": a})[0], expected)
x = relay.var("x", shape=(20, 128), dtype="uint8")
w = relay.const(rng.integers(-128, 128, (64, 128)).astype("int8"))
with tvm.transform.PassContext(opt_level=3):
    lib = relay.build(tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w, out_dtype="int32"))),
                      target=tvm_tcutils.host_target())
assert "tdpbusd" in lib.get_lib().get_source("asm")
runner = measure.graph_module(lib, {"x": rng.integers(0, 256, (20, 128)).astype("uint8")})
for _ in range(3):
    runner.run()
    assert np.array_equal(sess.run(None, {"a": a})[0], expected)
print("both ran")
"""


def test_onnxruntimes_tiles_survive_ours_on_the_same_thread():
    # onnxruntime's AMX kernels load their tile configuration once a thread; ours ran on that thread (TVM's
    # first parallel task is the caller's) and left theirs unusable: SIGILL at its next product, before the
    # kernels loaded the caller's configuration back.
    amx_runs_here()
    pytest.importorskip("onnxruntime")
    result = run_python(_ORT_THEN_TILES, env={"TVM_NUM_THREADS": "1"}, timeout=300)
    assert result.returncode == 0 and "both ran" in result.stdout, (result.returncode, result.stderr[-2000:])
