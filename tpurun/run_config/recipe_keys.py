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
from tpurun.run_config.bounds import is_number

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


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _fail(key: str, value: Any, allowed: str) -> UsageError:
    return UsageError(f"config.{key}={value!r} {allowed}")


def validate(config: Mapping[str, Any], train_steps: int | None) -> None:
    """Raises UsageError, one line, for the first bad recipe key of `config` (the whole config).

    `train_steps` is the run's final train.steps (the horizon of cosine and linear); None
    while it is not known yet (a run counted in epochs, before its examples are counted).
    Checks config.optimizer, and each named recipe of config.optimizers; with named
    ones, config.optimizer must stay at its defaults (it would not be read).
    """
    from tpurun.config_defaults import base_config

    defaults = base_config(model="")["optimizer"]
    named = config.get("optimizers") or {}
    if named:
        _validate_names(named, config["optimizer"], defaults)
    _validate_recipe(config["optimizer"], "optimizer", defaults, train_steps)
    for name in named:
        _validate_recipe(named[name], f"optimizers.{name}", defaults, train_steps)
    ema_decay = config["train"]["ema_decay"]
    if not is_number(ema_decay) or not 0 <= ema_decay < 1:
        raise _fail(
            "train.ema_decay", ema_decay, "must be a number in [0, 1) (0 = no moving average)"
        )


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
    optimizer: Mapping[str, Any], prefix: str, defaults: Mapping[str, Any], train_steps: int | None
) -> None:
    """The checks of one recipe; its keys are named `config.<prefix>.<key>`."""
    name = str(optimizer["name"]).lower()
    schedule = optimizer["schedule"]

    if schedule not in SCHEDULES:
        raise _fail(
            f"{prefix}.schedule", schedule, f"is not a schedule; use one of {', '.join(SCHEDULES)}"
        )
    if not is_number(optimizer["learning_rate"]) or optimizer["learning_rate"] < 0:
        raise _fail(f"{prefix}.learning_rate", optimizer["learning_rate"], "must be a number >= 0")
    if not _is_int(optimizer["base_batch_size"]) or optimizer["base_batch_size"] < 0:
        raise _fail(
            f"{prefix}.base_batch_size",
            optimizer["base_batch_size"],
            "must be an integer >= 0 (0 = no scaling with the global batch)",
        )
    warmup = optimizer["warmup_steps"]
    if not _is_int(warmup) or warmup < 0:
        raise _fail(f"{prefix}.warmup_steps", warmup, "must be an integer >= 0 (0 = no warmup)")
    target = optimizer.get("warmup_target", "schedule")
    if target not in WARMUP_TARGETS:
        raise _fail(
            f"{prefix}.warmup_target",
            target,
            "is not a warmup target; use 'schedule' (the schedule's rate at warmup_steps) "
            "or 'peak' (learning_rate, as google-research/bert's optimization.py)",
        )
    warmup_epochs = optimizer.get("warmup_epochs", 0.0)
    if not is_number(warmup_epochs) or warmup_epochs < 0:
        raise _fail(
            f"{prefix}.warmup_epochs", warmup_epochs, "must be a number >= 0 (0 = no warmup)"
        )
    for epochs_key, steps_key in EPOCH_KEYS.items():
        if optimizer.get(epochs_key) and optimizer[steps_key]:
            raise _fail(
                f"{prefix}.{epochs_key}",
                optimizer[epochs_key],
                f"and {prefix}.{steps_key}={optimizer[steps_key]!r} both say where it is: "
                "give one (in epochs, the steps are counted when the run starts)",
            )
    if warmup and train_steps is not None and warmup >= train_steps:
        raise _fail(
            f"{prefix}.warmup_steps",
            warmup,
            f"must be less than train.steps={train_steps} (0 = no warmup)",
        )
    for key, owner in SCHEDULE_KEYS.items():
        if owner != schedule and optimizer[key] != defaults[key]:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"is a parameter of schedule={owner!r}, not of {schedule!r}; remove it",
            )
    _validate_schedule(optimizer, schedule, prefix)

    for key, takers in OPTIMIZER_KEYS.items():
        if optimizer[key] != defaults[key] and name not in takers:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"does not apply to {name} (only to {', '.join(takers)}); remove it",
            )
    momentum = optimizer["momentum"]
    if not is_number(momentum) or not 0 <= momentum < 1:
        raise _fail(f"{prefix}.momentum", momentum, "must be a number in [0, 1) (0 = none)")
    if not isinstance(optimizer["nesterov"], bool):
        raise _fail(f"{prefix}.nesterov", optimizer["nesterov"], "must be true or false")
    if optimizer["nesterov"] and not momentum:
        raise _fail(f"{prefix}.nesterov", True, f"needs config.{prefix}.momentum > 0 (e.g. 0.9)")
    weight_decay = optimizer["weight_decay"]
    if not is_number(weight_decay) or weight_decay < 0:
        raise _fail(f"{prefix}.weight_decay", weight_decay, "must be a number >= 0 (0 = none)")
    l2 = optimizer.get("l2_weight_decay", 0.0)
    if not is_number(l2) or l2 < 0:
        raise _fail(f"{prefix}.l2_weight_decay", l2, "must be a number >= 0 (0 = none)")
    if name in NEEDS_WEIGHT_DECAY and not weight_decay:
        raise _fail(
            f"{prefix}.weight_decay",
            weight_decay,
            f"must be > 0 with {name} (Keras' default is 0.004), or use name='adam'",
        )
    exclude = optimizer["weight_decay_exclude"]
    try:
        re.compile(exclude)
    except (re.error, TypeError) as e:
        raise _fail(f"{prefix}.weight_decay_exclude", exclude, f"is not a regex: {e}") from None
    clip_norm = optimizer["clip_norm"]
    if not is_number(clip_norm) or clip_norm < 0:
        raise _fail(f"{prefix}.clip_norm", clip_norm, "must be a number >= 0 (0 = no clipping)")
    for key in optimizer.keys():
        if key in KERAS_ARGUMENTS_NOT_PASSED:
            raise _fail(
                f"{prefix}.{key}",
                optimizer[key],
                f"is not passed to Keras: {KERAS_ARGUMENTS_NOT_PASSED[key]}",
            )


