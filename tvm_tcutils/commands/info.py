"""``tvm-tcutils info``: the TVM found, what it can do, and the hooks installed."""
from __future__ import annotations

import argparse
import os

HELP = "print the TVM version and path, available capabilities and registered hooks"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", action="store_true", help="also list the built-in models")
    parser.add_argument("--rpc-tracker", metavar="HOST:PORT", default=None,
                        help="list this RPC tracker's queue instead: device keys, total, free and pending servers")


def run(args: argparse.Namespace) -> int:
    import tvm_tcutils
    from tvm_tcutils.models import ZOO

    if args.rpc_tracker:
        return _tracker_queue(args.rpc_tracker)
    caps = tvm_tcutils.capabilities()
    yes = lambda flag: "yes" if flag else "no"  # noqa: E731
    tested = "" if caps["tvm_tested"] else f" (untested; tested: {', '.join(tvm_tcutils.TESTED_TVM_VERSIONS)})"
    print(f"tvm-tcutils {tvm_tcutils.__version__}")
    print(f"TVM {caps['tvm_version']}{tested} at {caps['tvm_path']}")
    print("capabilities:")
    print(f"  relay            {yes(caps['relay'])}")
    print(f"  autotvm          {yes(caps['autotvm'])}")
    print(f"  llvm             {caps['llvm_version'] or 'no'} (targets: {', '.join(caps['llvm_targets']) or 'none'})")
    print(f"  cuda codegen     {_cuda_codegen(caps)}")
    print(f"  cuda device      {_cuda_device(caps)}")
    print(f"  hexagon codegen  {yes(caps['hexagon_codegen'])} (qemu emulation: {yes(caps['hexagon_emulator'])})")
    print(f"  onnxruntime      {caps['onnxruntime'] or 'no'}")
    print(f"  int8 kernels     {_int8_kernels()}")
    if caps["native_helpers"]:
        from tvm_tcutils.collage.toolchains.packed_call import native_module_maker, parking

        kind = "native modules" if native_module_maker() is not None else "compiled wrappers"
        print(f"  native helpers   {caps['native_helpers']} (toolchain calls: {parking()}; partitions: {kind})")
    else:
        print("  native helpers   no (pure-Python paths; scripts/build_native.sh builds them)")
    rows = tvm_tcutils.registered()
    print(f"registered hooks ({len(rows)}):")
    for row in rows:
        print(f"  {row}")
    if args.models:
        print("built-in models:")
        for model in ZOO.values():
            print(f"  {model.name:<14} {model.description}")
    return 0


def _int8_kernels() -> str:
    """This CPU's int8 kernel families: the 4-way dot-product row (with the instructions it keeps in flight,
    which size the fallback tiles, where they matter), and whether AMX tiles run here (why not)."""
    import tvm_tcutils
    from tvm_tcutils.dotprod import amx, cpu_facts
    from tvm_tcutils.dotprod.isa import for_target
    from tvm.target import Target

    host = tvm_tcutils.host_target()
    vector = for_target(host)
    name = vector.name if vector else "none"
    if vector is not None and vector.conv_tile_pixels:
        chains = cpu_facts.chains_in_flight(vector, Target(host))
        name += f" ({chains:g} instructions in flight)" if chains else " (instructions in flight unknown)"
    state = amx.state()
    return f"{name}; AMX tiles {'yes' if state.usable else 'no'} ({state.reason})"


def _cuda_codegen(caps: dict) -> str:
    """``yes (plugin: PATH; NVRTC 13.0; toolkit PATH)`` or ``no (why)``."""
    from tvm_tcutils.cuda import COMPILERS

    if not caps["cuda_codegen"]:
        return f"no ({caps['cuda_reason'] or 'TVM has no target.build.cuda'})"
    parts = [f"plugin: {caps['cuda_plugin']}" if caps["cuda_plugin"] else "TVM's own code generator"]
    if caps["cuda_nvrtc"]:
        parts.append(f"NVRTC {caps['cuda_nvrtc']}")
    if caps["cuda_compiler"] is None:
        chosen = os.environ.get("TVM_TCUTILS_CUDA_COMPILER", "")
        parts.append(f"TVM_TCUTILS_CUDA_COMPILER={chosen!r} is not one of {', '.join(COMPILERS)}")
    elif caps["cuda_compiler"] != "nvrtc":
        parts.append(f"compiles with {caps['cuda_compiler']}")
    parts.append(f"toolkit {caps['cuda_toolkit']}" if caps["cuda_toolkit"] else "no toolkit")
    return f"yes ({'; '.join(parts)})"


def _cuda_device(caps: dict) -> str:
    """``yes (sm_80)`` or ``no (why: the driver's error, or no GPU)``."""
    if caps["cuda_device"]:
        return f"yes ({caps['cuda_arch']})"
    return f"no ({caps['cuda_driver'] or 'no GPU'})"


def _tracker_queue(address: str) -> int:
    """Print an RPC tracker's queue, like ``python -m tvm.exec.query_rpc_tracker``."""
    from tvm_tcutils.rpc import RPCError, parse_tracker, queue_lines

    from ._common import CommandError

    try:
        lines = queue_lines(parse_tracker(address))
    except RPCError as err:
        raise CommandError(str(err)) from None
    print("\n".join(lines))
    return 0
