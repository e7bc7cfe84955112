"""The training loop: `--iterations` steps per tf.function call, checkpoints on loop boundaries."""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator

import keras
import tensorflow as tf
from absl import logging

from tpurun import checkpoints, inputs, monitors
from tpurun.cluster import Cluster, replica_sum
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


def crossed(step: int, num_steps: int, every: int) -> bool:
    """Whether the loop that ended at `step` passed a multiple of `every` (0: never).

    Not `step % every == 0`: a run resumed at 1050 (or with other --iterations)
    ends its loops at 1150, 1250, ... and would never meet a multiple of 500.
    """
    return every > 0 and step // every > (step - num_steps) // every


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
    """Holds the model, optimizer and compiled host loop of one training run.

    `evaluate_checkpoint(path)`, when given, is called on every worker after each
    checkpoint saved at an `--eval_every` step (and the final one).
    """

    def __init__(
        self,
        run: RunConfig,
        cluster: Cluster,
        model: Model,
        evaluate_checkpoint: Callable[[str], None] | None = None,
    ):
        self.run = run
        self.cluster = cluster
        self.strategy = cluster.strategy
        self.model = model
        self.evaluate_checkpoint = evaluate_checkpoint
        self.global_batch = run.train_batch_size
        with self.strategy.scope():
            self.keras_model = build_model(model)
            self.optimizer = model.optimizer()
            # Slot variables must exist before the first replicated step: created
            # lazily inside it, they break with 2+ replicas.
            self.optimizer.build(self.keras_model.trainable_variables)
        self.is_chief = cluster.is_chief
        self.scratch = None if cluster.is_chief else checkpoints.scratch_dir(run, cluster.task)
        self.checkpoint = tf.train.Checkpoint(
            model=self.keras_model,
            optimizer=self.optimizer,
            # Every model variable by name too: Keras's random-number states (Dropout's
            # seed_generator_state) are not reachable through `model`, and a resume
            # that restarted them would draw the first steps' dropout masks again.
            model_variables=list(self.keras_model.variables),
        )
        self._loop = tf.function(self._host_loop)
        self._sum_over_replicas = tf.function(lambda values: replica_sum(self.strategy, values))

    @property
    def step(self) -> int:
        return int(self.optimizer.iterations.numpy())

    def restore(self) -> None:
        """Continues from model_dir's newest intact checkpoint, or warm-starts, or starts fresh."""
        run = self.run
        configured = self._constant_learning_rate()
        path = checkpoints.restore_newest_intact(self.checkpoint, run, self.is_chief)
        if path is None:
            if run.config.train.warm_start_from:
                checkpoints.warm_start(self.model, self.keras_model, run)
            return
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

    def _host_loop(self, iterator, num_steps: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Runs num_steps replicated steps in-graph.

        Returns their mean loss, the seconds spent waiting for batches (the
        timestamps around `next(iterator)` are stateful ops, so automatic control
        dependencies keep them before and after the fetch), and whether every
        weight is still finite: the last step's update can be NaN while its loss,
        computed before it, was not, and such weights must never be saved.
        """
        total = tf.constant(0.0)
        waited = tf.constant(0.0, tf.float64)
        for _ in tf.range(num_steps):
            before = tf.timestamp()
            batch = next(iterator)
            with tf.control_dependencies(tf.nest.flatten(batch, expand_composites=True)):
                waited += tf.timestamp() - before
            per_replica_loss = self.strategy.run(self._replica_step, args=batch)
            total += self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica_loss, axis=None)
        finite = tf.reduce_all(
            [tf.reduce_all(tf.math.is_finite(v)) for v in self.keras_model.trainable_variables]
        )
        return total / tf.cast(num_steps, tf.float32), waited, finite

    def save(self, manager: tf.train.CheckpointManager, step: int) -> str:
        path = manager.save(checkpoint_number=step)
        if self.scratch is None:
            logging.info("Saved checkpoint %s.", path)
            return path
        tf.io.gfile.rmtree(self.scratch)
        return checkpoints.path_of(self.run.model_dir, step)  # the chief's copy

    def train(self) -> None:
        # SIGTERM is caught from the start: one during the restore or the input's
        # start-up (minutes on a TPU) still ends as "preempted, restart me".
        with sigterm_notice() as preempted:
            self._train(preempted)

    def _train(self, preempted: threading.Event) -> None:
        run = self.run
        started = time.perf_counter()
        self.restore()
        self._check_workers_agree_on_step()
        restore_seconds = time.perf_counter() - started
        step, last = self.step, run.train_steps
        if step >= last:
            logging.info("Already at step %d of --train_steps=%d: nothing to train.", step, last)
            return
        if self.is_chief:
            checkpoints.write_train_config(run)
        manager = checkpoints.manager(run, self.checkpoint, self.scratch)
        dataset = inputs.distribute(
            self.strategy, self.model, Mode.TRAIN, self.global_batch, run.seed, start_step=step
        )
        iterator = iter(dataset)
        logging.info("Training from step %d to %d, %d steps per loop.", step, last, run.iterations)
        watchers = monitors.for_training(run, self)
        if step > 0:
            watchers.append(monitors.ResumeCost(started, restore_seconds))
        try:
            for watcher in watchers:
                watcher.start(step, last)
            self._run_loops(iterator, manager, step, last, preempted, watchers)
        finally:
            for watcher in watchers:
                watcher.close()

    def _check_workers_agree_on_step(self) -> None:
        """Fails when workers restored different steps (one read a checkpoint the other could not).

        They would train diverging weights, and the first to finish would leave the
        others blocked in an all-reduce.
        """
        if self.cluster.num_workers == 1:
            return
        step = self.step
        total = int(self._sum_over_replicas(tf.constant([step]))[0])
        if total != step * self.strategy.num_replicas_in_sync:
            raise RunError(
                f"the workers restored different steps from {self.run.model_dir} (this one: "
                f"{step}); a checkpoint could not be read by all of them: rerun all workers"
            )

    def _cadence(self, name: str) -> int:
        """A config step cadence rounded up to whole host loops, with a notice if it moved."""
        configured = self.run.config.train[name]
        aligned = aligned_to_loop(configured, self.run.iterations)
        if aligned != configured:
            logging.info(
                "%s=%d rounded up to %d, a multiple of --iterations=%d.",
                name,
                configured,
                aligned,
                self.run.iterations,
            )
        return aligned

    def _run_loops(
        self,
        iterator,
        manager: tf.train.CheckpointManager,
        step: int,
        last: int,
        preempted: threading.Event,
        watchers: list[monitors.Monitor],
    ) -> None:
        iterations = self.run.iterations
        save_every = self._cadence("save_checkpoints_steps")
        eval_every = self._cadence("eval_every") if self.evaluate_checkpoint else 0
        save_secs = self.run.config.train.save_checkpoints_secs
        last_save = time.monotonic()
        while step < last:
            num_steps = min(iterations, last - step)
            for watcher in watchers:
                watcher.before_loop(step, num_steps)
            start = time.perf_counter()
            loss_tensor, waited, finite = self._loop(iterator, tf.constant(num_steps))
            loss = float(loss_tensor)
            elapsed = time.perf_counter() - start
            step += num_steps
            stats = monitors.LoopStats(
                step=step,
                num_steps=num_steps,
                last_step=last,
                loss=loss,
                seconds=elapsed,
                input_seconds=float(waited),
                global_batch=self.global_batch,
                learning_rate=float(tf.convert_to_tensor(self.optimizer.learning_rate)),
            )
            for watcher in watchers:
                watcher.after_loop(stats)
            if not (math.isfinite(loss) and bool(finite)):
                # Nothing after the last good checkpoint is saved: it stays the latest.
                what = (
                    f"the loss became {loss}"
                    if not math.isfinite(loss)
                    else "a weight became NaN or Inf"
                )
                raise RunError(
                    f"{what} between steps {step - num_steps + 1} and {step}; "
                    f"the latest checkpoint is still "
                    f"{checkpoints.latest(self.run.model_dir) or 'none (nothing was saved)'}; "
                    "lower config.optimizer.learning_rate or look for NaN/Inf in the data"
                )
            evaluate = bool(eval_every) and (crossed(step, num_steps, eval_every) or step == last)
            time_due, stop = self._agree(
                bool(save_secs) and time.monotonic() - last_save >= save_secs,
                preempted.is_set(),
            )
            due = step == last or evaluate or crossed(step, num_steps, save_every) or time_due
            if due or stop:
                path = self.save(manager, step)
                last_save = time.monotonic()
                for watcher in watchers:
                    watcher.after_save(step, path)
                if evaluate and self.evaluate_checkpoint is not None:
                    self.evaluate_checkpoint(path)
            if stop and step < last:
                raise Preempted(
                    f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to "
                    f"continue from it (exit code {Preempted.exit_code} means: preempted, restart me)"
                )

    def _agree(self, save_now: bool, stop_now: bool) -> tuple[bool, bool]:
        """Whether any worker wants a time-based save, or got SIGTERM, after this loop.

        Alone, a worker decides by itself. Workers of a MultiWorkerMirroredStrategy
        decide with their own clocks and signals, but must save the same step and
        stop together (one stopping alone leaves the others blocked in their next
        all-reduce), so they agree through one small all-reduce per host loop.
        (TF's PreemptionCheckpointHandler does this through the coordination
        service, but it turns itself off on GCE CPU and TPU VMs.)
        """
        if self.cluster.num_workers == 1:
            return save_now, stop_now
        # Summed over replicas: nonzero when any worker wants it (ReduceOp has no MAX).
        agreed = self._sum_over_replicas(tf.constant([int(save_now), int(stop_now)]))
        return bool(agreed[0] > 0), bool(agreed[1] > 0)
