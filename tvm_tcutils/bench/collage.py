"""Collage's benchmark toolchains and synthetic costs: search speed without measuring.

``mock_toolchains`` and ``synthetic_costs`` give the encoder of
:func:`tvm_tcutils.bench.models.encoder` three toolchains with different
winners per operator kind; ``roofline_costs`` prices a real model's candidates
for the real toolchains from FLOPs and boundary bytes.

Examples
--------
>>> [tc.name for tc in mock_toolchains()]
['tvm', 'ortlike', 'blaslike']
"""
from __future__ import annotations

from tvm.relay import dataflow_pattern as dfp

from ..collage import MockCostEstimator, Toolchain
from ..collage.subgraph import IndexedGraph
from ..collage.toolchains import TVM


def mock_toolchains():
    """Three toolchains: TVM, an ORT-like graph toolchain claiming every op, a BLAS-like library."""
    ort_patterns = tuple(
        (f"ortlike.{name}", dfp.is_op(name)(*[dfp.wildcard() for _ in range(arity)]))
        for name, arity in [
            ("nn.dense", 2), ("nn.bias_add", 2), ("nn.batch_matmul", 2), ("nn.softmax", 1), ("reshape", 1),
            ("transpose", 1), ("add", 2), ("subtract", 2), ("multiply", 2), ("divide", 2), ("mean", 1),
            ("sqrt", 1), ("erf", 1), ("power", 2),
        ]
    )
    blas_patterns = (
        ("blaslike.dense_bias", dfp.is_op("nn.bias_add")(dfp.is_op("nn.dense")(dfp.wildcard(), dfp.wildcard()),
                                                        dfp.wildcard())),
        ("blaslike.dense", dfp.is_op("nn.dense")(dfp.wildcard(), dfp.wildcard())),
        ("blaslike.batch_matmul", dfp.is_op("nn.batch_matmul")(dfp.wildcard(), dfp.wildcard())),
    )
    ort = Toolchain("ortlike", "ortlike", patterns=ort_patterns, combine=True, max_depth=4)
    blas = Toolchain("blaslike", "blaslike", patterns=blas_patterns, max_depth=2)
    return [TVM, ort, blas]


def synthetic_costs():
    """Per-op costs (ms) with different winners per op kind, and a per-partition overhead.

    Examples
    --------
    >>> sorted(synthetic_costs().costs)
    ['blaslike', 'ortlike', 'tvm']
    """
    tvm_costs = {"nn.dense": 0.10, "nn.batch_matmul": 0.12, "nn.softmax": 0.08, "erf": 0.06, "*": 0.01}
    ort_costs = {"nn.dense": 0.12, "nn.batch_matmul": 0.04, "nn.softmax": 0.012, "erf": 0.006, "*": 0.012}
    blas_costs = {"nn.dense": 0.09, "nn.batch_matmul": 0.05, "nn.bias_add": 0.01}
    return MockCostEstimator(
        {"tvm": tvm_costs, "ortlike": ort_costs, "blaslike": blas_costs},
        overhead={"tvm": 0.002, "ortlike": 0.02, "blaslike": 0.005},
    )



#: Roofline-style synthetic costs per toolchain: call overhead (ms), GFLOP/s per op kind, GB/s across
#: the candidate's boundary. Which toolchain wins differs per op kind, as measured here.
_ROOFLINE = {
    "tvm": (0.004, {"nn.conv2d": 40.0, "nn.dense": 60.0, "*": 8.0}, 12.0),
    "ort": (0.03, {"nn.conv2d": 55.0, "nn.dense": 45.0, "nn.avg_pool2d": 2.0, "nn.max_pool2d": 2.0,
                   "concatenate": 2.0, "*": 6.0}, 16.0),
    "blas": (0.01, {"nn.dense": 70.0, "*": 1.0}, 10.0),
}


def roofline_costs(graph: IndexedGraph, cands, noise: float = 0.15) -> list:
    """Synthetic cost (ms) of each candidate: overhead + FLOPs / rate + boundary bytes / bandwidth.

    Each cost is scaled by a seeded factor within +-``noise``, as measured or predicted costs
    scatter: without it one big region wins outright and the search has nothing to decide.

    Examples
    --------
    >>> from tvm_tcutils.bench.models import load
    >>> from tvm_tcutils.collage.candidates import enumerate_candidates
    >>> from tvm_tcutils.collage.driver import prepare
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> graph = IndexedGraph(prepare(*load("mlp"))["main"])
    >>> cands = enumerate_candidates(graph, resolve("tvm"))
    >>> all(c >= 0 for c in roofline_costs(graph, cands))
    True
    """
    import random

    from ..collage.cost.learned import _NodeSizes
    from ..collage.subgraph import bits

    rng = random.Random(0)
    sizes = _NodeSizes.of(graph)
    costs = []
    for cand in cands:
        if cand.host:
            costs.append(0.0)
            continue
        overhead, rates, bandwidth = _ROOFLINE[cand.toolchain]
        compute = sum(sizes.flops[i] / rates.get(graph.nodes[i].op_name, rates["*"]) for i in bits(cand.mask))
        moved = sum(sizes.bits[i] for i in graph.inputs_of(cand.mask) + graph.outputs_of(cand.mask)) / 8
        costs.append((overhead + compute * 1e-6 + moved / bandwidth * 1e-6) * rng.uniform(1 - noise, 1 + noise))
    return costs




