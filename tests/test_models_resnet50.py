"""resnet50 (configs/resnet50.py's cpu variant) on synthetic JPEGs in imagenet_to_gcs's format.

One training of the module (in-process, 35 steps of 32 at 32x32: 5 host loops of 7,
one trace, evaluated at its end by the train), predicted and exported once; its model_dir, copied, is evaluated
and predicted from TFDS's imagenet2012 by name (TFDS's training input is checked to the
bit by the stream tests); a SIGKILLed run of the same flags, resumed for a host loop, has
the weights of the module's checkpoint of that step, bit for bit. The input's keyed crops are checked without training.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import forked
import numpy as np
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, assert_ok, tpurun_in_process
from synthetic_jpegs import TRAIN, VALIDATION, prepare_imagenet2012, write_imagenet, write_split
from test_resume import assert_bit_identical, group_survivors, latest
from tpurun.models import imagenet_records, resnet_preprocessing

from tpurun import datasets
from tpurun import model as model_lib
from tpurun.model import InputParams, Mode
from tpurun.run_config import config_files

pytestmark = pytest.mark.slow

STEPS = 35
# A save every 7 steps: the resumed run starts inside an epoch (10 steps of 32 examples).
CONFIG = "--config=resnet50:cpu"
TRAINED = (CONFIG, f"--train_steps={STEPS}", "--iterations=7", "--save_checkpoints_steps=7")
LOCAL = ("--use_tpu=false",)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return write_imagenet(tmp_path_factory.mktemp("imagenet"))


@pytest.fixture(scope="module")
def validation(data) -> tuple[list[bytes], np.ndarray]:
    """The validation JPEGs and classes 0..9, in file order (written again: the same)."""
    return write_split(data.parent / "again", "validation", VALIDATION, 2, seed=2)


@pytest.fixture(scope="module")
def trained(data, tmp_path_factory) -> dict:
    """The module's training (evaluated at its end), then predict and export."""
    root = tmp_path_factory.mktemp("resnet50")
    model_dir = root / "model"
    where = (f"--data_dir={data}", f"--model_dir={model_dir}")
    runs = {"model_dir": model_dir}
    # Evaluated by the train at its end (its model and input built once, not again by an
    # eval of its own; `tpurun eval` of the model: from_tfds's).
    evaluated = f"--eval_every={STEPS}"
    runs["train"] = assert_ok(tpurun_in_process("train", *TRAINED, evaluated, *where, *LOCAL))
    common = (CONFIG, *where)
    results = model_dir / "eval" / "validation" / f"results-{STEPS}.json"
    runs["results"] = json.loads(results.read_text())
    predictions = root / "predictions.jsonl"
    assert_ok(tpurun_in_process("predict", *common, *LOCAL, f"--output={predictions}"))
    runs["rows"] = [json.loads(line) for line in predictions.read_text().splitlines()]
    runs["export"] = root / "export"
    assert_ok(tpurun_in_process("export", *common, f"--export_dir={runs['export']}"))
    return runs


def test_it_trains_in_bfloat16_and_learns_the_classes(trained):
    log = trained["train"].stderr
    assert f"step {STEPS}/{STEPS}" in log
    assert trained["results"]["top_1_accuracy"] >= 0.5, trained["results"]  # chance: 0.1


def test_it_trains_under_op_determinism_with_its_input_wait_measured(trained):
    """config.train.deterministic='auto' on a CPU: TensorFlow's op determinism, which refuses
    tf.timestamp; the JPEG pipeline's wait is timed by the host's clock instead."""
    assert "Resumes are bit-identical: deterministic kernels" in trained["train"].stderr
    (record,) = (trained["model_dir"] / "runs").glob("*-train.json")
    loops = json.loads(record.read_text())["goodput"]["loops"]
    assert 0 < loops["input_seconds"] < loops["seconds"], loops


def test_eval_counts_every_validation_image_once(trained, validation):
    """90 images in batches of 32: the last one padded with 6 rows, none of them counted:
    the accuracy is that of predict's 90 rows."""
    assert f"({VALIDATION} examples)" in trained["train"].stdout
    _, labels = validation
    predicted = np.array([row["class_ids"] for row in trained["rows"]])
    exact = float(np.mean(predicted == labels))
    assert trained["results"]["top_1_accuracy"] == pytest.approx(exact, abs=1e-6)
    assert trained["results"]["top_5_accuracy"] >= exact


