"""tensorflow/tpu's resnet_main.py ResNet, as TF1 wrote and ran it, for the tests: never tpurun.

resnet_model.py made its variables with tf.layers, which names a layer by a graph-wide
counter of its kind (`conv2d_7`, `batch_normalization_7`) in the order the layers are
made: the stem, then per block the projection shortcut (first blocks) before the
block's three convolutions, then `dense`. TensorFlow 2.21 has no tf.compat.v1.layers
without tf-keras, so here the same names are made by hand (tf.compat.v1.get_variable),
in that order, counted here independently of configs/resnet50.py's map, and the
network is resnet_model.py's `resnet_v1` (bottlenecks, channels_last) in tf.compat.v1
ops: conv2d_fixed_padding (fixed padding before a strided convolution, 'SAME' else),
fused batch norm in inference mode with epsilon 1e-5, a 3x3/2 'SAME' max pool, the
spatial mean, dense and softmax, after resnet_main's mean/stddev normalisation.

`write_model_dir` saves it as resnet_main.py's TPUEstimator did (model.ckpt-<step> with
its Momentum slots and global_step, a `checkpoint` state file) and returns the
probabilities its graph computes for the images.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tensorflow as tf

MEAN_RGB = [0.485 * 255, 0.456 * 255, 0.406 * 255]
STDDEV_RGB = [0.229 * 255, 0.224 * 255, 0.225 * 255]
EPSILON = 1e-5


class _Layers:
    """tf.layers' counters and a random draw for each variable made by name."""

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self.count = {"conv2d": 0, "batch_normalization": 0}
        self.trainable: list[tf.Variable] = []
        self.values: list[tuple[tf.Variable, np.ndarray]] = []

    def _name(self, kind: str) -> str:
        index = self.count[kind]
        self.count[kind] += 1
        return kind if index == 0 else f"{kind}_{index}"

    def _variable(self, name: str, value: np.ndarray, trainable: bool = True) -> tf.Variable:
        """A variable made by its name, its value loaded after the initializers ran (not a
        constant in the graph: that would copy every weight into the .meta file)."""
        variable = tf.compat.v1.get_variable(
            name, value.shape, initializer=tf.zeros_initializer(), trainable=trainable
        )
        self.values.append((variable, value.astype(np.float32)))
        if trainable:
            self.trainable.append(variable)
        return variable

    def conv(self, inputs: tf.Tensor, filters: int, kernel: int, strides: int) -> tf.Tensor:
        """resnet_model.py's conv2d_fixed_padding."""
        channels = int(inputs.shape[-1])
        scale = np.sqrt(2.0 / (kernel * kernel * channels))
        value = self.rng.normal(0.0, scale, (kernel, kernel, channels, filters))
        weights = self._variable(f"{self._name('conv2d')}/kernel", value)
        if strides > 1:
            begin = (kernel - 1) // 2
            end = kernel - 1 - begin
            inputs = tf.pad(inputs, [[0, 0], [begin, end], [begin, end], [0, 0]])
        padding = "SAME" if strides == 1 else "VALID"
        return tf.nn.conv2d(inputs, weights, [1, strides, strides, 1], padding)

    def batch_norm(self, inputs: tf.Tensor, relu: bool, last: bool = False) -> tf.Tensor:
        """resnet_model.py's batch_norm_relu in inference mode (its moving statistics).

        Random statistics, not the initial ones: a block's last scale kept small (as
        init_zero starts it) so that fifty layers of random weights stay in range."""
        name, channels = self._name("batch_normalization"), int(inputs.shape[-1])
        low, high = (0.1, 0.3) if last else (0.6, 1.2)
        gamma = self._variable(f"{name}/gamma", self.rng.uniform(low, high, channels))
        beta = self._variable(f"{name}/beta", self.rng.normal(0.0, 0.1, channels))
        mean = self._variable(
            f"{name}/moving_mean", self.rng.normal(0.0, 0.2, channels), trainable=False
        )
        variance = self._variable(
            f"{name}/moving_variance", self.rng.uniform(0.5, 2.0, channels), trainable=False
        )
        outputs, _, _ = tf.compat.v1.nn.fused_batch_norm(
            inputs, gamma, beta, mean, variance, epsilon=EPSILON, is_training=False
        )
        return tf.nn.relu(outputs) if relu else outputs

    def dense(self, inputs: tf.Tensor, units: int) -> tf.Tensor:
        channels = int(inputs.shape[-1])
        kernel = self._variable("dense/kernel", self.rng.normal(0.0, 0.2, (channels, units)))
        bias = self._variable("dense/bias", self.rng.normal(0.0, 0.5, units))
        return tf.matmul(inputs, kernel) + bias


def _bottleneck(layers: _Layers, inputs, filters: int, strides: int, projection: bool):
    shortcut = inputs
    if projection:  # made first: it takes the block's first counters
        shortcut = layers.conv(inputs, 4 * filters, 1, strides)
        shortcut = layers.batch_norm(shortcut, relu=False)
    net = layers.batch_norm(layers.conv(inputs, filters, 1, 1), relu=True)
    net = layers.batch_norm(layers.conv(net, filters, 3, strides), relu=True)
    net = layers.batch_norm(layers.conv(net, 4 * filters, 1, 1), relu=False, last=True)
    return tf.nn.relu(net + shortcut)


def _network(layers: _Layers, images, blocks, width: int, classes: int):
    """resnet_main's model_fn in PREDICT mode: the normalisation, resnet_v1, softmax."""
    net = (images - tf.constant(MEAN_RGB, shape=[1, 1, 3])) / tf.constant(
        STDDEV_RGB, shape=[1, 1, 3]
    )
    net = layers.batch_norm(layers.conv(net, width, 7, 2), relu=True)
    net = tf.nn.max_pool2d(net, 3, 2, "SAME")
    for group, count in enumerate(blocks):
        for block in range(count):
            strides = 2 if group and not block else 1
            net = _bottleneck(layers, net, width * 2**group, strides, projection=not block)
    net = tf.reduce_mean(net, axis=[1, 2])
    return tf.nn.softmax(layers.dense(net, classes))


def write_model_dir(
    model_dir: Path,
    images: np.ndarray,
    *,
    blocks=(3, 4, 6, 3),
    width: int = 64,
    classes: int = 1000,
    step: int = 112590,
    seed: int = 0,
) -> np.ndarray:
    """A resnet_main.py model_dir holding model.ckpt-<step> (random weights, Momentum slots,
    global_step); returns the probabilities of its TF1 graph for `images` (float32
    [n, size, size, 3] in [0, 255])."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        layers = _Layers(np.random.default_rng(seed))
        inputs = tf.compat.v1.placeholder(tf.float32, [None, *images.shape[1:]])
        probabilities = _network(layers, inputs, blocks, width, classes)
        for variable in layers.trainable:  # MomentumOptimizer's slots, made by name too
            name = variable.op.name + "/Momentum"
            tf.compat.v1.get_variable(name, variable.shape, initializer=tf.zeros_initializer())
        step_variable = tf.compat.v1.train.get_or_create_global_step()
        # Every initializer in one run, each weight's initial value fed its draw: a run per
        # variable would prune and plan this graph hundreds of times.
        feeds = {v.initializer.inputs[1]: value for v, value in layers.values}
        feeds[step_variable.initializer.inputs[1]] = np.int64(step)
        session.run(tf.compat.v1.global_variables_initializer(), feeds)
        tf.compat.v1.train.Saver().save(session, str(model_dir / "model.ckpt"), global_step=step)
        return session.run(probabilities, {inputs: images})
