"""The flags that were given, merged into the config's keys (`--batch_size` is
`--config.train.batch_size`), then frozen; how long to train said once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections

from tpurun.errors import UsageError
from tpurun.run_config.flag_table import (
    FLAG,
    FLAG_TO_CONFIG_KEY,
    MODEL_SPECIFIC_FLAGS,
)


def merge_flags(
    config: ml_collections.ConfigDict,
    flag_values: dict[str, Any],
    overridden: Mapping[str, Any] | None = None,
) -> ml_collections.FrozenConfigDict:
    """Applies the flags that were given (not None) to their config keys, then freezes.

    `overridden`: the config keys given as `--config.<key>=...` and their values (already
    in `config`).
    How long to train is said once: in steps or in epochs. Given on the command line,
    it replaces the config file's choice; both there is an error.
    """
    length = _length_given(flag_values, overridden or {})
    config = ml_collections.ConfigDict(config.to_dict())  # unlocked copy; caller's stays intact
    for flag_name, key in FLAG_TO_CONFIG_KEY.items():
        value = flag_values.get(flag_name)
        if value is None:
            continue
        value = FLAG[flag_name].value_of(value)
        section, _, leaf = key.rpartition(".")
        node = config if not section else config.get(section)
        if flag_name in MODEL_SPECIFIC_FLAGS and (node is None or leaf not in node):
            raise UsageError(
                f"--{flag_name} sets config key {key}, which config {config.get('model')!r} "
                "does not have: it applies only to configs that define it; drop the flag"
            )
        if node is None or leaf not in node:
            raise UsageError(
                f"--{flag_name} sets config key {key}, which this config does not have; "
                "start the config from tpurun.config_defaults.base_config()"
            )
        if flag_name == "eval_every":
            with node.ignore_type():  # a number of steps, or "epoch"
                node[leaf] = value
        else:
            node[leaf] = value
    if length == "steps":
        config.train.epochs = 0.0  # the config file's epochs give way to the command line
    elif config.train.epochs:
        config.train.steps = 0  # derived from the epochs when the run starts
    return ml_collections.FrozenConfigDict(config)


def _length_given(flag_values: dict[str, Any], overridden: Mapping[str, Any]) -> str:
    """ "steps", "epochs" or "" (neither): how long to train, as the command line says it."""
    given: dict[str, str | None] = {}
    for name, flag, key in (
        ("steps", "train_steps", "train.steps"),
        ("epochs", "train_epochs", "train.epochs"),
    ):
        if flag_values.get(flag) is not None:
            given[name] = f"--{flag}={flag_values[flag]:g}"
        elif key in overridden:
            given[name] = f"--config.{key}={overridden[key]:g}"
        else:
            given[name] = None
    if given["steps"] and given["epochs"]:
        raise UsageError(
            f"{given['epochs']} and {given['steps']} both say how long to train: give one "
            "(in epochs, the steps are ceil(epochs x training examples / examples per step))"
        )
    return "steps" if given["steps"] else "epochs" if given["epochs"] else ""