def test_predict_writes_one_row_per_validation_image_in_order(trained, validation):
    rows = trained["rows"]
    assert len(rows) == VALIDATION
    assert all(abs(sum(row["probabilities"]) - 1) < 1e-4 for row in rows)
    assert all(len(row["probabilities"]) == 10 for row in rows)


@pytest.fixture(scope="module")
def loaded(trained):
    """The module's export, loaded once for the tests that serve from it."""
    return tf.saved_model.load(str(trained["export"]))


def test_the_export_classifies_jpeg_bytes_as_predict_does(trained, loaded, validation):
    jpegs, _ = validation
    assert set(loaded.signatures) == {"serving_default", "serving_images"}
    served = loaded.signatures["serving_default"](image_bytes=tf.constant(jpegs))
    rows = trained["rows"]
    assert served["class_ids"].numpy().tolist() == [row["class_ids"] for row in rows]
    np.testing.assert_allclose(
        served["probabilities"].numpy(), [row["probabilities"] for row in rows], atol=1e-5
    )
    # The decoded-image signature, given the eval crops, serves the same.
    crops = tf.stack([resnet_preprocessing.eval_image(jpeg, 32) for jpeg in jpegs[:8]])
    images = loaded.signatures["serving_images"](image=crops)
    assert images["class_ids"].numpy().tolist() == served["class_ids"].numpy().tolist()[:8]


# --- the same from TFDS's imagenet2012 -----------------------------------------------------


@pytest.fixture(scope="module")
def tfds_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("tfds")
    prepare_imagenet2012(str(directory))
    return directory


@pytest.fixture(scope="module")
def from_tfds(trained, tfds_dir, tmp_path_factory) -> dict:
    """The module's training (a copy of its model_dir), evaluated and predicted from TFDS's
    imagenet2012 by name. Training from TFDS is not run again: its input is the one the
    stream tests check to the bit ([tfds]), the loop the one `trained` ran, and training
    by a TFDS name through the CLI is tests/test_datasets.py's."""
    root = tmp_path_factory.mktemp("resnet50-tfds")
    # Its checkpoints, not what its eval wrote: this eval's results are TFDS's own.
    shutil.copytree(trained["model_dir"], root / "model", ignore=shutil.ignore_patterns("eval"))
    where = (
        "--config.data.tfds_name=imagenet2012",
        f"--config.data.tfds_data_dir={tfds_dir}",
        f"--model_dir={root / 'model'}",
    )
    runs = {"eval": assert_ok(tpurun_in_process("eval", CONFIG, *where, *LOCAL))}
    results = root / "model" / "eval" / "validation" / f"results-{STEPS}.json"
    runs["results"] = json.loads(results.read_text())
    output = root / "predictions.jsonl"
    assert_ok(tpurun_in_process("predict", CONFIG, *where, *LOCAL, f"--output={output}"))
    runs["rows"] = [json.loads(line) for line in output.read_text().splitlines()]
    return runs


def test_tfds_evaluates_every_image_once_and_predicts(from_tfds):
    assert f"({VALIDATION} examples)" in from_tfds["eval"].stdout
    rows = from_tfds["rows"]
    assert len(rows) == VALIDATION and all(len(row["probabilities"]) == 10 for row in rows)


def test_the_export_classifies_the_tfds_splits_jpegs_as_predict_from_tfds_does(
    loaded, from_tfds, tfds_dir
):
    """The validation split's JPEGs, read by name in predict's order (tpurun.datasets), served
    by the module's export (of the checkpoint predict from TFDS read)."""
    import tensorflow_datasets as tfds

    data = config_files.load(config_files.resolve("resnet50:cpu")).data
    data.tfds_name, data.tfds_data_dir = "imagenet2012", str(tfds_dir)
    params = InputParams(1, 1, 1, 0, 1, seed=0)
    examples = datasets.tfds_examples(
        data,
        "validation",
        params,
        shuffle_files=False,
        decoders={"image": tfds.decode.SkipDecoding()},
    )
    read = list(examples.as_numpy_iterator())
    jpegs, labels = [x["image"] for x in read], np.array([x["label"] for x in read])
    serving = loaded.signatures["serving_default"]
    served = serving(image_bytes=tf.constant(jpegs))["class_ids"].numpy().tolist()
    assert served == [row["class_ids"] for row in from_tfds["rows"]]
    # Eval from TFDS counts each image once (the padded rows of its last batch nowhere):
    # its accuracy is that of predict's 90 rows against the split's labels.
    exact = float(np.mean(np.array(served) == labels))
    assert from_tfds["results"]["top_1_accuracy"] == pytest.approx(exact, abs=1e-6)


