"""Turning benchmark values (timings, ratios, numpy scalars) into plain JSON values."""
from __future__ import annotations

import dataclasses
import math


def jsonable(value):
    """``value`` with timings, ratios and numpy scalars made JSON-ready; ``nan``/``inf`` become ``None``.

    Examples
    --------
    >>> import numpy as np
    >>> jsonable({"x": np.float32(0.5), "y": [float("nan")], "z": (1, 2)})
    {'x': 0.5, 'y': [None], 'z': [1, 2]}
    """
    if hasattr(value, "as_dict"):
        return jsonable(value.as_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None  # strict JSON has no nan/inf
    return value
