"""A run's job on the tf.data service, and where a resumed run's input restarts (no TensorFlow).

A job is the stream the service makes for the readers that name it. Each run attempt
names a job of its own (`job_name`: the model_dir and a token drawn for the attempt,
the same on every host of a cluster): a restarted trainer never joins the job of
the attempt before, which would hand it what the workers had made ahead for that
one and skip it (tensorflow/tensorflow#63079: 4,500 steps of data skipped). The old
job is left to the dispatcher, which drops it once no reader is left.

A service's stream cannot be checkpointed (its iterator cannot be saved), so a
resumed run's input starts over (`plan`): at the start of the epoch it resumes in,
where the model's input_fn starts where it is told (`input_fn_seeks`) and an epoch's
examples are known; else at the start of its stream. Not the stream an uninterrupted
run would read: the examples from the epoch's start to the resumed step are seen
twice, what the workers had made for the last attempt is never seen, and the workers'
order is not one run's order anyway. A user who needs an exact resume drops
config.data.service: the input is then made here, and continues exactly.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any

from tpurun.layout import served_input
from tpurun.run_config.keys.service_keys import Service

# What each processing mode guarantees, as the start line says it.
GUARANTEES = {
    "distributed_epoch": "the workers share each epoch: every element once per epoch",
    "parallel_epochs": "every worker makes the whole stream",
}
EXACT_RESUME = "drop config.data.service for an exact resume"


def job_name(model_dir: str, token: int) -> str:
    """`tpurun-<8 hex of model_dir>-<token>`: the attempt's job, the same on every host."""
    return f"tpurun-{zlib.crc32(model_dir.encode()):08x}-{token:012x}"


@dataclasses.dataclass(frozen=True)
class Resume:
    """Where a run's input starts under the service."""

    step: int  # the global step the run starts at (0: a fresh run)
    start_batch: int  # what input_fn is told (InputParams.start_batch), in its batches
    epoch: int | None = None  # the epoch (from 0) whose start the input restarts at
    epoch_step: float | None = None  # the step at which that epoch began
    why_not_epoch: str = ""  # a resumed run restarting at its stream's start: why

    def where(self) -> str:
        """`the start of epoch 4 (step 1186.5)` or `the start of its stream`."""
        if self.epoch is None:
            return "the start of its stream"
        return f"the start of epoch {self.epoch + 1} (step {self.epoch_step:g})"

    def record(self, service: Service, job: str) -> dict[str, Any]:
        """The run record's `data_service` field (`tpurun.layout.served_input`): how this
        run's input was made and resumed."""
        starts = None
        if self.epoch is not None:
            assert self.epoch_step is not None  # planned with its epoch
            starts = served_input.InputStart(self.epoch + 1, self.epoch_step)
        served = served_input.ServedInput(
            service.target,
            service.processing_mode,
            job,
            self.step,
            input_starts_at=starts,
            exact_resume=False,
            why_not_epoch=self.why_not_epoch or None,
        )
        return served_input.as_json(served)

    def line(self, service: Service, job: str) -> str:
        """What the run says at its start, in the log."""
        head = (
            f"Training input through the tf.data service at {service.target} "
            f"({service.processing_mode}: {GUARANTEES[service.processing_mode]}), job {job}"
        )
        if not self.step:
            return (
                f"{head}. A resumed run restarts its input at the start of the epoch it resumes "
                f"in, not where it stopped (the service's stream cannot be checkpointed): "
                f"{EXACT_RESUME}."
            )
        why = f" ({self.why_not_epoch})" if self.why_not_epoch else ""
        return (
            f"{head}: resumed at step {self.step}, its input restarts at {self.where()}{why}, "
            "not where the last run stopped: examples already trained on are seen again and "
            f"what the workers had made for the last run is never seen; {EXACT_RESUME}."
        )


def plan(
    step: int,
    examples_per_epoch: int | None,
    examples_per_step: int,
    replica_batch: int,
    seeks: bool,
    model_name: str,
) -> Resume:
    """Where the input of a run starting at `step` restarts: the start of its epoch, in
    `replica_batch`es (one input pipeline's batches of one replica), when input_fn seeks
    and an epoch's examples are known; else the start of its stream."""
    if not step:
        return Resume(0, 0)
    if not seeks:
        return Resume(
            step,
            0,
            why_not_epoch=f"{model_name}.input_fn does not start where it is told: a model whose "
            "input_fn starts at params.start_batch sets input_fn_seeks = True",
        )
    if not examples_per_epoch:
        return Resume(
            step, 0, why_not_epoch="an epoch's examples are unknown: set config.data.train_examples"
        )
    epoch = step * examples_per_step // examples_per_epoch
    first_example = epoch * examples_per_epoch
    # The first whole batch of the epoch: at most a batch's examples of it are not read.
    start_batch = -(-first_example // replica_batch)
    return Resume(step, start_batch, epoch, first_example / examples_per_step)
