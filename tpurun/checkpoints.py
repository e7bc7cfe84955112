"""Checkpoints in model_dir: `ckpt-<step>` files written by tf.train.CheckpointManager.

A save is atomic in the way that matters: TensorFlow writes the tensors to a
`ckpt-<step>_temp` directory, merges them into `ckpt-<step>.index/.data-*`, and
only then rewrites the `checkpoint` state file (itself through a temporary file
and a rename). A process killed at any moment therefore leaves either the new
complete checkpoint or the previous state. On resume every candidate is checked
(the tensor bundle carries a CRC32C per tensor, verified as it is read) and a
damaged one is moved to `model_dir/damaged/`, falling back to the one before.
"""

from __future__ import annotations

import json
import re

import keras
import tensorflow as tf
from absl import logging

from tpurun import optimization_config
from tpurun.config_defaults import base_config
from tpurun.errors import RunError, UsageError
from tpurun.files import write_atomically
from tpurun.model import Model
from tpurun.run_config import RunConfig
from tpurun.tf_errors import one_line

# What reading a checkpoint that does not fit (or is damaged) raises.
DAMAGE_ERRORS = (tf.errors.OpError, ValueError, AssertionError)
# What a read raises when the storage, not the file, failed (GCS unavailable, no
# permission): never a reason to call a checkpoint damaged. A damaged file raises
# DataLoss, NotFound, OutOfRange, a bare OpError ("too short to be an sstable"),
# IndexError ("read less bytes than requested"), ValueError, AssertionError, ...
NOT_DAMAGE = (
    tf.errors.UnavailableError,
    tf.errors.DeadlineExceededError,
    tf.errors.ResourceExhaustedError,
    tf.errors.PermissionDeniedError,
    tf.errors.UnauthenticatedError,
    tf.errors.CancelledError,
    tf.errors.AbortedError,
)
TRAIN_CONFIG = "train_config.json"


def manager(
    run: RunConfig, checkpoint: tf.train.Checkpoint, directory: str | None = None
) -> tf.train.CheckpointManager:
    """Writes ckpt-<step> to `directory` (default: model_dir)."""
    return tf.train.CheckpointManager(
        checkpoint, directory or run.model_dir, max_to_keep=run.config.train.keep_checkpoint_max
    )


def scratch_dir(run: RunConfig, task: str) -> str:
    """Where a non-chief worker writes its copy of a checkpoint, deleted right after.

    Every worker of a MultiWorkerMirroredStrategy must take part in a save, but
    only the chief's copy is kept.
    """
    return tf.io.gfile.join(run.model_dir, ".scratch", task)


def path_of(model_dir: str, step: int) -> str:
    return tf.io.gfile.join(model_dir, f"ckpt-{step}")


def latest(model_dir: str) -> str | None:
    return tf.train.latest_checkpoint(model_dir)


def require_latest(run: RunConfig) -> str:
    """The newest checkpoint, or a RunError saying how to make one."""
    path = latest(run.model_dir) if tf.io.gfile.isdir(run.model_dir) else None
    if path is None:
        raise RunError(
            f"no checkpoint in {run.model_dir}; train first "
            f"(tpurun train --config={run.config_name} --model_dir={run.model_dir}) "
            "or point --model_dir at a trained run"
        )
    return path


def step_of(path: str) -> int:
    match = re.search(r"ckpt-(\d+)$", path)
    if not match:
        raise RunError(f"checkpoint {path} is not named ckpt-<step>; was it written by tpurun?")
    return int(match.group(1))


def candidates(model_dir: str) -> list[str]:
    """Every checkpoint in model_dir with an index file, newest step first.

    Read from the files, not only from the state file: a run killed after the
    merge but before the state file was rewritten left a complete newer one, and
    the state file itself may be what is damaged.
    """
    paths = {
        index[: -len(".index")]
        for index in tf.io.gfile.glob(tf.io.gfile.join(model_dir, "ckpt-*.index"))
        if re.search(r"ckpt-\d+\.index$", index)
    }
    return sorted(paths, key=step_of, reverse=True)


def remove_partial_saves(model_dir: str) -> None:
    """Deletes what an interrupted save or deletion left behind.

    A save killed before its merge leaves a `ckpt-<step>_temp` directory; one
    killed while deleting an old checkpoint leaves its .data without its .index.
    Neither can ever be restored.
    """
    leftovers = tf.io.gfile.glob(tf.io.gfile.join(model_dir, "ckpt-*_temp*"))
    for data in tf.io.gfile.glob(tf.io.gfile.join(model_dir, "ckpt-*.data-*")):
        if not tf.io.gfile.exists(data.rsplit(".data-", 1)[0] + ".index"):
            leftovers.append(data)
    for leftover in leftovers:
        logging.info("Removing %s, left by an interrupted save.", leftover)
        if tf.io.gfile.isdir(leftover):
            tf.io.gfile.rmtree(leftover)
        else:
            tf.io.gfile.remove(leftover)


