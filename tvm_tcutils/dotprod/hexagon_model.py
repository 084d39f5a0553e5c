"""Run a whole integer Relay model on an emulated Hexagon (HVX): :func:`run_model`.

The route, end to end:

1. ``relay.build`` for a C-source Hexagon target (:data:`DEFAULT_TARGET`,
   ``c -keys=hexagon,cpu -mcpu=hexagonv66``). Its ``hexagon`` key makes the package's
   legalize, alter-layout and strategy hooks apply as they would for a device (the HVX
   ISA supports it), and a C target makes the tensorized tiles call the HVX C helpers
   (:func:`~tvm_tcutils.dotprod.topi.intrinsics.target_mode`). TVM prints every fused
   function as C.
2. :func:`runner_source` turns the build's graph JSON into a small C graph runner: one
   static buffer per storage id, a ``DLTensor`` per graph entry, the fused functions
   called in order with TVM's packed-function C convention; weights and inputs are read
   from stdin (never C literals), the outputs written to stdout.
3. clang-16 compiles both for ``hexagonv66`` with HVX 128B, ld.lld-16 links them
   statically, and ``qemu-hexagon`` runs the binary.

:func:`tvm_tcutils.dotprod.hexagon_profile.profile_model` runs the same route with a qemu
plugin counting the executed packets and instructions, per graph node.

Example
-------
>>> from tvm_tcutils.dotprod import hexagon_model
>>> set(hexagon_model.missing_tools()) <= {"clang", "lld", "qemu"}
True
>>> str(hexagon_model.check_target(None))
'c -keys=hexagon,cpu -mcpu=hexagonv66'
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np

from .._tvm import hexagon_emulator, tvm
from tvm import relay

from .hexagon import CPU, _RUNTIME, _check, _include_dirs, helpers_source, missing_tools

#: The target :func:`run_model` builds for: TVM prints C, the package's Hexagon hooks apply.
DEFAULT_TARGET = f"c -keys=hexagon,cpu -mcpu={CPU}"

#: CPUs qemu-hexagon 7.2 runs (a ``hexagonv68`` binary fails with "unable to find CPU model").
CPUS = ("hexagonv66", "hexagonv67")

#: Workspace arena of the runner (bytes): generated code allocates its scratch buffers from it.
ARENA_BYTES = 64 << 20

#: The empty function a marked runner calls between graph nodes (:func:`runner_source`).
MARK_SYMBOL = "tcu_mark"

#: Graph-executor ops that are no call (an aliased reshape).
_NOP = "__nop"

#: Math functions generated C may call that the runner defines (single precision, exact for
#: every input, with the semantics the x86 LLVM build has: ``roundf`` rounds halves away from 0,
#: ``sqrtf`` is correctly rounded as ``sqrtss`` is, NaNs as x86 makes them).
MATH_FUNCTIONS = ("roundf", "truncf", "floorf", "ceilf", "fabsf", "sqrtf")

#: Freestanding math and Hexagon's integer-division helpers (the chip has no divide
#: instruction and no compiler-rt for Hexagon is installed, so clang's calls land here).
_MODEL_RUNTIME = r"""
typedef union { float f; uint32_t u; } tcu_f32;
float fabsf(float x) { tcu_f32 v = {x}; v.u &= 0x7fffffffu; return v.f; }
static float tcu_with_sign(float magnitude, float sign) {
  tcu_f32 m = {magnitude}, s = {sign}; m.u = (m.u & 0x7fffffffu) | (s.u & 0x80000000u); return m.f;
}
/* |x| >= 2^23 (and inf, nan) is already integral; below it the int32 conversion is exact. */
float truncf(float x) {
  float a = fabsf(x);
  if (!(a < 8388608.0f)) return x;
  return tcu_with_sign((float)(int32_t)a, x);
}
float roundf(float x) {
  float a = fabsf(x), t;
  if (!(a < 8388608.0f)) return x;
  t = (float)(int32_t)a;
  if (a - t >= 0.5f) t += 1.0f;  /* a - t is exact: a and t share their leading bits */
  return tcu_with_sign(t, x);
}
float floorf(float x) { float t = truncf(x); return t > x ? t - 1.0f : t; }
float ceilf(float x) { float t = truncf(x); return t < x ? t + 1.0f : t; }
/* |x| = m 2^(e-23), m in [2^23, 2^24), for a finite non-zero |x|'s bits. */
static uint32_t tcu_unpack(uint32_t bits, int32_t* e) {
  uint32_t m;
  if (bits >> 23) { *e = (int32_t)(bits >> 23) - 127; return (bits & 0x7fffffu) | 0x800000u; }
  *e = -126; m = bits;
  while (m < 0x800000u) { m <<= 1; (*e)--; }
  return m;
}
/* Correctly rounded (to nearest even), digit by digit on the integer significand: HVX v66 has no
   square root, and a Newton step from an estimate is not exact in its last bit. */
float sqrtf(float x) {
  tcu_f32 v = {x};
  uint32_t u = v.u, m, sig;
  int32_t e, exponent;
  uint64_t rest, root = 0, bit = (uint64_t)1 << 62;
  if ((u & 0x7fffffffu) == 0 || u == 0x7f800000u) return x;        /* +-0, +inf */
  if ((u & 0x7fffffffu) > 0x7f800000u) { v.u = u | 0x400000u; return v.f; }  /* NaN, quieted */
  if (u >> 31) { v.u = 0xffc00000u; return v.f; }                   /* x86's default NaN */
  m = tcu_unpack(u, &e);
  if (e & 1) { m <<= 1; e--; }
  /* x = m 2^(e-23) = (m 2^25) 2^(e-48), e even: root = floor(sqrt(m 2^25)) has 25 bits. */
  rest = (uint64_t)m << 25;
  while (bit > rest) bit >>= 2;
  while (bit) {
    if (rest >= root + bit) { rest -= root + bit; root = (root >> 1) + bit; } else root >>= 1;
    bit >>= 2;
  }
  sig = (uint32_t)(root >> 1);
  exponent = (e - 48) / 2 + 151;
  if ((root & 1) && (rest != 0 || (sig & 1))) sig++;
  if (sig >> 24) { sig >>= 1; exponent++; }
  v.u = ((uint32_t)exponent << 23) | (sig & 0x7fffffu);
  return v.f;
}
static uint64_t tcu_udivmod(uint64_t n, uint64_t d, uint64_t* rem) {
  uint64_t q = 0, r = 0;
  for (int i = 63; i >= 0; i--) {
    r = (r << 1) | ((n >> i) & 1);
    if (r >= d) { r -= d; q |= (uint64_t)1 << i; }
  }
  if (rem) *rem = r;
  return q;
}
static int64_t tcu_sdivmod(int64_t n, int64_t d, int64_t* rem) {
  uint64_t un = n < 0 ? -(uint64_t)n : (uint64_t)n, ud = d < 0 ? -(uint64_t)d : (uint64_t)d, ur;
  uint64_t q = tcu_udivmod(un, ud, &ur);
  if (rem) *rem = n < 0 ? -(int64_t)ur : (int64_t)ur;
  return (n < 0) != (d < 0) ? -(int64_t)q : (int64_t)q;
}
int64_t __hexagon_divdi3(int64_t n, int64_t d) { return tcu_sdivmod(n, d, 0); }
int64_t __hexagon_moddi3(int64_t n, int64_t d) { int64_t r; tcu_sdivmod(n, d, &r); return r; }
uint64_t __hexagon_udivdi3(uint64_t n, uint64_t d) { return tcu_udivmod(n, d, 0); }
uint64_t __hexagon_umoddi3(uint64_t n, uint64_t d) { uint64_t r; tcu_udivmod(n, d, &r); return r; }
int32_t __hexagon_divsi3(int32_t n, int32_t d) { return (int32_t)tcu_sdivmod(n, d, 0); }
int32_t __hexagon_modsi3(int32_t n, int32_t d) { int64_t r; tcu_sdivmod(n, d, &r); return (int32_t)r; }
uint32_t __hexagon_udivsi3(uint32_t n, uint32_t d) { return (uint32_t)tcu_udivmod(n, d, 0); }
uint32_t __hexagon_umodsi3(uint32_t n, uint32_t d) { uint64_t r; tcu_udivmod(n, d, &r); return (uint32_t)r; }
/* Float division, correctly rounded as divss (no float divide on the chip): a long division of the
   significands, then round to nearest even, subnormal results included. */
