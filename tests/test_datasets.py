"""Datasets by name (tpurun.datasets): a TFDS dataset prepared here, read by name, never downloaded.

The dataset is TFDS's `mnist` as `tfds build` lays it out, written by TFDS's own
builder API from the synthetic digits (tests/tfds_data.py), once per module into a
local data_dir and, for the gs:// test, onto the tests' GCS server. The model is
the shipped `mnist:tfds`, shrunk. One run is a process of its own (on gs://, watched for
any connection that leaves 127.0.0.1); the rest run in this process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import forked
import numpy as np
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, REPO, USAGE, assert_fails, assert_ok, tpurun_in_process
from test_resume import assert_bit_identical, weights
from tfds_data import prepare_mnist

from tpurun import datasets, inputs
from tpurun import model as model_lib
from tpurun.cluster import strategy
from tpurun.errors import UsageError
from tpurun.model import InputParams, Mode
from tpurun.run_config import RunConfig, config_files, merge_flags, refuse_local_paths_on_a_tpu_node

pytestmark = pytest.mark.slow

# mnist:tfds, shrunk to train in seconds: 400 training digits in 4 files, 100 test.
SMALL = (
    "--config=mnist:tfds",
    "--use_tpu=false",
    "--config.conv_filters=(4, 4)",
    "--config.hidden_units=8",
    "--batch_size=16",
    "--eval_batch_size=32",  # 100 test digits: the last batch padded, counted once
    "--iterations=5",
)
WATCHED = Path(__file__).resolve().parent / "watched_tpurun.py"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory) -> str:
    """A local data_dir where mnist was prepared by TFDS's builder API (4 files per split)."""
    root = tmp_path_factory.mktemp("tensorflow_datasets")
    prepare_mnist(str(root))
    return str(root)


def data_config(data_dir: str):
    """mnist:tfds's `config.data`, reading `data_dir`."""
    config = config_files.load(config_files.resolve("mnist:tfds"))
    with config.unlocked():
        config.data.tfds_data_dir = data_dir
    return config


def examples_of(dataset: tf.data.Dataset) -> list[str]:
    """Each example of a TFDS split as a short fingerprint of its pixels and label."""
    return [
        hashlib.sha1(example["image"].tobytes() + bytes([example["label"]])).hexdigest()[:12]
        for example in dataset.as_numpy_iterator()
    ]


def pipeline(input_pipeline_id: int, pipelines: int, seed: int = 0) -> InputParams:
    return InputParams(
        batch_size=8,
        global_batch_size=64,
        num_replicas=8,
        input_pipeline_id=input_pipeline_id,
        num_input_pipelines=pipelines,
        seed=seed,
    )


# --- tpurun.datasets: what one input pipeline reads --------------------------------------


@pytest.mark.parametrize(
    ("pipelines", "sizes"),
    [(2, [50, 50]), (5, [20, 20, 20, 20, 20])],
    ids=["by-files", "fewer-files-than-pipelines"],
)
def test_the_pipelines_share_the_split_without_overlap(data_dir, pipelines, sizes):
    """The test split's 100 examples in 4 files: 2 pipelines take 2 files each (TFDS's file
    sharding); 5 pipelines, more than the files, take an even share of the examples."""
    data = data_config(data_dir).data
    parts = [
        examples_of(
            datasets.tfds_examples(data, "test", pipeline(i, pipelines), shuffle_files=True)
        )
        for i in range(pipelines)
    ]
    everything = examples_of(
        datasets.tfds_examples(data, "test", pipeline(0, 1), shuffle_files=False)
    )
    assert len(everything) == 100 == datasets.num_examples(data, "test")
    assert sorted(sum(parts, [])) == sorted(everything)  # every example once
    assert [len(p) for p in parts] == sizes


def test_the_file_order_is_seeded_by_the_run_and_the_same_in_every_process(data_dir):
    data = data_config(data_dir).data

    def order(seed: int) -> list[str]:
        read = datasets.tfds_examples(data, "test", pipeline(0, 1, seed), shuffle_files=True)
        return examples_of(read.repeat(2))  # two epochs: reshuffled, as seeded

    first = order(seed=0)
    assert first == order(seed=0)
    assert first[:100] != first[100:]  # the second epoch's files in another order
    assert first != order(seed=1)
    assert datasets.file_seed(0) != 0  # derived: not the example shuffle's own seed


# --- reading a dataset by name in a run -----------------------------------------------


