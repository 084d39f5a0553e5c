"""The persistent cost store: measured costs on disk, one JSON record a line.

``costs.jsonl`` in the cache directory holds one record per measurement,
appended as it is taken; the last record of a key wins. The store is built to
survive what happens to such a file:

* every record carries the schema version :data:`SCHEMA`; records of a newer
  version (a newer release sharing the cache) are left alone;
* a damaged line (cut by a crash, not UTF-8, JSON that is not an object,
  fields of the wrong type) is skipped, with one warning naming the file and
  its line numbers, and the rest of the file is used;
* a cache path that cannot be read or written (a directory where the file
  should be, no permission, a file where the directory should be) leaves the
  store in memory, with a warning, never a crash;
* each record is appended by one ``write`` of the whole line to a file opened
  with ``O_APPEND``, so two processes sharing the cache never interleave
  partial records;
* a failure (``ms`` null, with its ``error``) is not final: :meth:`CostStore.get`
  treats one older than ``failure_ttl`` seconds (or any, with
  ``retry_failed``) as unknown, so it is measured again.

Examples
--------
>>> import tempfile
>>> store = CostStore(tempfile.mkdtemp())
>>> store.put("k", {"ms": 1.5, "toolchain": "tvm", "ops": ["add"]})
>>> CostStore(store.directory).get("k")["ms"]
1.5
"""
from __future__ import annotations

import json
import logging
import math
import os
import time
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from ...files import cache_dir

logger = logging.getLogger("tvm_tcutils.collage")

#: Version of the records this module writes (written as ``"v"``; records without one are version 0).
SCHEMA = 1

#: Default place of the cache (``$TVM_TCUTILS_CACHE`` overrides the parent directory).
DEFAULT_CACHE = cache_dir("collage")

#: Seconds after which a stored failure is measured again.
FAILURE_TTL = 24 * 3600.0


def default_cache_dir() -> str:
    """The cache directory used when none is given.

    Examples
    --------
    >>> default_cache_dir().endswith("collage")
    True
    """
    return DEFAULT_CACHE


