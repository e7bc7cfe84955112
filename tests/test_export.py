"""tpurun.runners.export: a SavedModel whose serving signature gives the Keras model's predictions,
written next to its target and renamed into place: never a half-written one."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from iris_runs import feature_columns, iris_checkpoint, iris_run, restored_iris

from tpurun.errors import UsageError
from tpurun.model import create
from tpurun.runners import export

ROWS = {
    "SepalLength": np.array([5.1, 5.9, 6.9, 4.4], np.float32),
    "SepalWidth": np.array([3.3, 3.0, 3.1, 2.9], np.float32),
    "PetalLength": np.array([1.7, 4.2, 5.4, 1.4], np.float32),
    "PetalWidth": np.array([0.5, 1.5, 2.1, 0.2], np.float32),
}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return iris_checkpoint(tmp_path_factory.mktemp("iris"))


def export_to(tmp_path, checkpoint, **fields) -> str:
    run = iris_run(tmp_path / "model", "export", fields=fields)
    return export.export(run, create(run.config), checkpoint)


def test_the_serving_signature_gives_the_keras_models_predictions(tmp_path, checkpoint):
    exported = export_to(tmp_path, checkpoint, export_dir=str(tmp_path / "served"))
    assert exported == str(tmp_path / "served")
    serving = tf.saved_model.load(exported).signatures["serving_default"]
    # Named inputs with any batch size: all four rows, and one.
    outputs = serving(**feature_columns(ROWS))
    logits = restored_iris(checkpoint)(feature_columns(ROWS), training=False).numpy()
    assert set(outputs) == {"class_ids", "probabilities", "logits"}
    np.testing.assert_allclose(outputs["logits"].numpy(), logits, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        outputs["probabilities"].numpy(), keras.ops.softmax(logits), rtol=1e-5
    )
    assert outputs["class_ids"].numpy().tolist() == logits.argmax(axis=1).tolist()
    one = serving(**{name: tf.constant(values[:1]) for name, values in ROWS.items()})
    np.testing.assert_allclose(one["logits"].numpy(), logits[:1], rtol=1e-5, atol=1e-6)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]  # no temporary left


def test_the_default_target_is_model_dir_export_timestamp_never_an_existing_one(
    tmp_path, checkpoint, monkeypatch
):
    monkeypatch.setattr(export.time, "time", lambda: 1795294096.7)
    first, second = export_to(tmp_path, checkpoint), export_to(tmp_path, checkpoint)
    assert first == str(tmp_path / "model" / "export" / "1795294096")
    assert second == str(tmp_path / "model" / "export" / "1795294097")
    assert sorted(p.name for p in (tmp_path / "model" / "export").iterdir()) == [
        "1795294096",
        "1795294097",
    ]


def test_an_existing_non_empty_export_dir_is_refused_and_left_alone(tmp_path, checkpoint):
    target = tmp_path / "served"
    target.mkdir()
    (target / "keep.txt").write_text("someone's file")
    with pytest.raises(UsageError) as raised:
        export_to(tmp_path, checkpoint, export_dir=str(target))
    assert str(raised.value) == f"--export_dir={target} exists and is not empty; pick a new one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]
    assert [p.name for p in target.iterdir()] == ["keep.txt"]


def test_an_existing_empty_export_dir_is_used(tmp_path, checkpoint):
    (tmp_path / "served").mkdir()
    exported = export_to(tmp_path, checkpoint, export_dir=str(tmp_path / "served"))
    assert (tmp_path / "served" / "saved_model.pb").is_file()
    assert exported == str(tmp_path / "served")


def test_a_failed_write_leaves_no_temporary_directory_and_no_export(
    tmp_path, checkpoint, monkeypatch
):
    def write_half_then_fail(self, path, **kwargs):
        tf.io.gfile.makedirs(tf.io.gfile.join(path, "variables"))
        with tf.io.gfile.GFile(tf.io.gfile.join(path, "saved_model.pb"), "w") as f:
            f.write("half")
        raise OSError("No space left on device")

    # ExportArchive() makes an archive of the backend's own class: patch that one.
    monkeypatch.setattr(type(keras.export.ExportArchive()), "write_out", write_half_then_fail)
    with pytest.raises(OSError, match="No space left on device"):
        export_to(tmp_path, checkpoint, export_dir=str(tmp_path / "exports" / "served"))
    assert list((tmp_path / "exports").iterdir()) == []


def test_serving_input_spec_names_the_features(checkpoint):
    spec = export.serving_input_spec(create(iris_run("/unused").config))
    assert {name: (s.name, s.shape.as_list(), s.dtype) for name, s in spec.items()} == {
        name: (name, [None], tf.float32) for name in ROWS
    }
