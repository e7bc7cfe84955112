"""WGAN-GP: keras-io's "WGAN-GP overriding Model.train_step", as a model that owns its step.

Gulrajani et al., "Improved Training of Wasserstein GANs" (2017), as the keras-io
example writes it for Fashion-MNIST, on the MNIST TFRecord schema of
`image_records` (MNIST, Fashion-MNIST, or `scripts/convert_mnist.py`'s output):

* critic: the 28x28 image zero-padded to 32x32, four 5x5 stride-2 convolutions
  with LeakyReLU(0.2) (the middle two followed by dropout 0.3), flatten, dropout
  0.2, one linear score. No batch normalization: the gradient penalty takes the
  gradient of each example's score alone;
* generator: noise -> dense 4x4xC (no bias) -> BatchNorm -> LeakyReLU, then three
  blocks of 2x upsampling -> 3x3 convolution (no bias) -> BatchNorm -> LeakyReLU
  (tanh after the last, of one channel), cropped from 32x32 to 28x28, in [-1, 1];
* each training step: `critic_steps` critic updates (Wasserstein loss plus
  `gp_weight` x the gradient penalty on random interpolates of real and generated
  images), then one generator update, each with its own Adam
  (`config.optimizers.critic` and `.generator`).

The paper's and keras-io's sizes, for a TPU (`configs/wgan_gp.py`'s `paper` variant;
`tpurun check --config=wgan_gp:paper --data_dir=... --target=v5e-8` sizes it): noise
128, critic filters (64, 128, 256, 512), generator 4x4x256 then (128, 64) filters,
batch 512 (keras-io; the paper: 64), 3 critic steps per generator step (keras-io;
the paper: 5), gradient penalty weight 10, Adam at 2e-4 with beta_1 0.5 and beta_2
0.9 (keras-io; the paper: 1e-4, 0.0, 0.9), 20 epochs of 60,000 images. The config's
defaults are a CPU-sized quarter of the filters.

What the launcher adds to keras-io's step, so 1 and 8 replicas train the same model
and a resume is exact: the losses are per-example and averaged over the global
batch (`step.mean`), the noise and interpolation weights are drawn per example from
the keyed source (`step.random`), the generator's BatchNorm is synchronized across
replicas, and the critic's dropout is `KeyedDropout`. keras-io draws the
interpolation weight from a normal distribution; the paper (and this) from U[0, 1].
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from tpurun.models import image_records

from tpurun import precision
from tpurun.model import InputParams, KeyedDropout, Mode, Model, Step, register
from tpurun.training_step import keyed_random

NOISE = "noise"  # the generator's input, in predict and the exported signature


def generator(config: Any) -> keras.Model:
    """Noise [batch, noise_dim] -> images [batch, 28, 28, 1] in [-1, 1]."""
    noise = keras.Input(shape=(config.noise_dim,), name=NOISE)
    base = config.generator_base
    net = keras.layers.Dense(4 * 4 * base, use_bias=False)(noise)
    # Synchronized: the statistics of the global batch, as one replica would compute
    # them (per-replica statistics would make 1 and 8 replicas different models).
    net = keras.layers.BatchNormalization(synchronized=True)(net)
    net = keras.layers.LeakyReLU(0.2)(net)
    net = keras.layers.Reshape((4, 4, base))(net)
    for filters in (*config.generator_filters, 1):
        net = keras.layers.UpSampling2D(2)(net)
        net = keras.layers.Conv2D(filters, 3, padding="same", use_bias=False)(net)
        net = keras.layers.BatchNormalization(synchronized=True)(net)
        net = (
            keras.layers.LeakyReLU(0.2)(net)
            if filters != 1
            else keras.layers.Activation("tanh")(net)
        )
    images = keras.layers.Cropping2D(2)(net)  # 32x32 -> 28x28
    return keras.Model({NOISE: noise}, images, name="generator")


class LeakyReLU(keras.layers.Layer):
    """max(x, slope x): Keras' LeakyReLU in two plain ops.

    The fused LeakyRelu op after a convolution trips TensorFlow's graph optimizer
    (grappler's remapper) on the gradient penalty's second-order gradient: it
    prints an error ("Mutation::Apply error ... LeakyReluGrad") on every compile,
    and skips that fusion anyway.
    """

    def __init__(self, slope: float, **kwargs: Any):
        super().__init__(**kwargs)
        self.slope = slope

    def call(self, inputs: tf.Tensor) -> tf.Tensor:
        return tf.maximum(inputs, self.slope * inputs)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "slope": self.slope}


def critic(config: Any) -> keras.Model:
    """Images [batch, 28, 28, 1] in [-1, 1] -> one score per image [batch, 1]."""
    images = keras.Input(shape=(image_records.HEIGHT, image_records.WIDTH, 1), name="images")
    net = keras.layers.ZeroPadding2D(2)(images)  # 28x28 -> 32x32: halves evenly to 2x2
    for index, filters in enumerate(config.critic_filters):
        net = keras.layers.Conv2D(filters, 5, strides=2, padding="same")(net)
        net = LeakyReLU(0.2)(net)
        if 0 < index < len(config.critic_filters) - 1:
            # Masks keyed on (seed, step, example, layer name): the same on every replica.
            net = KeyedDropout(config.dropout, name=f"critic_dropout_{index}")(net)
    net = keras.layers.Flatten()(net)
    net = KeyedDropout(config.final_dropout, name="critic_dropout_out")(net)
    score = keras.layers.Dense(1, name="score")(net)
    return keras.Model(images, score, name="critic")


def scores(model: keras.Model, images: tf.Tensor) -> tf.Tensor:
    """The critic's float32 score of each image, [batch]."""
    return precision.float32(model(images, training=True))[:, 0]


def gradient_penalty(
    critic_model: keras.Model, real: tf.Tensor, fake: tf.Tensor, alpha: tf.Tensor
) -> tf.Tensor:
    """(||d critic(x) / dx|| - 1)^2 at x = real + alpha (fake - real), per example [batch].

    The critic scores each example alone (no batch normalization), so the gradient
    of the summed scores holds each example's own gradient in its row.
    """
    interpolated = real + alpha * (fake - real)
    with tf.GradientTape() as tape:
        tape.watch(interpolated)
        score = scores(critic_model, interpolated)
    gradients = tape.gradient(score, interpolated)
    # + a tiny constant: the square root's gradient is infinite at 0.
    norm = tf.sqrt(tf.reduce_sum(tf.square(gradients), axis=[1, 2, 3]) + 1e-12)
    return tf.square(norm - 1.0)


def real_images(features: dict[str, tf.Tensor]) -> tf.Tensor:
    """The records' pixels ([-0.5, 0.5], `image_records.parse_batch`) as the critic's
    [batch, 28, 28, 1] in [-1, 1]."""
    return tf.reshape(features[image_records.FEATURE] * 2.0, [-1, 28, 28, 1])


@register("wgan_gp")
class WganGp(Model):
    """A generator and a critic, trained by a step of their own (see the module docstring)."""

    serving_model = "generator"
    eval_splits = ("test",)

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        if mode is Mode.PREDICT:
            return self._noise(params)
        data = self.config.data
        files = image_records.files_for(data, mode)
        batches = image_records.dataset(files, mode, params, data.shuffle_buffer, data.cycle_length)
        if mode is Mode.TRAIN:
            return batches

        # EVAL: each test image with noise of its own, keyed on its place in the files
        # (the same for every checkpoint evaluated).
        def with_noise(index: tf.Tensor, batch: Any) -> Any:
            features, labels = batch
            count = tf.shape(labels, out_type=tf.int64)[0]
            rows = index * params.batch_size + tf.range(count)
            features[NOISE] = keyed_random.normal(
                params.seed, 0, rows, [self.config.noise_dim], "eval", [params.input_pipeline_id]
            )
            return features, labels

        return batches.enumerate().map(with_noise)

    def _noise(self, params: InputParams) -> tf.data.Dataset:
        """config.generate.count noise vectors, each keyed on its index: `predict` writes
        one image per vector, the same ones whatever the batch or the replicas."""
        count = self.config.generate.count
        indices = tf.data.Dataset.range(count).shard(
            params.num_input_pipelines, params.input_pipeline_id
        )

        def noise(rows: tf.Tensor) -> dict[str, tf.Tensor]:
            return {
                NOISE: keyed_random.normal(
                    params.seed, 0, rows, [self.config.noise_dim], "generate"
                )
            }

        return indices.batch(params.batch_size).map(noise)

    def build(self) -> dict[str, keras.Model]:
        return {"generator": generator(self.config), "critic": critic(self.config)}

    def train_step(self, step: Step, features: Any, labels: Any) -> dict[str, tf.Tensor]:
        generator_model, critic_model = step.models["generator"], step.models["critic"]
        real = real_images(features)
        noise_dim = self.config.noise_dim
        for _ in range(self.config.critic_steps):
            noise = step.random.normal([noise_dim], "noise")
            alpha = step.random.uniform([1, 1, 1], "alpha")
            with tf.GradientTape() as tape:
                fake = precision.float32(generator_model({NOISE: noise}, training=True))
                penalty = gradient_penalty(critic_model, real, fake, alpha)
                wasserstein = scores(critic_model, fake) - scores(critic_model, real)
                d_loss = step.mean(wasserstein + self.config.gp_weight * penalty)
            step.minimize("critic", tape, d_loss)
        noise = step.random.normal([noise_dim], "noise")
        with tf.GradientTape() as tape:
            fake = precision.float32(generator_model({NOISE: noise}, training=True))
            g_loss = step.mean(-scores(critic_model, fake))
        step.minimize("generator", tape, g_loss)
        return {"d_loss": d_loss, "g_loss": g_loss, "gp": step.mean(penalty)}

    def eval_step(self, models: dict[str, keras.Model], features: Any, labels: Any) -> Any:
        """The critic's scores of the test images and of as many generated ones: `loss`
        is the critic's Wasserstein loss, E[critic(fake)] - E[critic(real)]."""
        critic_model = models["critic"]
        fake = precision.float32(models["generator"]({NOISE: features[NOISE]}, training=False))
        real = precision.float32(critic_model(real_images(features), training=False))[:, 0]
        generated = precision.float32(critic_model(fake, training=False))[:, 0]
        return real, generated, generated - real

    def metrics(self) -> dict[str, keras.metrics.Metric]:
        return {
            "critic_real": keras.metrics.MeanMetricWrapper(lambda real, fake: real),
            "critic_fake": keras.metrics.MeanMetricWrapper(lambda real, fake: fake),
        }

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        """The generated images as uint8 pixels [batch, 28, 28]."""
        pixels = tf.clip_by_value(tf.round((outputs[..., 0] + 1.0) * 127.5), 0.0, 255.0)
        return {"images": tf.cast(pixels, tf.uint8)}

    def train_record_files(self) -> list[str]:
        """One image per record: a run counting in epochs counts them."""
        return image_records.files_for(self.config.data, Mode.TRAIN)

    def diagnose_data(self, mode: Mode) -> str | None:
        if mode is Mode.PREDICT:
            return None  # predict reads no files: it generates from noise
        files = image_records.files_for(self.config.data, mode)
        return image_records.find_bad_record(files, mode)
