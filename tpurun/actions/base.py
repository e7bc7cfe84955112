"""The contract between the controller and its actions: `LoopStats`, `Saved`, `SaveState`
and the `Action` hooks."""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class LoopStats:
    """What one host loop did (the Trainer's `train(num_steps)` returns it)."""

    step: int  # global step after the loop
    num_steps: int  # steps the loop ran
    # Mean loss over the loop's steps: the scalar named "loss" (the supervised step's),
    # else the first the step returned.
    loss: float
    seconds: float  # wall time of the loop call
    input_seconds: float  # part of it spent waiting for the next batch
    global_batch: int  # examples per step: the global batch x accumulated micro-batches
    learning_rate: float
    weights_finite: bool = True  # every trainable weight finite after the loop
    # The batches were gathered on the device (tpurun.inputs.device_data): no input to wait for.
    device_input: bool = False
    # Every named scalar the step returned (a GAN's d_loss, g_loss, gp), each the mean
    # over the loop's steps, in the step's order; empty: `loss` alone (`named_scalars`).
    scalars: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # With config.optimizers, each optimizer's learning rate by name (`learning_rate` is
    # the first's); empty with config.optimizer.
    learning_rates: Mapping[str, float] = dataclasses.field(default_factory=dict)

    def named_scalars(self) -> dict[str, float]:
        """The scalars to show, check and write: `scalars`, or {"loss": loss}."""
        return dict(self.scalars) or {"loss": self.loss}

    def named_rates(self) -> dict[str, float]:
        """TensorBoard's learning-rate tags: `learning_rate`, or `learning_rate/<optimizer>`."""
        if not self.learning_rates:
            return {"learning_rate": self.learning_rate}
        return {f"learning_rate/{name}": rate for name, rate in self.learning_rates.items()}

    @property
    def steps_per_sec(self) -> float:
        return self.num_steps / self.seconds

    @property
    def examples_per_sec(self) -> float:
        return self.num_steps * self.global_batch / self.seconds

    @property
    def input_wait_share(self) -> float:
        """The part of the loop's time the steps waited for their batches, in [0, 1]."""
        return min(1.0, self.input_seconds / self.seconds) if self.seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class SaveState:
    """Where the checkpoint saves stand (what `SaveCheckpoint.state` says)."""

    in_flight: int | None = None  # the step of a save being written in the background
    last_seconds: float | None = None  # how long the newest complete save took, start to end
    # The save in flight's write: done, without an exception, once its checkpoint is whole
    # (for a watchdog whose loop is stuck before the controller hears of it).
    writing: concurrent.futures.Future[float] | None = None


@dataclasses.dataclass(frozen=True)
class Saved:
    """A checkpoint that became the newest: `seconds` from the save's start to then, of which
    the training loop waited `waited` (in the background: the copy to host memory, a
    previous save, and all of it when it was waited for)."""

    step: int
    path: str
    seconds: float
    waited: float
    background: bool = False


class Action:
    """Something the controller calls between host loops; every hook does nothing by default.

    Hooks get explicit values, never the Trainer: an action cannot reach into the
    loop, and the loop never knows which actions watch it. They run on the host
    between compiled loops, so they cost the device nothing.
    """

    def start(self, step: int, last_step: int) -> None:
        """Training is about to run from `step` to `last_step`."""

    def before_loop(self, step: int, num_steps: int) -> None:
        """A host loop of num_steps is about to start at `step`."""

    def after_loop(self, stats: LoopStats) -> None:
        """A host loop finished (before its checkpoint, if any, is saved)."""

    def saved(self, saved: Saved) -> None:
        """The checkpoint of `saved.step` is whole and the newest; the training loop waited
        `saved.waited` seconds for it (the copy to host memory, or all of it when it was
        waited for)."""

    def evaluated(self, step: int, seconds: float) -> None:
        """The checkpoint of `step` was evaluated in this process, in `seconds`."""

    def save_state(self, state: SaveState) -> None:
        """Where the checkpoint saves stand, after every host loop and save (one in flight
        in the background, how long the last took)."""

    def close(self) -> None:
        """Training ended (normally or not); release what was opened. Must not raise."""
