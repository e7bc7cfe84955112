"""The training loop: `--iterations` steps per tf.function call, checkpoints on loop boundaries."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Iterator

import keras
import tensorflow as tf
from absl import logging

from tpurun import checkpoints, inputs
from tpurun.cluster import Cluster
from tpurun.errors import Preempted, RunError
from tpurun.model import Mode, Model
from tpurun.run_config import RunConfig, aligned_to_loop


@contextlib.contextmanager
def sigterm_notice() -> Iterator[threading.Event]:
    """Turns SIGTERM (what a TPU VM gets before preemption) into an event the loop checks.

    The loop finishes its current host loop, saves a checkpoint at that step and
    exits with Preempted.exit_code, so a restart loses no step.
    """
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event  # signal handlers can only be installed from the main thread
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)


def build_model(model: Model) -> keras.Model:
    """Calls the model's build() (inside the caller's strategy scope) and checks the result."""
    keras_model = model.build()
    if not isinstance(keras_model, keras.Model) or not keras_model.built:
        raise RunError(
            f"{type(model).__name__}.build() must return a built keras.Model "
            "(e.g. a functional model starting from keras.Input)"
        )
    return keras_model


class Trainer:
    """Holds the model, optimizer and compiled host loop of one training run."""

    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.strategy = cluster.strategy
        self.model = model
        self.global_batch = run.train_batch_size
        with self.strategy.scope():
            self.keras_model = build_model(model)
            self.optimizer = model.optimizer()
            # Slot variables must exist before the first replicated step: created
            # lazily inside it, they break with 2+ replicas.
            self.optimizer.build(self.keras_model.trainable_variables)
        self.is_chief = cluster.is_chief
        self.scratch = None if cluster.is_chief else checkpoints.scratch_dir(run, cluster.task)
        self.manager = checkpoints.manager(run, self.keras_model, self.optimizer, self.scratch)
        self._loop = tf.function(self._host_loop)

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore(self) -> None:
        path = checkpoints.latest(self.run.model_dir)  # the chief's, on every worker
        if not path:
            return
        configured = self._constant_learning_rate()
        self.manager.checkpoint.restore(path).assert_existing_objects_matched()
        logging.info("Resuming from %s (step %d).", path, self.step)
        # A constant learning rate is a variable, so the checkpoint brought back the
        # old one; the config of this run decides, as the flags did for TPUEstimator.
        restored = self._constant_learning_rate()
        if configured is not None and restored != configured:
            self.optimizer.learning_rate = configured
            logging.info(
                "Learning rate %g from the config (the checkpoint had %g).", configured, restored
            )

    def _constant_learning_rate(self) -> float | None:
        """The optimizer's learning rate, or None when it follows a schedule."""
        schedule = keras.optimizers.schedules.LearningRateSchedule
        if isinstance(getattr(self.optimizer, "_learning_rate", None), schedule):
            return None
        return float(tf.convert_to_tensor(self.optimizer.learning_rate))

    def _replica_step(self, features, labels) -> tf.Tensor:
        with tf.GradientTape() as tape:
            outputs = self.keras_model(features, training=True)
            per_example = self.model.loss(labels, outputs)
            # Scaled by the global batch, so the all-reduced (summed) gradients equal
            # those of one replica on the whole batch.
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=self.global_batch)
            if self.keras_model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(self.keras_model.losses))
        variables = self.keras_model.trainable_variables
        gradients = tape.gradient(loss, variables)
        self.optimizer.apply_gradients(zip(gradients, variables, strict=True))
        return loss

    def _host_loop(self, iterator, num_steps: tf.Tensor) -> tf.Tensor:
        """Runs num_steps replicated steps in-graph; returns their mean loss."""
        total = tf.constant(0.0)
        for _ in tf.range(num_steps):
            per_replica_loss = self.strategy.run(self._replica_step, args=next(iterator))
            total += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        return total / tf.cast(num_steps, tf.float32)

    def save(self, step: int) -> None:
        path = self.manager.save(checkpoint_number=step)
        if self.scratch is None:
            logging.info("Saved checkpoint %s.", path)
        else:
            tf.io.gfile.rmtree(self.scratch)

    def train(self) -> None:
        run = self.run
        self.restore()
        step, last = self.step, run.train_steps
        if step >= last:
            logging.info("Already at step %d of --train_steps=%d: nothing to train.", step, last)
            return
        iterations = run.iterations
        save_every = aligned_to_loop(run.config.train.save_checkpoints_steps, iterations)
        if save_every != run.config.train.save_checkpoints_steps:
            logging.info(
                "save_checkpoints_steps=%d rounded up to %d, a multiple of --iterations=%d.",
                run.config.train.save_checkpoints_steps,
                save_every,
                iterations,
            )
        dataset = inputs.distribute(
            self.strategy, self.model, Mode.TRAIN, self.global_batch, run.seed
        )
        iterator = iter(dataset)
        logging.info("Training from step %d to %d, %d steps per loop.", step, last, iterations)
        # TensorBoard events (the chief's only): written from Python between host
        # loops, so tags carry no while/ prefix and cost nothing inside the loop.
        writer = tf.summary.create_file_writer(run.model_dir) if self.is_chief else None
        with sigterm_notice() as preempted:
            self._run_loops(iterator, step, last, save_every, preempted, writer)
        if writer is not None:
            writer.close()

    def _run_loops(
        self,
        iterator,
        step: int,
        last: int,
        save_every: int,
        preempted: threading.Event,
        writer: tf.summary.SummaryWriter | None,
    ) -> None:
        iterations = self.run.iterations
        while step < last:
            num_steps = min(iterations, last - step)
            start = time.perf_counter()
            loss = float(self._loop(iterator, tf.constant(num_steps)))
            elapsed = time.perf_counter() - start
            step += num_steps
            logging.info(
                "step %d/%d  loss %.4f  %.1f steps/sec  %.0f examples/sec",
                step,
                last,
                loss,
                num_steps / elapsed,
                num_steps * self.global_batch / elapsed,
            )
            if writer is not None:
                with writer.as_default(step=step):
                    tf.summary.scalar("loss", loss)
                    tf.summary.scalar(
                        "learning_rate", float(tf.convert_to_tensor(self.optimizer.learning_rate))
                    )
                    tf.summary.scalar("global_step/sec", num_steps / elapsed)
                    tf.summary.scalar("examples/sec", num_steps * self.global_batch / elapsed)
            if not math.isfinite(loss):
                # Nothing after the last good checkpoint is saved: it stays the latest.
                raise RunError(
                    f"the loss became {loss} between steps {step - num_steps + 1} and {step}; "
                    f"the latest checkpoint is still "
                    f"{checkpoints.latest(self.run.model_dir) or 'none (nothing was saved)'}; "
                    "lower config.optimizer.learning_rate or look for NaN/Inf in the data"
                )
            if step == last or (save_every and step % save_every == 0) or preempted.is_set():
                self.save(step)
            if preempted.is_set():
                raise Preempted(
                    f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to "
                    f"continue from it (exit code {Preempted.exit_code} means: preempted, restart me)"
                )
