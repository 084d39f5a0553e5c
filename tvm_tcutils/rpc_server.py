"""``python -m tvm_tcutils.rpc_server``: TVM's RPC server with the package's runtime functions registered.

Candidates of the package's graph-style toolchains (``ort``, ``openvino``,
``blas``) call packed functions (``tvm_tcutils.ort.run`` ...) at run time, so
the server that runs them must have them: this entry point is TVM's own
server (:class:`tvm.rpc.Server`, the flags of ``python -m tvm.exec.rpc_server``)
whose processes import :mod:`tvm_tcutils` first, which registers them. A stock
TVM server still serves the ``tvm`` toolchain; Collage leaves out, with a
warning, the toolchains the servers of a key cannot run.

On a device::

    python -m tvm_tcutils.rpc_server --host 192.168.1.23 --tracker HOST:9190 --key rasp4

A TVM RPC server loads and runs whatever library a client uploads: it belongs on
a trusted network only. So ``--host`` has no default (name the address of the
interface the tracker and clients reach, not every interface), and the server
says so when it starts. The server's process dies with this one (a killed
launcher leaves no server).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import List, Optional

from .processes import PackageServerInit


def parser() -> argparse.ArgumentParser:
    """The flags of ``python -m tvm.exec.rpc_server``.

    Examples
    --------
    >>> parser().parse_args(["--host", "127.0.0.1", "--tracker", "127.0.0.1:9190", "--key", "rasp4"]).port
    9090
    """
    p = argparse.ArgumentParser(prog="python -m tvm_tcutils.rpc_server", description=__doc__.splitlines()[0])
    p.add_argument("--host", required=True,
                   help="address the server binds to (required: the interface clients reach; "
                        "the server runs what they upload, so a trusted network only)")
    p.add_argument("--port", type=int, default=9090, help="first port to try")
    p.add_argument("--port-end", type=int, default=9199, help="end of the port range to try")
    p.add_argument("--through-proxy", dest="through_proxy", action="store_true",
                   help="serve through a proxy: --host and --port are the proxy's")
    p.add_argument("--tracker", help="the RPC tracker, HOST:PORT")
    p.add_argument("--key", default="", help="the device key to register with the tracker")
    p.add_argument("--silent", action="store_true", help="log errors only")
    p.add_argument("--load-library", help="additional libraries to load, ':'-separated")
    p.add_argument("--no-fork", dest="fork", action="store_false",
                   help="spawn instead of fork per session (for ROCm/Metal/OpenCL compilers)")
    p.add_argument("--custom-addr", help="address to report to the tracker")
    return p


def main(argv: Optional[List[str]] = None) -> int:
    """Start the server and serve until killed."""
    from .rpc import parse_tracker

    args = parser().parse_args(argv)
    tracker = None
    if args.tracker:
        try:
            address = parse_tracker(args.tracker, "--tracker")
        except ValueError as err:
            print(f"tvm_tcutils.rpc_server: error: {err}", file=sys.stderr)
            return 2
        if not args.key:
            print("tvm_tcutils.rpc_server: error: --tracker needs --key KEY", file=sys.stderr)
            return 2
        tracker = (address.host, address.port)
    from tvm import rpc

    logging.basicConfig(level=logging.INFO)
    print(f"tvm_tcutils.rpc_server: serving on {args.host}; a TVM RPC server runs any library a client "
          "uploads: run it on a trusted network only", file=sys.stderr, flush=True)
    server = rpc.Server(args.host, args.port, args.port_end, is_proxy=args.through_proxy, key=args.key,
                        tracker_addr=tracker, load_library=args.load_library, custom_addr=args.custom_addr,
                        silent=args.silent, no_fork=not args.fork,
                        server_init_callback=PackageServerInit(os.getpid()))
    server.proc.join()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