@pytest.fixture(scope="module")
def trained(data_dir, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """mnist:tfds trained 30 steps (an epoch is 25), saved at 15 and 30, and evaluated at
    the end: the reference of the resume test; its model_dir and what it printed."""
    model_dir = tmp_path_factory.mktemp("uninterrupted") / "model"
    result = tpurun_in_process(
        "train",
        *SMALL,
        f"--config.data.tfds_data_dir={data_dir}",
        "--train_steps=30",
        "--save_checkpoints_steps=15",
        "--eval_every=30",
        f"--model_dir={model_dir}",
    )
    return model_dir, assert_ok(result)


def test_eval_is_exact_over_the_test_split(trained):
    model_dir, result = trained
    assert "eval at step 30 on test:" in result.stdout
    assert "(100 examples)" in result.stdout  # 3 batches of 32 and one of 4, padded
    results = json.loads((model_dir / "eval" / "test" / "results-30.json").read_text())
    assert results["global_step"] == 30


def test_a_resumed_run_is_bit_identical_to_an_uninterrupted_one(trained, data_dir, tmp_path):
    """Stopped at step 15 and resumed, the input skipped to where step 15 left it: the same
    file order (seeded) and examples as without the stop, across the epoch at step 25.
    The stop is the reference's own ckpt-15, alone in a model_dir of its own (that a run
    stopped by its train_steps saves the same is tests/test_resume.py's)."""
    for file in trained[0].glob("ckpt-15.*"):
        shutil.copy(file, tmp_path)
    common = (*SMALL, f"--config.data.tfds_data_dir={data_dir}", f"--model_dir={tmp_path}")
    resumed = assert_ok(tpurun_in_process("train", *common, "--train_steps=30"))
    assert f"Resuming from {tmp_path / 'ckpt-15'} (step 15)." in resumed.stderr
    assert "Skipping 15 batches" in resumed.stderr
    reference = trained[0] / "ckpt-30"
    assert len(weights(reference)) > 10
    assert_bit_identical(tmp_path / "ckpt-30", reference)


def test_predict_reads_the_eval_split_features_in_its_order(data_dir):
    """input_fn(PREDICT) of mnist:tfds: the test split's images alone (N in, N out), in the
    order EVAL reads them."""
    model = model_lib.create(data_config(data_dir))
    params = dataclasses.replace(pipeline(0, 1), batch_size=32, split="test")
    predict = list(model.input_fn(Mode.PREDICT, dataclasses.replace(params, split=None)))
    evaluate = list(model.input_fn(Mode.EVAL, params))
    assert all(set(batch) == {"image"} for batch in predict)  # features only
    images = np.concatenate([batch["image"].numpy() for batch in predict])
    assert images.shape == (100, 784)
    np.testing.assert_array_equal(images, np.concatenate([f["image"] for f, _ in evaluate]))


def global_batches(data_dir: str, replicas: int, steps: int) -> list[np.ndarray]:
    """The images of the first `steps` global batches (of 32) that `replicas` replicas get,
    in replica order, as the training loop gets them."""
    config = data_config(data_dir)
    with config.unlocked():
        config.conv_filters, config.hidden_units = (4, 4), 8
    model = model_lib.create(config)
    cluster = strategy.local(replicas)
    dataset = inputs.distribute(cluster.strategy, model, Mode.TRAIN, 32, seed=0)
    iterator = iter(dataset)
    found = []
    for _ in range(steps):
        features, _ = inputs.gather_replicas(cluster.strategy, next(iterator))
        found.append(features["image"].numpy())
    return found


def test_one_and_four_replicas_see_the_same_examples_in_the_same_order(data_dir):
    one, four = global_batches(data_dir, 1, 15), global_batches(data_dir, 4, 15)
    for step, (a, b) in enumerate(zip(one, four, strict=True)):  # 15 x 32: past an epoch
        assert np.array_equal(a, b), f"global batch {step} differs"


# --- data that cannot be read: one line, nothing downloaded ----------------------------


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (("--config.data.tfds_data_dir=",), ("needs config.data.tfds_data_dir", "tfds build")),
        (
            ("--config.data.tfds_data_dir={empty}/missing",),
            ("does not exist", "tfds build mnist --data_dir={empty}/missing"),
        ),
        (
            ("--config.data.tfds_data_dir={data}", "--config.data.tfds_name=mnist:1.0.0"),
            ("mnist:1.0.0 is not prepared", "tfds_name=mnist:3.0.1"),
        ),
    ],
    ids=["no-data-dir", "data-dir-missing", "version-not-prepared"],
)
def test_data_that_cannot_be_found_is_one_line_before_anything_is_written(
    data_dir, tmp_path, flags, says
):
    empty = tmp_path / "empty"
    empty.mkdir()
    model_dir = tmp_path / "model"
    filled = [f.format(empty=empty, data=data_dir) for f in flags]
    result = tpurun_in_process("train", *SMALL, *filled, f"--model_dir={model_dir}")
    assert_fails(result, USAGE, *(s.format(empty=empty) for s in says))
    assert not list(model_dir.glob("ckpt-*"))


