"""--checkpoint=PATH: eval, predict and export of a checkpoint outside the model_dir.

A published checkpoint is served directly, as run_pretraining.py's `--do_eval
--init_checkpoint` did: a TF1 name-based one (a prefix, a TPUEstimator model_dir, an
Estimator SavedModel) through config.name_map, a TF2 SavedModel (tpurun's export) by
its variables' saved paths, or tpurun's own checkpoint (another run's ckpt-N or
model_dir) as a restore reads it, its moving averages too. The step reported is
the checkpoint's global_step (0 when it records none).

The source is only read: the run's record and outputs go to --model_dir, which may
be neither the checkpoint's directory nor inside it (nor may --export_dir or
--output be). Where they go:

    eval      model_dir/outside/<name>-<hash>/results-<split>.json (`results_path`): never
              eval/<split>/ (which marks model_dir's own steps evaluated) nor best/
    export    --export_dir, else model_dir/export/<timestamp>, as for model_dir's own
    predict   --output or stdout, as for model_dir's own

Every model variable must be filled (train.warm_start_vars is training's alone).
"""

from __future__ import annotations

import dataclasses
import hashlib

import keras
import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.errors import UsageError
from tpurun.foreign import report
from tpurun.foreign.fill import fill
from tpurun.foreign.plan import plan
from tpurun.foreign.sources import Kind, Source, open_source
from tpurun.foreign.warm_start import rules_for
from tpurun.layout import names
from tpurun.run_config import RunConfig
from tpurun.run_config.keys import trained_keys
from tpurun.storage import train_config

FLAG = "--checkpoint"
FIX = (
    "every variable of the model must be filled to serve it: fix config.name_map "
    "(`tpurun check --warm_start_from=PATH` lists the mapping)"
)


@dataclasses.dataclass
class Outside:
    """A checkpoint given by --checkpoint=PATH, opened; `step` is its global_step, known once
    it was read (0 when it records none)."""

    source: Source
    run: RunConfig
    step: int = 0

    @property
    def planned(self) -> bool:
        """Whether it is read through a plan (`fill`): a name-based checkpoint, through
        config.name_map, or a TF2 SavedModel; else it is tpurun's own, read as a restore
        reads model_dir's (its moving averages too)."""
        return self.source.kind is Kind.NAMES or self.source.saved_model

    def fill(self, models: dict[str, keras.Model], serving_model: str) -> None:
        """Fills the serving model through the plan (`planned`), saying the mapping first."""
        if len(models) > 1 and self.run.command == "eval":
            raise UsageError(
                f"{FLAG}={self.source.given} is not tpurun's checkpoint: it fills one Keras "
                f"model, and this model evaluates several ({', '.join(models)}); evaluate a "
                "tpurun checkpoint of it instead"
            )
        rules = rules_for(self.source, self.run, FLAG)
        planned = plan(self.source, models[serving_model], rules, None)
        if planned.problems:
            for line in report.lines(planned, "Reading", None):
                logging.info(line)
            raise report.refusal(planned, FLAG, FIX)
        self.step = _said(fill(planned))
        for line in report.lines(planned, "Reading", self.step):
            logging.info(line)


def step_in_model_dir(run: RunConfig) -> RunConfig:
    """`run` with --checkpoint=PATH of model_dir's own (its ckpt-N, or model_dir itself)
    read as model_dir's checkpoints are: as --checkpoint=N, or the latest."""
    if not isinstance(run.checkpoint, str):
        return run
    path = run.checkpoint.rstrip("/")
    if _same(path, run.model_dir):
        return dataclasses.replace(run, checkpoint=None)
    directory, _, name = path.rpartition("/")
    match = names.CHECKPOINT.fullmatch(name)
    if match and _same(directory, run.model_dir):
        return dataclasses.replace(run, checkpoint=int(match.group("step")))
    return run


def for_serving(run: RunConfig) -> tuple[RunConfig, tuple[trained_keys.Difference, ...]]:
    """`train_config.for_serving` for the checkpoint the command reads: model_dir's, or, for
    one from outside, the record beside it (another tpurun run's train_config.json). One
    without a record (a TF1 checkpoint) is read by the model of the config as given."""
    if not isinstance(run.checkpoint, str):
        return train_config.for_serving(run)
    directory = _directory(run.checkpoint)
    if not tf.io.gfile.exists(storage.join(directory, names.TRAIN_CONFIG)):
        return run, ()
    served, overridden = train_config.for_serving(dataclasses.replace(run, model_dir=directory))
    return dataclasses.replace(served, model_dir=run.model_dir), overridden


def check_paths(run: RunConfig) -> None:
    """Refuses, before anything is written, a --model_dir, --export_dir or --output in the
    directory of --checkpoint=PATH (or below it): tpurun writes nothing into a source."""
    directory = _directory(str(run.checkpoint))
    for flag, target in (
        ("--model_dir", run.model_dir),
        ("--export_dir", run.export_dir if run.command == "export" else None),
        ("--output", run.config.predict.output if run.command == "predict" else None),
    ):
        if target and (_same(target, directory) or storage.inside(directory, target)):
            raise UsageError(
                f"{flag}={target} is in {directory}, where {FLAG}={run.checkpoint} lives: "
                f"tpurun writes nothing into a checkpoint it reads; give a {flag} of its own"
            )


def open_outside(run: RunConfig) -> Outside:
    """Opens --checkpoint=PATH (its .index, its global_step), its map checked."""
    source = open_source(str(run.checkpoint), FLAG)
    rules_for(source, run, FLAG)
    logging.info("Reading %s: %s.", FLAG, source.described)
    outside = Outside(source, run)
    if not outside.planned:  # read by a restore: its step alone, now
        outside.step = _said(source.global_step())
    return outside


def _said(step: int | None) -> int:
    if step is None:
        logging.info("%s records no global_step: its results are reported as step 0.", FLAG)
    return step or 0


def results_path(model_dir: str, outside: Outside, split: str) -> str:
    """Where eval writes the results of an outside checkpoint: a directory per checkpoint,
    named after it and told apart from another of the same name by its path's hash."""
    name = storage.basename(
        outside.source.directory if outside.source.saved_model else outside.source.prefix
    )
    digest = hashlib.sha256(outside.source.prefix.encode()).hexdigest()[:8]
    return names.outside_results_path(model_dir, f"{name}-{digest}", split)


def _directory(path: str) -> str:
    """The directory a checkpoint path lives in: itself (a model_dir, a SavedModel), else the
    prefix's."""
    path = path.rstrip("/")
    return path if storage.isdir(path) else path.rpartition("/")[0] or "."


def _same(a: str, b: str) -> bool:
    """Whether paths `a` and `b` name one directory (each is inside the other's child)."""
    return storage.inside(a, b.rstrip("/") + "/x") and storage.inside(b, a.rstrip("/") + "/x")
