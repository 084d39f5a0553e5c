"""Numerics of the tensor-core compute definitions, built for the CPU and compared with numpy.

What is checked: the TE computes used by the CUDA templates (data packing
with zero padding, kernel packing, the packed int32 GEMM with strides and
dilation, unpacking back to HWNC / (N, O)) are built *unchanged* with a plain
CPU schedule (``te.create_schedule`` + ``tvm.build(..., "llvm")``), so every
intermediate (packed data, packed kernel, packed result) is materialized in
memory in its own dtype.

int4: TVM's LLVM backend builds int4 buffers, but NumPy has no int4 type and
``NDArray.numpy()`` does not sign-extend int4. So the test functions take int8
arrays holding values in [-8, 7], convert them to real int4 tensors inside the
compute (``astype("int4")``) and feed those to the compute under test: the
packed intermediates are true int4 buffers, and the range ends -8 and 7 are
always present. uint4/uint8 use [0, 15] / [0, 255].

The CUDA schedules and WMMA fragments are run by the last tests of this file,
which need TVM's CUDA code generator and a GPU with integer tensor cores
(sm_72+ for int8) and skip with the reason otherwise; without them, the
lowering tests check the schedules' structure.
"""
import numpy as np
import pytest
import tvm
from tvm import autotvm, relay, te
from tvm.contrib import graph_executor

import tvm_tcutils
from tvm_tcutils.tensorcore import strategy as tc
from tvm_tcutils.tensorcore.topi import conv2d_hwnc, dense, wmma

RANGES = {"int4": (-8, 7), "uint4": (0, 15), "int8": (-128, 127), "uint8": (0, 255)}
STORAGE = {"int4": "int8", "uint4": "uint8", "int8": "int8", "uint8": "uint8"}


def _values(rng, shape, dtype):
    low, high = RANGES[dtype]
    values = rng.integers(low, high + 1, size=[int(v) for v in shape]).astype(STORAGE[dtype])
    # The range ends are always present, at the first and last element.
    values.flat[0], values.flat[-1] = low, high
    return values


def _as_operand(storage: te.Tensor, dtype: str) -> te.Tensor:
    if storage.dtype == dtype:
        return storage
    return te.compute(storage.shape, lambda *i: storage[i].astype(dtype), name=f"{storage.name}_{dtype}")


def _run_cpu(out: te.Tensor, inputs, arrays):
    func = tvm.build(te.create_schedule(out.op), list(inputs) + [out], "llvm")
    result = tvm.nd.empty([int(v) for v in out.shape], out.dtype)
    func(*[tvm.nd.array(a) for a in arrays], result)
    return result.numpy()


def conv2d_hwnc_reference(x, w, stride, pad, dilation):
    """HWNC x HWOI convolution in int32 with numpy (symmetric padding)."""
    height, width = x.shape[:2]
    kh, kw = w.shape[:2]
    xp = np.pad(x.astype(np.int64), ((pad, pad), (pad, pad), (0, 0), (0, 0)))
    out_h = (height + 2 * pad - (kh - 1) * dilation - 1) // stride + 1
    out_w = (width + 2 * pad - (kw - 1) * dilation - 1) // stride + 1
    out = np.zeros((out_h, out_w, x.shape[2], w.shape[2]), np.int64)
    for i in range(kh):
        for j in range(kw):
            window = xp[i * dilation: i * dilation + (out_h - 1) * stride + 1: stride,
                        j * dilation: j * dilation + (out_w - 1) * stride + 1: stride]
            out += np.einsum("hwnc,oc->hwno", window, w[i, j].astype(np.int64))
    return out.astype(np.int32)


# (dtype, m (WMMA rows), H, batch, in, out, kernel, stride, pad, dilation)
CONV_CASES = [
    ("int4", 8, 5, 8, 32, 16, 3, 1, 1, 1),
    ("int4", 8, 7, 16, 64, 8, 3, 2, 1, 2),
    ("uint4", 8, 4, 8, 32, 8, 1, 1, 0, 1),
    ("int8", 16, 6, 16, 32, 16, 3, 1, 1, 1),
    ("int8", 32, 5, 32, 16, 8, 3, 2, 2, 1),
    ("int8", 8, 6, 8, 16, 32, 1, 1, 0, 1),
    ("uint8", 16, 4, 16, 16, 16, 3, 1, 1, 1),
]


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: f"{c[0]}-m{c[1]}-h{c[2]}-s{c[7]}p{c[8]}d{c[9]}")
def test_conv2d_hwnc_compute_matches_numpy(case):
    dtype, m, size, batch, cin, cout, k, stride, pad, dil = case
    rng = np.random.default_rng(sum(case[1:]))
    shape = wmma.shape_for(dtype, m=m)
    x = te.placeholder((size, size, batch, cin), STORAGE[dtype], name="x")
    w = te.placeholder((k, k, cout, cin), STORAGE[dtype], name="w")
    out = conv2d_hwnc.conv2d_hwnc(_as_operand(x, dtype), _as_operand(w, dtype), stride, pad, dil, shape=shape)
    xv, wv = _values(rng, x.shape, dtype), _values(rng, w.shape, dtype)
    got = _run_cpu(out, [x, w], [xv, wv])
    np.testing.assert_array_equal(got, conv2d_hwnc_reference(xv, wv, stride, pad, dil))


