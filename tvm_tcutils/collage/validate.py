"""Validation of a chosen partitioning: build it whole, time it, learn what crossings cost.

Candidates are measured alone, so the sum of their costs misses what a
partitioning pays at each boundary between toolchains. :class:`Validation`
builds the chosen partitioning and its rivals (single toolchains, BYOC's
greedy partitioning) whole, times them with a :class:`WholeModelTimer`,
re-searches with the measured cost of a crossing, and keeps the fastest.

The timer comes from the cost estimator
(:meth:`~.cost.base.CostEstimator.whole_model_timer`): a measuring estimator
times whole models in its worker processes, with its own target and tuning
log (:class:`~.cost.workers.PooledWholeModelTimer`); estimators whose costs
are not times here have none, and nothing is validated.
"""
from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple

from .._tvm import tvm
from ..measure import WHOLE_MODEL_MIN_REPEAT_MS, Interleaved, Ratio, Timer, Timing, error_line, interleave_until, ratio

from .candidates import Candidate
from .outline import partitioned_module
from .search import NoCoverError, SearchResult, is_valid, search, search_valid
from .subgraph import IndexedGraph
from .toolchains import Toolchain
from .toolchains.base import fast_math_nodes

logger = logging.getLogger("tvm_tcutils.collage")


class WholeModelTimer(Protocol):
    """Times whole partitioned modules (milliseconds).

    Examples
    --------
    >>> class Fixed:
    ...     def time(self, mod): return 1.0
    ...     def time_side_by_side(self, mods, rounds=5): return [1.0] * len(mods)
    >>> Fixed().time_side_by_side([None, None])
    [1.0, 1.0]
    """

    def time(self, mod: tvm.IRModule) -> Optional[float]:
        """Latency of one module (``inf``: it failed), or None when it cannot be timed at all."""

    def time_side_by_side(self, mods: Sequence[tvm.IRModule], rounds: int = 5) -> Optional[List[float]]:
        """Latencies of modules timed in turns (A B A B ...), so that a drift of load affects all alike."""

    # Optional, for the final comparison (see whole_model_sampler): ``sampler(mod)`` returns a function
    # giving one latency sample (ms) of ``mod`` per call; or a ``target`` (and ``tuning_log``) attribute.


def outline_chosen(graph: IndexedGraph, chosen: Sequence[Candidate], toolchains: Dict[str, Toolchain],
                   prepared: tvm.IRModule):
    """The partitioned module of ``chosen`` (and its partitions' symbols), lowered the TVM toolchain's way.

    Examples
    --------
    >>> from tvm import relay
    >>> from tvm_tcutils.collage.toolchains import TVM
    >>> x = relay.var("x", shape=(2,))
    >>> prepared = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> graph = IndexedGraph(prepared["main"])
    >>> mod, symbols = outline_chosen(graph, [Candidate("tvm", 0b10, "exp")], {"tvm": TVM}, prepared)
    >>> symbols  # everything stays in TVM's main
    {}
    """
    compilers = {name: tc.compiler for name, tc in toolchains.items()}
    fast = 0
    for cand in chosen:
        tc = toolchains.get(cand.toolchain)
        if tc is not None and tc.is_tvm and tc.fast_math and not cand.host:
            fast |= fast_math_nodes(graph, cand.mask)
    return partitioned_module(graph, chosen, compilers, prepared, fast_nodes=fast)


