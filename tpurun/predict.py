"""The predict runner: N input rows give exactly N output rows, in input order.

A model that defines `generate` (see `tpurun.model`) predicts its own way instead:
its rows are whatever `generate` returns for the restored model.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tpurun import checkpoints, inputs, precision
from tpurun.cluster import Cluster
from tpurun.model import Mode, Model, build_models, has_generate
from tpurun.run_config import RunConfig


class Predictor:
    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.strategy = cluster.strategy
        self.model = model
        with self.strategy.scope():
            self.models = build_models(model)
            self.keras_model = self.models[model.serving_model]  # what predicts
            self._averages = checkpoints.averages_of(model, self.models, run.config)
        self._step = tf.function(self._host_step)

    @property
    def weights(self) -> list:
        """The serving model's variables (what the predict step reads)."""
        return list(self.keras_model.variables)

    def replica_step(self, features, mask):
        """One replica's predict step: named predictions of its padded batch, and the mask."""
        outputs = precision.float32(self.keras_model(features, training=False))
        return self.model.predictions(outputs), mask

    def _host_step(self, batch):
        per_replica = self.strategy.run(self.replica_step, args=batch)
        return inputs.gather_replicas(self.strategy, per_replica)

    def predict(self, checkpoint_path: str) -> Iterator[dict[str, Any]]:
        """Yields one dict of numpy values per input row; padding rows are dropped.

        For a model with its own `generate`: the rows it returns.
        """
        checkpoints.restore_weights(self.models, checkpoint_path, self._averages)
        if has_generate(self.model):
            yield from self.model.generate(self.keras_model, self.strategy)
            return
        dataset = inputs.distribute(
            self.strategy, self.model, Mode.PREDICT, self.run.predict_batch_size, self.run.seed
        )
        for batch in dataset:
            predictions, mask = self._step(batch)
            predictions = tf.nest.map_structure(lambda t: t.numpy(), predictions)
            keep = mask.numpy() > 0
            for index in np.flatnonzero(keep):
                yield {name: value[index] for name, value in predictions.items()}
