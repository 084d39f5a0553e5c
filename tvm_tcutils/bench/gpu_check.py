"""The GPU check: what a lent GPU must confirm of the tensor-core kernels, in one run that fits a short lease.

Three parts, each writing its rows to one :class:`~.results.Results`:

* ``resnet50``: ResNet-50 (batch 8) prepared by
  :func:`~tvm_tcutils.tensorcore.prepare_for_tensorcore` in int8, built by
  ``relay.build`` for the GPU and for the CPU (the package's plain HWNC
  reference rows), run on the same input: the outputs must agree; then its
  end-to-end latency with the package's kernels and with TVM 0.19's own HWNC
  template (the package's strategy rows unregistered for that build).
* ``exact``: ResNet-50 int8 with every narrow cast saturating, GPU against CPU
  (:func:`exact`; the model as prepared casts out-of-range values, which
  the two devices treat differently).
* ``layers``: every distinct HWNC conv2d layer of that model, the package's
  template against TVM's ``conv2d_HWNCnc_tensorcore.cuda`` (both on their
  fallback configs), timed in turns.
* ``int4``: int4/uint4 layers through ``relay.build`` against the CPU build of
  the same module, with and without the package's rewrite of element-wise
  4-bit accesses (:mod:`tvm_tcutils.cuda_subbyte`); int4 ResNet-50 against
  its CPU build (integer weights). On sm_90 and newer, where the rules keep
  int4 off tensor cores, this part lifts that rule for itself.
* ``int4_speed``: int4 against int8 per ResNet-50 layer (the package's template).
* ``tune``: AutoTVM tuning on the GPU as a user runs it (:func:`tvm_tcutils.tuning.tune`)
  of the int8 ResNet-50's tensor-core convolutions and of a 4096^3 int8 dense,
  each then built untuned and tuned, outputs compared, timed in turns.
* ``dense``: the package's int8 tensor-core dense against cuBLASLt's int8 GEMM
  (``torch._int_mm``, in a process of its own that waits between its turns),
  and both against the GPU's integer tensor-core peak.

Everything before the first GPU launch (imports, the plugin, the builds for
the GPU's architecture, the CPU reference) also runs without a GPU: that is
the rehearsal (``--arch`` names the architecture to build for), and the rows
then say ``"rehearsal": true`` and hold no timings.

Examples
--------
>>> peak_tops("NVIDIA H200", "int8")
1979.0
>>> peak_tops("Some GPU", "int8") is None
True
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import tempfile
import time
from collections import Counter
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from tvm import autotvm, relay
from tvm.contrib import graph_executor

from .. import cuda
from ..measure import interleave, ratio
from .tensorcore import task_arguments

#: Dense integer tensor-core peak (TOPS, no sparsity) by device-name fragment, from the vendors' data sheets.
PEAK_TOPS: Dict[str, Dict[str, float]] = {
    "H200": {"int8": 1979.0},
    "H100 SXM": {"int8": 1979.0},
    "H100 80GB HBM3": {"int8": 1979.0},
    "H100 PCIe": {"int8": 1513.0},
    "A100": {"int8": 624.0, "int4": 1248.0},
    "L4": {"int8": 242.5, "int4": 485.0},
    "A10": {"int8": 250.0, "int4": 500.0},
    "T4": {"int8": 130.0, "int4": 260.0},
}

#: (M, N, K) of the dense comparison: a classifier at batch 8 (ResNet-50's, 1000 classes padded to
#: 1024), then token-matrix GEMMs.
DENSE_SHAPES: Tuple[Tuple[int, int, int], ...] = (
    (8, 1024, 2048), (128, 1024, 1024), (512, 4096, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
)


def peak_tops(device_name: str, dtype: str) -> Optional[float]:
    """The dense integer tensor-core peak of a GPU named ``device_name`` for ``dtype``, or ``None`` if unknown."""
    for fragment, peaks in PEAK_TOPS.items():
        if fragment in device_name:
            return peaks.get(dtype)
    return None


def gpu_present() -> bool:
    """Whether TVM can run CUDA kernels here (plugin or CUDA build, driver, GPU)."""
    return bool(cuda.status()["device"])


def device_arch(default: str) -> str:
    """GPU 0's ``sm_XX``, else ``default`` (a rehearsal builds for the architecture it is told)."""
    if gpu_present():
        return "sm_" + str(tvm.cuda(0).compute_version).replace(".", "")
    return default


def _graph(lib, dev):
    return graph_executor.GraphModule(lib["default"](dev))


def _build(mod, params, target):
    with tvm.transform.PassContext(opt_level=3):
        return relay.build(mod, target=target, params=params)


@contextlib.contextmanager
def packages_gemms_allowed(arch: str) -> Iterator[None]:
    """Within the block ``relay.build`` takes the package's GEMM kernels for ``arch`` (the mma ones, and the
    warp-group one on sm_90) as if the GPU check had verified them there: what a part measures before the
    arch is added to ``strategy.MMA_VERIFIED_ARCHS``; the sets are restored after."""
    from ..tensorcore import strategy
    from ..tensorcore.topi import wgmma_gemm
    from ..tensorcore.topi.mma_gemm import arch_number

    name = f"sm_{arch_number(arch)}"
    gates = {"MMA_VERIFIED_ARCHS": strategy.MMA_VERIFIED_ARCHS, "WGMMA_VERIFIED_ARCHS": strategy.WGMMA_VERIFIED_ARCHS}
    strategy.MMA_VERIFIED_ARCHS = gates["MMA_VERIFIED_ARCHS"] | {name}
    if wgmma_gemm.supports(arch):
        strategy.WGMMA_VERIFIED_ARCHS = gates["WGMMA_VERIFIED_ARCHS"] | {name}
    try:
        yield
    finally:
        for gate, value in gates.items():
            setattr(strategy, gate, value)


def _kernels(lib) -> Tuple[Dict[str, str], List[str]]:
    """({kernel: SASS}, kernels with local memory or a stack) of a built CUDA module."""
    cubin = cuda.module_cubin(lib)
    return cuda.sass(cubin), sorted(k for k, r in cuda.resources(cubin).items() if r.local or r.stack)


def _tensor_core_ops(kernels: Dict[str, str]) -> List[Tuple[str, int]]:
    """(tensor-core instruction, kernels using it) from ``{kernel: SASS}``."""
    return sorted(Counter(op for code in kernels.values()
                          for op in set(re.findall(r"\b(I(?:G)?MMA\.[\w.]+)", code))).items())


def _tvm_own_build(mod, params, target):
    """``mod`` built with TVM's own strategy (the package's hooks out), keeping the CUDA callbacks it needs.

    Without the package's postproc TVM's int8 code does not compile; without its compile callback
    TVM would call nvcc by name, which the PyPI toolkit does not put on PATH.
    """
    import tvm_tcutils
    from ..registry import overriding_func

    postproc = tvm.get_global_func("tvm_callback_cuda_postproc", allow_missing=True)
    compile_cb = tvm.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    tvm_tcutils.unregister()
    try:
        with overriding_func("tvm_callback_cuda_postproc", postproc), \
                overriding_func("tvm_callback_cuda_compile", compile_cb):
            return _build(mod, params, target)
    finally:
        tvm_tcutils.register()


def _without_softmax(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with a final ``nn.softmax`` removed (the model then returns the logits)."""
    func = mod["main"]
    body = func.body
    if isinstance(body, relay.Call) and getattr(body.op, "name", "") == "nn.softmax":
        func = relay.Function(func.params, body.args[0], attrs=func.attrs)
    return tvm.IRModule.from_expr(func)


def _sample(module, dev, number: int) -> Callable[[], float]:
    """One interleaving sample (ms): the mean of ``number`` runs of a graph module."""
    evaluator = module.module.time_evaluator("run", dev, number=number, repeat=1)
    return lambda: float(evaluator().results[0]) * 1e3


def _integer_weights(params: Dict[str, "tvm.nd.NDArray"]) -> Dict[str, "tvm.nd.NDArray"]:
    """``params`` with small integer weights (-2..2, conv and dense): the model's random float weights
    (``|w| < 1``) all truncate to 0 when recast to int8/int4, which would make a GPU-vs-CPU check vacuous."""
    rng = np.random.default_rng(0)
    return {name: tvm.nd.array(rng.integers(-2, 3, size=value.shape).astype(value.dtype))
            if len(value.shape) in (2, 4) else value for name, value in params.items()}


#: The request loop of a PyTorch model worker whose script defines ``make(*key) -> (model, input)``: one
#: request line ``*key number``, one answer line ``{"ms": mean of number calls}`` (or ``{"error": ...}``).
_TORCH_MODEL_LOOP = r"""
cache = {}
for line in sys.stdin:
    *key, number = (int(v) for v in line.split())
    try:
        key = tuple(key)
        if key not in cache:
            torch.manual_seed(0)
            model, x = make(*key)
            with torch.inference_mode():
                for _ in range(5):  # warm-up: cudnn.benchmark picks each conv's algorithm on the first calls
                    model(x)
            torch.cuda.synchronize()
            cache[key] = (model, x)
        model, x = cache[key]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.inference_mode():
            start.record()
            for _ in range(number):
                model(x)
            end.record(); torch.cuda.synchronize()
        print(json.dumps({"ms": start.elapsed_time(end) / number}), flush=True)
    except Exception as err:
        print(json.dumps({"error": str(err)[:300]}), flush=True)
"""

#: ResNet-50 in PyTorch float16 channels-last (cuDNN), timed in a process of its own; one request line
#: ``batch number``.
_TORCH_RESNET_WORKER = r"""
import json, sys, torch
from torch import nn
torch.backends.cudnn.benchmark = True

class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride):
        super().__init__()
        cout = mid * 4
        self.body = nn.Sequential(
            nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, mid, 3, stride, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(inplace=True),
            nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        return self.relu(self.body(x) + (x if self.down is None else self.down(x)))

def resnet50():  # torchvision's ResNet-50 (v1.5: the stride on the 3x3 conv); the GPU machine has no torchvision
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for mid, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(cin, mid, stride if i == 0 else 1))
            cin = mid * 4
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000))

