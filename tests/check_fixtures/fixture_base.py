"""The model the `tpurun check` fixtures start from: TPU-clean until a subclass breaks one rule.

Four float32 features -> Dense(8, relu) -> a `culprit` layer -> Dense(3) logits,
trained on random data batched as the model interface asks. Each `*_model.py`
beside this file overrides one method to break one rule of `tpurun check`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import InputParams, Mode, Model

ROWS = 64


class Culprit(keras.layers.Layer):
    """Applies `fn` to its input: where the fixtures put the op a TPU rejects."""

    def __init__(self, fn, **kwargs):
        super().__init__(**kwargs)
        self.fn = fn

    def call(self, x):
        return self.fn(x)


class TinyModel(Model):
    def data(self, mode: Mode) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(0)
        features = rng.normal(size=(ROWS, 4)).astype(np.float32)
        labels = rng.integers(0, 3, size=ROWS).astype(np.int32)
        return features, labels

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        features, labels = self.data(mode)
        if mode is Mode.PREDICT:
            return tf.data.Dataset.from_tensor_slices(features).batch(params.batch_size)
        dataset = tf.data.Dataset.from_tensor_slices((features, labels))
        if mode is Mode.TRAIN:
            return self.batch_train(dataset.repeat(), params)
        return dataset.batch(params.batch_size)

    def batch_train(self, dataset: tf.data.Dataset, params: InputParams) -> tf.data.Dataset:
        return dataset.batch(params.batch_size, drop_remainder=True)

    def culprit(self, x: tf.Tensor) -> tf.Tensor:
        return x

    def build(self) -> keras.Model:
        inputs = keras.Input(shape=(4,), name="x")
        net = keras.layers.Dense(8, activation="relu")(inputs)
        net = Culprit(self.culprit, name="culprit")(net)
        logits = keras.layers.Dense(3, name="logits")(net)
        return keras.Model(inputs=inputs, outputs=logits, name="tiny")

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
