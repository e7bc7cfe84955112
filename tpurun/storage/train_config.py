"""model_dir/train_config.json: the config the checkpoints of a model_dir were trained with.

Written by every `tpurun train` before its first save; read before a checkpoint
is restored, so that a run resumed, evaluated or exported with another config
fails at once with both config names and what differs, instead of deep inside
a restore.

It also keeps the training examples an epoch counted (a run that counts in epochs,
`tpurun.run_config.epochs.resolve_length`), so a resumed run keeps counting in the
same steps.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from absl import logging

from tpurun import storage
from tpurun.config_defaults import base_config
from tpurun.errors import RunError, UsageError
from tpurun.layout import names
from tpurun.run_config import DATA_LOCATION_SUFFIXES, RunConfig
from tpurun.run_config.epochs import Counted
from tpurun.run_config.keys import recipe_keys, trained_keys
from tpurun.storage import records

# The config's name, beside its keys in the record: a key no config has.
NAME_KEY = "__config_name__"
# The training examples an epoch counted (a run counted in epochs, or evaluating every
# epoch): a resumed run counts in them, whatever its data now hold.
EXAMPLES_KEY = "__train_examples__"
# How the device-data host loops timed (config.train.xla="auto" chose the faster by
# them): a resumed run runs the loop its checkpoints were trained with.
LOOP_TIMES_KEY = "__loop_times__"

# Config keys a resumed run may change: how long, how often and from where, not the
# model, its optimizer, the seed or the batch size. The learning rate and train.steps
# depend on the schedule: `resumable_changes`.
RESUMABLE_CHANGES = (
    "train.steps",
    "train.epochs",
    "train.iterations",
    "train.save_checkpoints_steps",
    "train.save_checkpoints_secs",
    "train.keep_checkpoint_max",
    "train.async_checkpoint",
    "train.summary_upload_secs",
    "train.eval_every",
    "train.warm_start_from",
    "train.warm_start_vars",
    # How foreign checkpoints' names are read: nothing of the model.
    "name_map",
    # Variables are float32 under every policy: a checkpoint reads the same.
    "precision",
    # Where the training batches are made: the same batches either way.
    "train.device_data",
    "train.device_data_mb",
    "train.xla",
    # Where the input is made: here (exact resume), or by a tf.data service (docs/data-service.md).
    "data.service",
    "data.service_processing_mode",
    "data.service_timeout",
    # Which kernels: a resume's weights then match the uninterrupted run's, or not (said
    # at its start), the model and its checkpoint the same either way.
    "train.deterministic",
    "eval.",
    "predict.",
)
# ...and where the data live (moved files, a new bucket): data.* keys named so
# (run_config.DATA_LOCATION_SUFFIXES).


def resumable_changes(trained: dict) -> tuple[str, ...]:
    """RESUMABLE_CHANGES for checkpoints trained with the config `trained`.

    A schedule is not in the checkpoint (only the global step is): it is rebuilt
    from the config and evaluated at the restored step, so a changed schedule or
    parameter would make the rate jump. With the constant schedule the rate may change
    (a constant rate is a variable the resumed run sets from its config, train.py; with
    a warmup, the new rate is the warmup's target). Cosine and linear end at
    train.steps, so with them train.steps may not change either. Each recipe decides
    for its own keys: config.optimizer's, or each of config.optimizers'.
    """
    named = trained.get("optimizers") or {}
    recipes = {f"optimizers.{n}": r for n, r in named.items()} if named else {}
    recipes = recipes or {"optimizer": trained.get("optimizer", {})}
    schedules = {key: recipe.get("schedule", "constant") for key, recipe in recipes.items()}
    changes = [*RESUMABLE_CHANGES]
    changes += [f"{key}.learning_rate" for key, s in schedules.items() if s == "constant"]
    if any(s in recipe_keys.SCHEDULES_ENDING_AT_TRAIN_STEPS for s in schedules.values()):
        changes = [key for key in changes if key not in ("train.steps", "train.epochs")]
    return tuple(changes)


def _flatten(config: dict, prefix: str = "") -> dict[str, object]:
    flat: dict[str, object] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _trained_config(config: dict, resumable: tuple[str, ...]) -> dict[str, object]:
    """The keys that decide what a checkpoint holds: the model, its data order, the batch."""
    return {
        key: value
        for key, value in _flatten(json.loads(json.dumps(config, default=str))).items()
        if not any(key == r or (r.endswith(".") and key.startswith(r)) for r in resumable)
        and not (key.startswith("data.") and key.endswith(DATA_LOCATION_SUFFIXES))
    }


def _with_new_defaults(recorded: dict) -> dict:
    """A recorded config with the keys base_config gained since, at their defaults.

    A new key's default does what tpurun did before it existed (no schedule, no
    weight decay, ...), so a model_dir of an older tpurun resumes.
    """
    merged = _flatten(json.loads(json.dumps(base_config(model="").to_dict(), default=str)))
    merged.update(_flatten(recorded))
    nested: dict = {}
    for key, value in merged.items():
        *sections, leaf = key.split(".")
        node = nested
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return nested


def write(run: RunConfig, loop_times: dict[str, Any] | None = None) -> None:
    """Records the config the checkpoints in model_dir are trained with (atomically), and
    the loop times its host loop was chosen by, if it was (`recorded_loop_times`)."""
    record = {**run.config.to_dict(), NAME_KEY: run.config_name}
    if run.train_examples:
        record[EXAMPLES_KEY] = run.train_examples
    if loop_times:
        record[LOOP_TIMES_KEY] = loop_times
    storage.write_atomically(
        storage.join(run.model_dir, names.TRAIN_CONFIG),
        json.dumps(record, indent=2, sort_keys=True, default=str) + "\n",
    )


def read(run: RunConfig) -> tuple[str | None, dict[str, Any]] | None:
    """(config name, config) of model_dir's record; None if it has none.

    A damaged record ends the run with one line, unless --force_resume says to
    go on without the check (the next train rewrites it).
    """
    path = storage.join(run.model_dir, names.TRAIN_CONFIG)
    try:
        record = records.read_json(path)
        if record is None:
            return None
        if not isinstance(record, dict):
            raise records.DamagedRecord(path, "not a JSON object")
    except records.DamagedRecord as e:
        if run.force_resume:
            logging.warning("%s; --force_resume: going on without comparing configs.", e)
            return None
        raise RunError(
            f"{e}: it records the config the checkpoints were trained with; restore it from "
            "a backup, or pass --force_resume to go on without the check (train rewrites it)"
        ) from None
    name = record.pop(NAME_KEY, None)  # tpurun 0.2 recorded the config alone
    record.pop(EXAMPLES_KEY, None)  # not a config key: `recorded_examples`
    record.pop(LOOP_TIMES_KEY, None)  # nor this: `recorded_loop_times`
    return (name if isinstance(name, str) else None), record


def check_same_model(run: RunConfig) -> None:
    """Fails, before any restore, when model_dir was trained with a config of another model."""
    _check_model(run, read(run))


def for_serving(run: RunConfig) -> tuple[RunConfig, tuple[trained_keys.Difference, ...]]:
    """eval, predict and export: `run` with the model its checkpoints were trained as (the
    trained config's model keys, `tpurun.run_config.keys.trained_keys`), and the model keys
    the command line changed. Fails first, as `check_same_model`, for another model's
    model_dir; `run` as it is when model_dir keeps no record (a tpurun before 0.2)."""
    recorded = read(run)
    _check_model(run, recorded)
    if recorded is None:
        return run, ()
    served = trained_keys.serve(run.config, _with_new_defaults(recorded[1]), run.given_keys)
    if served.taken:
        logging.info(
            "The model as trained (%s/%s): %s; --config.<key>=<value> overrides one.",
            run.model_dir,
            names.TRAIN_CONFIG,
            ", ".join(d.shown("the config file:") for d in served.taken),
        )
    if served.overridden:
        logging.info(
            "Overriding the config the checkpoints were trained with: %s.",
            ", ".join(d.shown("given:") for d in served.overridden),
        )
    return dataclasses.replace(run, config=served.config), served.overridden


def _check_model(run: RunConfig, recorded: tuple[str | None, dict[str, Any]] | None) -> None:
    if recorded is None:
        return
    name, config = recorded
    model = config.get("model")
    if model is None or model == run.config.model:
        return
    trained = f"--config={name} (model {model})" if name else f"model {model}"
    raise UsageError(
        f"{run.model_dir} was trained with {trained}, but this is --config={run.config_name} "
        f"(model {run.config.model}): pass --config={name or model}, or the --model_dir of a "
        f"{run.config.model} run"
    )


def check_resume(run: RunConfig) -> None:
    """Refuses to resume when this config changes what the checkpoints were trained as."""
    recorded = read(run)
    if recorded is None:
        return  # written by a tpurun that kept no record: nothing to compare with
    _check_model(run, recorded)  # the record read once: a request fewer on gs://
    trained = _with_new_defaults(recorded[1])
    # The trained config decides what may change: a changed schedule is a difference.
    resumable = resumable_changes(trained)
    before = _trained_config(trained, resumable)
    now = _trained_config(run.config.to_dict(), resumable)
    differences = [
        f"{key}: {before.get(key, '(absent)')!r} -> {now.get(key, '(absent)')!r}"
        for key in sorted(set(before) | set(now))
        if before.get(key, "(absent)") != now.get(key, "(absent)")
    ]
    if not differences:
        return
    listed = "; ".join(differences)
    if run.force_resume:
        logging.warning("Resuming with a changed config (--force_resume): %s.", listed)
        return
    raise UsageError(
        f"the checkpoints in {run.model_dir} were trained with a different config: {listed}. "
        "Use a new --model_dir (or --warm_start_from to start from these weights), or pass "
        "--force_resume to continue anyway"
    )


def recorded_examples(run: RunConfig) -> Counted | None:
    """The training examples model_dir's epochs counted, if its record kept them
    (`tpurun.run_config.epochs.resolve_length` keeps counting them)."""
    examples = _recorded(run, EXAMPLES_KEY)
    if not isinstance(examples, int) or isinstance(examples, bool) or examples <= 0:
        return None
    return Counted(examples, storage.join(run.model_dir, names.TRAIN_CONFIG))


def recorded_loop_times(run: RunConfig) -> dict[str, Any] | None:
    """The device-data loop times model_dir's record kept (`write`), if it kept them."""
    times = _recorded(run, LOOP_TIMES_KEY)
    return times if isinstance(times, dict) else None


def _recorded(run: RunConfig, key: str) -> Any:
    path = storage.join(run.model_dir, names.TRAIN_CONFIG)
    try:
        record = records.read_json(path)
    except records.DamagedRecord:
        return None  # said where the record is read for the resume (check_resume)
    return record.get(key) if isinstance(record, dict) else None