class Validation:
    """Builds and times whole-model partitionings; learns the cost of crossing between toolchains.

    Candidates are measured alone, so their sum misses what a partitioning
    pays at each boundary between toolchains (thread pools waking up, caches,
    the call itself). When the estimator can time whole models, the chosen
    partitioning is built and timed; the gap between that and its estimate,
    spread over its external partitions, becomes a per-crossing penalty, and
    the search runs again with it (``rounds`` times). Each single-toolchain
    answer is timed too, and BYOC's greedy partitioning of each BYOC
    toolchain (its largest candidates, TVM for the rest): the fastest
    partitioning measured wins, so Collage is never measured slower than
    these in its own run.

    Parameters
    ----------
    graph, cands, costs, toolchains, prepared :
        What the search ran on (``toolchains`` by name).
    timer : WholeModelTimer, optional
        Times whole modules; None validates nothing.

    Attributes
    ----------
    trials : list of (str, float, float)
        Label, estimated ms and measured ms of each partitioning timed alone.
    side_by_side : list of (str, float, float)
        The same, timed again in turns (the fastest of these is chosen).

    Examples
    --------
    >>> from tvm_tcutils.collage.candidates import enumerate_candidates
    >>> from tvm_tcutils.collage.driver import prepare
    >>> from tvm_tcutils.collage.toolchains import resolve
    >>> from tvm_tcutils.models import load_model
    >>> prepared = prepare(*load_model("mlp"))
    >>> graph, toolchains = IndexedGraph(prepared["main"]), {tc.name: tc for tc in resolve("tvm")}
    >>> cands = enumerate_candidates(graph, list(toolchains.values()))
    >>> costs = [1.0] * len(cands)
    >>> class TwoMs:
    ...     def time(self, mod): return 2.0
    ...     def time_side_by_side(self, mods, rounds=5): return [2.0] * len(mods)
    >>> check = Validation(graph, cands, costs, toolchains, prepared, TwoMs())
    >>> answer = search(graph, cands, costs)
    >>> check.run(answer, rounds=2, singles={}) is answer, check.trials[0][0], check.measured_of(answer)
    (True, 'collage', 2.0)
    """

    def __init__(self, graph: IndexedGraph, cands: Sequence[Candidate], costs: Sequence[float],
                 toolchains: Dict[str, Toolchain], prepared: tvm.IRModule, timer: Optional[WholeModelTimer]):
        self.graph, self.cands, self.costs = graph, cands, costs
        self.toolchains, self.prepared, self.timer = toolchains, prepared, timer
        self.trials: List = []
        self.side_by_side: List = []
        #: ``time.perf_counter()`` after which :meth:`run` times nothing more (None: no limit).
        self.deadline: Optional[float] = None
        #: Whether :meth:`run` stopped at :attr:`deadline` before timing everything.
        self.cut_short = False
        #: The cost of crossing into another toolchain learned by :meth:`run` (ms per partition outside
        #: TVM: whole-model time less the estimates, shared out); 0 until learned.
        self.penalty = 0.0
        self._measured: Dict[frozenset, float] = {}
        self._labels: Dict[frozenset, str] = {}
        self._modules: Dict[frozenset, tvm.IRModule] = {}
        #: ``(label, ms())``: a rival of every mix that the final comparison times anyway (TVM alone, built
        #: beside validation), timed once on demand; a re-searched mix whose estimate, corrected by how
        #: the first mix's estimate erred where it erred low, is above the rival's time is not built.
        self.rival: Optional[Tuple[str, Callable[[], Optional[float]]]] = None
        self._rival_ms: Optional[float] = None
        #: Re-searched mixes :meth:`run` did not build: (label, estimated ms, the rival, its ms).
        self.skipped: List[Tuple[str, float, str, float]] = []

    def _beaten(self, first: SearchResult, current: SearchResult, label: str) -> bool:
        """Whether ``current`` (a re-searched mix) cannot beat :attr:`rival`: its estimate, scaled by the
        first mix's measured / estimated time where that is below 1 (estimates run low there), is still
        above the rival's measured time."""
        if self.rival is None:
            return False
        if self._rival_ms is None:
            ms = self.rival[1]()
            self._rival_ms = ms if ms is not None and math.isfinite(ms) else math.inf
        measured = self._measured.get(self._key(first))
        scale = min(1.0, measured / first.cost) if measured and first.cost > 0 else 1.0
        if current.cost * scale <= self._rival_ms:
            return False
        self.skipped.append((label, current.cost, self.rival[0], self._rival_ms))
        logger.info("validation: %s estimated %.3f ms: not built, %s measured %.3f ms", label, current.cost,
                    self.rival[0], self._rival_ms)
        return True

    def _external(self, cand: Candidate) -> bool:
        return not cand.host and not self.toolchains[cand.toolchain].is_tvm

    def crossings(self, result: SearchResult) -> int:
        """How many of ``result``'s partitions run outside TVM (each one a crossing into another toolchain)."""
        return sum(1 for c in result.chosen if self._external(c))

    @staticmethod
    def _key(result: SearchResult) -> frozenset:
        return frozenset((c.toolchain, c.mask, c.composites) for c in result.chosen if not c.host)

    def measured_of(self, result: SearchResult) -> Optional[float]:
        """The latest whole-model time of ``result`` (None if it was not timed)."""
        return self._measured.get(self._key(result))

    def module_of(self, result: SearchResult) -> tvm.IRModule:
        """``result`` outlined (:func:`outline_chosen`), once: the driver hands the first mix to the
        comparison's background builds before validation times it (BERT-base: 7 s an outline)."""
        key = self._key(result)
        if key not in self._modules:
            self._modules[key] = outline_chosen(self.graph, result.chosen, self.toolchains, self.prepared)[0]
        return self._modules[key]

    def _time(self, result: SearchResult, label: str) -> Optional[float]:
        key = self._key(result)
        if key not in self._measured:
            mod = self.module_of(result)
            del self._modules[key]  # the timer keeps what it built; the outline is not needed again
            ms = self.timer.time(mod)
            if ms is None:
                return None
            self._measured[key] = ms
            self._labels[key] = label
            self.trials.append((label, result.cost, ms))
            logger.info("validation: %s estimated %.3f ms, measured %.3f ms", label, result.cost, ms)
        return self._measured[key]

    def with_crossings(self) -> List[float]:
        """The candidates' costs with :attr:`penalty` added to each partition outside TVM (what a new search
        should use after validation, e.g. the error budget's re-searches)."""
        return [x + self.penalty if self._external(c) else x for c, x in zip(self.cands, self.costs)]

    def _late(self) -> bool:
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            self.cut_short = True
        return self.cut_short

    def run(self, result: SearchResult, rounds: int, singles: Dict[str, SearchResult],
            greedy: Optional[Dict[str, SearchResult]] = None, retime: bool = True) -> SearchResult:
        """Time ``result`` whole, re-search ``rounds`` times with the learned crossing cost, time the
        ``singles`` and ``greedy`` answers too; the fastest measured answer (``result`` untimed when
        there is no timer or ``rounds`` is 0).

        ``retime``: time the distinct answers again side by side before choosing (each is built
        again). The driver leaves it off when its final comparison follows: that comparison times
        the chosen mix in interleaved rounds against every toolchain alone, and returns a toolchain
        alone unless the mix is faster with confidence.

        Past :attr:`deadline` (a ``time.perf_counter()`` value) nothing more is
        timed: the fastest answer timed so far is returned and
        :attr:`cut_short` is set."""
        if rounds == 0 or self.timer is None or self._late() or self._time(result, "collage") is None:
            return result
        tried = [result]
        penalty = 0.0
        current = result
        for _ in range(rounds):
            if self._late():
                break
            crossings = self.crossings(current)
            if not crossings:
                break
            gap = self._measured[self._key(current)] - current.cost
            penalty = max(0.0, penalty + gap / crossings)
            self.penalty = penalty
            costs = self.with_crossings()
            current = search_valid(self.graph, self.cands, costs, self.toolchains)
            if self._key(current) in self._measured:
                break
            label = f"collage, {penalty * 1e3:.0f} us per crossing"
            if self._beaten(result, current, label):
                break
            self._time(current, label)
            tried.append(current)
        labelled = [(f"{name} alone" if self.toolchains[name].is_tvm else f"{name} + tvm", single)
                    for name, single in singles.items()]
        labelled += [(f"{name} greedy", answer) for name, answer in (greedy or {}).items()]
        for label, answer in labelled:
            if self._late():
                break
            self._time(answer, label)
            tried.append(answer)
        if retime and not self._late():
            self._retime_side_by_side(tried)
        return min(tried, key=lambda r: self._measured.get(self._key(r), math.inf))

    def _retime_side_by_side(self, tried: List[SearchResult]) -> None:
        """Time the distinct partitionings again, in turns, and keep those timings.

        The timings above were taken one after the other, seconds apart; on a
        machine whose load drifts that alone can flip the choice. Timed
        round-robin in one process the ratios are fair.
        """
        distinct: Dict[frozenset, SearchResult] = {}
        for result in tried:
            if math.isfinite(self._measured.get(self._key(result), math.inf)):
                distinct.setdefault(self._key(result), result)
        if len(distinct) < 2:
            return
        mods = [outline_chosen(self.graph, r.chosen, self.toolchains, self.prepared)[0] for r in distinct.values()]
        times = self.timer.time_side_by_side(mods)
        if not times:
            return
        for (key, result), ms in zip(distinct.items(), times):
            self._measured[key] = ms
            self.side_by_side.append((self._labels.get(key, "?"), result.cost, ms))
            logger.info("validation, timed side by side: %s estimated %.3f ms, measured %.3f ms",
                        self._labels.get(key, "?"), result.cost, ms)


