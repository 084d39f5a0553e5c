"""Every int8 / QNN op TVM 0.19 lowers, as tiny Relay cases with a numpy reference.

Run as a script, it builds each named case for one target with ``tvm_tcutils``
imported and writes one JSON line per case (``{"case", "status", ...}``) to an
output file, flushing a ``started`` line before each build: when LLVM aborts
the process (exit 134, as TVM 0.19's own VNNI path does), the last ``started``
case is the one that killed it and the caller restarts the worker for the rest.
The cases run where the host CPU has the target's vector features; elsewhere
only the build is checked.

``python int8_sweep_cases.py TARGET OUT.jsonl CASE [CASE ...]``

Examples
--------
>>> "qnn.batch_matmul/i8xi8" in CASES and "nn.conv2d/u8xi8" in CASES
True
>>> case = CASES["nn.dense/i8xi8"](np.random.default_rng(0))
>>> case.reference.dtype.name
'int32'
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Callable, Dict, Tuple

import numpy as np

#: Short dtype names used in case names.
_SHORT = {"u8": "uint8", "i8": "int8"}

#: Dtype pairs every matmul-like op is tried with: (data, weight).
PAIRS = ("u8xi8", "i8xi8", "u8xu8", "i8xu8")

#: Target features (LLVM names, by prefix) that decide whether the host can run a build.
_SIMD_PREFIXES = ("sse", "ssse", "avx", "fma", "f16c", "amx")


@dataclasses.dataclass
class Case:
    """A Relay function over named inputs, their values and the expected output."""

    expr: object
    inputs: Dict[str, np.ndarray]
    reference: np.ndarray
    atol: int = 0  # 0: exact (int32 accumulations); 1: one step of requantize rounding


def _rand(rng, shape, dtype):
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max + 1, shape).astype(dtype)


def _pair(name: str) -> Tuple[str, str]:
    data, weight = name.split("x")
    return _SHORT[data], _SHORT[weight]


# --------------------------------------------------------------------------
# numpy references
# --------------------------------------------------------------------------
def np_conv2d(x, w, stride=1, padding=0, dilation=1, groups=1):
    """NCHW x OIHW convolution in int64 (tiny shapes only)."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    ow = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        ws = w[g * og:(g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation:i * dilation + stride * oh:stride,
                           j * dilation:j * dilation + stride * ow:stride]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out


def np_conv2d_transpose(x, w, stride=1, padding=0):
    """NCHW x IOHW transposed convolution in int64."""
    n, c, h, wd = x.shape
    _, o, kh, kw = w.shape
    full = np.zeros((n, o, (h - 1) * stride + kh, (wd - 1) * stride + kw), np.int64)
    for i in range(kh):
        for j in range(kw):
            full[:, :, i:i + stride * h:stride, j:j + stride * wd:stride] += np.einsum(
                "nchw,co->nohw", x.astype(np.int64), w[:, :, i, j].astype(np.int64))
    return full[:, :, padding:full.shape[2] - padding, padding:full.shape[3] - padding]


def _i32(value):
    return np.asarray(value).astype(np.int32)


# --------------------------------------------------------------------------
# Cases
# --------------------------------------------------------------------------
def _relay():
    from tvm import relay

    return relay


def _dense(pair):
    def build(rng):
        relay = _relay()
        d, w = _pair(pair)
        x, y = _rand(rng, (3, 37), d), _rand(rng, (19, 37), w)
        expr = relay.nn.dense(relay.var("x", shape=x.shape, dtype=d), relay.var("w", shape=y.shape, dtype=w),
                              out_dtype="int32")
        return Case(expr, {"x": x, "w": y}, _i32(x.astype(np.int64) @ y.T.astype(np.int64)))
    return build


def _dense_const(pair):
    def build(rng):
        relay = _relay()
        d, w = _pair(pair)
        x, y = _rand(rng, (2, 64), d), _rand(rng, (32, 64), w)
        expr = relay.nn.dense(relay.var("x", shape=x.shape, dtype=d), relay.const(y), out_dtype="int32")
        return Case(expr, {"x": x}, _i32(x.astype(np.int64) @ y.T.astype(np.int64)))
    return build


