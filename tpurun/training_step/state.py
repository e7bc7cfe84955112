"""`TrainState`: what a training run owns, and so what its checkpoints hold.

Its models (by name), the global step, and the named optimizers, each built on
the variables the model assigns it, its schedule following the global step (not
its own `iterations`: a GAN's critic updates three times per step), and under
mixed_float16 wrapped in its own loss scale. A checkpoint is one
`tf.train.Checkpoint` over these parts:

* `model`: the serving model (what eval, predict and export restore), and `models`,
  all of them by name, when there are several;
* `optimizer` (config.optimizer), or `optimizers` by name (config.optimizers);
* `model_variables`: every model variable by name too (Keras's random-number states
  are not reachable through `model`);
* `loss_scale` / `loss_scales` under mixed_float16, apart from the optimizers, so a
  checkpoint reads the same under every precision;
* `step`: the global step.

A checkpoint written before a part existed (no `model_variables` or `step`: tpurun
before 0.2 and 0.3, whose step was the one optimizer's `iterations`) restores
without it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tpurun import optimization, precision
from tpurun.errors import RunError
from tpurun.training_step.step import Step
from tpurun.training_step.supervised import OPTIMIZER

# Parts every checkpoint of a run has; the others are read only when present.
REQUIRED_PARTS = ("model", "models", "optimizer", "optimizers")


def unique(variables: Sequence[Any]) -> list[Any]:
    """`variables` without repeats (a layer shared by two models), in order."""
    seen: set[int] = set()
    kept = []
    for variable in variables:
        if id(variable) not in seen:
            seen.add(id(variable))
            kept.append(variable)
    return kept


class TrainState:
    """The models, global step and named optimizers of a run; build it in the strategy's scope.

    `names`: config.optimizers' names, none for config.optimizer (the one named
    `OPTIMIZER`); `make_optimizer(name)` gives the optimizer of config.optimizer (name
    None) or of config.optimizers.<name> (`Model.optimizer`); `variables` the
    variables each optimizer updates, by name (`Model.optimized_variables`).
    """

    def __init__(
        self,
        models: Mapping[str, keras.Model],
        serving: str,
        names: Sequence[str],
        variables: Mapping[str, Sequence[Any]],
        make_optimizer: Callable[[str | None], keras.optimizers.Optimizer],
        precision_name: str,
        model_name: str,
    ):
        self.models = dict(models)
        self.serving = serving
        self.named = bool(names)
        self.variables = _checked(variables, list(names) or [OPTIMIZER], self.models, model_name)
        # The run's step (steps done): schedules, cadences, checkpoints and the keyed
        # random draws go by it, whatever each optimizer's `iterations` counts.
        self.global_step = tf.Variable(
            0,
            dtype=tf.int64,
            trainable=False,
            name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        self.optimizers: dict[str, keras.optimizers.Optimizer] = {}
        self.applying: dict[str, Any] = {}  # each optimizer, in its loss scale if any
        for name, owned in self.variables.items():
            optimizer = make_optimizer(name if self.named else None)
            optimization.follow_step(optimizer, self.global_step)
            applying = optimizer
            if precision.needs_loss_scaling(precision_name):
                applying = keras.optimizers.LossScaleOptimizer(optimizer)
            # Slot variables must exist before the first replicated step: created
            # lazily inside it, they break with 2+ replicas.
            applying.build(owned)
            self.optimizers[name], self.applying[name] = optimizer, applying
        self.trainable = unique([v for owned in self.variables.values() for v in owned])
        self.weights = unique([v for m in self.models.values() for v in m.variables])
        self._configured_rates = {n: self._constant_rate(n) for n in self.optimizers}
        self._restored_step = True

    @property
    def serving_model(self) -> keras.Model:
        return self.models[self.serving]

    @property
    def optimizer_variables(self) -> list[Any]:
        return unique([v for o in self.applying.values() for v in o.variables])

    # do_not_convert: no tensor-dependent Python control flow, no user
    # code; why it pays, at tpurun.precision.float32.
    @tf.autograph.experimental.do_not_convert
    def step_of(self, seed: int, global_batch: int, rows: int, micro_batches: int = 1) -> Step:
        """A `Step` for one replica's trace of the training step, on `rows` examples (per
        micro-batch) of a step of `global_batch`."""
        return Step(
            models=self.models,
            serving=self.serving,
            optimizers=self.optimizers,
            applying=self.applying,
            variables=self.variables,
            number=self.global_step,
            seed=seed,
            global_batch=global_batch,
            batch_size=rows,
            micro_batches=micro_batches,
        )

    def checkpoint(self, present: Collection[str] | None = None) -> tf.train.Checkpoint:
        """A checkpoint object over the parts (see the module docstring).

        `present`: the parts a checkpoint file has, to read it (one written before a
        part existed lacks it); None: every part, to save.
        """
        parts: dict[str, Any] = {"model": self.serving_model}
        if len(self.models) > 1:
            parts["models"] = self.models
        if self.named:
            parts["optimizers"] = self.optimizers
        else:
            parts["optimizer"] = self.optimizers[OPTIMIZER]
        parts["model_variables"] = list(self.weights)
        scales = {n: a for n, a in self.applying.items() if a is not self.optimizers[n]}
        if scales:
            parts.update(
                {"loss_scales": scales} if self.named else {"loss_scale": scales[OPTIMIZER]}
            )
        parts["step"] = self.global_step
        if present is not None:
            parts = {k: v for k, v in parts.items() if k in present or k in REQUIRED_PARTS}
            self._restored_step = "step" in parts
        return tf.train.Checkpoint(**parts)

    @property
    def step(self) -> int:
        return int(self.global_step.numpy())

    def learning_rates(self) -> dict[str, float]:
        """Each optimizer's rate for the next step (a schedule's value at the global step)."""
        return {
            n: float(optimization.learning_rate_at(o, self.step))
            for n, o in self.optimizers.items()
        }

    def rates_in_graph(self) -> tf.Tensor:
        """`learning_rates`, in a host loop's graph: a [optimizers] float32 vector."""
        step = self.global_step.read_value()
        return tf.stack([optimization.learning_rate_at(o, step) for o in self.optimizers.values()])

    def restored(self) -> None:
        """After a restore: the step of an older checkpoint, and this config's constant rates.

        A checkpoint without `step` was trained with one optimizer taking one update
        per step: its `iterations` is the step. A constant learning rate is a
        variable, so the checkpoint brought back the old one; the config of this run
        decides, as the flags did for TPUEstimator.
        """
        if not self._restored_step:
            if self.named:
                raise RunError("the checkpoint has named optimizers but no step: not tpurun's")
            self.global_step.assign(self.optimizers[OPTIMIZER].iterations)
        for name, configured in self._configured_rates.items():
            restored = self._constant_rate(name)
            if configured is not None and restored != configured:
                self.optimizers[name].learning_rate = configured
                logging.info(
                    "Learning rate %g%s from the config (the checkpoint had %g).",
                    configured,
                    f" of {name}" if self.named else "",
                    restored,
                )

    def _constant_rate(self, name: str) -> float | None:
        """The optimizer's learning rate, or None when it follows a schedule.

        Keras's public `get_config` gives a constant rate as a number and a schedule
        as its serialized description.
        """
        optimizer = self.optimizers[name]
        if not isinstance(optimizer.get_config().get("learning_rate"), (int, float)):
            return None
        return float(optimization.learning_rate_at(optimizer, self.step))