def greedy_answers(graph: IndexedGraph, cands: List[Candidate], costs: List[float],
                   toolchains: Dict[str, Toolchain]) -> Dict[str, SearchResult]:
    """BYOC's greedy partitioning of each BYOC toolchain, as a search answer.

    The toolchain's largest candidates (those inside no other of its
    candidates: for a graph-style toolchain its maximal regions, as
    ``MergeCompilerRegions`` makes them) are forced, TVM candidates touching
    them are left out, and TVM covers the rest. Timed whole in validation: the
    isolated costs of a fine-grained mix can miss what one big region gains in
    a whole model (the toolchain's own fusion, fewer calls).

    Examples
    --------
    >>> greedy_answers(None, [], [], {})  # TVM alone has no greedy rival
    {}
    """
    out: Dict[str, SearchResult] = {}
    for name, tc in toolchains.items():
        if tc.is_tvm:
            continue
        own = sorted((k for k, c in enumerate(cands) if c.toolchain == name and not c.host and math.isfinite(costs[k])),
                     key=lambda k: (-cands[k].mask.bit_count(), k))
        largest: List[int] = []
        for k in own:
            mask = cands[k].mask
            if not any(mask & cands[j].mask == mask for j in largest):
                largest.append(k)
        if not largest:
            continue
        claimed = 0
        for k in largest:
            claimed |= cands[k].mask
        keep = set(largest)
        sub = [k for k, c in enumerate(cands)
               if k in keep or c.host or (toolchains[c.toolchain].is_tvm and not c.mask & claimed)]
        try:
            answer = search(graph, [cands[k] for k in sub], [costs[k] for k in sub])
        except NoCoverError:  # overlapping largest candidates can leave nodes without a cover
            continue
        if is_valid(graph, answer.chosen, toolchains):  # else its regions depend on each other cyclically
            out[name] = answer
    return out


