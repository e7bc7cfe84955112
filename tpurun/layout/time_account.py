"""The time account of a train's run record: each field, its type and meaning, and its check.

A train process keeps its account under `KEY` in its run record
(`runs/<time>-train.json`), rewritten as it goes (`tpurun.actions.goodput`), so a
process that is killed leaves it up to its last write; its supervisor passes on how
the trainer before it died and writes the record of one that left none
(`tpurun.supervisor`). `tpurun report` counts only what `check` passed
(`tpurun.report.goodput`: where the time went). The one module that names the fields
(tests/test_layout.py checks that no other spells one): the others use the classes'
attributes, which mypy checks.

A field's type says its kind: `Time` (seconds since 1970), `Duration` (seconds),
`Count` (a step or a count), `Text`, `Flops` (a FLOP count or rate), `Flag` (true
or false), or an object
of this module (a list of them). To add one: declare it in its class with its
kind and a comment saying what it means, without a default only where its object
cannot be accounted without it. `check` then checks it, `as_json` writes it and
`from_json` reads it. A record of an older tpurun lacks it (None); one of a newer
tpurun may hold fields this one does not know: ignored.

A record is the model_dir's, so anyone may have edited, truncated or forged it:
`check(goodput)` returns the account as the report may trust it, or raises
`BadField` naming the first field that is wrong and why:

* times are finite, not in the future (a day of clock skew allowed), and inside
  the process's life: after its start, not after its end; the death it was told of
  comes before its start;
* durations and FLOP counts are finite and not negative, and a process's loops,
  saves and evaluations fit in its life; steps and counts are integers >= 0;
* objects are objects, lists are lists, texts are texts; a field set to null is absent.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, TypeVar

KEY = "goodput"  # the account's key in a run record

TIME, DURATION, STEP, TEXT, FLOPS, BOOL = "time", "duration", "step", "text", "flops", "bool"
MAX_STEP = 2**62
Time = Annotated[float, TIME]
Duration = Annotated[float, DURATION]
Count = Annotated[int, STEP]
Text = Annotated[str, TEXT]
Flops = Annotated[float, FLOPS]
Flag = Annotated[bool, BOOL]
_WHAT = {
    TIME: "a time (seconds since 1970, not in the future)",
    DURATION: "a duration (seconds, finite, not negative)",
    STEP: f"a step or count (an integer from 0 to {MAX_STEP})",
    TEXT: "a text",
    FLOPS: "a FLOP count or rate (finite, not negative)",
    BOOL: "true or false",
}
# Clocks of two machines (a record written elsewhere) may differ; a day is generous.
FUTURE_SLACK = 24 * 3600.0
# What one clock reading may differ from another taken as the same moment (a write's
# `updated` after its `end`): float rounding and a clock's small steps, not more.
SLACK = 1.0


@dataclasses.dataclass
class Death:
    """How the trainer before this one ended, as its supervisor saw it."""

    t: Time | None = None  # when it died
    cause: Text | None = None  # what ended it ("was killed by SIGKILL")
    step: Count | None = None  # its last step, as it told its supervisor
    step_t: Time | None = None  # when it reached that step


@dataclasses.dataclass
class Device:
    kind: Text | None = None  # the device kind ("TPU v5 lite", "CPU")
    replicas: Count | None = None


@dataclasses.dataclass
class Resume:
    """Whether a resume of the process's run is bit-identical (tpurun.run_config.keys.determinism)."""

    bit_identical: Flag  # its weights then those of an uninterrupted run, bit for bit
    deterministic: Flag | None = None  # whether it ran TensorFlow's op determinism
    reason: Text | None = None  # what makes it so, or not


@dataclasses.dataclass
class TrainingStart:
    t: Time  # when the first step began: start-up (imports, cluster, build, restore) is over
    step: Count  # the step it restored (0: none)


@dataclasses.dataclass
class FirstLoop:
    """The first host loop, which compiled the step."""

    steps: Count | None = None
    seconds: Duration | None = None
    input_seconds: Duration | None = None  # of them waiting for batches


@dataclasses.dataclass
class Loops:
    """Every host loop, summed (the first included)."""

    count: Count | None = None
    steps: Count | None = None
    seconds: Duration | None = None
    input_seconds: Duration | None = None  # of them waiting for batches


@dataclasses.dataclass
class Last:
    step: Count | None = None  # the step the last host loop ended at
    t: Time | None = None  # when


@dataclasses.dataclass
class Save:
    step: Count
    t: Time  # when the loop went on
    blocking_s: Duration  # what the loop waited for it
    reached_t: Time | None = None  # when the loop reached its step: where a resume starts


@dataclasses.dataclass
class Evaluation:
    step: Count
    t: Time  # when it ended
    seconds: Duration  # what the loop waited for it


