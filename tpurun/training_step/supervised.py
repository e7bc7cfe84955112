"""The default training step, `Model.train_step` of every model that does not write its own.

It is written with the same `Step` a model's own step gets: the serving model's
per-example `loss(labels, outputs)` averaged over the global batch, its
regularization losses scaled, one optimizer (`optimizer`) over its trainable
variables, and gradient accumulation: with `train.accumulate_steps` = N the step
gets its N micro-batches stacked ([N, batch, ...]), sums their gradients and
applies them once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import tensorflow as tf

from tpurun import precision
from tpurun.training_step.step import Step

# The one optimizer of config.optimizer, as Step.optimizers names it.
OPTIMIZER = "optimizer"

Loss = Callable[[Any, Any], tf.Tensor]


def supervised_step(loss_fn: Loss, step: Step, features: Any, labels: Any) -> dict[str, tf.Tensor]:
    """One replica's supervised step; returns {"loss": its share of the step's mean loss}."""
    if step.micro_batches == 1:
        loss, gradients = _gradients(loss_fn, step, features, labels)
    else:
        variables = step.variables(OPTIMIZER)
        loss = tf.constant(0.0)
        gradients = [tf.zeros_like(v) for v in variables]
        for i in tf.range(step.micro_batches):
            micro_features, micro_labels = tf.nest.map_structure(
                lambda t, i=i: t[i], (features, labels)
            )
            with step.micro_batch(i):
                micro_loss, micro_gradients = _gradients(
                    loss_fn, step, micro_features, micro_labels
                )
            loss += micro_loss
            gradients = [
                g if m is None else g + tf.convert_to_tensor(m)  # sparse ones made dense
                for g, m in zip(gradients, micro_gradients, strict=True)
            ]
    step.apply(OPTIMIZER, gradients)
    return {"loss": loss}


def _gradients(
    loss_fn: Loss, step: Step, features: Any, labels: Any
) -> tuple[tf.Tensor, list[Any]]:
    """This replica's loss share on one (micro-)batch and its gradients."""
    with tf.GradientTape() as tape:
        outputs = precision.float32(step.model(features, training=True))
        # Scaled by the global batch of a whole step (all micro-batches), so the
        # all-reduced (summed) gradients equal those of one replica on it.
        loss = step.mean(loss_fn(labels, outputs))
        if step.model.losses:
            loss += step.regularization()
    return loss, step.gradients(OPTIMIZER, tape, loss)
