"""A user's WGAN-GP on the "8 Gaussians" toy set (Gulrajani et al., 2017), written from the
manual alone: a train_step of its own, 5 critic updates per generator update, the gradient
penalty; the training points are in-memory arrays, kept on the device.

Not part of tpurun: scripts/bench_loop_choice.py copies it out of the repository and runs
it as a user would (`--config=<dir>/gauss_config.py`).
"""

import keras
import numpy as np
import tensorflow as tf

from tpurun.model import Mode, Model, TrainArrays, register

NOISE = 2  # the generator's input size


def eight_gaussians(count: int, seed: int) -> np.ndarray:
    """`count` points near 8 centres on a circle of radius 2 (scaled by 1/1.414), float32."""
    rng = np.random.default_rng(seed)
    angles = np.arange(8) * np.pi / 4
    centres = 2 * np.stack([np.cos(angles), np.sin(angles)], 1)
    points = centres[rng.integers(0, 8, count)] + 0.02 * rng.normal(size=(count, 2))
    return (points / 1.414).astype(np.float32)


def mlp(name: str, inputs: str, units: int, size: int, outputs: int) -> keras.Model:
    """Three ReLU layers of `units`, then a linear output: the paper's toy networks."""
    x = keras.Input(shape=(size,), name=inputs)
    hidden = x
    for _ in range(3):
        hidden = keras.layers.Dense(units, activation="relu")(hidden)
    return keras.Model({inputs: x}, keras.layers.Dense(outputs)(hidden), name=name)


def gradient_penalty(critic, real, fake, alpha):
    """(||d critic(x) / dx|| - 1)^2 at x = real + alpha (fake - real), per example."""
    mixed = real + alpha * (fake - real)
    with tf.GradientTape() as tape:
        tape.watch(mixed)
        scores = critic({"xy": mixed}, training=True)
    slopes = tf.norm(tape.gradient(scores, mixed), axis=-1)
    return (slopes - 1.0) ** 2


@register("gauss_wgan")
class GaussWgan(Model):
    serving_model = "generator"

    def train_arrays(self):
        points = eight_gaussians(self.config.examples, seed=0)
        return TrainArrays(({"xy": points}, np.zeros(len(points), np.int32)))  # no labels

    def input_fn(self, mode, params):  # EVAL: other points with noise; PREDICT: noise
        count = self.config.generate.count if mode is Mode.PREDICT else 4096
        features = {"noise": np.random.default_rng(1).normal(size=(count, NOISE)).astype("f4")}
        if mode is Mode.EVAL:
            features["xy"] = eight_gaussians(count, seed=1)
            dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros(count, np.int32)))
        else:
            dataset = tf.data.Dataset.from_tensor_slices(features)
        dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
        return dataset.batch(params.batch_size)

    def build(self):
        units = self.config.hidden_units
        return {
            "generator": mlp("generator", "noise", units, NOISE, 2),
            "critic": mlp("critic", "xy", units, 2, 1),
        }

    def train_step(self, step, features, labels):
        generator, critic = step.models["generator"], step.models["critic"]

        def score(points):
            return critic({"xy": points}, training=True)[:, 0]

        real = features["xy"]
        for _ in range(self.config.critic_steps):
            noise = step.random.normal([NOISE], "noise")
            alpha = step.random.uniform([1], "alpha")
            with tf.GradientTape() as tape:
                fake = generator({"noise": noise}, training=True)
                penalty = gradient_penalty(critic, real, fake, alpha)
                d_loss = step.mean(score(fake) - score(real) + self.config.gp_weight * penalty)
            step.minimize("critic", tape, d_loss)
        noise = step.random.normal([NOISE], "noise")
        with tf.GradientTape() as tape:
            g_loss = step.mean(-score(generator({"noise": noise}, training=True)))
        step.minimize("generator", tape, g_loss)
        return {"d_loss": d_loss, "g_loss": g_loss, "gp": step.mean(penalty)}

    def eval_step(self, models, features, labels):
        """loss: the critic's score of real points minus that of generated ones."""
        fake = models["generator"]({"noise": features["noise"]}, training=False)
        real = models["critic"]({"xy": features["xy"]}, training=False)[:, 0]
        scores = models["critic"]({"xy": fake}, training=False)[:, 0]
        return labels, fake, real - scores

    def predictions(self, outputs):
        return {"xy": outputs}