@pytest.mark.parametrize("dtype", ["int4", "int8"])
def test_prepacked_kernel_gives_the_same_result(dtype):
    """The alter-op layout HWOI<n>o<k>i, packed by numpy, computes the same convolution."""
    shape = wmma.WMMA_SHAPES[dtype][-1]
    rng = np.random.default_rng(3)
    x = te.placeholder((4, 4, shape.m, 2 * shape.k), STORAGE[dtype], name="x")
    w = te.placeholder((3, 3, 2 * shape.n, 2 * shape.k), STORAGE[dtype], name="w")
    xv, wv = _values(rng, x.shape, dtype), _values(rng, w.shape, dtype)
    kh, kw, co, ci = wv.shape
    packed = wv.reshape(kh, kw, co // shape.n, shape.n, ci // shape.k, shape.k).transpose(0, 1, 2, 4, 3, 5)
    wp = te.placeholder(packed.shape, STORAGE[dtype], name="wp")
    out = conv2d_hwnc.conv2d_hwnc(_as_operand(x, dtype), _as_operand(wp, dtype), 1, 1, 1)
    got = _run_cpu(out, [x, wp], [xv, np.ascontiguousarray(packed)])
    np.testing.assert_array_equal(got, conv2d_hwnc_reference(xv, wv, 1, 1, 1))


def test_pack_and_unpack_index_maps():
    """pack_data pads spatially and tiles (N, C); pack_kernel tiles (O, I); both match numpy reshapes."""
    shape = wmma.WmmaShape(8, 32, 16)
    rng = np.random.default_rng(5)
    x = te.placeholder((3, 4, 16, 32), "int8", name="x")
    w = te.placeholder((1, 2, 64, 32), "int8", name="w")
    xv, wv = _values(rng, x.shape, "int8"), _values(rng, w.shape, "int8")
    got_x = _run_cpu(conv2d_hwnc.pack_data(x, shape, (1, 2, 0, 1)), [x], [xv])
    padded = np.pad(xv, ((1, 0), (2, 1), (0, 0), (0, 0)))
    want_x = padded.reshape(4, 7, 2, 8, 2, 16).transpose(0, 1, 2, 4, 3, 5)
    np.testing.assert_array_equal(got_x, want_x)
    got_w = _run_cpu(conv2d_hwnc.pack_kernel(w, shape), [w], [wv])
    np.testing.assert_array_equal(got_w, wv.reshape(1, 2, 2, 32, 2, 16).transpose(0, 1, 2, 4, 3, 5))


@pytest.mark.parametrize("dtype,m,batch,cin,cout", [
    ("int4", 8, 16, 64, 24), ("int8", 16, 16, 48, 32), ("int8", 32, 32, 16, 8), ("uint8", 8, 8, 32, 64),
])
def test_dense_compute_matches_numpy(dtype, m, batch, cin, cout):
    rng = np.random.default_rng(batch + cin + cout)
    x = te.placeholder((batch, cin), STORAGE[dtype], name="x")
    w = te.placeholder((cout, cin), STORAGE[dtype], name="w")
    out = dense.dense(_as_operand(x, dtype), _as_operand(w, dtype), shape=wmma.shape_for(dtype, m=m))
    xv, wv = _values(rng, x.shape, dtype), _values(rng, w.shape, dtype)
    got = _run_cpu(out, [x, w], [xv, wv])
    np.testing.assert_array_equal(got, xv.astype(np.int64) @ wv.astype(np.int64).T)


@pytest.mark.parametrize("bad,match", [
    (dict(dtype="float16"), "must share one of"),
    (dict(out_dtype="int8"), "out_dtype must be int32"),
    (dict(batch=12), "does not tile"),
    (dict(kernel_dtype="int8"), "must share one of"),
])
def test_bad_compute_arguments_raise_clear_errors(bad, match):
    dtype = bad.get("dtype", "int4")
    x = te.placeholder((4, 4, bad.get("batch", 8), 32), dtype, name="x")
    w = te.placeholder((3, 3, 8, 32), bad.get("kernel_dtype", dtype), name="w")
    with pytest.raises(ValueError, match=match):
        conv2d_hwnc.conv2d_hwnc(x, w, 1, 1, 1, bad.get("out_dtype", "int32"), shape=wmma.WmmaShape(8, 8, 32))


# --------------------------------------------------------------------------
# On a GPU: the CUDA kernels themselves.
# --------------------------------------------------------------------------
_CAPS = tvm_tcutils.capabilities()


def _arch() -> int:
    if not _CAPS["cuda_codegen"]:
        pytest.skip("TVM was built without the CUDA code generator (target.build.cuda)")
    if not _CAPS["cuda_device"]:
        pytest.skip("no CUDA GPU on this machine")
    return int(str(tvm.cuda(0).compute_version).replace(".", ""))


def _need(arch_min: int, dtype: str = "int8") -> tvm.target.Target:
    from tvm_tcutils.tensorcore.rules import unsupported_reason

    arch = _arch()
    if arch < arch_min:
        pytest.skip(f"GPU is sm_{arch}; integer tensor cores of this test need sm_{arch_min}+")
    target = tvm.target.Target(f"cuda -arch=sm_{arch}")
    refused = unsupported_reason(dtype, target)  # int4/uint4 on sm_90 and newer
    if refused:
        pytest.skip(f"GPU is sm_{arch}, where the rules keep {dtype} off tensor cores: {refused}")
    return target


@pytest.mark.parametrize("dtype,batch,cin,cout", [
    ("int8", 16, 64, 64), ("int8", 8, 60, 30), ("int4", 8, 64, 16), ("int4", 8, 60, 8),
], ids=lambda v: str(v))
def test_relay_conv2d_hwnc_runs_on_tensor_cores(dtype, batch, cin, cout):
    """Relay build on the GPU: fitting layers, and layers legalization pads (60 -> 64 channels)."""
    target = _need(wmma.MIN_ARCH[dtype], dtype)
    rng = np.random.default_rng(0)
    xv = _values(rng, (8, 8, batch, cin), dtype)
    wv = _values(rng, (3, 3, cout, cin), dtype)
    # int4 travels as int8 (NumPy has no int4) and is cast on the device.
    x = relay.var("x", shape=xv.shape, dtype=STORAGE[dtype])
    y = relay.nn.conv2d(relay.cast(x, dtype), relay.cast(relay.const(wv), dtype), padding=1, kernel_size=(3, 3),
                        data_layout="HWNC", kernel_layout="HWOI", out_dtype="int32")
    mod = tvm.IRModule.from_expr(relay.Function([x], y))
    with tc.pad_limit(0.5), tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target)
    module = graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("x", xv)
    module.run()
    np.testing.assert_array_equal(module.get_output(0).numpy(), conv2d_hwnc_reference(xv, wv, 1, 1, 1))