# --- keyed crops and a stream that seeks -------------------------------------------------


def stream(
    data: Path,
    start_batch: int,
    batches: int,
    pipelines: int = 1,
    pipeline: int = 0,
    tfds: bool = False,
):
    """`batches` training batches of 32 (float32) from `start_batch`, as input_fn makes them
    (from the TFRecords in `data`, or `tfds`: from TFDS's imagenet2012 prepared in `data`)."""
    config = config_files.load(config_files.resolve("resnet50:cpu"))
    if tfds:
        config.data.tfds_name = "imagenet2012"
        config.data.tfds_data_dir = str(data)
    else:
        config.data.data_dir = str(data)
    config.precision = "float32"
    model = model_lib.create(config)
    params = InputParams(
        batch_size=32,
        global_batch_size=32 * pipelines,
        num_replicas=pipelines,
        input_pipeline_id=pipeline,
        num_input_pipelines=pipelines,
        seed=config.seed,
        start_batch=start_batch,
    )
    dataset = model.input_fn(Mode.TRAIN, params).take(batches)
    return [(f["image"].numpy(), labels.numpy()) for f, labels in dataset]


# One case per reader: TFRecords on the second of two pipelines (5 batches an epoch each),
# TFDS on one. TFRecords on one pipeline is the SIGKILL test's: resumed at a batch inside
# the second epoch, bit for bit the uninterrupted run's weights.
@pytest.mark.parametrize("source, pipelines, pipeline", [("tfrecords", 2, 1), ("tfds", 1, 0)])
def test_a_stream_started_at_batch_n_is_the_stream_from_0_from_batch_n(
    data, tfds_dir, source, pipelines, pipeline
):
    """Across an epoch's end (10 batches an epoch on one pipeline, 5 on each of two), to
    the bit: the files, the records and the crops of a resumed run are an uninterrupted one's."""
    where, tfds = (tfds_dir, True) if source == "tfds" else (data, False)
    whole = stream(where, 0, 14, pipelines, pipeline, tfds)
    for start in (3, 12):
        resumed = stream(where, start, 2, pipelines, pipeline, tfds)
        for (image, label), (expected_image, expected_label) in zip(
            resumed, whole[start : start + 2], strict=True
        ):
            np.testing.assert_array_equal(image, expected_image)
            np.testing.assert_array_equal(label, expected_label)


def test_every_epoch_has_every_image_once_in_a_new_order_with_new_crops(data):
    one_epoch = TRAIN // 32
    batches = stream(data, 0, 2 * one_epoch)
    first, second = batches[:one_epoch], batches[one_epoch:]
    labels = [np.concatenate([b[1] for b in epoch]) for epoch in (first, second)]
    assert sorted(labels[0]) == sorted(labels[1]) == sorted(np.arange(TRAIN) % 10)
    assert not np.array_equal(labels[0], labels[1])
    # Random crops and flips: no two images of an epoch alike (each image is drawn anew).
    images = np.concatenate([b[0] for b in first])
    assert len({image.tobytes() for image in images}) == TRAIN
    assert images.min() >= -30 and images.max() <= 285  # [0, 255], bicubic overshoots a little


def test_the_eval_crop_is_the_centre_224_256_of_the_shorter_side():
    image = np.zeros((256, 320, 3), np.uint8)
    image[16:240, 48:272] = 255  # the centre 224 x 224 square of the shorter side
    crop = resnet_preprocessing.eval_image(tf.io.encode_jpeg(image, quality=100), 224).numpy()
    assert crop.shape == (224, 224, 3)
    assert crop[2:-2, 2:-2].min() > 240  # inside the square (JPEG and bicubic blur the edge)