# ---------------------------------------------------------------------------
# The final answer: the mix only when it is faster than every single toolchain
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class FinalAnswer:
    """The outcome of :func:`final_answer`: which competitor is the answer, and why.

    Attributes
    ----------
    answer : str
        The chosen competitor: ``mix``, or a single toolchain's name.
    mix : str or None
        The name of the mix (None: the mix was one of the single toolchains).
    best_single : str or None
        The single toolchain with the lowest median.
    ratio : Ratio or None
        ``mix / best single`` (below 1: the mix is faster); with no mix, the
        fastest single over the second (None when there are not two to compare).
    reason : str
        The decision in words.
    timings : dict of str to Timing
        Every competitor's samples (empty: it could not be built or run).
    rounds, seconds, stopped :
        How many interleaved rounds ran, in how long, and why they stopped
        (see :class:`~tvm_tcutils.measure.Interleaved`).
    """

    answer: str
    mix: Optional[str]
    best_single: Optional[str]
    ratio: Optional[Ratio]
    reason: str
    timings: Dict[str, Timing]
    rounds: int
    seconds: float
    stopped: str

    @property
    def is_mix(self) -> bool:
        """Whether the mix is the answer."""
        return self.mix is not None and self.answer == self.mix

    def as_dict(self) -> dict:
        """A JSON-ready summary (for benchmark results)."""
        return {"answer": self.answer, "mix": self.mix, "best_single": self.best_single,
                "ratio": self.ratio.as_dict() if self.ratio else None, "reason": self.reason,
                "timings": {name: t.as_dict() for name, t in self.timings.items()},
                "rounds": self.rounds, "seconds": self.seconds, "stopped": self.stopped}


