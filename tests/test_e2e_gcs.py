"""Iris end to end on gs://: model_dir, data and predictions in a bucket of the test GCS server.

train, eval, predict and export run in this process through `tpurun.cli.main` (the proxy
is a process of its own, so TensorFlow holding the GIL during gs:// I/O cannot stall it).
Every storage request goes through the proxy: none may be refused (a host other than
Google's storage API) or ask for a token. (That a fresh process finds its way to the
bucket from the environment alone, TensorFlow's client and the lease's gcsfs, and asks
for no token either: the trainer process of tests/test_gcs_lease.py.)
"""

from __future__ import annotations

import json
import logging

import pytest
import tensorflow as tf
from absl.testing import flagsaver
from conftest import assert_ok
from tpurun.models import iris

from tpurun import cli

pytestmark = pytest.mark.slow


@pytest.fixture
def iris_on_gcs(bucket) -> list[str]:
    """The common flags of a run whose model_dir and data are in `bucket`."""
    for name in ("iris_training.csv", "iris_test.csv"):
        tf.io.gfile.copy(iris.shipped_csv(name), f"{bucket}/data/{name}")
    return [
        "--config=iris",
        "--use_tpu=false",
        f"--model_dir={bucket}/iris",
        f"--config.data.train_path={bucket}/data/iris_training.csv",
        f"--config.data.eval_path={bucket}/data/iris_test.csv",
    ]


def test_train_eval_predict_export(bucket, gcs, iris_on_gcs, tpurun_cli):
    model_dir = f"{bucket}/iris"
    result = assert_ok(tpurun_cli("train", *iris_on_gcs, "--train_steps=20", "--iterations=10"))
    assert f"Saved checkpoint {model_dir}/ckpt-20." in result.stderr
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"

    result = assert_ok(tpurun_cli("eval", *iris_on_gcs))
    assert "eval at step 20 on test:" in result.stdout and "(30 examples)" in result.stdout
    with tf.io.gfile.GFile(f"{model_dir}/eval/test/results-20.json") as f:
        assert json.load(f)["global_step"] == 20

    # predict through `tpurun.cli.main` itself, as a program embedding tpurun calls it,
    # after the runs above in this process (main() runs several times in one process).
    output = f"{bucket}/out/predictions.jsonl"
    # main() sets the levels of the progress lines (the root's and absl's loggers): put
    # back, or a later test of this worker would see no INFO line.
    levels = logging.root.level, logging.getLogger("absl").level
    try:
        with flagsaver.flagsaver():
            assert cli.main(["tpurun", "predict", *iris_on_gcs, f"--output={output}"]) == 0
    finally:
        logging.root.setLevel(levels[0])
        logging.getLogger("absl").setLevel(levels[1])
    with tf.io.gfile.GFile(output) as f:
        assert len(f.read().splitlines()) == 3

    result = assert_ok(tpurun_cli("export", *iris_on_gcs))
    [export_dir] = result.stdout.split()
    assert export_dir.startswith(f"{model_dir}/export/")
    serving = tf.saved_model.load(export_dir).signatures["serving_default"]
    served = serving(**{name: tf.constant([5.1, 5.9]) for name in iris.FEATURES})
    assert served["class_ids"].shape == (2,)

    assert not [r for r in gcs.requests if r.kind in ("refused", "auth")], gcs.requests
    files = [name for _, _, names in tf.io.gfile.walk(model_dir) for name in names]
    assert not [name for name in files if ".tmp" in name], files
