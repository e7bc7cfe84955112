"""MNIST: the TFRecord reader (unit tests) and the model end to end through the CLI."""

from __future__ import annotations

import numpy as np
import pytest
from synthetic_images import check_image_model, digits, write_digit_records


def params(batch_size: int, pipelines: int = 1, pipeline: int = 0):
    from tpurun.model import InputParams

    return InputParams(
        batch_size=batch_size,
        global_batch_size=batch_size * pipelines,
        num_replicas=pipelines,
        input_pipeline_id=pipeline,
        num_input_pipelines=pipelines,
        seed=0,
    )


def read_all(dataset) -> tuple[np.ndarray, np.ndarray]:
    images, labels = [], []
    for features, label in dataset:
        images.append(features["image"].numpy())
        labels.append(label.numpy())
    return np.concatenate(images), np.concatenate(labels)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_digit_records(tmp_path_factory.mktemp("digits"), train=400, test=100)


def test_eval_reads_every_record_in_order_scaled_to_half_unit(data_dir):
    from tpurun.models import image_records

    from tpurun.model import Mode

    files = image_records.list_files(str(data_dir / "train-*.tfrecord"), "test")
    assert [f.rsplit("/", 1)[1] for f in files] == [
        f"train-0000{i}-of-00004.tfrecord" for i in range(4)
    ]
    images, labels = read_all(image_records.dataset(files, Mode.EVAL, params(64)))
    expected_images, expected_labels = digits(400, 1)
    np.testing.assert_array_equal(labels, expected_labels)
    assert labels.dtype == np.int32 and images.dtype == np.float32 and images.shape == (400, 784)
    np.testing.assert_allclose(images, expected_images.reshape(400, 784) / 255 - 0.5, atol=1e-6)


def test_train_batches_are_static_shuffled_and_repeat(data_dir):
    from tpurun.models import image_records

    from tpurun.model import Mode

    files = image_records.list_files(str(data_dir / "train-*"), "test")
    dataset = image_records.dataset(files, Mode.TRAIN, params(32), shuffle_buffer=100)
    assert dataset.element_spec[0]["image"].shape.as_list() == [32, 784]
    labels = np.concatenate([label.numpy() for _, label in dataset.take(25)])  # 2 epochs
    assert len(labels) == 800
    assert not np.array_equal(labels[:400], digits(400, 1)[1])  # shuffled
    assert set(np.unique(labels)) == set(range(10))
    rebuilt = image_records.dataset(files, Mode.TRAIN, params(32), shuffle_buffer=100)
    again = np.concatenate([label.numpy() for _, label in rebuilt.take(25)])
    np.testing.assert_array_equal(labels, again)  # the seed fixes the order


@pytest.mark.parametrize(
    "pattern, sharding",
    [("train-*", "by file: 4 files for 2 pipelines"), ("test-*", "by record: 1 file for 2")],
)
def test_two_input_pipelines_read_disjoint_halves(data_dir, pattern, sharding):
    from tpurun.models import image_records

    from tpurun.model import Mode

    files = image_records.list_files(str(data_dir / pattern), "test")
    halves = [
        read_all(image_records.dataset(files, Mode.EVAL, params(16, 2, pipeline)))[0]
        for pipeline in (0, 1)
    ]
    everything = read_all(image_records.dataset(files, Mode.EVAL, params(16)))[0]
    assert len(halves[0]) + len(halves[1]) == len(everything), sharding
    together = np.concatenate(halves)
    assert sorted(map(bytes, together)) == sorted(map(bytes, everything)), sharding


def test_missing_data_says_how_to_make_it(tpurun_cli, tmp_path):
    from conftest import error_lines

    result = tpurun_cli(
        "train", "--config=mnist", "--use_tpu=false", f"--model_dir={tmp_path / 'm'}"
    )
    assert result.returncode == 1
    [line] = error_lines(result)
    assert "--data_dir" in line and "convert_mnist.py" in line
    result = tpurun_cli("predict", "--config=iris", "--prompt=x", f"--model_dir={tmp_path}")
    assert result.returncode == 2
    assert "--prompt sets config key predict.prompt, which config 'iris' does not have" in (
        result.stderr
    )


@pytest.mark.slow
@pytest.mark.tpu_wheel  # the CNN's end-to-end run on tensorflow-tpu 2.20 too
def test_mnist_trains_to_090_on_synthetic_digits_and_predicts_exports_and_resumes(tmp_path):
    # 400 training digits (10 noisy prototypes), 100 test digits: a small CNN
    # (8 and 16 filters, 32 units) reaches >= 0.9 in 60 steps of batch 32 on 2
    # replicas (the default 32/64/128 network gets there too, just slower).
    overrides = (
        "--config.conv_filters=(8, 16)",
        "--config.hidden_units=32",
        "--config.optimizer.name=adam",
        "--config.optimizer.learning_rate=0.003",
        "--batch_size=32",
        "--train_steps=60",
        "--iterations=30",
        "--eval_batch_size=32",
        "--predict_batch_size=32",
    )
    # The resume: one host loop of 10 steps, all that resuming from the last checkpoint
    # needs (the loop's step count is a tensor: no retrace for a shorter loop).
    accuracy = check_image_model(
        "mnist", tmp_path, overrides, min_accuracy=0.9, num_shards=2, resume_to=70
    )
    print(f"mnist accuracy on the synthetic test digits: {accuracy:.4f}")


def test_epochs_count_the_records_the_data_hold_not_the_declared_60000(
    tpurun_cli, tmp_path, data_dir
):
    """config.data.train_examples says MNIST's 60,000; the data_dir holds 400 digits."""
    result = tpurun_cli(
        "train",
        "--config=mnist",
        f"--data_dir={data_dir}",
        "--use_tpu=false",
        "--num_shards=1",
        "--config.conv_filters=(8, 16)",
        "--config.hidden_units=32",
        "--batch_size=32",
        "--train_epochs=0.16",
        f"--model_dir={tmp_path / 'm'}",
    )
    assert result.returncode == 0, result.stderr
    where = "counted in the 4 TFRecord files of the training data"
    # One warning of the count (others, such as an input-bound one, depend on the machine).
    warned = [line for line in result.stderr.splitlines() if "train_examples" in line]
    assert (
        len(warned) == 1
        and warned[0].startswith("W")
        and warned[0].endswith(
            f"config.data.train_examples=60000, but the training data hold 400 examples ({where}): "
            "epochs count the 400."
        )
    ), warned
    said = f"--train_epochs=0.16: 2 steps (ceil(0.16 epochs x 400 training examples ({where}) "
    assert said in result.stderr
    assert (tmp_path / "m" / "ckpt-2.index").exists()