def _fastest(timings: Mapping[str, Timing], names: Sequence[str]) -> Optional[str]:
    timed = [name for name in names if timings[name].samples_ms]
    return min(timed, key=lambda name: timings[name].median_ms) if timed else None


#: How much faster than the best single a mix must be able to be for the final comparison to go on: once the
#: interval of their ratio lies at or above ``1 - EQUIVALENCE`` more rounds could at best show a mix faster by
#: less than that, so they stop and the single is kept -- whatever the interval's upper end (a mix that is a
#: runtime's region with a few operators moved otherwise runs the rounds to the budget's end, undecided).
#: Before the search's validation, an answer estimated within it of a toolchain alone gives way to that.
EQUIVALENCE = 0.01


def _cannot_win_by_more(r: Ratio) -> bool:
    return r.low >= 1 - EQUIVALENCE


#: Why rounds ended without a separated interval, in words.
_STOPPED = {"budget": "the time budget ended", "rounds": "the round limit was reached", "decided": "separated"}


def final_answer(timers: Mapping[str, Callable[[], float]], mix: Optional[str] = "collage",
                 confidence: float = 0.95, budget_s: Optional[float] = 60.0, min_rounds: int = 5,
                 max_rounds: int = 40, clock: Callable[[], float] = time.perf_counter,
                 on_round: Optional[Callable[[int, int], None]] = None) -> FinalAnswer:
    """Time the mix and every single toolchain in interleaved rounds; the mix only if it is faster.

    Rounds of A B C ... (one sample of each competitor, in turns, see
    :func:`~tvm_tcutils.measure.interleave_until`) run until the bootstrap
    interval of ``median(mix) / median(best single)`` at ``confidence``
    excludes 1, or ``budget_s`` seconds or ``max_rounds`` rounds end. The
    mix is the answer only when the interval lies below 1; otherwise the
    single toolchain with the lowest median is. With ``mix=None`` (the mix
    *is* a single toolchain) the rounds run until the fastest single is
    separated from the second, and the fastest is the answer.

    Parameters
    ----------
    timers : mapping of str to callable
        One sample in ms per call (:meth:`tvm_tcutils.measure.Timer.sample`);
        every name but ``mix`` is a single toolchain. A timer that raises is
        left out (empty timing).
    confidence : float
        Of the interval, in (0, 1).
    budget_s : float or None
        Seconds of timing (checked between rounds).
    min_rounds, max_rounds : int
        Rounds before the first test, and the cap.
    clock : callable
        Seconds (injected by tests).
    on_round : callable, optional
        ``on_round(rounds_done, max_rounds)`` after each round (progress).

    Examples
    --------
    >>> noise = iter([0.0, 0.02, -0.02, 0.01, -0.01] * 100)
    >>> timers = {"collage": lambda: 1.0 + next(noise), "tvm alone": lambda: 2.0 + next(noise)}
    >>> out = final_answer(timers)
    >>> out.answer, out.stopped, out.ratio.high < 1
    ('collage', 'decided', True)
    """
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if mix is not None and mix not in timers:
        raise ValueError(f"mix: {mix!r} is not one of the timers {sorted(timers)}")
    singles = [name for name in timers if name != mix]
    if not singles and mix is None:
        raise ValueError("timers: nothing to compare (no mix and no single toolchain)")

    def pair(timings: Dict[str, Timing]):
        """The two competitors whose ratio decides: the mix (or the fastest single) and the best other."""
        best = _fastest(timings, singles)
        if mix is not None:
            return mix, best
        return best, _fastest(timings, [name for name in singles if name != best])

    def decided(timings: Dict[str, Timing]) -> bool:
        a, b = pair(timings)
        if a is None or b is None or not timings[a].samples_ms:
            return True  # nothing left to separate: more rounds cannot change the answer
        r = ratio(timings[a], timings[b], confidence)
        # A mix that can be at most EQUIVALENCE faster than the best single cannot win by more: it is kept.
        return r.separated or (mix is not None and _cannot_win_by_more(r))

    run: Interleaved = interleave_until(timers, decided, min_rounds, max_rounds, budget_s, clock,
                                        on_round=(lambda done: on_round(done, max_rounds)) if on_round else None)
    timings = run.timings
    best = _fastest(timings, singles)
    a, b = pair(timings)
    r = ratio(timings[a], timings[b], confidence) if a and b and timings[a].samples_ms else None
    answer, reason = _decide(mix, a, b, best, r, confidence, run)
    return FinalAnswer(answer, mix, best, r, reason, timings, run.rounds, run.seconds, run.stopped)


