"""A learnable synthetic digit set with the MNIST schema, written as TFRecords for the tests.

Ten fixed random 28x28 prototypes, one per class; every example is its class's
prototype plus noise, clipped to uint8. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

PROTOTYPE_SEED = 1234


def digits(count: int, seed: int, noise: float = 60.0) -> tuple[np.ndarray, np.ndarray]:
    """`count` uint8 images [count, 28, 28] and int64 labels, classes in turn."""
    prototypes = np.random.default_rng(PROTOTYPE_SEED).integers(0, 256, size=(10, 28, 28))
    rng = np.random.default_rng(seed)
    labels = np.arange(count) % 10
    rng.shuffle(labels)
    images = prototypes[labels] + rng.normal(0, noise, size=(count, 28, 28))
    return np.clip(np.round(images), 0, 255).astype(np.uint8), labels.astype(np.int64)


def write_digit_records(
    data_dir: Path, train: int = 400, test: int = 100, examples_per_file: int = 100
) -> Path:
    """train-*.tfrecord and test-*.tfrecord in data_dir (what convert_mnist.py writes)."""
    from tpurun.models import image_records

    for split, count, seed in (("train", train, 1), ("test", test, 2)):
        images, labels = digits(count, seed)
        image_records.write_records(images, labels, str(data_dir), split, examples_per_file)
    return data_dir


def check_image_model(
    config: str,
    tmp_path: Path,
    overrides: tuple[str, ...],
    min_accuracy: float,
    num_shards: int = 1,
    resume_to: int | None = None,
) -> float:
    """Trains `config` on the synthetic digits through the CLI (in-process), then evals,
    predicts, exports, and with `resume_to` trains on to that step.

    Checks: the train ran under op determinism (the CPU's default) with its input wait
    measured; eval accuracy >= min_accuracy on the 100 test digits; predict gives one
    row per test record, in record order (so mostly the true labels); the export
    has saved_model.pb and its signature, fed serialized tf.Examples, agrees with
    predict; the second train resumes from the first's last checkpoint. Returns the
    eval accuracy.
    """
    import json

    import tensorflow as tf
    from conftest import assert_ok, tpurun_in_process
    from tpurun.models import image_records

    data_dir = write_digit_records(tmp_path / "data")
    model_dir = tmp_path / "model"
    common = (
        f"--config={config}",
        f"--data_dir={data_dir}",
        f"--model_dir={model_dir}",
        *overrides,
    )
    local = ("--use_tpu=false", f"--num_shards={num_shards}")
    trained = assert_ok(tpurun_in_process("train", *common, *local))
    # config.train.deterministic='auto' turns op determinism on on a CPU, which refuses
    # tf.timestamp: the input wait is timed by the host's clock, and measured all the same.
    assert "Resumes are bit-identical: deterministic kernels" in trained.stderr
    (record,) = (model_dir / "runs").glob("*-train.json")
    loops = json.loads(record.read_text())["goodput"]["loops"]
    assert 0 < loops["input_seconds"] < loops["seconds"], loops
    result = assert_ok(tpurun_in_process("eval", *common, *local))
    assert "(100 examples)" in result.stdout, result.stdout
    results = model_dir / "eval" / "test"  # the models' one split
    step = max(int(p.stem.split("-")[1]) for p in results.glob("results-*.json"))
    accuracy = json.loads((results / f"results-{step}.json").read_text())["accuracy"]
    assert accuracy >= min_accuracy, f"{config}: accuracy {accuracy} < {min_accuracy}"

    test_files = sorted(str(p) for p in data_dir.glob("test-*.tfrecord"))
    output = tmp_path / "predictions.jsonl"
    assert_ok(
        tpurun_in_process(
            "predict", *common, *local, f"--input={data_dir}/test-*", f"--output={output}"
        )
    )
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    images, labels = image_records.read_arrays(test_files)
    assert len(rows) == len(labels) == 100
    predicted = [row["class_ids"] for row in rows]
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-4 for row in rows)
    assert sum(p == y for p, y in zip(predicted, labels, strict=True)) >= min_accuracy * 100

    export_dir = tmp_path / "export"
    assert_ok(tpurun_in_process("export", *common, f"--export_dir={export_dir}"))
    assert (export_dir / "saved_model.pb").is_file()
    serving = tf.saved_model.load(str(export_dir)).signatures["serving_default"]
    examples = [image_records.example(x, 0).SerializeToString() for x in images[:10]]
    served = serving(examples=tf.constant(examples))
    assert served["class_ids"].numpy().tolist() == predicted[:10]

    if resume_to is not None:
        result = assert_ok(
            tpurun_in_process("train", *common, *local, f"--train_steps={resume_to}")
        )
        assert f"Resuming from {model_dir / f'ckpt-{step}'} (step {step})." in result.stderr
        assert (model_dir / f"ckpt-{resume_to}.index").is_file()
    return accuracy
