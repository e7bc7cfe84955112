"""The best checkpoint so far by `config.eval.best_metric`, kept apart in model_dir/best/.

Every evaluation (`tpurun eval`, `eval --continuous`, `train --eval_every`) offers
its checkpoint; the chief copies the checkpoint's files here when its metric on
`config.eval.best_split` beats the recorded best. Evaluations of other splits never
touch it: a checkpoint chosen on the test data would make the test result a lie. Living outside model_dir's ckpt-<step> files, it is never
deleted by keep_checkpoint_max; `tpurun export --best` exports it.

A replacement never leaves a half-written best, and renames nothing (on GCS a
rename copies and deletes every object): the new checkpoint's files are copied into
`best/` beside the current best's (their names differ by step), then `best.json`,
the switch a reader goes by, is rewritten atomically to name them, and only then are
the previous best's files removed. A failure or a kill at any moment leaves
`best.json` naming a whole checkpoint; stray files of an unfinished copy are
removed by the next update. One process at a time updates the best of a model_dir
(a train with --eval_every, or one sidecar).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable

import tensorflow as tf
from absl import logging

from tpurun import storage
from tpurun.errors import RunError, UsageError
from tpurun.layout import names
from tpurun.run_config import RunConfig
from tpurun.storage import checkpoints, records
from tpurun.storage.eval_results import NOT_METRICS


@dataclasses.dataclass(frozen=True)
class Best:
    """What best.json records, and where the checkpoint is."""

    step: int
    metric: str
    mode: str
    value: float
    checkpoint: str  # the file prefix in the best directory, e.g. ckpt-300
    path: str  # the full checkpoint path, for restoring
    split: str = ""  # the split it was chosen on; "" in a record of tpurun before splits

    def record(self) -> dict[str, object]:
        return {
            "step": self.step,
            "split": self.split,
            "metric": self.metric,
            "mode": self.mode,
            "value": self.value,
            "checkpoint": self.checkpoint,
        }


def check_metric(run: RunConfig, metric_names: Iterable[str]) -> None:
    """Fails with the metrics there are when config.eval.best_metric is not one of them."""
    available = sorted(name for name in metric_names if name not in NOT_METRICS)
    name = run.config.eval.best_metric
    if name not in available:
        raise UsageError(
            f"config.eval.best_metric={name!r} is not an eval metric of this model; "
            f"use one of {', '.join(available)} (--config.eval.best_metric=NAME)"
        )


def read(model_dir: str) -> Best | None:
    """The recorded best checkpoint of model_dir, or None if there is none yet.

    A damaged record (truncated, edited) is set aside into model_dir/damaged/ with a
    warning, and the best is as if none were kept: the next evaluation rebuilds it.
    """
    for name in (names.BEST_DIR, names.PREVIOUS_BEST):
        directory = storage.join(model_dir, name)
        record_path = storage.join(directory, names.BEST_RECORD)
        try:
            best = _parse(directory, records.read_json(record_path, _KEYS))
        except records.DamagedRecord as e:
            moved_to = storage.move_into(model_dir, [record_path], names.DAMAGED_DIR)
            logging.warning(
                "%s; moved it to %s: the next evaluation keeps a new best.", e, moved_to
            )
            continue
        if best is None or not tf.io.gfile.exists(names.index_file(best.path)):
            continue  # deleted by hand, or a rename of tpurun before 0.3 killed half-way
        return best
    return None


_KEYS = ("step", "metric", "mode", "value", "checkpoint")


def _parse(directory: str, record: dict | None) -> Best | None:
    if record is None:
        return None
    name = record["checkpoint"]
    if not isinstance(name, str) or not names.CHECKPOINT.fullmatch(name):
        # Never a path: the best is a copy inside `directory`, whatever the record says.
        raise records.DamagedRecord(
            storage.join(directory, names.BEST_RECORD), f"checkpoint {name!r}"
        )
    try:
        return Best(
            step=int(record["step"]),
            metric=str(record["metric"]),
            mode=str(record["mode"]),
            value=float(record["value"]),
            checkpoint=name,
            path=storage.join(directory, name),
            split=str(record.get("split", "")),
        )
    except (TypeError, ValueError) as e:
        raise records.DamagedRecord(storage.join(directory, names.BEST_RECORD), str(e)) from None


def require(run: RunConfig) -> Best:
    """The best checkpoint, or a RunError saying how to make one."""
    best = read(run.model_dir)
    if best is None:
        where = f"--config={run.config_name} --model_dir={run.model_dir}"
        raise RunError(
            f"no best checkpoint in {storage.join(run.model_dir, names.BEST_DIR)} yet; evaluate first "
            f"(tpurun eval {where}, or tpurun train {where} --eval_every=N), "
            f"or {run.command} the latest checkpoint without --best"
        )
    return best


def results_path(model_dir: str, split: str) -> str:
    """Where `eval --best --split=S` records its results: best/results-<S>.json."""
    return names.best_results_path(model_dir, split)


def improves(value: float, best: Best | None, metric: str, mode: str, split: str = "") -> bool:
    """Whether `value` of `metric` beats the recorded best (a tie does not: the older stays)."""
    if not math.isfinite(value):
        return False
    # A record without a split (tpurun before splits) was chosen on the one split there was.
    other_split = bool(best and best.split and split and best.split != split)
    if (
        best is None
        or best.metric != metric
        or best.mode != mode
        or other_split
        or not math.isfinite(best.value)
    ):
        return True  # nothing comparable recorded: the config chose another metric or split
    return value < best.value if mode == "min" else value > best.value


def update(run: RunConfig, checkpoint_path: str, results: dict[str, float], split: str) -> bool:
    """Keeps the evaluated checkpoint as the best if its metric improves; returns whether it did.

    `split` is the selecting split (config.eval.best_split): the caller offers no other.
    """
    check_metric(run, results)
    metric, mode = run.config.eval.best_metric, run.config.eval.best_mode
    value = float(results[metric])
    step = checkpoints.step_of(checkpoint_path)
    current = read(run.model_dir)
    if not improves(value, current, metric, mode, split):
        kept = f"step {current.step} ({metric}={current.value:.4f})" if current else "none"
        logging.info("Best checkpoint stays %s; step %d has %s=%.4f.", kept, step, metric, value)
        return False
    name = checkpoint_path.rstrip("/").rsplit("/", 1)[-1]
    best = Best(
        step, metric, mode, value, name, storage.join(run.model_dir, names.BEST_DIR, name), split
    )
    if not _write(run.model_dir, checkpoint_path, best, current):
        return False
    before = f"; was {current.value:.4f} at step {current.step}" if current else ""
    logging.info(
        "New best checkpoint: step %d, %s=%.4f on %s (%s is best%s); kept in %s.",
        step,
        metric,
        value,
        split,
        mode,
        before,
        storage.join(run.model_dir, names.BEST_DIR),
    )
    return True


def _write(model_dir: str, checkpoint_path: str, best: Best, current: Best | None) -> bool:
    """Makes `best` model_dir's best (see the module's docstring); False if the checkpoint was
    deleted meanwhile. Whatever fails before best.json is switched removes the files it
    copied and leaves the best as it was.
    """
    directory = storage.make_dir(model_dir, storage.join(model_dir, names.BEST_DIR))
    copied: list[str] = []
    try:
        files = checkpoints.files_of(checkpoint_path)  # ckpt-N.index, ckpt-N.data-*
        if not any(names.is_index(f) for f in files):
            raise tf.errors.NotFoundError(
                None, None, f"{names.index_file(checkpoint_path)} is gone"
            )
        if current is None or current.path != best.path:  # else: the same files are there
            for file in files:
                copied.append(storage.join(directory, storage.basename(file)))
                tf.io.gfile.copy(file, copied[-1], overwrite=True)
        storage.write_atomically(
            storage.join(directory, names.BEST_RECORD),
            json.dumps(best.record(), indent=2, sort_keys=True) + "\n",
        )
    except BaseException as e:
        for path in copied:
            storage.remove_file_quietly(model_dir, path, names.CHECKPOINT_FILE)
        # A 404 can also be one failed request (GCS): only a checkpoint whose index is
        # really gone was deleted.
        if not isinstance(e, tf.errors.NotFoundError) or tf.io.gfile.exists(
            names.index_file(checkpoint_path)
        ):
            raise
        # A sidecar's checkpoint can be deleted by the trainer's keep_checkpoint_max
        # after it was evaluated; the best recorded before stays.
        logging.warning(
            "Checkpoint %s was deleted (keep_checkpoint_max) before it could be kept as the "
            "best; the best stays as it was.",
            checkpoint_path,
        )
        return False
    # The previous best's files, and any an unfinished copy left; results of
    # `eval --best` of another checkpoint would now say the wrong step.
    for name in storage.listdir(directory):
        path = storage.join(directory, name)
        if names.CHECKPOINT_FILE.fullmatch(name) and not names.is_file_of(best.checkpoint, name):
            storage.remove_file_quietly(model_dir, path, names.CHECKPOINT_FILE)
        elif names.BEST_RESULTS.fullmatch(name) and (current is None or current.step != best.step):
            storage.remove_file_quietly(model_dir, path, names.BEST_RESULTS)
    previous = storage.join(model_dir, names.PREVIOUS_BEST)
    if current is not None and current.path.startswith(previous + "/"):
        storage.remove(model_dir, previous, names.exactly(names.PREVIOUS_BEST))
    return True
