"""Validation of a command's arguments, before any work: rules as data, one line per failure.

Each command lists its checks as :class:`Check` rows (the option as the user
typed it, the ``argparse`` destination, the rule) and calls :func:`validate`
first thing, before loading a model: a bad target, toolchain, number or
output path then fails in seconds with a :class:`CommandError` naming the
option, instead of after minutes of building and timing. A rule is a function
``rule(value, option, args)`` that raises :class:`CommandError`; options left
unset (``None``) are not checked.

Examples
--------
>>> import argparse
>>> args = argparse.Namespace(repeat=0)
>>> validate(args, [Check("--repeat", "repeat", at_least(1))])
Traceback (most recent call last):
...
tvm_tcutils.commands._common.CommandError: --repeat must be at least 1, got 0
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
from typing import Any, Callable, Iterable, Optional

from ..files import can_create_in
from ._common import CommandError

#: A rule: ``rule(value, option, args)``; raises CommandError when ``value`` is not acceptable.
Rule = Callable[[Any, str, argparse.Namespace], None]


@dataclasses.dataclass(frozen=True)
class Check:
    """One argument to check: the option as typed (``--target``), its ``argparse`` destination, the rule.

    Examples
    --------
    >>> Check("--trials", "trials", at_least(1)).option
    '--trials'
    """

    option: str
    dest: str
    rule: Rule


def validate(args: argparse.Namespace, checks: Iterable[Check]) -> None:
    """Apply ``checks`` to ``args`` in order; the first failure raises :class:`CommandError`.

    Examples
    --------
    >>> validate(argparse.Namespace(trials=3, log=None),
    ...          [Check("--trials", "trials", at_least(1)), Check("--log", "log", new_or_log_file)])
    """
    for check in checks:
        value = getattr(args, check.dest, None)
        if value is not None:
            check.rule(value, check.option, args)


# ---------------------------------------------------------------------------
# Numbers
# ---------------------------------------------------------------------------
def at_least(minimum: float) -> Rule:
    """A rule: the value is at least ``minimum``.

    Examples
    --------
    >>> at_least(1)(2, "--repeat", argparse.Namespace())
    >>> at_least(0.0)(-0.5, "--pad-fraction", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --pad-fraction must be at least 0.0, got -0.5
    """
    def rule(value: float, option: str, args: argparse.Namespace) -> None:
        if not value >= minimum:  # "not >=" also refuses NaN
            raise CommandError(f"{option} must be at least {minimum}, got {value}")
    return rule


def positive(value: float, option: str, args: argparse.Namespace) -> None:
    """The value is greater than 0 (a time, a fraction of work).

    Examples
    --------
    >>> positive(0.0, "--timeout", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --timeout must be greater than 0, got 0.0
    """
    if not value > 0:
        raise CommandError(f"{option} must be greater than 0, got {value}")


# ---------------------------------------------------------------------------
# Targets
# ---------------------------------------------------------------------------
#: Forms of a target string, shown when one cannot be parsed.
TARGET_FORMS = ("llvm", "llvm -mcpu=NAME", "llvm -mcpu=NAME -mattr=+FEATURE", "cuda -arch=sm_80")

#: Prefixes of LLVM CPU features whose instructions compute kernels use: code built for a CPU with
#: one of them dies with SIGILL on a CPU without it. Other features (mwaitx, pku, ...) do not
#: appear in kernels, so a CPU model name differing in those still runs here.
COMPUTE_FEATURE_PREFIXES = ("sse", "ssse", "avx", "amx", "fma", "f16c", "neon", "sve", "dotprod", "i8mm")


def _parse_target(text: str, option: str):
    from .._tvm import tvm

    forms = ", ".join(f"'{form}'" for form in TARGET_FORMS)
    if not text.strip():
        raise CommandError(f"{option} is empty; use a TVM target such as {forms}")
    try:
        return tvm.target.Target(text)
    # What TVM raises for an unknown kind or attribute (ValueError) or an unparsable string.
    except (ValueError, tvm.TVMError) as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = lines[-1].split(". Target creation")[0] if lines else type(err).__name__
        reason = reason.removeprefix("ValueError: ").removeprefix("TVMError: ")
        raise CommandError(f"{option} {text!r}: not a TVM target ({reason}); use e.g. {forms}") from None


def _llvm_cannot_run_here(target) -> Optional[str]:
    """Why code for an LLVM ``target`` cannot run on this CPU, or None."""
    from .._tvm import tvm

    codegen = tvm.target.codegen
    triple = str(target.attrs.get("mtriple") or "")
    system = str(codegen.llvm_get_system_triple())
    if triple and triple.split("-")[0] != system.split("-")[0]:
        return f"it is for {triple}, this machine is {system}"
    cpu = str(target.attrs.get("mcpu") or "")
    # The CPU list from a target without the -mcpu in question: LLVM logs an error for an unknown one.
    plain = tvm.target.Target("llvm" + (f" -mtriple={triple}" if triple else ""))
    if cpu and cpu not in {str(name) for name in codegen.llvm_get_cpu_archlist(plain)}:
        return f"LLVM knows no CPU {cpu!r} (e.g. -mcpu={codegen.llvm_get_system_cpu()}, this one)"
    reported = tvm.get_global_func("tvm.codegen.llvm.GetHostCPUFeatures")()
    host = {str(name): bool(on) for name, on in dict(reported).items()}
    missing = sorted(str(f) for f in codegen.llvm_get_cpu_features(target)
                     if host.get(str(f)) is False and str(f).startswith(COMPUTE_FEATURE_PREFIXES))
    if missing:
        return f"this CPU lacks {', '.join(missing)}: its code would stop with an illegal instruction"
    return None


def runnable_target(text: str, option: str, args: argparse.Namespace) -> None:
    """A TVM target whose code can run here: it parses, its device exists, an LLVM CPU this one can run.

    Examples
    --------
    >>> runnable_target("llvm", "--target", argparse.Namespace())
    >>> runnable_target("banana", "--target", argparse.Namespace())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --target 'banana': not a TVM target (Target kind ...
    """
    from .._tvm import tvm

    target = _parse_target(text, option)
    if getattr(args, "rpc_key", None):  # runs on the RPC servers of the key, not here (cross-compiled)
        return
    kind = str(target.kind.name)
    if kind == "llvm":
        reason = _llvm_cannot_run_here(target)
        if reason:
            raise CommandError(f"{option} {text!r}: cannot run here: {reason}")
        return
    if not tvm.device(kind).exist:
        raise CommandError(f"{option} {text!r}: no {kind} device on this machine; "
                           "this command runs the code it builds (use an llvm target)")


#: What ``--target`` may say for an emulated Hexagon run, besides a full C-source Hexagon target.
HEXAGON_ALIAS = "hexagon"


def hexagon_target(text: Optional[str]):
    """The C-source Hexagon target ``--target`` names for ``--emulate`` (``hexagon`` or None: the default).

    Raises :class:`CommandError` for another target, or when the emulation tools are missing
    (before any model is loaded).

    Examples
    --------
    >>> hexagon_target("llvm")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --target 'llvm': --emulate runs Hexagon HVX: use --target hexagon ...
    """
    from ..dotprod import hexagon_model, hexagon_profile

    try:
        target = hexagon_model.check_target(None if text in (None, HEXAGON_ALIAS) else text)
    except ValueError as err:
        raise CommandError(f"--target {text!r}: --emulate runs Hexagon HVX: use --target {HEXAGON_ALIAS} or "
                           f"{str(err).split('such as ', 1)[-1]}") from None
    missing = hexagon_profile.missing_profile_tools()
    if missing:
        raise CommandError(f"--emulate needs {', '.join(missing)} (apt-get install qemu-user clang-16 lld-16; "
                           "scripts/test.sh installs them)")
    return target


def emulated_hexagon_target(text: str, option: str, args: argparse.Namespace) -> None:
    """Rule form of :func:`hexagon_target` (the value is converted when the command runs).

    Examples
    --------
    >>> emulated_hexagon_target("cuda", "--target", argparse.Namespace())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --target 'cuda': --emulate runs Hexagon HVX: ...
    """
    hexagon_target(text)


def not_with(other: str) -> Rule:
    """A rule for an option that makes no sense together with ``other``: set at all, it fails.

    Examples
    --------
    >>> not_with("--emulate")(["x.png"], "--plot", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --plot cannot be used with --emulate
    """
    def rule(value: Any, option: str, args: argparse.Namespace) -> None:
        raise CommandError(f"{option} cannot be used with {other}")

    return rule


def one_of(choices, why: str) -> Rule:
    """A rule that takes only ``choices``; ``why`` says what restricts them.

    Examples
    --------
    >>> one_of(("int8",), why="--emulate runs integer models")("float32", "--dtype", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --dtype 'float32': --emulate runs integer models; choose from int8
    """
    def rule(value: Any, option: str, args: argparse.Namespace) -> None:
        if value not in choices:
            raise CommandError(f"{option} {value!r}: {why}; choose from {', '.join(map(str, choices))}")

    return rule


# ---------------------------------------------------------------------------
# Output paths
# ---------------------------------------------------------------------------
def _same_file(a: str, b: Any) -> bool:
    return isinstance(b, str) and os.path.exists(a) and os.path.exists(b) and os.path.samefile(a, b)


def _writable_directory(path: str, option: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise CommandError(f"{option} {path}: directory {directory} does not exist")
    if not can_create_in(directory):
        raise CommandError(f"{option} {path}: directory {directory} is not writable")
    if os.path.isdir(path):
        raise CommandError(f"{option} {path}: is a directory; give a file name")


def model_output(path: str, option: str, args: argparse.Namespace) -> None:
    """Where a model will be saved: a known extension, a writable directory, no file replaced without ``--force``.

    Saving over the input model itself (``-o`` naming the ``MODEL`` file) is an
    update on purpose and needs no ``--force``.

    Examples
    --------
    >>> model_output("/no/such/dir/m.json", "-o", argparse.Namespace(force=False))
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: -o /no/such/dir/m.json: directory /no/such/dir does not exist
    """
    from ..models import ModelError, check_output_path

    overwrite = bool(getattr(args, "force", False)) or _same_file(path, getattr(args, "model", None))
    try:
        check_output_path(path, overwrite=overwrite, argument=option)
    except ModelError as err:
        raise CommandError(str(err)) from None


#: ``--dot`` extension -> the program that renders it (None: written as Graphviz text).
PICTURE_RENDERERS = {".dot": None, ".gv": None, ".svg": "dot", ".png": "dot", ".pdf": "dot"}


def picture_output(path: str, option: str, args: argparse.Namespace) -> None:
    """Where a picture will be written: a known extension, Graphviz for rendered ones, no overwrite without ``--force``.

    Examples
    --------
    >>> picture_output("graph.jpg", "--dot", argparse.Namespace(force=False))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --dot graph.jpg: cannot write '.jpg'; use one of .dot, ...
    """
    ext = os.path.splitext(path)[1].lower()
    if ext not in PICTURE_RENDERERS:
        raise CommandError(f"{option} {path}: cannot write {ext!r}; use one of {', '.join(PICTURE_RENDERERS)}")
    program = PICTURE_RENDERERS[ext]
    if program and shutil.which(program) is None:
        raise CommandError(f"{option} {path}: rendering {ext} needs Graphviz's '{program}' program, "
                           "not found on PATH; install Graphviz or write a .dot file")
    _writable_directory(path, option)
    if os.path.exists(path) and not getattr(args, "force", False):
        raise CommandError(f"{option} {path}: already exists; choose another path or overwrite (--force)")


def plot_output(path: str, option: str, args: argparse.Namespace) -> None:
    """Where a bar chart will be drawn: .png/.svg/.pdf in a writable directory, matplotlib installed.

    Examples
    --------
    >>> plot_output("speedup.txt", "--plot", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --plot speedup.txt: cannot write '.txt'; use one of .png, .svg, .pdf
    """
    from ..bench.plot import check_plot_path

    try:
        check_plot_path(path)
    except ValueError as err:
        raise CommandError(str(err).replace("--plot", option, 1)) from None


def appendable_file(path: str, option: str, args: argparse.Namespace) -> None:
    """A file lines will be appended to: its directory exists and is writable, the file (if any) too.

    Examples
    --------
    >>> appendable_file("/no/such/dir/x.log", "--log", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --log /no/such/dir/x.log: directory /no/such/dir does not exist
    """
    _writable_directory(path, option)
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise CommandError(f"{option} {path}: is not writable")


def cache_directory(path: str, option: str, args: argparse.Namespace) -> None:
    """A directory the command may create and write: not a file, writable where it exists.

    Examples
    --------
    >>> import tempfile
    >>> cache_directory(tempfile.mkdtemp(), "--cache-dir", argparse.Namespace())
    """
    if not path:  # "" turns the cache off
        return
    existing = os.path.abspath(path)
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise CommandError(f"{option} {path}: {existing} is a file, not a directory")
    if not can_create_in(existing):
        raise CommandError(f"{option} {path}: {existing} is not writable")


# ---------------------------------------------------------------------------
# AutoTVM logs
# ---------------------------------------------------------------------------
def _log_problem(path: str) -> Optional[str]:
    """Why ``path`` is not an AutoTVM log (None when it is one, or is empty).

    Reads up to the first record AutoTVM can decode: a log whose first lines
    are damaged but that holds records is still a log (the reader skips the
    damaged lines with a warning).
    """
    from tvm import autotvm

    from ..tuning import _DECODE_ERRORS

    first_bad = None
    try:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    first_bad = first_bad or (number, "not UTF-8 text")
                    continue
                if not line.strip() or line.startswith("#"):
                    continue
                try:
                    if autotvm.record.decode(line) is not None:
                        return None
                except _DECODE_ERRORS as err:
                    first_bad = first_bad or (number, f"{type(err).__name__}: {err}"[:120])
                    continue
                first_bad = first_bad or (number, "not a record")
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if first_bad is None:
        return None
    number, reason = first_bad
    return f"not an AutoTVM log: no line is a tuning record (line {number}: {reason})"


def existing_log(path: str, option: str, args: argparse.Namespace) -> None:
    """An AutoTVM log to apply: it exists and holds at least one record.

    Examples
    --------
    >>> existing_log("/no/such.log", "--log", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --log /no/such.log: no such file
    """
    if not os.path.isfile(path):
        raise CommandError(f"{option} {path}: no such file")
    problem = _log_problem(path)
    if problem:
        raise CommandError(f"{option} {path}: {problem}")


def npz_file(path: str, option: str, args: argparse.Namespace) -> None:
    """A NumPy ``.npz`` file of named arrays that loads (sample inputs).

    Examples
    --------
    >>> npz_file("/no/such.npz", "--sample-inputs", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --sample-inputs /no/such.npz: no such file
    """
    import zipfile

    import numpy as np

    if not os.path.isfile(path):
        raise CommandError(f"{option} {path}: no such file")
    try:
        with np.load(path, allow_pickle=False) as data:
            if not isinstance(data, np.lib.npyio.NpzFile) or not data.files:
                raise ValueError("not an .npz file of named arrays (numpy.savez)")
            for name in data.files:
                data[name]  # every array must read, before the model loads
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        raise CommandError(f"{option} {path}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                           ) from None


def new_or_log_file(path: str, option: str, args: argparse.Namespace) -> None:
    """An AutoTVM log to append to and resume from: writable, and a log if it exists.

    Examples
    --------
    >>> import os, tempfile
    >>> new_or_log_file(os.path.join(tempfile.mkdtemp(), "new.log"), "--log", argparse.Namespace())
    """
    appendable_file(path, option, args)
    if os.path.isfile(path):
        problem = _log_problem(path)
        if problem:
            raise CommandError(f"{option} {path}: {problem}; tune appends to it: "
                               "name a new file or a log that 'tvm-tcutils tune' wrote")


# ---------------------------------------------------------------------------
# Collage toolchains
# ---------------------------------------------------------------------------
def measured_toolchains(text: str, option: str, args: argparse.Namespace) -> None:
    """Toolchains for a measured search: at least one, each known, available and buildable here.

    A toolchain whose partitions cannot be built (its ``relay.ext.<compiler>``
    codegen is missing from this TVM) would get infinite measured costs and
    never be chosen: it is refused instead.

    Examples
    --------
    >>> measured_toolchains("tvm", "--toolchains", argparse.Namespace())
    >>> measured_toolchains("", "--toolchains", argparse.Namespace())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --toolchains is empty; name at least one of ...
    """
    from ..collage.toolchains import known, resolve

    table = known()
    usable = ", ".join(name for name, tc in table.items() if tc.availability()[0] and tc.buildable())
    names = [name.strip() for name in text.split(",")]
    if not any(names):
        raise CommandError(f"{option} is empty; name at least one of {usable} (or leave it out for the default)")
    if not all(names):
        raise CommandError(f"{option} {text!r}: an empty name between commas; usable here: {usable}")
    unknown = [name for name in names if name not in table]
    if unknown:
        raise CommandError(f"{option} {text!r}: unknown toolchain {unknown[0]!r}; available: {usable}")
    try:
        chosen = resolve(names)
    except ValueError as err:  # not available here (a missing Python module), two TVM toolchains
        raise CommandError(f"{option} {text!r}: {str(err).removeprefix('toolchains: ')}") from None
    unbuildable = [tc for tc in chosen if not tc.buildable()]
    if unbuildable:
        raise CommandError(
            f"{option} {text!r}: {', '.join(tc.name for tc in unbuildable)} cannot be built here (this TVM "
            f"has no {', '.join(f'relay.ext.{tc.compiler}' for tc in unbuildable)} codegen), so its costs "
            f"cannot be measured; usable here: {usable}"
        )


def max_depths(spec: str, option: str, args: argparse.Namespace) -> None:
    """A ``NAME=N,...`` spec of maximum depths, for toolchains among ``--toolchains``.

    Examples
    --------
    >>> max_depths("tvm=0", "--max-depth", argparse.Namespace(toolchains="tvm"))
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --max-depth 'tvm=0': expected NAME=N with N >= 1, got 'tvm=0'
    """
    from ..collage.toolchains import resolve, with_max_depth

    try:
        with_max_depth(resolve(getattr(args, "toolchains", None)), spec)
    except ValueError as err:
        raise CommandError(f"{option} {spec!r}: {str(err).removeprefix('max depth: ')}") from None


# ---------------------------------------------------------------------------
# Names
# ---------------------------------------------------------------------------
def dtype(text: str, option: str, args: argparse.Namespace) -> None:
    """A TVM data type name (``int32``, ``float16``...).

    Examples
    --------
    >>> dtype("int33x", "--out-dtype", argparse.Namespace())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --out-dtype 'int33x': not a data type ...
    """
    from .._tvm import tvm

    try:
        tvm.runtime.DataType(text)
    except (ValueError, tvm.TVMError):
        raise CommandError(f"{option} {text!r}: not a data type (e.g. int32, float32, int8)") from None


def op_names(names, option: str, args: argparse.Namespace) -> None:
    """Relay operator names (``nn.conv2d``, ``nn.dense``...).

    Examples
    --------
    >>> op_names(["nn.conv2d", "nn.dens"], "--ops", argparse.Namespace())
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --ops: 'nn.dens' is not a registered Relay operator; ...
    """
    from ..tensorcore._graph import resolve_ops  # the passes' own check, with its suggestions

    try:
        resolve_ops(list(names), option)
    except ValueError as err:
        raise CommandError(str(err)) from None


#: What every command with the shared ``MODEL`` argument checks (see ``_common.add_model_argument``).
MODEL_CHECKS = (Check("--batch-size", "batch_size", at_least(1)),)


# ---------------------------------------------------------------------------
# Measuring through TVM's RPC tracker
# ---------------------------------------------------------------------------
def rpc_tracker(text: str, option: str, args: argparse.Namespace) -> None:
    """``HOST:PORT`` of an RPC tracker, given with a device key.

    Examples
    --------
    >>> rpc_tracker("localhost", "--rpc-tracker", argparse.Namespace(rpc_key="k"))
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --rpc-tracker 'localhost': expected HOST:PORT, e.g. 127.0.0.1:9190
    >>> rpc_tracker("127.0.0.1:9190", "--rpc-tracker", argparse.Namespace(rpc_key=None))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: --rpc-tracker needs --rpc-key KEY ...
    """
    from ..rpc import parse_tracker

    try:
        parse_tracker(text, option)
    except ValueError as err:
        raise CommandError(str(err)) from None
    if not getattr(args, "rpc_key", None):
        raise CommandError(f"{option} needs --rpc-key KEY (the device key its servers registered with)")


def rpc_device(key: str, option: str, args: argparse.Namespace) -> None:
    """A device key whose tracker answers (in seconds) and has at least one server for it.

    Examples
    --------
    >>> rpc_device("k", "--rpc-key", argparse.Namespace(rpc_tracker="127.0.0.1:1", rpc_key="k"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.commands._common.CommandError: RPC tracker 127.0.0.1:1 is not reachable (...
    """
    from ..rpc import RPCError
    from ._common import rpc_backend

    try:
        rpc_backend(args).servers()  # CommandError without a tracker
    except (RPCError, ValueError) as err:
        raise CommandError(str(err)) from None


#: The checks of the ``--rpc-*`` arguments (see ``_common.add_rpc_arguments``): the tracker is reached
#: (a few seconds at most) before any model is loaded.
RPC_CHECKS = (Check("--rpc-tracker", "rpc_tracker", rpc_tracker), Check("--rpc-key", "rpc_key", rpc_device))
