"""The bounds of the numbers a run takes, each refused with its allowed range.

nan, inf, a negative or an absurd size is never a plan: a typo caught here is one
UsageError line naming the flag or config key and what it may be, instead of a
run that hangs, allocates gigabytes or never saves. Each bound is a small value
(`Integer(1, MAX_STEPS)`) that the flag table (`tpurun.run_config.flag_table`) gives
to a flag or config key; `check(shown, value)` refuses a value out of it, `shown`
being how the message names it (`--batch_size (config.train.batch_size)`). And how
they divide: a global batch evenly over the replicas (`check_divisible`), a cadence into
whole host loops (`aligned_to_loop`).
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TypeGuard

from tpurun.errors import UsageError

# Bounds of the numbers a run takes: beyond them a value is a typo, not a plan.
# The global train and eval batches have none of their own: a v4-4096 at 1,024 per
# replica is 2,097,152, and what a slice holds is `tpurun check --target`'s answer
# (its memory per replica), not a constant's. They must only be numbers TensorFlow
# can hold as a dimension (int64). A predict batch past the rows to predict only pads
# them (and allocates the padding): `tpurun predict` reads rows a file holds, so past
# 2^20 it is absurdly larger than any input it takes.
MAX_DIMENSION = 2**63 - 1
MAX_PREDICT_BATCH = 2**20
MAX_STEPS = 10**12
MAX_EPOCHS = 10**9
MAX_ITERATIONS = 10**6
MAX_SECONDS = 30 * 24 * 3600  # 30 days
MAX_REPLICAS = 2**16
MAX_SEED = 2**32 - 1  # numpy's seeds
MAX_ACCUMULATE_STEPS = 4096
MAX_DEVICE_DATA_MB = 2**20  # 1 TB
MAX_RESTARTS = 1000  # train --max_restarts
MAX_CHECKPOINTS_KEPT = 10**6


# How a run's numbers divide: a global batch over the replicas, a cadence into host loops.


def split_fix(batch_size: int, num_replicas: int, flag: str = "") -> str | None:
    """None when a global batch splits evenly over the replicas, else the fix to say.

    `use a multiple of 8 (e.g. 96 or 104)`; with `flag`, `(e.g. --batch_size=96 or 104)`.
    """
    if not batch_size % num_replicas:
        return None
    lower = batch_size // num_replicas * num_replicas
    upper = lower + num_replicas
    name = f"{flag}=" if flag else ""
    example = f"{name}{lower} or {upper}" if lower else f"{name}{upper}"
    return f"use a multiple of {num_replicas} (e.g. {example})"


def check_divisible(what: str, batch_size: int, num_replicas: int) -> None:
    """A global batch must split evenly: every replica (TPU core) gets the same static shape."""
    fix = split_fix(batch_size, num_replicas)
    if fix:
        raise UsageError(
            f"{what}={batch_size} is not divisible by the {num_replicas} replicas; {fix}"
        )


def aligned_to_loop(steps: int, iterations: int) -> int:
    """Rounds a step cadence up to a whole number of host loops (0 stays 0)."""
    if steps <= 0:
        return 0
    return -(-steps // iterations) * iterations


def is_number(value: object) -> bool:
    """An int or float, not a bool (True is an int to Python, never a size here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_integer(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    return f"{value:g}" if is_number(value) else str(value)


def _limit(value: float) -> str:
    """A bound as written: 2592000, not 2.592e+06."""
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclasses.dataclass(frozen=True)
class Integer:
    """An integer in [low, high]; `note` says what a special low end means (" (0 = off)")."""

    low: int
    high: int
    note: str = ""

    def check(self, shown: str, value: object) -> None:
        if is_integer(value) and self.low <= value <= self.high:
            return
        if self.low == 1:
            allowed = f"a positive integer{self.note} (at most {self.high})"
        elif self.note == " (0 = off)":
            allowed = f"an integer >= {self.low}{self.note} and at most {self.high}"
        else:
            allowed = f">= {self.low}{self.note} and at most {self.high}"
        raise UsageError(f"{shown}={value} must be {allowed}")


@dataclasses.dataclass(frozen=True)
class Batch:
    """A global train or eval batch: a positive integer, with no cap of its own (a slice's
    memory bounds it: `tpurun check --target`), that TensorFlow can hold as a dimension."""

    def check(self, shown: str, value: object) -> None:
        if is_integer(value) and 1 <= value <= MAX_DIMENSION:
            return
        if is_integer(value) and value > MAX_DIMENSION:
            raise UsageError(
                f"{shown}={value} must be a positive integer of at most 2^63-1 (TensorFlow's "
                "int64); `tpurun check --target=<TPU type>` says which batches a slice holds"
            )
        raise UsageError(f"{shown}={value} must be a positive integer")


@dataclasses.dataclass(frozen=True)
class Number:
    """A finite number in [low, high] of `unit` (seconds, MB, epochs); `above`: > low, not >=."""

    low: float
    high: float
    unit: str = "seconds"
    note: str = ""
    above: bool = False

    def check(self, shown: str, value: object) -> None:
        if is_number(value) and math.isfinite(value):  # type: ignore[arg-type]
            number = float(value)  # type: ignore[arg-type]
            if (number > self.low if self.above else number >= self.low) and number <= self.high:
                return
        relation = ">" if self.above else ">="
        raise UsageError(
            f"{shown}={_shown(value)} must be a number of {self.unit} {relation} "
            f"{_limit(self.low)}{self.note}, at most {_limit(self.high)}"
        )


@dataclasses.dataclass(frozen=True)
class Boolean:
    """true or false (a config file's "yes" is neither)."""

    def check(self, shown: str, value: object) -> None:
        if not isinstance(value, bool):
            raise UsageError(f"{shown}={value!r} must be true or false")


@dataclasses.dataclass(frozen=True)
class BooleanOrWord:
    """true, false, or one word meaning "not chosen": train.xla's "auto", tpurun decides."""

    word: str

    def check(self, shown: str, value: object) -> None:
        if not isinstance(value, bool) and value != self.word:
            raise UsageError(f"{shown}={value!r} must be true, false or {self.word!r}")


@dataclasses.dataclass(frozen=True)
class StepsOrEpoch:
    """A step cadence (an Integer bound), or the word "epoch" (at the end of every epoch)."""

    steps: Integer

    def check(self, shown: str, value: object) -> None:
        if value == "epoch":
            return
        try:
            self.steps.check(shown, value)
        except UsageError as e:
            raise UsageError(f"{e}, or 'epoch' (at the end of every epoch)") from None


# The bounds of a config's recipe keys (`tpurun.run_config.keys.recipe_keys.RECIPE_BOUNDS`):
# their messages show the value as the config file holds it (repr: 'cosin', (200, 100)).


@dataclasses.dataclass(frozen=True)
class AtLeast:
    """A number (an integer with `integer`) >= low, or > low with `above`; `note` says
    what the low end means or what the value is for (" (0 = no warmup)")."""

    low: int
    integer: bool = False
    above: bool = False
    note: str = ""

    def check(self, shown: str, value: object) -> None:
        kind = is_integer(value) if self.integer else is_number(value)
        if kind and (value > self.low if self.above else value >= self.low):  # type: ignore[operator]
            return
        what = "an integer" if self.integer else "a number"
        raise UsageError(
            f"{shown}={value!r} must be {what} {'>' if self.above else '>='} {self.low}{self.note}"
        )


@dataclasses.dataclass(frozen=True)
class Fraction:
    """A number in [0, 1], or in [0, 1) with `below_one`; `note` says what it means."""

    below_one: bool = False
    note: str = ""

    def check(self, shown: str, value: object) -> None:
        if is_number(value) and (0 <= value < 1 if self.below_one else 0 <= value <= 1):  # type: ignore[operator]
            return
        interval = "[0, 1)" if self.below_one else "[0, 1]"
        raise UsageError(f"{shown}={value!r} must be a number in {interval}{self.note}")


@dataclasses.dataclass(frozen=True)
class OneOf:
    """One of `choices`, each `what` (" a schedule")."""

    choices: tuple[str, ...]
    what: str

    def check(self, shown: str, value: object) -> None:
        if value not in self.choices:
            raise UsageError(
                f"{shown}={value!r} is not {self.what}; use one of {', '.join(self.choices)}"
            )


@dataclasses.dataclass(frozen=True)
class Regex:
    """A regular expression Python compiles."""

    def check(self, shown: str, value: object) -> None:
        try:
            re.compile(value)  # type: ignore[call-overload]
        except (re.error, TypeError) as e:
            raise UsageError(f"{shown}={value!r} is not a regex: {e}") from None


Bound = (
    Integer
    | Batch
    | Number
    | Boolean
    | BooleanOrWord
    | StepsOrEpoch
    | AtLeast
    | Fraction
    | OneOf
    | Regex
)