# How a process ended (End.reason): its training done; SIGTERM (a save first); a failure;
# Ctrl-C.
FINISHED, PREEMPTED, ERROR, INTERRUPTED = "finished", "preempted", "error", "interrupted"


@dataclasses.dataclass
class End:
    t: Time
    reason: Text | None = None  # FINISHED, PREEMPTED, ERROR or INTERRUPTED
    step: Count | None = None  # its last step


@dataclasses.dataclass
class TimeAccount:
    """What a train process did, and when: its run record's `goodput`."""

    # Its supervisor's spawn time, else the kernel's start of the process.
    process_start: Time
    spawned_at: Time | None = None  # when its supervisor started it
    supervisor_start: Time | None = None  # when its supervisor started: whose trainer it is
    cluster_ready: Time | None = None  # when the strategy was built: TPU found and initialized
    updated: Time | None = None  # when the record was last written
    restart: Count | None = None  # its supervisor's count of restarts before it (0: first)
    model_flops_per_step: Flops | None = None  # counted after a finished train
    peak_flops_per_s: Flops | None = None  # the devices' peak, where known
    peak_why: Text | None = None  # why a peak or FLOP count is missing
    unrecorded: Text | None = None  # a record its supervisor wrote: how the trainer died
    previous_death: Death | None = None  # the death of the trainer before it (supervised)
    training_start: TrainingStart | None = None
    first_loop: FirstLoop | None = None
    loops: Loops | None = None
    last: Last | None = None
    end: End | None = None  # how the process ended (none: killed)
    device: Device | None = None
    resume: Resume | None = None
    saves: list[Save] = dataclasses.field(default_factory=list)
    evaluations: list[Evaluation] = dataclasses.field(default_factory=list)


# --- JSON ------------------------------------------------------------------------------


def as_json(value: Any) -> Any:
    """An account (or any object of this module) as JSON values, nulls left out."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return {name: as_json(item) for name, item in fields if item is not None}
    if isinstance(value, list):
        return [as_json(item) for item in value]
    return value


def record_text(record: Mapping[str, Any]) -> str:
    """A run record's text, its account (a TimeAccount under KEY) as JSON."""
    return json.dumps(record, indent=2, default=_encode) + "\n"


def _encode(value: Any) -> Any:
    return as_json(value) if isinstance(value, TimeAccount) else str(value)


def from_json(value: Mapping[str, Any]) -> TimeAccount:
    """The account a run record's JSON holds (one `check` passed, or one this tpurun wrote):
    fields it does not know left out. TypeError where a field without a default is missing."""
    return _build(TimeAccount, value)


def death_from_json(text: str) -> Death | None:
    """The death the supervisor passed on as JSON (`as_json` of a Death); None if it is none."""
    try:
        value = json.loads(text)
        return _build(Death, value) if isinstance(value, dict) else None
    except (ValueError, TypeError):
        return None


Object = TypeVar("Object")


def _build(cls: type[Object], value: Mapping[str, Any]) -> Object:
    kwargs: dict[str, Any] = {}
    for name, (_, nested, listed) in _fields(cls).items():
        item = value.get(name)
        if item is None:
            continue
        if nested is None:
            kwargs[name] = item
        else:
            kwargs[name] = [_build(nested, i) for i in item] if listed else _build(nested, item)
    return cls(**kwargs)


_Fields = dict[str, tuple[str | None, type | None, bool]]
_FIELDS: dict[type, _Fields] = {}


def _fields(cls: type) -> _Fields:
    """Each field of `cls`, in order: its kind (None for an object of this module), the
    object's class (None for a value), and whether it is a list of them."""
    if cls in _FIELDS:
        return _FIELDS[cls]
    found: _Fields = {}
    for name, hint in typing.get_type_hints(cls, include_extras=True).items():
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        listed = typing.get_origin(hint) is list
        if listed:
            hint = typing.get_args(hint)[0]
        if typing.get_origin(hint) is Annotated:
            found[name] = (hint.__metadata__[0], None, listed)
        else:
            found[name] = (None, hint, listed)
    _FIELDS[cls] = found
    return found


# --- The check -------------------------------------------------------------------------