def _checked(
    variables: Mapping[str, Sequence[Any]],
    names: list[str],
    models: Mapping[str, keras.Model],
    model_name: str,
) -> dict[str, list[Any]]:
    """`optimized_variables`' answer, checked: one list per optimizer, each of trainable
    variables of the models, none in two optimizers, none empty."""
    if sorted(variables) != sorted(names):
        raise RunError(
            f"{model_name}.optimized_variables names the optimizers {', '.join(variables)}, "
            f"and this config has {', '.join(names)} (config.optimizers, or 'optimizer' for "
            "config.optimizer): give each of them its variables"
        )
    trainable = {id(v) for m in models.values() for v in m.trainable_variables}
    owner: dict[int, str] = {}
    checked = {}
    for name, owned in variables.items():
        owned = list(owned)
        if not owned:
            raise RunError(
                f"{model_name}.optimized_variables gives optimizer {name!r} no variables; give "
                "it its model's trainable_variables"
            )
        for variable in owned:
            if id(variable) not in trainable:
                raise RunError(
                    f"{model_name}.optimized_variables gives optimizer {name!r} "
                    f"{getattr(variable, 'path', variable)!r}, not a trainable variable of "
                    "the models build() returned"
                )
            if owner.setdefault(id(variable), name) != name:
                raise RunError(
                    f"{model_name}.optimized_variables gives {variable.path!r} to both "
                    f"{owner[id(variable)]!r} and {name!r}; give each variable one optimizer"
                )
        checked[name] = owned
    return checked
