"""C replicas of the AMX tile programs, compiled and run here: the probes' machinery (scripts/probe_amx_*.py).

A probe is a C program (tile intrinsics from ``immintrin.h``) that asks for the tile state itself and prints
its timings on stdout; :func:`run_program` compiles it with clang or gcc for the tile ISA and runs it, after
checking that this machine can (a CPU without AMX-INT8 would stop at the first tile instruction).
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
from typing import List, Sequence

from .results import add_json_argument

#: Compilers tried, in order.
COMPILERS = ("clang-16", "clang", "gcc")


def unavailable() -> str:
    """Why the probes cannot run here ("" when they can).

    Examples
    --------
    >>> isinstance(unavailable(), str)
    True
    """
    if not any(shutil.which(name) for name in COMPILERS):
        return f"no C compiler ({', '.join(COMPILERS)}) on PATH"
    try:
        with open("/proc/cpuinfo") as info:
            if "amx_int8" not in info.read():
                return "this CPU has no AMX-INT8 (amx_int8 in /proc/cpuinfo): the probe runs tile code"
    except OSError:
        return "no /proc/cpuinfo: cannot tell whether this CPU has AMX-INT8"
    return ""


def run_program(program: str, args: Sequence[str], flags: Sequence[str] = ()) -> str:
    """Compile ``program`` (C, ``-O2 -mamx-tile -mamx-int8 -mavx512f`` and ``flags``), run it with ``args``
    and return its stdout; ``RuntimeError`` naming the reason where this machine cannot.

    Examples
    --------
    >>> run_program("int main(void) { return 0; }", []) if not unavailable() else ""
    ''
    """
    reason = unavailable()
    if reason:
        raise RuntimeError(reason)
    compiler = next(shutil.which(name) for name in COMPILERS if shutil.which(name))
    with tempfile.TemporaryDirectory() as work:
        source, binary = os.path.join(work, "probe.c"), os.path.join(work, "probe")
        with open(source, "w") as handle:
            handle.write(program)
        built = subprocess.run([compiler, "-O2", "-mamx-tile", "-mamx-int8", "-mavx512f", *flags, "-o", binary,
                                source], capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError(f"{os.path.basename(compiler)} failed: {built.stderr.strip()[-500:]}")
        ran = subprocess.run([binary, *args], capture_output=True, text=True)
        if ran.returncode:
            raise RuntimeError(f"the probe exited with status {ran.returncode}: {ran.stderr.strip()[-500:]}")
        return ran.stdout


def probe_arguments(description: str, script: str, iterations: int, per: str, argv=None) -> argparse.Namespace:
    """A probe script's command line: ``--iterations`` (``per`` a timing), ``--tsc-ghz``, ``--json``.

    Examples
    --------
    >>> probe_arguments("p", "probe_x", 10, "runs", ["--tsc-ghz", "2.6"]).iterations
    10
    """
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--iterations", type=int, default=iterations, help=f"{per} per timing")
    parser.add_argument("--tsc-ghz", type=float, default=None,
                        help="time-stamp counter frequency, to print times too (/proc/cpuinfo's MHz in a VM)")
    add_json_argument(parser, script)
    args = parser.parse_args(argv)
    if args.iterations < 1:
        parser.error(f"--iterations must be at least 1, got {args.iterations}")
    return args


def probe_rows(program: str, iterations: int, flags: Sequence[str] = ()) -> List[List[str]]:
    """The words of each line :func:`run_program` prints for ``iterations``; ``SystemExit`` with the reason
    where it cannot run (what a script says in one line)."""
    try:
        return [line.split() for line in run_program(program, [str(iterations)], flags).splitlines()]
    except RuntimeError as err:
        raise SystemExit(str(err))