@pytest.mark.parametrize("task_name", [conv2d_hwnc.TASK, dense.TASK])
def test_random_configs_run_correctly(task_name):
    target = _need(72)
    if task_name == conv2d_hwnc.TASK:
        args = (te.placeholder((7, 7, 32, 64), "int8"), te.placeholder((3, 3, 64, 64), "int8"),
                (1, 1), (1, 1, 1, 1), (1, 1), "int32")
    else:
        args = (te.placeholder((32, 128), "int8"), te.placeholder((64, 128), "int8"), "int32")
    task = autotvm.task.create(task_name, args=args, target=target)
    rng = np.random.default_rng(1)
    arrays = [rng.integers(-128, 128, size=[int(v) for v in a.shape]).astype("int8") for a in args[:2]]
    if task_name == conv2d_hwnc.TASK:
        want = conv2d_hwnc_reference(arrays[0], arrays[1], 1, 1, 1)
    else:
        want = arrays[0].astype(np.int64) @ arrays[1].astype(np.int64).T
    dev = tvm.cuda(0)
    for index in rng.choice(len(task.config_space), 4, replace=False):
        with target:
            sched, tensors = task.instantiate(task.config_space.get(int(index)))
            func = tvm.build(sched, tensors, target)
        out = tvm.nd.empty(want.shape, "int32", dev)
        # AutoTVM's instantiate lists the output first, then the inputs.
        func(out, *[tvm.nd.array(a, dev) for a in arrays])
        np.testing.assert_array_equal(out.numpy(), want)