def test_an_unknown_split_names_the_splits_the_dataset_has(trained, data_dir):
    result = tpurun_in_process(
        "eval",
        *SMALL,
        f"--config.data.tfds_data_dir={data_dir}",
        "--config.data.tfds_splits.test=validation",
        f"--model_dir={trained[0]}",
    )
    assert_fails(result, USAGE, "tfds_splits.test='validation'", "Unknown split", "'train', 'test'")


def test_a_local_data_dir_is_refused_before_a_tpu_node_is_reached(data_dir):
    """A TPU node's host sees only Cloud Storage: tfds_data_dir is checked as every *_dir."""
    run = RunConfig(
        command="train",
        config_name="mnist:tfds",
        config=merge_flags(data_config(data_dir), {}),
        model_dir="gs://bucket/model",
        tpu="grpc://10.0.0.2:8470",
    )
    with pytest.raises(UsageError, match=f"--config.data.tfds_data_dir={data_dir} is on this"):
        refuse_local_paths_on_a_tpu_node(run)
    gcs = dataclasses.replace(run, config=merge_flags(data_config("gs://bucket/tfds"), {}))
    refuse_local_paths_on_a_tpu_node(gcs)  # gs://: fine


@pytest.fixture
def connections() -> Iterator[list[str]]:
    """Every address this process connects a socket to or looks up during the test."""
    seen: list[str] = []
    watching = [True]

    def hook(event: str, args: tuple) -> None:
        if watching and event == "socket.connect":
            seen.append(f"connect {args[1]!r}")
        elif watching and event == "socket.getaddrinfo":
            seen.append(f"getaddrinfo {args[0]!r}")

    sys.addaudithook(hook)  # stays for the process; silent once the test ends
    yield seen
    watching.clear()


def test_a_name_not_prepared_says_how_to_prepare_it_and_downloads_nothing(
    gcs, tmp_path, connections
):
    """An empty data_dir: `mnist` is TFDS's own, which `tfds.builder` would offer to
    download; tpurun looks at the files only, and says the `tfds build` command."""
    empty = tmp_path / "tensorflow_datasets"
    empty.mkdir()
    with gcs.counting() as log:  # every https request of this process goes through its proxy
        result = tpurun_in_process(
            "train",
            *SMALL,
            f"--config.data.tfds_data_dir={empty}",
            f"--model_dir={tmp_path / 'model'}",
        )
    assert_fails(result, USAGE, "mnist is not prepared", f"tfds build mnist --data_dir={empty}")
    assert "(it is empty)" in result.stderr
    assert not log, log.summary()
    assert not [c for c in connections if "127.0.0.1" not in c and "localhost" not in c]
    assert not any(empty.iterdir())  # nothing downloaded or prepared into it


# --- gs://: a process of its own, TensorFlow's own client, nothing beyond 127.0.0.1 -------


def test_a_process_of_its_own_reads_the_dataset_from_gcs_with_tensorflows_client(
    gcs, bucket, tmp_path
):
    """Forked (tests/forked), not a new interpreter: a process that never touched gs:// or
    TFDS (this one did, preparing the data), whose whole run is watched, TFDS's import with
    it. What it does not watch is the import of TensorFlow, Keras and tpurun, done once in
    the forking server: no gs:// path is known then, and it is every run's."""
    data_dir = f"{bucket}/tensorflow_datasets"
    prepare_mnist(data_dir, train=64, test=16, files=2)
    gcs.reset_requests()
    watch = tmp_path / "connections.txt"
    env = {**os.environ, **OFFLINE_ENV, **gcs.env}
    # Plain http too through the proxy, which logs (and refuses) any host but storage's.
    env.update(http_proxy=gcs.env["https_proxy"], HTTP_PROXY=gcs.env["https_proxy"])
    result = forked.run(
        [
            sys.executable,
            str(WATCHED),
            str(watch),
            "train",
            *SMALL,
            f"--config.data.tfds_data_dir={data_dir}",
            "--config.data.shuffle_buffer=64",  # an epoch: a larger one reads it again
            "--train_steps=5",  # one host loop of 5
            f"--model_dir={tmp_path / 'model'}",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert_ok(result)
    assert "Saved checkpoint" in result.stderr and (tmp_path / "model" / "ckpt-5.index").exists()
    requests = gcs.requests
    read = [r for r in requests if r.kind == "download"]
    assert any("mnist-train.tfrecord" in r.object for r in read), requests.summary()
    assert any(r.object.endswith("dataset_info.json") for r in read), requests.summary()
    # TensorFlow's client names Google's hosts (the proxy stands in for them); gcsfs would
    # have gone to STORAGE_EMULATOR_HOST, 127.0.0.1. Nothing refused: no other host.
    assert {r.host for r in requests} <= {"www.googleapis.com", "storage.googleapis.com"}
    assert {r.bucket for r in requests} == {bucket.removeprefix("gs://")}
    first, *lines = watch.read_text().splitlines()
    assert first == "watching"
    assert all("127.0.0.1" in line or "localhost" in line for line in lines), lines
