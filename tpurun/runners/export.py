"""Export for serving: a SavedModel whose `serving_default` returns the model's predictions.

Written to a temporary directory of this process beside the target and renamed
into place, so a failed or killed export never leaves a half-written SavedModel.
"""

from __future__ import annotations

import time
from typing import Any

import keras
import tensorflow as tf
from absl import logging

from tpurun import precision, storage
from tpurun.errors import RunError, UsageError
from tpurun.layout import names
from tpurun.model import InputParams, Model, build_models
from tpurun.run_config import RunConfig
from tpurun.runners import restore


def serving_signatures(model: Model) -> dict[str, Any]:
    """The model's signatures and their inputs, each input named after its feature so that
    clients can pass them by name."""
    params = InputParams(
        batch_size=1,
        global_batch_size=1,
        num_replicas=1,
        input_pipeline_id=0,
        num_input_pipelines=1,
        seed=0,
    )
    predict_spec = model.predict_spec(params)
    signatures = {}
    for name, spec in model.serving_signatures(predict_spec).items():
        if isinstance(spec, dict):
            spec = {k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in spec.items()}
        signatures[name] = spec
    return signatures


def serving_input_spec(model: Model) -> Any:
    """The inputs of the model's serving_default signature."""
    return serving_signatures(model)["serving_default"]


def target_dir(run: RunConfig) -> str:
    """--export_dir (new, or an empty directory), else model_dir/export/<timestamp>."""
    if run.export_dir:
        storage.require_bucket(run.export_dir, "--export_dir")
        if storage.is_link(run.export_dir):
            raise UsageError(
                f"--export_dir={run.export_dir} is a symbolic link; give the directory it "
                "points to, or a new path"
            )
        if tf.io.gfile.exists(run.export_dir) and (
            not tf.io.gfile.isdir(run.export_dir) or tf.io.gfile.listdir(run.export_dir)
        ):
            raise UsageError(
                f"--export_dir={run.export_dir} exists and is not empty; pick a new one"
            )
        return run.export_dir
    storage.make_dir(run.model_dir, storage.join(run.model_dir, names.EXPORT_DIR))
    stamp = int(time.time())
    while tf.io.gfile.exists(names.export_path(run.model_dir, stamp)):
        stamp += 1
    return names.export_path(run.model_dir, stamp)


def export(run: RunConfig, model: Model, checkpoint_path: restore.Chosen) -> str:
    """Exports the checkpoint; returns the SavedModel directory.

    Written to a temporary directory of this process beside the target and
    renamed into place: a failed or killed export leaves no half-written
    SavedModel (a killed one's temporary is removed by the next run).
    """
    models = build_models(model)  # default strategy: serving has no replicas
    keras_model = models[model.serving_model]  # what the signature serves
    averages = restore.averages_of(model, models, run.config)
    restore.restore_weights(models, checkpoint_path, averages, model.serving_model)
    # keras.export.ExportArchive, not tf.saved_model.save: only it saves Keras 3
    # variables so that TF1-style loaders (saved_model_cli, TF Serving) find them.
    archive = keras.export.ExportArchive()
    archive.track(keras_model)
    for name, spec in serving_signatures(model).items():
        archive.add_endpoint(
            name,
            # Predictions in float32 whatever the compute dtype: a bfloat16-trained model
            # serves the same signature as a float32 one.
            lambda inputs: model.predictions(
                precision.float32(keras_model(model.serving_features(inputs), training=False))
            ),
            input_signature=[spec],
        )
    final = target_dir(run)
    tmp = names.temporary_path(final)
    try:
        tf.io.gfile.makedirs(final.rstrip("/").rpartition("/")[0] or ".")
        archive.write_out(tmp, verbose=False)
        if tf.io.gfile.exists(final):  # an empty --export_dir
            storage.remove_tree(final)
        storage.rename_dir(tmp, final)
    except BaseException as e:
        if tf.io.gfile.exists(tmp):
            storage.remove_tree(tmp)
        if isinstance(e, tf.errors.OpError):
            raise RunError(
                f"cannot write the export to {final}, nothing was left behind: {storage.failure(e)}"
            ) from None
        raise
    logging.info("Exported step %d to %s.", restore.step_of(checkpoint_path), final)
    return final
