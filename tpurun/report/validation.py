"""What a run record's time account must hold to be counted: each field's type and physical bounds.

A record is the model_dir's, so anyone may have edited, truncated or forged it.
`check(goodput)` returns the account as `tpurun.report.goodput` may trust it, or
raises `BadField` naming the first field that is wrong and why:

* times are seconds since 1970, finite, not in the future (a day of clock skew
  allowed), and inside the process's life: after its start, not after its end;
  the death it was told of comes before its start;
* durations and FLOP counts are finite and not negative, and a process's loops,
  saves and evaluations fit in its life; steps and counts are integers >= 0;
* objects are objects, lists are lists, texts are texts; a field not named
  here is ignored (a later tpurun's), a field set to null is absent.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

# Clocks of two machines (a record written elsewhere) may differ; a day is generous.
FUTURE_SLACK = 24 * 3600.0
# What one clock reading may differ from another taken as the same moment (a write's
# `updated` after its `end`): float rounding and a clock's small steps, not more.
SLACK = 1.0
MAX_STEP = 2**62

TIME, DURATION, STEP, TEXT, FLOPS, BOOL = "time", "duration", "step", "text", "flops", "bool"
_WHAT = {
    TIME: "a time (seconds since 1970, not in the future)",
    DURATION: "a duration (seconds, finite, not negative)",
    STEP: f"a step or count (an integer from 0 to {MAX_STEP})",
    TEXT: "a text",
    FLOPS: "a FLOP count or rate (finite, not negative)",
    BOOL: "true or false",
}
# Each field of the account (`tpurun.actions.goodput` writes them), and which are
# required where the object is present: a record without them cannot be accounted.
_OBJECTS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "previous_death": ({"t": TIME, "cause": TEXT, "step": STEP, "step_t": TIME}, ()),
    "training_start": ({"t": TIME, "step": STEP}, ("t", "step")),
    "first_loop": ({"steps": STEP, "seconds": DURATION, "input_seconds": DURATION}, ()),
    "loops": (
        {"count": STEP, "steps": STEP, "seconds": DURATION, "input_seconds": DURATION},
        (),
    ),
    "last": ({"step": STEP, "t": TIME}, ()),
    "end": ({"t": TIME, "reason": TEXT, "step": STEP}, ("t",)),
    "device": ({"kind": TEXT, "replicas": STEP}, ()),
    # Whether a resume of the process's run is bit-identical (tpurun.run_config.determinism).
    "resume": ({"bit_identical": BOOL, "deterministic": BOOL, "why": TEXT}, ("bit_identical",)),
}
_LISTS: dict[str, tuple[dict[str, str], tuple[str, ...]]] = {
    "saves": (
        {"step": STEP, "t": TIME, "blocking_s": DURATION, "reached_t": TIME},
        ("step", "t", "blocking_s"),
    ),
    "evaluations": ({"step": STEP, "t": TIME, "seconds": DURATION}, ("step", "t", "seconds")),
}
_VALUES = {
    "process_start": TIME,
    "spawned_at": TIME,
    "supervisor_start": TIME,
    "cluster_ready": TIME,
    "updated": TIME,
    "restart": STEP,
    "model_flops_per_step": FLOPS,
    "peak_flops_per_s": FLOPS,
    "peak_why": TEXT,
}


class BadField(ValueError):
    """`field` (dotted: `goodput.saves[3].t`) is wrong: `reason`."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def check(goodput: Any, now: float | None = None) -> dict[str, Any]:
    """The `goodput` object of a run record, its nulls dropped, if every field holds; else
    BadField naming the first that does not."""
    now = time.time() if now is None else now
    account = _object("goodput", goodput, _VALUES, ("process_start",), now)
    for name, (fields, required) in _OBJECTS.items():
        if name in account:
            account[name] = _object(f"goodput.{name}", account[name], fields, required, now)
    for name, (fields, required) in _LISTS.items():
        if name in account:
            items = account[name]
            if not isinstance(items, list):
                raise BadField(f"goodput.{name}", f"is {_kind(items)}, not a list")
            account[name] = [
                _object(f"goodput.{name}[{i}]", item, fields, required, now)
                for i, item in enumerate(items)
            ]
    _check_order(account)
    return account


