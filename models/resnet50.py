"""ResNet-50 on ImageNet: tensorflow/tpu's resnet_main.py recipe and resnet_model.py network.

The network is written out here, not taken from `keras.applications.ResNet50`,
because the recipe's network differs from that one where it matters:

* BatchNormalization with momentum 0.9 and epsilon 1e-5 (keras.applications: 0.99
  and 1.001e-5), and the last BatchNormalization of every block starting with its
  scale (gamma) at zero, so that each residual block starts as the identity
  (resnet_model.py's init_zero, from "Accurate, Large Minibatch SGD");
* convolutions without biases (BatchNormalization follows each), He-normal
  (fan-in) initialised, with resnet_model.py's fixed padding before a strided
  convolution, and the stride on the 3x3 convolution of a bottleneck ("v1.5");
  the final dense layer initialised from N(0, 0.01);
* a width and a depth to set (`config.width`, `config.blocks`), so that the tests
  and a laptop train the same code at 32x32 in seconds.

To the last padding it is resnet_model.py's: a resnet_main.py checkpoint read through
configs/resnet50.py's name map serves the probabilities of resnet_model.py's own TF1
graph (tests/test_foreign_resnet50.py; docs/checkpoints.md, "From a TPUEstimator
model_dir").

Bottleneck blocks (3, 4, 6, 3) of widths 64, 128, 256, 512 (x4 out) after a 7x7/2
convolution and a 3x3/2 max pool; global average pool; dense logits. The input is
{"image": [batch, size, size, 3]}, pixel values in [0, 255]; the first layer
normalises them with ImageNet's mean and standard deviation, on the device, as
resnet_main.py's model_fn did. Data: `resnet_input` (imagenet_to_gcs TFRecords or
TFDS imagenet2012), preprocessing: `resnet_preprocessing`.

Loss: softmax cross-entropy with config.label_smoothing. Metrics: top-1 and top-5
accuracy (resnet_main.py's eval metrics). Export: `serving_default` takes encoded
JPEG bytes (`image_bytes`, [batch] strings) and runs the eval preprocessing inside
the SavedModel, as tensorflow/tpu's image_serving_input_fn; `serving_images` takes
the decoded, cropped images (`image`, float32 [batch, size, size, 3] in [0, 255]).
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from tpurun.models import imagenet_records, resnet_input, resnet_preprocessing

from tpurun.errors import UsageError
from tpurun.model import Classifier, InputParams, Mode, register

# resnet_model.py's BatchNormalization.
BATCH_NORM_MOMENTUM = 0.9
BATCH_NORM_EPSILON = 1e-5
# The exported signatures' inputs.
SERVING_BYTES = "image_bytes"
SERVING_IMAGES = "serving_images"


@register("resnet50")
class ResNet50(Classifier):
    """tensorflow/tpu's ResNet-50 (v1.5 bottlenecks), trained on ImageNet JPEGs."""

    eval_splits = ("validation",)
    # input_fn(TRAIN) starts at params.start_batch itself: at the epoch of that
    # position, without reading (or decoding) the epochs before it.
    input_fn_seeks = True

    # Data ------------------------------------------------------------------------------

    def _dtype(self) -> tf.DType:
        """What the images cross to the device in: the compute dtype of the precision."""
        return tf.bfloat16 if self.config.precision == "mixed_bfloat16" else tf.float32

    def _source(self, mode: Mode, params: InputParams) -> Any:
        """TFDS's dataset when config.data.tfds_name names one, else imagenet_to_gcs's files."""
        data = self.config.data
        if data.tfds_name and not (mode is Mode.PREDICT and self.config.predict.input):
            split = "train" if mode is Mode.TRAIN else params.split or self.eval_splits[0]
            return resnet_input.TfdsSource(data, split, params, data.shuffle_buffer)
        files = imagenet_records.files_for(data, mode, self.config.predict.input)
        return resnet_input.TFRecordSource(files, params, data.cycle_length, data.shuffle_buffer)

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        source = self._source(mode, params)
        size = self.config.image_size
        if mode is Mode.TRAIN:
            return resnet_input.train_dataset(source, params, size, self._dtype())
        return resnet_input.eval_dataset(source, mode, params, size, self._dtype())

    def train_record_files(self) -> list[str] | None:
        """imagenet_to_gcs's records, one image each: a run counting in epochs counts them
        (on a local disk; a local ImageNet is too large to, and data.train_examples says it)."""
        if self.config.data.tfds_name:
            return None  # TFDS's record counts its train split
        return imagenet_records.files_for(self.config.data, Mode.TRAIN)

    def diagnose_data(self, mode: Mode) -> str | None:
        if self.config.data.tfds_name:
            return None  # TFDS wrote and checked its records: TensorFlow's error is shown
        files = imagenet_records.files_for(self.config.data, mode, self.config.predict.input)
        return imagenet_records.find_bad_record(files, mode, self.config.num_classes)

    # Network ---------------------------------------------------------------------------

    def build(self) -> keras.Model:
        config = self.config
        if len(config.blocks) != 4 or not all(b >= 1 for b in config.blocks):
            raise UsageError(
                f"config.blocks={tuple(config.blocks)} must be 4 numbers of blocks >= 1, one per "
                "group: (3, 4, 6, 3) is ResNet-50, (3, 4, 23, 3) ResNet-101"
            )
        size = config.image_size
        inputs = {resnet_input.FEATURE: keras.Input((size, size, 3), name=resnet_input.FEATURE)}
        mean, stddev = resnet_preprocessing.MEAN_RGB, resnet_preprocessing.STDDEV_RGB
        net = keras.layers.Rescaling(  # (pixel - mean) / stddev, per channel
            scale=[1 / s for s in stddev],
            offset=[-m / s for m, s in zip(mean, stddev, strict=True)],
            name="normalize",
        )(inputs[resnet_input.FEATURE])
        net = _conv(net, config.width, 7, 2, "stem_conv")
        net = _batch_norm(net, "stem_bn", relu=True)
        net = keras.layers.MaxPooling2D(3, 2, padding="same", name="stem_pool")(net)
        for group, blocks in enumerate(config.blocks):
            for block in range(blocks):
                net = _bottleneck(
                    net,
                    config.width * 2**group,
                    strides=2 if group and not block else 1,
                    projection=not block,
                    name=f"group{group + 1}_block{block + 1}",
                )
        net = keras.layers.GlobalAveragePooling2D(name="pool")(net)
        logits = keras.layers.Dense(
            config.num_classes,
            kernel_initializer=keras.initializers.RandomNormal(stddev=0.01),
            name="logits",
        )(net)
        return keras.Model(inputs, logits, name="resnet50")

    # Training and eval -----------------------------------------------------------------

    def loss(self, labels: tf.Tensor, outputs: tf.Tensor) -> tf.Tensor:
        """Softmax cross-entropy against labels smoothed by config.label_smoothing (TF1's
        tf.losses.softmax_cross_entropy: one-hot x (1 - s) + s / classes)."""
        smoothing = self.config.label_smoothing
        if not smoothing:
            return super().loss(labels, outputs)
        classes = self.config.num_classes
        targets = tf.one_hot(labels, classes) * (1.0 - smoothing) + smoothing / classes
        return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=outputs)

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {
            "top_1_accuracy": keras.metrics.SparseCategoricalAccuracy(),
            "top_5_accuracy": keras.metrics.SparseTopKCategoricalAccuracy(k=5),
        }

    # Serving ---------------------------------------------------------------------------

    def predict_spec(self, params: InputParams) -> Any:
        """The eval crops input_fn(PREDICT) yields, known without its data: an export of a
        published checkpoint needs no ImageNet."""
        size = self.config.image_size
        return {
            resnet_input.FEATURE: tf.TensorSpec(
                [None, size, size, 3], self._dtype(), name=resnet_input.FEATURE
            )
        }

    def serving_signatures(self, predict_spec: Any) -> dict[str, Any]:
        size = self.config.image_size
        return {
            "serving_default": {
                SERVING_BYTES: tf.TensorSpec([None], tf.string, name=SERVING_BYTES)
            },
            SERVING_IMAGES: {
                resnet_input.FEATURE: tf.TensorSpec(
                    [None, size, size, 3], tf.float32, name=resnet_input.FEATURE
                )
            },
        }

    def serving_features(self, inputs: Any) -> Any:
        """JPEG bytes: the eval crop of each, inside the SavedModel; images: as they are."""
        if SERVING_BYTES not in inputs:
            return inputs
        size = self.config.image_size
        images = tf.map_fn(
            lambda image_bytes: resnet_preprocessing.eval_image(image_bytes, size),
            inputs[SERVING_BYTES],
            fn_output_signature=tf.TensorSpec([size, size, 3], tf.float32),
        )
        return {resnet_input.FEATURE: images}