# ---------------------------------------------------------------------------
# Search speed (scripts/bench_collage_search.py)
# ---------------------------------------------------------------------------
def layers_for(min_ops: int, layers: int) -> int:
    """Encoder layers for at least ``min_ops`` operators, and at least ``layers``.

    Examples
    --------
    >>> layers_for(0, 3)
    3
    """
    from .models import encoder, operator_count

    per_layer = operator_count(encoder(1))
    return max(layers, -(-min_ops // per_layer))


def encoder_search(layers: int, repeat: int) -> dict:
    """Enumerate and search an encoder's candidates with synthetic costs: counts, times, costs.

    Examples
    --------
    >>> row = encoder_search(1, 1)
    >>> row["layers"], row["cost_ratio"] <= 1.0 + 1e-9
    (1, True)
    """
    from ..collage import search as search_mod
    from ..collage.candidates import enumerate_candidates
    from ..collage.cost.base import CostRequest
    from ..measure import time_callable
    from .competitors import timed_once
    from .models import encoder

    graph = IndexedGraph(encoder(layers)["main"])
    toolchains = mock_toolchains()
    cands, t_enum = timed_once(lambda: enumerate_candidates(graph, toolchains))
    by_name = {tc.name: tc for tc in toolchains}
    estimates = synthetic_costs().estimate([CostRequest(graph, c, by_name[c.toolchain]) for c in cands])
    costs = [0.0 if c.host else x for c, x in zip(cands, estimates)]
    result = search_mod.search(graph, cands, costs)
    searching = time_callable(lambda: search_mod.search(graph, cands, costs), repeat=repeat, warmup=0)
    tvm_only = search_mod.search(graph, [c for c in cands if c.toolchain == "tvm"],
                                 [x for c, x in zip(cands, costs) if c.toolchain == "tvm"])
    return {
        "layers": layers, "nodes": len(graph), "operators": sum(1 for n in graph.nodes if n.kind == "call"),
        "candidates": len(cands),
        "candidates_per_toolchain": {tc.name: sum(1 for c in cands if c.toolchain == tc.name) for tc in toolchains},
        "enumerate_s": t_enum, "search": searching, "search_s": searching.median_ms / 1e3,
        "states": result.states, "partitions": len(result.non_host()),
        "cost_ms": result.cost, "tvm_alone_cost_ms": tvm_only.cost, "cost_ratio": result.cost / tvm_only.cost,
    }


def model_search(name: str) -> dict:
    """Search a real model's candidates (tvm, ort, blas) with roofline costs, under each A* bound.

    Per bound: search seconds, states, cost and the bound at the start as a share of the optimum.
    """
    from ..collage import search as search_mod
    from ..collage.candidates import enumerate_candidates
    from ..collage.driver import prepare
    from ..collage.toolchains import resolve
    from .competitors import timed_once
    from .models import load

    graph = IndexedGraph(prepare(*load(name))["main"])
    cands, t_enum = timed_once(lambda: enumerate_candidates(graph, resolve("tvm,ort,blas")))
    costs = roofline_costs(graph, cands)
    relaxation = search_mod._relaxation_shares
    bounds = {}
    for label, patched in [("linear relaxation", relaxation), ("ascent only", lambda *args: None)]:
        search_mod._relaxation_shares = patched
        try:
            result, seconds = timed_once(lambda: search_mod.search(graph, cands, costs))
        finally:
            search_mod._relaxation_shares = relaxation
        bounds[label] = {"search_s": seconds, "states": result.states, "cost_ms": result.cost,
                         "bound_share": result.bound / result.cost}
    same = abs(bounds["linear relaxation"]["cost_ms"] - bounds["ascent only"]["cost_ms"]) \
        <= 1e-9 * bounds["ascent only"]["cost_ms"]
    return {"model": name, "nodes": len(graph), "candidates": len(cands), "enumerate_s": t_enum,
            "bounds": bounds, "same_optimum": same}


HOOK = "example_target_hook"


def _peer_cost(mod, toolchain: str) -> float:
    """Per-partition overhead plus per-op costs (ms), on every op call of a candidate module."""
    from tvm import relay

    from .._tvm import tvm

    ops = []
    for func in mod.functions.values():
        relay.analysis.post_order_visit(
            func,
            lambda e: ops.append(e.op.name) if isinstance(e, relay.Call) and isinstance(e.op, tvm.ir.Op) else None)
    table = synthetic_costs().costs["tvm" if toolchain == "tvm" else "ortlike"]
    overhead = 0.002 if toolchain == "tvm" else 0.02
    return overhead + sum(table.get(op, table["*"]) for op in ops)


def peer_search(layers: int, depth: int = 3) -> dict:
    """Ours and TVM 0.19's ``CollagePartition`` on one encoder with one cost function: times and totals."""
    import dataclasses
    import os
    import re
    import tempfile

    from tvm import relay

    from .. import registry
    from .._tvm import tvm
    from ..collage import CustomCostEstimator, partition
    from .competitors import timed_once
    from .models import encoder, operator_count

    mod = encoder(layers)
    patterns = [(f"{HOOK}.{name}", pat, lambda e: True) for name, pat in
                [(label.split(".", 1)[1], pat) for label, pat in mock_toolchains()[1].patterns]]
    reg = registry.Registry()
    reg.add(registry.pattern_table(HOOK, lambda: patterns),
            registry.packed_func("tvm_tcutils.bench.collage_cost",
                                 lambda m, target: 1e-3 * _peer_cost(m, "tvm" if target.kind.name == "llvm" else HOOK)))
    reg.register()
    try:
        ours_tc = [dataclasses.replace(TVM, max_depth=depth),
                   Toolchain(HOOK, HOOK, pattern_table=HOOK, combine=True, max_depth=depth, greedy_regions=False)]
        ours, t_ours = timed_once(lambda: partition(mod, None, ours_tc, CustomCostEstimator(_peer_cost),
                                                    compare_single=False, validate_rounds=0))
        targets = [tvm.target.Target("llvm"), tvm.target.Target(HOOK)]
        config = {"relay.collage.tvm_max_depth": depth, "relay.collage.byoc_max_depth": depth}
        log = tempfile.TemporaryFile()
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # TVM's pass logs every candidate on stderr; keep its total only
        try:
            with tvm.transform.PassContext(config=config):
                compilation = tvm.target.make_compilation_config(tvm.transform.PassContext.current(), targets)
                estimator = relay.collage.CustomCostEstimator("tvm_tcutils.bench.collage_cost")
                _, t_tvm = timed_once(lambda: relay.transform.CollagePartition(compilation, estimator)(mod))
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        found = re.findall(rb"Estimated overall cost is ([0-9.]+)us", log.read())
        tvm_cost = float(found[-1]) / 1000 if found else float("nan")
    finally:
        reg.unregister()
    return {"layers": layers, "operators": operator_count(mod), "depth": depth, "ours_s": t_ours, "tvm_s": t_tvm,
            "tvm_over_ours": t_tvm / t_ours, "ours_cost_ms": ours.estimated_ms, "tvm_cost_ms": tvm_cost}


# ---------------------------------------------------------------------------
# Isolated TVM candidates (scripts/diag_isolated_tvm_costs.py)
# ---------------------------------------------------------------------------
def single_conv_tvm_candidates(mod, params) -> list:
    """Stand-alone modules of the model's TVM candidates that hold exactly one ``nn.conv2d`` (nothing measured)."""
    from ..collage import CustomCostEstimator, partition

    found = []

    def collect(candidate, toolchain):
        name = getattr(toolchain, "name", toolchain)
        if name == "tvm" and candidate.astext(show_meta_data=False).count("nn.conv2d(") == 1:
            found.append(candidate)
        return 1.0

    partition(mod, params, toolchains="tvm", cost_estimator=CustomCostEstimator(collect),
              validate_rounds=0, compare_single=False)
    return found


def kernel_profile_us(mod) -> dict:
    """Per-kernel microseconds of one run of ``mod`` built by :func:`tvm_tcutils.measure.build` (TVM's profiler).

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> sum(kernel_profile_us(load_model("mlp")[0]).values()) > 0
    True
    """
    import tempfile

    from tvm.contrib.debugger import debug_executor

    from .._tvm import tvm
    from ..measure import build
    from ..models import random_inputs

    lib = build(mod)
    with tempfile.TemporaryDirectory() as dump:
        run = debug_executor.GraphModuleDebug(lib["debug_create"]("default", tvm.cpu()), [tvm.cpu()],
                                              lib.get_graph_json(), dump_root=dump)
        run.set_input(**random_inputs(mod))
        report = run.profile()
    out: dict = {}
    for call in report.calls:
        name = str(call["Name"])
        out[name] = out.get(name, 0.0) + call["Duration (us)"].microseconds
    return out


# ---------------------------------------------------------------------------
# Whole models: Collage against every single toolchain (scripts/bench_collage_models.py)
# ---------------------------------------------------------------------------
#: The single toolchains a whole-model table puts next to Collage, where usable here: TVM (as the
#: search lowers it, and the other TVM lowering), onnxruntime, BLAS, OpenVINO in f32 and bf16.
BASELINES = ("tvm", "tvm-fastmath", "ort", "blas", "openvino", "openvino-bf16")


def usable_toolchains(names):
    """``(toolchains, notes)``: the toolchains of ``names`` usable here, and a note for each one left out.

    Examples
    --------
    >>> usable, notes = usable_toolchains(["tvm", "nosuch"])
    >>> [tc.name for tc in usable], notes
    (['tvm'], ['nosuch left out: no such toolchain (known: ...)'])
    """
    from ..collage.toolchains import known

    table = known()
    usable, notes = [], []
    for name in names:
        tc = table.get(name)
        if tc is None:
            notes.append(f"{name} left out: no such toolchain (known: {', '.join(sorted(table))})")
            continue
        ok, reason = tc.availability()
        if ok and tc.buildable():
            usable.append(tc)
        else:
            notes.append(f"{name} left out: {reason or 'no codegen (relay.ext.' + str(tc.compiler) + ')'}")
    return usable, notes


def baseline_modules(prepared, search_toolchains, names=BASELINES):
    """``({"<name> alone": module}, notes)``: each usable single toolchain of ``names`` as a whole module.

    TVM toolchains lower the whole model; every other is BYOC's greedy
    partitioning with the rest lowered as the search's TVM toolchain lowers it
    (:func:`tvm_tcutils.collage.driver.single_toolchain_modules`).

    Examples
    --------
    >>> from tvm_tcutils.bench.models import load
    >>> from tvm_tcutils.collage.driver import prepare
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> modules, notes = baseline_modules(prepare(*load("mlp")), resolve("tvm"), ["tvm", "blas"])
    >>> sorted(modules)
    ['blas alone', 'tvm alone']
    """
    from ..collage.driver import single_toolchain_modules
    from ..collage.toolchains import tvm_toolchain

    usable, notes = usable_toolchains(names)
    lowering = tvm_toolchain(search_toolchains)
    # The search's TVM toolchain first: it lowers what the others leave to TVM.
    ordered = [lowering] + [tc for tc in usable if tc.name != lowering.name]
    return single_toolchain_modules(prepared, ordered), notes


def final_table(modules, mix="collage", repeat: int = 5, rounds: int = 5, max_rounds: int = 40,
                budget_s=None, tuning_log=None, confidence: float = 0.95):
    """Collage's final answer over whole modules: the benchmarks' one call of it.

    ``modules`` maps ``mix`` (Collage's module) and each single toolchain's
    (``"<name> alone"``) to a whole module; each is built here for this CPU and
    all are timed in interleaved rounds until the interval of Collage / best
    single excludes 1, ``budget_s`` or ``max_rounds`` ends
    (:func:`tvm_tcutils.collage.validate.final_comparison`). Returns its
    :class:`~tvm_tcutils.collage.validate.FinalAnswer`.

    Examples
    --------
    >>> from tvm import relay
    >>> from tvm_tcutils._tvm import tvm
    >>> x = relay.var("x", shape=(64,))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> final_table({"collage": mod, "tvm alone": mod}, repeat=1, rounds=2, max_rounds=2).rounds
    2
    """
    from .._tvm import host_target
    from ..collage.validate import final_comparison, in_process_sampler

    sampler = in_process_sampler(host_target(), tuning_log, repeat=repeat)
    return final_comparison(modules, mix, sampler, confidence, budget_s, min_rounds=rounds,
                            max_rounds=max(rounds, max_rounds))


def final_cells(final, singles):
    """Table cells of a final answer: each single's median ms, the mix's, the answer, mix / best single.

    Examples
    --------
    >>> from tvm_tcutils.collage.validate import final_answer
    >>> out = final_answer({"collage": lambda: 1.0, "tvm alone": lambda: 2.0}, min_rounds=2, max_rounds=2)
    >>> final_cells(out, ["tvm alone", "ort alone"])
    ['2.00', '-', '1.00', 'collage', 'x0.500 [0.500, 0.500]']
    """
    def ms(name):
        timing = final.timings.get(name)
        return f"{timing.median_ms:.2f}" if timing is not None and timing.samples_ms else "-"

    return [*[ms(name) for name in singles], ms(final.mix) if final.mix else "-", final.answer,
            str(final.ratio) if final.ratio else "-"]