def make(batch):
    model = resnet50().eval().half().cuda().to(memory_format=torch.channels_last)
    return model, torch.randn(batch, 3, 224, 224, device="cuda").half().to(memory_format=torch.channels_last)
""" + _TORCH_MODEL_LOOP


def _resnet50_logits(batch: int, dtype: str, target: str):
    """ResNet-50 with small integer weights (:func:`_integer_weights`), returning its logits, prepared for
    ``target`` in ``dtype``: ``(prepared, params, skipped, input)``. The logits, not the softmax: with the
    model's random weights the softmax is nearly uniform (about 0.001 everywhere) and would hide differences."""
    import tvm_tcutils

    mod, params = tvm_tcutils.load_model("resnet-50", batch_size=batch)
    prepared, skipped = tvm_tcutils.prepare_for_tensorcore(_without_softmax(mod), dtype=dtype, target=target)
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype("float32")
    return prepared, _integer_weights(params), skipped, x


def resnet50(results, arch: str, batch: int = 8, rounds: int = 5, wait: Callable[[], None] = lambda: None,
             torch_python: str = "python3") -> None:
    """ResNet-50 int8 on tensor cores: GPU outputs against the CPU reference, then end to end in turns: the
    package as verified (``tcutils``), the package with its mma kernels allowed for ``arch``
    (``tcutils_mma``: :func:`packages_gemms_allowed`; checked equal to ``tcutils`` first), TVM's own HWNC
    template (``tvm``) and the same network in PyTorch float16 channels-last on cuDNN (``torch_fp16``, in
    a process of its own)."""
    target = f"cuda -arch={arch}"
    prepared, params, skipped, x = _resnet50_logits(batch, "int8", target)
    row: Dict[str, object] = {"part": "resnet50", "batch": batch, "dtype": "int8", "target": target,
                              "skipped_layers": len(skipped)}
    start = time.time()
    lib = _build(prepared, params, target)
    row["build_s"] = round(time.time() - start, 1)
    kernels, row["local_memory_kernels"] = _kernels(lib)
    row["kernels"] = len(kernels)
    row["imma_kernels"] = sum("IMMA" in code for code in kernels.values())
    # The same model with the package's mma kernels allowed (the implicit-GEMM conv2d, the dense).
    mma_lib = None
    start = time.time()
    try:
        with packages_gemms_allowed(arch):
            mma_lib = _build(prepared, params, target)
        row["mma_build_s"] = round(time.time() - start, 1)
        mma_kernels, row["mma_local_memory_kernels"] = _kernels(mma_lib.get_lib())
        row["mma_tensor_core_ops"] = _tensor_core_ops(mma_kernels)
        row["mma_kernels"] = len(mma_kernels)  # each layer's epilogue inside its GEMM kernel
    except Exception as err:  # noqa: BLE001  (a result to report: the WMMA build is still timed)
        row["mma_error"] = str(err).strip().splitlines()[-1][:300]
    own_lib = None
    start = time.time()
    try:
        own_lib = _tvm_own_build(prepared, params, target)
        row["tvm_build_s"] = round(time.time() - start, 1)
    except Exception as err:  # noqa: BLE001  (TVM's own path failing is a result to report, not a crash)
        row["tvm_error"] = str(err).strip().splitlines()[-1][:300]
    start = time.time()
    cpu_lib = _build(prepared, params, "llvm")
    row["cpu_build_s"] = round(time.time() - start, 1)
    cpu = _graph(cpu_lib, tvm.cpu())
    cpu.set_input("data", x)
    cpu.run()
    want = cpu.get_output(0).numpy()
    if not gpu_present():
        row["rehearsal"] = True
        results.add(**row)
        print(f"rehearsal: ResNet-50 int8 built for {target} ({row['kernels']} kernels, {row['imma_kernels']} with "
              f"IMMA), with TVM's own template ({row.get('tvm_error') or 'built'}) and for the CPU; "
              "the GPU run needs a GPU", flush=True)
        return
    dev = tvm.cuda(0)
    gpu = _graph(lib, dev)
    gpu.set_input("data", x)
    gpu.run()
    got = gpu.get_output(0).numpy()
    row["output"] = "logits"
    row["max_abs_diff"] = float(np.max(np.abs(got - want)))
    row["max_abs_ref"] = float(np.max(np.abs(want)))
    row["top1_agree"] = float(np.mean(got.argmax(1) == want.argmax(1)))
    print(f"ResNet-50 int8 GPU vs CPU: max |diff| {row['max_abs_diff']:.3g} of {row['max_abs_ref']:.3g}, "
          f"top-1 agreement {row['top1_agree']:.2f}", flush=True)
    timers = {"tcutils": _sample(gpu, dev, 20)}
    if mma_lib is not None:
        mma = _graph(mma_lib, dev)
        mma.set_input("data", x)
        mma.run()
        # Both integer-exact on the same GPU: the mma kernels against the WMMA ones, exactly.
        row["mma_vs_tcutils_max_abs_diff"] = float(np.max(np.abs(mma.get_output(0).numpy() - got)))
        timers["tcutils_mma"] = _sample(mma, dev, 20)
    worker = TorchWorker(torch_python, _TORCH_RESNET_WORKER)
    timers["torch_fp16"] = lambda: worker.request(batch, 20)
    if own_lib is not None:
        try:
            own = _graph(own_lib, dev)
            own.set_input("data", x)
            own.run()
            own_out = own.get_output(0).numpy()
            row["tvm_max_abs_diff"] = float(np.max(np.abs(own_out - want)))
            # Both on the GPU, so the casts agree: the package's kernels against TVM's template, exactly.
            row["tcutils_vs_tvm_max_abs_diff"] = float(np.max(np.abs(own_out - got)))
            timers["tvm"] = _sample(own, dev, 20)
        except Exception as err:  # noqa: BLE001  (as above)
            row["tvm_error"] = str(err).strip().splitlines()[-1][:300]
    wait()
    try:
        timings = interleave(timers, rounds)
    finally:
        worker.close()
    row.update({name: timing for name, timing in timings.items()})
    if "tvm" in timings and timings["tvm"].samples_ms:
        row["tvm_over_tcutils"] = ratio(timings["tvm"], timings["tcutils"])
    best = min((name for name in ("tcutils", "tcutils_mma") if name in timings), key=lambda n: timings[n].median_ms)
    row["torch_fp16_over_tcutils_best"] = ratio(timings["torch_fp16"], timings[best])
    results.add(**row)
    print(f"ResNet-50 end to end: tcutils {timings['tcutils'].median_ms:.3f} ms, "
          f"mma {timings['tcutils_mma'].median_ms if 'tcutils_mma' in timings else float('nan'):.3f} ms, "
          f"PyTorch fp16 channels-last {timings['torch_fp16'].median_ms:.3f} ms"
          + (f", TVM {timings['tvm'].median_ms:.3f} ms" if "tvm" in timings else f" (TVM: {row.get('tvm_error')})"),
          flush=True)


def exact(results, arch: str, batch: int = 8) -> None:
    """ResNet-50 int8 on the GPU against the CPU, every narrow cast saturating (:func:`_saturating_casts`).

    The ``resnet50`` part times the model as prepared; its integer weights push activations past int8,
    where the two devices' casts differ, so its GPU-vs-CPU numbers measure that, not the kernels. Here
    both builds compute one defined function. It is still ill-conditioned: each truncating cast of a float
    activation (after the float batch norms) turns a rounding difference next to an integer into a step of 1,
    which 50 layers of integer weights amplify. So the row also holds the CPU build against itself with the
    input scaled by ``1 + 1e-6`` (an H200 gave 7,759 of 8,000 outputs different from the CPU, top-1 agreement
    0.875; the CPU against itself so perturbed, 7,000 and 0.875). The exact end-to-end oracle is the
    ``resnet50`` part's ``tcutils_vs_tvm_max_abs_diff``: TVM's template on the same GPU, where every float
    step is the same code.
    """
    target = f"cuda -arch={arch}"
    prepared, params, skipped, x = _resnet50_logits(batch, "int8", target)
    checked = _saturating_casts(prepared)
    row: Dict[str, object] = {"part": "exact", "case": "resnet-50", "dtype": "int8", "batch": batch,
                              "skipped_layers": len(skipped), "casts": "saturating"}
    print("exact: ResNet-50 int8, building for the GPU", flush=True)
    lib = _build(checked, params, target)
    print("exact: building and running the CPU reference", flush=True)
    cpu_lib = _build(checked, params, "llvm")
    want = _run_graph(cpu_lib, tvm.cpu(), {"data": x})
    row.update(max_abs_ref=float(np.max(np.abs(want))), elements=int(want.size))
    wobble = _run_graph(cpu_lib, tvm.cpu(), {"data": x * np.float32(1 + 1e-6)})
    row.update(cpu_perturbed_mismatches=int((wobble != want).sum()),
               cpu_perturbed_max_abs_diff=float(np.max(np.abs(wobble - want))),
               cpu_perturbed_top1_agree=float(np.mean(wobble.argmax(1) == want.argmax(1))))
    if gpu_present():
        got = _run_graph(lib, tvm.cuda(0), {"data": x})
        row.update(max_abs_diff=float(np.max(np.abs(got - want))), mismatches=int((got != want).sum()),
                   top1_agree=float(np.mean(got.argmax(1) == want.argmax(1))))
        print(f"exact: ResNet-50 int8 GPU vs CPU: {row['mismatches']} of {row['elements']} outputs differ, max |diff| "
              f"{row['max_abs_diff']:.3g} of {row['max_abs_ref']:.3g}, top-1 agreement {row['top1_agree']:.2f}",
              flush=True)
    else:
        row["rehearsal"] = True
    results.add(**row)