def _optional(kind: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or kind(value)


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _string_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


#: Field -> whether a value is valid (a missing optional field is fine; ``key`` is required).
FIELDS: Dict[str, Callable[[object], bool]] = {
    "v": _number,
    "key": lambda value: isinstance(value, str),
    "ms": _optional(_number),
    "toolchain": _optional(lambda value: isinstance(value, str)),
    "ops": _optional(_string_list),
    "error": _optional(lambda value: isinstance(value, str)),
    "when": _optional(lambda value: isinstance(value, str)),
    "time": _optional(_number),
}


def parse_record(raw: bytes) -> Tuple[Optional[dict], str]:
    """One line of the file: ``(record, "")``, or ``(None, why it is damaged)``.

    Examples
    --------
    >>> parse_record(b'{"v": 1, "key": "k", "ms": 2.0}')
    ({'v': 1, 'key': 'k', 'ms': 2.0}, '')
    >>> parse_record(b'{"key": "k", "ms": "fast"}')[1]
    "field 'ms' has the wrong type"
    """
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, "not UTF-8"
    try:
        record = json.loads(text)
    except ValueError:
        return None, "not JSON (cut?)"
    if not isinstance(record, dict):
        return None, f"a JSON {type(record).__name__}, not an object"
    if "key" not in record:
        return None, "no key"
    for field, valid in FIELDS.items():
        if field in record and not valid(record[field]):
            return None, f"field {field!r} has the wrong type"
    return record, ""


class CostStore:
    """Measured costs keyed by strings, kept in ``directory/costs.jsonl`` (or in memory only).

    Parameters
    ----------
    directory : str, optional
        Where the file lives (created on the first write); None keeps the
        store in memory.
    failure_ttl : float
        Seconds a stored failure counts; older ones read as unknown.
    retry_failed : bool
        Read every stored failure as unknown (measure it again).

    Attributes
    ----------
    path : str or None
        The file, or None once the store is in memory only.
    entries : dict
        The last record of each key.
    loaded : int
        How many keys came from the file.
    skipped : list of (int, str)
        Damaged lines left out: line number and why.

    Examples
    --------
    >>> store = CostStore(None)
    >>> store.put("bad", {"ms": float("inf"), "error": "boom"})
    >>> store.get("bad")["error"], CostStore(None, retry_failed=True).get("bad")
    ('boom', None)
    """

    FILE = "costs.jsonl"

    def __init__(self, directory: Optional[str], failure_ttl: float = FAILURE_TTL, retry_failed: bool = False):
        if failure_ttl < 0:
            raise ValueError(f"failure_ttl must be >= 0, got {failure_ttl}")
        self.directory = directory
        self.path: Optional[str] = os.path.join(directory, self.FILE) if directory else None
        self.failure_ttl, self.retry_failed = failure_ttl, retry_failed
        self.entries: Dict[str, dict] = {}
        self.skipped: List[Tuple[int, str]] = []
        self._newline_first = False  # the file ends in a cut line: start the next record on a new line
        self._load()
        self.loaded = len(self.entries)

    # -- reading ------------------------------------------------------------
    def _load(self) -> None:
        if self.path is None or not os.path.lexists(self.path):
            return
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
        except OSError as err:
            self._fall_back("cannot be read", err)
            return
        newer = 0
        for number, raw in enumerate(data.split(b"\n"), start=1):
            if not raw.strip():
                continue
            record, why = parse_record(raw)
            if record is None:
                self.skipped.append((number, why))
            elif record.get("v", 0) > SCHEMA:
                newer += 1
            else:
                self.entries[record["key"]] = record
        self._newline_first = bool(data) and not data.endswith(b"\n")
        if self.skipped:
            shown = ", ".join(f"line {n} ({why})" for n, why in self.skipped[:5])
            more = f" and {len(self.skipped) - 5} more" if len(self.skipped) > 5 else ""
            logger.warning("cost cache %s: skipped %d damaged record(s): %s%s", self.path, len(self.skipped),
                           shown, more)
        if newer:
            logger.info("cost cache %s: %d record(s) of a newer schema left alone", self.path, newer)

    def get(self, key: str) -> Optional[dict]:
        """The record of ``key``; None if there is none, or if it is a failure to measure again."""
        entry = self.entries.get(key)
        if entry is None or not is_failure(entry):
            return entry
        if self.retry_failed or time.time() - float(entry.get("time") or 0.0) > self.failure_ttl:
            return None
        return entry

    # -- writing ------------------------------------------------------------
    def put(self, key: str, entry: Mapping) -> None:
        """Store ``entry`` under ``key`` (appended to the file; ``ms`` ``inf`` is stored as a failure)."""
        record = dict(entry, key=key, v=SCHEMA)
        record.setdefault("time", time.time())
        if record.get("ms") is not None and not math.isfinite(record["ms"]):
            record["ms"] = None  # JSON has no infinity; null reads back as a failure
        self.entries[key] = record
        if self.path is None:
            return
        line = ("\n" if self._newline_first else "") + json.dumps(record, default=str) + "\n"
        try:
            os.makedirs(self.directory, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode("utf-8"))  # one write of the whole line: never interleaved
            finally:
                os.close(fd)
        except OSError as err:
            self._fall_back("cannot be written", err)
            return
        self._newline_first = False

    def _fall_back(self, what: str, err: OSError) -> None:
        logger.warning("cost cache %s %s (%s): costs are kept in memory for this run", self.path, what,
                       err.strerror or err)
        self.path = None


def is_failure(entry: Mapping) -> bool:
    """Whether a record is a failed measurement (its ``ms`` null or infinite).

    Examples
    --------
    >>> is_failure({"ms": None}), is_failure({"ms": 1.0})
    (True, False)
    """
    return not math.isfinite(cost_ms(entry))


def cost_ms(entry: Mapping) -> float:
    """The cost of a record in ms (``inf`` for a failure).

    Examples
    --------
    >>> cost_ms({"ms": 2}), cost_ms({"ms": None})
    (2.0, inf)
    """
    value = entry.get("ms")
    return math.inf if value in (None, "inf") else float(value)
