"""A QDQ encoder (onnxruntime's quantizer) through plain ``relay.build`` for a CUDA target: its integer products
on the tensor-core GEMMs where a GPU check verified them, the float path elsewhere.

Without a GPU the machine code is checked (which kernel each product became); on a GPU
(``scripts/gpu_check.sh``) the outputs are compared with onnxruntime's on the same file.
"""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

import tvm_tcutils  # noqa: E402,F401  (the hooks, as a user imports them)
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402

from conftest import SASS_OPCODE, cuda_status  # noqa: E402
from tvm_tcutils import cuda, models  # noqa: E402
from tvm_tcutils.dotprod import qdq  # noqa: E402
from tvm_tcutils.dotprod.quantize import ort_quantize  # noqa: E402
from tvm_tcutils.tensorcore import strategy  # noqa: E402

_STATUS = cuda_status()
#: seq 64, hidden 64, one head: every product is made of whole tiles (an attention head's K is 64).
SHAPE = (1, 64, 64)

pytestmark = [
    pytest.mark.skipif(not _STATUS["codegen"], reason=f"no CUDA code generation here: {_STATUS['reason']}"),
    pytest.mark.skipif(cuda.tool("cuobjdump") is None, reason="cuobjdump is not in the CUDA toolkit"),
]


@pytest.fixture(scope="module")
def qdq_encoder(tmp_path_factory):
    """(path, input) of a one-layer BERT-like encoder through onnxruntime's quantize_static (QDQ)."""
    folder = tmp_path_factory.mktemp("encoder_cuda")
    fp32 = str(folder / "encoder.onnx")
    onnx.save(models.bert_onnx(layers=1, seq=SHAPE[1], hidden=SHAPE[2], heads=1), fp32)
    rng = np.random.default_rng(5)
    samples = [{"input": rng.standard_normal(SHAPE).astype("float32")} for _ in range(4)]
    return ort_quantize(fp32, str(folder / "encoder-qdq.onnx"), samples, "qdq"), samples[0]["input"]


def _build(path: str, arch: str):
    mod, params = relay.frontend.from_onnx(onnx.load(path), freeze_params=True)
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=tvm.target.Target(f"cuda -arch={arch}", host="llvm"), params=params), mod


def _tensor_core_kernels(lib) -> Counter:
    found = Counter()
    for code in cuda.sass(cuda.module_cubin(lib.get_lib())).values():
        ops = sorted({op for op in SASS_OPCODE.findall(code) if op.startswith(("IMMA", "IGMMA"))})
        if ops:
            found[tuple(ops)] += 1
    return found


def _integer_products(mod) -> Counter:
    integer = relay.transform.InferType()(qdq.to_integer(relay.transform.InferType()(mod)))
    return Counter(call.op.name for call in qdq.calls(integer)
                   if getattr(call.op, "name", "") in ("qnn.dense", "qnn.batch_matmul"))


def test_verified_archs_put_every_integer_product_on_tensor_cores(qdq_encoder, monkeypatch):
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    monkeypatch.setattr(strategy, "WGMMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    lib, mod = _build(qdq_encoder[0], "sm_90")
    products = _integer_products(mod)
    kernels = _tensor_core_kernels(lib)
    assert products["qnn.dense"] >= 6 and products["qnn.batch_matmul"] == 2, products
    # Each product its own kernel: attention's two u8 x u8 on mma, the projections on wgmma or mma.
    assert kernels[("IMMA.16832.U8.U8",)] == products["qnn.batch_matmul"], kernels
    assert sum(kernels.values()) == sum(products.values()), (kernels, products)


def test_the_qdq_route_follows_the_verified_archs(monkeypatch):
    # Unverified: QDQ regions stay float for CUDA (TVM's path, as without the package's GEMMs).
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset())
    assert not qdq.rewrites_for("cuda -arch=sm_90") and not qdq.rewrites_for("cuda -arch=sm_80")
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({"sm_90"}))
    assert qdq.rewrites_for("cuda -arch=sm_90") and not qdq.rewrites_for("cuda -arch=sm_80")
    assert qdq.rewrites_for("llvm -mcpu=znver4") and not qdq.rewrites_for("llvm")


def test_on_the_gpu_the_outputs_match_onnxruntime(qdq_encoder, monkeypatch):
    import onnxruntime as ort
    from tvm.contrib import graph_executor

    if not _STATUS["device"]:
        pytest.skip("no GPU here: the numbers come from a machine with one (scripts/gpu_check.sh)")
    arch = "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    if int(arch[3:]) < 80:
        pytest.skip(f"the GPU is {arch}: the integer GEMMs need sm_80+")
    monkeypatch.setattr(strategy, "MMA_VERIFIED_ARCHS", frozenset({f"sm_{arch[3:5]}"}))
    path, x = qdq_encoder
    lib, _ = _build(path, arch)
    module = graph_executor.GraphModule(lib["default"](tvm.cuda(0)))
    module.set_input("input", x)
    module.run()
    want = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    found = module.get_output(0).numpy()
    # Requantization rounds once per layer in each runtime; a step of the output's scale apart at most.
    assert np.max(np.abs(found - want)) <= 0.05 * np.max(np.abs(want)), np.max(np.abs(found - want))
