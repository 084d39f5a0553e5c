"""Facts about this machine's dot-product unit that the fallback tiles are chosen from.

A register tile needs as many independent accumulators as the unit has
instructions in flight (its latency times the instructions it starts a cycle),
or the unit waits. That number differs between CPUs of one ISA (Zen 4 starts one
512-bit ``vpdpbusd`` a cycle, Zen 5 two) and no CPU reports it, so it is
measured: the throughput of a register-only loop of 16 independent chains
divided by that of one chain (:func:`measure_chains_in_flight`). The answer is
kept per machine in the package's cache folder (``cpu/dot_chains.json``) and
measured only for a target whose code runs here (the host's CPU); for another
CPU the environment variable :data:`CHAINS_ENV` states it, else the schedules
keep their ISA's own tiles.

Examples
--------
>>> from tvm_tcutils.dotprod.isa import X86_VNNI
>>> import tvm
>>> os.environ[CHAINS_ENV] = "9"
>>> chains_in_flight(X86_VNNI, tvm.target.Target("llvm -mcpu=znver5"))
9.0
>>> del os.environ[CHAINS_ENV]
"""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Dict, Optional

import numpy as np

from .._tvm import host_target, tvm
from tvm import te

from ..files import atomic_path, cache_dir
from .isa import ISAS, DotProductISA

logger = logging.getLogger(__name__)

#: Environment variable stating the dot-product instructions in flight of the CPU the code is for
#: (a float; ``0`` or empty: unknown). It wins over the measurement, and is the only source for a
#: target whose code cannot run here (cross-compiling).
CHAINS_ENV = "TCUTILS_DOT_CHAINS"

#: Chains of the peak loop: more than any CPU here needs (Zen 4 reaches its peak at 4, Zen 5 at about 10).
PEAK_CHAINS = 16

_LOCK = threading.Lock()
_MEASURED: Dict[str, Optional[float]] = {}


def chain_kernel(isa: DotProductISA, tasks: int, chains: int, iters: int, target=None):
    """A compiled register-only loop: ``tasks`` parallel tasks of ``chains`` independent accumulator
    chains, ``iters`` dot-product steps each, on loop-invariant operands (args: ``A`` (4,) uint8,
    ``B`` (lanes, 4) int8, ``C`` (tasks, chains, lanes) int32), built for ``target`` (default: the host's).

    Every step is one instruction of the ISA, through the package's own tensor intrinsic: the
    instruction the kernels use.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> asm = chain_kernel(X86_VNNI, 1, 2, 10, "llvm -mcpu=znver4").get_source("asm")
    >>> asm.count("vpdpbusd") >= 2
    True
    """
    from .topi.intrinsics import dot_product_intrin

    lanes = isa.lanes
    a = te.placeholder((isa.reduce,), "uint8", name="A")
    b = te.placeholder((lanes, isa.reduce), "int8", name="B")
    i, k = te.reduce_axis((0, iters), "i"), te.reduce_axis((0, isa.reduce), "k")
    c = te.compute((tasks, chains, lanes), lambda t, r, lane: te.sum(
        a[k].astype("int32") * b[lane, k].astype("int32"), axis=[i, k]), name="C")
    s = te.create_schedule(c.op)
    t, r, lane_axis = s[c].op.axis
    s[c].reorder(t, i, r, lane_axis, k)
    s[c].unroll(r)
    if tasks > 1:  # one task runs on the calling thread: no pool started in a compiling process
        s[c].parallel(t)
    s[c].tensorize(lane_axis, dot_product_intrin(isa, "uint8", "int8"))
    # A context of its own: this may run while a model is being lowered, under the user's context
    # (its instruments and disabled passes are not this kernel's).
    with tvm.transform.PassContext(opt_level=3):
        return tvm.build(s, [a, b, c], target=target or host_target())


def chain_gops(isa: DotProductISA, tasks: int, chains: int, iters: int = 100_000, repeat: int = 5,
               min_ms: int = 100, settle_threads: bool = True, target=None) -> float:
    """GOPS (the best of ``repeat`` samples) of :func:`chain_kernel` on this machine.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> here = X86_VNNI.supports(tvm.target.Target(host_target()))
    >>> not here or chain_gops(X86_VNNI, 1, 4, 1000, repeat=1, min_ms=1) > 0
    True
    """
    from ..measure import time_function

    lib = chain_kernel(isa, tasks, chains, iters, target)
    args = chain_arguments(isa, tasks, chains)
    seconds = time_function(lib, args, repeat=repeat, min_repeat_ms=min_ms, settle_threads=settle_threads).min_ms / 1e3
    return chain_gop(isa, tasks, chains, iters) / seconds


def chain_arguments(isa: DotProductISA, tasks: int, chains: int) -> list:
    """The arrays :func:`chain_kernel` runs on (``A``, ``B``, ``C``), on the CPU.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> [a.shape for a in chain_arguments(X86_VNNI, 2, 3)]
    [(4,), (16, 4), (2, 3, 16)]
    """
    return [tvm.nd.array(np.ones(isa.reduce, "uint8")), tvm.nd.array(np.ones((isa.lanes, isa.reduce), "int8")),
            tvm.nd.array(np.zeros((tasks, chains, isa.lanes), "int32"))]


