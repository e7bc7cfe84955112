"""`build_optimizer`: the Keras optimizer a config's recipe describes, with tpurun's recipe mixed in.

The keys, their defaults and meaning are in `tpurun.config_defaults`; their checks in
`tpurun.run_config.keys.recipe_keys`. A recipe key tpurun does not read goes to the Keras
constructor, and one it does not take is an error.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import keras
import ml_collections

from tpurun.config_defaults import base_config
from tpurun.errors import RunError, UsageError
from tpurun.optimization.adam_weight_decay import AdamWeightDecay
from tpurun.optimization.keras_private import ALL_REDUCE_HOOK
from tpurun.optimization.recipe_optimizer import RecipeOptimizer
from tpurun.optimization.schedules import learning_rate
from tpurun.run_config.keys.recipe_keys import KERAS_ARGUMENTS_NOT_PASSED, RECIPE_KEYS


@functools.cache
def _with_recipe(cls: type) -> type:
    """`cls` with RecipeOptimizer mixed in; same class name, so the same variable names."""
    return type(cls.__name__, (RecipeOptimizer, cls), {"__module__": __name__})


# Keras optimizers that wrap others (a loss scale, one optimizer per variable group).
_WRAPPERS = ("lossscaleoptimizer", "multioptimizer")


def optimizer_classes() -> dict[str, type]:
    """Keras' optimizers by lower-case name, as config.optimizer.name spells them."""
    classes = {}
    for attribute in dir(keras.optimizers):
        cls = getattr(keras.optimizers, attribute)
        if (
            isinstance(cls, type)
            and issubclass(cls, keras.optimizers.Optimizer)
            and cls is not keras.optimizers.Optimizer
            and attribute.lower() not in _WRAPPERS
        ):
            classes[attribute.lower()] = cls
    classes["adamweightdecay"] = AdamWeightDecay  # tpurun's own: google-research/bert's
    return classes


def _optimizer_class(name: str, prefix: str = "config.optimizer") -> type:
    classes = optimizer_classes()
    cls = classes.get(name.lower()) or keras.saving.get_registered_object(name)
    if not (isinstance(cls, type) and issubclass(cls, keras.optimizers.Optimizer)):
        raise UsageError(
            f"{prefix}.name={name!r} is not a Keras optimizer; use one of "
            f"{', '.join(sorted(classes))} (or a registered Keras optimizer's name)"
        )
    return cls


def _constructor_arguments(
    cls: type, optimizer_config: ml_collections.ConfigDict, prefix: str = "config.optimizer"
) -> dict:
    """The keys of a recipe (`prefix`, config.optimizer) that go to the Keras constructor."""
    defaults = _recipe_defaults()
    takes = inspect.signature(cls).parameters
    arguments = {}
    for key in optimizer_config.keys():
        value = optimizer_config[key]
        if key in RECIPE_KEYS and (key not in ("momentum", "nesterov") or value == defaults[key]):
            continue  # read by build_optimizer; momentum and nesterov only when set
        if key in KERAS_ARGUMENTS_NOT_PASSED:
            raise UsageError(
                f"{prefix}.{key}={value!r} is not passed to Keras: "
                f"{KERAS_ARGUMENTS_NOT_PASSED[key]}"
            )
        if key not in takes:
            raise UsageError(
                f"{prefix}.{key}={value!r} is not an argument of keras.optimizers."
                f"{cls.__name__}; remove it (its own arguments: "
                f"{', '.join(_own_arguments(cls)) or 'none'})"
            )
        arguments[key] = tuple(value) if isinstance(value, list) else value
    return arguments


def _own_arguments(cls: type) -> list[str]:
    base = set(inspect.signature(keras.optimizers.SGD).parameters)
    base -= {"momentum", "nesterov"}
    return [p for p in inspect.signature(cls).parameters if p not in base]


@functools.cache
def _recipe_defaults() -> dict[str, Any]:
    return dict(base_config(model="").optimizer.to_dict())


def recipe_of(config: ml_collections.ConfigDict, name: str | None = None) -> Any:
    """config.optimizer (name None), or the named recipe config.optimizers.<name>."""
    return config.optimizer if name is None else config.optimizers[name]


def build_optimizer(
    config: ml_collections.ConfigDict,
    global_batch_size: int,
    name: str | None = None,
    ema: bool = True,
) -> keras.optimizers.Optimizer:
    """The Keras optimizer of `config` (the run's final config, already validated).

    `global_batch_size` is the run's train.batch_size after every flag, for
    base_batch_size; `name`: a recipe of config.optimizers (None: config.optimizer);
    `ema`: whether it keeps config.train.ema_decay's moving averages (of the variables
    it is built on). Create it in the strategy's scope and `build` it on the model's
    trainable variables there (the weight-decay exclusion is resolved then).
    """
    opt = recipe_of(config, name)
    key = "config.optimizer" if name is None else f"config.optimizers.{name}"
    cls = _optimizer_class(opt.name, key)
    if opt.clip_norm and not hasattr(cls, ALL_REDUCE_HOOK):
        raise RunError(
            f"{key}.clip_norm needs Keras' {ALL_REDUCE_HOOK}, where tpurun clips "
            f"the summed gradients, and keras {keras.__version__} has none: use the Keras "
            "version TensorFlow 2.20/2.21 installs, or clip_norm=0"
        )
    ema_decay = config.train.ema_decay if ema else 0.0
    arguments = _constructor_arguments(cls, opt, key)
    try:
        optimizer = _with_recipe(cls)(
            learning_rate=learning_rate(config, global_batch_size, opt),
            weight_decay=opt.weight_decay or None,
            **({"use_ema": True, "ema_momentum": ema_decay} if ema_decay else {}),
            **arguments,
        )
    except (ValueError, TypeError) as e:
        raise UsageError(
            f"keras.optimizers.{cls.__name__} rejected {key} ({e}); fix the value"
        ) from None
    optimizer.clip_norm = float(opt.clip_norm)
    optimizer.weight_decay_exclude = opt.weight_decay_exclude
    optimizer.l2_weight_decay = float(opt.get("l2_weight_decay", 0.0))
    return optimizer
