"""TF1-style checkpoints for the tests, written as a TPUEstimator program wrote them: never by tpurun.

TensorFlow 2.21 has no tf.compat.v1.layers without tf-keras, so the variables are made
by their names (`tf.compat.v1.get_variable`), in graph mode, and saved by a name-based
`tf.compat.v1.train.Saver` (its `checkpoint` state file and .meta too), or exported by
`tf.compat.v1.saved_model.Builder` as a TF1 Estimator's export did.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import tensorflow as tf


def _variables(values: Mapping[str, np.ndarray], global_step: int | None) -> None:
    for name, value in values.items():
        tf.compat.v1.get_variable(name, initializer=tf.constant(value))
    if global_step is not None:
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.add_to_collection("step_value", step.assign(global_step))


def write_checkpoint(
    prefix: Path | str, values: Mapping[str, np.ndarray], global_step: int | None = None
) -> str:
    """`<prefix>-<global_step>` (or `<prefix>` without a step) in its directory, with the
    `checkpoint` state file naming it; returns the checkpoint's prefix."""
    Path(prefix).parent.mkdir(parents=True, exist_ok=True)
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        _variables(values, global_step)
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(tf.compat.v1.get_collection("step_value"))
        saver = tf.compat.v1.train.Saver()
        return saver.save(session, str(prefix), global_step=global_step)


def write_saved_model(
    export_dir: Path | str, values: Mapping[str, np.ndarray], global_step: int | None = None
) -> str:
    """A TF1 SavedModel (tag "serve") whose variables/ holds `values`, name-based."""
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        _variables(values, global_step)
        session.run(tf.compat.v1.global_variables_initializer())
        session.run(tf.compat.v1.get_collection("step_value"))
        builder = tf.compat.v1.saved_model.Builder(str(export_dir))
        builder.add_meta_graph_and_variables(session, ["serve"])
        builder.save()
    return str(export_dir)


def with_slots(values: Mapping[str, np.ndarray], slot: str = "Momentum") -> dict[str, np.ndarray]:
    """`values` and an optimizer's slot of each (`<name>/<slot>`), as MomentumOptimizer made."""
    return {**values, **{f"{name}/{slot}": np.zeros_like(v) for name, v in values.items()}}


def hashes(directory: Path) -> dict[str, str]:
    """Every file below `directory` by its relative path, with the SHA-256 of its bytes."""
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }
