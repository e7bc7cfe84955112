"""The optimizer a config describes: schedule, warmup, batch scaling, weight decay, clipping, EMA.

`build_optimizer(config, global_batch_size)` returns a Keras optimizer that the
training loop uses as any other: build it on the trainable variables in the
strategy's scope, call `apply_gradients` inside `strategy.run` with each replica's
own (not yet summed) gradients. The keys, their defaults and meaning are in
`tpurun.config_defaults`; their checks in `tpurun.run_config.recipe_keys`.

What Keras 3 (TensorFlow backend) does under tf.distribute, and what tpurun adds:

* Clipping. `apply_gradients` in replica context runs `_clip_gradients` (clipnorm,
  global_clipnorm) on each replica's gradients *before* `_backend_update_step`
  all-reduces them (`_all_reduce_sum_gradients`, keras/src/backend/tensorflow/
  optimizer.py). Each replica's part of the batch is clipped on its own, so 1 and 4
  replicas take different steps (tests/test_optimization.py shows it), and Keras 3
  has no `skip_gradients_aggregation` / `experimental_aggregate_gradients` to all-reduce
  first and apply the sum (keras-team/keras#19308). Calling `apply_gradients` from a
  merge_call (cross-replica context) fails inside Keras (`maybe_merge_call` then finds
  no replica context). So tpurun's optimizers clip in `_all_reduce_sum_gradients`
  itself, right after the one all-reduce: every replica clips the same summed
  gradients by their global norm, at no extra communication.
* Weight decay. Keras decays every variable not excluded, by `variable x rate x
  weight_decay` before each update. `exclude_from_weight_decay(var_names=...)` matches
  substrings of `variable.name` ("bias", without the layer); tpurun's regex is searched
  in `variable.path` ("dense/bias") when the optimizer is built, and the matches are
  excluded by identity (`var_list=`).
* The all-reduce. Keras sums the replicas' gradients with `ReplicaContext.all_reduce`,
  which wraps it in a `tf.custom_gradient` (so that the sum is differentiable); in a
  graph that wrapper walks back from the summed gradients to every op they depend on,
  with a list for the ops seen (op_selector.get_backward_walk_ops: quadratic), and
  under a MirroredStrategy, which traces the step once per replica, the sum depends
  on every replica's forward and backward pass: tracing ResNet-50's train step on 8
  replicas (`tpurun check --target=v5e-8`) took over 40 minutes in it. Nothing
  differentiates the sum of gradients, so tpurun sums them without the wrapper
  (`sum_over_replicas`: the same reduction, as all_reduce itself calls it).
* EMA. `use_ema=True, ema_momentum=d` keeps one average per trainable variable,
  created by `build` as ordinary optimizer variables (`optimizer/_variables/<i>` in a
  tf.train.Checkpoint, so saved and restored with the optimizer), updated after each
  step: the first step copies the weights, then average = d x average + (1 - d) x
  weights. With `ema_overwrite_frequency=None` the weights are never replaced during
  training; `finalize_variable_values` would overwrite them for good, so tpurun uses
  `swap_in_ema` (in-process) and `restore_ema_weights` (an evaluator that restores a
  checkpoint) instead.
* AdamWeightDecay (`adam_weight_decay`, `name="adamweightdecay"`): google-research/bert's
  optimizer, Adam without bias correction, for its recipes (configs/bert.py); the
  decoupled decay and its exclusions are Keras' and tpurun's as above.
* Schedules are Keras LearningRateSchedules, which Keras evaluates at
  `optimizer.iterations`; `follow_step` makes them follow the run's global step
  instead (a GAN's critic updates several times per step), the step a checkpoint
  restores: a resumed run continues on the curve. The schedule itself is not in the checkpoint (only variables are); it is
  rebuilt from the config, which is why checkpoints.py refuses a resume that changes it.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Iterator, Sequence
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tpurun.config_defaults import base_config
from tpurun.errors import CheckpointMismatch, RunError, UsageError
from tpurun.errors.tf_errors import one_line
from tpurun.optimization.adam_weight_decay import AdamWeightDecay
from tpurun.optimization.schedules import learning_rate
from tpurun.run_config.recipe_keys import KERAS_ARGUMENTS_NOT_PASSED, RECIPE_KEYS

# Keras' private hook this module extends (see the module docstring); checked when an
# optimizer is built, so a Keras without it fails loudly instead of not clipping.
_ALL_REDUCE_HOOK = "_all_reduce_sum_gradients"
# Keras' list of averages, parallel to the variables the optimizer was built on.
_AVERAGES = "_model_variables_moving_average"
# Keras' schedule (or rate variable) and the variables the optimizer was built on.
_SCHEDULE = "_learning_rate"
_BUILT_ON = "_trainable_variables"


def missing() -> list[str]:
    """The private Keras attributes this module uses that this Keras lacks.

    tests/test_tf_internals.py asserts none is: clipping without the all-reduce hook
    refuses to build (rather than not clip), EMA without the averages' list fails to
    read them, and without the schedule the learning_rate scalar shows the current rate.
    """
    optimizer = keras.optimizers.SGD(use_ema=True)
    optimizer.build([keras.Variable(1.0)])
    absent = [
        name
        for name in (_ALL_REDUCE_HOOK, _AVERAGES, _SCHEDULE, _BUILT_ON)
        if not hasattr(optimizer, name)
    ]
    extended = tf.distribute.get_strategy().extended
    return absent + [name for name in _REDUCE_PATHS if not hasattr(extended, name)]


# tf.distribute's private choice between its two replica-context reductions (what
# ReplicaContext.all_reduce calls), for `sum_over_replicas`.
_REDUCE_PATHS = ("_use_merge_call", "_replica_ctx_all_reduce")


def sum_over_replicas(values: list[Any]) -> list[Any]:
    """ReplicaContext.all_reduce(SUM, values) in a replica context, without the gradient
    TensorFlow wraps it in (see the module docstring); all_reduce itself where the
    private paths it takes moved (`missing` says so)."""
    context = tf.distribute.get_replica_context()
    extended = context.strategy.extended
    total = tf.distribute.ReduceOp.SUM
    if not all(hasattr(extended, name) for name in _REDUCE_PATHS):
        return list(context.all_reduce(total, values))
    if not extended._use_merge_call():  # e.g. TPUStrategy: in the replica context
        options = tf.distribute.experimental.CommunicationOptions()
        return list(extended._replica_ctx_all_reduce(total, values, options))

    def batch_sum(strategy: tf.distribute.Strategy, *parts: Any) -> Any:
        # Each sum where its part is (a tensor's device), as all_reduce reduces them.
        destinations = [p.device if isinstance(p, tf.Tensor) else p for p in parts]
        return strategy.extended.batch_reduce_to(total, list(zip(parts, destinations, strict=True)))

    return list(context.merge_call(batch_sum, args=tuple(values)))


def learning_rate_at(optimizer: keras.optimizers.Optimizer, step: Any) -> tf.Tensor:
    """The rate the optimizer uses for the update after `step` steps (for TensorBoard), as
    a float32 tensor: `step` may be a tensor, in a host loop's graph."""
    rate = getattr(optimizer, _SCHEDULE, None)
    if isinstance(rate, StepSchedule):
        rate = rate.schedule
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
        return tf.cast(rate(step), tf.float32)
    return tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)


class StepSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule evaluated at the run's global step, not at the optimizer's `iterations`.

    Keras evaluates a schedule at `optimizer.iterations`, the updates that optimizer
    made: a GAN's critic makes several per step, so its curve would run ahead of the
    run's. `step` is the Trainer's global step variable (the steps done).
    """

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, step: Any):
        self.schedule = schedule
        self.step = step

    def __call__(self, iterations: Any) -> tf.Tensor:
        return self.schedule(self.step)

    def get_config(self) -> dict[str, Any]:
        return self.schedule.get_config()


def follow_step(optimizer: keras.optimizers.Optimizer, step: Any) -> None:
    """Makes the optimizer's schedule (if it has one) follow the global step `step`.

    A constant rate stays the variable it is (a resumed run sets it from its config).
    """
    rate = getattr(optimizer, _SCHEDULE, None)
    if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule) and not isinstance(
        rate, StepSchedule
    ):
        optimizer.learning_rate = StepSchedule(rate, step)


class RecipeOptimizer:
    """Mixed into a Keras optimizer class: tpurun's clipping and weight-decay exclusion.

    The MRO is (RecipeOptimizer, keras class): `build` and `_all_reduce_sum_gradients`
    run here first, then Keras'. Everything else is the Keras optimizer's own.
    """

    clip_norm: float = 0.0
    weight_decay_exclude: str = ""
    l2_weight_decay: float = 0.0

    def build(self, variables: Sequence[Any]) -> None:
        pattern = re.compile(self.weight_decay_exclude)
        excluded = [v for v in variables if pattern.search(v.path)]
        if self.weight_decay:  # type: ignore[attr-defined]
            self.exclude_from_weight_decay(var_list=excluded)  # type: ignore[attr-defined]
        # The update sees the variables' values (what Keras' _backend_update_step passes):
        # the L2-decayed ones are known by those.
        self._l2_decayed = {id(v.value) for v in variables if not any(v is e for e in excluded)}
        super().build(variables)  # type: ignore[misc]

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        # Keras all-reduces here, after its own (per-replica) clipping and before the
        # update (module docstring); tpurun sums without all_reduce's gradient. The summed
        # gradients get the L2 term and are clipped right after, as if the L2 term were in
        # the loss (as TF1 programs put it).
        pairs = list(grads_and_vars)
        present = [g for g, _ in pairs if g is not None]
        if tf.distribute.get_replica_context() is None or not present:
            summed = list(super()._all_reduce_sum_gradients(pairs))  # type: ignore[misc]
        else:
            sums = iter(sum_over_replicas(present))
            summed = [(None if g is None else next(sums), v) for g, v in pairs]
        if self.l2_weight_decay:
            summed = [(self._with_l2(g, v), v) for g, v in summed]
        if not self.clip_norm:
            return summed
        grads = clip_by_global_norm([g for g, _ in summed], self.clip_norm)
        return [(g, v) for g, (_, v) in zip(grads, summed, strict=True)]

    def _with_l2(self, grad: Any, variable: Any) -> Any:
        """grad + l2_weight_decay x variable: the gradient of l2_weight_decay x sum(w^2) / 2."""
        if grad is None or id(variable) not in self._l2_decayed:
            return grad
        decay = tf.cast(self.l2_weight_decay, variable.dtype) * tf.convert_to_tensor(variable)
        if isinstance(grad, tf.IndexedSlices):  # an embedding's: every row decays
            grad = tf.convert_to_tensor(grad)
        return grad + tf.cast(decay, grad.dtype)


def clip_by_global_norm(grads: Sequence[Any], clip_norm: float) -> list[Any]:
    """Scales the gradients so that their global norm is at most clip_norm (None stays None).

    The norm is computed in float32 from dense values: an IndexedSlices (an embedding's
    gradient) may repeat an index, whose rows add up, so the norm of its `values`
    would overstate it. The slices themselves stay sparse.
    """
    present = [g for g in grads if g is not None]
    squares = [
        tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(g), tf.float32))) for g in present
    ]
    norm = tf.sqrt(tf.add_n(squares))
    # Never above 1; NaN when the norm is NaN or Inf, so a blown-up step shows as NaN
    # weights (the loop stops on them) rather than a silent zero update.
    scale = clip_norm / tf.maximum(norm, clip_norm) + 0.0 * (norm - norm)

    def scaled(g: Any) -> Any:
        if g is None:
            return None
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(scale, g.dtype), g.indices, g.dense_shape)
        return g * tf.cast(scale, g.dtype)

    return [scaled(g) for g in grads]


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
    if opt.clip_norm and not hasattr(cls, _ALL_REDUCE_HOOK):
        raise RunError(
            f"{key}.clip_norm needs Keras' {_ALL_REDUCE_HOOK}, where tpurun clips "
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


def ema_pairs(optimizer: keras.optimizers.Optimizer) -> list[tuple[Any, Any]]:
    """(trainable variable, its moving average) for every variable the optimizer built on."""
    if not optimizer.use_ema:
        raise RunError("the optimizer keeps no moving averages: config.train.ema_decay is 0")
    if not optimizer.built:
        raise RunError("build the optimizer on the trainable variables before reading averages")
    averages = getattr(optimizer, _AVERAGES)
    pairs = zip(getattr(optimizer, _BUILT_ON), averages, strict=True)
    return [(variable, average) for variable, average in pairs if average is not None]


@contextlib.contextmanager
def swap_in_ema(optimizer: keras.optimizers.Optimizer) -> Iterator[None]:
    """Within the block, the model's trainable variables hold their moving averages.

    For an evaluation or export in the training process (in cross-replica context,
    outside `strategy.run`); the raw weights are back afterwards, even on an error.
    """
    pairs = ema_pairs(optimizer)
    raw = [tf.identity(variable) for variable, _ in pairs]
    for variable, average in pairs:
        variable.assign(average)
    try:
        yield
    finally:
        for (variable, _), value in zip(pairs, raw, strict=True):
            variable.assign(value)


class MovingAverages:
    """The moving averages a training checkpoint keeps, read into a model's trainable weights.

    For an evaluator, predictor or export that restores the model only: the averages
    are optimizer variables, found by their place in an optimizer built from the same
    config on the same variables (`variables`, as training built it). `name`: the
    recipe of config.optimizers that kept them (None: config.optimizer). Make it
    (once) in the strategy scope the model was built in; `load(path)` after each
    restore of the model.
    """

    def __init__(
        self,
        variables: Sequence[Any],
        config: ml_collections.ConfigDict,
        name: str | None = None,
    ):
        self._optimizer = build_optimizer(config, config.train.batch_size, name)
        self._optimizer.build(list(variables))
        self._name = name

    def load(self, checkpoint_path: str) -> None:
        # The optimizer tracks the model's variables too: this also restores the raw
        # weights. Every variable of this optimizer must be in the checkpoint: one
        # trained without EMA has fewer, and would otherwise fill the averages with
        # Adam's moments (the variables are matched by their place in the list).
        parts: dict[str, Any] = (
            {"optimizer": self._optimizer}
            if self._name is None
            else {"optimizers": {self._name: self._optimizer}}
        )
        try:
            status = tf.train.Checkpoint(**parts).read(checkpoint_path)
            status.expect_partial().assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:
            reason = one_line(e, 200)
            raise CheckpointMismatch(
                f"{checkpoint_path} has no moving averages for this config's optimizer "
                f"({reason}): it was not trained with this config.train.ema_decay "
                "and optimizer; use the config it was trained with",
                f"no moving averages for this optimizer ({reason})",
            ) from None
        for variable, average in ema_pairs(self._optimizer):
            variable.assign(average)


def restore_ema_weights(
    keras_model: keras.Model, config: ml_collections.ConfigDict, checkpoint_path: str
) -> None:
    """Sets the model's trainable weights to the moving averages of a training checkpoint
    (`MovingAverages`, once)."""
    MovingAverages(keras_model.trainable_variables, config).load(checkpoint_path)
