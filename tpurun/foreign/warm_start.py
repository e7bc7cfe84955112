"""--warm_start_from: a new run's weights taken from any checkpoint, said before it trains.

The source is told apart by itself (`sources`): tpurun's own checkpoints and any
object-based one are read through the model's structure, a TF1 name-based checkpoint,
a TPUEstimator model_dir or an Estimator SavedModel through config.name_map. Only the
model's weights are taken (no optimizer state, no step: training starts at step 0), and
only those whose path config.train.warm_start_vars matches (a regex searched in the
path; default all). What is taken and left is logged first; a selected variable that
finds nothing, or a value of another shape or dtype, ends the run in one line (exit 2)
before a tensor is read. `tpurun check --warm_start_from=PATH` prints the same, with
the mapping itself (`print_mapping`).
"""

from __future__ import annotations

import re
from typing import TextIO

import keras
from absl import logging

from tpurun.errors import UsageError
from tpurun.foreign import name_map, report
from tpurun.foreign.fill import fill
from tpurun.foreign.plan import Plan, plan
from tpurun.foreign.sources import Kind, Source, open_source
from tpurun.model import Model, build_keras_model
from tpurun.run_config import RunConfig

FLAG = "--warm_start_from"
FIX = (
    "leave such variables out with config.train.warm_start_vars (a regex searched in the "
    "model's variable paths: '^(?!logits/)' takes all but logits/), or fix config.name_map"
)


def warm_start(model: Model, keras_model: keras.Model, run: RunConfig) -> None:
    """Fills `keras_model` (the serving model of `model`) from train.warm_start_from."""
    del model  # the serving model is the one filled, as with a restore
    planned = _plan(keras_model, run)
    if planned.problems or not planned.taken:
        for line in report.lines(planned, "Warm start", None):
            logging.info(line)
        _refuse(planned, run)
    step = fill(planned)  # every value, and the step, read in one pass before any is said
    for line in report.lines(planned, "Warm start", step):
        logging.info(line)
    logging.info(
        "Warm-started %d of %d variables from %s; training starts at step 0.",
        len(planned.taken),
        planned.model_variables,
        planned.source.prefix,
    )


def print_mapping(model: Model, run: RunConfig, out: TextIO) -> None:
    """`tpurun check --warm_start_from=PATH`: the warm start's report with its mapping, a
    line per pair; raises the warm start's own error when it could not be done."""
    planned = _plan(build_keras_model(model), run)
    step = planned.source.global_step()
    print("\n".join(report.lines(planned, "Warm start", step, table=True)), file=out)
    _refuse(planned, run)


def rules_for(source: Source, run: RunConfig, flag: str) -> name_map.NameMap:
    """config.name_map, parsed; a map given on the command line for an object-based source
    (read by the model's structure, never by names) is refused rather than ignored."""
    rules = name_map.parse(run.config.get(name_map.CONFIG_KEY, ()))
    if source.kind is Kind.OBJECTS and rules and name_map.CONFIG_KEY in run.given_keys:
        raise UsageError(
            f"{flag}={source.given} is an object-based (TF2) checkpoint, read by the model's "
            f"structure, not by names: --config.{name_map.CONFIG_KEY} does not apply to it; "
            "drop it (a name map reads TF1 name-based checkpoints)"
        )
    return rules


def _plan(keras_model: keras.Model, run: RunConfig) -> Plan:
    source = open_source(run.config.train.warm_start_from, FLAG)
    rules = rules_for(source, run, FLAG)
    text = run.config.train.warm_start_vars
    try:
        selected = re.compile(text)
    except re.error as e:
        raise UsageError(f"config.train.warm_start_vars={text!r} is not a regex: {e}") from None
    if not any(selected.search(v.path) for v in keras_model.variables):
        raise UsageError(
            f"config.train.warm_start_vars={text!r} matches none of the model's variables "
            f"({', '.join(v.path for v in keras_model.variables[:6])}, ...)"
        )
    return plan(source, keras_model, rules, selected)


def _refuse(planned: Plan, run: RunConfig) -> None:
    if planned.problems:
        raise report.refusal(planned, FLAG, FIX)
    if not planned.taken:
        raise UsageError(
            f"{FLAG}={planned.source.given}: nothing of it fits the model of "
            f"--config={run.config_name}"
        )
