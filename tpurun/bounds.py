"""The bounds of the numbers a run takes, each refused with its allowed range.

nan, inf, a negative or an absurd size is never a plan: a typo caught here is one
UsageError line naming the flag or config key and what it may be, instead of a
run that hangs, allocates gigabytes or never saves.
"""

from __future__ import annotations

import math
from typing import Any

from tpurun.errors import UsageError

# Bounds of the numbers a run takes: beyond them a value is a typo, not a plan. A
# global batch of 2^20 is far past the largest TPU pod batches in use; a predict
# batch past the rows to predict only pads them (and allocates the padding).
MAX_BATCH = 2**20
MAX_STEPS = 10**12
MAX_ITERATIONS = 10**6
MAX_SECONDS = 30 * 24 * 3600  # 30 days
MAX_REPLICAS = 2**16
MAX_SEED = 2**32 - 1  # numpy's seeds
MAX_ACCUMULATE_STEPS = 4096
MAX_DEVICE_DATA_MB = 2**20  # 1 TB


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
        ("--predict_batch_size", "predict.batch_size"),
    ):
        section, leaf = key.split(".")
        integer(f"{flag} (config.{key})", config[section][leaf], 1, MAX_BATCH)
    integer("--iterations (config.train.iterations)", config.train.iterations, 1, MAX_ITERATIONS)
    integer("--train_steps", config.train.steps, 0, MAX_STEPS)
    integer("--eval_steps", config.eval.steps, 0, MAX_STEPS, " (0 = one exact pass)")
    for name, high in (
        ("save_checkpoints_steps", MAX_STEPS),
        ("eval_every", MAX_STEPS),
        ("save_checkpoints_secs", MAX_SECONDS),
    ):
        key = f" (config.train.{name})"
        integer(f"--{name}", config.train[name], 0, high, " (0 = off)", key=key)
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