def _profile(lib, dev, x, top: int = 12) -> List[dict]:
    """The ``top`` kernels by time (TVM's debug executor times each one alone): where the end-to-end time goes."""
    from tvm.contrib.debugger import debug_executor

    module = debug_executor.create(lib.get_graph_json(), lib.lib, dev, dump_root="/tmp/tcutils-gpu-debug")
    module.set_input("data", x)
    module.set_input(**lib.get_params())
    module.run()
    nodes = json.loads(lib.get_graph_json())["nodes"]
    # One list of repeats (seconds) per graph node; inputs and weights cost nothing.
    times = module.run_individual(number=10, repeat=1, min_repeat_ms=0)
    rows = sorted(({"name": node["attrs"]["func_name"], "us": float(np.median(sample)) * 1e6}
                   for node, sample in zip(nodes, times) if node["op"] == "tvm_op"), key=lambda c: -c["us"])
    total = sum(r["us"] for r in rows)
    print(f"profile: {total / 1e3:.2f} ms in {len(rows)} kernels; top: "
          + ", ".join(f"{r['name']} {r['us']:.0f} us" for r in rows[:top]), flush=True)
    return rows[:top] + [{"name": "(all kernels)", "us": total}]


def profile(results, arch: str, batch: int = 8) -> None:
    """ResNet-50 int8 (batch ``batch``) on the GPU, each kernel timed alone: what the end-to-end time is made of."""
    import tvm_tcutils

    mod, params = tvm_tcutils.load_model("resnet-50", batch_size=batch)
    prepared, _ = tvm_tcutils.prepare_for_tensorcore(mod, dtype="int8", target=f"cuda -arch={arch}")
    lib = _build(prepared, params, f"cuda -arch={arch}")
    if not gpu_present():
        results.add(part="profile", rehearsal=True)
        print("rehearsal: the per-kernel profile needs a GPU", flush=True)
        return
    x = np.random.default_rng(0).standard_normal((batch, 3, 224, 224)).astype("float32")
    results.add(part="profile", batch=batch, kernels=_profile(lib, tvm.cuda(0), x))


def _task_function(task, target):
    with target:
        sched, tensors = task.instantiate(autotvm.task.space.FallbackConfigEntity())
        return tvm.build(sched, tensors, target), tensors


def _kernel_sample(func, args, dev, number: int = 50) -> Callable[[], float]:
    evaluator = func.time_evaluator(func.entry_name, dev, number=number, repeat=1)
    return lambda: float(evaluator(*args).results[0]) * 1e3


def layers(results, arch: str, batch: int = 8, rounds: int = 5) -> None:
    """Each distinct ResNet-50 HWNC layer: the package's template against TVM's, fallback configs, in turns."""
    from . import tensorcore as bench
    from ..tensorcore.topi import conv2d_hwnc

    target = tvm.target.Target(f"cuda -arch={arch}")
    rng = np.random.default_rng(0)
    workloads = bench.layers("int8", batch, f"cuda -arch={arch}")
    present = gpu_present()
    dev = tvm.cuda(0) if present else None
    for workload in workloads:
        task_args = workload[1:]
        shapes = [task_args[0][1], task_args[1][1]]
        row: Dict[str, object] = {"part": "layers", "data": list(shapes[0]), "kernel": list(shapes[1]),
                                  "strides": list(task_args[2])}
        funcs = {}
        for name, task_name in (("tvm", bench.TVM_TASK), ("tcutils", conv2d_hwnc.TASK)):
            try:
                funcs[name] = _task_function(autotvm.task.create(task_name, task_args, target), target)
            except Exception as err:  # noqa: BLE001  (one side failing to build is a result)
                row[f"{name}_error"] = str(err).strip().splitlines()[-1][:300]
        if not present:
            row["rehearsal"] = True
            results.add(**row)
            continue
        arrays = [rng.integers(-128, 128, size=s).astype("int8") for s in shapes]
        timers = {name: _kernel_sample(func, task_arguments(tensors, arrays, dev), dev)
                  for name, (func, tensors) in funcs.items()}
        timings = interleave(timers, rounds)
        row.update(timings)
        (h, _, n, c), (kh, kw, co, _) = shapes
        out_h = (h + task_args[3][0] + task_args[3][2] - kh) // task_args[2][0] + 1
        macs = out_h * out_h * n * co * kh * kw * c
        row["gops"] = 2 * macs / 1e9
        if len(timings) == 2 and all(t.samples_ms for t in timings.values()):
            row["tvm_over_tcutils"] = ratio(timings["tvm"], timings["tcutils"])
        results.add(**row)
        line = ", ".join(f"{k} {v.median_ms:.4f} ms" for k, v in timings.items() if v.samples_ms)
        print(f"layer {tuple(shapes[0])} x {tuple(shapes[1])}: {line}", flush=True)
    if not present:
        print(f"rehearsal: {len(workloads)} ResNet-50 layers built with both templates; timing needs a GPU", flush=True)


#: The cuBLASLt contender: a process of its own (torch and TVM stay apart) that times one GEMM per request.
_TORCH_WORKER = r"""
import json, sys, torch
cache = {}
for line in sys.stdin:
    m, n, k, number = (int(v) for v in line.split())
    try:
        if (m, n, k) not in cache:
            gen = torch.Generator(device="cuda").manual_seed(0)
            a = torch.randint(-128, 128, (m, k), dtype=torch.int8, device="cuda", generator=gen)
            b = torch.randint(-128, 128, (n, k), dtype=torch.int8, device="cuda", generator=gen).t()
            torch._int_mm(a, b); torch.cuda.synchronize()
            cache[(m, n, k)] = (a, b)
        a, b = cache[(m, n, k)]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            torch._int_mm(a, b)
        end.record(); torch.cuda.synchronize()
        print(json.dumps({"ms": start.elapsed_time(end) / number}), flush=True)
    except Exception as err:  # one shape torch refuses (M <= 16) must not end the worker
        print(json.dumps({"error": str(err)[:300]}), flush=True)
"""


#: PyTorch float16 BERT encoder (``nn.TransformerEncoder``: the fused fast path a user gets in inference
#: mode), timed in a process of its own; one request line ``layers seq hidden heads number``.
_TORCH_BERT_WORKER = r"""
import json, sys, torch

def make(layers, seq, hidden, heads):
    layer = torch.nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, activation="gelu", batch_first=True)
    model = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False).half().cuda().eval()
    return model, torch.randn(1, seq, hidden, dtype=torch.float16, device="cuda")
""" + _TORCH_MODEL_LOOP


