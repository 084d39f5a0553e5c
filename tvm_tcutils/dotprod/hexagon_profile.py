"""Instruction profiles of whole integer models on emulated Hexagon: :func:`profile_model`.

:func:`~tvm_tcutils.dotprod.hexagon_model.run_model` runs a model's C build under
``qemu-hexagon``; this module runs it the same way with a small TCG plugin
(:data:`PLUGIN_SOURCE`, compiled for the host with clang-16 on first use) that counts
what the guest executes:

* **packets**: Hexagon is VLIW, and qemu's plugin interface sees one "instruction" per
  packet (up to 4 instructions issued together; on the chip, about one cycle each without stalls);
* **instructions**: the instructions in those packets (duplex halves counted apart, constant
  extenders ``immext`` and ``nop`` fillers not counted);
* **vrmpy**: HVX ``vrmpy`` instructions. With 128-byte vectors one ``vrmpy`` is 32 lanes of
  4-byte dot products: 128 byte multiply-accumulates (MACs), so a node of ``M`` MACs needs at
  least ``ceil(M / 128)`` of them (:attr:`NodeProfile.ideal_vrmpy`).

The runner calls an empty marker function between graph nodes; the plugin snapshots its
counters each time that function's code runs, so each node's count is everything the node
executed (its parallel ``_compute_`` bodies, the HVX helpers and the runtime functions it
calls included). What is left (reading the inputs, writing the outputs) is the runner's.

Example
-------
>>> from tvm_tcutils.dotprod import hexagon_profile
>>> hexagon_profile.ideal_vrmpy(1000)  # 1000 byte-MACs need 8 vrmpy of 128 MACs
8
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
import os
import re
import struct
import subprocess
import tempfile
import textwrap
from typing import Any, Iterator, List, Mapping, Optional, Sequence, Union

import numpy as np

from .._tvm import hexagon_emulator, tvm
from tvm import relay

from . import hexagon_model, qdq
from .hexagon_model import bit_equal
from .hexagon import missing_tools

#: Byte multiply-accumulates of one HVX 128B ``vrmpy``: 32 lanes of 4-byte dot products.
MACS_PER_VRMPY = 128

#: The TCG plugin. Its declarations of QEMU's plugin API (version 1, as QEMU 7.2 exports it)
#: are written here, because Debian ships neither ``qemu-plugin.h`` nor any plugin.
PLUGIN_SOURCE = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
struct qemu_plugin_insn;
typedef struct qemu_info_t qemu_info_t;
enum qemu_plugin_op { QEMU_PLUGIN_INLINE_ADD_U64 };
enum qemu_plugin_cb_flags { QEMU_PLUGIN_CB_NO_REGS, QEMU_PLUGIN_CB_R_REGS, QEMU_PLUGIN_CB_RW_REGS };
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, struct qemu_plugin_tb*));
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb*);
uint64_t qemu_plugin_tb_vaddr(const struct qemu_plugin_tb*);
struct qemu_plugin_insn* qemu_plugin_tb_get_insn(const struct qemu_plugin_tb*, size_t);
char* qemu_plugin_insn_disas(const struct qemu_plugin_insn*);
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb*, enum qemu_plugin_op, void*, uint64_t);
void qemu_plugin_register_vcpu_tb_exec_cb(struct qemu_plugin_tb*, void (*)(unsigned int, void*),
                                          enum qemu_plugin_cb_flags, void*);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t, void (*)(qemu_plugin_id_t, void*), void*);
__attribute__((visibility("default"))) int qemu_plugin_version = 1;

/* counters[0]: packets, [1]: instructions, [2]: vrmpy. The run is single-threaded. */
static uint64_t counters[3];
static uint64_t* marks;
static size_t n_marks, cap_marks;
static uint64_t mark_address = (uint64_t)-1;
static const char* out_path;

/* One packet as qemu disassembles it: "0xWORD\t{\tinsn" then "0xADDR:  0xWORD\t\tinsn" lines,
   the last ending in " }"; a duplex word holds two instructions separated by ';'. */
static void count_packet(const char* text, uint64_t* insns, uint64_t* vrmpy) {
  char* copy = strdup(text);
  for (char* line = strtok(copy, "\n"); line; line = strtok(NULL, "\n")) {
    char* body = strrchr(line, '\t');
    body = body ? body + 1 : line;
    char* save = NULL;
    for (char* part = strtok_r(body, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
      while (*part == ' ' || *part == '{') part++;
      size_t n = strlen(part);
      while (n && (part[n - 1] == ' ' || part[n - 1] == '}')) part[--n] = 0;
      if (!n || strncmp(part, "immext", 6) == 0 || strcmp(part, "nop") == 0) continue;
      ++*insns;
      if (strstr(part, "vrmpy")) ++*vrmpy;
    }
  }
  free(copy);
}

static void on_mark(unsigned int vcpu, void* data) {
  if (n_marks == cap_marks) {
    cap_marks = cap_marks ? 2 * cap_marks : 256;
    marks = realloc(marks, cap_marks * 3 * sizeof(uint64_t));
    if (!marks) abort();
  }
  memcpy(marks + 3 * n_marks++, counters, sizeof counters);
}

static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb* tb) {
  size_t n = qemu_plugin_tb_n_insns(tb);
  uint64_t insns = 0, vrmpy = 0;
  for (size_t i = 0; i < n; i++) {
    char* text = qemu_plugin_insn_disas(qemu_plugin_tb_get_insn(tb, i));
    if (text) { count_packet(text, &insns, &vrmpy); free(text); }
  }
  /* The marker snapshot comes first, so the marker's own packet is counted after it. */
  if (qemu_plugin_tb_vaddr(tb) == mark_address)
    qemu_plugin_register_vcpu_tb_exec_cb(tb, on_mark, QEMU_PLUGIN_CB_NO_REGS, NULL);
  qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counters[0], n);
  if (insns) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counters[1], insns);
  if (vrmpy) qemu_plugin_register_vcpu_tb_exec_inline(tb, QEMU_PLUGIN_INLINE_ADD_U64, &counters[2], vrmpy);
}

static void on_plugin_exit(qemu_plugin_id_t id, void* data) {
  FILE* f = fopen(out_path, "w");
  if (!f) return;
  fprintf(f, "total %llu %llu %llu\n", (unsigned long long)counters[0], (unsigned long long)counters[1],
          (unsigned long long)counters[2]);
  for (size_t i = 0; i < n_marks; i++)
    fprintf(f, "mark %llu %llu %llu\n", (unsigned long long)marks[3 * i], (unsigned long long)marks[3 * i + 1],
            (unsigned long long)marks[3 * i + 2]);
  fclose(f);
}

__attribute__((visibility("default")))
int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t* info, int argc, char** argv) {
  for (int i = 0; i < argc; i++) {
    if (strncmp(argv[i], "mark=", 5) == 0) mark_address = strtoull(argv[i] + 5, NULL, 0);
    else if (strncmp(argv[i], "out=", 4) == 0) out_path = argv[i] + 4;
  }
  if (!out_path) { fprintf(stderr, "tcu profile plugin: no out=<file> argument\n"); return -1; }
  qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
  qemu_plugin_register_atexit_cb(id, on_plugin_exit, NULL);
  return 0;
}
"""