def _object(
    where: str, value: Any, fields: Mapping[str, str], required: tuple[str, ...], now: float
) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BadField(where, f"is {_kind(value)}, not an object")
    checked = {key: item for key, item in value.items() if item is not None}
    for key in required:
        if key not in checked:
            raise BadField(f"{where}.{key}", "is missing")
    for key, kind in fields.items():
        if key in checked:
            _value(f"{where}.{key}", checked[key], kind, now)
    return checked


def _value(where: str, value: Any, kind: str, now: float) -> None:
    if kind == TEXT:
        ok = isinstance(value, str)
    elif kind == BOOL:
        ok = isinstance(value, bool)
    elif kind == STEP:
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP
    else:
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = number and math.isfinite(value) and value >= 0
        if ok and kind == TIME:
            ok = value <= now + FUTURE_SLACK
    if not ok:
        shown = repr(value) if isinstance(value, (int, float, bool)) else _kind(value)
        raise BadField(where, f"is {shown}, not {_WHAT[kind]}")


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a text", bool: "a boolean"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else "null")


def _check_order(account: dict[str, Any]) -> None:
    """The times inside the process's life, the death before it, the durations within it."""
    start = float(account["process_start"])
    end = account.get("end", {}).get("t")
    if end is not None and end < start:
        raise BadField("goodput.end.t", f"is {end!r}, before the process's start ({start!r})")
    # The last moment the record speaks of: its end, or its last write.
    last_write = max(float(end or start), float(account.get("updated", start)))
    moments = [
        ("goodput.cluster_ready", account.get("cluster_ready")),
        ("goodput.updated", account.get("updated")),
        ("goodput.training_start.t", account.get("training_start", {}).get("t")),
        ("goodput.last.t", account.get("last", {}).get("t")),
    ]
    for name in ("saves", "evaluations"):
        for i, item in enumerate(account.get(name, [])):
            moments.append((f"goodput.{name}[{i}].t", item["t"]))
            moments.append((f"goodput.{name}[{i}].reached_t", item.get("reached_t")))
    for field, moment in moments:
        if moment is not None and not start - SLACK <= moment <= last_write + SLACK:
            raise BadField(
                field, f"is {moment!r}, outside the process's life ({start!r} to {last_write!r})"
            )
    death = account.get("previous_death", {})
    for key in ("t", "step_t"):
        if death.get(key) is not None and death[key] > start + SLACK:
            raise BadField(
                f"goodput.previous_death.{key}",
                f"is {death[key]!r}, after this process started ({start!r})",
            )
    _check_durations(account, last_write)


def _check_durations(account: dict[str, Any], last_write: float) -> None:
    loops, first = account.get("loops", {}), account.get("first_loop", {})
    for where, part in (("goodput.loops", loops), ("goodput.first_loop", first)):
        if part.get("input_seconds", 0.0) > part.get("seconds", 0.0) + SLACK:
            raise BadField(f"{where}.input_seconds", "is more than its loops' seconds")
    busy = loops.get("seconds", 0.0) - loops.get("input_seconds", 0.0)
    if first.get("seconds", 0.0) - first.get("input_seconds", 0.0) > busy + SLACK:
        raise BadField("goodput.first_loop.seconds", "is more than all the loops' (goodput.loops)")
    if first.get("steps", 0) > loops.get("steps", first.get("steps", 0)):
        raise BadField("goodput.first_loop.steps", "is more than all the loops' (goodput.loops)")
    began = account.get("training_start", {}).get("t")
    spent = loops.get("seconds", 0.0)
    spent += sum(s["blocking_s"] for s in account.get("saves", []))
    spent += sum(e["seconds"] for e in account.get("evaluations", []))
    if began is not None and began + spent > last_write + SLACK:
        raise BadField(
            "goodput.loops.seconds",
            f"and the saves' and evaluations' times add up to {spent:.6g} s, more than the "
            f"{last_write - began:.6g} s from its training start to its last write",
        )
    start = account.get("training_start", {}).get("step")
    last = account.get("last", {}).get("step")
    if start is not None and last is not None and last < start:
        raise BadField("goodput.last.step", f"is {last}, before its first ({start})")
