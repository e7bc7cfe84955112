"""Rows of predictions as strict JSON: what `tpurun predict` prints and writes."""

from __future__ import annotations

import json
from typing import Any

import numpy as np


def to_json(row: dict[str, np.ndarray]) -> dict[str, Any]:
    """A row of numpy predictions as plain values that strict JSON can hold.

    NaN and infinity (a diverged model's outputs) are not JSON: they become null.
    """
    out: dict[str, Any] = {}
    for key, value in row.items():
        value = np.asarray(value)
        if value.dtype.kind in "SO":
            value = np.char.decode(value.astype(bytes), "utf-8")
        if value.dtype.kind in "fc" and not np.all(np.isfinite(value)):
            value = value.astype(object)
            value[~np.isfinite(value.astype(float))] = None
        out[key] = value.tolist()
    return out


def json_line(row: dict[str, np.ndarray]) -> str:
    """One row of predictions as a line of strict JSON (no NaN, no Infinity)."""
    return json.dumps(to_json(row), allow_nan=False)
