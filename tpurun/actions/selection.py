"""The actions a training run gets (`for_training`), besides save and eval, which the
controller calls itself."""

from __future__ import annotations

import sys
from collections.abc import Callable

import tensorflow as tf

from tpurun.actions.base import Action
from tpurun.actions.hang import HangTimeout
from tpurun.actions.profiler import ProfileSteps
from tpurun.actions.progress import InputBound, LogLines, ProgressBar
from tpurun.actions.summaries import TrainSummaries
from tpurun.run_config import RunConfig
from tpurun.run_config.epochs import epoch_count
from tpurun.storage.background import Writer


def for_training(
    run: RunConfig,
    *,
    is_chief: bool,
    model_name: str,
    input_seeks: bool,
    graph: Callable[[], tf.Graph] | None = None,
    terminal: bool | None = None,
    writer: Writer | None = None,
) -> list[Action]:
    """The actions of a training run (besides save and eval, which the controller calls).

    Every worker logs its loops (the chief on a terminal: a live line instead),
    warns when input-bound and watches for a hang; only the chief writes
    TensorBoard events and profiles. `input_seeks`: whether the model's training
    input starts at its resume position itself (`Model.input_fn_seeks`); `graph`:
    the model's forward graph for TensorBoard; `terminal`: whether stderr is one
    (default: ask it); `writer`: the run's background writer (TensorBoard events on
    gs:// are uploaded through it).
    """
    if terminal is None:
        terminal = sys.stderr.isatty()
    actions: list[Action] = []
    if run.hang_timeout:
        actions.append(HangTimeout(run.hang_timeout, run.model_dir, input_seeks=input_seeks))
    epochs = epoch_count(run)  # shown when the run counted its examples
    actions.append(ProgressBar(epochs=epochs) if terminal and is_chief else LogLines(epochs))
    actions.append(InputBound(model_name))
    if is_chief:
        actions.append(
            TrainSummaries(
                run.model_dir,
                graph=graph,
                writer=writer,
                upload_secs=run.config.train.summary_upload_secs,
            )
        )
        if run.profile_steps is not None:
            actions.append(ProfileSteps(run.model_dir, *run.profile_steps))
    return actions