float __hexagon_divsf3(float a, float b) {
  tcu_f32 va = {a}, vb = {b}, r;
  uint32_t sign = (va.u ^ vb.u) & 0x80000000u, aa = va.u & 0x7fffffffu, ab = vb.u & 0x7fffffffu, sig;
  int32_t ea, eb, shift, biased;
  uint64_t q, rest, dropped;
  if (aa > 0x7f800000u) { r.u = va.u | 0x400000u; return r.f; }  /* NaN operands, quieted, a first */
  if (ab > 0x7f800000u) { r.u = vb.u | 0x400000u; return r.f; }
  if (aa == 0x7f800000u) { r.u = ab == 0x7f800000u ? 0xffc00000u : sign | 0x7f800000u; return r.f; }
  if (ab == 0x7f800000u) { r.u = sign; return r.f; }
  if (ab == 0) { r.u = aa == 0 ? 0xffc00000u : sign | 0x7f800000u; return r.f; }
  if (aa == 0) { r.u = sign; return r.f; }
  q = tcu_udivmod((uint64_t)tcu_unpack(aa, &ea) << 31, tcu_unpack(ab, &eb), &rest);
  /* a / b = (q + rest / mb) 2^(ea - eb - 31), q of 31 or 32 bits: 24 of them kept. */
  shift = (q >> 31) ? 8 : 7;
  biased = ea - eb - 31 + shift + 23 + 127;
  if (biased >= 255) { r.u = sign | 0x7f800000u; return r.f; }
  if (biased <= 0) { shift += 1 - biased; biased = 0; }  /* a subnormal result keeps fewer bits */
  if (shift > 40) shift = 40;
  sig = (uint32_t)(q >> shift);
  dropped = q & (((uint64_t)1 << shift) - 1);
  if ((dropped >> (shift - 1)) & 1) {  /* half an ulp or more: up, unless an exact tie and sig even */
    if ((dropped & (((uint64_t)1 << (shift - 1)) - 1)) || rest || (sig & 1)) sig++;
  }
  if (biased == 0) { r.u = sign | sig; return r.f; }  /* a carry into 2^23 is the smallest normal */
  if (sig >> 24) { sig >>= 1; biased++; }
  r.u = biased >= 255 ? sign | 0x7f800000u : sign | ((uint32_t)biased << 23) | (sig & 0x7fffffu);
  return r.f;
}
static void tcu_fail(const char* func) { tcu_say(func); tcu_exit(4); }
"""

#: Functions generated C may call that the runner and the HVX helpers define.
_RUNTIME_NAMES = frozenset(
    {"TVMBackendAllocWorkspace", "TVMBackendFreeWorkspace", "TVMAPISetLastError", "TVMBackendParallelLaunch",
     "TVMBackendParallelBarrier", "memset", "memcpy", "memmove", *MATH_FUNCTIONS}
)

Inputs = Union[Mapping[str, Any], Sequence[Any]]


def check_target(target: Union[None, str, "tvm.target.Target"] = None,
                 hexagon_key: bool = True) -> "tvm.target.Target":
    """The C-source Hexagon target ``target`` names (None: :data:`DEFAULT_TARGET`).

    ``hexagon_key=False`` also takes a target without the ``hexagon`` key (such as
    ``c -keys=cpu -mcpu=hexagonv66``: TVM's generic CPU schedules, which its C backend can
    print, for the same chip), as a baseline for comparisons.

    Raises
    ------
    ValueError
        When it is not of kind ``c``, lacks the ``hexagon`` key (the package's hooks
        would not apply) or names a CPU qemu-hexagon cannot run (see :data:`CPUS`).
    TypeError
        When it is neither a string nor a ``tvm.target.Target``.

    Examples
    --------
    >>> check_target("c -keys=hexagon,cpu -mcpu=hexagonv67").attrs["mcpu"]
    'hexagonv67'
    >>> check_target("llvm")
    Traceback (most recent call last):
    ...
    ValueError: target must be a C-source Hexagon target such as ... got 'llvm'
    """
    if target is None:
        target = DEFAULT_TARGET
    if not isinstance(target, (str, tvm.target.Target)):
        raise TypeError(f"target must be a str or tvm.target.Target, got {type(target).__name__}")
    parsed = tvm.target.Target(target) if isinstance(target, str) else target
    mcpu = str(parsed.attrs.get("mcpu", CPU) or CPU)
    if parsed.kind.name != "c" or (hexagon_key and "hexagon" not in parsed.keys) or mcpu not in CPUS:
        raise ValueError(
            f"target must be a C-source Hexagon target such as {DEFAULT_TARGET!r} (kind 'c', key 'hexagon', "
            f"-mcpu one of {CPUS}), got {target if isinstance(target, str) else str(parsed)!r}"
        )
    return parsed


def _as_array(value: Any, what: str) -> np.ndarray:
    if isinstance(value, tvm.nd.NDArray):
        return value.numpy()
    if isinstance(value, (np.ndarray, np.generic)):
        return np.asarray(value)
    raise TypeError(f"{what} must be a numpy array or tvm.nd.NDArray, got {type(value).__name__}")


def _own_copy(mod: tvm.IRModule) -> tvm.IRModule:
    """A deep copy of ``mod`` to work on.

    TVM's passes fill type caches (``checked_type_``) of the expressions they visit in place,
    even when they return a new module: the caller's module is left exactly as it was only
    when no pass ever sees its nodes.
    """
    if not isinstance(mod, tvm.IRModule) or "main" not in [g.name_hint for g in mod.get_global_vars()]:
        raise TypeError(f"mod must be a tvm.IRModule with a 'main' function, got {type(mod).__name__}")
    return tvm.ir.load_json(tvm.ir.save_json(mod))


def _main_params(mod: tvm.IRModule) -> List[Tuple[str, Tuple[int, ...], str]]:
    """(name, static shape, dtype) of ``main``'s parameters (``mod``: a copy of the caller's)."""
    typed = relay.transform.InferType()(mod)
    out = []
    for var in typed["main"].params:
        ttype = var.checked_type
        if not isinstance(ttype, relay.TensorType):
            raise ValueError(f"main's parameter {var.name_hint!r} is a {type(ttype).__name__}; run_model takes tensors")
        try:
            shape = tuple(int(d) for d in ttype.shape)
        except (TypeError, ValueError):
            raise ValueError(f"main's parameter {var.name_hint!r} has a dynamic shape {ttype.shape}") from None
        out.append((var.name_hint, shape, str(ttype.dtype)))
    return out


def _check_arrays(mod: tvm.IRModule, params: Optional[Mapping[str, Any]], inputs: Inputs):
    """``(params, inputs)`` as dicts of numpy arrays, checked against ``main``'s signature."""
    signature = _main_params(mod)
    by_name = {name: (shape, dtype) for name, shape, dtype in signature}
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a dict of name -> array (or None), got {type(params).__name__}")
    checked_params = {}
    for name, value in params.items():
        if name not in by_name:
            raise ValueError(f"params names {name!r}, which is no parameter of main; choose from {sorted(by_name)}")
        checked_params[name] = _as_array(value, f"params[{name!r}]")
    free = [name for name, _, _ in signature if name not in checked_params]
    if isinstance(inputs, Mapping):
        unknown = sorted(set(inputs) - set(free))
        missing = [name for name in free if name not in inputs]
        if unknown or missing:
            raise ValueError(f"inputs must hold exactly main's inputs {free}; missing {missing}, unknown {unknown}")
        values = {name: inputs[name] for name in free}
    elif isinstance(inputs, (list, tuple)):
        if len(inputs) != len(free):
            raise ValueError(f"inputs must hold {len(free)} arrays, for {free}; got {len(inputs)}")
        values = dict(zip(free, inputs))
    else:
        raise TypeError(f"inputs must be a dict of name -> array or a list in the order {free}, "
                        f"got {type(inputs).__name__}")
    checked_inputs = {}
    for name, value in values.items():
        array = _as_array(value, f"inputs[{name!r}]")
        shape, dtype = by_name[name]
        if array.shape != shape or str(array.dtype) != dtype:
            raise ValueError(f"input {name!r} must have shape {shape} and dtype {dtype}, "
                             f"got {array.shape} and {array.dtype}")
        checked_inputs[name] = np.ascontiguousarray(array)
    return checked_params, checked_inputs