class TorchWorker:
    """A PyTorch contender timed in a separate process (torch and TVM stay apart), one sample per call:
    ``torch._int_mm`` (cuBLASLt int8 GEMM) by default, or another worker ``script`` that answers one JSON
    line ``{"ms": ...}`` per request line."""

    def __init__(self, python: str = "python3", script: str = _TORCH_WORKER):
        self.proc = subprocess.Popen([python, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)

    def request(self, *values: int) -> float:
        self.proc.stdin.write(" ".join(map(str, values)) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"torch worker ended: {self.proc.stderr.read()[-500:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"torch worker, request {values}: {answer['error']}")
        return float(answer["ms"])

    def sample(self, m: int, n: int, k: int, number: int = 50) -> float:
        return self.request(m, n, k, number)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


def _gemm_task(template: str, tiles, m: int, n: int, k: int, arch: str):
    """The AutoTVM task of a GEMM ``template`` for int8 ``m x n x k`` and the ``tiles`` its fallback config
    takes; None where no tiling fits (``tiles`` None)."""
    from tvm import te

    if tiles is None:
        return None
    args = (te.placeholder((m, k), "int8"), te.placeholder((n, k), "int8"), "int32")
    return autotvm.task.create(template, args, tvm.target.Target(f"cuda -arch={arch}")), tiles


def dense(results, arch: str, rounds: int = 5, shapes: Sequence[Tuple[int, int, int]] = DENSE_SHAPES,
          torch_python: str = "python3") -> None:
    """The package's int8 dense kernels (fallback configs) against cuBLASLt (torch._int_mm) and the peak.

    The package's kernels: the WMMA template (``tcutils``); on sm_80 and newer where a tiling fits, the
    mma.sync/ldmatrix/cp.async one (``mma``, :mod:`~tvm_tcutils.tensorcore.topi.mma_gemm`); on sm_90 the
    warp-group one (``wgmma``, :mod:`~tvm_tcutils.tensorcore.topi.wgmma_gemm`). Each is checked
    bit-exact against numpy (``exact``, ``mma_exact``, ``wgmma_exact``) before it is timed.
    """
    from tvm import te

    from ..tensorcore.topi import dense as tc_dense
    from ..tensorcore.topi import mma_gemm, wgmma_gemm

    target = tvm.target.Target(f"cuda -arch={arch}")
    present = gpu_present()
    name = str(tvm.cuda(0).device_name) if present else ""
    peak = peak_tops(name, "int8")
    worker = TorchWorker(torch_python) if present else None
    rng = np.random.default_rng(0)
    try:
        for m, n, k in shapes:
            row: Dict[str, object] = {"part": "dense", "m": m, "n": n, "k": k, "peak_tops": peak}
            args = (te.placeholder((m, k), "int8"), te.placeholder((n, k), "int8"), "int32")
            kernels = {"tcutils": _task_function(autotvm.task.create(tc_dense.TASK, args, target), target)}
            number = mma_gemm.arch_number(arch)
            gemms = {"mma": _gemm_task(mma_gemm.TASK, mma_gemm.fallback_tiles(m, n, k, number), m, n, k, arch)}
            if wgmma_gemm.supports(arch):
                gemms["wgmma"] = _gemm_task(wgmma_gemm.TASK, wgmma_gemm.fallback_tiles(m, n, k), m, n, k, arch)
            for key, gemm in gemms.items():
                if gemm is not None:
                    kernels[key] = _task_function(gemm[0], target)
                    row[f"{key}_tiles"] = dict(gemm[1]._asdict())
            if not present:
                row["rehearsal"] = True
                row["kernels"] = sorted(kernels)
                results.add(**row)
                continue
            dev = tvm.cuda(0)
            arrays = [rng.integers(-128, 128, size=(m, k)).astype("int8"),
                      rng.integers(-128, 128, size=(n, k)).astype("int8")]
            want = arrays[0].astype(np.int64) @ arrays[1].astype(np.int64).T if m * n * k <= 2 ** 31 else None
            timers = {}
            for key, (func, tensors) in kernels.items():
                call_args = task_arguments(tensors, arrays, dev)
                func(*call_args)
                if want is not None:
                    row["exact" if key == "tcutils" else f"{key}_exact"] = bool(np.array_equal(call_args[0].numpy(),
                                                                                               want))
                timers[key] = _kernel_sample(func, call_args, dev, 20)
            if worker is not None:
                timers["cublaslt"] = lambda m=m, n=n, k=k: worker.sample(m, n, k, 20)
            timings = interleave(timers, rounds)
            row.update(timings)
            for key, timing in timings.items():
                if timing.samples_ms:
                    row[f"{key}_tops"] = 2 * m * n * k / (timing.median_ms * 1e-3) / 1e12
            for key in kernels:
                if "cublaslt" in timings and timings["cublaslt"].samples_ms and timings[key].samples_ms:
                    row[f"cublaslt_over_{key}"] = ratio(timings["cublaslt"], timings[key])
            results.add(**row)
            print(f"dense {m}x{n}x{k}: " + ", ".join(f"{key} {t.median_ms:.4f} ms ({row.get(key + '_tops', 0):.0f} "
                                                     f"TOPS)" for key, t in timings.items() if t.samples_ms)
                  + (f"; peak {peak:.0f} TOPS" if peak else ""), flush=True)
    finally:
        if worker is not None:
            worker.close()
    if not present:
        print(f"rehearsal: the dense kernels of {len(shapes)} shapes built; timing needs a GPU", flush=True)


#: The ``bert`` part's encoder: BERT-base (12 layers, hidden 768, 12 heads) at sequence 128.
BERT_BASE = {"layers": 12, "seq": 128, "hidden": 768, "heads": 12}


def bert(results, arch: str, rounds: int = 5, config: Optional[Dict[str, int]] = None, torch_python: str = "python3",
         work_dir: Optional[str] = None) -> None:
    """A BERT encoder quantized by onnxruntime (QDQ, static) through plain ``relay.build`` for this GPU, with the
    package's GEMMs allowed for ``arch`` during the part (``MMA_VERIFIED_ARCHS``, and ``WGMMA_VERIFIED_ARCHS`` on
    sm_90): its tensor-core kernels counted from SASS, its output compared with onnxruntime's on the same file,
    timed in turns against the same encoder in PyTorch float16 (``torch.nn.TransformerEncoder``). The model is
    made here (``models.bert_onnx``, random weights, four calibration samples): the GPU machine has no network.
    Without a GPU: the build and the kernel count (the rehearsal)."""
    import onnx
    import onnxruntime

    from ..dotprod.quantize import ort_quantize
    from ..models import bert_onnx

    config = dict(config or BERT_BASE)
    folder = work_dir or tempfile.mkdtemp(prefix="tcutils-bert-")
    fp32 = os.path.join(folder, "bert.onnx")
    onnx.save(bert_onnx(**config), fp32)
    rng = np.random.default_rng(0)
    shape = (1, config["seq"], config["hidden"])
    samples = [{"input": rng.standard_normal(shape).astype("float32")} for _ in range(4)]
    path = ort_quantize(fp32, os.path.join(folder, "bert-qdq.onnx"), samples, "qdq")
    with packages_gemms_allowed(arch):
        mod, params = relay.frontend.from_onnx(onnx.load(path), freeze_params=True)
        start = time.time()
        lib = _build(mod, params, f"cuda -arch={arch}")
        row: Dict[str, object] = {"part": "bert", **config, "build_s": round(time.time() - start, 1)}
    kernels, _ = _kernels(lib.get_lib())
    row["kernels"] = len(kernels)
    row["tensor_core_kernels"] = _tensor_core_ops(kernels)
    if not gpu_present():
        row["rehearsal"] = True
        results.add(**row)
        print(f"rehearsal: bert {config} built for {arch}: {row['tensor_core_kernels']}; timing needs a GPU",
              flush=True)
        return
    dev = tvm.cuda(0)
    module = _graph(lib, dev)
    module.set_input("input", samples[0]["input"])
    module.run()
    found = module.get_output(0).numpy()
    want = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, samples[0])[0]
    row["max_abs_diff"] = float(np.max(np.abs(found - want)))
    row["max_abs_ort"] = float(np.max(np.abs(want)))
    worker = TorchWorker(torch_python, _TORCH_BERT_WORKER)
    try:
        timers = {"tcutils": _sample(module, dev, 20),
                  "torch_fp16": lambda: worker.request(config["layers"], config["seq"], config["hidden"],
                                                       config["heads"], 20)}
        timings = interleave(timers, rounds)
    finally:
        worker.close()
    row.update(timings)
    row["torch_fp16_over_tcutils"] = ratio(timings["torch_fp16"], timings["tcutils"])
    results.add(**row)
    print(f"bert {config}: tvm-tcutils {timings['tcutils'].median_ms:.3f} ms, PyTorch fp16 "
          f"{timings['torch_fp16'].median_ms:.3f} ms (x{row['torch_fp16_over_tcutils'].value:.2f}); output "
          f"max |diff| {row['max_abs_diff']:.3g} of {row['max_abs_ort']:.3g}", flush=True)


def wait_for_file(path: Optional[str], timeout_s: float = 600.0) -> Callable[[], None]:
    """A function that waits until ``path`` exists (another process's end), so that timings run alone."""
    def _wait() -> None:
        if not path:
            return
        deadline = time.time() + timeout_s
        while not os.path.exists(path) and time.time() < deadline:
            time.sleep(0.5)
    return _wait


def summary(rows: List[dict]) -> Dict[str, object]:
    """Geometric means of the ratios (>1: the package is faster), for the docs' headline."""
    out: Dict[str, object] = {}
    for part, key in (("layers", "tvm_over_tcutils"), ("dense", "cublaslt_over_tcutils"),
                      ("dense", "cublaslt_over_mma"), ("dense", "cublaslt_over_wgmma")):
        values = [r[key].value for r in rows if r.get("part") == part and key in r]
        if values:
            out[f"{part}_geomean_{key}"] = float(np.exp(np.mean(np.log(values))))
    return out


def _ms(value: Optional[dict]) -> str:
    return f"{value['median_ms']:.3f}" if value and value.get("samples_ms") else "-"


def _ratio(value: Optional[dict]) -> str:
    return f"x{value['value']:.2f} [{value['low']:.2f}, {value['high']:.2f}]" if value else "-"


def _tune_model(row: dict) -> str:
    if row["model"].startswith("resnet50"):
        return f"ResNet-50 int8, batch {row.get('batch', 8)}" + (" (mma)" if row["model"] == "resnet50_mma" else "")
    kernel = {"dense_mma": " (mma)", "dense_wgmma": " (wgmma)"}.get(row["model"], "")
    return "int8 dense {} x {} x {}".format(*TUNE_DENSE) + kernel


def markdown(payload: dict) -> str:
    """The docs' tables (end to end, per layer, dense) from a :func:`~.results.Results` JSON of this check.

    Examples
    --------
    >>> t = {"median_ms": 1.0, "samples_ms": [1.0]}
    >>> r = {"value": 2.0, "low": 1.9, "high": 2.1}
    >>> doc = markdown({"rows": [{"part": "layers", "data": [7, 7, 8, 512], "kernel": [3, 3, 512, 512],
    ...                           "strides": [1, 1], "tvm": t, "tcutils": t, "tvm_over_tcutils": r, "gops": 1.0}]})
    >>> doc.splitlines()[2]
    '| (7, 7, 8, 512) x (3, 3, 512, 512) /1 | 1.000 | 1.000 | x2.00 [1.90, 2.10] | 1.0 |'
    """
    from .table import markdown as table

    rows = payload["rows"]
    parts = []
    e2e = [r for r in rows if r.get("part") == "resnet50" and "tcutils" in r]
    if e2e:
        parts.append(table(
            ["model", "tvm-tcutils ms", "with the mma kernels ms", "TVM 0.19 HWNC template ms", "TVM / tcutils",
             "PyTorch fp16 channels-last ms", "PyTorch / best tcutils", "max abs diff vs CPU",
             "mma vs WMMA build max abs diff", "top-1 agreement"],
            [[f"ResNet-50 int8, batch {r['batch']}", _ms(r.get("tcutils")),
              _ms(r.get("tcutils_mma")) if "tcutils_mma" in r else r.get("mma_error", "-"),
              _ms(r.get("tvm")) if "tvm" in r else r.get("tvm_error", "-"), _ratio(r.get("tvm_over_tcutils")),
              _ms(r.get("torch_fp16")), _ratio(r.get("torch_fp16_over_tcutils_best")),
              f"{r['max_abs_diff']:.3g} (of {r['max_abs_ref']:.3g})",
              f"{r['mma_vs_tcutils_max_abs_diff']:.3g}" if "mma_vs_tcutils_max_abs_diff" in r else "-",
              f"{r['top1_agree']:.2f}"] for r in e2e]))
    layer_rows = [r for r in rows if r.get("part") == "layers" and "tcutils" in r]
    if layer_rows:
        parts.append(table(
            ["layer (HWNC data x HWOI kernel / stride)", "TVM ms", "tvm-tcutils ms", "TVM / tcutils",
             "GOP"],
            [[f"{tuple(r['data'])} x {tuple(r['kernel'])} /{r['strides'][0]}", _ms(r.get("tvm")),
              _ms(r.get("tcutils")), _ratio(r.get("tvm_over_tcutils")), f"{r['gops']:.1f}"] for r in layer_rows]))
    dense_rows = [r for r in rows if r.get("part") == "dense" and "tcutils" in r]
    if dense_rows:
        def timed(r: dict, key: str) -> str:
            return f"{_ms(r.get(key))} ({r.get(key + '_tops', 0):.0f})" if r.get(key) else "-"

        def of_peak(r: dict, key: str) -> str:
            return f"{100 * r.get(key + '_tops', 0) / r['peak_tops']:.1f}" if r.get("peak_tops") and r.get(key) else "-"

        def exact(r: dict) -> str:
            return " / ".join({True: "yes", False: "NO"}.get(r.get(key), "-")
                              for key in ("exact", "mma_exact", "wgmma_exact"))

        parts.append(table(
            ["M x N x K", "WMMA ms (TOPS)", "mma ms (TOPS)", "wgmma ms (TOPS)", "cuBLASLt ms (TOPS)",
             "cuBLASLt / WMMA", "cuBLASLt / mma", "cuBLASLt / wgmma", "peak TOPS",
             "WMMA / mma / wgmma % of peak", "bit-exact WMMA / mma / wgmma"],
            [[f"{r['m']} x {r['n']} x {r['k']}", timed(r, "tcutils"), timed(r, "mma"), timed(r, "wgmma"),
              timed(r, "cublaslt"), _ratio(r.get("cublaslt_over_tcutils")), _ratio(r.get("cublaslt_over_mma")),
              _ratio(r.get("cublaslt_over_wgmma")), f"{r['peak_tops']:.0f}" if r.get("peak_tops") else "-",
              f"{of_peak(r, 'tcutils')} / {of_peak(r, 'mma')} / {of_peak(r, 'wgmma')}", exact(r)]
             for r in dense_rows]))
    bert_rows = [r for r in rows if r.get("part") == "bert" and "tcutils" in r]
    if bert_rows:
        parts.append(table(
            ["encoder (QDQ, plain relay.build)", "tensor-core kernels", "tvm-tcutils ms", "PyTorch fp16 ms",
             "PyTorch / tcutils", "max |diff| vs onnxruntime (of max |out|)"],
            [[f"{r['layers']} x {r['hidden']}, {r['heads']} heads, seq {r['seq']}",
              ", ".join(f"{op} x{count}" for op, count in r["tensor_core_kernels"]), _ms(r.get("tcutils")),
              _ms(r.get("torch_fp16")), _ratio(r.get("torch_fp16_over_tcutils")),
              f"{r['max_abs_diff']:.3g} ({r['max_abs_ort']:.3g})"] for r in bert_rows]))
    tune_rows = [r for r in rows if r.get("part") == "tune" and "tuned" in r]
    if tune_rows:
        parts.append(table(
            ["model (template)", "tasks tuned", "trials (s)", "untuned ms", "tuned ms", "untuned / tuned",
             "outputs max abs diff"],
            [[f"{_tune_model(r)} (`{r['template']}`)", f"{r['tasks_tuned']} of {r['tasks']}",
              f"{r['new_trials']} ({r['tune_s']:.0f})",
              _ms(r.get("untuned")), _ms(r.get("tuned")), _ratio(r.get("untuned_over_tuned")),
              f"{r['max_abs_diff']:.3g}"] for r in tune_rows]))
    speed_rows = [r for r in rows if r.get("part") == "int4_vs_int8" and "int4" in r]
    if speed_rows:
        parts.append(table(
            ["layer (HWNC data x HWOI kernel / stride)", "int4 ms", "int8 ms", "int8 / int4"],
            [[f"{tuple(r['data'])} x {tuple(r['kernel'])} /{r['strides'][0]}", _ms(r.get("int4")),
              _ms(r.get("int8")), _ratio(r.get("int8_over_int4"))] for r in speed_rows]))
    stem_rows = [r for r in rows if r.get("part") == "stem" and "nchw_fallback" in r]
    for r in stem_rows:
        names = {"nchw_fallback": "float32 NCHW, TVM's fallback config (what ResNet-50 runs)",
                 "nchw_best_random": f"float32 NCHW, best of {r['random_configs_tried']} random configs",
                 "nhwc_fallback": "float32 NHWC, TVM's fallback config",
                 "hwnc_int8_c16": "int8 HWNC on tensor cores, 3 channels padded to 16 (the package's template)"}
        base = r["nchw_fallback"]["median_ms"]
        parts.append(table(["stem convolution (8x3x224x224, 64 7x7 filters, stride 2)", "ms", "x faster"],
                           [[label, _ms(r.get(key)), f"x{base / r[key]['median_ms']:.0f}"]
                            for key, label in names.items() if key in r]))
    return "\n\n".join(parts)


#: int4 WMMA alone, outside TVM: one 8x8x32 s4 tile through nvcuda::wmma, compiled by CuPy's NVRTC for each
#: architecture given, against numpy. Tells a wrong int4 result of the GPU's toolchain apart from the package's.
_INT4_PROBE = r'''
import json, sys
import numpy as np, cupy as cp
CODE = r"""
#include <mma.h>
using namespace nvcuda;
extern "C" __global__ void s4(const int* a, const int* b, int* c) {
  wmma::fragment<wmma::matrix_a, 8, 8, 32, wmma::experimental::precision::s4, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 8, 8, 32, wmma::experimental::precision::s4, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 8, 8, 32, int> fc;
  wmma::fill_fragment(fc, 0);
  wmma::load_matrix_sync(fa, a, 32);
  wmma::load_matrix_sync(fb, b, 32);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 8, wmma::mem_row_major);
}
"""
rng = np.random.default_rng(0)
a = rng.integers(-8, 8, (8, 32)); b = rng.integers(-8, 8, (8, 32))
def pack(m):
    u = (m & 0xF).astype(np.uint32); out = np.zeros((m.shape[0], 4), np.uint32)
    for j in range(32):
        out[:, j // 8] |= u[:, j] << np.uint32(4 * (j % 8))
    return out.view(np.int32)
want = a @ b.T
result = {}
for arch in sys.argv[1:]:
    try:
        include = "-I" + __import__("os").environ.get("CUDA_PATH", "/usr/local/cuda") + "/include"
        kernel = cp.RawModule(code=CODE, options=("-arch=" + arch, "-std=c++17", include)).get_function("s4")
        c = cp.zeros((8, 8), cp.int32)
        kernel((1,), (32,), (cp.asarray(pack(a)), cp.asarray(pack(b)), c))
        got = cp.asnumpy(c)
        result[arch] = {"exact": bool((got == want).all()), "mismatches": int((got != want).sum())}
    except Exception as err:
        result[arch] = {"error": str(err)[:300]}
print(json.dumps(result))
'''


def int4_probe(results, python: str = "python3", archs: Sequence[str] = ("sm_90", "compute_80", "compute_75")) -> None:
    """One int4 WMMA tile outside TVM (CuPy, its own process) on this GPU, against numpy, per architecture."""
    if not gpu_present():
        results.add(part="int4_probe", rehearsal=True)
        print("rehearsal: the int4 WMMA probe needs a GPU (and CuPy)", flush=True)
        return
    proc = subprocess.run([python, "-c", _INT4_PROBE, *archs], capture_output=True, text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": proc.stderr[-500:]}
    results.add(part="int4_probe", **found)
    print(f"int4 WMMA probe (8x8x32 s4 tile via CuPy): {found}", flush=True)


#: The relay cases of the ``int4`` part: (op, dtype, batch, in-channels, out-channels); legalization pads 60
#: channels to 64 (conv2d: the package's, dense: TVM's) and 8 output channels stay 8.
INT4_CASES: Tuple[Tuple[str, str, int, int, int], ...] = (
    ("conv2d", "int4", 8, 64, 16), ("conv2d", "int4", 8, 60, 8), ("conv2d", "uint4", 8, 32, 32),
    ("dense", "int4", 16, 64, 32), ("dense", "int4", 16, 60, 32),
)


@contextlib.contextmanager
def _int4_allowed() -> Iterator[None]:
    """int4/uint4 layers qualify for every arch (the rules keep them off sm_90 and newer) inside the block."""
    from ..tensorcore import rules

    kept = rules.INT4_EMULATED_FROM_ARCH
    rules.INT4_EMULATED_FROM_ARCH = 10 ** 6
    try:
        yield
    finally:
        rules.INT4_EMULATED_FROM_ARCH = kept


def _int4_case(op: str, dtype: str, batch: int, cin: int, cout: int,
               rng) -> Tuple[tvm.IRModule, np.ndarray, np.ndarray]:
    """A relay module casting its 8-bit input (and constant weights) to ``dtype`` on the device; input; weight."""
    storage, (low, high) = ("int8", (-8, 7)) if dtype == "int4" else ("uint8", (0, 15))
    shape = (8, 8, batch, cin) if op == "conv2d" else (batch, cin)
    weight = rng.integers(low, high + 1, size=(3, 3, cout, cin) if op == "conv2d" else (cout, cin)).astype(storage)
    value = rng.integers(low, high + 1, size=shape).astype(storage)
    x = relay.var("x", shape=shape, dtype=storage)
    w = relay.cast(relay.const(weight), dtype)
    if op == "conv2d":
        y = relay.nn.conv2d(relay.cast(x, dtype), w, padding=1, kernel_size=(3, 3), data_layout="HWNC",
                            kernel_layout="HWOI", out_dtype="int32")
    else:
        y = relay.nn.dense(relay.cast(x, dtype), w, out_dtype="int32")
    return tvm.IRModule.from_expr(relay.Function([x], y)), value, weight


def _rewrite_casts(mod: tvm.IRModule, dtypes, rewrite: Callable[[relay.Expr, str], relay.Expr]) -> tvm.IRModule:
    """``mod`` with each ``cast(value, dtype)`` for ``dtype`` in ``dtypes`` replaced by ``rewrite(value, dtype)``."""

    class _Rewrite(relay.ExprMutator):
        def visit_call(self, call):
            new = super().visit_call(call)
            dtype = str(new.attrs.dtype) if getattr(new.op, "name", "") == "cast" else ""
            return rewrite(new.args[0], dtype) if dtype in dtypes else new

    return tvm.IRModule.from_expr(_Rewrite().visit(mod["main"]))


def _int4_as_8bit(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with each cast to int4/uint4 done in int32 and kept in int8/uint8: the CPU reference.

    TVM's CPU code generator refuses element-wise 4-bit accesses; a 4-bit cast
    truncates to the low nibble (sign-extended for int4), which is what this computes.
    """

    def as_8bit(value: relay.Expr, dtype: str) -> relay.Expr:
        value = relay.cast(value, "int32")
        if dtype == "int4":
            value = relay.right_shift(relay.left_shift(value, relay.const(28)), relay.const(28))
            return relay.cast(value, "int8")
        return relay.cast(relay.bitwise_and(value, relay.const(15)), "uint8")

    return _rewrite_casts(mod, ("int4", "uint4"), as_8bit)


#: The value range of each narrow integer type a prepared model casts to.
_INTEGER_RANGE: Dict[str, Tuple[int, int]] = {"int8": (-128, 127), "uint8": (0, 255), "int4": (-8, 7), "uint4": (0, 15)}


def _saturating_casts(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` with every cast to a narrow integer type preceded by a ``clip`` to that type's range.

    A prepared model casts float activations to int8/int4 as they are; with integer weights a 50-layer
    network grows them past that range, where a float-to-integer cast is undefined (the GPU saturates, LLVM's
    CPU code does not), so a GPU-vs-CPU comparison of the model as prepared compares two undefined results.
    Clipped, both devices compute the same function and must agree.
    """
    return _rewrite_casts(mod, _INTEGER_RANGE, lambda value, dtype: relay.cast(
        relay.clip(value, *_INTEGER_RANGE[dtype]), dtype))


def _run_graph(lib, dev, inputs: Dict[str, np.ndarray]) -> np.ndarray:
    module = _graph(lib, dev)
    module.set_input(**inputs)
    module.run()
    return module.get_output(0).numpy()


def int4(results, arch: str, batch: int = 8, rounds: int = 5) -> None:
    """int4 on the GPU: relay layers with and without the package's 4-bit access rewrite, ResNet-50, int4 vs int8."""
    from ..registry import overriding_func, replaced_func
    from ..tensorcore import strategy as tc

    target = f"cuda -arch={arch}"
    present = gpu_present()
    dev = tvm.cuda(0) if present else None
    rng = np.random.default_rng(0)
    tvm_codegen = replaced_func("target.build.cuda")
    with _int4_allowed():
        for case in INT4_CASES:
            mod, value, _ = _int4_case(*case, rng)
            with tc.pad_limit(0.5):
                want = _run_graph(_build(_int4_as_8bit(mod), None, "llvm"), tvm.cpu(), {"x": value})
                libs = {"fixed": _build(mod, None, target)}
                if tvm_codegen is not None:
                    with overriding_func("target.build.cuda", tvm_codegen):
                        libs["unfixed"] = _build(mod, None, target)
            row: Dict[str, object] = {"part": "int4", "case": list(case), "elements": int(want.size)}
            kernels = cuda.sass(cuda.module_cubin(libs["fixed"]))
            row["mma"] = sorted({m for code in kernels.values() for m in re.findall(r"IMMA\.\w+\.\w+\.\w+", code)})
            if not present:
                results.add(rehearsal=True, **row)
                continue
            for name, lib in libs.items():
                row[f"{name}_mismatches"] = int((_run_graph(lib, dev, {"x": value}) != want).sum())
            results.add(**row)
            print(f"int4 {case}: mismatches of {row['elements']} with the rewrite {row['fixed_mismatches']}, "
                  f"without {row.get('unfixed_mismatches')}; {row['mma']}", flush=True)

        prepared, params, skipped, x = _resnet50_logits(batch, "int4", target)
        prepared = _saturating_casts(prepared)
        row = {"part": "int4", "case": "resnet-50", "batch": batch, "skipped_layers": len(skipped),
               "casts": "saturating"}
        # Each step says when it starts: one run died here with SIGSEGV, and the log is what came back.
        print("int4 ResNet-50: building for the GPU", flush=True)
        lib = _build(prepared, params, target)
        print("int4 ResNet-50: building and running the CPU reference", flush=True)
        want = _run_graph(_build(_int4_as_8bit(prepared), params, "llvm"), tvm.cpu(), {"data": x})
        row["max_abs_ref"] = float(np.max(np.abs(want)))
        if present:
            print("int4 ResNet-50: running on the GPU", flush=True)
            got = _run_graph(lib, dev, {"data": x})
            row.update(max_abs_diff=float(np.max(np.abs(got - want))), mismatches=int((got != want).sum()),
                       elements=int(want.size), top1_agree=float(np.mean(got.argmax(1) == want.argmax(1))))
            print(f"ResNet-50 int4 GPU vs CPU: max |diff| {row['max_abs_diff']:.3g} of {row['max_abs_ref']:.3g}",
                  flush=True)
        else:
            row["rehearsal"] = True
        results.add(**row)


_INT4_PROBE_VARIANTS = r'''
import json, sys
import numpy as np, cupy as cp
CODE = r"""
#include <mma.h>
using namespace nvcuda;
// K = 32 * ksteps; a: 8 x K row-major, b: 8 x K (col-major B), nibbles packed eight to an int.
extern "C" __global__ void s4(const int* a, const int* b, int* c, int ksteps, int from_shared) {
  __shared__ int sa[8 * 16], sb[8 * 16];
  wmma::fragment<wmma::matrix_a, 8, 8, 32, wmma::experimental::precision::s4, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 8, 8, 32, wmma::experimental::precision::s4, wmma::col_major> fb;
  wmma::fragment<wmma::accumulator, 8, 8, 32, int> fc;
  wmma::fill_fragment(fc, 0);
  for (int i = threadIdx.x; i < 8 * 4 * ksteps; i += 32) { sa[i] = a[i]; sb[i] = b[i]; }
  __syncthreads();
  for (int k = 0; k < ksteps; ++k) {
    const int* pa = from_shared ? sa : a;
    const int* pb = from_shared ? sb : b;
    wmma::load_matrix_sync(fa, pa + k * 4, 32 * ksteps);
    wmma::load_matrix_sync(fb, pb + k * 4, 32 * ksteps);
    wmma::mma_sync(fc, fa, fb, fc);
  }
  wmma::store_matrix_sync(c, fc, 8, wmma::mem_row_major);
}
"""
def pack(m):
    u = (m & 0xF).astype(np.uint32); out = np.zeros((m.shape[0], m.shape[1] // 8), np.uint32)
    for j in range(m.shape[1]):
        out[:, j // 8] |= u[:, j] << np.uint32(4 * (j % 8))
    return out.view(np.int32)
result = {}
import os
include = "-I" + os.environ.get("CUDA_PATH", "/usr/local/cuda") + "/include"
for arch in sys.argv[1:]:
    kernel = cp.RawModule(code=CODE, options=("-arch=" + arch, "-std=c++17", include)).get_function("s4")
    for ksteps in (1, 2, 4):
        for shared in (0, 1):
            rng = np.random.default_rng(ksteps)
            a = rng.integers(-8, 8, (8, 32 * ksteps)); b = rng.integers(-8, 8, (8, 32 * ksteps))
            c = cp.zeros((8, 8), cp.int32)
            kernel((1,), (32,), (cp.asarray(pack(a)), cp.asarray(pack(b)), c, np.int32(ksteps), np.int32(shared)))
            got = cp.asnumpy(c)
            result[f"{arch} k={32 * ksteps} {'shared' if shared else 'global'}"] = int((got != a @ b.T).sum())
print(json.dumps(result))
'''


def int4_diag(results, arch: str, python: str = "python3") -> None:
    """Where int4 tensor-core layers go wrong on this GPU: compilers, PTX JIT, WMMA probes; arrays saved.

    The relay int4 dense and conv2d of :data:`INT4_CASES` are built with NVRTC for ``arch`` (the
    package's default), nvcc for ``arch``, and nvcc to compute_80 PTX that the driver compiles;
    each output is compared with the CPU build and saved with the inputs to ``$OUT/int4_diag.npz``
    for offline analysis. Then one s4 WMMA tile chain outside TVM (CuPy) with K = 32-128, from
    global and from shared memory.
    """
    from ..registry import overriding_func

    target = f"cuda -arch={arch}"
    present = gpu_present()
    compilers: Dict[str, Optional[Callable]] = {f"nvrtc_{arch}": None}
    if cuda.tool("nvcc"):
        # tvm_callback_cuda_compile's convention, (code, target) -> bytes; PTX is loaded through the driver's JIT.
        compilers[f"nvcc_{arch}"] = lambda code, target: cuda.nvcc_compile(code, arch, "cubin")
        compilers["ptx_compute_80"] = lambda code, target: cuda.nvcc_compile(code, "compute_80", "ptx")
    saved: Dict[str, np.ndarray] = {}
    rng = np.random.default_rng(0)
    with _int4_allowed():
        for case in (INT4_CASES[3], INT4_CASES[0]):
            mod, value, weight = _int4_case(*case, rng)
            key = case[0]
            saved[f"{key}_x"], saved[f"{key}_w"] = value, weight
            saved[f"{key}_want"] = _run_graph(_build(_int4_as_8bit(mod), None, "llvm"), tvm.cpu(), {"x": value})
            row: Dict[str, object] = {"part": "int4_diag", "case": list(case)}
            for name, compile_fn in compilers.items():
                scope = overriding_func("tvm_callback_cuda_compile", compile_fn) if compile_fn \
                    else contextlib.nullcontext()
                try:
                    with scope:
                        lib = _build(mod, None, target)
                    if present:
                        got = _run_graph(lib, tvm.cuda(0), {"x": value})
                        saved[f"{key}_{name}"] = got
                        row[name] = int((got != saved[f"{key}_want"]).sum())
                    else:
                        row[name] = "built"
                except Exception as err:  # noqa: BLE001  (a diagnosis reports every variant)
                    row[name] = f"error: {str(err).strip().splitlines()[-1][:200]}"
            results.add(**row)
            print(f"int4 diag {case}: {row}", flush=True)
    out_dir = os.environ.get("OUT", "gpu-out")
    os.makedirs(out_dir, exist_ok=True)
    np.savez(os.path.join(out_dir, "int4_diag.npz"), **saved)
    if not present:
        results.add(part="int4_diag_probe", rehearsal=True)
        return
    proc = subprocess.run([python, "-c", _INT4_PROBE_VARIANTS, arch, "compute_80"], capture_output=True,
                          text=True, timeout=300)
    lines = proc.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if proc.returncode == 0 and lines else {"error": proc.stderr[-800:]}
    results.add(part="int4_diag_probe", **found)
    print(f"int4 WMMA probe variants (mismatches of 64): {found}", flush=True)


def int4_speed(results, arch: str, batch: int = 8, rounds: int = 5) -> None:
    """The package's template on each ResNet-50 layer in int4 and in int8 (fallback configs), in turns."""
    from . import tensorcore as bench
    from ..tensorcore.topi import conv2d_hwnc

    target = tvm.target.Target(f"cuda -arch={arch}")
    dev = tvm.cuda(0) if gpu_present() else None
    for workload in bench.layers("int8", batch, str(target)):
        data, kernel = workload[1][1], workload[2][1]
        row: Dict[str, object] = {"part": "int4_vs_int8", "data": list(data), "kernel": list(kernel),
                                  "strides": list(workload[3])}
        timers = {}
        for dtype in ("int4", "int8"):
            args = (("TENSOR", data, dtype), ("TENSOR", kernel, dtype)) + tuple(workload[3:])
            func, tensors = _task_function(autotvm.task.create(conv2d_hwnc.TASK, args, target), target)
            if dev is not None:
                arrays = [tvm.nd.empty([int(v) for v in t.shape], t.dtype, dev) for t in tensors]
                timers[dtype] = _kernel_sample(func, arrays, dev)
        if dev is None:
            results.add(rehearsal=True, **row)
            continue
        timings = interleave(timers, rounds)
        row.update(timings)
        row["int8_over_int4"] = ratio(timings["int8"], timings["int4"])
        results.add(**row)
        print(f"layer {tuple(data)} x {tuple(kernel)}: int4 {timings['int4'].median_ms:.4f} ms, "
              f"int8 {timings['int8'].median_ms:.4f} ms", flush=True)


#: ResNet-50's stem at batch 8 (NCHW data, OIHW kernel, stride, padding): 38 of the 40 ms of the int8 model
#: on an H200, on TVM's fallback configuration of its direct CUDA convolution.
STEM = ((8, 3, 224, 224), (64, 3, 7, 7), (2, 2), (3, 3, 3, 3))


def stem(results, arch: str, rounds: int = 5, random_configs: int = 24, budget_s: float = 40.0) -> None:
    """The stem convolution alone: TVM's NCHW and NHWC fallbacks, the best of random NCHW configs, int8 HWNC.

    Says what the end-to-end time's one slow kernel could be: tuned, in another layout, or on the
    tensor cores with its 3 input channels padded to 16 (the int8 template's smallest).
    """
    from ..tensorcore.topi import conv2d_hwnc

    target = tvm.target.Target(f"cuda -arch={arch}")
    (n, c, h, w), (o, _, kh, kw), strides, padding = STEM
    f32 = "float32"
    tasks = {
        "nchw_fallback": autotvm.task.create("conv2d_nchw.cuda", (("TENSOR", (n, c, h, w), f32),
                                             ("TENSOR", (o, c, kh, kw), f32), strides, padding, (1, 1), f32), target),
        "nhwc_fallback": autotvm.task.create("conv2d_nhwc.gpu", (("TENSOR", (n, h, w, c), f32),
                                             ("TENSOR", (kh, kw, c, o), f32), strides, padding, (1, 1), f32), target),
        "hwnc_int8_c16": autotvm.task.create(conv2d_hwnc.TASK, (("TENSOR", (h, w, n, 16), "int8"),
                                             ("TENSOR", (kh, kw, o, 16), "int8"), strides, padding, (1, 1), "int32"),
                                             target),
    }
    funcs = {name: _task_function(task, target) for name, task in tasks.items()}
    present = gpu_present()
    dev = tvm.cuda(0) if present else None

    def _timer(func, tensors):
        arrays = [tvm.nd.empty([int(v) for v in t.shape], t.dtype, dev) for t in tensors]
        return _kernel_sample(func, arrays, dev, number=10)

    space = tasks["nchw_fallback"].config_space
    picks = np.random.default_rng(0).choice(len(space), min(random_configs, len(space)), replace=False)
    best: Optional[Tuple[float, int]] = None
    start = time.time()
    tried = 0
    for index in picks:
        if time.time() - start > budget_s:
            break
        try:
            with target:
                sched, tensors = tasks["nchw_fallback"].instantiate(space.get(int(index)))
                func = tvm.build(sched, tensors, target)
            tried += 1
            if present:
                ms = min(_timer(func, tensors)() for _ in range(2))
                if best is None or ms < best[0]:
                    best = (ms, int(index))
        except Exception:  # noqa: BLE001  (a config that does not build or launch is skipped, as AutoTVM does)
            continue
    row: Dict[str, object] = {"part": "stem", "data": list(STEM[0]), "kernel": list(STEM[1]),
                              "random_configs_tried": tried}
    if not present:
        results.add(rehearsal=True, **row)
        print(f"rehearsal: stem built 3 ways and {tried} random NCHW configs; timing needs a GPU", flush=True)
        return
    if best is not None:
        with target:
            sched, tensors = tasks["nchw_fallback"].instantiate(space.get(best[1]))
            funcs["nchw_best_random"] = (tvm.build(sched, tensors, target), tensors)
        row["best_random_config"] = str(space.get(best[1]))
    timings = interleave({name: _timer(func, tensors) for name, (func, tensors) in funcs.items()}, rounds)
    row.update(timings)
    results.add(**row)
    print("stem: " + ", ".join(f"{k} {v.median_ms:.3f} ms" for k, v in timings.items() if v.samples_ms), flush=True)


def int4_cast(results, arch: str) -> None:
    """int8 -> int4 -> int8 casts on the GPU (TVM's own kernels): do int4 tensors written by TVM round-trip?

    Tells whether a wrong int4 result comes from the tensor-core kernel or from the int4 tensors around it.
    """
    target = f"cuda -arch={arch}"
    for shape in ((8, 8, 8, 64), (1, 3)):
        x = relay.var("x", shape=shape, dtype="int8")
        mod = tvm.IRModule.from_expr(relay.Function([x], relay.cast(relay.cast(x, "int4"), "int8")))
        lib = _build(mod, None, target)
        row: Dict[str, object] = {"part": "int4_cast", "shape": list(shape)}
        if not gpu_present():
            results.add(rehearsal=True, **row)
            continue
        values = np.random.default_rng(0).integers(-8, 8, size=shape).astype("int8")
        module = _graph(lib, tvm.cuda(0))
        module.set_input("x", values)
        module.run()
        got = module.get_output(0).numpy()
        row["mismatches"] = int((got != values).sum())
        row["elements"] = int(values.size)
        results.add(**row)
        print(f"int4 round trip {shape} on the GPU: {row['mismatches']} of {row['elements']} elements differ",
              flush=True)


#: The ``tune`` part's dense: the 4096^3 GEMM of the ``dense`` table, where the untuned package reached 10.8 %
#: of an H200's peak.
TUNE_DENSE = (4096, 4096, 4096)


def _dense_module(m: int, n: int, k: int) -> tvm.IRModule:
    """``nn.dense`` of two int8 inputs (int32 out), both graph inputs (no weight re-layout to time)."""
    x = relay.var("x", shape=(m, k), dtype="int8")
    w = relay.var("w", shape=(n, k), dtype="int8")
    return tvm.IRModule.from_expr(relay.Function([x, w], relay.nn.dense(x, w, out_dtype="int32")))


def _best_per_task(log: str, template: str) -> List[dict]:
    """Each tuned task of ``template`` in ``log``: its shapes, trials, and the best measured time (ms)."""
    from ..tuning import checked_records

    tasks: Dict[str, dict] = {}
    for inp, res in checked_records(log):
        if inp.task.name != template:
            continue
        entry = tasks.setdefault(str(inp.task.args), {
            "args": [list(a[1]) if isinstance(a, tuple) and a and a[0] == "TENSOR" else a for a in inp.task.args],
            "trials": 0, "valid": 0, "best_ms": None})
        entry["trials"] += 1
        if res.error_no == 0:
            entry["valid"] += 1
            ms = float(np.mean(res.costs)) * 1e3
            entry["best_ms"] = ms if entry["best_ms"] is None else min(entry["best_ms"], ms)
    return list(tasks.values())


def tune(results, arch: str, model: str = "resnet50", batch: int = 8, rounds: int = 5, budget_s: float = 240.0,
         trials: Optional[int] = None, log_dir: Optional[str] = None, wait: Callable[[], None] = lambda: None) -> None:
    """AutoTVM tuning on this GPU, as a user runs it: :func:`tvm_tcutils.tuning.tune` (XGBTuner, the
    package's local runner) of ``model``'s tensor-core tasks for ``budget_s``: ``"resnet50"`` (the int8
    ResNet-50's convolutions, ``trials`` per task, default 32; its float layers keep their fallback configs),
    ``"dense"`` (the int8 :data:`TUNE_DENSE` GEMM on the WMMA template, default 64 trials), ``"dense_mma"``
    (the same GEMM on the sm_80+ mma template, which the part lets ``relay.build`` take for ``arch`` while it
    runs: see :data:`~tvm_tcutils.tensorcore.strategy.MMA_VERIFIED_ARCHS`) or ``"dense_wgmma"`` (the sm_90
    warp-group template, likewise: ``WGMMA_VERIFIED_ARCHS``) or ``"resnet50_mma"`` (the int8 ResNet-50's
    convolutions on the implicit-GEMM mma template, the gate open likewise); the dense outputs are checked against
    numpy. Then the model is built untuned and with
    the log, run on one input (the tuned kernels compute the same integers: the outputs must be equal) and
    timed in turns. The log (``tune_<model>.log``) stays in ``log_dir``. Without a GPU: the builds, the tasks,
    and whether the local runner's server has the CUDA device API (the rehearsal)."""
    if model not in TUNE_MODELS:
        raise ValueError(f"model must be one of {', '.join(TUNE_MODELS)}, got {model!r}")
    gate = {"dense_mma": "MMA_VERIFIED_ARCHS", "dense_wgmma": "WGMMA_VERIFIED_ARCHS",
            "resnet50_mma": "MMA_VERIFIED_ARCHS"}.get(model)
    if gate is None:
        return _tune(results, arch, model, batch, rounds, budget_s, trials, log_dir, wait)
    from ..tensorcore import strategy
    from ..tensorcore.topi.mma_gemm import arch_number

    verified = getattr(strategy, gate)
    setattr(strategy, gate, verified | {f"sm_{arch_number(arch)}"})
    try:
        return _tune(results, arch, model, batch, rounds, budget_s, trials, log_dir, wait)
    finally:
        setattr(strategy, gate, verified)


#: What :func:`tune` tunes.
TUNE_MODELS = ("resnet50", "resnet50_mma", "dense", "dense_mma", "dense_wgmma")


def _tune(results, arch: str, model: str, batch: int, rounds: int, budget_s: float, trials: Optional[int],
          log_dir: Optional[str], wait: Callable[[], None]) -> None:
    from .. import tuning
    from ..tensorcore.topi import conv2d_hwnc, mma_conv2d, mma_gemm, wgmma_gemm
    from ..tensorcore.topi import dense as tc_dense

    # What the tuning needs beyond TVM, before a minute of building: XGBTuner's model and the local runner's
    # RPC tracker (the GPU machine had neither, and the first try failed only after the builds).
    import tornado  # noqa: F401
    import xgboost  # noqa: F401

    target = f"cuda -arch={arch}"
    log_dir = log_dir or tempfile.mkdtemp(prefix="tcutils-tune-")
    os.makedirs(log_dir, exist_ok=True)
    present = gpu_present()
    if model.startswith("resnet50"):
        template, n_trials = (conv2d_hwnc.TASK if model == "resnet50" else mma_conv2d.TASK), trials or 32
        mod, params, _, x = _resnet50_logits(batch, "int8", target)
        inputs = {"data": x}
    else:
        template = {"dense": tc_dense.TASK, "dense_mma": mma_gemm.TASK, "dense_wgmma": wgmma_gemm.TASK}[model]
        n_trials = trials or 64
        m, n, k = TUNE_DENSE
        mod, params = _dense_module(m, n, k), {}
        rng = np.random.default_rng(0)
        inputs = {"x": rng.integers(-128, 128, (m, k)).astype("int8"),
                  "w": rng.integers(-128, 128, (n, k)).astype("int8")}
    log = os.path.join(log_dir, f"tune_{model}.log")
    row: Dict[str, object] = {"part": "tune", "model": model, "template": template, "target": target,
                              "trials_per_task": n_trials, "budget_s": budget_s, "log": os.path.basename(log)}
    if model.startswith("resnet50"):
        row["batch"] = batch
    start = time.time()
    untuned = _build(mod, params, target)
    row["build_s"] = round(time.time() - start, 1)
    if not present:
        row["tasks"] = sum(task.name == template for task in tuning.extract_tasks(mod, params, target))
        row["server_has_cuda"] = _runner_server_has_cuda()
        row["rehearsal"] = True
        results.add(**row)
        print(f"rehearsal: tune {model}: {row['tasks']} tasks of {template}, built untuned; the local runner's "
              f"server has the CUDA device API: {row['server_has_cuda']}; tuning needs a GPU", flush=True)
        return
    wait()
    start = time.time()
    summary = tuning.tune(mod, params, target, n_trials, log, progress=False, measure_number=20,
                          time_budget_s=budget_s, templates=[template])
    row["tune_s"] = round(time.time() - start, 1)
    row["tasks"] = sum(task_name == template for task_name, _ in summary)
    row["tasks_tuned"] = sum(1 for task_name, count in summary if task_name == template and count)
    row["new_trials"] = sum(count for _, count in summary)
    row["per_task"] = _best_per_task(log, template)
    start = time.time()
    with autotvm.apply_history_best(log):
        tuned = _build(mod, params, target)
    row["tuned_build_s"] = round(time.time() - start, 1)
    dev = tvm.cuda(0)
    modules = {"untuned": _graph(untuned, dev), "tuned": _graph(tuned, dev)}
    outputs = {}
    for key, module in modules.items():
        for input_name, value in inputs.items():
            module.set_input(input_name, value)
        module.run()
        outputs[key] = module.get_output(0).numpy().astype(np.float64)
    row["max_abs_diff"] = float(np.max(np.abs(outputs["tuned"] - outputs["untuned"])))
    if not model.startswith("resnet50"):
        want = inputs["x"].astype(np.int64) @ inputs["w"].astype(np.int64).T
        row["exact"] = all(bool(np.array_equal(out, want)) for out in outputs.values())
    timings = interleave({key: _sample(module, dev, 20) for key, module in modules.items()}, rounds)
    row.update(timings)
    row["untuned_over_tuned"] = ratio(timings["untuned"], timings["tuned"])
    if not model.startswith("resnet50"):
        for key, timing in timings.items():
            row[f"{key}_tops"] = 2 * m * n * k / (timing.median_ms * 1e-3) / 1e12
    results.add(**row)
    print(f"tune {model}: {row['new_trials']} trials over {row['tasks_tuned']} of {row['tasks']} tasks in "
          f"{row['tune_s']} s; untuned {timings['untuned'].median_ms:.3f} ms, tuned "
          f"{timings['tuned'].median_ms:.3f} ms (x{row['untuned_over_tuned'].value:.2f}); outputs differ by "
          f"{row['max_abs_diff']:.3g}", flush=True)


def _runner_server_has_cuda() -> bool:
    """Whether the package's AutoTVM local runner serves from a process with the CUDA device API."""
    from tvm.autotvm.measure.measure_methods import request_remote

    from .._tvm import host_target
    from ..dotprod.quantize import quantize_int8
    from ..models import load_model
    from ..tuning import PackageLocalRunner, extract_tasks

    runner = PackageLocalRunner(number=1)
    # Any task will do (a small CPU one: set_task checks that the server has the task's device).
    task = extract_tasks(quantize_int8(*load_model("mlp")), {}, host_target())[0]
    alive = runner.set_task(task)  # noqa: F841  (keeps the tracker and the server up)
    remote = request_remote(runner.key, runner.host, runner.port)
    try:
        return remote.get_function("device_api.cuda") is not None
    except AttributeError:
        return False
