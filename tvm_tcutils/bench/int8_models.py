"""Quantized models end to end against onnxruntime and OpenVINO, each contender in its own process.

A model (a zoo name or an ``.onnx`` file) is quantized by onnxruntime's own
quantizer as users quantize it -- ``quantize_static`` in QDQ format (u8
activations, s8 per-channel weights) and ``quantize_dynamic`` (the default
``QInt8`` weights) -- and every route is run by every runtime that takes it:

* ``tcutils``: the file imported with ``tvm_tcutils.load_model`` and built with plain
  ``relay.build`` for this CPU (the package's hooks do the rest), exported once;
* ``onnxruntime``: the file, CPU provider;
* ``OpenVINO``: the file, CPU plugin (latency hint).

Each contender runs in a worker process of its own (:class:`~.isolated.Isolated`), stopped
while another one is timed; the contenders of one thread count take turns
(:func:`~.competitors.compare`), and each ratio comes with its bootstrap interval.
Outputs are compared with onnxruntime's on the same input before any timing.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._tvm import host_target, tvm
from tvm import relay

from ..files import atomic_path
from .competitors import compare, ort_session, ratios, timed_once
from .int8 import QUANTIZED_CACHE, ort_quantized
from .isolated import Isolated

#: Routes of onnxruntime's quantizer (and the float model), by the key of :func:`model_files`.
ROUTES = {
    "qdq": "quantize_static, QDQ, per-channel s8 weights, u8 activations",
    "qoperator": "quantize_static, QOperator (QLinearConv, QLinearMatMul, ...), per-channel s8 weights",
    "dynamic": "quantize_dynamic (DynamicQuantizeLinear + MatMulInteger / ConvInteger)",
    "fp32": "the float model",
    # onnxruntime's quantization guide advises reduce_range on CPUs without VNNI, whose u8 x s8
    # multiply-add (vpmaddubsw) saturates full-range weights: what such a CPU's users run.
    "qdq-rr": "quantize_static, QDQ, per-channel 7-bit weights (reduce_range, in [-64, 64])",
}

#: What a run takes unless told: ``qdq-rr`` is asked for where it matters (CPUs without VNNI).
DEFAULT_ROUTES = ("qdq", "qoperator", "dynamic", "fp32")

#: Runtimes: column prefix -> :mod:`.isolated` kind.
RUNTIMES = {"tcutils": "tvm", "onnxruntime": "ort", "OpenVINO": "openvino"}


def dynamic_file(fp32: str, folder: Optional[str] = None) -> str:
    """``quantize_dynamic`` of an ONNX file (default settings), written once next to the others and reused."""
    from onnxruntime.quantization import quantize_dynamic

    folder = folder or QUANTIZED_CACHE
    path = os.path.join(folder, os.path.splitext(os.path.basename(fp32))[0] + "-dynamic.onnx")
    if not os.path.exists(path):
        with atomic_path(path, suffix=".onnx") as partial:
            quantize_dynamic(fp32, partial)
    return path


def model_files(model: str, routes: Sequence[str] = DEFAULT_ROUTES) -> Dict[str, str]:
    """Route -> ONNX file of ``model``, quantized by onnxruntime and cached.

    ``model``: a zoo name, an ``.onnx`` file, or ``light_<name>``, one of the onnx package's light
    models with random weights (:func:`~tvm_tcutils.bench.models.light_model`): architectures
    the zoo lacks (LRN, grouped and concatenated convs, batch norms to fold), as users bring them.

    Raises
    ------
    ValueError
        An unknown route.
    """
    unknown = [r for r in routes if r not in ROUTES]
    if unknown:
        raise ValueError(f"routes must be among {tuple(ROUTES)}, got {unknown}")
    if model.startswith("light_"):
        from .models import light_model

        model = light_model(model[len("light_"):], weights="random")
    files = ort_quantized(model)
    out = {"fp32": files["fp32"], "qdq": files["qdq"], "qoperator": files["qoperator"]}
    if "dynamic" in routes:
        out["dynamic"] = dynamic_file(files["fp32"])
    if "qdq-rr" in routes:
        out["qdq-rr"] = ort_quantized(model, reduce_range=True)["qdq"]
    return {route: out[route] for route in routes}


def feed_of(path: str, seed: int = 0) -> Dict[str, np.ndarray]:
    """One random input per graph input of an ONNX file (standard normal: the models take float32)."""
    import onnx

    from ..models import onnx_graph_inputs

    rng = np.random.default_rng(seed)
    return {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype("float32")
            for i in onnx_graph_inputs(onnx.load(path, load_external_data=False).graph)}


def build_tcutils(path: str, folder: str, target: Optional[str] = None) -> Tuple[str, float]:
    """``(library, seconds)``: ``path`` imported by ``tvm_tcutils.load_model``, built by plain ``relay.build``
    and exported into ``folder``."""
    from .. import load_model

    target = target or host_target()

    def build():
        mod, params = load_model(path)
        with tvm.transform.PassContext(opt_level=3):
            return relay.build(mod, target=target, params=params)

    lib, seconds = timed_once(build)
    out = os.path.join(folder, os.path.splitext(os.path.basename(path))[0] + ".so")
    lib.export_library(out)
    return out, seconds


def relative_difference(ours: np.ndarray, reference: np.ndarray) -> float:
    """``max |ours - reference| / max |reference|``.

    Examples
    --------
    >>> relative_difference(np.array([1.0, 2.1]), np.array([1.0, 2.0]))
    0.05
    """
    scale = float(np.max(np.abs(reference))) or 1.0
    return round(float(np.max(np.abs(ours.astype("float64") - reference))) / scale, 6)


def _check(library: str, path: str, feed: Mapping[str, np.ndarray]) -> float:
    """The built library's first output against onnxruntime's on the same file and input."""
    from ..measure import graph_module

    runner = graph_module(tvm.runtime.load_module(library), feed)
    runner.run()
    expected = ort_session(path, 1).run(None, dict(feed))[0]
    return relative_difference(runner.get_output(0).numpy(), expected)


def bench_model(model: str, threads: Sequence[int], rounds: int = 5, routes: Sequence[str] = DEFAULT_ROUTES,
                runtimes: Sequence[str] = tuple(RUNTIMES), min_ms: float = 200.0) -> List[dict]:
    """Every runtime on every route of ``model``, per thread count, isolated and in turns. The JSON rows.

    Each row holds one thread count: every column's timing, its ratio to onnxruntime and to OpenVINO on
    the same route, and ``tcutils``'s int8 routes against its own fp32 build; plus the build times and
    each ``tcutils`` build's relative difference from onnxruntime's output.
    """
    files = model_files(model, routes)
    feed = feed_of(files[routes[0]])
    rows = []
    with tempfile.TemporaryDirectory(prefix="tcutils-int8-models-") as folder:
        built, checks, build_s = {}, {}, {}
        if "tcutils" in runtimes:
            for route in routes:
                built[route], build_s[route] = build_tcutils(files[route], folder)
                checks[route] = _check(built[route], files[route], feed)
                print(f"{model} {route}: tcutils build {build_s[route]:.0f} s, relative difference from "
                      f"onnxruntime {checks[route]:.4f}", flush=True)
        for n in threads:
            columns = {}
            with contextlib.ExitStack() as stack:
                for runtime in runtimes:
                    for route in routes:
                        path = built[route] if runtime == "tcutils" else files[route]
                        try:
                            columns[f"{runtime} {route}"] = stack.enter_context(
                                Isolated(RUNTIMES[runtime], path, feed, threads=n, min_ms=min_ms))
                        except (RuntimeError, ImportError) as err:
                            print(f"{runtime} {route}: not timed ({err})")
                            columns[f"{runtime} {route}"] = None
                timed = compare(columns, rounds=rounds)
            row = {"model": model, "threads": n, "timings": {k: v.as_dict() for k, v in timed.items()},
                   "build_s": build_s, "relative_difference_vs_ort": checks}
            def has(column):
                return column in timed and bool(timed[column].samples_ms)

            # Time ratios (< 1: tcutils is faster), each with its bootstrap interval.
            for runtime in ("onnxruntime", "OpenVINO"):
                row[f"vs_{runtime}"] = {
                    route: ratios(timed, f"{runtime} {route}")[f"tcutils {route}"].as_dict()
                    for route in routes if has(f"tcutils {route}") and has(f"{runtime} {route}")}
            if has("tcutils fp32"):
                row["vs_tcutils_fp32"] = {route: ratios(timed, "tcutils fp32")[f"tcutils {route}"].as_dict()
                                          for route in routes if has(f"tcutils {route}")}
            _print_row(row, timed)
            rows.append(row)
    return rows


def _print_row(row: dict, timed) -> None:
    print(f"{row['model']}, {row['threads']} thread(s), isolated processes, ms (median +- half IQR):")
    for column, timing in timed.items():
        route = column.split()[-1]
        cells = "  ".join(f"time / {rt}'s {row[f'vs_{rt}'][route]['value']:.2f}"
                          for rt in ("onnxruntime", "OpenVINO")
                          if column.startswith("tcutils") and route in row.get(f"vs_{rt}", {}))
        print(f"  {column:<22} {str(timing):<30} {cells}", flush=True)


def _speedup(ratio: Optional[dict]) -> str:
    """A time ratio (ours / theirs, with interval) as a speedup: theirs / ours, interval inverted."""
    if not ratio:
        return "-"
    return f"x{1 / ratio['value']:.2f} [{1 / ratio['high']:.2f}, {1 / ratio['low']:.2f}]"


def markdown(rows: Sequence[Mapping]) -> str:
    """The Markdown table of :func:`bench_model`'s rows: one line per model, thread count and route.

    Speedups are the other runtime's median time over tcutils' (above 1: tcutils is faster), each with
    its 95 % bootstrap interval.

    Examples
    --------
    >>> t = {"median_ms": 2.0, "spread": 0.01}
    >>> row = {"model": "m", "threads": 1, "timings": {"tcutils qdq": t, "onnxruntime qdq": {"median_ms": 3.0,
    ...        "spread": 0.0}}, "vs_onnxruntime": {"qdq": {"value": 0.5, "low": 0.4, "high": 0.625}},
    ...        "vs_OpenVINO": {}}
    >>> print(markdown([row]).splitlines()[-1])
    | m | 1 | qdq | 2.00 | 3.00 | - | x2.00 [1.60, 2.50] | - | - |
    """
    from .table import markdown as table

    header = ["model", "threads", "route", "tcutils ms", "onnxruntime ms", "OpenVINO ms",
              "speedup vs onnxruntime", "speedup vs OpenVINO", "speedup vs tcutils fp32"]
    lines = []
    for row in rows:
        routes = list(dict.fromkeys(column.split()[-1] for column in row["timings"]))
        for route in routes:
            def ms(runtime):
                timing = row["timings"].get(f"{runtime} {route}")
                return f"{timing['median_ms']:.2f}" if timing and timing.get("samples_ms", [1]) else "-"

            lines.append([row["model"], row["threads"], route, ms("tcutils"), ms("onnxruntime"), ms("OpenVINO"),
                          _speedup(row["vs_onnxruntime"].get(route)), _speedup(row["vs_OpenVINO"].get(route)),
                          "-" if route == "fp32" else _speedup(row.get("vs_tcutils_fp32", {}).get(route))])
    return table(header, lines)