def _validate_schedule(optimizer: Mapping[str, Any], schedule: str, prefix: str) -> None:
    if schedule == "exponential":
        decay_steps, decay_rate = optimizer["decay_steps"], optimizer["decay_rate"]
        if not _is_int(decay_steps) or decay_steps < 1:
            raise _fail(
                f"{prefix}.decay_steps",
                decay_steps,
                "must be an integer >= 1 with schedule='exponential' "
                "(the rate is multiplied by decay_rate every decay_steps steps)",
            )
        if not is_number(decay_rate) or decay_rate <= 0:
            raise _fail(
                f"{prefix}.decay_rate",
                decay_rate,
                "must be a number > 0 with schedule='exponential' (e.g. 0.94)",
            )
        if not isinstance(optimizer["staircase"], bool):
            raise _fail(f"{prefix}.staircase", optimizer["staircase"], "must be true or false")
    elif schedule == "piecewise":
        boundaries, multipliers = tuple(optimizer["boundaries"]), tuple(optimizer["multipliers"])
        in_epochs = tuple(optimizer.get("boundary_epochs", ()))
        if in_epochs:
            if not all(is_number(b) and b > 0 for b in in_epochs) or any(
                a >= b for a, b in zip(in_epochs, in_epochs[1:], strict=False)
            ):
                raise _fail(
                    f"{prefix}.boundary_epochs",
                    in_epochs,
                    "must be increasing epochs > 0, e.g. (30, 60, 80)",
                )
            boundaries, what = in_epochs, "boundary_epochs"
        elif not all(_is_int(b) and b > 0 for b in boundaries) or any(
            a >= b for a, b in zip(boundaries, boundaries[1:], strict=False)
        ):
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
    elif schedule == "cosine":
        alpha = optimizer["alpha"]
        if not is_number(alpha) or not 0 <= alpha <= 1:
            raise _fail(
                f"{prefix}.alpha",
                alpha,
                "must be a number in [0, 1] (the final rate, as a fraction of learning_rate)",
            )
    elif schedule == "linear":
        end = optimizer["end_learning_rate"]
        if not is_number(end) or end < 0:
            raise _fail(f"{prefix}.end_learning_rate", end, "must be a number >= 0")


def counts_epochs(config: Mapping[str, Any]) -> bool:
    """Whether a recipe of `config` says a length in epochs (warmup_epochs, boundary_epochs):
    the run then needs its training examples counted, as for --train_epochs."""
    recipes = [config["optimizer"], *(config.get("optimizers") or {}).values()]
    return any(recipe.get(key) for recipe in recipes for key in EPOCH_KEYS)
