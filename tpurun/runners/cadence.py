"""When the training loop saves, evaluates and stops: the Controller's decisions as values.

No TensorFlow and no clock: `Cadence` is the run's config resolved once (how long a
host loop is, every how many steps or seconds a checkpoint is saved, when an
evaluation is due), and `after_loop` turns what happened in a loop (where it ended,
whether the workers agreed on a time-based save or a SIGTERM) into an `AfterLoop`:
what the Controller does next. Tested as plain arithmetic (tests/test_cadence.py).
"""

from __future__ import annotations

import dataclasses

from absl import logging

from tpurun.errors import RunError
from tpurun.run_config import EPOCH, RunConfig, aligned_to_loop
from tpurun.run_config.epochs import EpochCount, epoch_count


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


@dataclasses.dataclass(frozen=True)
class AfterLoop:
    """What the Controller does after a host loop, in this order."""

    save: bool  # save a checkpoint at the loop's step
    # Wait until that save is whole before going on (the last one, the one before a
    # stop and one to evaluate); any other is written while the next loops train.
    wait_for_save: bool
    eval_due: bool  # evaluate the saved checkpoint
    stop: bool  # stop after the save: preempted (SIGTERM) before the last step


@dataclasses.dataclass(frozen=True)
class Cadence:
    """The run's loop length and save/eval cadences, in steps and seconds (0: off)."""

    last_step: int  # the step training ends at (--train_steps)
    iterations: int  # steps per host loop
    save_every: int = 0  # steps, a whole number of host loops
    save_secs: float = 0
    eval_every: int = 0  # steps, a whole number of host loops
    # With --eval_every=epoch: host loops end where epochs end, and each ends with an eval.
    epochs: EpochCount | None = None

    @classmethod
    def of(cls, run: RunConfig, evaluating: bool) -> Cadence:
        """`run`'s cadence; `evaluating`: the Controller has an evaluator to call."""
        every_epoch = evaluating and run.config.train.eval_every == EPOCH
        epochs = epoch_count(run) if every_epoch else None
        if every_epoch and epochs is None:
            # tpurun.commands.running.resolve_length counts them before the Controller starts
            raise RunError("--eval_every=epoch: the training examples were not counted")
        return cls(
            last_step=run.train_steps,
            iterations=run.iterations,
            save_every=loop_cadence(run, "save_checkpoints_steps"),
            save_secs=run.config.train.save_checkpoints_secs,
            eval_every=loop_cadence(run, "eval_every") if evaluating and not every_epoch else 0,
            epochs=epochs,
        )

    def loop_length(self, step: int) -> int:
        """The steps of the host loop that starts at `step`."""
        num_steps = min(self.iterations, self.last_step - step)
        if self.epochs is not None:
            num_steps = min(num_steps, self.epochs.end_after(step) - step)
        return num_steps

    def time_save_due(self, seconds_since_save: float) -> bool:
        """Whether this worker wants a checkpoint by time (the workers then agree on it)."""
        return bool(self.save_secs) and seconds_since_save >= self.save_secs

    def after_loop(self, step: int, num_steps: int, time_due: bool, stop: bool) -> AfterLoop:
        """What follows the loop of `num_steps` that ended at `step`; `time_due`, `stop`: a
        time-based save and a SIGTERM, as the workers agreed."""
        last = step == self.last_step
        if self.epochs is not None:
            eval_due = self.epochs.crossed(step, num_steps) or last
        else:
            eval_due = bool(self.eval_every) and (crossed(step, num_steps, self.eval_every) or last)
        save = last or eval_due or crossed(step, num_steps, self.save_every) or time_due or stop
        return AfterLoop(
            save=save,
            wait_for_save=last or stop or eval_due,
            eval_due=eval_due,
            stop=stop and not last,
        )
