"""Instruction profile of an int8 model on emulated Hexagon HVX: the package's schedules against TVM's.

The model is made integer by one of two routes: ``quantize`` (``quantize_int8`` of a float
zoo model) or ``qdq`` (onnxruntime's ``quantize_static``, QDQ per-channel, of a built-in ONNX
model, made integer by ``tvm_tcutils.dotprod.qdq.to_integer``). A final softmax is stripped
(its float ``exp`` has no C form in the freestanding runner). Then it is built twice for C and
run under ``qemu-hexagon`` with a counting plugin (``tvm_tcutils.dotprod.hexagon_profile``):

* package: ``c -keys=hexagon,cpu -mcpu=hexagonv66`` with the package's hooks (HVX ``vrmpy`` tiles);
* TVM plain: the package's hooks removed, ``c -keys=cpu`` (TVM's generic CPU schedules; its own
  Hexagon schedules use LLVM HVX intrinsics on vector types its C backend cannot print).

Both outputs must agree bit for bit (each is bit-exact against the x86 build in the tests).
Counts are executed packets (qemu's unit on Hexagon), the instructions in them (``immext`` and
``nop`` not counted) and HVX ``vrmpy`` instructions; ideal = ceil(MACs / 128): one 128-byte
``vrmpy`` is 32 lanes x 4 = 128 byte MACs.

Usage::

    PYTHONPATH=. python scripts/bench_hexagon.py --model resnet-50-onnx resnet-18
    PYTHONPATH=. python scripts/bench_hexagon.py --model resnet-18 --route quantize --no-plain

Rows go to ``docs/benchmarks/data/bench_hexagon.json`` (``--json``), with the command, machine and date.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

import tvm_tcutils  # noqa: E402,F401  (installs the hooks)
from tvm import relay  # noqa: E402
from tvm_tcutils.bench.results import Results, add_json_argument  # noqa: E402
from tvm_tcutils.dotprod import hexagon_model, hexagon_profile  # noqa: E402


def integer_model(name: str, route: str, seed: int = 0):
    """``(mod, params, inputs, notes)``: the model made integer by ``route``, and a random input."""
    rng = np.random.default_rng(seed)
    notes = []
    if route == "qdq":
        import onnx

        from tvm_tcutils.bench.int8 import ort_quantized

        path = ort_quantized(name)["qdq"]
        model = onnx.load(path)
        inp = model.graph.input[0]
        shape = tuple(d.dim_value for d in inp.type.tensor_type.shape.dim)
        mod, params = relay.frontend.from_onnx(model, {inp.name: shape})
        mod, params, made = hexagon_profile.integer_model(mod, params)
        notes.append(f"onnxruntime quantize_static QDQ per-channel ({os.path.basename(path)})")
        inputs = {inp.name: rng.standard_normal(shape).astype("float32")}
    else:
        from tvm_tcutils.models import load_model

        mod, params, made = hexagon_profile.integer_model(*load_model(name))
        var = mod["main"].params[0]
        inputs = {var.name_hint: rng.standard_normal([int(d) for d in var.checked_type.shape]).astype("float32")}
    return mod, params, inputs, notes + made


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", nargs="+", default=["resnet-50-onnx"], help="zoo names (route quantize) or "
                        "built-in ONNX models such as resnet-50-onnx (route qdq); default %(default)s")
    parser.add_argument("--route", choices=("qdq", "quantize"), default=None,
                        help="how the models become integer (default: qdq for *-onnx names, else quantize)")
    parser.add_argument("--timeout", type=float, default=3000, help="seconds each emulated run may take")
    parser.add_argument("--no-plain", action="store_true", help="profile the package's build only")
    add_json_argument(parser, __file__)
    args = parser.parse_args(argv)
    missing = hexagon_profile.missing_profile_tools()
    if missing:  # before the long model preparation
        parser.error(f"needs {', '.join(missing)} (apt-get install qemu-user clang-16 lld-16)")
    results = Results(__file__, argv, target=hexagon_model.DEFAULT_TARGET,
                      plain_target=str(hexagon_profile.plain_target()).strip(),
                      counts="packets: executed Hexagon packets (qemu TCG plugin); instructions: in those packets, "
                             "immext and nop not counted; vrmpy: HVX vrmpy instructions; ideal_vrmpy = "
                             "ceil(byte MACs / 128); node MACs in the node's (padded) layout, total MACs the model's")
    failed = False
    for model in args.model:
        route = args.route or ("qdq" if model.endswith("-onnx") else "quantize")
        failed |= not profile_one(model, route, args, results)
        results.write(args.json)  # after each model: an interrupted run keeps the models done
    print("wrote", args.json)
    return 1 if failed else 0


def profile_one(model: str, route: str, args, results: Results) -> bool:
    """Profile ``model`` (package and plain builds), print its table, add its rows; False when the
    two builds' outputs differ or differ from the x86 build's."""
    start = time.time()
    mod, params, inputs, notes = integer_model(model, route)
    print(f"{model} via {route}: {'; '.join(notes)} ({time.time() - start:.0f} s)", flush=True)
    start = time.time()
    compared = hexagon_profile.compare_builds(mod, params, inputs, timeout=args.timeout, plain=not args.no_plain)
    package, plain = compared.package, compared.plain
    print(f"profiled in {time.time() - start:.0f} s", flush=True)
    out = package.outputs[0]
    print(f"output: {out.dtype}{list(out.shape)}, {np.unique(out).size} distinct values, argmax {int(out.argmax())}")
    print(compared.summary())
    print(hexagon_profile.format_table(package, plain), flush=True)
    common = {"model": model, "route": route}
    for which, prof in (("package", package), ("plain", plain)):
        if prof is None:
            continue
        for index, node in enumerate(prof.nodes):
            results.add(**common, build=which, index=index, node=node.name, macs=node.macs,
                        packets=node.counts.packets, instructions=node.counts.instructions, vrmpy=node.counts.vrmpy,
                        ideal_vrmpy=node.ideal_vrmpy)
        for name, counts in (("runner", prof.runner), ("total", prof.total)):
            results.add(**common, build=which, node=name, macs=prof.model_macs if name == "total" else 0,
                        packets=counts.packets, instructions=counts.instructions, vrmpy=counts.vrmpy,
                        ideal_vrmpy=prof.ideal_vrmpy if name == "total" else 0)
    results.add(**common, build="check", node="outputs", notes=notes, distinct_values=int(np.unique(out).size),
                package_equals_plain=compared.equals_plain is not False, package_equals_x86=compared.equals_x86)
    return compared.bit_exact


if __name__ == "__main__":
    sys.exit(main())