def _conv(net: Any, filters: int, kernel: int, strides: int, name: str) -> Any:
    """resnet_model.py's conv2d_fixed_padding: a strided convolution pads by the kernel
    alone ((kernel - 1) / 2 each side), whatever the input's size."""
    padding = "same"
    if strides > 1 and kernel > 1:
        pad = kernel - 1
        net = keras.layers.ZeroPadding2D(((pad // 2, pad - pad // 2),) * 2, name=f"{name}_pad")(net)
        padding = "valid"
    return keras.layers.Conv2D(
        filters,
        kernel,
        strides=strides,
        padding=padding,
        use_bias=False,
        kernel_initializer=keras.initializers.VarianceScaling(
            scale=1.0, mode="fan_in", distribution="truncated_normal"
        ),
        name=name,
    )(net)


def _batch_norm(net: Any, name: str, relu: bool, zero_scale: bool = False) -> Any:
    net = keras.layers.BatchNormalization(
        momentum=BATCH_NORM_MOMENTUM,
        epsilon=BATCH_NORM_EPSILON,
        gamma_initializer="zeros" if zero_scale else "ones",
        name=name,
    )(net)
    return keras.layers.ReLU(name=f"{name}_relu")(net) if relu else net


def _bottleneck(net: Any, filters: int, strides: int, projection: bool, name: str) -> Any:
    """1x1 -> 3x3 (strided) -> 1x1 (x4 filters), BatchNorm after each, the last one's scale
    at zero; a projection shortcut (1x1, strided) where the shape changes."""
    shortcut = net
    if projection:
        shortcut = _conv(net, 4 * filters, 1, strides, f"{name}_project")
        shortcut = _batch_norm(shortcut, f"{name}_project_bn", relu=False)
    net = _batch_norm(_conv(net, filters, 1, 1, f"{name}_conv1"), f"{name}_bn1", relu=True)
    net = _batch_norm(_conv(net, filters, 3, strides, f"{name}_conv2"), f"{name}_bn2", relu=True)
    net = _conv(net, 4 * filters, 1, 1, f"{name}_conv3")
    net = _batch_norm(net, f"{name}_bn3", relu=False, zero_scale=True)
    net = keras.layers.Add(name=f"{name}_add")([net, shortcut])
    return keras.layers.ReLU(name=f"{name}_out")(net)
