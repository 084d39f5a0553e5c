"""Precision as a choice: faster, less precise toolchains placed per partition under an error budget.

Some toolchains are a faster, less exact mode of another (``openvino-bf16`` of
``openvino``, ``tvm-fastmath`` of ``tvm``: :attr:`~.toolchains.Toolchain.exact`).
The search places them per partition like any toolchain; with an error budget
(``collage.partition(..., error_budget=0.01)``) the answer must also keep the
model's outputs within that relative error of the exact model on sample inputs:

1. the mix is built and run on the sample inputs, and its outputs compared
   with the input module's, built by the exact TVM toolchain
   (:func:`relative_error`, the largest over the outputs);
2. over budget, one lossy partition is given up: the one whose loss costs the
   least estimated latency (each is tried by a new search with lossy
   toolchains forbidden on its nodes; the costs are the search's, so nothing
   new is measured), and the new mix is checked again;
3. until the error is within budget or no lossy partition is left (the exact
   mix, whose error is that of float reordering).

Errors cannot be attributed to partitions without building a model per
partition, so the order is by cost, not by error; each step is one build and
run of the whole model. Single toolchains that are lossy (``openvino-bf16``
alone) are checked the same way before the final comparison, and one over
budget does not compete.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .._tvm import tvm
from ..measure import build, error_line, graph_module, outputs

from . import arguments
from .candidates import Candidate
from .search import NoCoverError, SearchResult, search_valid
from .subgraph import IndexedGraph
from .toolchains import Toolchain
from .toolchains.base import relative_error  # noqa: F401  (the error measure of budgets lives with the toolchains)

logger = logging.getLogger("tvm_tcutils.collage")


def lossy(cand: Candidate, toolchains: Mapping[str, Toolchain]) -> bool:
    """Whether ``cand`` runs on a less precise mode of another toolchain."""
    tc = toolchains.get(cand.toolchain)
    return bool(tc is not None and not cand.host and tc.lossy)


class ErrorCheck:
    """Outputs of modules on fixed sample inputs, against the exact model's.

    Parameters
    ----------
    reference : IRModule
        The exact model (Collage's prepared module: parameters bound), built by
        TVM as it is.
    inputs : dict, optional
        Sample inputs by name (the model's free inputs; missing ones get seeded
        random values of their types, :func:`tvm_tcutils.models.random_inputs`).
    target, tuning_log : optional
        How modules are built (default: this CPU, untuned).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(64,))
    >>> exact = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> check = ErrorCheck(exact)
    >>> check(exact), 0 < check(relay.transform.FastMath()(exact)) < 1e-5
    (0.0, True)
    """

    def __init__(self, reference: tvm.IRModule, inputs: Optional[Mapping[str, np.ndarray]] = None,
                 target: Optional[str] = None, tuning_log: Optional[str] = None):
        from ..models import random_inputs

        self.target, self.tuning_log = target, tuning_log
        self.inputs = {**random_inputs(reference), **{k: _numpy(v) for k, v in (inputs or {}).items()}}
        self.reference = self.outputs(reference)
        self.builds = 0

    def outputs(self, mod: tvm.IRModule) -> List[np.ndarray]:
        """``mod``'s outputs on the sample inputs."""
        runner = graph_module(build(mod, None, self.target, self.tuning_log), self.inputs)
        runner.run()
        return outputs(runner)

    def __call__(self, mod: tvm.IRModule) -> float:
        """``mod``'s :func:`relative_error` against the exact model."""
        self.builds += 1
        return relative_error(self.outputs(mod), self.reference)


def _numpy(value) -> np.ndarray:
    return value.numpy() if isinstance(value, tvm.nd.NDArray) else np.asarray(value)


def check_sample_inputs(main, value) -> Dict[str, np.ndarray]:
    """``sample_inputs`` checked against ``main``'s parameters (names, shapes, dtypes): a new dict.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(2,))
    >>> check_sample_inputs(relay.Function([x], x), {"y": np.ones(2, "float32")})
    Traceback (most recent call last):
    ...
    ValueError: sample_inputs: ['y'] are not parameters of main; its parameters: ['x']
    """
    return {k: _numpy(v) for k, v in arguments.params_for(main, value, "sample_inputs").items()}


@dataclasses.dataclass
class BudgetStep:
    """One mix checked against the error budget: what it gave up so far, its error, its estimate."""

    given_up: Tuple[str, ...]
    lossy_partitions: int
    error: float
    estimated_ms: float

    def __str__(self) -> str:
        what = "the search's mix" if not self.given_up else "without " + "; ".join(self.given_up)
        return (f"{what}: {self.lossy_partitions} lossy partition(s), error {self.error:.3g}, "
                f"estimated {self.estimated_ms:.3f} ms")


def _describe(graph: IndexedGraph, cand: Candidate) -> str:
    ops = graph.op_names(cand.mask)
    shown = "+".join(ops[:4]) + ("+..." if len(ops) > 4 else "")
    return f"{cand.toolchain} on {shown}"


