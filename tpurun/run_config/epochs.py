"""Epochs counted in steps: the pure arithmetic of a run that trains for N epochs.

A run counts its training examples when it starts (`tpurun.storage.train_config.
resolve_length`: the model's train_arrays, or config.data.train_examples); from then
on an epoch is a number of examples, and a step takes the global batch x
accumulate_steps of them.
"""

from __future__ import annotations

import dataclasses
import fractions
import math

import ml_collections

from tpurun.run_config import RunConfig


@dataclasses.dataclass(frozen=True)
class EpochCount:
    """Epochs in steps: `examples` per epoch, `per_step` examples per optimizer step (the
    global batch x accumulate_steps), `total` the epochs the run trains (0: it counts in
    steps). After s steps the input has given s x per_step examples: the epoch of step s
    is s x per_step / examples, as the input stream's own position (tpurun.inputs.example_order)."""

    examples: int
    per_step: int
    total: float = 0.0

    def at(self, step: int) -> float:
        """The epochs done after `step` steps."""
        return step * self.per_step / self.examples

    def end_after(self, step: int) -> int:
        """The step that completes the next epoch after `step`: the first step s > `step`
        with s x per_step >= k x examples for the next whole k."""
        finished = step * self.per_step // self.examples
        return -(-(finished + 1) * self.examples // self.per_step)

    def crossed(self, step: int, num_steps: int) -> bool:
        """Whether the loop of `num_steps` that ended at `step` finished an epoch."""
        return (
            step * self.per_step // self.examples
            > (step - num_steps) * self.per_step // self.examples
        )

    def text(self, step: int) -> str:
        """ "epoch 1.60/2" (counting in epochs) or "epoch 1.60" (in steps)."""
        done = f"epoch {self.at(step):.2f}"
        return f"{done}/{self.total:g}" if self.total else done


def steps_for_epochs(epochs: float, examples: int, per_step: int) -> int:
    """ceil(epochs x examples / per_step), in exact arithmetic: 0.3 epochs of 100 examples at
    10 per step is 3 steps, not the 4 that float rounding (3.0000000000000004) would give."""
    exact = fractions.Fraction(repr(float(epochs))) * examples / per_step
    return math.ceil(exact)


def epoch_count(run: RunConfig) -> EpochCount | None:
    """How `run`'s steps count epochs, once its training examples are counted."""
    if not run.train_examples:
        return None
    train = run.config.train
    return EpochCount(run.train_examples, train.batch_size * train.accumulate_steps, train.epochs)


def resolve_epochs(config: ml_collections.ConfigDict, examples: int, per_step: int) -> None:
    """Turns the optimizer recipes' epochs into steps, in place, for `examples` per epoch and
    `per_step` examples per optimizer step, as --train_epochs becomes train.steps.

    warmup_epochs E -> warmup_steps = the first step by which E epochs are done. A piecewise
    boundary is the last step at the rate before it, so boundary_epochs E -> boundaries =
    that first step minus one: the new rate starts once E epochs are done (resnet_main.py's
    `current_epoch < start_epoch`). The epoch keys are cleared: the run's record holds the
    steps they made, and a resumed run, which makes the same, compares equal.
    """
    for recipe in [config.optimizer, *(config.get("optimizers") or {}).values()]:
        if recipe.get("warmup_epochs"):
            recipe.warmup_steps = steps_for_epochs(recipe.warmup_epochs, examples, per_step)
            recipe.warmup_epochs = 0.0
        if recipe.get("boundary_epochs"):
            recipe.boundaries = tuple(
                steps_for_epochs(epochs, examples, per_step) - 1
                for epochs in recipe.boundary_epochs
            )
            recipe.boundary_epochs = ()
