"""The outer training loop: host loops, cadences, worker agreement, the NaN guard, preemption.

Orbit's split: the Trainer (`tpurun.train`) owns the compiled inner loop and
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

from tpurun import checkpoints, errors, train_config
from tpurun.actions.base import Action, LoopStats
from tpurun.actions.save import SaveCheckpoint, Saved
from tpurun.background import Writer
from tpurun.cluster import Cluster, replica_sum
from tpurun.errors import Preempted, RunError
from tpurun.run_config import EPOCH, RunConfig, aligned_to_loop
from tpurun.train import Trainer
from tpurun.warm_start import warm_start


@contextlib.contextmanager
def sigterm_notice() -> Iterator[threading.Event]:
    """Turns SIGTERM (what a TPU VM gets before preemption) into an event the loop checks.

    The loop finishes its current host loop, saves a checkpoint at that step and
    exits with Preempted.exit_code, so a restart loses no step.
    """
    event = threading.Event()
    if errors.sigterm_seen():  # one came at start-up and its exit was swallowed: stop now
        event.set()
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


def loop_cadence(run: RunConfig, name: str) -> int:
    """A config step cadence rounded up to whole host loops, with a notice if it moved."""
    configured = run.config.train[name]
    aligned = aligned_to_loop(configured, run.iterations)
    if aligned != configured:
        logging.info(
            "%s=%d rounded up to %d, a multiple of --iterations=%d.",
            name,
            configured,
            aligned,
            run.iterations,
        )
    return aligned


class Controller:
    """Trains `trainer` from model_dir's newest checkpoint to --train_steps.

    `evaluate(path)`, when given, runs on every worker after each checkpoint saved
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
        evaluate: Callable[[str], None] | None = None,
        writer: Writer | None = None,
    ):
        self.run = run
        self.writer = writer
        self.cluster = cluster
        self.trainer = trainer
        self.actions = list(actions)
        self.evaluate = evaluate
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
        if self.cluster.is_chief:
            train_config.write(run)
        save = SaveCheckpoint(run, trainer.checkpoint, self.cluster, self.writer)
        trainer.start_input()
        epochs = train_config.epoch_count(run)
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
        run = self.run
        save_every = loop_cadence(run, "save_checkpoints_steps")
        # --eval_every=epoch: host loops end where epochs end, and each ends with an eval.
        every_epoch = self.evaluate is not None and run.config.train.eval_every == EPOCH
        epochs = train_config.epoch_count(run) if every_epoch else None
        if every_epoch and epochs is None:  # commands.count_examples counts them first
            raise RunError("--eval_every=epoch: the training examples were not counted")
        eval_every = loop_cadence(run, "eval_every") if self.evaluate and not every_epoch else 0
        save_secs = run.config.train.save_checkpoints_secs
        last_save = time.monotonic()
        while step < last:
            num_steps = min(run.iterations, last - step)
            if epochs is not None:
                num_steps = min(num_steps, epochs.end_after(step) - step)
            for action in self.actions:
                action.before_loop(step, num_steps)
            stats = self.trainer.train(num_steps)
            step = stats.step
            self._saved(save, save.poll())  # a background save that failed ends the run here
            for action in self.actions:
                action.after_loop(stats)
            self._stop_unless_finite(stats, save)
            if epochs is not None:
                evaluate = epochs.crossed(step, num_steps) or step == last
            else:
                evaluate = bool(eval_every) and (
                    crossed(step, num_steps, eval_every) or step == last
                )
            time_due, stop = self._agree(
                bool(save_secs) and time.monotonic() - last_save >= save_secs,
                preempted.is_set(),
            )
            due = step == last or evaluate or crossed(step, num_steps, save_every) or time_due
            if due or stop:
                path = save(step)
                last_save = time.monotonic()
                # The last checkpoint, the one before a stop and one to evaluate are whole
                # before the run goes on; any other is written while it trains.
                final = step == last or stop or evaluate
                self._saved(save, save.wait() if final else save.poll())
                if evaluate and self.evaluate is not None:
                    began = time.monotonic()
                    self.evaluate(path)
                    for action in self.actions:
                        action.evaluated(step, time.monotonic() - began)
            if stop and step < last:
                raise Preempted(
                    f"SIGTERM: saved a checkpoint at step {step}; rerun the same command to "
                    f"continue from it (exit code {Preempted.exit_code} means: preempted, restart me)"
                )

    def _saved(self, save: SaveCheckpoint, saved: list[Saved]) -> None:
        for each in saved:
            for action in self.actions:
                action.after_save(each.step, each.path)
                action.save_waited(each.step, each.waited)
        for action in self.actions:
            action.saves(save.state)

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
