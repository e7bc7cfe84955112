"""Fashion-MNIST: the Keras CNN of the Fashion-MNIST TPU example, on the MNIST TFRecord schema.

Three blocks of BatchNormalization -> Conv2D 5x5 elu -> max pool 2x2 -> dropout
0.25 (64, 128, 256 filters), then flatten -> dense 256 elu -> dropout 0.5 -> dense
10. The example ended in a softmax; here the last layer gives logits and
`predictions` applies the softmax (the loss is computed from logits, which is
numerically safer). Data: `scripts/convert_mnist.py` converts Fashion-MNIST's
files (same IDX names and npz keys as MNIST) to the TFRecords `image_records` reads.
"""

from __future__ import annotations

import keras
from tpurun.models.image_records import NUM_CLASSES, ImageClassifier, image_input

from tpurun.model import register

CLASS_NAMES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)


@register("fashion_mnist")
class FashionMnist(ImageClassifier):
    """BN/conv/pool/dropout blocks, a dense elu layer with dropout, logits for ten garments."""

    class_names = CLASS_NAMES

    def build(self) -> keras.Model:
        config = self.config
        inputs, net = image_input()
        for filters in config.conv_filters:
            net = keras.layers.BatchNormalization(momentum=config.bn_momentum)(net)
            net = keras.layers.Conv2D(
                filters, config.kernel_size, padding="same", activation="elu"
            )(net)
            net = keras.layers.MaxPooling2D(pool_size=2, strides=2)(net)
            net = keras.layers.Dropout(config.conv_dropout, seed=config.seed)(net)
        net = keras.layers.Flatten()(net)
        net = keras.layers.Dense(config.hidden_units, activation="elu")(net)
        net = keras.layers.Dropout(config.dropout, seed=config.seed)(net)
        logits = keras.layers.Dense(NUM_CLASSES, name="logits")(net)
        return keras.Model(inputs=inputs, outputs=logits, name="fashion_mnist")
