"""Malformed TFRecords through the real CLI: one line naming the file and the record.

A bad record fails deep inside tf.data, in the compiled loop, as an
InvalidArgumentError or DataLossError whose message names an op, not a file; the
launcher then asks the model (`Model.diagnose_data`) which record it was. Every
case starts from valid synthetic digits (40 training records in two files of 20,
20 test records) and breaks one thing. (Malformed CSVs: tests/test_cli_errors.py.)
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import RUN_FAILURE, assert_fails, assert_ok, contents, tpurun_in_process
from synthetic_images import write_digit_records

# A small network and a few steps: each case fails within the first loop.
TINY = (
    "--config=mnist",
    "--use_tpu=false",
    "--config.conv_filters=(4, 8)",
    "--config.hidden_units=16",
    "--config.data.shuffle_buffer=10",
    "--batch_size=8",
    "--eval_batch_size=8",
    "--predict_batch_size=8",
    "--train_steps=10",
    "--iterations=5",
)
BAD_FILE = "train-00001-of-00002.tfrecord"  # of train-0000{0,1}-of-00002.tfrecord


def rewrite_record(path: Path, index: int, change: Callable) -> None:
    """Applies `change` to the features of record `index` (from 0) of a TFRecord file."""
    import tensorflow as tf

    records = [record.numpy() for record in tf.data.TFRecordDataset(str(path))]
    example = tf.train.Example.FromString(records[index])
    change(example.features.feature)
    records[index] = example.SerializeToString()
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def label_as_float(features) -> None:
    features["label"].Clear()
    features["label"].float_list.value.append(3.0)


def image_as_int64(features) -> None:
    features["image_raw"].Clear()
    features["image_raw"].int64_list.value.extend([1, 2, 3])


def image_of_700_bytes(features) -> None:
    features["image_raw"].bytes_list.value[0] = bytes(700)


def label_10(features) -> None:
    features["label"].int64_list.value[0] = 10


def cut_the_end(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-10])


def overwrite_with_text(path: Path) -> None:
    path.write_text("image,label\n" * 100)


# name -> (what it does to the bad file, the keywords of the error line)
BROKEN_RECORDS = {
    "label_is_a_float": (
        lambda path: rewrite_record(path, 7, label_as_float),
        ["record 8:", "feature 'label' holds 1 float value, not one int64 value", "convert_mnist"],
    ),
    "image_is_int64": (
        lambda path: rewrite_record(path, 7, image_as_int64),
        ["record 8:", "feature 'image_raw' holds 3 int64 values, not one bytes value"],
    ),
    "image_has_700_bytes": (
        lambda path: rewrite_record(path, 7, image_of_700_bytes),
        ["record 8:", "feature 'image_raw' has 700 bytes, not 784"],
    ),
    "label_out_of_range": (
        lambda path: rewrite_record(path, 7, label_10),
        ["record 8:", "label 10 is not a class id in 0..9"],
    ),
    "truncated_file": (
        cut_the_end,
        [
            "record 20:",
            "the file ends inside this record (truncated",
            "write or copy the file again",
        ],
    ),
    "not_a_tfrecord_file": (
        overwrite_with_text,
        ["record 1:", "not a TFRecord file", "pass only TFRecord files"],
    ),
}


@pytest.fixture(scope="module")
def clean_data(tmp_path_factory) -> Path:
    return write_digit_records(
        tmp_path_factory.mktemp("digits"), train=40, test=20, examples_per_file=20
    )


@pytest.fixture
def data_dir(clean_data, tmp_path) -> Path:
    """A private copy of the clean digits, for one test to break."""
    return Path(shutil.copytree(clean_data, tmp_path / "data"))


# Through the CLI, one case per place a bad record fails training's compiled loop: in tf.data
# (an InvalidArgumentError: the image's reshape; parse_example's own, in predict below), in
# the loss (a label out of range) and in the reader (a DataLossError). Every case's line, from
# the broken file on: test_every_broken_record_is_named.
THROUGH_THE_CLI = ("image_has_700_bytes", "label_out_of_range", "truncated_file")


@pytest.mark.slow
@pytest.mark.parametrize(
    "corrupt, keywords",
    [BROKEN_RECORDS[name] for name in THROUGH_THE_CLI],
    ids=list(THROUGH_THE_CLI),
)
def test_malformed_train_record_is_named_and_leaves_no_model_dir(
    tpurun_cli, tmp_path, data_dir, corrupt, keywords
):
    corrupt(data_dir / BAD_FILE)
    before = contents(tmp_path)
    result = tpurun_cli(
        "train", *TINY, f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'model'}", cwd=tmp_path
    )
    assert_fails(result, RUN_FAILURE, f"data file {data_dir / BAD_FILE}, ", *keywords)
    # No checkpoint, no run record: the model_dir this train created is removed again.
    assert contents(tmp_path) == before


@pytest.mark.slow
def test_empty_train_files_say_there_are_no_examples(tpurun_cli, tmp_path, data_dir):
    """Zero records would make training wait forever for its first batch."""
    files = sorted(data_dir.glob("train-*.tfrecord"))
    for path in files:
        path.write_bytes(b"")
    before = contents(tmp_path)
    result = tpurun_cli(
        "train", *TINY, f"--data_dir={data_dir}", f"--model_dir={tmp_path / 'model'}", cwd=tmp_path
    )
    assert_fails(
        result, RUN_FAILURE, "no examples", "empty (0 bytes)", *(str(path) for path in files)
    )
    assert contents(tmp_path) == before


@pytest.fixture(scope="module")
def trained(clean_data, tmp_path_factory) -> Path:
    """A tiny mnist model_dir trained on the clean digits, for the eval and predict cases."""
    model_dir = tmp_path_factory.mktemp("mnist") / "model"
    assert_ok(
        tpurun_in_process("train", *TINY, f"--data_dir={clean_data}", f"--model_dir={model_dir}")
    )
    return model_dir


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, corrupt, keywords",
    [  # a DataLossError in eval's loop, an InvalidArgumentError in predict's
        ("eval", cut_the_end, ["record 20:", "the file ends inside this record"]),
        ("predict", BROKEN_RECORDS["image_is_int64"][0], ["record 8:", "feature 'image_raw'"]),
    ],
    ids=["eval_truncated", "predict_image_is_int64"],
)
def test_malformed_eval_or_predict_record_is_named_and_writes_nothing(
    tpurun_cli, trained, data_dir, tmp_path, command, corrupt, keywords
):
    bad = data_dir / "test-00000-of-00001.tfrecord"
    corrupt(bad)
    model_dir = Path(shutil.copytree(trained, tmp_path / "model"))
    before = contents(model_dir)
    result = tpurun_cli(
        command, *TINY, f"--data_dir={data_dir}", f"--model_dir={model_dir}", cwd=tmp_path
    )
    assert_fails(result, RUN_FAILURE, f"data file {bad}, ", *keywords)
    assert contents(model_dir) == before, "no eval results, no run record"


def test_find_bad_record_passes_clean_files_and_names_a_bad_one(clean_data, tmp_path):
    from tpurun.models import image_records

    from tpurun.model import Mode

    files = sorted(str(path) for path in clean_data.glob("*.tfrecord"))
    assert image_records.find_bad_record(files, Mode.TRAIN) is None
    bad = Path(shutil.copy(clean_data / BAD_FILE, tmp_path))
    rewrite_record(bad, 3, label_10)
    assert image_records.find_bad_record([str(bad)], Mode.TRAIN) == (
        f"data file {bad}, record 4: label 10 is not a class id in 0..9; fix the label"
    )
    # Predict ignores labels: not a reason for its failure.
    assert image_records.find_bad_record([str(bad)], Mode.PREDICT) is None


@pytest.mark.parametrize("name", list(BROKEN_RECORDS))
def test_every_broken_record_is_named(clean_data, tmp_path, name):
    """The line the CLI prints for each broken file (the diagnosis, without a training run)."""
    from tpurun.models import image_records

    from tpurun.model import Mode

    corrupt, keywords = BROKEN_RECORDS[name]
    bad = Path(shutil.copy(clean_data / BAD_FILE, tmp_path))
    corrupt(bad)
    line = image_records.find_bad_record([str(bad)], Mode.TRAIN)
    assert line is not None and line.startswith(f"data file {bad}, ")
    missing = [k for k in keywords if k not in line]
    assert not missing, f"{missing} not in {line!r}"