def build_c(mod: tvm.IRModule, params: Optional[Mapping[str, np.ndarray]] = None,
            target: Union[None, str, "tvm.target.Target"] = None) -> Tuple[str, str, Dict[str, np.ndarray]]:
    """``relay.build`` ``mod`` for the C-source Hexagon ``target``: (graph JSON, C source, params).

    Vectorized loops become serial loops (``tir.disable_vectorize``): TVM's C backend prints
    no vector types, and clang vectorizes for HVX on its own where it can.

    Raises
    ------
    RuntimeError
        When an operator has no C form (TVM's C backend cannot print its code), naming TVM's reason.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,), dtype="int32")
    >>> graph, source, _ = build_c(tvm.IRModule.from_expr(relay.Function([x], x + relay.const(1))))
    >>> "tvmgen_default_fused_add" in source and '"tvm_op"' in graph
    True
    """
    return _build_c(_own_copy(mod), params, check_target(target))


def _build_c(mod: tvm.IRModule, params: Optional[Mapping[str, np.ndarray]],
             target: "tvm.target.Target",
             functions: Optional[Dict[str, Any]] = None) -> Tuple[str, str, Dict[str, np.ndarray]]:
    """:func:`build_c` on a module of the caller's own (a copy) and a checked target.

    ``functions``, when given, is filled with the Relay primitive function of each fused
    function, by name (the build's ``function_metadata``): what a profile counts MACs in.
    """
    config = {"tir.disable_vectorize": True}
    capture = _LastTIR()
    try:
        with tvm.transform.PassContext(opt_level=3, config=config, instruments=[capture]):
            lib = relay.build(mod, target=target, params=dict(params or {}))
    except tvm.TVMError as err:
        reason = str(err).strip().splitlines()[-1]
        raise RuntimeError(f"relay.build for {target} failed (an operator without a C form?): {reason}") from None
    sources = []
    for module in [lib.get_lib(), *lib.get_lib().imported_modules]:
        if module.type_key != "c":
            raise RuntimeError(f"the build holds a {module.type_key!r} module, which has no C source for the "
                               f"emulator (only TVM's C backend, target kind 'c', is supported)")
        sources.append(module.get_source())
    built_params = {name: value.numpy() for name, value in lib.get_params().items()}
    if functions is not None:
        for name, info in lib.function_metadata.items():
            relay_funcs = list(info.relay_primfuncs.values()) if info.relay_primfuncs else []
            if relay_funcs and name != "__tvm_main__":
                functions[str(name)] = relay_funcs[0]
    # Freestanding: no libc headers; the few math functions used are the runner's.
    source = "\n".join(sources).replace("#include <math.h>", "")
    return lib.get_graph_json(), exact_float_literals(source, capture.module), built_params


@tvm.ir.instrument.pass_instrument
class _LastTIR:
    """Keeps the last module of PrimFuncs a pass produced: the one TVM's C backend prints."""

    def __init__(self):
        self.module = None

    def run_after_pass(self, mod, info):
        if any(isinstance(func, tvm.tir.PrimFunc) for func in mod.functions.values()):
            self.module = mod


#: A float literal as TVM's C backend prints it (``std::scientific``: 7 significant digits).
_FLOAT_LITERAL = re.compile(r"(?<![\w.])(\d\.\d{6}e[+-]\d{2,3})(f?)(?![\w.])")


def _printed(value: float) -> str:
    return f"{abs(value):e}"