def _batch_matmul(pair, shape=(2, 5, 36, 20), transpose_b=True, const_b=False):
    def build(rng):
        relay = _relay()
        d, w = _pair(pair)
        b, m, k, n = shape
        x = _rand(rng, (b, m, k), d)
        y = _rand(rng, (b, n, k) if transpose_b else (b, k, n), w)
        rhs = relay.const(y) if const_b else relay.var("y", shape=y.shape, dtype=w)
        expr = relay.nn.batch_matmul(relay.var("x", shape=x.shape, dtype=d), rhs, out_dtype="int32",
                                     transpose_b=transpose_b)
        yt = y if transpose_b else y.transpose(0, 2, 1)
        ref = np.einsum("bmk,bnk->bmn", x.astype(np.int64), yt.astype(np.int64))
        return Case(expr, {"x": x} if const_b else {"x": x, "y": y}, _i32(ref))
    return build


def _matmul(pair):
    def build(rng):
        relay = _relay()
        d, w = _pair(pair)
        x, y = _rand(rng, (4, 24), d), _rand(rng, (24, 16), w)
        expr = relay.nn.matmul(relay.var("x", shape=x.shape, dtype=d), relay.var("y", shape=y.shape, dtype=w),
                               out_dtype="int32")
        return Case(expr, {"x": x, "y": y}, _i32(x.astype(np.int64) @ y.astype(np.int64)))
    return build


