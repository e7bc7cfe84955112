"""Every path a run touches goes through TensorFlow's file systems: a whole run in ram://.

ram:// is TensorFlow's in-memory file system: nothing of it is on disk, so an
open(), os.path or shutil call on a data, model_dir or export path would fail
there (gs:// works the same way, through the same calls). It lives inside one
process only: train, eval, predict and export run in this one, through
`tpurun.cli.main`, which also shows that main() can run several times in a process.
"""

from __future__ import annotations

import pytest
from conftest import contents

pytestmark = pytest.mark.slow


def ram_files(*roots: str) -> list[str]:
    import tensorflow as tf

    return sorted(
        tf.io.gfile.join(directory, name)
        for root in roots
        for directory, _, names in tf.io.gfile.walk(root)
        for name in names
    )


def test_train_eval_predict_export_in_ram(tpurun_cli, tmp_path):
    import tensorflow as tf
    from tpurun.models import iris

    ram = f"ram://{tmp_path.name}"  # this test's own corner of the process's ram://
    data = f"{ram}/data/iris_training.csv"
    tf.io.gfile.makedirs(f"{ram}/data")
    tf.io.gfile.copy(iris.shipped_csv("iris_training.csv"), data)
    common = ["--config=iris", "--use_tpu=false", f"--model_dir={ram}/runs/iris",
              f"--config.data.train_path={data}"]  # fmt: skip
    codes, errors = [], []
    for command, *flags in [
        ("train", "--train_steps=20", "--iterations=10"),
        ("eval",),
        ("predict", f"--output={ram}/out/predictions.jsonl"),
        ("export",),  # to <model_dir>/export/<timestamp>
        ("export", f"--export_dir={ram}/exports/iris"),
    ]:
        result = tpurun_cli(command, *common, *flags, cwd=tmp_path)
        codes.append([command, result.returncode])
        errors.append(result.stderr)
    assert codes == [
        ["train", 0],
        ["eval", 0],
        ["predict", 0],
        ["export", 0],
        ["export", 0],
    ], errors
    files = [
        f.replace(ram, "ram:/") for f in ram_files(f"{ram}/runs", f"{ram}/out", f"{ram}/exports")
    ]
    with tf.io.gfile.GFile(f"{ram}/out/predictions.jsonl") as f:
        predictions = f.read().splitlines()
    serving = tf.saved_model.load(f"{ram}/exports/iris").signatures["serving_default"]
    served = serving(**{name: tf.constant([5.1, 5.9]) for name in iris.FEATURES})
    for path in (
        "ram://runs/iris/checkpoint",
        "ram://runs/iris/ckpt-20.index",
        "ram://runs/iris/eval/test/results-20.json",
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
    assert len(predictions) == 3 and served["class_ids"].shape.as_list() == [2]
    assert contents(tmp_path) == set(), "nothing may be written to the local disk"
