"""The machine's side of AMX: whether this process may run tile kernels, and why not.

Linux keeps the AMX tile data (8 KiB a thread) out of a process's saved state until the process asks
for it: ``arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)``. Without that request the first tile
instruction dies with SIGILL. The permission is the process's (every thread, kept across ``fork``,
cleared by ``exec``), so the package's tile kernels also request it themselves, once per loaded module,
at their first call (:mod:`tvm_tcutils.dotprod.topi.tiles`): a library exported and run by TVM's C++
runtime, an AutoTVM measuring server or an RPC session then work without this package imported.

Here the package decides at build time: on a host whose CPU has the tile engine, kernels are built for
it only where CPUID lists the tile palette the kernels configure and the request succeeds (a hypervisor
may report AMX with no palette, or not enable its state, which the kernel then refuses); otherwise the
target's 4-way dot-product kernels are built, with one warning. A host without the engine builds what
the target names (cross-compilation). ``TCUTILS_AMX=0`` turns the tile kernels off, as
``ONEDNN_MAX_CPU_ISA`` does for oneDNN.
"""
from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import functools
import mmap
import os
import platform
import warnings
from typing import Callable, Iterator, Optional, Tuple

#: ``arch_prctl`` numbers (x86-64 Linux): the syscall, the permission request, the tile data feature.
SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA = 158, 0x1023, 18

#: The environment variable that turns the tile kernels off (``0``, ``off``, ``no``, ``false``).
ENV = "TCUTILS_AMX"

#: /proc/cpuinfo flags of the engine the kernels use.
CPU_FLAGS = ("amx_tile", "amx_int8")


_REFERENCE: contextvars.ContextVar = contextvars.ContextVar("tcutils_reference_tiles", default=False)


@contextlib.contextmanager
def reference_tiles() -> Iterator[None]:
    """Within it, tile kernels are built in the reference form (:mod:`.topi.tiles`: plain code with the
    tiles' semantics, runs on any CPU), whatever this machine has.

    Examples
    --------
    >>> with reference_tiles():
    ...     inside = in_reference_form()
    >>> inside, in_reference_form()
    (True, False)
    """
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)


def in_reference_form() -> bool:
    """Whether tile kernels built now take the reference form."""
    return bool(_REFERENCE.get())


@dataclasses.dataclass(frozen=True)
class AmxState:
    """What this process found out about AMX.

    Parameters
    ----------
    host_has : bool
        The CPU reports the tile engine (``amx_tile`` and ``amx_int8`` in /proc/cpuinfo).
    usable : bool
        Tile kernels may run in this process.
    reason : str
        Why not (or what granted it), one line.
    """

    host_has: bool
    usable: bool
    reason: str


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset:
    """The first processor's flags in ``path`` (empty where it cannot be read).

    Examples
    --------
    >>> isinstance(cpu_flags(), frozenset)
    True
    """
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


#: x86-64 machine code of ``void cpuid(uint32 leaf, uint32 subleaf, uint32 out[4])`` (System V ABI):
#: push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx; cpuid; mov [r8], eax; mov [r8+4], ebx;
#: mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret. Python has no CPUID, and /proc/cpuinfo has no
#: tile palette.
_CPUID_CODE = bytes.fromhex("53" "89f8" "89f1" "4989d0" "0fa2" "418900" "41895804" "41894808" "4189500c" "5b" "c3")

#: CPUID leaf of the tile palettes.
TILE_LEAF = 0x1D

#: The palette the kernels configure and its geometry: tile registers, rows a tile, bytes a row. The
#: ISA row (:data:`~.isa.x86_amx.X86_AMX`) takes its geometry from here (this module imports no ISA).
PALETTE, TILES, ROWS, ROW_BYTES = 1, 8, 16, 64


@functools.lru_cache(maxsize=None)
def _cpuid_function():
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):  # W^X systems refuse writable + executable pages
        return None
    page.write(_CPUID_CODE)
    address = ctypes.addressof(ctypes.c_char.from_buffer(page))
    function = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint32 * 4))(address)
    function.page = page  # the code lives as long as the function
    return function


def cpuid(leaf: int, subleaf: int = 0) -> Optional[Tuple[int, int, int, int]]:
    """``(eax, ebx, ecx, edx)`` of CPUID ``leaf`` / ``subleaf``; ``None`` off x86-64 or where no
    executable page may be made.

    Examples
    --------
    >>> regs = cpuid(0)
    >>> regs is None or len(regs) == 4
    True
    """
    function = _cpuid_function()
    if function is None:
        return None
    out = (ctypes.c_uint32 * 4)()
    function(leaf, subleaf, ctypes.byref(out))
    return tuple(int(v) for v in out)