def restore_newest_intact(
    checkpoint: tf.train.Checkpoint, run: RunConfig, is_chief: bool
) -> str | None:
    """Restores the newest checkpoint that reads back whole; returns its path (None: none).

    A damaged checkpoint (the tensors do not read back, or do not match the
    model) is moved to model_dir/damaged/ by the chief, and the one before it is
    tried, so a run always resumes from the last complete checkpoint.
    """
    model_dir = run.model_dir
    if is_chief:
        remove_partial_saves(model_dir)
    found = candidates(model_dir)
    if found:
        check_resume_config(run)
    damaged: list[str] = []
    reasons: list[str] = []
    for path in found:
        try:
            _read_whole(checkpoint, path)
        except NOT_DAMAGE as e:
            # The storage failed, not the file: moving a good checkpoint aside and
            # resuming from an older one would silently throw away steps.
            raise RunError(
                f"cannot read {path} ({type(e).__name__}: {one_line(e, 200)}); "
                "check access to the model_dir's storage and rerun"
            ) from None
        except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways (IndexError, ...)
            damaged.append(path)
            reason = f"{type(e).__name__}: {one_line(e)}"
            reasons.append(reason)
            logging.warning(
                "Checkpoint %s is damaged (%s); trying the one before.", path, reason[:300]
            )
            continue
        if is_chief:
            for bad in damaged:
                _move_aside(bad, model_dir)
            if damaged or latest(model_dir) != path:
                _rewrite_state(model_dir, path)
        return path
    if found:
        raise RunError(
            f"no checkpoint in {model_dir} can be restored ({', '.join(found)}; the newest: "
            f"{reasons[0][:200]}): they are damaged, or do not fit the model of this config; "
            "use the config they were trained with, move them away to train from scratch, "
            "or restore the model_dir from a backup"
        )
    return None


def _read_whole(checkpoint: tf.train.Checkpoint, path: str) -> None:
    """Restores every object of `checkpoint` from `path`, or raises.

    A checkpoint of tpurun before 0.2 has no `model_variables` list (which also
    saves Keras's random-number states): it restores the model and optimizer only.
    """
    keys = {name for name, _ in tf.train.list_variables(path)}
    if hasattr(checkpoint, "model_variables") and not any(
        key.startswith("model_variables/") for key in keys
    ):
        checkpoint = tf.train.Checkpoint(model=checkpoint.model, optimizer=checkpoint.optimizer)
    checkpoint.read(path).assert_existing_objects_matched()


def _move_aside(path: str, model_dir: str) -> None:
    damaged_dir = tf.io.gfile.join(model_dir, "damaged")
    tf.io.gfile.makedirs(damaged_dir)
    for file in tf.io.gfile.glob(path + ".*"):
        target = tf.io.gfile.join(damaged_dir, file.rsplit("/", 1)[-1])
        tf.io.gfile.rename(file, target, overwrite=True)
    logging.warning("Moved the damaged checkpoint %s to %s.", path, damaged_dir)


def _rewrite_state(model_dir: str, newest: str) -> None:
    """Points the `checkpoint` state file at `newest`, listing the intact older ones."""
    kept = [p for p in reversed(candidates(model_dir)) if step_of(p) <= step_of(newest)]
    tf.compat.v1.train.update_checkpoint_state(model_dir, newest, all_model_checkpoint_paths=kept)


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
    "eval.",
    "predict.",
)
# ...and where the data live (moved files, a new bucket): data.* keys named so.
DATA_LOCATION_SUFFIXES = ("path", "dir", "files", "pattern")


def resumable_changes(trained: dict) -> tuple[str, ...]:
    """RESUMABLE_CHANGES for checkpoints trained with the config `trained`.

    A schedule is not in the checkpoint (only the optimizer's step is): it is rebuilt
    from the config and evaluated at the restored step, so a changed schedule or
    parameter would make the rate jump. With the constant schedule the rate may change
    (a constant rate is a variable the resumed run sets from its config, train.py; with
    a warmup, the new rate is the warmup's target). Cosine and linear end at
    train.steps, so with them train.steps may not change either.
    """
    schedule = trained.get("optimizer", {}).get("schedule", "constant")
    if schedule == "constant":
        return (*RESUMABLE_CHANGES, "optimizer.learning_rate")
    if schedule in optimization_config.SCHEDULES_ENDING_AT_TRAIN_STEPS:
        return tuple(key for key in RESUMABLE_CHANGES if key != "train.steps")
    return RESUMABLE_CHANGES


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


