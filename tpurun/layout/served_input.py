"""The run record's `data_service` field: how a tf.data service made a train's input, and where
a resumed run's input restarted. Its one schema.

A train whose config names a service (config.data.service) writes it beside its time
account (`tpurun.data_service.job` builds the `ServedInput`, `GoodputRecord.set_field`
writes it under `KEY`); `tpurun report` reads it back through `check` and says where
each resumed run's input restarted. The one module that names its fields
(tests/test_layout.py checks that no other spells one): the others use the classes'
attributes. A record is the model_dir's, so anyone may have edited it: `check` returns
the field as the report may trust it, or raises `BadField` naming what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from tpurun.layout.time_account import MAX_STEP, BadField

KEY = "data_service"  # the field's key in a run record, beside the time account's
# `input_starts_at` of a run whose input restarted at the start of its stream.
STREAM_START = "stream start"


@dataclasses.dataclass(frozen=True)
class InputStart:
    """The start of the epoch a resumed run's input restarted at."""

    epoch: int  # counted from 1
    step: float  # the step at which that epoch began (between two steps, where it began inside one)


@dataclasses.dataclass(frozen=True)
class ServedInput:
    """How a run's training input was made by a tf.data service, and where it started."""

    service: str  # grpc://HOST:PORT, the dispatcher
    processing_mode: str  # distributed_epoch or parallel_epochs
    job_name: str  # the run attempt's own job
    started_at_step: int  # the global step the run started at (0: a fresh run)
    input_starts_at: InputStart | None = None  # None: the start of its stream
    exact_resume: bool = False  # never under a service: said, for whoever reads the record
    why_not_epoch: str | None = None  # a resumed run restarting at its stream's start: why


def as_json(served: ServedInput) -> dict[str, Any]:
    """The field as the run record holds it."""
    start = served.input_starts_at
    return {
        "service": served.service,
        "processing_mode": served.processing_mode,
        "job_name": served.job_name,
        "started_at_step": served.started_at_step,
        "input_starts_at": (
            {"epoch": start.epoch, "step": start.step} if start is not None else STREAM_START
        ),
        "exact_resume": served.exact_resume,
        "why_not_epoch": served.why_not_epoch,
    }


def check(value: Any) -> ServedInput:
    """The field of a run record, if each of its values holds; else BadField naming the first
    that does not."""
    if not isinstance(value, dict):
        raise BadField(KEY, f"is {_kind(value)}, not an object")
    texts = {name: _text(value, name) for name in ("service", "processing_mode", "job_name")}
    why = value.get("why_not_epoch")
    if why is not None and not isinstance(why, str):
        raise BadField(f"{KEY}.why_not_epoch", f"is {_kind(why)}, not a text")
    exact = value.get("exact_resume", False)
    if not isinstance(exact, bool):
        raise BadField(f"{KEY}.exact_resume", f"is {_kind(exact)}, not true or false")
    return ServedInput(
        **texts,
        started_at_step=_count(value.get("started_at_step"), f"{KEY}.started_at_step"),
        input_starts_at=_start(value.get("input_starts_at")),
        exact_resume=exact,
        why_not_epoch=why,
    )


def _start(value: Any) -> InputStart | None:
    where = f"{KEY}.input_starts_at"
    if value == STREAM_START:
        return None
    if not isinstance(value, dict):
        raise BadField(where, f"is {_kind(value)}, not an object or {STREAM_START!r}")
    step: Any = value.get("step")
    number = isinstance(step, (int, float)) and not isinstance(step, bool)
    if not (number and _finite(step) and step >= 0):
        raise BadField(f"{where}.step", f"is {_kind(step)}, not a step (a number, not negative)")
    return InputStart(_count(value.get("epoch"), f"{where}.epoch"), float(step))


def _text(value: dict[str, Any], name: str) -> str:
    text = value.get(name)
    if not isinstance(text, str):
        raise BadField(f"{KEY}.{name}", f"is {_kind(text)}, not a text")
    return text


def _count(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP:
        return value
    raise BadField(where, f"is {_kind(value)}, not a step or count (an integer from 0)")


def _finite(number: float) -> bool:
    try:
        return math.isfinite(number)
    except OverflowError:  # an integer too large for a float
        return False


def _kind(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not _finite(value):
        return f"an integer of {len(str(abs(value)))} digits"  # its repr: a page of digits
    if isinstance(value, (int, float, bool)) or value is None:
        return repr(value) if value is not None else "null"
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a text"}
    return names.get(type(value), type(value).__name__)
