"""The bounds of the numbers a run takes, each refused with its allowed range.

nan, inf, a negative or an absurd size is never a plan: a typo caught here is one
UsageError line naming the flag or config key and what it may be, instead of a
run that hangs, allocates gigabytes or never saves.
"""

from __future__ import annotations

import math
from typing import Any

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


def is_number(value: object) -> bool:
    """An int or float, not a bool (True is an int to Python, never a size here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def integer(name: str, value: object, low: int, high: int, note: str = "", key: str = "") -> None:
    """An integer in [low, high], or a UsageError saying the range (`note` after its low end,
    `key` the config key after the value)."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return
    if low == 1:
        allowed = f"a positive integer{note} (at most {high})"
    else:
        allowed = (
            f"{'an integer ' if note == ' (0 = off)' else ''}>= {low}{note} and at most {high}"
        )
    raise UsageError(f"{name}={value}{key} must be {allowed}")


def batch(name: str, value: object) -> None:
    """A global train or eval batch: a positive integer, with no cap of its own (a slice's
    memory bounds it: `tpurun check --target`), that TensorFlow can hold as a dimension."""
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DIMENSION:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > MAX_DIMENSION:
        raise UsageError(
            f"{name}={value} must be a positive integer of at most 2^63-1 (TensorFlow's "
            "int64); `tpurun check --target=<TPU type>` says which batches a slice holds"
        )
    raise UsageError(f"{name}={value} must be a positive integer")


def seconds(name: str, value: object, low: float, high: float, note: str = "") -> None:
    """A finite number of seconds in [low, high] (nan and inf are neither)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and low <= value <= high:
            return
    shown = f"{value:g}" if is_number(value) else value
    raise UsageError(f"{name}={shown} must be a number of seconds >= {low:g}{note}, at most {high}")


def check_sizes(config: Any) -> None:
    """Batch sizes, steps, cadences, retention and seed within their bounds."""
    for flag, key in (
        ("--batch_size", "train.batch_size"),
        ("--eval_batch_size", "eval.batch_size"),
    ):
        section, leaf = key.split(".")
        batch(f"{flag} (config.{key})", config[section][leaf])
    integer(
        "--predict_batch_size (config.predict.batch_size)",
        config.predict.batch_size,
        1,
        MAX_PREDICT_BATCH,
    )
    integer("--iterations (config.train.iterations)", config.train.iterations, 1, MAX_ITERATIONS)
    integer("--train_steps", config.train.steps, 0, MAX_STEPS)
    epochs = config.train.epochs
    if not (is_number(epochs) and math.isfinite(epochs) and 0 <= epochs <= MAX_EPOCHS):
        shown = f"{epochs:g}" if is_number(epochs) else repr(epochs)
        raise UsageError(
            f"--train_epochs (config.train.epochs)={shown} must be a number of epochs > 0 "
            f"(0 = count in --train_steps), at most {MAX_EPOCHS}"
        )
    integer("--eval_steps", config.eval.steps, 0, MAX_STEPS, " (0 = one exact pass)")
    for name, high in (
        ("save_checkpoints_steps", MAX_STEPS),
        ("eval_every", MAX_STEPS),
        ("save_checkpoints_secs", MAX_SECONDS),
    ):
        key = f" (config.train.{name})"
        if name == "eval_every" and config.train[name] == "epoch":
            continue  # at the end of every epoch
        try:
            integer(f"--{name}", config.train[name], 0, high, " (0 = off)", key=key)
        except UsageError as e:
            if name != "eval_every":
                raise
            raise UsageError(f"{e}, or 'epoch' (at the end of every epoch)") from None
    integer(
        "--keep_checkpoint_max (config.train.keep_checkpoint_max)",
        config.train.keep_checkpoint_max,
        1,
        10**6,
    )
    integer("--seed (config.seed)", config.seed, 0, MAX_SEED)
    integer("config.train.accumulate_steps", config.train.accumulate_steps, 1, MAX_ACCUMULATE_STEPS)
    for key in ("device_data", "xla", "async_checkpoint"):
        if not isinstance(config.train[key], bool):
            raise UsageError(f"config.train.{key}={config.train[key]!r} must be true or false")
    upload = config.train.summary_upload_secs
    if not (is_number(upload) and math.isfinite(upload) and 0 <= upload <= MAX_SECONDS):
        raise UsageError(
            f"config.train.summary_upload_secs={upload} must be a number of seconds >= 0 "
            f"(0 = after every host loop), at most {MAX_SECONDS}"
        )
    budget = config.train.device_data_mb
    if not (is_number(budget) and math.isfinite(budget) and 0 <= budget <= MAX_DEVICE_DATA_MB):
        raise UsageError(
            f"config.train.device_data_mb={budget} must be a number of MB >= 0 (0 = automatic), "
            f"at most {MAX_DEVICE_DATA_MB}"
        )
