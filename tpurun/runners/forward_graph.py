"""The serving model's forward pass as a graph, for TensorBoard's graph tab (`TrainSummaries`)."""

from __future__ import annotations

import tensorflow as tf

from tpurun import inputs
from tpurun.model import Mode, has_own_train_step
from tpurun.runners.train import Trainer


def forward_graph(trainer: Trainer) -> tf.Graph:
    """The serving model's forward pass, traced (not run) on one replica's training
    features (with a training step of its own, on the model's own inputs: a GAN's
    generator takes noise, not the training data)."""
    if has_own_train_step(trainer.model):
        features_spec = tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype, name=t.name), trainer.keras_model.input
        )
    else:
        ctx = tf.distribute.InputContext(num_replicas_in_sync=trainer.strategy.num_replicas_in_sync)
        params = inputs.input_params(ctx, trainer.global_batch, trainer.run.seed)
        if trainer.arrays is not None:  # from their specs: no second dataset of them
            features_spec, _ = trainer.arrays.batch_spec(params.batch_size)
        else:
            features_spec, _ = trainer.model.input_fn(Mode.TRAIN, params).element_spec
        if isinstance(features_spec, dict):  # the graph's inputs named after the features
            features_spec = {
                k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in features_spec.items()
            }
    forward = tf.function(lambda features: trainer.keras_model(features, training=True))
    with trainer.strategy.scope():
        return forward.get_concrete_function(features_spec).graph