def chain_gop(isa: DotProductISA, tasks: int, chains: int, iters: int) -> float:
    """Billion operations (a multiply and an add each) of one run of :func:`chain_kernel`.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> chain_gop(X86_VNNI, 1, 16, 100_000)
    0.2048
    """
    return tasks * iters * chains * isa.lanes * isa.reduce * 2 / 1e9


def measure_chains_in_flight(isa: DotProductISA, rounds: int = 3) -> float:
    """Instructions of ``isa`` in flight on one core: the peak loop's throughput over one chain's.

    One chain runs at one instruction per latency; :data:`PEAK_CHAINS` chains at the unit's issue
    rate. Each is the best of ``rounds`` turns, so a busy neighbour slows neither the answer.
    Only an :attr:`~.isa.DotProductISA.accumulating` ISA can be measured so (``ValueError`` for
    another: LLVM hoists its step out of the loop, and the ratio read 0.4 on a Zen 3's AVX2).

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> here = X86_VNNI.supports(tvm.target.Target(host_target()))
    >>> not here or 1.0 <= measure_chains_in_flight(X86_VNNI, rounds=1) <= PEAK_CHAINS
    True
    """
    if not isa.accumulating:
        raise ValueError(f"isa: {isa.name}'s step is not one accumulating instruction, so a register-only "
                         f"loop does not measure it; measurable: "
                         f"{', '.join(i.name for i in ISAS if i.accumulating)}")
    one, peak = 0.0, 0.0
    for _ in range(rounds):  # in turns: a slow spell of the machine falls on both
        one = max(one, chain_gops(isa, 1, 1, iters=50_000, repeat=3, min_ms=20, settle_threads=False))
        peak = max(peak, chain_gops(isa, 1, PEAK_CHAINS, iters=50_000, repeat=3, min_ms=20, settle_threads=False))
    return round(peak / one, 2)


def _facts_path() -> str:
    return os.path.join(cache_dir("cpu"), "dot_chains.json")


def _machine_key(isa: DotProductISA) -> str:
    # Not measure.machine(): it asks TVM's pool its size, which starts the pool in a compiling process.
    from ..measure import cpu_name

    return f"{isa.name}|{host_target()}|{cpu_name()}"


def _read_facts(path: str) -> Dict[str, dict]:
    try:
        with open(path) as handle:
            facts = json.load(handle)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        logger.warning("CPU facts %s: damaged (%s); measuring again", path, err)
        return {}
    if not isinstance(facts, dict):
        logger.warning("CPU facts %s: damaged (not a JSON object); measuring again", path)
        return {}
    return facts


def _cached_chains(isa: DotProductISA) -> Optional[float]:
    path, key = _facts_path(), _machine_key(isa)
    facts = _read_facts(path)
    record = facts.get(key)
    if isinstance(record, dict) and isinstance(record.get("chains"), (int, float)) and record["chains"] >= 1:
        return float(record["chains"])
    if record is not None:
        logger.warning("CPU facts %s: damaged record for %s; measuring again", path, key)
    try:
        chains = measure_chains_in_flight(isa)
    except Exception as err:  # noqa: BLE001 -- a failed probe must not fail the user's build
        logger.warning("could not measure %s's instructions in flight (%s): its default tiles are used",
                       isa.name, err)
        return None
    facts[key] = {"chains": chains}
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_path(path) as partial, open(partial, "w") as handle:
            json.dump(facts, handle, indent=1, sort_keys=True)
    except OSError as err:
        logger.warning("CPU facts %s: not written (%s); measured again by the next process", path, err)
    return chains


def _runs_here(isa: DotProductISA, target) -> bool:
    host = tvm.target.Target(host_target())
    return (str(target.attrs.get("mcpu", "")) == str(host.attrs.get("mcpu", ""))
            and bool(isa.supports(host)) and bool(isa.supports(target)))


def chains_in_flight(isa: DotProductISA, target=None) -> Optional[float]:
    """Instructions of ``isa`` in flight on ``target``'s CPU (default: the current target), or None
    where unknown.

    :data:`CHAINS_ENV` first; else, for a target of this machine's CPU, the measured number (once
    per machine, then from the cache file); else None.

    Examples
    --------
    >>> from tvm_tcutils.dotprod.isa import X86_VNNI
    >>> import tvm
    >>> chains_in_flight(X86_VNNI, tvm.target.Target("llvm -mcpu=icelake-server")) is None \\
    ...     or "icelake" in host_target()
    True
    """
    stated = os.environ.get(CHAINS_ENV, "").strip()
    if stated:
        try:
            value = float(stated)
        except ValueError:
            raise ValueError(f"{CHAINS_ENV} must be a number of instructions in flight (e.g. 4), "
                             f"got {stated!r}") from None
        if value < 0:
            raise ValueError(f"{CHAINS_ENV} must be >= 0 (0: unknown), got {stated!r}")
        return value or None
    target = tvm.target.Target.current(allow_none=True) if target is None else target
    if target is None or target.kind.name != "llvm" or not _runs_here(isa, target):
        return None
    key = isa.name
    with _LOCK:
        if key not in _MEASURED:
            _MEASURED[key] = _cached_chains(isa)
        return _MEASURED[key]
