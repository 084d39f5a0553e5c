"""A small encoder quantized both ways onnxruntime's quantizer does it, built with plain ``relay.build`` (issue 31).

``quantize_static`` (QDQ) and ``quantize_dynamic`` files of a one-layer BERT-like encoder are imported
with ``relay.frontend.from_onnx`` after ``import tvm_tcutils`` and built by ``relay.build``: the
integer ``dense`` (and, from the QDQ file, the two attention ``batch_matmul`` of activations, u8 x u8)
run on the dot-product instruction, and the outputs match onnxruntime's.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

import tvm_tcutils  # noqa: E402,F401  (the hooks, as a user imports them)
from tvm_tcutils._tvm import tvm  # noqa: E402
from tvm import relay  # noqa: E402

from tvm_tcutils import measure  # noqa: E402
from tvm_tcutils.bench.int8_models import relative_difference  # noqa: E402
from tvm_tcutils.dotprod.quantize import ort_quantize  # noqa: E402

from conftest import host_dot_target  # noqa: E402

#: The instruction each x86 ISA's kernels are made of (AVX2 and SSE: the exact 16-bit multiply-add).
INSTRUCTION = {"x86_vnni": "vpdpbusd", "x86_avx2": "vpmaddwd", "x86_sse": "pmaddwd"}

SHAPE = (1, 16, 32)
_FUNC = re.compile(r"^(tvmgen_\w+):", re.M)


@pytest.fixture(scope="module")
def encoder_files(tmp_path_factory, small_bert_onnx):
    """route -> file: the one-layer encoder through quantize_static (QDQ) and quantize_dynamic."""
    from onnxruntime.quantization import quantize_dynamic

    folder = tmp_path_factory.mktemp("encoder")
    model, _, _ = small_bert_onnx
    fp32 = str(folder / "encoder.onnx")
    onnx.save(model, fp32)
    rng = np.random.default_rng(3)
    samples = [{"input": rng.standard_normal(SHAPE).astype("float32")} for _ in range(4)]
    dynamic = str(folder / "encoder-dynamic.onnx")
    quantize_dynamic(fp32, dynamic)
    return {"static": ort_quantize(fp32, str(folder / "encoder-qdq.onnx"), samples, "qdq"), "dynamic": dynamic}


def _kernel_asm(lib) -> dict:
    """Function name -> its assembly, a function's parallel bodies (``<name>_compute_``) included."""
    asm = lib.get_lib().get_source("asm")
    starts = [(m.start(), m.group(1)) for m in _FUNC.finditer(asm)]
    bodies = {}
    for (start, name), (end, _) in zip(starts, starts[1:] + [(len(asm), "")]):
        key = name.split("_compute_")[0]
        bodies[key] = bodies.get(key, "") + asm[start:end]
    return bodies


def _integer_products(lib) -> dict:
    """Graph node function -> op kind ("dense"/"batch_matmul") of the products with 8-bit inputs."""
    graph = json.loads(lib.get_graph_json())
    dtypes = graph["attrs"]["dltype"][1]
    found = {}
    for node in graph["nodes"]:
        if node["op"] != "tvm_op":
            continue
        name = node["attrs"]["func_name"]
        kind = "batch_matmul" if "batch_matmul" in name else "dense" if "dense" in name else None
        if kind and any(dtypes[entry[0]] in ("uint8", "int8") for entry in node["inputs"]):
            found[name] = kind
    return found


# The dynamic route under -m slow (the CI budget): test_onnx_quantize_dynamic.py runs its integer ops against onnxruntime.
# The static route under -m slow too since session 43 (18 s on a slow VM): by default test_qdq.py's
# test_matmul_of_activations runs a QDQ file's dense and batch_matmul (MatMul of activations) on the
# dot-product kernels against onnxruntime, and test_fast_forms.py the encoder's softmax, GELU and layer norm.
@pytest.mark.parametrize("route, kinds", [pytest.param("static", {"dense", "batch_matmul"}, marks=pytest.mark.slow),
                                         pytest.param("dynamic", {"dense"}, marks=pytest.mark.slow)])
def test_quantized_encoder_runs_on_the_dot_product_and_matches_onnxruntime(encoder_files, route, kinds):
    from tvm_tcutils.dotprod.isa import for_target, tile_isa

    target = host_dot_target()
    path = encoder_files[route]
    mod, params = relay.frontend.from_onnx(onnx.load(path), {"input": SHAPE}, freeze_params=True)
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(mod, target=target, params=params)
    products = _integer_products(lib)
    # quantize_dynamic leaves the attention products of two activations in float (onnxruntime does too);
    # the package computes those as one float dense per head (fast_forms.dense_per_batch), not on TVM's
    # x86 batch_matmul schedule.
    assert set(products.values()) == kinds, products
    if route == "dynamic":
        graph = json.loads(lib.get_graph_json())
        assert not [n for n in graph["nodes"] if "batch_matmul" in n.get("attrs", {}).get("func_name", "")]
    asm, instruction = _kernel_asm(lib), INSTRUCTION[for_target(target).name]
    # On a CPU with AMX the denses that fill its tiles run on them (tdpbusd), the rest on the vector ISA.
    tiles = "tdpbusd" if tile_isa(target) is not None else instruction
    missing = [name for name in products if instruction not in asm[name] and tiles not in asm[name]]
    assert not missing, f"not on {instruction} or {tiles}: {missing}"

    x = np.random.default_rng(7).standard_normal(SHAPE).astype("float32")
    runner = measure.graph_module(lib, {"input": x})
    runner.run()
    expected = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    # Static: onnxruntime requantizes in float and rounds some 8-bit values one step apart from the integer
    # graph (0.023 here); dynamic: the same integer products with the same float around them (0 here).
    assert relative_difference(runner.get_output(0).numpy(), expected) < (0.06 if route == "static" else 1e-4)
