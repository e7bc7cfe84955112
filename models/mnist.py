"""MNIST: the CNN of "Using the Estimator API with TPUs" (mnist_tpu.py), on TFRecords of digits.

784 pixels -> 28x28x1 -> conv 5x5x32 relu -> max pool 2x2 -> conv 5x5x64 relu ->
max pool 2x2 -> dense 128 relu -> dropout 0.4 -> dense 10 logits. The data are
TFRecords of tf.train.Example (`image_raw`, `label`; see `image_records`), made from
the official files by `scripts/convert_mnist.py`.
"""

from __future__ import annotations

import keras
from tpurun.models.image_records import NUM_CLASSES, ImageClassifier, image_input

from tpurun.model import register


@register("mnist")
class Mnist(ImageClassifier):
    """Two conv/pool blocks, a dense layer with dropout, logits for the ten digits."""

    def build(self) -> keras.Model:
        config = self.config
        inputs, net = image_input()
        for filters in config.conv_filters:
            net = keras.layers.Conv2D(
                filters, config.kernel_size, padding="same", activation="relu"
            )(net)
            net = keras.layers.MaxPooling2D(pool_size=2, strides=2)(net)
        net = keras.layers.Flatten()(net)
        net = keras.layers.Dense(config.hidden_units, activation="relu")(net)
        net = keras.layers.Dropout(config.dropout, seed=config.seed)(net)
        logits = keras.layers.Dense(NUM_CLASSES, name="logits")(net)
        return keras.Model(inputs=inputs, outputs=logits, name="mnist")