def write_train_config(run: RunConfig) -> None:
    """Records the config the checkpoints in model_dir are trained with (atomically)."""
    write_atomically(
        tf.io.gfile.join(run.model_dir, TRAIN_CONFIG),
        json.dumps(run.config.to_dict(), indent=2, sort_keys=True, default=str) + "\n",
    )


def check_resume_config(run: RunConfig) -> None:
    """Refuses to resume when this config changes what the checkpoints were trained as."""
    path = tf.io.gfile.join(run.model_dir, TRAIN_CONFIG)
    if not tf.io.gfile.exists(path):
        return  # written by a tpurun that kept no record: nothing to compare with
    with tf.io.gfile.GFile(path) as f:
        recorded = _with_new_defaults(json.load(f))
    # The trained config decides what may change: a changed schedule is a difference.
    resumable = resumable_changes(recorded)
    before = _trained_config(recorded, resumable)
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


def warm_start(model: Model, keras_model: keras.Model, run: RunConfig) -> None:
    """Copies the variables matching train.warm_start_vars from another run's checkpoint.

    The checkpoint is read into a second copy of this config's model, so a
    variable is found by its place in the model, as a restore would; only the
    model's weights are taken (no optimizer state, no step).
    """
    source = run.config.train.warm_start_from
    path = source
    if tf.io.gfile.isdir(source):
        path = latest(source)
        if path is None:
            raise UsageError(f"--warm_start_from={source} holds no checkpoint; pass a ckpt-N path")
    elif not tf.io.gfile.exists(path + ".index"):
        raise UsageError(
            f"--warm_start_from={source} is neither a model_dir nor a checkpoint (no {path}.index)"
        )
    pattern_text = run.config.train.warm_start_vars
    try:
        pattern = re.compile(pattern_text)
    except re.error as e:
        raise UsageError(
            f"config.train.warm_start_vars={pattern_text!r} is not a regex: {e}"
        ) from None
    source_model = model.build()
    for variable in source_model.variables:
        # NaN until restored: a selected variable the checkpoint has no value for
        # must fail, not be copied over as the source model's random init.
        if tf.as_dtype(variable.dtype).is_floating:
            variable.assign(tf.fill(tf.shape(variable), float("nan")))
    try:
        tf.train.Checkpoint(model=source_model).read(path).expect_partial()
    except DAMAGE_ERRORS as e:
        reason = one_line(e, 300)
        raise RunError(
            f"cannot warm-start from {path}: it does not fit the model of this config ({reason})"
        ) from None
    taken = []
    missing = []
    for target, value in zip(keras_model.variables, source_model.variables, strict=True):
        if pattern.search(target.path) and tf.as_dtype(value.dtype).is_floating:
            if not bool(tf.reduce_all(tf.math.is_finite(value))):
                missing.append(target.path)
                continue
            if tuple(target.shape) != tuple(value.shape):
                raise RunError(
                    f"cannot warm-start {target.path}: shape {tuple(target.shape)} here, "
                    f"{tuple(value.shape)} in {path}; exclude it with config.train.warm_start_vars"
                )
            target.assign(value)
            taken.append(target.path)
    if missing:
        raise UsageError(
            f"--warm_start_from={source}: {path} has no value for {', '.join(missing[:5])}"
            f"{' ...' if len(missing) > 5 else ''} (is it a tpurun checkpoint of this model?); "
            "leave them out with config.train.warm_start_vars"
        )
    if not taken:
        raise UsageError(
            f"config.train.warm_start_vars={pattern_text!r} matches none of the model's "
            f"variables ({', '.join(v.path for v in keras_model.variables[:6])}, ...)"
        )
    logging.info(
        "Warm-started %d of %d variables from %s; training starts at step 0.",
        len(taken),
        len(keras_model.variables),
        path,
    )


class CheckpointGone(RunError):
    """The checkpoint's files disappeared before it was read (deleted by keep_checkpoint_max)."""


def restore_model(keras_model: keras.Model, path: str) -> None:
    """Loads the model's weights (not the optimizer's) from a training checkpoint."""
    try:
        status = tf.train.Checkpoint(model=keras_model).read(path)
    except tf.errors.NotFoundError as e:
        raise CheckpointGone(f"checkpoint {path} is gone ({one_line(e, 200)})") from None
    try:
        status.expect_partial().assert_existing_objects_matched()
    except AssertionError as e:
        raise RunError(
            f"checkpoint {path} does not match the model built from this config "
            f"({one_line(e, 300)}); use the config it was trained with"
        ) from None
