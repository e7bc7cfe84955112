"""Epochs counted in steps: how long a run trains when it says a length in epochs.

A run counts its training examples when it starts (`resolve_length`: the examples the
caller counted, the model's train_arrays or a dataset's record, else
config.data.train_examples; a resumed run those its model_dir recorded); from then on
an epoch is a number of examples, and a step takes `examples_per_step` of them. Nothing
here reads data or a model_dir: the caller counts, this decides.
"""

from __future__ import annotations

import dataclasses
import fractions
import math
from collections.abc import Mapping
from typing import Any

import ml_collections
from absl import logging

from tpurun.errors import UsageError
from tpurun.run_config import bounds
from tpurun.run_config.flag_table import EPOCH
from tpurun.run_config.run import RunConfig

# Where the training examples came from when the config declares them.
DECLARED = "config.data.train_examples"


@dataclasses.dataclass(frozen=True)
class Counted:
    """A number of training examples, and where it came from as a message names it
    ("counted in the model's train_arrays", "config.data.train_examples")."""

    examples: int
    where: str


def examples_per_step(train: Any) -> int:
    """The examples one optimizer step takes: the global batch x accumulate_steps (the
    micro-batches one update sees), of config.train."""
    return train.batch_size * train.accumulate_steps


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
    return EpochCount(run.train_examples, examples_per_step(train), train.epochs)


def resolve_epochs(
    config: ml_collections.ConfigDict, examples: int, per_step: int
) -> dict[str, float]:
    """Turns the optimizer recipes' epochs into steps, in place, for `examples` per epoch and
    `per_step` examples per optimizer step, as --train_epochs becomes train.steps; returns
    the warmup_epochs each recipe (by its key, "optimizer" or "optimizers.<name>") had.

    warmup_epochs E -> warmup_steps = the first step by which E epochs are done. A piecewise
    boundary is the last step at the rate before it, so boundary_epochs E -> boundaries =
    that first step minus one: the new rate starts once E epochs are done (resnet_main.py's
    `current_epoch < start_epoch`). The epoch keys are cleared: the run's record holds the
    steps they made, and a resumed run, which makes the same, compares equal.
    """
    warmups = {}
    for key, recipe in recipes(config).items():
        if recipe.get("warmup_epochs"):
            warmups[key] = recipe.warmup_epochs
            recipe.warmup_steps = steps_for_epochs(recipe.warmup_epochs, examples, per_step)
            recipe.warmup_epochs = 0.0
        if recipe.get("boundary_epochs"):
            recipe.boundaries = tuple(
                steps_for_epochs(epochs, examples, per_step) - 1
                for epochs in recipe.boundary_epochs
            )
            recipe.boundary_epochs = ()
    return warmups


def recipes(config: Any) -> dict[str, Any]:
    """The optimizer recipes of `config` by their keys: "optimizer", or each
    "optimizers.<name>" of a config that names several (config.optimizer is then unread)."""
    named = config.get("optimizers") or {}
    if named:
        return {f"optimizers.{name}": recipe for name, recipe in named.items()}
    return {"optimizer": config.optimizer}


def resolve_length(
    run: RunConfig, counted: Counted | None = None, recorded: Counted | None = None
) -> RunConfig:
    """The run with its training examples counted, and its train.steps when it counts in
    epochs (ceil(epochs x examples / examples per step)); `run` itself when it needs
    neither (see RunConfig.needs_examples).

    `counted`: the examples the caller counted in the training data (a model's in-memory
    train_arrays, a TFDS dataset's record of its train split), or None where only
    `config.data.train_examples` says them: TRAIN repeats forever, and the cardinality under
    its `.repeat()` counts batches, shards or windows as often as examples. `recorded`:
    the examples model_dir's record counted, for a run that resumes; a resumed run keeps
    counting those, so with the same batch it trains to the same step as the first one
    did, even if its data moved to files of another size. A batch changed on resume
    (--force_resume) counts its epochs in the new batch, as the input stream does (step s
    is at example s x global batch).
    """
    if not run.needs_examples:
        warn_of_warmups(run.config)
        return run
    config = run.config
    why = _why(config)
    examples = _training_examples(run, counted, recorded, why)
    per_step = examples_per_step(config.train)
    with_steps = ml_collections.ConfigDict(config.to_dict())
    warmups = resolve_epochs(with_steps, examples.examples, per_step)
    if not config.train.epochs:
        warn_of_warmups(with_steps, warmups, f"{examples.examples} examples / {per_step} per step")
        return _with(run, with_steps, examples)
    steps = steps_for_epochs(config.train.epochs, examples.examples, per_step)
    if steps > bounds.MAX_STEPS:
        raise UsageError(
            f"{why} of {examples.examples} examples at {per_step} per step is {steps} steps, "
            f"more than {bounds.MAX_STEPS}: fewer epochs"
        )
    logging.info(
        "%s: %d steps (ceil(%g epochs x %d training examples (%s) / %d examples per step)).",
        why,
        steps,
        config.train.epochs,
        examples.examples,
        examples.where,
        per_step,
    )
    with_steps.train.steps = steps
    warn_of_warmups(with_steps, warmups, f"{examples.examples} examples / {per_step} per step")
    try:  # validated again, now with its steps
        return _with(run, with_steps, examples)
    except UsageError as e:
        said_of = f"{examples.examples} examples ({examples.where}) at {per_step} per step"
        length = f"{steps} step" if steps == 1 else f"{steps} steps"
        raise UsageError(f"{e}; {why} of {said_of} is {length}") from None