def palette_problem(query: Callable[[int, int], Optional[Tuple[int, int, int, int]]] = cpuid) -> str:
    """Why the CPU's tile palettes (CPUID leaf 0x1D, from ``query``) cannot hold the kernels' tiles, or
    ``""``: the kernels configure palette :data:`PALETTE` with :data:`TILES` registers of
    :data:`ROWS` x :data:`ROW_BYTES`, and some hypervisors report AMX with no palette behind it. ``""`` too where
    CPUID cannot be asked (the permission request still decides).

    Examples
    --------
    >>> palette_problem(lambda leaf, sub: (0x1D, 0, 0, 0) if leaf == 0 else (0, 0, 0, 0))
    'CPUID leaf 0x1D lists no tile palette 1 (its highest is 0)'
    >>> good = {0: (0x1D, 0, 0, 0), (0x1D, 0): (1, 0, 0, 0), (0x1D, 1): (0x4002000, 0x80040, 16, 0)}
    >>> palette_problem(lambda leaf, sub: good[leaf] if leaf == 0 else good[(leaf, sub)])
    ''
    """
    highest = query(0, 0)
    if highest is None:
        return ""
    if highest[0] < TILE_LEAF:
        return f"CPUID reports no tile leaf 0x{TILE_LEAF:X} (highest leaf 0x{highest[0]:X})"
    palettes = query(TILE_LEAF, 0)[0]
    if palettes < PALETTE:
        return f"CPUID leaf 0x{TILE_LEAF:X} lists no tile palette {PALETTE} (its highest is {palettes})"
    eax, ebx, ecx, _ = query(TILE_LEAF, PALETTE)
    row_bytes, names, rows = ebx & 0xFFFF, ebx >> 16, ecx & 0xFFFF
    if row_bytes < ROW_BYTES or names < TILES or rows < ROWS:
        return (f"tile palette {PALETTE} has {names} tiles of {rows} x {row_bytes} bytes; the kernels "
                f"need {TILES} of {ROWS} x {ROW_BYTES}")
    return ""


def _request_tile_state() -> int:
    """0 when the kernel grants the tile state to this process, else the errno."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0:
        return 0
    return ctypes.get_errno() or -1


def decide(flags: frozenset, env: Optional[str], request: Callable[[], int],
           palette: Callable[[], str] = lambda: "") -> AmxState:
    """The state from the CPU's ``flags``, the :data:`ENV` value, the ``palette`` check
    (:func:`palette_problem`) and the permission ``request`` (the last two called only where the CPU
    has the engine and nothing turned it off).

    Examples
    --------
    >>> decide(frozenset({"amx_tile", "amx_int8"}), None, lambda: 0).usable
    True
    >>> print(decide(frozenset({"amx_tile", "amx_int8"}), None, lambda: 22).reason)
    Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: errno 22, Invalid argument)
    >>> decide(frozenset({"amx_tile", "amx_int8"}), "0", lambda: 0).reason
    'turned off by TCUTILS_AMX=0'
    >>> decide(frozenset({"avx512_vnni"}), None, lambda: 0).host_has
    False
    >>> decide(frozenset({"amx_tile", "amx_int8"}), None, lambda: 0, lambda: "no palette 1").reason
    'no palette 1'
    """
    host_has = all(flag in flags for flag in CPU_FLAGS)
    if not host_has:
        return AmxState(False, False, f"this CPU reports no {' and '.join(CPU_FLAGS)}")
    if env is not None and env.strip().lower() in ("0", "off", "no", "false"):
        return AmxState(True, False, f"turned off by {ENV}={env}")
    problem = palette()
    if problem:
        return AmxState(True, False, problem)
    err = request()
    if err:
        why = os.strerror(err) if err > 0 else "unknown error"
        return AmxState(True, False, f"Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM: "
                                     f"errno {err}, {why})")
    return AmxState(True, True, "tile state granted to this process")


@functools.lru_cache(maxsize=None)
def _state_for(pid: int) -> AmxState:
    return decide(cpu_flags(), os.environ.get(ENV), _request_tile_state, palette_problem)


def state() -> AmxState:
    """This process's :class:`AmxState` (asked once a process: the permission survives ``fork``).

    Examples
    --------
    >>> state().usable in (True, False)
    True
    """
    return _state_for(os.getpid())


def refresh() -> AmxState:
    """Forget the answer (after :data:`ENV` changed) and ask again."""
    _state_for.cache_clear()
    _warned.clear()
    return state()


_warned: set = set()


def allowed_for(target) -> bool:
    """Whether kernels for ``target`` (whose features name the tile engine) may use it: always for a host
    without the engine or in the reference form (nothing runs the tiles here); on a host with it, where
    :func:`state` is usable -- else one warning per process and reason, and the vector kernels.

    Examples
    --------
    >>> with reference_tiles():
    ...     allowed_for(None)
    True
    """
    if in_reference_form():
        return True
    current = state()
    if current.usable:
        return True
    if current.host_has:
        if current.reason not in _warned:
            _warned.add(current.reason)
            warnings.warn(f"tvm_tcutils: AMX kernels not built ({current.reason}); building the "
                          "AVX-512 VNNI kernels instead", RuntimeWarning, stacklevel=2)
        return False
    # Cross-compiling for a CPU this host is not: the target decides, its code runs elsewhere.
    env = os.environ.get(ENV)
    return not (env is not None and env.strip().lower() in ("0", "off", "no", "false"))