def exact_float_literals(source: str, tir_mod: Optional[tvm.IRModule]) -> str:
    """``source`` with each float literal TVM printed rounded to 7 digits replaced by the exact
    value of the TIR constant it came from, as a C hex float literal.

    Seven digits do not hold a float32 (nine do): ``0.00010972`` scale factors printed that way
    differ from the x86 build's in the last bits. A printed literal two different constants of
    the same function round to is left as it is, and so is any literal when ``tir_mod`` is None.

    Examples
    --------
    >>> import tvm
    >>> x = tvm.tir.Var("x", "float32")
    >>> func = tvm.tir.PrimFunc([x], tvm.tir.Evaluate(x * tvm.tir.const(0.1, "float32")))
    >>> source = "int32_t f(float x) {\\n  y = x * 1.000000e-01f;\\n}\\n"
    >>> print(exact_float_literals(source, tvm.IRModule({"f": func.with_attr("global_symbol", "f")})), end="")
    int32_t f(float x) {
      y = x * 0x1.99999a0000000p-4f;
    }
    """
    if tir_mod is None:
        return source
    per_func: Dict[str, Dict[Tuple[str, str], set]] = {}
    for gvar, func in tir_mod.functions.items():
        if not isinstance(func, tvm.tir.PrimFunc):
            continue
        found: Dict[Tuple[str, str], set] = {}

        def visit(node, found=found):
            if isinstance(node, tvm.tir.FloatImm) and str(node.dtype) in ("float32", "float64"):
                single = str(node.dtype) == "float32"
                # A float32 FloatImm holds a double; the x86 build rounds it to float32 (LLVM's ConstantFP).
                value = float(np.float32(abs(node.value))) if single else abs(node.value)
                found.setdefault((_printed(node.value), "f" if single else ""), set()).add(value)

        tvm.tir.stmt_functor.post_order_visit(func.body, visit)
        name = func.attrs["global_symbol"] if func.attrs and "global_symbol" in func.attrs else gvar.name_hint
        per_func[str(name)] = found
    starts = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(source)]
    pieces, last = [], 0
    for index, (start, name) in enumerate(starts):
        end = starts[index + 1][0] if index + 1 < len(starts) else len(source)
        # A lifted parallel body is named after its function (``<name>_compute_``).
        owner = max((f for f in per_func if name.startswith(f)), key=len, default=None)
        constants = per_func.get(owner, {})

        def exact(match, constants=constants):
            values = constants.get((match.group(1), match.group(2)), ())
            return float(next(iter(values))).hex() + match.group(2) if len(values) == 1 else match.group(0)

        pieces += [source[last:start], _FLOAT_LITERAL.sub(exact, source[start:end])]
        last = end
    return "".join(pieces) + source[last:]


_DECLARATION = re.compile(r"^TVM_DLL\s+[\w\s\*]*?\b(\w+)\([^;{]*\);\s*$", re.M)
_DEFINITION = re.compile(r"^(?:TVM_DLL\s+|static\s+)?[\w\s\*]*?\b(\w+)\([^;{]*\)\s*\{\s*$", re.M)


def external_calls(source: str) -> Dict[str, List[str]]:
    """Functions ``source`` declares and calls but does not define: name -> the functions calling it.

    Examples
    --------
    >>> src = "TVM_DLL float expf(float);\\nTVM_DLL int32_t f(void* a) {\\n  x = expf(y);\\n}\\n"
    >>> external_calls(src)
    {'expf': ['f']}
    """
    declared = set(_DECLARATION.findall(source))
    defined = [(m.start(), m.group(1)) for m in _DEFINITION.finditer(source)]
    callers: Dict[str, List[str]] = {}
    for index, (start, func) in enumerate(defined):
        end = defined[index + 1][0] if index + 1 < len(defined) else len(source)
        body = source[start:end]
        for name in declared - {f for _, f in defined}:
            if re.search(rf"\b{name}\(", body):
                callers.setdefault(name, []).append(func)
    return callers


def _operator_of(function: str) -> str:
    """The Relay operator a C math function computes: C names single-precision ones ``<op>f``.

    Examples
    --------
    >>> _operator_of("erff"), _operator_of("expf"), _operator_of("tcu_x")
    ('erf', 'exp', 'tcu_x')
    """
    return function[:-1] if function.endswith("f") and not function.startswith("tcu_") else function


def _check_externals(source: str) -> None:
    provided = _RUNTIME_NAMES | set(re.findall(r"\b(tcu_\w+)\(", helpers_source()))
    unknown = {name: funcs for name, funcs in external_calls(source).items() if name not in provided}
    if unknown:
        detail = "; ".join(f"operator {_operator_of(name)} ({name}, called by {', '.join(sorted(set(funcs)))})"
                           for name, funcs in sorted(unknown.items()))
        raise RuntimeError(
            f"no C form on emulated Hexagon for {detail}: the freestanding runner defines "
            f"{', '.join(MATH_FUNCTIONS)}, float division and the HVX helpers, and no other math function "
            f"exact as x86's (a quantizer's file has these ops in their integer forms)"
        )


def _dtype(dtype: str) -> Tuple[int, int, int]:
    """(DLPack type code, bits, bytes per element) of a graph dtype string."""
    dt = tvm.runtime.DataType(dtype)
    if dt.lanes != 1:
        raise RuntimeError(f"graph tensor of vector dtype {dtype} is not supported")
    return int(dt.type_code), int(dt.bits), (int(dt.bits) + 7) // 8


class GraphPlan:
    """The graph executor's view of a build, as the runner needs it.

    Attributes
    ----------
    entries : list of (shape, dtype, storage id)
        One per graph entry (node output), in entry order.
    storage : list of int
        Bytes of each storage id (the largest entry placed there).
    args : list of (name, entry)
        Graph inputs and parameters, in the graph's order.
    calls : list of (function name, input entries, output entries)
        The fused functions in execution order.
    heads : list of int
        Entries of the model's outputs.
    """

    def __init__(self, graph_json: str):
        graph = json.loads(graph_json)
        nodes, attrs, row = graph["nodes"], graph["attrs"], graph["node_row_ptr"]
        shapes, dtypes, storage_ids = attrs["shape"][1], attrs["dltype"][1], attrs["storage_id"][1]
        devices = attrs.get("device_index", ["list_int", [1] * len(shapes)])[1]
        if any(int(d) != 1 for d in devices):
            raise RuntimeError("the graph places tensors on a device other than the CPU; the runner has one device")
        self.entries = [(tuple(int(d) for d in s), str(t), int(sid)) for s, t, sid in zip(shapes, dtypes, storage_ids)]
        self.storage = [0] * (max(storage_ids) + 1 if storage_ids else 0)
        for shape, dtype, sid in self.entries:
            self.storage[sid] = max(self.storage[sid], self.nbytes(shape, dtype))
        self.args = [(nodes[nid]["name"], row[nid]) for nid in graph["arg_nodes"]]
        self.calls = []
        for nid, node in enumerate(nodes):
            if node["op"] == "null":
                continue
            func = node["attrs"]["func_name"]
            if func == _NOP:
                continue
            if node["op"] != "tvm_op" or func.startswith("__"):
                raise RuntimeError(f"graph node {node['name']!r} ({node['op']} {func}) is not a fused function call")
            ins = [row[src] + index for src, index, *_ in node["inputs"]]
            outs = [row[nid] + k for k in range(int(node["attrs"].get("num_outputs", 1)))]
            self.calls.append((func, ins, outs))
        self.heads = [row[nid] + index for nid, index, *_ in graph["heads"]]

    @staticmethod
    def nbytes(shape: Sequence[int], dtype: str) -> int:
        """Bytes of a tensor (the graph executor's sizing)."""
        return int(np.prod(shape, dtype=np.int64)) * _dtype(dtype)[2]