class BadField(ValueError):
    """`field` (dotted: `goodput.saves[3].t`) is wrong: `reason`."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field} {reason}")
        self.field = field
        self.reason = reason


def check(goodput: Any, now: float | None = None) -> TimeAccount:
    """The account of a run record's `goodput`, if every field holds; else BadField naming
    the first that does not (its values first, then its objects, then its lists)."""
    now = time.time() if now is None else now
    checked = _object(KEY, goodput, TimeAccount, now)
    fields = _fields(TimeAccount)
    for listed in (False, True):
        for name, (_, nested, is_list) in fields.items():
            if nested is None or is_list != listed or name not in checked:
                continue
            where, value = f"{KEY}.{name}", checked[name]
            if not listed:
                checked[name] = _object(where, value, nested, now)
            elif not isinstance(value, list):
                raise BadField(where, f"is {_kind(value)}, not a list")
            else:
                checked[name] = [
                    _object(f"{where}[{i}]", item, nested, now) for i, item in enumerate(value)
                ]
    account = from_json(checked)
    _check_order(account)
    return account


def _object(where: str, value: Any, cls: type, now: float) -> dict[str, Any]:
    """`value`, an object of class `cls`, its nulls dropped and its values checked."""
    if not isinstance(value, dict):
        raise BadField(where, f"is {_kind(value)}, not an object")
    checked = {key: item for key, item in value.items() if item is not None}
    for field in dataclasses.fields(cls):
        missing = field.default is dataclasses.MISSING
        if missing and field.default_factory is dataclasses.MISSING and field.name not in checked:
            raise BadField(f"{where}.{field.name}", "is missing")
    for key, (kind, _, _) in _fields(cls).items():
        if kind is not None and key in checked:
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
        ok = number and _finite(value) and value >= 0
        if ok and kind == TIME:
            ok = value <= now + FUTURE_SLACK
    if not ok:
        raise BadField(where, f"is {_shown(value)}, not {_WHAT[kind]}")


def _finite(number: float) -> bool:
    """Whether `number` is a finite float: an integer too large for one is not."""
    try:
        return math.isfinite(number)
    except OverflowError:
        return False


def _shown(value: Any) -> str:
    if isinstance(value, int) and not isinstance(value, bool) and not _finite(value):
        return f"an integer of {len(str(abs(value)))} digits"  # not one that fits a float
    return repr(value) if isinstance(value, (int, float, bool)) else _kind(value)


def _kind(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a text", bool: "a boolean"}
    return names.get(type(value), "a number" if isinstance(value, (int, float)) else "null")


def _check_order(account: TimeAccount) -> None:
    """The times inside the process's life, the death before it, the durations within it."""
    start = float(account.process_start)
    end = account.end.t if account.end else None
    if end is not None and end < start:
        raise BadField(f"{KEY}.end.t", f"is {end!r}, before the process's start ({start!r})")
    # The last moment the record speaks of: its end, or its last write.
    updated = account.updated if account.updated is not None else start
    last_write = max(float(end or start), float(updated))
    moments = [
        ("cluster_ready", account.cluster_ready),
        ("updated", account.updated),
        ("training_start.t", account.training_start.t if account.training_start else None),
        ("last.t", account.last.t if account.last else None),
    ]
    for i, save in enumerate(account.saves):
        moments += [(f"saves[{i}].t", save.t), (f"saves[{i}].reached_t", save.reached_t)]
    moments += [(f"evaluations[{i}].t", e.t) for i, e in enumerate(account.evaluations)]
    for field, moment in moments:
        if moment is not None and not start - SLACK <= moment <= last_write + SLACK:
            raise BadField(
                f"{KEY}.{field}",
                f"is {moment!r}, outside the process's life ({start!r} to {last_write!r})",
            )
    death = account.previous_death or Death()
    for field, moment in (("t", death.t), ("step_t", death.step_t)):
        if moment is not None and moment > start + SLACK:
            raise BadField(
                f"{KEY}.previous_death.{field}",
                f"is {moment!r}, after this process started ({start!r})",
            )
    _check_durations(account, last_write)


def _check_durations(account: TimeAccount, last_write: float) -> None:
    loops, first = account.loops or Loops(), account.first_loop or FirstLoop()
    for where, part in ((f"{KEY}.loops", loops), (f"{KEY}.first_loop", first)):
        if (part.input_seconds or 0.0) > (part.seconds or 0.0) + SLACK:
            raise BadField(f"{where}.input_seconds", "is more than its loops' seconds")
    busy = (loops.seconds or 0.0) - (loops.input_seconds or 0.0)
    if (first.seconds or 0.0) - (first.input_seconds or 0.0) > busy + SLACK:
        raise BadField(f"{KEY}.first_loop.seconds", f"is more than all the loops' ({KEY}.loops)")
    first_steps = first.steps or 0
    if first_steps > (loops.steps if loops.steps is not None else first_steps):
        raise BadField(f"{KEY}.first_loop.steps", f"is more than all the loops' ({KEY}.loops)")
    began = account.training_start.t if account.training_start else None
    spent = loops.seconds or 0.0
    spent += sum(s.blocking_s for s in account.saves)
    spent += sum(e.seconds for e in account.evaluations)
    if began is not None and began + spent > last_write + SLACK:
        raise BadField(
            f"{KEY}.loops.seconds",
            f"and the saves' and evaluations' times add up to {spent:.6g} s, more than the "
            f"{last_write - began:.6g} s from its training start to its last write",
        )
    start = account.training_start.step if account.training_start else None
    last = account.last.step if account.last else None
    if start is not None and last is not None and last < start:
        raise BadField(f"{KEY}.last.step", f"is {last}, before its first ({start})")