def _decide(mix: Optional[str], a: Optional[str], b: Optional[str], best: Optional[str], r: Optional[Ratio],
            confidence: float, run: Interleaved):
    """``(answer, reason)`` of :func:`final_answer` (``a / b`` is the deciding ratio ``r``)."""
    level = f"{100 * confidence:.0f} % confidence"
    rounds = f"{run.rounds} interleaved round{'s' * (run.rounds != 1)}"
    if best is None:
        if mix is not None and run.timings[mix].samples_ms:
            return mix, "no single toolchain could be built and timed; the mix is kept"
        raise RuntimeError("final comparison: no competitor could be built and timed")
    if mix is None:
        if b is None:
            return best, f"{best}, the only single toolchain timed"
        if r.separated:
            return best, f"{best} is fastest (x{1 / r.value:.3f} faster than {b}, {level}, {rounds})"
        return best, (f"{best} has the lowest median; not separated from {b} at {level} "
                      f"after {rounds} ({_STOPPED[run.stopped]})")
    if r is None:
        return best, f"the mix could not be built and timed; {best} is kept"
    if r.high < 1.0:
        return mix, f"the mix is faster than {best} with {level} ({rounds})"
    if r.low > 1.0:
        return best, f"{best} is fastest; no mix beats it (the mix is slower with {level}, {rounds})"
    if _cannot_win_by_more(r):
        return best, (f"{best} is kept: the mix is at best x{1 - EQUIVALENCE:g} of it with {level} ({rounds}): "
                      f"it cannot win by more")
    return best, (f"{best} is kept: the mix is not faster with {level} after {rounds} "
                  f"({_STOPPED[run.stopped]})")