def runner_source(plan: GraphPlan, order: Sequence[str], arena: int = ARENA_BYTES, marks: bool = False) -> str:
    """A freestanding C ``_start`` running ``plan``'s fused functions in order.

    It reads the arguments named in ``order`` (their bytes, in that order) from stdin into
    their storage, calls each function with TVM's packed convention, and writes the heads'
    bytes to stdout. A function returning non-zero stops it with exit code 4 and its name
    on stderr (after the message of the check that failed, if any).

    With ``marks``, the runner calls the empty function :data:`MARK_SYMBOL` before each
    fused function and after the last one (``len(plan.calls) + 1`` calls): an emulator
    plugin watching that address splits the run's counts per graph node
    (:mod:`tvm_tcutils.dotprod.hexagon_profile`).

    Examples
    --------
    >>> graph = {"nodes": [{"op": "null", "name": "x", "inputs": []},
    ...                    {"op": "tvm_op", "name": "f", "inputs": [[0, 0, 0]],
    ...                     "attrs": {"func_name": "f", "num_outputs": "1", "num_inputs": "1"}}],
    ...          "arg_nodes": [0], "heads": [[1, 0, 0]], "node_row_ptr": [0, 1, 2],
    ...          "attrs": {"shape": ["list_shape", [[4], [4]]], "dltype": ["list_str", ["int8", "int8"]],
    ...                    "storage_id": ["list_int", [0, 1]]}}
    >>> src = runner_source(GraphPlan(json.dumps(graph)), ["x"])
    >>> "f(tcu_args0, tcu_codes0, 2, &ret, &ret_code, 0)" in src
    True
    >>> runner_source(GraphPlan(json.dumps(graph)), ["x"], marks=True).count(f"  {MARK_SYMBOL}();")
    2
    """
    entry_of = dict(plan.args)
    lines = [
        "#include <stdint.h>",
        '#include "tvm/runtime/c_runtime_api.h"',
        '#include "tvm/runtime/c_backend_api.h"',
        f"#define TCU_ARENA {int(arena)}",
        helpers_source(),
        _RUNTIME,
        _MODEL_RUNTIME,
    ]
    for func in sorted({func for func, _, _ in plan.calls}):
        lines.append(f"int32_t {func}(void*, int32_t*, int32_t, void*, int32_t*, void*);")
    for sid, size in enumerate(plan.storage):
        lines.append(f"static unsigned char tcu_store{sid}[{max(size, 1)}] __attribute__((aligned(128)));")
    used = sorted({e for _, ins, outs in plan.calls for e in ins + outs} | set(plan.heads) | set(entry_of.values()))
    for eid in used:
        shape, dtype, sid = plan.entries[eid]
        code, bits, _ = _dtype(dtype)
        dims = ", ".join(str(d) for d in shape) or "1"
        lines.append(f"static int64_t tcu_shape{eid}[] = {{{dims}}};")
        lines.append(
            f"static DLTensor tcu_t{eid} = {{.data = tcu_store{sid}, .device = {{kDLCPU, 0}}, .ndim = {len(shape)}, "
            f".dtype = {{{code}, {bits}, 1}}, .shape = tcu_shape{eid}, .strides = 0, .byte_offset = 0}};"
        )
    for index, (func, ins, outs) in enumerate(plan.calls):
        handles = ", ".join(f"{{.v_handle = &tcu_t{e}}}" for e in ins + outs)
        lines.append(f"static TVMValue tcu_args{index}[] = {{{handles}}};")
        lines.append(f"static int32_t tcu_codes{index}[] = {{{', '.join(['kTVMDLTensorHandle'] * len(ins + outs))}}};")
        lines.append(f'static const char tcu_name{index}[] = "{func} failed";')
    if marks:
        # Not inlined, and kept: the plugin sees a translation block start at its address.
        lines.append(f"__attribute__((noinline, used)) void {MARK_SYMBOL}(void) "
                     '{ __asm__ volatile("" ::: "memory"); }')
    mark = f"  {MARK_SYMBOL}();" if marks else None
    lines += ["void _start(void) {", "  TVMValue ret; int32_t ret_code;"]
    for name in order:
        eid = entry_of[name]
        shape, dtype, sid = plan.entries[eid]
        lines.append(f"  if (tcu_io(63, 0, tcu_store{sid}, {plan.nbytes(shape, dtype)})) tcu_exit(3);  /* {name} */")
    for index, (func, ins, outs) in enumerate(plan.calls):
        if mark:
            lines.append(mark)
        lines.append(f"  if ({func}(tcu_args{index}, tcu_codes{index}, {len(ins + outs)}, &ret, &ret_code, 0) != 0) "
                     f"tcu_fail(tcu_name{index});")
    if mark:
        lines.append(mark)
    for eid in plan.heads:
        shape, dtype, sid = plan.entries[eid]
        lines.append(f"  if (tcu_io(64, 1, tcu_store{sid}, {plan.nbytes(shape, dtype)})) tcu_exit(5);")
    lines += ["  tcu_exit(0);", "}"]
    return "\n".join(lines) + "\n"


def _compile_flags(cpu: str) -> List[str]:
    # -ffp-contract=off: a fused multiply-add would round differently from the x86 build's separate ops.
    return ["--target=hexagon-unknown-linux-musl", f"-mcpu={cpu}", "-mhvx", "-mhvx-length=128b", "-O2",
            "-ffreestanding", "-fno-builtin", "-ffp-contract=off", "-w"] + [f"-I{d}" for d in _include_dirs()]


