"""The training-recipe keys of a config (`config.optimizer[s]`, `train.ema_decay`) and their checks.

Pure Python, like run_config, which calls `validate` before TensorFlow is imported:
a bad value fails in milliseconds with one line naming the key, the value and what
is allowed. `tpurun.optimization` builds the Keras optimizer from the same keys; the
defaults, with what each key means, are in `tpurun.config_defaults.base_config`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tpurun.errors import UsageError
from tpurun.run_config.bounds import (
    AtLeast,
    Boolean,
    Bound,
    Fraction,
    OneOf,
    Regex,
    is_integer,
    is_number,
)

SCHEDULES = ("constant", "exponential", "piecewise", "cosine", "linear")
WARMUP_TARGETS = ("schedule", "peak")
# Schedules whose curve ends at train.steps: a resumed run may not change it (checkpoints.py).
SCHEDULES_ENDING_AT_TRAIN_STEPS = ("cosine", "linear")

# The keys of config.optimizer that tpurun reads itself. Any other key is passed to the
# Keras optimizer's constructor (e.g. beta_1 or epsilon for adam), and is an error when
# that constructor does not take it: no key is ever silently ignored.
RECIPE_KEYS = (
    "name",
    "learning_rate",
    "base_batch_size",
    "schedule",
    "warmup_steps",
    "warmup_target",
    "warmup_epochs",
    "decay_steps",
    "decay_rate",
    "staircase",
    "boundaries",
    "boundary_epochs",
    "multipliers",
    "alpha",
    "end_learning_rate",
    "momentum",
    "nesterov",
    "weight_decay",
    "l2_weight_decay",
    "weight_decay_exclude",
    "clip_norm",
)
# Recipe keys in epochs and the keys in steps they become when the run's training
# examples are counted (`resolve_epochs`): a recipe says each length in one of the two.
EPOCH_KEYS = {"warmup_epochs": "warmup_steps", "boundary_epochs": "boundaries"}
# Recipe keys that belong to one schedule: set (not at their default) with another
# schedule they would be ignored, so that is an error.
SCHEDULE_KEYS = {
    "decay_steps": "exponential",
    "decay_rate": "exponential",
    "staircase": "exponential",
    "boundaries": "piecewise",
    "boundary_epochs": "piecewise",
    "multipliers": "piecewise",
    "alpha": "cosine",
    "end_learning_rate": "linear",
}
# Recipe keys only some Keras 3 optimizers take (their constructors' arguments);
# `tpurun.optimization` checks the constructor's signature too.
OPTIMIZER_KEYS = {"momentum": ("sgd", "rmsprop", "muon"), "nesterov": ("sgd", "muon")}
# Arguments of every Keras optimizer that tpurun sets from its own keys, or that its
# training loop does not support. Given as extra config.optimizer keys they would
# bypass the recipe: Keras' clipnorm/global_clipnorm clip each replica's gradients
# before the all-reduce (see tpurun.optimization), and gradient accumulation changes
# what optimizer.iterations (the step of checkpoints and schedules) counts.
KERAS_ARGUMENTS_NOT_PASSED = {
    "clipnorm": "use config.optimizer.clip_norm (the global norm of the summed gradients)",
    "global_clipnorm": "use config.optimizer.clip_norm (the global norm of the summed gradients)",
    "clipvalue": "use config.optimizer.clip_norm (the global norm of the summed gradients)",
    "use_ema": "use config.train.ema_decay",
    "ema_momentum": "use config.train.ema_decay",
    "ema_overwrite_frequency": "tpurun keeps the averages beside the weights (config.train.ema_decay)",
    "gradient_accumulation_steps": "tpurun's loop takes one optimizer step per batch",
    "loss_scale_factor": "tpurun's loop does not scale the loss",
}
# Keras optimizers that need a weight decay (AdamW is Adam with decoupled weight decay).
NEEDS_WEIGHT_DECAY = ("adamw",)

# The bound of every recipe's value of these keys (one UsageError line naming the key).
RECIPE_BOUNDS: Mapping[str, Bound] = {
    "schedule": OneOf(SCHEDULES, "a schedule"),
    "learning_rate": AtLeast(0),
    "base_batch_size": AtLeast(0, integer=True, note=" (0 = no scaling with the global batch)"),
    "warmup_steps": AtLeast(0, integer=True, note=" (0 = no warmup)"),
    # 'schedule': warm up to the schedule's rate at warmup_steps; 'peak': to learning_rate,
    # the decay counted from step 0 (google-research/bert's optimization.py).
    "warmup_target": OneOf(WARMUP_TARGETS, "a warmup target"),
    "warmup_epochs": AtLeast(0, note=" (0 = no warmup)"),
    "momentum": Fraction(below_one=True, note=" (0 = none)"),
    "nesterov": Boolean(),
    "weight_decay": AtLeast(0, note=" (0 = none)"),
    "l2_weight_decay": AtLeast(0, note=" (0 = none)"),
    "weight_decay_exclude": Regex(),
    "clip_norm": AtLeast(0, note=" (0 = no clipping)"),
}
_EXPONENTIAL = " with schedule='exponential'"
# ...and of the keys of one schedule, in a recipe of that schedule (piecewise's boundaries
# and multipliers go together: `_validate_piecewise`).
SCHEDULE_BOUNDS: Mapping[str, Mapping[str, Bound]] = {
    "exponential": {
        "decay_steps": AtLeast(
            1,
            integer=True,
            note=f"{_EXPONENTIAL} (the rate is multiplied by decay_rate every decay_steps steps)",
        ),
        "decay_rate": AtLeast(0, above=True, note=f"{_EXPONENTIAL} (e.g. 0.94)"),
        "staircase": Boolean(),
    },
    "cosine": {"alpha": Fraction(note=" (the final rate, as a fraction of learning_rate)")},
    "linear": {"end_learning_rate": AtLeast(0)},
}
EMA_DECAY = Fraction(below_one=True, note=" (0 = no moving average)")


def _fail(key: str, value: Any, allowed: str) -> UsageError:
    return UsageError(f"config.{key}={value!r} {allowed}")


def validate(config: Mapping[str, Any]) -> None:
    """Raises UsageError, one line, for the first bad recipe key of `config` (the whole config).

    A warmup longer than the run is not refused: a smoke run shorter than its recipe's
    warmup runs with a warning (`tpurun.run_config.epochs.warn_of_warmups`). Checks
    config.optimizer, and each named recipe of config.optimizers; with named
    ones, config.optimizer must stay at its defaults (it would not be read).
    """
    from tpurun.config_defaults import base_config

    defaults = base_config(model="")["optimizer"]
    named = config.get("optimizers") or {}
    if named:
        _validate_names(named, config["optimizer"], defaults)
    _validate_recipe(config["optimizer"], "optimizer", defaults)
    for name in named:
        _validate_recipe(named[name], f"optimizers.{name}", defaults)
    EMA_DECAY.check("config.train.ema_decay", config["train"]["ema_decay"])


def _validate_names(
    named: Mapping[str, Any], optimizer: Mapping[str, Any], defaults: Mapping[str, Any]
) -> None:
    """config.optimizers: identifiers, not 'optimizer', whole recipes; config.optimizer unset."""
    listed = ", ".join(named)
    for name in named:
        if not re.fullmatch(r"[A-Za-z_]\w*", name) or name == "optimizer":
            raise UsageError(
                f"config.optimizers.{name}: {name!r} is not an optimizer name; use an "
                "identifier (e.g. critic) other than 'optimizer', which config.optimizer is"
            )
        recipe = named[name]
        missing = [key for key in defaults if not hasattr(recipe, "keys") or key not in recipe]
        if missing:
            raise UsageError(
                f"config.optimizers.{name} has no {', '.join(missing[:3])}"
                f"{' ...' if len(missing) > 3 else ''}: make it a whole recipe, "
                "config_defaults.optimizer_recipe(learning_rate=..., ...)"
            )
    for key in optimizer.keys():
        if key not in defaults or optimizer[key] != defaults[key]:
            raise _fail(
                f"optimizer.{key}",
                optimizer[key],
                f"is not read: config.optimizers names this run's optimizers ({listed}); "
                f"set config.optimizers.<name>.{key} instead",
            )


def _validate_recipe(
    optimizer: Mapping[str, Any], prefix: str, defaults: Mapping[str, Any]
) -> None:
    """The checks of one recipe; its keys are named `config.<prefix>.<key>`."""
    schedule = optimizer["schedule"]
    for key, bound in RECIPE_BOUNDS.items():
        bound.check(f"config.{prefix}.{key}", optimizer.get(key, defaults[key]))
    _validate_lengths(optimizer, prefix)
    for key, owner in SCHEDULE_KEYS.items():
        if owner != schedule and optimizer[key] != defaults[key]:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"is a parameter of schedule={owner!r}, not of {schedule!r}; remove it",
            )
    for key, bound in SCHEDULE_BOUNDS.get(schedule, {}).items():
        bound.check(f"config.{prefix}.{key}", optimizer[key])
    if schedule == "piecewise":
        _validate_piecewise(optimizer, prefix)
    _validate_optimizer_keys(optimizer, prefix, defaults)


def _validate_lengths(optimizer: Mapping[str, Any], prefix: str) -> None:
    """A length is said in steps or in epochs, not both."""
    for epochs_key, steps_key in EPOCH_KEYS.items():
        if optimizer.get(epochs_key) and optimizer[steps_key]:
            raise _fail(
                f"{prefix}.{epochs_key}",
                optimizer[epochs_key],
                f"and {prefix}.{steps_key}={optimizer[steps_key]!r} both say where it is: "
                "give one (in epochs, the steps are counted when the run starts)",
            )


def _validate_optimizer_keys(
    optimizer: Mapping[str, Any], prefix: str, defaults: Mapping[str, Any]
) -> None:
    """The keys that depend on which Keras optimizer the recipe names, and on each other."""
    name = str(optimizer["name"]).lower()
    for key, takers in OPTIMIZER_KEYS.items():
        if optimizer[key] != defaults[key] and name not in takers:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"does not apply to {name} (only to {', '.join(takers)}); remove it",
            )
    if optimizer["nesterov"] and not optimizer["momentum"]:
        raise _fail(f"{prefix}.nesterov", True, f"needs config.{prefix}.momentum > 0 (e.g. 0.9)")
    if name in NEEDS_WEIGHT_DECAY and not optimizer["weight_decay"]:
        raise _fail(
            f"{prefix}.weight_decay",
            optimizer["weight_decay"],
            f"must be > 0 with {name} (Keras' default is 0.004), or use name='adam'",
        )
    for key in optimizer.keys():
        if key in KERAS_ARGUMENTS_NOT_PASSED:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"is not passed to Keras: {KERAS_ARGUMENTS_NOT_PASSED[key]}",
            )


def _validate_piecewise(optimizer: Mapping[str, Any], prefix: str) -> None:
    """Increasing boundaries (in steps, or in epochs), and one more multiplier than them."""
    boundaries, multipliers = tuple(optimizer["boundaries"]), tuple(optimizer["multipliers"])
    in_epochs = tuple(optimizer.get("boundary_epochs", ()))
    if in_epochs:
        if not all(is_number(b) and b > 0 for b in in_epochs) or not _increasing(in_epochs):
            raise _fail(
                f"{prefix}.boundary_epochs",
                in_epochs,
                "must be increasing epochs > 0, e.g. (30, 60, 80)",
            )
        boundaries, what = in_epochs, "boundary_epochs"
    elif not all(is_integer(b) and b > 0 for b in boundaries) or not _increasing(boundaries):
        raise _fail(
            f"{prefix}.boundaries",
            boundaries,
            "must be increasing step numbers > 0, e.g. (30000, 60000) (or boundary_epochs)",
        )
    else:
        what = "boundaries"
    if len(multipliers) != len(boundaries) + 1 or not all(
        is_number(m) and m >= 0 for m in multipliers
    ):
        raise _fail(
            f"{prefix}.multipliers",
            multipliers,
            f"must be {len(boundaries) + 1} numbers >= 0, one more than the "
            f"{len(boundaries)} {what} (factors of learning_rate, e.g. (1.0, 0.1, 0.01))",
        )


def _increasing(values: tuple[Any, ...]) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def counts_epochs(config: Mapping[str, Any]) -> bool:
    """Whether a recipe of `config` says a length in epochs (warmup_epochs, boundary_epochs):
    the run then needs its training examples counted, as for --train_epochs."""
    recipes = [config["optimizer"], *(config.get("optimizers") or {}).values()]
    return any(recipe.get(key) for recipe in recipes for key in EPOCH_KEYS)
