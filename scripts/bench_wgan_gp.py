"""Benchmark of the WGAN-GP's training step: tpurun's own-step Trainer against keras-io's `fit`.

What it measures: seconds per training step (3 critic updates with a gradient
penalty, then 1 generator update) of the WGAN-GP of `configs/wgan_gp.py` at its
CPU-sized defaults (global batch 64), float32, 1 replica, on TFRecords read by the
model's own input_fn (random 28x28 images: speed does not depend on what they show):

* tpurun:    `Trainer.train(iterations)`, the real host loop running
             `WganGp.train_step` (`models/wgan_gp.py`);
* keras fit: keras-io's formulation, a `keras.Model` subclass overriding
             `train_step` (its own `tf.random.normal` draws, `reduce_mean` losses and
             two compiled Adams), built from the same generator and critic, fitted
             with `steps_per_execution` = iterations on the same dataset, compiled
             with Keras' defaults (`jit_compile="auto"`: the script prints what it
             resolved to).

Both run in one process (one Keras policy: float32), each warmed up (two host
calls; the first traces), then take turns, repeat by repeat, so a change in the
machine's load hits them alike: `--repeats` repeats of `--steps` steps each, the
median reported. fit is timed per call (`fit(steps_per_epoch=--steps)`), which
adds what fit does around its steps (milliseconds, against steps of ~0.2 s). The
figure to read is the ratio of one run.

Usage: `.venv/bin/python scripts/bench_wgan_gp.py [--steps=100 --repeats=3]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from bench_mnist import write_data  # scripts/bench_mnist.py: the same synthetic digits
from offline_env import run_json_worker  # scripts/offline_env.py

ITERATIONS = 50  # steps per host call (tpurun) and per execution (fit)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100, help="steps timed per repeat")
    parser.add_argument("--repeats", type=int, default=3, help="timed repeats; median reported")
    parser.add_argument("--worker", choices=("both",), help=argparse.SUPPRESS)
    parser.add_argument("--data_dir", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    if args.worker:
        print(json.dumps(run_worker(args)))
        return
    with tempfile.TemporaryDirectory() as data_dir:
        write_data(data_dir)
        found = run_json_worker(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker=both",
                f"--data_dir={data_dir}",
                f"--steps={args.steps}",
                f"--repeats={args.repeats}",
            ]
        )
    assert isinstance(found, dict)
    print(f"\nWGAN-GP (configs/wgan_gp.py), global batch {found['batch']}, float32, 1 replica")
    print(f"{'loop':<40} {'ms/step':>10}")
    print(f"{'tpurun (own train_step)':<40} {1000 * found['tpurun']:>10.1f}")
    label = f"keras-io fit (jit_compile={found['jit_compile']})"
    print(f"{label:<40} {1000 * found['fit']:>10.1f}")
    ratio = found["fit"] / found["tpurun"]
    print(f"\nkeras-io fit / tpurun step time = {ratio:.2f}  (> 1: tpurun faster)")


def run_worker(args: argparse.Namespace) -> dict:
    """Seconds per step of each loop (median of the repeats), and what fit compiled with."""
    import keras

    from tpurun import model as model_lib
    from tpurun.cluster import strategy
    from tpurun.run_config import RunConfig, config_files, merge_flags

    flags = {"data_dir": args.data_dir, "iterations": ITERATIONS, "precision": "float32"}
    config = merge_flags(config_files.load(config_files.resolve("wgan_gp")), flags)
    run = RunConfig("train", "wgan_gp", config, model_dir=tempfile.mkdtemp())
    cluster = strategy.build(run)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(0)
    loops = {"tpurun": tpurun_loop(run, cluster, model), "fit": fit_loop(run, model)}
    seconds, _ = time_loops(loops, args.steps, args.repeats)
    found: dict = {name: statistics.median(s) / args.steps for name, s in seconds.items()}
    fit = loops["fit"]
    return {**found, "batch": run.train_batch_size, "jit_compile": fit.jit_compile}  # type: ignore[attr-defined]


def time_loops(loops: dict, steps: int, repeats: int) -> tuple[dict, dict]:
    """Each `loop(steps)` timed `repeats` times, the loops taking turns, after two warm-up
    calls of ITERATIONS steps each (the first traces): the wall seconds and the process's
    CPU seconds (all its threads) of every call, by loop name."""
    for loop in loops.values():
        for _ in range(2):
            loop(ITERATIONS)
    seconds: dict[str, list[float]] = {name: [] for name in loops}
    cpu: dict[str, list[float]] = {name: [] for name in loops}
    for _ in range(repeats):
        for name, loop in loops.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            loop(steps)
            seconds[name].append(time.perf_counter() - start)
            cpu[name].append(time.process_time() - start_cpu)
    return seconds, cpu


def tpurun_loop(run, cluster, model):
    """`loop(steps)`: tpurun's Trainer, host loops of ITERATIONS steps."""
    from tpurun.runners.train import Trainer

    trainer = Trainer(run, cluster, model)

    def loop(steps: int) -> None:
        for _ in range(steps // ITERATIONS):
            trainer.train(ITERATIONS)

    return loop


def keras_io_wgan(generator, critic, config):
    """keras-io's WGAN: a keras.Model whose train_step trains the critic `critic_steps`
    times, then the generator, with per-replica random draws and `reduce_mean` losses."""
    import keras
    import tensorflow as tf

    class WGAN(keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.generator, self.critic = generator, critic

        def compile(self, d_optimizer, g_optimizer, **kwargs):
            super().compile(**kwargs)
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

        def penalty(self, batch, real, fake):
            alpha = tf.random.uniform([batch, 1, 1, 1])
            mixed = real + alpha * (fake - real)
            with tf.GradientTape() as tape:
                tape.watch(mixed)
                score = self.critic(mixed, training=True)
            norm = tf.sqrt(tf.reduce_sum(tf.square(tape.gradient(score, mixed)), axis=[1, 2, 3]))
            return tf.reduce_mean((norm - 1.0) ** 2)

        def train_step(self, real):
            batch = tf.shape(real)[0]
            for _ in range(config.critic_steps):
                noise = tf.random.normal([batch, config.noise_dim])
                with tf.GradientTape() as tape:
                    fake = self.generator({"noise": noise}, training=True)
                    cost = tf.reduce_mean(self.critic(fake, training=True)) - tf.reduce_mean(
                        self.critic(real, training=True)
                    )
                    d_loss = cost + config.gp_weight * self.penalty(batch, real, fake)
                weights = self.critic.trainable_variables
                self.d_optimizer.apply_gradients(
                    zip(tape.gradient(d_loss, weights), weights, strict=True)
                )
            noise = tf.random.normal([batch, config.noise_dim])
            with tf.GradientTape() as tape:
                fake = self.generator({"noise": noise}, training=True)
                g_loss = -tf.reduce_mean(self.critic(fake, training=True))
            weights = self.generator.trainable_variables
            self.g_optimizer.apply_gradients(
                zip(tape.gradient(g_loss, weights), weights, strict=True)
            )
            return {"d_loss": d_loss, "g_loss": g_loss}

    return WGAN()


def fit_loop(run, model):
    """`loop(steps)`: one `fit` call of `steps` steps of keras-io's WGAN on the same data."""
    import keras
    import tensorflow as tf
    from tpurun.models.wgan_gp import real_images

    from tpurun import inputs
    from tpurun.model import Mode

    built = model.build()
    wgan = keras_io_wgan(built["generator"], built["critic"], run.config)

    def adam():
        return keras.optimizers.Adam(learning_rate=2e-4, beta_1=0.5, beta_2=0.9)

    wgan.compile(d_optimizer=adam(), g_optimizer=adam(), steps_per_execution=ITERATIONS)
    params = inputs.input_params(tf.distribute.InputContext(), run.train_batch_size, run.seed)
    dataset = model.input_fn(Mode.TRAIN, params).map(lambda f, labels: real_images(f))

    def loop(steps: int) -> None:
        wgan.fit(dataset, steps_per_epoch=steps, epochs=1, verbose=0)

    loop.jit_compile = str(wgan.jit_compile)  # type: ignore[attr-defined]
    return loop


if __name__ == "__main__":
    main()