def _link(tools: Dict[str, str], objects: List[str], binary: str) -> None:
    proc = subprocess.run([tools["lld"], "-static", "-e", "_start", *objects, "-o", binary],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        undefined = sorted(set(re.findall(r"undefined symbol: (\S+)", proc.stderr)))
        if undefined:
            raise RuntimeError(f"ld.lld failed: the model's code needs {', '.join(undefined)}, which the "
                               f"freestanding Hexagon runner does not define")
        raise RuntimeError(f"ld.lld failed: {proc.stderr[-2000:]}")


def x86_reference(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None,
                  inputs: Optional[Mapping[str, np.ndarray]] = None,
                  target: Union[None, str, "tvm.target.Target"] = None) -> List[np.ndarray]:
    """The reference :func:`run_model`'s outputs are compared to: the same integer graph built for plain
    x86 ``llvm`` (TVM's own lowering) and run by TVM's graph executor.

    "The same graph" means the one the Hexagon build computes: its quantized ops are legalized first
    under the Hexagon ``target`` (:func:`check_target`, default :data:`DEFAULT_TARGET`), where the
    package's QNN rules apply (a QDQ region as the integer ops ``to_integer`` makes, a requantize as
    onnxruntime rounds it), and only then built for x86. Built for plain ``llvm`` directly, those ops
    would get TVM's own lowering instead (a float fake-quantized conv, a fixed-point requantize rounding
    half up): a different model, one quantization step apart here and there.

    Examples
    --------
    >>> x = relay.var("x", shape=(2,), dtype="int32")
    >>> x86_reference(tvm.IRModule.from_expr(relay.Function([x], x + relay.const(1))),
    ...               inputs={"x": np.array([1, 2], "int32")})[0].tolist()
    [2, 3]
    """
    from tvm.contrib import graph_executor

    graph = _hexagon_legalized(_own_copy(mod), params, check_target(target))
    with tvm.transform.PassContext(opt_level=3):
        lib = relay.build(graph, target="llvm")
    runner = graph_executor.GraphModule(lib["default"](tvm.cpu()))
    runner.set_input(**dict(inputs or {}))
    runner.run()
    return [runner.get_output(i).numpy() for i in range(runner.get_num_outputs())]


def bound_params(mod: tvm.IRModule, params: Optional[Mapping[str, Any]]) -> tvm.IRModule:
    """``mod`` with ``params`` bound as constants (``mod`` itself without any).

    Examples
    --------
    >>> x, w = relay.var("x", shape=(2,)), relay.var("w", shape=(2,))
    >>> mod = tvm.IRModule.from_expr(relay.Function([x, w], x + w))
    >>> [p.name_hint for p in bound_params(mod, {"w": np.ones(2, "float32")})["main"].params]
    ['x']
    """
    if not params:
        return mod
    bound = {name: tvm.nd.array(_as_array(value, f"params[{name!r}]")) for name, value in params.items()}
    return tvm.IRModule.from_expr(relay.build_module.bind_params_by_name(mod["main"], bound))


def _hexagon_legalized(mod: tvm.IRModule, params: Optional[Mapping[str, Any]],
                       target: "tvm.target.Target") -> tvm.IRModule:
    """``mod`` (the caller's own copy) with ``params`` bound and its QNN ops legalized as ``relay.build``
    legalizes them for ``target``: TVM's first pass, which the package's rules take part in."""
    mod = bound_params(mod, params)
    with target, tvm.transform.PassContext(opt_level=3):
        return tvm.transform.Sequential([relay.transform.InferType(), relay.qnn.transform.Legalize(),
                                         relay.transform.InferType()])(mod)


def run_model(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None, inputs: Inputs = (),
              timeout: float = 600, target: Union[None, str, "tvm.target.Target"] = None,
              per_node: bool = False) -> Union[List[np.ndarray], Tuple[List[np.ndarray], "NodeReport"]]:
    """Build an integer Relay model for Hexagon and run it under qemu-hexagon.

    Parameters
    ----------
    mod : tvm.IRModule
        The model (already integer: a ``relay.quantize`` output or a ``qnn`` model; float
        edges such as the input quantization are fine). Not modified.
    params : dict of str to array, optional
        Values bound to ``main``'s parameters as constants (``relay.build``'s ``params``).
    inputs : dict of str to array, or sequence of arrays
        ``main``'s other parameters, by name or in their order; shapes and dtypes must match.
    timeout : float
        Seconds the emulated run may take.
    target : str or tvm.target.Target, optional
        A C-source Hexagon target (:func:`check_target`); default :data:`DEFAULT_TARGET`.
    per_node : bool
        Also record the nodes' values on Hexagon and on the x86 build of the same graph and
        find the first node that differs (:func:`differential_run`, ``nodes="auto"``).

    Returns
    -------
    list of numpy.ndarray
        The model's outputs, in the graph executor's order.
    NodeReport
        With ``per_node`` only (then the two are returned as a tuple): its ``summary()`` names the
        first node that differs, or says that none did.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (before any build), naming it and what it takes.
    RuntimeError
        When a tool is missing, an operator has no C form, compiling or linking fails, or the
        emulated program fails.

    Examples
    --------
    Skipped by the doctest run (it needs qemu-user, clang-16 and lld-16);
    ``python_tests/dotprod/test_hexagon_model.py`` runs an int8 CNN this way.

    >>> x = relay.var("x", shape=(2, 3), dtype="int32")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], x * relay.const(2)))
    >>> run_model(mod, inputs={"x": np.ones((2, 3), "int32")})  # doctest: +SKIP
    [array([[2, 2, 2],
           [2, 2, 2]], dtype=int32)]
    """
    if not isinstance(per_node, bool):
        raise TypeError(f"per_node must be a bool, got {type(per_node).__name__}")
    if per_node:
        report = differential_run(mod, params, inputs, timeout, target)
        return report.outputs, report
    return _run_model(mod, params, inputs, timeout, target)


class Instrument:
    """What :func:`_run_model` lets a caller add to a run (the profiler's hooks).

    ``tools_missing`` is checked with the emulator's tools, before the build;
    ``qemu_options`` gives qemu-hexagon's options for the linked binary (the runner then
    calls :data:`MARK_SYMBOL` between nodes); ``collect`` reads what the run left in the
    work directory, before it is removed. ``functions`` receives the Relay function of
    each fused function (see :func:`_build_c`).

    Examples
    --------
    >>> Instrument().qemu_options("model", "/tmp"), Instrument().plan is None
    ([], True)
    """

    def __init__(self):
        self.functions: Dict[str, Any] = {}
        self.plan: Optional[GraphPlan] = None

    def tools_missing(self) -> Optional[str]:
        return None

    def qemu_options(self, binary: str, workdir: str) -> List[str]:
        return []

    def collect(self, workdir: str) -> None:
        pass


def _checked(mod: tvm.IRModule, params: Optional[Mapping[str, Any]], inputs: Inputs, timeout: float,
             target: Union[None, str, "tvm.target.Target"], hexagon_key: bool = True):
    """``(target, own copy of mod, params, inputs)``, every argument and tool checked: before the build,
    the longest step but the run."""
    target = check_target(target, hexagon_key)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    mod = _own_copy(mod)
    params, inputs = _check_arrays(mod, params, inputs)
    missing = missing_tools()
    if missing:
        raise RuntimeError(f"Hexagon emulation needs {', '.join(missing)} (apt-get install qemu-user clang-16 lld-16)")
    return target, mod, params, inputs


def _run_model(mod: tvm.IRModule, params: Optional[Mapping[str, Any]], inputs: Inputs, timeout: float,
               target: Union[None, str, "tvm.target.Target"],
               instrument: Optional[Instrument] = None, hexagon_key: bool = True) -> List[np.ndarray]:
    """:func:`run_model`, with an optional :class:`Instrument` watching the emulated run
    (``hexagon_key``: see :func:`check_target`)."""
    target, mod, params, inputs = _checked(mod, params, inputs, timeout, target, hexagon_key)
    problem = instrument.tools_missing() if instrument is not None else None
    if problem:
        raise RuntimeError(problem)
    if instrument is None:
        graph_json, source, built_params = _build_c(mod, params, target)
    else:
        graph_json, source, built_params = _build_c(mod, params, target, instrument.functions)
    _check_externals(source)
    plan = GraphPlan(graph_json)
    if instrument is not None:
        instrument.plan = plan
    order, payload = [], []
    for name, eid in plan.args:
        shape, dtype, _ = plan.entries[eid]
        value = built_params.get(name, inputs.get(name))
        if value is None:
            raise RuntimeError(f"the graph's argument {name!r} is neither a built parameter nor an input")
        if value.shape != shape or str(value.dtype) != dtype:  # the build's own view of a value wins
            raise RuntimeError(f"argument {name!r} is {value.shape}/{value.dtype}, the graph wants {shape}/{dtype}")
        order.append(name)
        payload.append(np.ascontiguousarray(value).tobytes())
    tools = hexagon_emulator()
    cpu = str(target.attrs.get("mcpu", CPU) or CPU)
    with tempfile.TemporaryDirectory(prefix="tcu_hexagon_model_") as tmp:
        objects = []
        runner = runner_source(plan, order, marks=instrument is not None)
        for fname, text in (("model.c", source), ("runner.c", runner)):
            path = os.path.join(tmp, fname)
            with open(path, "w") as f:
                f.write(text)
            objects.append(path[:-2] + ".o")
            _check([tools["clang"], *_compile_flags(cpu), "-c", path, "-o", objects[-1]], f"clang ({fname})")
        binary = os.path.join(tmp, "model")
        _link(tools, objects, binary)
        options = instrument.qemu_options(binary, tmp) if instrument is not None else []
        try:
            proc = subprocess.run([tools["qemu"], *options, binary], input=b"".join(payload), capture_output=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"qemu-hexagon did not finish the model within {timeout} s") from None
        sizes = [plan.nbytes(*plan.entries[e][:2]) for e in plan.heads]
        if proc.returncode != 0 or len(proc.stdout) != sum(sizes):
            raise RuntimeError(
                f"qemu-hexagon run failed (exit {proc.returncode}, {len(proc.stdout)} of {sum(sizes)} output bytes): "
                f"{proc.stderr.decode(errors='replace')[-1000:]}"
            )
        if instrument is not None:
            instrument.collect(tmp)
    outputs, offset = [], 0
    for eid, size in zip(plan.heads, sizes):
        shape, dtype, _ = plan.entries[eid]
        outputs.append(np.frombuffer(proc.stdout, dtype=dtype, count=size // np.dtype(dtype).itemsize,
                                     offset=offset).reshape(shape).copy())
        offset += size
    return outputs


# ---------------------------------------------------------------- the per-node differential run
# A whole-model comparison (run_model against x86_reference) says *that* an output differs; this says
# *where*. ``main`` gets extra outputs ("taps"): the values of chosen Relay calls, in the layout the model
# computes them in. Both builds of that same graph run once, and each tap is compared bit for bit, in the
# order the calls are computed. Tapping a value makes both builds store it, which may split a fused
# kernel: so by default the layer boundaries (8-bit tensors, stored by every build anyway) are tapped
# first, then every call from the last boundary that agreed to the first one that did not.

#: What :func:`differential_run` records: ``"boundaries"`` the 8-bit tensors between layers,
#: ``"all"`` every tensor a call computes, ``"auto"`` boundaries, then every call up to the
#: first boundary that differs.
NODE_CHOICES = ("auto", "boundaries", "all")

#: Dtypes of the tensors that pass between an integer model's layers (stored by every build).
BOUNDARY_DTYPES = frozenset({"int8", "uint8"})


@dataclasses.dataclass(frozen=True)
class NodeDifference:
    """One recorded call whose value differs between the two builds.

    Attributes
    ----------
    index : int
        The call's position among ``main``'s calls in the order they are computed (post-order).
    op : str
        The operator (or ``"function"`` for a call of a Relay function).
    name : str
        The model's own name for the node where the importer kept one (the ONNX node name), else "".
    shape : tuple of int
    dtype : str
    count : int
        Elements that differ bit for bit.
    size : int
        Elements in all.
    largest : float
        The largest absolute difference (NaN where a value is not a number).
    """

    index: int
    op: str
    name: str
    shape: Tuple[int, ...]
    dtype: str
    count: int
    size: int
    largest: float

    def line(self) -> str:
        """The difference in one line.

        Examples
        --------
        >>> NodeDifference(41, "qnn.requantize", "conv3", (1, 64, 7, 7), "uint8", 2, 3136, 1.0).line()
        'node #41 qnn.requantize (conv3) (1, 64, 7, 7) uint8: 2 of 3136 elements differ, by up to 1'
        """
        named = f" ({self.name})" if self.name else ""
        return (f"node #{self.index} {self.op}{named} {self.shape} {self.dtype}: {self.count} of {self.size} "
                f"elements differ, by up to {self.largest:g}")


@dataclasses.dataclass
class NodeReport:
    """What :func:`differential_run` found.

    Attributes
    ----------
    outputs : list of numpy.ndarray
        The model's outputs on emulated Hexagon (with no taps: the build as :func:`run_model` makes it).
    outputs_equal : bool
        Those outputs equal the x86 build's bit for bit.
    recorded : int
        Calls compared (all passes together; a call is counted once).
    calls : int
        Calls ``main`` has.
    differences : list of NodeDifference
        Every recorded call that differs, in the order computed.
    """

    outputs: List[np.ndarray]
    outputs_equal: bool
    recorded: int
    calls: int
    differences: List[NodeDifference]

    @property
    def first(self) -> Optional[NodeDifference]:
        """The first recorded call that differs (None when all agree)."""
        return self.differences[0] if self.differences else None

    def summary(self) -> str:
        """One line: the first node that differs, or that none did.

        Examples
        --------
        >>> NodeReport([], True, 12, 40, []).summary()
        'Hexagon and x86 agree bit for bit on the outputs and on all 12 recorded of 40 nodes'
        >>> diff = NodeDifference(3, "clip", "", (8,), "int32", 1, 8, 2.0)
        >>> NodeReport([], False, 12, 40, [diff]).summary()
        'first node that differs between Hexagon and x86: node #3 clip (8,) int32: 1 of 8 elements differ, by up to 2'
        >>> print(NodeReport([], False, 12, 40, []).summary())  # doctest: +NORMALIZE_WHITESPACE
        the outputs differ between Hexagon and x86, but none of the 12 recorded of 40 nodes does
        (nodes='all' records every node)
        """
        if self.first is not None:
            return f"first node that differs between Hexagon and x86: {self.first.line()}"
        if not self.outputs_equal:
            return (f"the outputs differ between Hexagon and x86, but none of the {self.recorded} recorded of "
                    f"{self.calls} nodes does (nodes='all' records every node)")
        return (f"Hexagon and x86 agree bit for bit on the outputs and on all {self.recorded} recorded of "
                f"{self.calls} nodes")


def model_calls(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None) -> List[relay.Call]:
    """``main``'s calls that compute a tensor from the model's inputs, in the order computed.

    Calls on parameters alone (weight transforms the build folds) are left out.

    Examples
    --------
    >>> x = relay.var("x", shape=(4,), dtype="int32")
    >>> w = relay.var("w", shape=(4,), dtype="int32")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x, w], relay.clip(x + relay.abs(w), 0, 9)))
    >>> [c.op.name for c in model_calls(mod, {"w": np.ones(4, "int32")})]
    ['add', 'clip']
    """
    typed = relay.transform.InferType()(mod)
    constant = set(params or ())
    calls: List[relay.Call] = []

    def visit(node):
        if isinstance(node, relay.Call) and isinstance(node.checked_type, relay.TensorType):
            if any(v.name_hint not in constant for v in relay.analysis.free_vars(node)):
                calls.append(node)

    relay.analysis.post_order_visit(typed["main"].body, visit)
    return calls


def _op_name(call: relay.Call) -> str:
    return call.op.name if isinstance(call.op, tvm.ir.Op) else "function"


def _node_name(call: relay.Call) -> str:
    span = call.span
    return str(span.source_name.name) if span is not None and span.source_name is not None else ""


def _tapped(mod: tvm.IRModule, taps: Sequence[relay.Call]) -> Tuple[tvm.IRModule, int]:
    """``mod`` whose ``main`` also returns ``taps``; and how many outputs it had before them."""
    main = relay.transform.InferType()(mod)["main"]
    body = main.body
    outputs = list(body.fields) if isinstance(body, relay.Tuple) else [body]
    func = relay.Function(main.params, relay.Tuple(outputs + list(taps)), None, main.type_params, main.attrs)
    return tvm.IRModule.from_expr(func), len(outputs)


def bit_equal(outputs: Sequence[np.ndarray], references: Sequence[np.ndarray]) -> bool:
    """Whether two lists of arrays are equal bit for bit (a NaN equals the same NaN; -0.0 is not 0.0).

    Examples
    --------
    >>> bit_equal([np.array([0.0], "float32")], [np.array([-0.0], "float32")])
    False
    >>> bit_equal([np.arange(3)], [np.arange(3)])
    True
    """
    if len(outputs) != len(references):
        return False
    return all(a.shape == b.shape and a.dtype == b.dtype
               and np.array_equal(a.view(f"u{a.dtype.itemsize}"), b.view(f"u{b.dtype.itemsize}"))
               for a, b in zip(outputs, references))


def _differs(got: np.ndarray, want: np.ndarray) -> Tuple[int, float]:
    """Elements that differ bit for bit, and the largest absolute difference."""
    width = f"u{got.dtype.itemsize}"
    unequal = got.view(width) != want.view(width)
    count = int(np.count_nonzero(unequal))
    if not count:
        return 0, 0.0
    gap = np.abs(got[unequal].astype(np.float64) - want[unequal].astype(np.float64))
    return count, float(np.nanmax(gap)) if np.isfinite(gap).any() else float("nan")


def _compare(mod, params, inputs, timeout, target, calls, indices) -> List[Tuple[int, Optional[NodeDifference]]]:
    """Run both builds of ``mod`` tapped at ``calls[i]`` for ``i`` in ``indices``: ``[(index, NodeDifference
    or None)]``."""
    tapped, n_out = _tapped(mod, [calls[i] for i in indices])
    hexagon = _run_model(tapped, params, inputs, timeout, target)
    x86 = x86_reference(tapped, params, inputs, target)
    if len(hexagon) != len(x86) or len(hexagon) != n_out + len(indices):
        raise RuntimeError(f"the tapped builds returned {len(hexagon)} (Hexagon) and {len(x86)} (x86) outputs, "
                           f"expected {n_out + len(indices)}")
    found = []
    for index, got, want in zip(indices, hexagon[n_out:], x86[n_out:]):
        count, largest = _differs(got, want)
        call = calls[index]
        found.append((index, None if not count else NodeDifference(
            index, _op_name(call), _node_name(call), tuple(got.shape), str(got.dtype), count, int(got.size), largest)))
    return found


def differential_run(mod: tvm.IRModule, params: Optional[Mapping[str, Any]] = None,
                     inputs: Inputs = (), timeout: float = 600,
                     target: Union[None, str, "tvm.target.Target"] = None, nodes: str = "auto") -> NodeReport:
    """Run an integer model on emulated Hexagon and on x86 recording its nodes' values; find the first that differs.

    Parameters
    ----------
    mod, params, inputs, timeout, target
        As :func:`run_model` takes them (``mod`` is not modified;
        ``timeout`` is per emulated run).
    nodes : str
        Which calls to record, one of :data:`NODE_CHOICES`.

    Returns
    -------
    NodeReport
        Its :meth:`~NodeReport.summary` names the first differing node in one line.

    Raises
    ------
    TypeError, ValueError
        For a bad argument (before any build), naming it and what it takes.
    RuntimeError
        As :func:`run_model`.

    Examples
    --------
    Skipped by the doctest run (it needs qemu-user, clang-16 and lld-16);
    ``python_tests/dotprod/test_hexagon_model.py`` runs it.

    >>> x = relay.var("x", shape=(2, 3), dtype="int32")
    >>> mod = tvm.IRModule.from_expr(relay.Function([x], relay.clip(x * relay.const(2), 0, 5)))
    >>> differential_run(mod, inputs=[np.ones((2, 3), "int32")]).summary()  # doctest: +SKIP
    'Hexagon and x86 agree bit for bit on the outputs and on all 2 recorded of 2 nodes'
    """
    if nodes not in NODE_CHOICES:
        raise ValueError(f"nodes must be one of {NODE_CHOICES}, got {nodes!r}")
    target, mod, params, inputs = _checked(mod, params, inputs, timeout, target)
    mod = relay.transform.InferType()(mod)
    calls = model_calls(mod, params)
    if nodes == "all":
        first_pass = list(range(len(calls)))
    else:
        first_pass = [i for i, c in enumerate(calls) if str(c.checked_type.dtype) in BOUNDARY_DTYPES]
    # The model's own outputs come from a build without taps: the one run_model makes.
    outputs = _run_model(mod, params, inputs, timeout, target)
    outputs_equal = bit_equal(outputs, x86_reference(mod, params, inputs, target))
    found = _compare(mod, params, inputs, timeout, target, calls, first_pass)
    recorded = {index: diff for index, diff in found}
    if nodes == "auto":
        bad = [index for index, diff in found if diff is not None]
        if bad or not outputs_equal:
            stop = bad[0] if bad else len(calls) - 1
            start = max([index for index, diff in found if diff is None and index < stop], default=-1)
            inner = [i for i in range(start + 1, stop + 1) if i not in recorded]
            if inner:
                recorded.update(_compare(mod, params, inputs, timeout, target, calls, inner))
    differences = [recorded[i] for i in sorted(recorded) if recorded[i] is not None]
    return NodeReport(outputs, outputs_equal, len(recorded), len(calls), differences)
