"""The outer training loop: host loops, cadences, worker agreement, the NaN guard, preemption.

Orbit's split: the Trainer (`tpurun.runners.train`) owns the compiled inner loop and
answers `train(num_steps)`; the Controller decides how many steps each call runs,
when to save and evaluate, and when to stop, and hands explicit values (the
step, the loop's `LoopStats`, the checkpoint path) to its actions (`tpurun.actions`):
progress lines, TensorBoard, profiler, hang watchdog, eval + best.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import tensorflow as tf
from absl import logging

from tpurun import errors
from tpurun.actions.base import Action, LoopStats, Saved
from tpurun.actions.save import SaveCheckpoint
from tpurun.cluster import Cluster, replica_sum
from tpurun.errors import Preempted, RunError
from tpurun.foreign.warm_start import warm_start
from tpurun.run_config import RunConfig
from tpurun.run_config.epochs import epoch_count
from tpurun.runners.cadence import Cadence
from tpurun.runners.host_loops import LoopTimes
from tpurun.runners.train import Trainer
from tpurun.storage import checkpoints, train_config
from tpurun.storage.background import Writer


@contextlib.contextmanager
def sigterm_notice() -> Iterator[threading.Event]:
    """Turns SIGTERM (what a TPU VM gets before preemption) into an event the loop checks.

    The loop finishes its current host loop, saves a checkpoint at that step and
    exits with Preempted.exit_code, so a restart loses no step.
    """
    if errors.sigterm_seen():
        # One came at start-up and C code swallowed its StoppedBySigterm (TensorFlow's
        # nest.flatten, then going on with its work half done: it once dropped an element
        # of what it flattened). Nothing is restored, trained or saved from a state built
        # that way: the run ends here as one stopped at start-up does.
        raise errors.StoppedBySigterm()
    event = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield event  # signal handlers can only be installed from the main thread
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: event.set())
    try:
        yield event
    finally:
        signal.signal(signal.SIGTERM, previous)


class Controller:
    """Trains `trainer` from model_dir's newest checkpoint to --train_steps.

    `evaluate_checkpoint(path)`, when given, runs on every worker after each checkpoint saved
    at an `--eval_every` step and at the last one; `actions` see every host loop
    and save. With a `writer`, saves are written in the background (`SaveCheckpoint`);
    the last one, the one before a stop and an evaluated one are waited for.
    """

    def __init__(
        self,
        run: RunConfig,
        cluster: Cluster,
        trainer: Trainer,
        *,
        actions: Sequence[Action] = (),
        evaluate_checkpoint: Callable[[str], None] | None = None,
        writer: Writer | None = None,
    ):
        self.run = run
        self.writer = writer
        self.cluster = cluster
        self.trainer = trainer
        self.actions = list(actions)
        self.evaluate_checkpoint = evaluate_checkpoint
        self._sum_over_replicas = tf.function(lambda values: replica_sum(cluster.strategy, values))

    def train(self) -> None:
        # SIGTERM is caught from the start: one during the restore or the input's
        # start-up (minutes on a TPU) still ends as "preempted, restart me".
        with sigterm_notice() as preempted:
            self._train(preempted)

    def _train(self, preempted: threading.Event) -> None:
        run, trainer = self.run, self.trainer
        self._restore()
        step, last = trainer.step, run.train_steps
        if step >= last:
            epochs = run.config.train.epochs
            length = (
                f"--train_epochs={epochs:g} ({last} steps)" if epochs else f"--train_steps={last}"
            )
            logging.info("Already at step %d of %s: nothing to train.", step, length)
            return
        # A resumed run runs the device-data loop its checkpoints were trained with.
        trainer.start_input(lambda: _recorded_loop_times(run) if step else None)
        if self.cluster.is_chief:
            times = trainer.loop_times
            train_config.write(run, times.as_record() if times else None)
        save = SaveCheckpoint(run, trainer.checkpoint, self.cluster, self.writer)
        epochs = epoch_count(run)
        logging.info(
            "Training from step %d to %d%s, %d steps per loop.",
            step,
            last,
            f" (epoch {epochs.at(step):.2f} to {epochs.at(last):.2f})" if epochs else "",
            run.iterations,
        )
        try:
            for action in self.actions:
                action.start(step, last)
            self._run_loops(save, step, last, preempted)
        finally:
            save.close()  # a save still being written ends whole, before the lease goes
            for action in self.actions:
                action.close()

    def _restore(self) -> None:
        """Continues from model_dir's newest intact checkpoint, or warm-starts, or starts fresh."""
        run, trainer = self.run, self.trainer
        path = checkpoints.restore_newest_intact(
            trainer.fresh_checkpoint, run, self.cluster.is_chief
        )
        if path is None:
            if run.config.train.warm_start_from:
                warm_start(trainer.model, trainer.keras_model, run)
        else:
            trainer.restored()
            logging.info("Resuming from %s (step %d).", path, trainer.step)
        self._check_workers_agree_on_step()

    def _check_workers_agree_on_step(self) -> None:
        """Fails when workers restored different steps (one read a checkpoint the other could not).

        They would train diverging weights, and the first to finish would leave the
        others blocked in an all-reduce.
        """
        if self.cluster.num_workers == 1:
            return
        step = self.trainer.step
        total = int(self._sum_over_replicas(tf.constant([step]))[0])
        if total != step * self.cluster.num_replicas:
            raise RunError(
                f"the workers restored different steps from {self.run.model_dir} (this one: "
                f"{step}); a checkpoint could not be read by all of them: rerun all workers"
            )

    def _run_loops(
        self, save: SaveCheckpoint, step: int, last: int, preempted: threading.Event
    ) -> None:
        cadence = Cadence.of(self.run, evaluating=self.evaluate_checkpoint is not None)
        last_save = time.monotonic()
        while step < last:
            num_steps = cadence.loop_length(step)
            for action in self.actions:
                action.before_loop(step, num_steps)
            stats = self.trainer.train(num_steps)
            step = stats.step
            self._saved(save, save.poll())  # a background save that failed ends the run here
            for action in self.actions:
                action.after_loop(stats)
            self._stop_unless_finite(stats, save)
            time_due, stop = self._agree(
                cadence.time_save_due(time.monotonic() - last_save), preempted.is_set()
            )
            then = cadence.after_loop(step, num_steps, time_due, stop)
            if then.save:
                path = save(step)
                last_save = time.monotonic()
                self._saved(save, save.wait() if then.wait_for_save else save.poll())
                if then.eval_due and self.evaluate_checkpoint is not None:
                    began = time.monotonic()
                    self.evaluate_checkpoint(path)
                    for action in self.actions:
                        action.evaluated(step, time.monotonic() - began)
            if then.stop:
                raise Preempted(
                    f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to "
                    f"continue from it (exit code {Preempted.exit_code} means: preempted, restart me)"
                )

    def _saved(self, save: SaveCheckpoint, saved: list[Saved]) -> None:
        for each in saved:
            for action in self.actions:
                action.saved(each)
        for action in self.actions:
            action.save_state(save.state)

    def _stop_unless_finite(self, stats: LoopStats, save: SaveCheckpoint) -> None:
        """Nothing after the last good checkpoint is saved: it stays the latest (a save
        still being written is finished first)."""
        bad = {name: v for name, v in stats.named_scalars().items() if not math.isfinite(v)}
        if not bad and stats.weights_finite:
            return
        self._saved(save, save.wait())
        if not bad:
            what = "a weight became NaN or Inf"
        elif list(bad) == ["loss"]:
            what = f"the loss became {bad['loss']}"
        else:
            what = " and ".join(f"{name} became {value}" for name, value in bad.items())
        latest = checkpoints.latest(self.run.model_dir) or "none (nothing was saved)"
        named = self.run.config.get("optimizers")
        rate = (
            "config.optimizers.<name>.learning_rate" if named else "config.optimizer.learning_rate"
        )
        raise RunError(
            f"{what} between steps {stats.step - stats.num_steps + 1} and {stats.step}; "
            f"the latest checkpoint is still {latest}; lower {rate} or look for NaN/Inf in the data"
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


def _recorded_loop_times(run: RunConfig) -> LoopTimes | None:
    recorded = train_config.recorded_loop_times(run)
    return LoopTimes.from_record(recorded) if recorded is not None else None