def test_a_bad_record_is_named_with_its_file_and_fix(tmp_path):
    path = tmp_path / "train-00000-of-00001"
    good = write_split(tmp_path / "ok", "train", 2, 1, seed=3)[0][0]
    example = tf.train.Example()
    example.features.feature["image/encoded"].bytes_list.value.append(good)
    example.features.feature["image/class/label"].int64_list.value.append(0)
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(example.SerializeToString())
    said = imagenet_records.find_bad_record([str(path)], Mode.TRAIN, 10)
    assert said.startswith(f"data file {path}, record 1: label 0 is not a class 1..10"), said


# --- SIGKILL, then resume ---------------------------------------------------------------


def test_sigkill_then_resume_with_the_jpeg_pipeline_is_bit_identical(trained, data, tmp_path):
    """A trainer of its own process, killed (SIGKILL) once a checkpoint inside the second
    epoch is saved, resumed in this process: the weights of the uninterrupted run."""
    # TRAINED's flags but --train_steps (the killed run's: STEPS; the resume's: below).
    flags = [flag for flag in TRAINED if not flag.startswith("--train_steps=")]
    common = (*flags, *LOCAL, f"--data_dir={data}", f"--model_dir={tmp_path}")
    process = forked.Popen(
        [sys.executable, "-m", "tpurun", "train", *common, f"--train_steps={STEPS}"],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: what it started is found by it
    )
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        saved = re.search(r"Saved checkpoint \S+ckpt-(\d+)\.", line)
        if saved and int(saved.group(1)) >= 14:
            process.send_signal(signal.SIGKILL)
            break
    assert process.wait(timeout=120) == -signal.SIGKILL, "".join(lines)[-3000:]
    assert not group_survivors(process), "the killed trainer left a process behind"
    # Resumed for one host loop past the checkpoint it resumes from (ckpt-14 unless the kill
    # landed late), not to STEPS: the module's training kept each of its checkpoints, and
    # no step of the schedule depends on --train_steps (its warmup and boundaries are
    # epochs). 14 steps fewer to train again than a resume to STEPS.
    start = int(latest(tmp_path).name.split("-")[1])
    assert start % 10, f"resumed at {start}, an epoch's end: the test wants one inside an epoch"
    end = start + 7
    assert end <= STEPS, f"the kill landed after ckpt-{start}: nothing left to resume"
    resumed = assert_ok(tpurun_in_process("train", *common, f"--train_steps={end}")).stderr
    assert f"Resuming from {tmp_path / f'ckpt-{start}'} (step {start})" in resumed, resumed[-3000:]
    assert_bit_identical(tmp_path / f"ckpt-{end}", trained["model_dir"] / f"ckpt-{end}")


# --- tpurun check of the full-size model on a v5e-8, by the TPU's own compiler -----------


@pytest.mark.full_size
@pytest.mark.timeout(3600)
def test_check_sizes_the_full_model_on_a_v5e_8_with_the_tpu_compiler(data, tmp_path, monkeypatch):
    """224x224, global batch 1024 (128 per replica), the recipe's 90 epochs: every step
    compiled by the TPU compiler for a v5e, fits a replica, and is bounded in time."""
    from tpurun.datasets import train_count

    # The synthetic JPEGs stand in for ImageNet, too large to count (140 GB): its epochs
    # are config.data.train_examples' 1,281,167 examples, not the 320 records here.
    monkeypatch.setattr(train_count, "COUNT_BYTES", 0)
    report = tmp_path / "report.json"
    result = tpurun_in_process(
        "check",
        "--config=resnet50",
        "--target=v5e-8",
        f"--data_dir={data}",
        f"--report={report}",
        # The train step's compile took past the default 600 s on a loaded 2-core machine.
        "--compile_timeout=3600",
    )
    text = result.stdout
    assert text.startswith(
        "Memory per replica on a v5litepod-8: 8 replicas with 16 GB of HBM each (compiled "
        "by the TPU compiler"
    ), text + result.stderr[-3000:]
    assert "XLA's CPU estimate" not in text, text  # no step fell back
    steps = json.loads(report.read_text())["steps"]
    assert set(steps) == {"train", "eval", "predict"}
    for step in steps.values():
        assert step["batch_per_replica"] == 128 and step["fits"], step
    (training,) = [line for line in text.splitlines() if line.startswith("Training, at least")]
    assert training.startswith("Training, at least: 112603 steps (--train_epochs=90) take "), (
        training
    )