def _conv2d(pair, cin=8, cout=16, k=3, stride=1, padding=1, dilation=1, groups=1, const_w=True):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        x, w = _rand(rng, (1, cin, 9, 9), d), _rand(rng, (cout, cin // groups, k, k), wd)
        weight = relay.const(w) if const_w else relay.var("w", shape=w.shape, dtype=wd)
        expr = relay.nn.conv2d(relay.var("x", shape=x.shape, dtype=d), weight, strides=(stride, stride),
                               padding=(padding, padding), dilation=(dilation, dilation), groups=groups,
                               channels=cout, kernel_size=(k, k), out_dtype="int32")
        inputs = {"x": x} if const_w else {"x": x, "w": w}
        return Case(expr, inputs, _i32(np_conv2d(x, w, stride, padding, dilation, groups)))
    return build


def _conv2d_nhwc(pair):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        x, w = _rand(rng, (1, 7, 7, 8), d), _rand(rng, (3, 3, 8, 16), wd)
        expr = relay.nn.conv2d(relay.var("x", shape=x.shape, dtype=d), relay.const(w), padding=(1, 1),
                               channels=16, kernel_size=(3, 3), data_layout="NHWC", kernel_layout="HWIO",
                               out_dtype="int32")
        ref = np_conv2d(x.transpose(0, 3, 1, 2), w.transpose(3, 2, 0, 1), padding=1).transpose(0, 2, 3, 1)
        return Case(expr, {"x": x}, _i32(ref))
    return build


def _conv1d(pair):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        x, w = _rand(rng, (1, 8, 12), d), _rand(rng, (16, 8, 3), wd)
        expr = relay.nn.conv1d(relay.var("x", shape=x.shape, dtype=d), relay.const(w), padding=(1,),
                               channels=16, kernel_size=(3,), out_dtype="int32")
        ref = np_conv2d(np.pad(x, ((0, 0), (0, 0), (1, 1)))[:, :, None, :], w[:, :, None, :])[:, :, 0]
        return Case(expr, {"x": x}, _i32(ref))
    return build


def _conv2d_transpose(pair):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        x, w = _rand(rng, (1, 8, 5, 5), d), _rand(rng, (8, 12, 3, 3), wd)
        expr = relay.nn.conv2d_transpose(relay.var("x", shape=x.shape, dtype=d), relay.const(w), strides=(2, 2),
                                         padding=(1, 1), channels=12, kernel_size=(3, 3), out_dtype="int32")
        return Case(expr, {"x": x}, _i32(np_conv2d_transpose(x, w, 2, 1)))
    return build


def _qnn_args(relay, d, w, zx, zw):
    return relay.const(zx, "int32"), relay.const(zw, "int32"), relay.const(0.05), relay.const(0.01)


def _zero_points(d, w):
    return (3 if d == "uint8" else -3), (5 if w == "uint8" else 0)


def _qnn_dense(pair):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        zx, zw = _zero_points(d, wd)
        x, w = _rand(rng, (3, 40), d), _rand(rng, (24, 40), wd)
        expr = relay.qnn.op.dense(relay.var("x", shape=x.shape, dtype=d), relay.const(w),
                                  *_qnn_args(relay, d, wd, zx, zw), units=24, out_dtype="int32")
        ref = (x.astype(np.int64) - zx) @ (w.astype(np.int64) - zw).T
        return Case(expr, {"x": x}, _i32(ref))
    return build


def _qnn_batch_matmul(pair, shape=(2, 6, 32, 16), const_b=False):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        zx, zw = _zero_points(d, wd)
        b, m, k, n = shape
        x, y = _rand(rng, (b, m, k), d), _rand(rng, (b, n, k), wd)
        rhs = relay.const(y) if const_b else relay.var("y", shape=y.shape, dtype=wd)
        expr = relay.qnn.op.batch_matmul(relay.var("x", shape=x.shape, dtype=d), rhs,
                                         *_qnn_args(relay, d, wd, zx, zw), out_dtype="int32")
        ref = np.einsum("bmk,bnk->bmn", x.astype(np.int64) - zx, y.astype(np.int64) - zw)
        return Case(expr, {"x": x} if const_b else {"x": x, "y": y}, _i32(ref))
    return build


def _qnn_conv2d(pair, groups=1, cin=8, cout=16, stride=1):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        zx, zw = _zero_points(d, wd)
        x, w = _rand(rng, (1, cin, 8, 8), d), _rand(rng, (cout, cin // groups, 3, 3), wd)
        expr = relay.qnn.op.conv2d(relay.var("x", shape=x.shape, dtype=d), relay.const(w),
                                   *_qnn_args(relay, d, wd, zx, zw), kernel_size=(3, 3), channels=cout,
                                   groups=groups, strides=(stride, stride), padding=(1, 1), out_dtype="int32")
        # Padding holds the zero point, i.e. a real zero.
        xp = np.pad(x.astype(np.int64) - zx, ((0, 0), (0, 0), (1, 1), (1, 1)))
        ref = np_conv2d(xp, w.astype(np.int64) - zw, stride=stride, groups=groups)
        return Case(expr, {"x": x}, _i32(ref))
    return build


def _qnn_conv2d_transpose(pair):
    def build(rng):
        relay = _relay()
        d, wd = _pair(pair)
        zx, zw = _zero_points(d, wd)
        x, w = _rand(rng, (1, 8, 4, 4), d), _rand(rng, (8, 12, 3, 3), wd)
        expr = relay.qnn.op.conv2d_transpose(relay.var("x", shape=x.shape, dtype=d), relay.const(w),
                                             *_qnn_args(relay, d, wd, zx, zw), kernel_size=(3, 3), channels=12,
                                             strides=(2, 2), padding=(1, 1), kernel_layout="IOHW",
                                             out_dtype="int32")
        ref = np_conv2d_transpose(x.astype(np.int64) - zx, w.astype(np.int64) - zw, 2, 1)
        return Case(expr, {"x": x}, _i32(ref))
    return build


def _requantize(dtype):
    def build(rng):
        relay = _relay()
        x = rng.integers(-20000, 20000, (2, 33)).astype("int32")
        expr = relay.qnn.op.requantize(relay.var("x", shape=x.shape, dtype="int32"), relay.const(0.002),
                                       relay.const(0), relay.const(0.1), relay.const(4), out_dtype=dtype)
        info = np.iinfo(dtype)
        ref = np.clip(np.floor(x * 0.02 + 0.5) + 4, info.min, info.max).astype(dtype)
        return Case(expr, {"x": x}, ref, atol=1)
    return build


def _qnn_binary(op_name, fn):
    def build(rng):
        relay = _relay()
        a, b = _rand(rng, (2, 40), "int8"), _rand(rng, (2, 40), "int8")
        sa, za, sb, zb, so, zo = 0.1, 2, 0.05, -1, 0.2, 3
        op = getattr(relay.qnn.op, op_name)
        expr = op(relay.var("a", shape=a.shape, dtype="int8"), relay.var("b", shape=b.shape, dtype="int8"),
                  relay.const(sa), relay.const(za), relay.const(sb), relay.const(zb),
                  relay.const(so), relay.const(zo))
        real = fn(sa * (a.astype(np.float64) - za), sb * (b.astype(np.float64) - zb))
        ref = np.clip(np.round(real / so) + zo, -128, 127).astype("int8")
        return Case(expr, {"a": a, "b": b}, ref, atol=1)
    return build


def _quantize_dequantize(rng):
    relay = _relay()
    x = rng.uniform(-5, 5, (3, 17)).astype("float32")
    q = relay.qnn.op.quantize(relay.var("x", shape=x.shape), relay.const(0.05), relay.const(-4), out_dtype="int8")
    expr = relay.qnn.op.dequantize(q, relay.const(0.05), relay.const(-4))
    ref = (np.clip(np.round(x / 0.05) - 4, -128, 127) + 4) * 0.05
    # A tolerance of one quantization step, in units of the output (float): compared in steps below.
    return Case(expr, {"x": x}, ref.astype("float32"), atol=1)


def _cases() -> Dict[str, Callable[[np.random.Generator], Case]]:
    # Every dtype pair where TVM's choice depends on it (its int8 paths take u8 x i8, its legalizations
    # make i8 data u8); one or two pairs for ops whose lowering does not look at the dtypes; QNN ops
    # are legalized to u8 x i8 or i8 x i8 whatever they start from.
    cases: Dict[str, Callable] = {}
    for pair in PAIRS:
        cases[f"nn.dense/{pair}"] = _dense(pair)
        cases[f"nn.dense_const/{pair}"] = _dense_const(pair)
        cases[f"nn.batch_matmul/{pair}"] = _batch_matmul(pair)
        cases[f"nn.batch_matmul_aligned/{pair}"] = _batch_matmul(pair, shape=(2, 4, 64, 32))
        cases[f"nn.conv2d/{pair}"] = _conv2d(pair)
    for pair in ("u8xi8", "i8xi8"):
        cases[f"nn.batch_matmul_nt/{pair}"] = _batch_matmul(pair, transpose_b=False)
        cases[f"nn.batch_matmul_const/{pair}"] = _batch_matmul(pair, shape=(1, 3, 40, 16), const_b=True)
        cases[f"nn.conv2d_1x1_stride2/{pair}"] = _conv2d(pair, k=1, stride=2, padding=0, cin=12, cout=20)
        cases[f"qnn.dense/{pair}"] = _qnn_dense(pair)
        cases[f"qnn.batch_matmul/{pair}"] = _qnn_batch_matmul(pair)
        cases[f"qnn.batch_matmul_aligned/{pair}"] = _qnn_batch_matmul(pair, shape=(2, 4, 64, 32))
        cases[f"qnn.conv2d/{pair}"] = _qnn_conv2d(pair)
    pair = "i8xi8"
    cases[f"nn.matmul/{pair}"] = _matmul(pair)
    cases[f"nn.conv2d_weight_input/{pair}"] = _conv2d(pair, const_w=False)
    cases[f"nn.conv2d_dilated/{pair}"] = _conv2d(pair, dilation=2, padding=2)
    cases[f"nn.conv2d_grouped/{pair}"] = _conv2d(pair, groups=2)
    cases[f"nn.conv2d_depthwise/{pair}"] = _conv2d(pair, cin=8, cout=8, groups=8)
    cases[f"nn.conv2d_nhwc/{pair}"] = _conv2d_nhwc(pair)
    cases[f"nn.conv1d/{pair}"] = _conv1d(pair)
    cases[f"nn.conv2d_transpose/{pair}"] = _conv2d_transpose(pair)
    cases[f"qnn.batch_matmul_const/{pair}"] = _qnn_batch_matmul(pair, shape=(1, 3, 40, 16), const_b=True)
    cases[f"qnn.conv2d_depthwise/{pair}"] = _qnn_conv2d(pair, groups=8, cin=8, cout=8)
    cases[f"qnn.conv2d_grouped/{pair}"] = _qnn_conv2d(pair, groups=2, stride=2)
    cases[f"qnn.conv2d_transpose/{pair}"] = _qnn_conv2d_transpose(pair)
    cases["qnn.requantize/uint8"] = _requantize("uint8")
    cases["qnn.add/i8"] = _qnn_binary("add", np.add)
    cases["qnn.mul/i8"] = _qnn_binary("mul", np.multiply)
    cases["qnn.quantize_dequantize/f32"] = _quantize_dequantize
    return cases


#: Case name -> builder ``(rng) -> Case``.
CASES = _cases()


# --------------------------------------------------------------------------
# Worker
# --------------------------------------------------------------------------
def host_runs(target: str) -> bool:
    """Whether this CPU has every vector feature ``target`` may use."""
    import tvm
    import tvm_tcutils
    from tvm.target import codegen

    def simd(t):
        return {str(f) for f in codegen.llvm_get_cpu_features(tvm.target.Target(t))
                if str(f).startswith(_SIMD_PREFIXES)}

    return simd(target) <= simd(tvm_tcutils.host_target())


def check(name: str, target: str, run: bool) -> dict:
    """Build case ``name`` for ``target`` (and run it when ``run``); the result as a JSON-able dict."""
    import tvm
    from tvm import relay
    from tvm.contrib import graph_executor

    case = CASES[name](np.random.default_rng(sum(map(ord, name))))  # stable per case, across processes
    func = relay.Function(relay.analysis.free_vars(case.expr), case.expr)
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    if not run:
        return {"case": name, "status": "built"}
    gmod = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    gmod.set_input(**case.inputs)
    gmod.run()
    out = gmod.get_output(0).numpy()
    if out.shape != case.reference.shape:
        return {"case": name, "status": "wrong", "detail": f"shape {out.shape} != {case.reference.shape}"}
    ref = case.reference
    if ref.dtype.kind == "f":  # quantize/dequantize: compare in quantization steps
        diff = np.abs(out.astype(np.float64) - ref) / 0.05
        bad = diff > case.atol + 1e-3
    else:
        diff = np.abs(out.astype(np.int64) - ref.astype(np.int64))
        bad = diff > case.atol
    if bad.any():
        return {"case": name, "status": "wrong",
                "detail": f"{int(bad.sum())}/{bad.size} elements off, max {float(diff.max())}"}
    return {"case": name, "status": "ok"}


def main(argv) -> int:
    target, out_path, names = argv[0], argv[1], argv[2:]
    import tvm  # noqa: F401
    import tvm_tcutils  # noqa: F401  (the package under test)

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from _tvm_speedups import cache_libinfo

    cache_libinfo()
    run = host_runs(target)
    with open(out_path, "a") as out:
        for name in names:
            out.write(json.dumps({"case": name, "status": "started"}) + "\n")
            out.flush()
            try:
                result = check(name, target, run)
            # The sweep reports every failure of a case (TVM raises TVMError, ValueError, ...) as that
            # case's result and goes on with the next: one broken op must not hide the others.
            except Exception as err:  # noqa: BLE001
                result = {"case": name, "status": "error", "detail": f"{type(err).__name__}: {str(err)[-800:]}"}
            out.write(json.dumps(result) + "\n")
            out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