def cache_dir() -> str:
    """Where the compiled plugin is kept: ``$TVM_TCUTILS_CACHE``, else ``$XDG_CACHE_HOME/tvm_tcutils``
    (``~/.cache/tvm_tcutils``).

    Examples
    --------
    >>> os.path.basename(cache_dir()) != ""
    True
    """
    explicit = os.environ.get("TVM_TCUTILS_CACHE")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tvm_tcutils")


def missing_profile_tools() -> List[str]:
    """The tools a profile needs and PATH lacks: the emulation tools (clang-16 also builds the plugin).

    Examples
    --------
    >>> set(missing_profile_tools()) <= {"clang", "lld", "qemu"}
    True
    """
    return missing_tools()


def _require_tools() -> None:
    missing = missing_profile_tools()
    if missing:
        raise RuntimeError(f"a Hexagon instruction profile needs {', '.join(missing)} "
                           f"(apt-get install qemu-user clang-16 lld-16)")


def plugin_path(directory: Optional[str] = None) -> str:
    """The plugin's shared library, compiled with clang for the host on first use.

    Its name holds a hash of :data:`PLUGIN_SOURCE` and of the compiler's path, so an edited
    source gets a new file; it is written under a temporary name and renamed into place
    (atomic), so concurrent first uses never load a half-written library.

    Raises
    ------
    RuntimeError
        When clang is missing or fails.

    Examples
    --------
    >>> path = plugin_path()  # doctest: +SKIP
    >>> path.endswith(".so")  # doctest: +SKIP
    True
    """
    _require_tools()
    clang = hexagon_emulator()["clang"]
    directory = directory or cache_dir()
    digest = hashlib.sha256((PLUGIN_SOURCE + "\0" + clang).encode()).hexdigest()[:16]
    path = os.path.join(directory, f"tcu_hexagon_profile_{digest}.so")
    if os.path.exists(path):
        return path
    os.makedirs(directory, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tcu_plugin_", dir=directory) as tmp:
        source = os.path.join(tmp, "plugin.c")
        with open(source, "w") as f:
            f.write(PLUGIN_SOURCE)
        built = os.path.join(tmp, "plugin.so")
        proc = subprocess.run([clang, "-shared", "-fPIC", "-O2", "-w", source, "-o", built],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building the qemu profile plugin with {clang} failed: {proc.stderr[-2000:]}")
        os.replace(built, path)
    return path


def symbol_address(binary: str, name: str) -> int:
    """Address of the symbol ``name`` in the symbol table of a 32-bit little-endian ELF file.

    Read directly (a Hexagon binary is ELF32 LE), so no ``nm`` is needed.

    Raises
    ------
    ValueError
        When the file is no such ELF file or has no symbol ``name``.

    Examples
    --------
    >>> import sys
    >>> symbol_address(sys.executable, "main")
    Traceback (most recent call last):
    ...
    ValueError: ... is not a 32-bit little-endian ELF file
    """
    with open(binary, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF" or data[4] != 1 or data[5] != 1:
        raise ValueError(f"{binary} is not a 32-bit little-endian ELF file")
    shoff, = struct.unpack_from("<I", data, 0x20)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x2E)
    sections = [struct.unpack_from("<IIIIIIIIII", data, shoff + i * shentsize) for i in range(shnum)]
    wanted = name.encode()
    for _, sh_type, _, _, offset, size, link, _, _, entsize in sections:
        if sh_type != 2:  # SHT_SYMTAB
            continue
        strtab_offset = sections[link][4]
        for index in range(size // (entsize or 16)):
            st_name, st_value = struct.unpack_from("<II", data, offset + index * (entsize or 16))
            end = data.index(b"\0", strtab_offset + st_name)
            if data[strtab_offset + st_name:end] == wanted:
                return st_value
    raise ValueError(f"{binary} has no symbol {name!r}")


def ideal_vrmpy(macs: int) -> int:
    """The fewest HVX 128B ``vrmpy`` instructions doing ``macs`` byte multiply-accumulates.

    Examples
    --------
    >>> ideal_vrmpy(128), ideal_vrmpy(129), ideal_vrmpy(0)
    (1, 2, 0)
    """
    return math.ceil(int(macs) / MACS_PER_VRMPY)


def _kernel_out_channels(layout: str, shape: Sequence[int]) -> int:
    """Output channels of a (possibly packed) kernel: the product of its ``O``/``o`` axes."""
    axes = re.findall(r"\d*([A-Za-z])", layout)
    if len(axes) != len(shape):
        raise ValueError(f"kernel layout {layout} does not match shape {tuple(shape)}")
    return int(np.prod([d for axis, d in zip(axes, shape) if axis in "Oo"], dtype=np.int64))


_CONVS = ("nn.conv2d", "qnn.conv2d", "nn.contrib_conv2d_NCHWc", "nn.contrib_depthwise_conv2d_NCHWc",
          "nn.conv1d", "nn.conv3d")
_DENSES = ("nn.dense", "qnn.dense", "nn.contrib_dense_pack", "nn.matmul")


def macs(func: "relay.Function") -> int:
    """Integer multiply-accumulates of the convolutions, dense layers and batch matmuls in ``func``.

    Only ops on integer operands count (the model's 8-bit MACs, which ``vrmpy`` can do; a
    build may widen them to 16 bits first, and a float dense that quantization left counts 0).
    Counted in the layouts the function has, so channels a packed layout pads are counted
    (what the node's code has to compute).

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 3, 8, 8), dtype="int8")
    >>> w = relay.var("w", shape=(16, 3, 3, 3), dtype="int8")
    >>> f = relay.Function([x, w], relay.nn.conv2d(x, w, kernel_size=(3, 3), out_dtype="int32"))
    >>> macs(f) == 16 * 6 * 6 * 3 * 3 * 3
    True
    >>> macs(relay.Function([x, w], relay.nn.conv2d(relay.cast(x, "float32"), relay.cast(w, "float32"))))
    0
    """
    mod = relay.transform.InferType()(tvm.IRModule.from_expr(func))
    total = [0]

    def shape(expr) -> List[int]:
        return [int(d) for d in expr.checked_type.shape]

    def visit(node):
        if not isinstance(node, relay.Call) or not isinstance(node.op, tvm.ir.Op):
            return
        name = node.op.name
        if name not in _CONVS + _DENSES + ("nn.batch_matmul", "qnn.batch_matmul") or len(node.args) < 2:
            return
        if any(not str(arg.checked_type.dtype).startswith(("int", "uint")) for arg in node.args[:2]):
            return
        out = shape(node)
        if name in _CONVS:
            kernel = shape(node.args[1])
            layout = str(node.attrs.kernel_layout)
            per_output = int(np.prod(kernel, dtype=np.int64)) // _kernel_out_channels(layout, kernel)
            total[0] += int(np.prod(out, dtype=np.int64)) * per_output
        elif name in _DENSES:
            total[0] += int(np.prod(out, dtype=np.int64)) * shape(node.args[0])[-1]
        elif name in ("nn.batch_matmul", "qnn.batch_matmul"):
            x = shape(node.args[0])
            k = x[-2] if getattr(node.attrs, "transpose_a", False) else x[-1]
            total[0] += int(np.prod(out, dtype=np.int64)) * k

    relay.analysis.post_order_visit(mod["main"].body, visit)
    return total[0]


@dataclasses.dataclass
class Counts:
    """Executed packets, instructions and HVX ``vrmpy`` instructions (see the module's doc)."""

    packets: int
    instructions: int
    vrmpy: int

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(self.packets - other.packets, self.instructions - other.instructions,
                      self.vrmpy - other.vrmpy)

    def __add__(self, other: "Counts") -> "Counts":
        return Counts(self.packets + other.packets, self.instructions + other.instructions,
                      self.vrmpy + other.vrmpy)


@dataclasses.dataclass
class NodeProfile:
    """One graph node (fused function call): its name, MACs and what it executed."""

    name: str
    macs: int
    counts: Counts

    @property
    def ideal_vrmpy(self) -> int:
        """``ceil(macs / 128)``: the fewest ``vrmpy`` instructions the node's MACs need."""
        return ideal_vrmpy(self.macs)


@dataclasses.dataclass
class Profile:
    """A profiled run: the outputs, the whole run's counts and each node's.

    ``runner`` is what ran outside the nodes (reading inputs and weights, writing outputs):
    ``total`` minus the nodes' sum. ``model_macs`` counts the MACs of the model as given
    (before any layout pads channels); :attr:`macs` sums the nodes' (padding included).
    """

    outputs: List[np.ndarray]
    total: Counts
    nodes: List[NodeProfile]
    model_macs: int = 0

    @property
    def runner(self) -> Counts:
        nodes = Counts(0, 0, 0)
        for node in self.nodes:
            nodes = nodes + node.counts
        return self.total - nodes

    @property
    def macs(self) -> int:
        return sum(node.macs for node in self.nodes)

    @property
    def ideal_vrmpy(self) -> int:
        """``ceil(model_macs / 128)``: the fewest ``vrmpy`` the model's own MACs need."""
        return ideal_vrmpy(self.model_macs)


class _Counter(hexagon_model.Instrument):
    """Runs qemu-hexagon with the plugin watching the runner's marker."""

    def __init__(self, plugin: str):
        super().__init__()
        self.plugin = plugin
        self.total: Optional[Counts] = None
        self.marks: List[Counts] = []

    def qemu_options(self, binary: str, workdir: str) -> List[str]:
        mark = symbol_address(binary, hexagon_model.MARK_SYMBOL)
        # qemu splits the plugin's arguments at commas: the work directory must have none.
        if "," in workdir:
            raise RuntimeError(f"the work directory {workdir!r} holds a comma, which qemu's -plugin cannot pass")
        return ["-plugin", f"{self.plugin},mark={mark:#x},out={os.path.join(workdir, 'profile.txt')}"]

    def collect(self, workdir: str) -> None:
        path = os.path.join(workdir, "profile.txt")
        if not os.path.exists(path):
            raise RuntimeError("the qemu profile plugin wrote no counts (was it loaded?)")
        with open(path) as f:
            for line in f:
                kind, *values = line.split()
                counts = Counts(*(int(v) for v in values))
                if kind == "total":
                    self.total = counts
                else:
                    self.marks.append(counts)


@contextlib.contextmanager
def package_hooks(enabled: bool) -> Iterator[None]:
    """Within the block, the package's TVM hooks are installed (``enabled``) or removed.

    Removing them makes ``relay.build`` use TVM's own legalizations and schedules; whatever
    happens in the block, the hooks are put back as they were.

    Examples
    --------
    >>> import tvm_tcutils
    >>> def installed():  # one of the package's hooks (others, e.g. a test's, may be installed too)
    ...     return ("qnn.quantize", "FTVMQnnLegalize") in {(r.name, r.attr) for r in tvm_tcutils.registered()}
    >>> with package_hooks(False):
    ...     off = installed()
    >>> off, installed()
    (False, True)
    """
    import tvm_tcutils

    was = bool(tvm_tcutils.registered())
    try:
        if enabled:
            tvm_tcutils.register()
        else:
            tvm_tcutils.unregister()
        yield
    finally:
        if was:
            tvm_tcutils.register()
        else:
            tvm_tcutils.unregister()


def plain_target(target: Union[None, str, "tvm.target.Target"] = None) -> "tvm.target.Target":
    """The baseline target of a C-source Hexagon ``target``: the same CPU, the ``cpu`` key only.

    Examples
    --------
    >>> str(plain_target("c -keys=hexagon,cpu -mcpu=hexagonv67"))
    'c -keys=cpu -mcpu=hexagonv67'
    >>> str(plain_target(None)).strip()
    'c -keys=cpu'
    """
    checked = hexagon_model.check_target(target, hexagon_key=False)
    mcpu = str(checked.attrs.get("mcpu", hexagon_model.CPU) or hexagon_model.CPU)
    # The default CPU is left implicit: TVM's CPU strategies ask LLVM about ``-mcpu``, and an
    # x86 LLVM warns once per operator that it does not know hexagonv66.
    return tvm.target.Target("c -keys=cpu" if mcpu == hexagon_model.CPU else f"c -keys=cpu -mcpu={mcpu}")


def profile_model(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None,
                  inputs: hexagon_model.Inputs = (), timeout: float = 600,
                  target: Union[None, str, "tvm.target.Target"] = None,
                  package_schedules: bool = True) -> Profile:
    """:func:`~tvm_tcutils.dotprod.hexagon_model.run_model`, counting what the emulated Hexagon executes.

    Parameters
    ----------
    mod, params, inputs, timeout, target
        As for :func:`~tvm_tcutils.dotprod.hexagon_model.run_model`.
    package_schedules : bool
        False builds with the package's hooks removed (:func:`package_hooks`) for
        :func:`plain_target` of ``target`` (``c -keys=cpu``, hexagonv66, by default): TVM's
        own generic CPU schedules, for comparison. (TVM's own Hexagon schedules tensorize with
        LLVM HVX intrinsics on ``int32x32`` vectors, which its C backend cannot print.)

    Returns
    -------
    Profile
        The outputs, the whole run's counts and each graph node's (in execution order).

    Raises
    ------
    TypeError, ValueError
        For a bad argument, as :func:`run_model` does.
    RuntimeError
        When a tool is missing (before any build), the plugin cannot be built, or the run fails.

    Examples
    --------
    Skipped by the doctest run (it needs qemu-user, clang-16 and lld-16);
    ``python_tests/dotprod/test_hexagon_profile.py`` profiles an int8 CNN.

    >>> x = relay.var("x", shape=(4, 64), dtype="int8")
    >>> w = relay.const(np.ones((32, 64), "int8"))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w, out_dtype="int32")))
    >>> prof = profile_model(mod, inputs=[np.ones((4, 64), "int8")])  # doctest: +SKIP
    >>> prof.nodes[0].macs, prof.nodes[0].ideal_vrmpy  # doctest: +SKIP
    (8192, 64)
    """
    if not isinstance(package_schedules, bool):
        raise TypeError(f"package_schedules must be a bool, got {type(package_schedules).__name__}")
    target = hexagon_model.check_target(target)
    if not package_schedules:
        target = plain_target(target)
    _require_tools()
    counter = _Counter(plugin_path())
    with package_hooks(package_schedules):
        outputs = hexagon_model._run_model(mod, params, inputs, timeout, target, counter,
                                           hexagon_key=package_schedules)
    calls = counter.plan.calls
    if counter.total is None or len(counter.marks) != len(calls) + 1:
        raise RuntimeError(f"the profile plugin saw {len(counter.marks)} node markers, expected {len(calls) + 1}")
    nodes = []
    for index, (func, _, _) in enumerate(calls):
        relay_func = counter.functions.get(func)
        nodes.append(NodeProfile(func, macs(relay_func) if relay_func is not None else 0,
                                 counter.marks[index + 1] - counter.marks[index]))
    # The model's own MACs: a QDQ file's products are float until its regions are made integer (as the
    # build makes them, less the channel padding TVM's legalization adds).
    model = qdq.to_integer(relay.transform.InferType()(hexagon_model.bound_params(hexagon_model._own_copy(mod),
                                                                                    params)))
    return Profile(outputs, counter.total, nodes, macs(model["main"]))


def _heavy(name: str) -> bool:
    """Whether a fused function's name says it holds a convolution, dense layer or matmul."""
    return any(word in name for word in ("conv", "dense", "matmul"))


def match_nodes(package: Profile, plain: Profile) -> dict:
    """Index of a node of ``package`` -> the node of ``plain`` computing the same thing.

    By position when both builds have as many nodes; else the nodes whose names say
    convolution, dense or matmul, by their rank, when both have as many of them (the builds
    fuse the element-wise ops around them differently); else none.

    Examples
    --------
    >>> pad, conv = NodeProfile("pad", 0, Counts(1, 1, 0)), NodeProfile("conv", 9, Counts(1, 1, 1))
    >>> a = Profile([], Counts(0, 0, 0), [pad, conv])
    >>> b = Profile([], Counts(0, 0, 0), [NodeProfile("conv", 9, Counts(5, 5, 0))])
    >>> {i: n.name for i, n in match_nodes(a, b).items()}
    {1: 'conv'}
    """
    if len(package.nodes) == len(plain.nodes):
        return dict(enumerate(plain.nodes))
    ours = [i for i, n in enumerate(package.nodes) if _heavy(n.name)]
    theirs = [n for n in plain.nodes if _heavy(n.name)]
    return dict(zip(ours, theirs)) if len(ours) == len(theirs) else {}


def format_table(package: Profile, plain: Optional[Profile] = None, width: int = 60) -> str:
    """A text table of a profile per node (and of a plain-TVM profile of the same model, when given).

    Plain nodes are matched with :func:`match_nodes`; a row sums the other nodes of each build
    (no convolution, dense or matmul: layout changes, padding, pooling...). Node names longer
    than ``width`` characters are cut. The total row's MACs are the model's own (``model_macs``).

    Examples
    --------
    >>> node = NodeProfile("fused_conv", 256, Counts(10, 20, 2))
    >>> print(format_table(Profile([], Counts(15, 25, 2), [node], 256)))  # doctest: +NORMALIZE_WHITESPACE
    node           MACs  packets  instructions  vrmpy  ideal vrmpy
    fused_conv      256       10            20      2            2
    (other nodes)     0        0             0      0            0
    runner                 0        5             5      0            0
    total                256       15            25      2            2
    """
    matched = match_nodes(package, plain) if plain is not None else {}
    header = ["node", "MACs", "packets", "instructions", "vrmpy", "ideal vrmpy"]
    if plain is not None:
        header += ["plain packets", "plain instructions"]

    def others(prof: Profile) -> Counts:
        total = Counts(0, 0, 0)
        for node in prof.nodes:
            if not _heavy(node.name):
                total = total + node.counts
        return total

    rows = []
    for index, node in enumerate(package.nodes):
        name = node.name if len(node.name) <= width else node.name[:width - 3] + "..."
        row = [name, node.macs, node.counts.packets, node.counts.instructions, node.counts.vrmpy, node.ideal_vrmpy]
        if plain is not None:
            other = matched.get(index)
            row += [other.counts.packets, other.counts.instructions] if other is not None else ["", ""]
        rows.append(row)
    summaries = [("(other nodes)", others(package), others(plain) if plain else None),
                 ("runner", package.runner, plain.runner if plain else None),
                 ("total", package.total, plain.total if plain else None)]
    for name, counts, other in summaries:
        node_macs = package.model_macs if name == "total" else 0
        row = [name, node_macs, counts.packets, counts.instructions, counts.vrmpy, ideal_vrmpy(node_macs)]
        if plain is not None:
            row += [other.packets, other.instructions]
        rows.append(row)
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        lines.append("  ".join(c.ljust(widths[0]) if i == 0 else c.rjust(widths[i]) for i, c in enumerate(r)))
    return "\n".join(line.rstrip() for line in lines)


def strip_final_softmax(mod: tvm.IRModule) -> "tuple[tvm.IRModule, bool]":
    """``(mod without the softmax its main ends in, True)``, or ``(mod, False)`` when it ends otherwise.

    A classifier's final float softmax calls ``expf``, which the freestanding runner has no
    bit-exact form of; the logits before it are what the comparison checks. ``mod`` is not changed.

    Examples
    --------
    >>> x = relay.var("x", shape=(1, 4))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.softmax(x)))
    >>> stripped, done = strip_final_softmax(mod)
    >>> done, stripped["main"].body.name_hint
    (True, 'x')
    >>> strip_final_softmax(stripped)[1]
    False
    """
    body = mod["main"].body
    if isinstance(body, relay.Call) and isinstance(body.op, tvm.ir.Op) and body.op.name == "nn.softmax":
        stripped = tvm.IRModule.from_expr(relay.Function(mod["main"].params, body.args[0]))
        return relay.transform.InferType()(stripped), True
    return mod, False


def integer_model(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None):
    """``(mod, params, notes)``: a model made integer the way it can run on emulated Hexagon.

    A quantizer's file (``qnn`` ops: a QDQ import) has its weights bound and its fake-quantized
    regions made integer as ``relay.build`` makes them for a Hexagon target
    (:func:`tvm_tcutils.dotprod.qdq.prepare_for_target`: with the package's hooks installed the build's
    legalization does it, with the fast forms of an encoder's softmax, GELU and layer norm that
    :func:`~tvm_tcutils.dotprod.qdq.to_integer` alone does not write); a float model is
    quantized by :func:`tvm_tcutils.dotprod.quantize.quantize_int8` (weights bound, params
    ``None``). A final softmax is stripped first (:func:`strip_final_softmax`). ``notes`` say
    what was done, for reports. ``mod`` is not changed.

    Examples
    --------
    >>> from tvm_tcutils.models import load_model
    >>> qmod, qparams, notes = integer_model(*load_model("mlp"))
    >>> qparams is None, notes[0]
    (True, 'a float model: quantized by relay.quantize (dotprod.quantize.quantize_int8)')
    """
    from .quantize import is_quantized, quantize_int8

    mod, stripped = strip_final_softmax(relay.transform.InferType()(mod))
    if is_quantized(mod):
        mod = relay.transform.InferType()(hexagon_model.bound_params(mod, params))
        mod, params = qdq.prepare_for_target(mod, hexagon_model.DEFAULT_TARGET), None
        notes = ["a quantizer's int8 file: its QDQ regions made integer as relay.build makes them for Hexagon "
                 "(dotprod.qdq)"]
    else:
        mod, params = quantize_int8(mod, params), None
        notes = ["a float model: quantized by relay.quantize (dotprod.quantize.quantize_int8)"]
    if stripped:
        notes.append("final softmax stripped (its float exp has no bit-exact C form in the freestanding runner)")
    return mod, params, notes


@dataclasses.dataclass
class Comparison:
    """What :func:`compare_builds` found: the two profiles and whether the outputs agree bit for bit."""

    package: Profile
    plain: Optional[Profile]
    #: The package's Hexagon outputs equal the x86 build's (TVM's graph executor, plain ``llvm``).
    equals_x86: bool
    #: The package's outputs equal the plain build's (None: no plain build).
    equals_plain: Optional[bool]

    @property
    def bit_exact(self) -> bool:
        """Every comparison made agreed."""
        return self.equals_x86 and self.equals_plain is not False

    def summary(self, width: int = 110) -> str:
        """Packets of both builds, their ratio, vrmpy against the ideal, the output checks.

        Examples
        --------
        >>> prof = Profile([], Counts(100, 150, 8), [], 1024)
        >>> print(Comparison(prof, Profile([], Counts(1500, 1600, 0), [], 1024), True, True).summary())
        packets: 100 (package), 1500 (TVM plain): x15.00 fewer; vrmpy 8 (ideal 8); outputs bit-identical to the x86
        build and to the plain build
        """
        text = f"packets: {self.package.total.packets} (package)"
        if self.plain is not None:
            text += (f", {self.plain.total.packets} (TVM plain): "
                     f"x{self.plain.total.packets / max(self.package.total.packets, 1):.2f} fewer")
        text += f"; vrmpy {self.package.total.vrmpy} (ideal {self.package.ideal_vrmpy}); outputs "
        text += "bit-identical to" if self.equals_x86 else "DIFFERENT from"
        text += " the x86 build"
        if self.equals_plain is not None:
            text += " and " + ("to" if self.equals_plain else "DIFFERENT from") + " the plain build"
        return textwrap.fill(text, width)


def compare_builds(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None,
                   inputs: hexagon_model.Inputs = (), timeout: float = 600,
                   target: Union[None, str, "tvm.target.Target"] = None, plain: bool = True) -> Comparison:
    """Profile an integer model with the package's schedules (and TVM's plain ones) and check the outputs.

    Runs :func:`profile_model` for ``target`` (and, with ``plain``, for :func:`plain_target`),
    and :func:`~tvm_tcutils.dotprod.hexagon_model.x86_reference` on the same inputs.

    Examples
    --------
    Skipped by the doctest run (it needs qemu-user, clang-16 and lld-16);
    ``python_tests/dotprod/test_hexagon_profile.py`` runs it.

    >>> x = relay.var("x", shape=(4, 64), dtype="int8")
    >>> w = relay.const(np.ones((32, 64), "int8"))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.nn.dense(x, w, out_dtype="int32")))
    >>> compare_builds(mod, inputs=[np.ones((4, 64), "int8")]).bit_exact  # doctest: +SKIP
    True
    """
    if not isinstance(plain, bool):
        raise TypeError(f"plain must be a bool, got {type(plain).__name__}")
    package = profile_model(mod, params, inputs, timeout=timeout, target=target)
    baseline = None
    if plain:
        baseline = profile_model(mod, params, inputs, timeout=timeout, target=target, package_schedules=False)
    checked_params, named = hexagon_model._check_arrays(mod, params, inputs)
    x86 = hexagon_model.x86_reference(mod, checked_params, named, target)
    return Comparison(package, baseline, bit_equal(package.outputs, x86),
                      None if baseline is None else bit_equal(package.outputs, baseline.outputs))