# --- the full-size model, bit for bit with config.train.deterministic ------------------

# The full `resnet50` config (224x224 crops, ResNet-50, mixed bfloat16, the recipe's SGD
# with Nesterov momentum and L2 decay) at a tiny batch, a few steps: issue 52's runs. Without
# deterministic kernels two such runs differed in 12-15 of 432 tensors after 2 steps (the
# momentum and weights of a few late layers, by up to 4e-9: Grappler's arithmetic optimizer
# rewrote their updates differently from one process to the next).
FULL = (
    "--config=resnet50",
    "--batch_size=8",
    "--iterations=2",
    "--save_checkpoints_steps=2",
    "--config.optimizer.warmup_epochs=0",
    "--config.train.deterministic=true",
    *LOCAL,
)
FULL_STEPS = 6


def full_size_process(*args: str, **popen) -> subprocess.Popen:
    """`tpurun train` of FULL in a fresh interpreter: a process of its own from its start (a
    fork would share this one's hash seeds and memory layout), in its own process group."""
    return subprocess.Popen(
        [sys.executable, "-m", "tpurun", "train", *FULL, *args],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


@pytest.fixture(scope="module")
def full_size(data, tmp_path_factory) -> Path:
    """An uninterrupted run of the full model, in this process: FULL_STEPS steps."""
    model_dir = tmp_path_factory.mktemp("resnet50-full")
    where = (f"--data_dir={data}", f"--model_dir={model_dir}")
    assert_ok(tpurun_in_process("train", *FULL, f"--train_steps={FULL_STEPS}", *where))
    return model_dir


@pytest.mark.full_size
@pytest.mark.timeout(3600)
def test_two_fresh_runs_of_the_full_model_are_bit_identical(full_size, data, tmp_path):
    """Every checkpoint of a second run, in a fresh interpreter, equals the first's."""
    process = full_size_process(
        f"--train_steps={FULL_STEPS}", f"--data_dir={data}", f"--model_dir={tmp_path}"
    )
    _, stderr = process.communicate(timeout=3000)
    assert process.returncode == 0, stderr[-3000:]
    assert "Resumes are bit-identical: deterministic kernels" in stderr
    for step in range(2, FULL_STEPS + 1, 2):
        assert_bit_identical(tmp_path / f"ckpt-{step}", full_size / f"ckpt-{step}")


@pytest.mark.full_size
@pytest.mark.timeout(3600)
def test_sigkill_then_resume_of_the_full_model_is_bit_identical(full_size, data, tmp_path):
    """The tpurun process killed (SIGKILL) once its first checkpoint is saved, nothing of it
    left; resumed in this process to the end: the uninterrupted run's weights."""
    where = (f"--data_dir={data}", f"--model_dir={tmp_path}")
    process = full_size_process(f"--train_steps={FULL_STEPS}", *where)
    assert process.stderr is not None
    lines = []
    for line in process.stderr:
        lines.append(line)
        if re.search(r"Saved checkpoint \S+ckpt-\d+\.", line):
            process.send_signal(signal.SIGKILL)
            break
    assert process.wait(timeout=600) == -signal.SIGKILL, "".join(lines)[-3000:]
    assert not group_survivors(process), "the killed trainer left a process behind"
    start = int(latest(tmp_path).name.split("-")[1])
    assert start < FULL_STEPS, f"the kill landed after ckpt-{start}: nothing left to resume"
    resumed = tpurun_in_process("train", *FULL, f"--train_steps={FULL_STEPS}", *where)
    assert f"Resuming from {tmp_path / f'ckpt-{start}'} (step {start})" in assert_ok(resumed).stderr
    assert_bit_identical(tmp_path / f"ckpt-{FULL_STEPS}", full_size / f"ckpt-{FULL_STEPS}")
