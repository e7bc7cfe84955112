"""Iris end to end through the real CLI (in-process): train, eval, predict, export, on 1, 2
and 8 replicas; the export also under the TF1-style loader of saved_model_cli and TF Serving."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_ok, tpurun_in_process

pytestmark = pytest.mark.slow

FEATURES = ("SepalLength", "SepalWidth", "PetalLength", "PetalWidth")


def checkpoint_weights(model_dir: Path, step: int) -> dict[str, np.ndarray]:
    """Every variable in the checkpoint: model weights and optimizer slots."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(model_dir / f"ckpt-{step}"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name.endswith("VARIABLE_VALUE") and not name.startswith("save_counter")
    }


def eval_results(model_dir: Path, step: int) -> dict:
    return json.loads((model_dir / "eval" / "test" / f"results-{step}.json").read_text())


def write_rows(path: Path, rows: int) -> np.ndarray:
    """Writes the first `rows` test rows (features only, with a header) to a CSV."""
    from tpurun.models import iris

    test = iris.read_csv(iris.shipped_csv("iris_test.csv"), with_labels=True)
    features = test[list(FEATURES)].iloc[:rows]
    features.to_csv(path, index=False)
    return features.to_numpy()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def reference_eval(trained_iris) -> tuple[str, dict]:
    """`tpurun eval` of the default config's model (its batch 32 > 30 rows: one padded batch):
    its stdout and results."""
    result = assert_ok(tpurun_in_process("eval", "--config=iris", f"--model_dir={trained_iris}"))
    return result.stdout, eval_results(trained_iris, 1000)


def test_default_config_reaches_090_and_predicts_the_tutorial_examples(
    tpurun_cli, trained_iris, reference_eval
):
    stdout, results = reference_eval
    assert "(30 examples)" in stdout
    assert results["accuracy"] >= 0.9

    result = assert_ok(tpurun_cli("predict", "--config=iris", f"--model_dir={trained_iris}"))
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 3
    for line, species in zip(lines, ("Setosa", "Versicolor", "Virginica"), strict=True):
        assert line.startswith(f'Prediction is "{species}" (')
        assert line.endswith(f'%), expected "{species}"')


def test_run_record_written_with_versions(trained_iris):
    records = sorted((trained_iris / "runs").glob("*-train.json"))
    assert records, "train wrote no run record"
    record = json.loads(records[0].read_text())
    assert record["run_config"]["config"]["model"] == "iris"
    assert record["run_config"]["config"]["train"]["batch_size"] == 32
    assert set(record["versions"]) == {"tpurun", "tensorflow", "python"}


@pytest.fixture(scope="module")
def one_and_eight(tmp_path_factory) -> tuple[Path, dict[int, str]]:
    """The same 20 steps (seed 7) trained on 1 and on 8 replicas: (root, stderr by shards)."""
    root = tmp_path_factory.mktemp("replicas")
    logs = {}
    for shards in (1, 8):
        result = tpurun_in_process(
            "train",
            "--config=iris",
            "--use_tpu=false",
            f"--num_shards={shards}",
            # The plain host loop on 1 replica too, as 8 run (XLA's, config.train.xla="auto"'s
            # pick for Iris on 1, compiled by XLA first, is test_device_data.py's).
            "--config.train.xla=false",
            f"--train_steps={REPLICA_STEPS}",
            f"--iterations={REPLICA_STEPS}",
            "--seed=7",
            f"--model_dir={root / str(shards)}",
        )
        logs[shards] = assert_ok(result).stderr
    return root, logs


# One host loop of 20 steps: the 8 replicas' step (traced once, run 8 times a step) is the
# cost, and 20 steps of Adagrad carry any difference of the gradients into the weights.
REPLICA_STEPS = 20


def test_eight_shards_split_the_global_batch(one_and_eight):
    log = one_and_eight[1][8]
    assert "8 logical CPU replicas (MirroredStrategy)" in log
    assert "Global batch 32 split over 8 replica(s): 4 examples per replica" in log


