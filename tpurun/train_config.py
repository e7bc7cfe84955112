"""model_dir/train_config.json: the config the checkpoints of a model_dir were trained with.

Written by every `tpurun train` before its first save; read before a checkpoint
is restored, so that a run resumed, evaluated or exported with another config
fails at once with both config names and what differs, instead of deep inside
a restore.
"""

from __future__ import annotations

import json
from typing import Any

from absl import logging

from tpurun import optimization_config, records, storage
from tpurun.config_defaults import base_config
from tpurun.errors import RunError, UsageError
from tpurun.run_config import DATA_LOCATION_SUFFIXES, RunConfig

FILE = "train_config.json"
# The config's name, beside its keys in the record: a key no config has.
NAME_KEY = "__config_name__"

# Config keys a resumed run may change: how long, how often and from where, not the
# model, its optimizer, the seed or the batch size. The learning rate and train.steps
# depend on the schedule: `resumable_changes`.
RESUMABLE_CHANGES = (
    "train.steps",
    "train.iterations",
    "train.save_checkpoints_steps",
    "train.save_checkpoints_secs",
    "train.keep_checkpoint_max",
    "train.eval_every",
    "train.warm_start_from",
    "train.warm_start_vars",
    # Variables are float32 under every policy: a checkpoint reads the same.
    "precision",
    # Where the training batches are made: the same batches either way.
    "train.device_data",
    "train.device_data_mb",
    "train.xla",
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
    if any(s in optimization_config.SCHEDULES_ENDING_AT_TRAIN_STEPS for s in schedules.values()):
        changes.remove("train.steps")
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


def write(run: RunConfig) -> None:
    """Records the config the checkpoints in model_dir are trained with (atomically)."""
    record = {**run.config.to_dict(), NAME_KEY: run.config_name}
    storage.write_atomically(
        storage.join(run.model_dir, FILE),
        json.dumps(record, indent=2, sort_keys=True, default=str) + "\n",
    )


def read(run: RunConfig) -> tuple[str | None, dict[str, Any]] | None:
    """(config name, config) of model_dir's record; None if it has none.

    A damaged record ends the run with one line, unless --force_resume says to
    go on without the check (the next train rewrites it).
    """
    path = storage.join(run.model_dir, FILE)
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
    return (name if isinstance(name, str) else None), record


def check_same_model(run: RunConfig) -> None:
    """Fails, before any restore, when model_dir was trained with a config of another model;
    warns when it kept moving averages this config does not read."""
    recorded = read(run)
    _check_model(run, recorded)
    if recorded is not None:
        _warn_of_unread_averages(run, recorded[1])


def _warn_of_unread_averages(run: RunConfig, trained: dict[str, Any]) -> None:
    """eval, predict and export read the moving averages only when their config has
    train.ema_decay: said, or a run trained with an override silently serves raw weights."""
    decay = _flatten(trained).get("train.ema_decay")
    if run.config.train.ema_decay or not isinstance(decay, (int, float)) or not decay:
        return
    logging.warning(
        "%s was trained with config.train.ema_decay=%g, but this config has none: using "
        "the raw weights; pass --config.train.ema_decay=%g to use their moving averages.",
        run.model_dir,
        decay,
        decay,
    )


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