def in_process_sampler(target: Optional[str] = None, tuning_log: Optional[str] = None, repeat: int = 5,
                       min_repeat_ms: int = WHOLE_MODEL_MIN_REPEAT_MS) -> Callable[[tvm.IRModule], Callable[[], float]]:
    """``sampler(mod)``: build ``mod`` here (:class:`~tvm_tcutils.measure.Timer`) and return its sample function.

    Each sample is the median of ``repeat`` runs of at least ``min_repeat_ms``.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(64,))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> sample = in_process_sampler(repeat=2, min_repeat_ms=1)(mod)
    >>> sample() > 0
    True
    """
    def sampler(mod: tvm.IRModule) -> Callable[[], float]:
        return Timer(mod, None, target, repeat=repeat, warmup=2, min_repeat_ms=min_repeat_ms,
                     tuning_log=tuning_log).sample
    return sampler


def whole_model_sampler(timer) -> Optional[Callable[[tvm.IRModule], Callable[[], float]]]:
    """How the final comparison samples whole modules, given validation's :class:`WholeModelTimer`.

    A timer with its own ``sampler(mod)`` method is used as is: a measuring
    estimator's (:class:`~.cost.workers.PooledWholeModelTimer`: each module
    in a fresh process of its own), a remote one's, a test's; one with only
    a ``target`` gives :func:`in_process_sampler` for its target and tuning
    log; other timers give None (no final comparison).

    Examples
    --------
    >>> whole_model_sampler(None) is None
    True
    """
    own = getattr(timer, "sampler", None)
    if callable(own):
        return own
    if getattr(timer, "target", None) is None:
        return None
    return in_process_sampler(timer.target, getattr(timer, "tuning_log", None))


def final_comparison(modules: Mapping[str, tvm.IRModule], mix: Optional[str] = "collage",
                     sampler: Optional[Callable[[tvm.IRModule], Callable[[], float]]] = None,
                     confidence: float = 0.95, budget_s: Optional[float] = 60.0, min_rounds: int = 5,
                     max_rounds: int = 40, on_round: Optional[Callable[[int, int], None]] = None) -> FinalAnswer:
    """Build whole modules, then :func:`final_answer` on their samples.

    ``modules`` maps competitor names to whole partitioned modules (the mix
    under ``mix``); ``sampler(module)`` builds one and returns its sample
    function (default :func:`in_process_sampler` for this CPU). A sampler with
    a ``build_all(modules)`` method (name -> sample function, or the exception
    its build raised) builds them all its own way, for example several at
    once in processes of their own; every build ends before the first sample.
    A module that fails to build is left out, with a warning, and gets an
    empty timing. ``on_round(done, cap)`` is called after each round
    (progress). The benchmark scripts call this same function.

    Examples
    --------
    >>> from tvm import relay
    >>> x = relay.var("x", shape=(64,))
    >>> mod = relay.transform.InferType()(tvm.IRModule.from_expr(relay.Function([x], relay.exp(x))))
    >>> out = final_comparison({"tvm alone": mod}, mix=None, sampler=in_process_sampler(repeat=1), min_rounds=1,
    ...                        max_rounds=1)
    >>> out.answer, out.rounds
    ('tvm alone', 1)
    """
    sampler = sampler or in_process_sampler()
    build_all = getattr(sampler, "build_all", None)
    if build_all is not None:
        built = build_all(modules)
    else:
        built = {}
        for name, module in modules.items():
            try:
                built[name] = sampler(module)
            except (tvm.TVMError, RuntimeError, ValueError) as err:
                built[name] = err
    timers: Dict[str, Callable[[], float]] = {}
    for name in modules:
        timer = built[name]
        if isinstance(timer, BaseException):
            logger.warning("final comparison: %s could not be built: %s", name, error_line(timer))
            timer = _unbuildable(name, timer)
        timers[name] = timer
    return final_answer(timers, mix, confidence, budget_s, min_rounds, max_rounds, on_round=on_round)


def _unbuildable(name: str, err: BaseException) -> Callable[[], float]:
    def fail() -> float:
        raise RuntimeError(f"{name} could not be built: {error_line(err)}")
    return fail