def test_eight_replicas_get_the_same_global_batch_in_eight_slices():
    """Each replica gets 4 rows, and together they are the 1-replica batch of 32, in order."""
    import ml_collections
    import tensorflow as tf
    from tpurun.models.iris import Iris

    from tpurun import inputs
    from tpurun.cluster import strategy
    from tpurun.model import Mode
    from tpurun.run_config import config_files

    config = ml_collections.FrozenConfigDict(config_files.load(config_files.resolve("iris")))
    eight = strategy.local(8).strategy
    model = Iris(config)
    dist = inputs.distribute(eight, model, Mode.TRAIN, 32, seed=0)
    first = next(iter(dist))
    per_replica = eight.experimental_local_results(first[1])
    assert [int(t.shape[0]) for t in per_replica] == [4] * 8, per_replica
    single = next(iter(inputs.distribute(tf.distribute.get_strategy(), model, Mode.TRAIN, 32, 0)))
    np.testing.assert_array_equal(tf.concat(per_replica, 0).numpy(), single[1].numpy())


def test_one_and_eight_replicas_reach_the_same_weights(one_and_eight):
    tmp_path, steps = one_and_eight[0], REPLICA_STEPS
    one, eight = (
        checkpoint_weights(tmp_path / "1", steps),
        checkpoint_weights(tmp_path / "8", steps),
    )
    assert one.keys() == eight.keys() and len(one) >= 12
    # The model's variables are saved as model_variables/<i> (trainer.checkpoint).
    weights = [k for k in one if k.startswith("model_variables/")]
    assert len(weights) == 6
    worst = max(float(np.max(np.abs(one[k] - eight[k]))) for k in weights)
    assert worst < 1e-5, f"max abs weight difference {worst}"
    # Adagrad's accumulators grow into the hundreds: equal up to float32 rounding.
    for name in set(one) - set(weights):
        np.testing.assert_allclose(eight[name], one[name], rtol=1e-5, err_msg=name)


def test_default_model_dir_resumes_from_the_checkpoint_to_train_steps(tpurun_cli, tmp_path):
    """No --model_dir: ./iris (named after the config), and no --use_tpu: locally; a second
    train resumes there, and eval finds it too."""
    # The plain host loop: not what this test is about (test_device_data.py's).
    common = ("--config=iris", "--iterations=10", "--config.train.xla=false")
    first = assert_ok(tpurun_cli("train", *common, "--train_steps=20", cwd=tmp_path))
    assert f"using {tmp_path / 'iris'}" in first.stderr
    assert "running locally" in first.stderr
    model_dir = tmp_path / "iris"
    assert (model_dir / "ckpt-20.index").exists()
    resumed = assert_ok(tpurun_cli("train", *common, "--train_steps=40", cwd=tmp_path))
    assert "(step 20)" in resumed.stderr
    assert "Training from step 20 to 40" in resumed.stderr
    assert "step 30/40" in resumed.stderr and "step 40/40" in resumed.stderr
    assert "step 10/40" not in resumed.stderr
    assert (model_dir / "ckpt-40.index").exists()
    again = assert_ok(tpurun_cli("train", *common, "--train_steps=40", cwd=tmp_path))
    assert "nothing to train" in again.stderr
    evaluated = assert_ok(tpurun_cli("eval", "--config=iris", cwd=tmp_path))
    assert "(30 examples)" in evaluated.stdout


@pytest.mark.parametrize(
    "batch_flags",
    [
        # Two replicas of 2 rows: 30 = 7 x 4 + 2, the last batch a replica of 2 rows and a
        # whole replica of padding (the path of 8 replicas' whole replicas of padding). (One
        # replica with a padded batch: reference_eval's batch of 32; every batch and replica
        # count is checked against the metrics on the 30 rows in test_evaluate.py.)
        pytest.param(("--eval_batch_size=4", "--num_shards=2"), id="batch4-2replicas"),
    ],
)
def test_eval_counts_exactly_the_30_examples(
    tpurun_cli, trained_iris, reference_eval, tmp_path, batch_flags
):
    model_dir = tmp_path / "copy"
    shutil.copytree(trained_iris, model_dir)
    result = assert_ok(
        tpurun_cli("eval", "--config=iris", f"--model_dir={model_dir}", *batch_flags)
    )
    assert "(30 examples)" in result.stdout
    results, reference = eval_results(model_dir, 1000), reference_eval[1]
    assert results["num_examples"] == 30
    # However the 30 rows are batched and padded, the metrics are the same.
    assert results["accuracy"] == pytest.approx(reference["accuracy"], abs=1e-6)
    assert results["loss"] == pytest.approx(reference["loss"], rel=1e-5)


