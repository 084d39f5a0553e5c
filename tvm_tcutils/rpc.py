"""Measuring on other machines through TVM's RPC tracker.

TVM's RPC system is how TVM users measure on devices: a tracker on one host
(``python -m tvm.exec.rpc_tracker``), a server on each device
(``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``, or
:mod:`tvm_tcutils.rpc_server` for toolchains that need the package's runtime
functions), and clients that ask the tracker for a free server of a key. This
module is the package's client side:

* :class:`Tracker` and :func:`parse_tracker` (``HOST:PORT``, or AutoTVM's
  ``TVM_TRACKER_HOST``/``TVM_TRACKER_PORT`` through :func:`tracker_from_env`);
* :func:`check_reachable`, a handshake with a short timeout whose error names
  the address (TVM's own client retries for a minute);
* :func:`queue`, the tracker's servers per key, like
  ``python -m tvm.exec.query_rpc_tracker``;
* :class:`RemoteBackend`, a :class:`tvm_tcutils.measure.Backend`: a library
  built here (cross-compiled for the device's target) is uploaded to a free
  server of the key, loaded, timed by :class:`tvm_tcutils.measure.Timer` with
  the remote ``time_evaluator``, and removed.

The tracker gives a server to one session at a time, so each server measures
one module at a time and its timings stay clean.

Examples
--------
>>> parse_tracker("127.0.0.1:9190")
Tracker(host='127.0.0.1', port=9190)
>>> str(RemoteBackend(Tracker("10.0.0.2", 9190), "rasp4"))
'rasp4 at 10.0.0.2:9190'
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import struct
import tempfile
import uuid
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from ._tvm import tvm
from .measure import Backend, Loaded, graph_module

#: AutoTVM's environment variables naming the tracker; :data:`ENV_KEY` names the device key.
ENV_HOST, ENV_PORT = "TVM_TRACKER_HOST", "TVM_TRACKER_PORT"
ENV_KEY = "TVM_TCUTILS_RPC_KEY"

#: Seconds the reachability check and the queue query wait for the tracker.
REACH_TIMEOUT = 5.0

#: Seconds a session may last before the server ends it (a hung measurement frees its server).
SESSION_TIMEOUT = 600.0

#: How to start the pieces, quoted in error messages.
START_TRACKER = "python -m tvm.exec.rpc_tracker --host HOST --port PORT"
START_SERVER = "python -m tvm_tcutils.rpc_server --host ADDRESS --tracker HOST:PORT --key KEY"


class RPCError(RuntimeError):
    """A tracker or server could not be used: unreachable, no server for the key, a lost session."""


@dataclasses.dataclass(frozen=True)
class Tracker:
    """The address of an RPC tracker.

    Examples
    --------
    >>> str(Tracker("localhost", 9190))
    'localhost:9190'
    """

    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_tracker(text: str, argument: str = "--rpc-tracker") -> Tracker:
    """``HOST:PORT`` as a :class:`Tracker`; a ValueError naming ``argument`` for anything else.

    Examples
    --------
    >>> parse_tracker("[::1]:9190")
    Tracker(host='::1', port=9190)
    >>> parse_tracker("localhost")
    Traceback (most recent call last):
    ...
    ValueError: --rpc-tracker 'localhost': expected HOST:PORT, e.g. 127.0.0.1:9190
    """
    if not isinstance(text, str):
        raise TypeError(f"{argument} must be a 'HOST:PORT' string, got {type(text).__name__}")
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")  # an IPv6 address in brackets
    if not sep or not host or not port.isdigit():
        raise ValueError(f"{argument} {text!r}: expected HOST:PORT, e.g. 127.0.0.1:9190")
    if not 0 < int(port) < 65536:
        raise ValueError(f"{argument} {text!r}: the port must lie in 1..65535")
    return Tracker(host, int(port))


def tracker_from_env(environ: Mapping[str, str] = os.environ) -> Optional[Tracker]:
    """The tracker AutoTVM's ``TVM_TRACKER_HOST`` and ``TVM_TRACKER_PORT`` name (port 9190 by default), or None.

    Examples
    --------
    >>> tracker_from_env({"TVM_TRACKER_HOST": "10.0.0.2"})
    Tracker(host='10.0.0.2', port=9190)
    >>> tracker_from_env({}) is None
    True
    """
    host = environ.get(ENV_HOST, "").strip()
    if not host:
        return None
    port = environ.get(ENV_PORT, "9190").strip() or "9190"
    return parse_tracker(f"{host}:{port}", f"{ENV_HOST}/{ENV_PORT}")


# ---------------------------------------------------------------------------
# Talking to the tracker (TVM's protocol: a magic number, then length-prefixed JSON)
# ---------------------------------------------------------------------------
@contextlib.contextmanager
def _tracker_socket(tracker: Tracker, timeout: Optional[float]) -> Iterator[socket.socket]:
    from tvm.rpc import base

    try:
        sock = socket.create_connection((tracker.host, tracker.port), timeout=timeout)
    except OSError as err:
        raise RPCError(f"RPC tracker {tracker} is not reachable ({err.strerror or err}); start one with "
                       f"'{START_TRACKER}' or check --rpc-tracker") from None
    try:
        sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
        magic = struct.unpack("<i", base.recvall(sock, 4))[0]
        if magic != base.RPC_TRACKER_MAGIC:
            raise RPCError(f"{tracker} answers, but it is not a TVM RPC tracker")
        yield sock
    except socket.timeout:
        raise RPCError(f"RPC tracker {tracker} is not reachable (no answer within {timeout:g} s); check "
                       "--rpc-tracker") from None
    except (OSError, RuntimeError) as err:  # recvall raises RuntimeError on a closed connection
        if isinstance(err, RPCError):
            raise
        raise RPCError(f"RPC tracker {tracker} is not reachable (the connection failed: {err})") from None
    finally:
        sock.close()


def check_reachable(tracker: Tracker, timeout: float = REACH_TIMEOUT) -> None:
    """Raise :class:`RPCError` naming ``tracker`` unless a TVM tracker answers there within ``timeout`` s.

    Examples
    --------
    >>> check_reachable(Tracker("127.0.0.1", 1), timeout=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.rpc.RPCError: RPC tracker 127.0.0.1:1 is not reachable (...)...
    """
    with _tracker_socket(tracker, timeout):
        pass


@dataclasses.dataclass(frozen=True)
class KeyQueue:
    """One device key at a tracker: its servers, how many are free, how many requests wait."""

    key: str
    total: int
    free: int
    pending: int


def queue(tracker: Tracker, timeout: float = REACH_TIMEOUT) -> Dict[str, KeyQueue]:
    """The tracker's queue per device key (what ``python -m tvm.exec.query_rpc_tracker`` prints).

    Raises :class:`RPCError` naming the address when no tracker answers.
    """
    from tvm.rpc import base

    with _tracker_socket(tracker, timeout) as sock:
        base.sendjson(sock, [base.TrackerCode.SUMMARY])
        answer = base.recvjson(sock)
    if answer[0] != base.TrackerCode.SUCCESS:
        raise RPCError(f"RPC tracker {tracker} refused the summary request: {answer}")
    summary = answer[1]
    totals: Dict[str, int] = {}
    for server in summary["server_info"]:
        key = server["key"].split(":")[1]  # "server:KEY" or "server:KEY:random"
        totals[key] = totals.get(key, 0) + 1
    rows = {}
    for key, info in summary["queue_info"].items():
        rows[key] = KeyQueue(key, totals.get(key, 0), int(info["free"]), int(info["pending"]))
    return dict(sorted(rows.items()))


def queue_lines(tracker: Tracker, timeout: float = REACH_TIMEOUT) -> List[str]:
    """The queue as a table: one line per key with servers or waiting requests.

    Examples
    --------
    >>> queue_lines(Tracker("127.0.0.1", 1), timeout=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.rpc.RPCError: RPC tracker 127.0.0.1:1 is not reachable ...
    """
    rows = [row for row in queue(tracker, timeout).values() if row.total or row.pending]
    width = max([len("key")] + [len(row.key) for row in rows]) + 2
    lines = [f"RPC tracker {tracker}", f"{'key':<{width}}{'total':>6}{'free':>6}{'pending':>9}"]
    lines += [f"{row.key:<{width}}{row.total:>6}{row.free:>6}{row.pending:>9}" for row in rows]
    if not rows:
        lines.append(f"(no servers; start one with '{START_SERVER}')")
    return lines


def servers(tracker: Tracker, key: str, timeout: float = REACH_TIMEOUT) -> KeyQueue:
    """The queue row of ``key``; :class:`RPCError` naming the keys there are when it has no server.

    Examples
    --------
    >>> servers(Tracker("127.0.0.1", 1), "x", timeout=1)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tvm_tcutils.rpc.RPCError: RPC tracker 127.0.0.1:1 is not reachable ...
    """
    rows = queue(tracker, timeout)
    row = rows.get(key)
    if row is None or row.total == 0:
        known = ", ".join(name for name, r in rows.items() if r.total) or "none"
        raise RPCError(f"RPC tracker {tracker} has no server for key {key!r} (keys with servers: {known}); "
                       f"start one with '{START_SERVER}'")
    return row


def request(tracker: Tracker, key: str, priority: int = 1,
            session_timeout: float = SESSION_TIMEOUT) -> Tuple["tvm.rpc.RPCSession", str]:
    """A session on a free server of ``key`` (waiting in the tracker's queue), and that server's ``host:port``.

    TVM's :meth:`tvm.rpc.TrackerSession.request` hides which server answered;
    the logs of a measurement name it.
    """
    from tvm import rpc
    from tvm.rpc import base

    with _tracker_socket(tracker, REACH_TIMEOUT) as sock:
        sock.settimeout(None)  # waiting for a free server is the queue's job
        base.sendjson(sock, [base.TrackerCode.REQUEST, key, "", priority])
        answer = base.recvjson(sock)
    if answer[0] != base.TrackerCode.SUCCESS:
        raise RPCError(f"RPC tracker {tracker} refused a request for key {key!r}: {answer}")
    host, port, match_key = answer[1]
    where = f"{host}:{port}"
    try:
        return rpc.connect(host, port, match_key, session_timeout), where
    except tvm.TVMError as err:
        raise RPCError(f"RPC server {where} (key {key!r}) refused the session: {_last_line(err)}") from None


#: Words of the errors a session raises when its server died, hung up or dropped the connection
#: (TVM's endpoint reports ``kShutdown``; sockets report resets and broken pipes).
LOST_SESSION_SIGNS = ("kShutdown", "RPCSessionTimeoutError", "Connection reset", "Broken pipe",
                      "connection closed", "Socket", "socket")


def lost_session(err: BaseException) -> bool:
    """Whether ``err`` says the session's server went away (a retry elsewhere may succeed), not that the module failed.

    Examples
    --------
    >>> lost_session(RuntimeError("Check failed: (code == RPCCode::kReturn) is false: code=kShutdown"))
    True
    >>> lost_session(RuntimeError("Check failed: x == y"))
    False
    """
    text = str(err)
    return isinstance(err, (RPCError, OSError)) or any(sign in text for sign in LOST_SESSION_SIGNS)


def _last_line(err: BaseException) -> str:
    from .measure import error_line

    return error_line(err)


# ---------------------------------------------------------------------------
# Libraries for the device
# ---------------------------------------------------------------------------
def _android(triple: str) -> Callable:
    from tvm.contrib import ndk

    return ndk.create_shared  # the compiler named by TVM_NDK_CC


def _gnu_cross(triple: str) -> Callable:
    from tvm.contrib import cc

    return cc.cross_compiler(f"{triple}-g++")


#: How a library is linked for a ``-mtriple`` other than this machine's: the first
#: rule whose word occurs in the triple (``-`` matches every triple: the GNU cross
#: compiler named after it, e.g. ``aarch64-linux-gnu-g++``).
LINKERS: Tuple[Tuple[str, Callable[[str], Callable]], ...] = (
    ("android", _android),
    ("-", _gnu_cross),
)


def linker(target: Optional[str], compiler: Optional[str] = None) -> Optional[Callable]:
    """The ``fcompile`` that exports a library built for ``target`` (None: this machine's compiler).

    ``compiler`` (a command) overrides the :data:`LINKERS` rules.

    Examples
    --------
    >>> linker("llvm") is None
    True
    >>> linker("llvm -mtriple=aarch64-linux-gnu").__name__
    '_fcompile'
    """
    from tvm.contrib import cc

    if compiler:
        return cc.cross_compiler(compiler)
    triple = str(tvm.target.Target(target).attrs.get("mtriple") or "") if target else ""
    system = str(tvm.target.codegen.llvm_get_system_triple())
    if not triple or triple.split("-")[0] == system.split("-")[0]:
        return None
    return next(make(triple) for word, make in LINKERS if word in triple)


def _target_of(lib) -> Optional[str]:
    targets = getattr(lib, "target", None)
    if isinstance(targets, Mapping):
        targets = list(targets.values())
    return str(targets[0]) if targets else None


class RemoteBackend(Backend):
    """Time built modules on a server of TVM's RPC tracker: upload, load, ``time_evaluator``, remove.

    Parameters
    ----------
    tracker : Tracker
        The tracker's address.
    key : str
        The device key the servers registered with.
    priority : int
        The tracker serves higher priorities first.
    session_timeout : float
        Seconds after which the server ends a session (0: never): a hung
        measurement frees its server.
    compiler : str, optional
        Cross compiler that links the library (default from the target's
        ``-mtriple``, see :func:`linker`).

    Examples
    --------
    >>> backend = RemoteBackend(Tracker("10.0.0.2", 9190), "rasp4")
    >>> backend.cache_key, backend.name
    ('rpc:rasp4', 'rpc')
    >>> RemoteBackend(Tracker("h", 1), "")
    Traceback (most recent call last):
    ...
    ValueError: key must be a non-empty device key (the --key the servers registered with), got ''
    """

    name = "rpc"

    def __init__(self, tracker: Tracker, key: str, priority: int = 1, session_timeout: float = SESSION_TIMEOUT,
                 compiler: Optional[str] = None):
        if not isinstance(tracker, Tracker):
            raise TypeError(f"tracker must be a Tracker (see parse_tracker), got {type(tracker).__name__}")
        if not isinstance(key, str) or not key.strip() or ":" in key:
            raise ValueError(f"key must be a non-empty device key (the --key the servers registered with), got {key!r}")
        if not session_timeout >= 0:
            raise ValueError(f"session_timeout must be >= 0 seconds, got {session_timeout}")
        self.tracker, self.key, self.priority = tracker, key, int(priority)
        self.session_timeout, self.compiler = float(session_timeout), compiler

    @property
    def cache_key(self) -> str:
        """The device key: costs measured on different devices never share a cache entry."""
        return f"rpc:{self.key}"

    def __str__(self) -> str:
        return f"{self.key} at {self.tracker}"

    def __reduce__(self):  # travels to worker processes
        return (RemoteBackend, (self.tracker, self.key, self.priority, self.session_timeout, self.compiler))

    def lost(self, err: BaseException) -> bool:
        """Whether ``err`` says the server went away (see :func:`lost_session`)."""
        return lost_session(err)

    def missing(self, functions: Sequence[str]) -> List[str]:
        """Which of the global ``functions`` a server of the key lacks (asked in a short session)."""
        session, _ = request(self.tracker, self.key, self.priority, self.session_timeout)
        absent = []
        for name in functions:
            try:
                session.get_function(name)
            except (tvm.TVMError, AttributeError):  # TVM raises for a name the server does not have
                absent.append(name)
        return absent

    def servers(self) -> KeyQueue:
        """The key's row in the tracker's queue (:class:`RPCError` when the tracker or the key has none)."""
        return servers(self.tracker, self.key)

    def autotvm_runner(self, number: int, repeat: int = 1, min_repeat_ms: int = 0, timeout: float = 20.0,
                       n_parallel: Optional[int] = None):
        """AutoTVM's ``RPCRunner`` for this key; ``n_parallel`` defaults to the key's free servers.

        The tracker's queue spreads the measurements over its servers, one at a time each.
        """
        from tvm import autotvm

        if n_parallel is None:
            n_parallel = max(self.servers().free, 1)
        return autotvm.RPCRunner(self.key, self.tracker.host, self.tracker.port, priority=self.priority,
                                 timeout=timeout, n_parallel=n_parallel, number=number, repeat=repeat,
                                 min_repeat_ms=min_repeat_ms)

    @contextlib.contextmanager
    def one_server(self) -> Iterator["RemoteBackend"]:
        """Within the block, every :meth:`load` goes to one server, in one session.

        Competitors timed in turns (:func:`tvm_tcutils.measure.interleave`)
        must run on the same device, and each would otherwise hold a server
        of its own (with one server, the second would wait for ever).
        """
        self._held = request(self.tracker, self.key, self.priority, self.session_timeout)
        try:
            yield self
        finally:
            self._held = None

    def load(self, lib, inputs: Mapping[str, np.ndarray], debug: bool = False) -> Loaded:
        """Export ``lib`` for its target, upload it to a free server, load it there with ``inputs`` set."""
        held = getattr(self, "_held", None)
        session, where = held or request(self.tracker, self.key, self.priority, self.session_timeout)
        name = f"tcutils-{uuid.uuid4().hex}.so"
        with tempfile.TemporaryDirectory(prefix="tcutils-rpc-") as directory:
            path = os.path.join(directory, name)
            lib.export_library(path, fcompile=linker(_target_of(lib), self.compiler))
            try:
                session.upload(path)
                remote = session.load_module(name)
                target = _target_of(lib)
                device = session.device(str(tvm.target.Target(target).kind.name) if target else "cpu")
                runner = graph_module(remote, inputs, debug, device=device)
            except tvm.TVMError as err:
                raise RPCError(f"RPC server {where} (key {self.key!r}) failed to load the module: "
                               f"{_last_line(err)}") from err

        def release() -> None:
            try:
                session.remove(name)
            except tvm.TVMError:  # the session ended already (timeout, a dead server): its directory goes with it
                pass

        return Loaded(runner, device, release, where)
