"""keras-io's "DCGAN to generate face images", ported to a train_step of tpurun's with the
manual's porting table (docs/own-step.md): the same networks, losses, label noise and
the fake and real images concatenated into one batch for the discriminator.

The images are stand-ins for CelebA's (no download): a soft coloured disc per image, in
memory, kept on the device. Not part of tpurun: scripts/bench_loop_choice.py copies it out
of the repository and runs it as a user would (`--config=<dir>/dcgan_config.py`).
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from tpurun.model import Mode, Model, TrainArrays, register


def discs(count: int, size: int, seed: int) -> np.ndarray:
    """uint8 [count, size, size, 3]: a disc of a random colour, place and radius each."""
    rng = np.random.default_rng(seed)
    grid = np.stack(np.meshgrid(np.arange(size), np.arange(size), indexing="ij"), -1)
    centres = rng.uniform(0.3 * size, 0.7 * size, (count, 1, 1, 2))
    radius = rng.uniform(0.15 * size, 0.3 * size, (count, 1, 1))
    inside = np.linalg.norm(grid[None] - centres, axis=-1) < radius
    colours = rng.uniform(0, 1, (count, 1, 1, 3))
    return (255 * inside[..., None] * colours).astype(np.uint8)


def discriminator(size: int) -> keras.Model:
    """keras-io's: three strided 4x4 convolutions, dropout, a sigmoid."""
    return keras.Sequential(
        [
            keras.Input(shape=(size, size, 3)),
            layers.Conv2D(64, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Conv2D(128, kernel_size=4, strides=2, padding="same"),
            layers.LeakyReLU(negative_slope=0.2),
            layers.Flatten(),
            layers.Dropout(0.2),
            layers.Dense(1, activation="sigmoid"),
        ],
        name="discriminator",
    )


def generator(latent_dim: int, size: int, filters: tuple[int, ...]) -> keras.Model:
    """keras-io's: a dense 8x8x128 map, three strided transposed convolutions, a sigmoid."""
    start = size // 8
    stack = [
        keras.Input(shape=(latent_dim,)),
        layers.Dense(start * start * 128),
        layers.Reshape((start, start, 128)),
    ]
    for count in filters:
        stack.append(layers.Conv2DTranspose(count, kernel_size=4, strides=2, padding="same"))
        stack.append(layers.LeakyReLU(negative_slope=0.2))
    stack.append(layers.Conv2D(3, kernel_size=5, padding="same", activation="sigmoid"))
    return keras.Sequential(stack, name="generator")


@register("dcgan")
class Dcgan(Model):
    serving_model = "generator"

    def train_arrays(self):
        images = discs(self.config.examples, self.config.image_size, seed=0)
        return TrainArrays((images, np.zeros(len(images), np.int32)))  # no labels

    def input_fn(self, mode, params):  # EVAL and PREDICT: noise vectors
        count = self.config.generate.count if mode is Mode.PREDICT else 256
        noise = np.random.default_rng(1).normal(size=(count, self.config.latent_dim))
        features = noise.astype(np.float32)
        if mode is Mode.EVAL:
            dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros(count, np.int32)))
        else:
            dataset = tf.data.Dataset.from_tensor_slices(features)
        dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
        return dataset.batch(params.batch_size)

    def build(self):
        config = self.config
        return {
            "generator": generator(config.latent_dim, config.image_size, config.generator_filters),
            "discriminator": discriminator(config.image_size),
        }

    def train_step(self, step, features, labels):
        generator, discriminator = step.models["generator"], step.models["discriminator"]
        bce = keras.losses.BinaryCrossentropy(reduction=None)  # per example, for step.mean
        real = tf.cast(features, tf.float32) / 255.0
        batch = step.batch_size
        # keras-io: the generated and the real images in one batch, labels 1 and 0 with
        # noise. Called without training=, as keras-io does: its Dropout stays off.
        noise = step.random.normal([self.config.latent_dim], "noise")
        combined = tf.concat([generator(noise), real], axis=0)
        targets = tf.concat([tf.ones((batch, 1)), tf.zeros((batch, 1))], axis=0)
        jitter = [step.random.uniform([1], "fake_label"), step.random.uniform([1], "real_label")]
        targets += 0.05 * tf.concat(jitter, axis=0)
        with tf.GradientTape() as tape:
            per_row = bce(targets, discriminator(combined))
            fake_loss, real_loss = tf.split(per_row, 2)  # back to one value per example
            d_loss = step.mean((fake_loss + real_loss) / 2)  # keras-io's mean of 2B rows
        step.minimize("discriminator", tape, d_loss)
        noise = step.random.normal([self.config.latent_dim], "noise")
        with tf.GradientTape() as tape:
            g_loss = step.mean(bce(tf.zeros((batch, 1)), discriminator(generator(noise))))
        step.minimize("generator", tape, g_loss)
        return {"d_loss": d_loss, "g_loss": g_loss}

    def eval_step(self, models, features, labels):
        """loss: the generator's, -log D(G(z)) on fixed noise."""
        images = models["generator"](features, training=False)
        scores = models["discriminator"](images, training=False)[:, 0]
        return labels, images, -tf.math.log(scores + 1e-7)

    def predictions(self, outputs):
        return {"images": tf.cast(tf.round(outputs * 255.0), tf.uint8)}