def predict_rows(model_dir: Path, tmp_path: Path, rows: Path, *flags: str) -> list[dict]:
    """`tpurun predict --input=rows --output=...` and its JSON lines."""
    out = tmp_path / "out.jsonl"
    assert_ok(
        tpurun_in_process(
            "predict",
            "--config=iris",
            f"--model_dir={model_dir}",
            f"--input={rows}",
            f"--output={out}",
            *flags,
        )
    )
    return read_jsonl(out)


# On 2 replicas through the CLI (one replica: the export test below; the padding on 1 and 8
# replicas, row by row: test_predict.py).
@pytest.mark.parametrize("shards", [2])
def test_predict_7_rows_with_batch_4_returns_7_rows_in_order(trained_iris, tmp_path, shards):
    rows = tmp_path / "rows.csv"
    write_rows(rows, 7)
    predictions = predict_rows(
        trained_iris, tmp_path, rows, "--predict_batch_size=4", f"--num_shards={shards}"
    )
    assert len(predictions) == 7
    # The test rows' labels: 1,2,0,1,1,1,0 -- a trained model gets these in order.
    assert [p["class_ids"] for p in predictions] == [1, 2, 0, 1, 1, 1, 0]
    for p in predictions:
        assert sum(p["probabilities"]) == pytest.approx(1.0, abs=1e-5)


def test_default_export_runs_under_the_tf1_loader_and_matches_predict(
    tpurun_cli, trained_iris, tmp_path
):
    rows = tmp_path / "rows.csv"
    features = write_rows(rows, 7)
    predictions = predict_rows(trained_iris, tmp_path, rows)  # one replica, the config's batch
    assert len(predictions) == 7
    predicted = np.array([p["probabilities"] for p in predictions])

    # No --export_dir: <model_dir>/export/<timestamp>, and nothing else left there.
    model_dir = tmp_path / "copy"
    shutil.copytree(trained_iris, model_dir)
    result = assert_ok(tpurun_cli("export", "--config=iris", f"--model_dir={model_dir}"))
    exports = list((model_dir / "export").iterdir())
    assert len(exports) == 1 and exports[0].name.isdigit()
    export_dir = exports[0]
    assert str(export_dir) in result.stdout
    assert (export_dir / "saved_model.pb").exists()

    import tensorflow as tf

    # The TF1-style loader that `saved_model_cli run` (docs/predict-export.md) and TF Serving
    # use: a session over the serve MetaGraph, fed and fetched by the signature's tensor names.
    # In this process: saved_model_cli's own module defines absl flags in the global FLAGS,
    # which tpurun's in-process runs parse.
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
        meta_graph = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(export_dir))
        signature = meta_graph.signature_def["serving_default"]
        feed = {
            signature.inputs[name].name: features[:, i].astype(np.float32)
            for i, name in enumerate(FEATURES)
        }
        fetched = session.run(
            {key: signature.outputs[key].name for key in ("probabilities", "class_ids")}, feed
        )
    np.testing.assert_allclose(fetched["probabilities"], predicted, atol=1e-5)
    np.testing.assert_array_equal(fetched["class_ids"], predicted.argmax(axis=1))

    serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    outputs = serving(**{name: tf.constant(features[:, i]) for i, name in enumerate(FEATURES)})
    np.testing.assert_allclose(outputs["probabilities"].numpy(), predicted, atol=1e-5)