def fit_budget(graph: IndexedGraph, cands: Sequence[Candidate], costs: Sequence[float],
               toolchains: Mapping[str, Toolchain], result: SearchResult, budget: float,
               error_of: Callable[[SearchResult], float], deadline: Optional[float] = None,
               ) -> Tuple[SearchResult, float, List[BudgetStep]]:
    """Give up lossy partitions of ``result`` until ``error_of(result) <= budget`` (see the module's text).

    Parameters
    ----------
    graph, cands, costs, toolchains :
        The search's graph, candidates, their costs and toolchains by name.
    result : SearchResult
        The search's (or validation's) answer.
    budget : float
        Largest relative error of the outputs allowed.
    error_of : callable
        The error of a search result's partitioned module (:class:`ErrorCheck` on it).
    deadline : float, optional
        ``time.perf_counter()`` value after which no more mixes are tried: the
        mix with every lossy partition given up is returned, unchecked.

    Returns
    -------
    (SearchResult, float, list of BudgetStep)
        The answer, its error (nan: not checked), and the mixes checked on the way.

    Examples
    --------
    >>> from tvm import relay
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> x = relay.var("x", shape=(4,))
    >>> graph = IndexedGraph(relay.transform.InferType()(tvm.IRModule.from_expr(
    ...     relay.Function([x], relay.exp(x))))["main"])
    >>> tcs = {tc.name: tc for tc in resolve("tvm,tvm-fastmath")}
    >>> cands = [Candidate("tvm", 0b10, "exp"), Candidate("tvm-fastmath", 0b10, "exp")]
    >>> first = search_valid(graph, cands, [2.0, 1.0], tcs)
    >>> answer, error, steps = fit_budget(graph, cands, [2.0, 1.0], tcs, first, 0.01,
    ...                                   lambda r: 0.5 if r.chosen[-1].toolchain == "tvm-fastmath" else 0.0)
    >>> answer.chosen[-1].toolchain, error, [s.lossy_partitions for s in steps]
    ('tvm', 0.0, [1, 0])
    """
    forbidden = 0  # nodes where no lossy toolchain may run
    given_up: List[str] = []
    steps: List[BudgetStep] = []

    def without(mask: int) -> SearchResult:
        keep = [k for k, c in enumerate(cands) if not (lossy(c, toolchains) and c.mask & mask)]
        return search_valid(graph, [cands[k] for k in keep], [costs[k] for k in keep], toolchains)

    current = result
    while True:
        partitions = [c for c in current.chosen if lossy(c, toolchains)]
        if deadline is not None and time.perf_counter() >= deadline and partitions:
            logger.warning("error budget: the time budget ended; every lossy partition given up, unchecked")
            exact = without(graph.covered_mask | forbidden)
            steps.append(BudgetStep(tuple(given_up + ["every lossy partition"]), 0, math.nan, exact.cost))
            return exact, math.nan, steps
        error = error_of(current)
        steps.append(BudgetStep(tuple(given_up), len(partitions), error, current.cost))
        logger.info("error budget %.3g: %s", budget, steps[-1])
        if error <= budget or not partitions:
            return current, error, steps
        options = []
        for cand in partitions:
            try:
                options.append((without(forbidden | cand.mask), cand))
            except NoCoverError:  # only the lossy toolchain covers it: it cannot be given up alone
                continue
        if not options:
            current = without(graph.covered_mask)
            given_up.append("every lossy partition")
            continue
        current, cand = min(options, key=lambda pair: pair[0].cost)
        forbidden |= cand.mask
        given_up.append(_describe(graph, cand))


def check_singles(modules: Mapping[str, tvm.IRModule], lossy_names: Sequence[str], budget: float,
                  check: ErrorCheck) -> Tuple[Dict[str, tvm.IRModule], Dict[str, float]]:
    """The competitors of the final comparison within ``budget``: ``(kept modules, {checked name: error})``.

    Only ``lossy_names`` are checked (the others compute exactly); one that
    fails to build is kept (the comparison reports it).

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(64,))
    >>> exact = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.tanh(x))))
    >>> fast = relay.transform.FastMath()(exact)
    >>> kept, errors = check_singles({"a": exact, "b": fast}, ["b"], 1e-12, ErrorCheck(exact))
    >>> sorted(kept), errors["b"] > 1e-12
    (['a'], True)
    """
    kept, errors = {}, {}
    for name, module in modules.items():
        if name in lossy_names:
            try:
                errors[name] = check(module)
            except (tvm.TVMError, RuntimeError, ValueError) as err:
                logger.warning("error budget: %s could not be checked: %s", name, error_line(err))
            else:
                if errors[name] > budget:
                    logger.info("error budget %.3g: %s left out of the final comparison (error %.3g)",
                                budget, name, errors[name])
                    continue
        kept[name] = module
    return kept, errors
