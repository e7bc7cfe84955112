"""Export for serving: a SavedModel whose `serving_default` returns the model's predictions.

Written to a hidden temporary directory beside the target and renamed into place,
so a failed or killed export never leaves a half-written SavedModel behind.
"""

from __future__ import annotations

import os
import time

import keras
import tensorflow as tf
from absl import logging

from tpurun import checkpoints
from tpurun.errors import UsageError
from tpurun.files import rename_dir
from tpurun.model import InputParams, Mode, Model, build_keras_model
from tpurun.run_config import RunConfig


def serving_input_spec(model: Model):
    """The model's serving inputs; named after the features so clients can pass them by name."""
    params = InputParams(
        batch_size=1,
        global_batch_size=1,
        num_replicas=1,
        input_pipeline_id=0,
        num_input_pipelines=1,
        seed=0,
    )
    predict_spec = model.input_fn(Mode.PREDICT, params).element_spec
    spec = model.serving_input_spec(predict_spec)
    if isinstance(spec, dict):
        spec = {k: tf.TensorSpec(s.shape, s.dtype, name=k) for k, s in spec.items()}
    return spec


def target_dir(run: RunConfig) -> str:
    if run.export_dir:
        if tf.io.gfile.exists(run.export_dir) and tf.io.gfile.listdir(run.export_dir):
            raise UsageError(
                f"--export_dir={run.export_dir} exists and is not empty; pick a new one"
            )
        return run.export_dir
    base = tf.io.gfile.join(run.model_dir, "export")
    stamp = int(time.time())
    while tf.io.gfile.exists(tf.io.gfile.join(base, str(stamp))):
        stamp += 1
    return tf.io.gfile.join(base, str(stamp))


def export(run: RunConfig, model: Model, checkpoint_path: str) -> str:
    """Exports the checkpoint; returns the SavedModel directory."""
    keras_model = build_keras_model(model)  # default strategy: serving has no replicas
    checkpoints.restore_model(keras_model, checkpoint_path)
    # keras.export.ExportArchive, not tf.saved_model.save: only it saves Keras 3
    # variables so that TF1-style loaders (saved_model_cli, TF Serving) find them.
    archive = keras.export.ExportArchive()
    archive.track(keras_model)
    archive.add_endpoint(
        "serving_default",
        lambda inputs: model.predictions(
            keras_model(model.serving_features(inputs), training=False)
        ),
        input_signature=[serving_input_spec(model)],
    )
    final = target_dir(run)
    # Not os.path: the path may be gs://... or any other TensorFlow file system.
    parent, _, name = final.rstrip("/").rpartition("/")
    parent = parent or "."
    tmp = tf.io.gfile.join(parent, f".{name}.tmp-{os.getpid()}")
    tf.io.gfile.makedirs(parent)
    try:
        archive.write_out(tmp, verbose=False)
        if tf.io.gfile.exists(final):  # an empty --export_dir
            tf.io.gfile.remove(final) if not tf.io.gfile.isdir(final) else tf.io.gfile.rmtree(final)
        rename_dir(tmp, final)
    except BaseException:
        if tf.io.gfile.exists(tmp):
            tf.io.gfile.rmtree(tmp)
        raise
    logging.info("Exported step %d to %s.", checkpoints.step_of(checkpoint_path), final)
    return final
