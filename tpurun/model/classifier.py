"""`Classifier`: a Model of class logits and int32 class ids, with their loss, accuracy and predictions."""

from __future__ import annotations

import keras
import tensorflow as tf

from tpurun.model.interface import Model


class Classifier(Model):
    """A Model whose outputs are class logits and whose labels are int32 class ids.

    Supplies the loss (softmax cross-entropy), the accuracy metric and the
    `class_ids` / `probabilities` predictions; subclasses still provide
    `input_fn` and `build`.
    """

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=outputs)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {
            "class_ids": tf.argmax(outputs, axis=-1, output_type=tf.int32),
            "probabilities": tf.nn.softmax(outputs),
        }
