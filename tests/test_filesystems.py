"""Every path a run touches goes through TensorFlow's file systems: a whole run in ram://.

ram:// is TensorFlow's in-memory file system: nothing of it is on disk, so an
open(), os.path or shutil call on a data, model_dir or export path would fail
there (gs:// works the same way, through the same calls). It lives inside one
process only, so one Python process runs train, eval, predict and export through
`tpurun.cli.main`, which also shows that main() can run several times in a process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import OFFLINE_ENV, contents

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json
import tensorflow as tf
from tpurun import cli
from tpurun.models import iris

data = "ram://data/iris_training.csv"
tf.io.gfile.makedirs("ram://data")
tf.io.gfile.copy(iris.shipped_csv("iris_training.csv"), data)
common = ["--config=iris", "--use_tpu=false", "--model_dir=ram://runs/iris",
          f"--config.data.train_path={data}"]
codes = []
for command, *flags in [
    ("train", "--train_steps=20", "--iterations=10"),
    ("eval",),
    ("predict", "--output=ram://out/predictions.jsonl"),
    ("export",),  # to ram://runs/iris/export/<timestamp>
    ("export", "--export_dir=ram://exports/iris"),
]:
    codes.append([command, cli.main(["tpurun", command, *common, *flags])])
files = sorted(
    tf.io.gfile.join(directory, name)
    for root in ("ram://runs", "ram://out", "ram://exports")
    for directory, _, names in tf.io.gfile.walk(root)
    for name in names
)
with tf.io.gfile.GFile("ram://out/predictions.jsonl") as f:
    predictions = f.read().splitlines()
serving = tf.saved_model.load("ram://exports/iris").signatures["serving_default"]
served = serving(**{name: tf.constant([5.1, 5.9]) for name in iris.FEATURES})
print("RESULT " + json.dumps({
    "codes": codes, "files": files, "predictions": len(predictions),
    "served": served["class_ids"].shape.as_list(),
}))
"""


def test_train_eval_predict_export_in_ram(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    [line] = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    report = json.loads(line[len("RESULT ") :])
    assert report["codes"] == [
        ["train", 0],
        ["eval", 0],
        ["predict", 0],
        ["export", 0],
        ["export", 0],
    ], result.stderr
    files = report["files"]
    for path in (
        "ram://runs/iris/checkpoint",
        "ram://runs/iris/ckpt-20.index",
        "ram://runs/iris/eval/results-20.json",
        "ram://out/predictions.jsonl",
        "ram://exports/iris/saved_model.pb",
        "ram://exports/iris/variables/variables.index",
    ):
        assert path in files, files
    records = [f.rsplit("-", 1)[1] for f in files if f.startswith("ram://runs/iris/runs/")]
    assert sorted(records) == [
        "eval.json",
        "export.json",
        "export.json",
        "predict.json",
        "train.json",
    ]
    default_export = [f for f in files if f.startswith("ram://runs/iris/export/")]
    assert [f.rsplit("/", 1)[1] for f in default_export if "/variables/" not in f] == [
        "fingerprint.pb",
        "saved_model.pb",
    ], default_export
    assert not [f for f in files if ".tmp" in f], "temporary files left behind"
    assert report["predictions"] == 3 and report["served"] == [2]
    assert contents(tmp_path) == set(), "nothing may be written to the local disk"