def warn_of_warmups(
    config: Any, warmups: Mapping[str, float] | None = None, epoch: str = ""
) -> None:
    """One warning line per recipe whose warmup does not end before the run does.

    A smoke run shorter than its recipe's warmup is what a user runs first (the recipe's 5
    epochs of ResNet-50, BERT's 10,000 steps): it runs, its learning rate still rising when
    it ends, and the line says where the warmup came from and how to change it.
    `warmups`: the warmup_epochs that made a recipe's warmup_steps (`resolve_epochs`), at
    `epoch` ("1281167 examples / 1024 per step").
    """
    steps = config.train.steps
    for key, recipe in recipes(config).items():
        warmup = recipe.warmup_steps
        if not warmup or not steps or warmup < steps:
            continue
        epochs = (warmups or {}).get(key)
        if epochs:
            origin = f" (warmup_epochs={epochs:g} at {epoch})"
            fix = f"--config.{key}.warmup_epochs=E with fewer epochs"
        else:
            origin = ""
            fix = f"--config.{key}.warmup_steps=N with N < {steps}"
        logging.warning(
            "config.%s.warmup_steps=%d%s does not end before the run's train.steps=%d: the "
            "run ends inside its warmup, its learning rate short of the peak; to warm up "
            "within it, pass %s (0 = no warmup).",
            key,
            warmup,
            origin,
            steps,
            fix,
        )


def _with(run: RunConfig, config: ml_collections.ConfigDict, examples: Counted) -> RunConfig:
    frozen = ml_collections.FrozenConfigDict(config)
    return dataclasses.replace(run, config=frozen, train_examples=examples.examples)


def _why(config: Any) -> str:
    """What makes the run count its examples, as the user said it."""
    if config.train.epochs:
        return f"--train_epochs={config.train.epochs:g}"
    if config.train.eval_every == EPOCH:
        return "--eval_every=epoch"
    return "the optimizer's warmup_epochs or boundary_epochs"


def _training_examples(
    run: RunConfig, counted: Counted | None, recorded: Counted | None, why: str
) -> Counted:
    """The examples an epoch counts: the recorded ones, else the counted, else the declared."""
    declared = _declared(run.config)
    if counted is not None and counted.examples and declared and counted.examples != declared:
        logging.warning(
            "%s=%d, but the training data hold %d examples (%s): epochs count the %d.",
            DECLARED,
            declared,
            counted.examples,
            counted.where,
            counted.examples,
        )
    examples = counted if counted is not None and counted.examples else None
    if examples is None and declared:
        examples = Counted(declared, DECLARED)
    if recorded is not None and examples is not None and recorded.examples != examples.examples:
        logging.warning(
            "%s counted epochs of %d training examples, and the data now have %d: epochs "
            "keep counting %d, so a resumed run trains to the same step (a new --model_dir "
            "counts the new data).",
            recorded.where,
            recorded.examples,
            examples.examples,
            recorded.examples,
        )
    examples = recorded or examples
    if examples is None:
        raise UsageError(
            f"{why} needs the number of training examples, and {run.config_name}'s model has "
            "no train_arrays to count them in: add `config.data.train_examples = <N>` to the "
            "config (or pass --config.data.train_examples=N if it has the key), or count in "
            "--train_steps"
        )
    return examples


def _declared(config: Any) -> int:
    """config.data.train_examples (0: not declared), or a UsageError for a bad value."""
    declared = (config.get("data") or {}).get("train_examples") or 0
    if not isinstance(declared, int) or isinstance(declared, bool) or declared < 0:
        raise UsageError(
            f"{DECLARED}={declared!r} must be an integer >= 0: the number of "
            "training examples an epoch counts (0 = unknown)"
        )
    return declared
