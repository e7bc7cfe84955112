"""tpurun.runners.predict: N rows in, N rows out, in input order, the padding stripped; or `generate`."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import threading
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from conftest import assert_fails, assert_ok
from iris_runs import feature_columns, iris_checkpoint, iris_run, restored_iris
from tpurun.models import iris

from tpurun.cluster import strategy
from tpurun.errors import UsageError
from tpurun.model import create
from tpurun.runners.predict import Predictor, output_target


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    return iris_checkpoint(tmp_path_factory.mktemp("iris"))


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> tuple[str, dict[str, np.ndarray]]:
    """A CSV of the first 7 test rows' features, and those features."""
    path = tmp_path_factory.mktemp("rows") / "rows.csv"
    test = iris.read_csv(iris.shipped_csv("iris_test.csv"), with_labels=True)
    test[list(iris.FEATURES)].iloc[:7].to_csv(path, index=False)
    return str(path), {name: test[name].to_numpy()[:7] for name in iris.FEATURES}


def predict(checkpoint: str, replicas: int, **flags) -> list[dict]:
    run = iris_run("/unused", "predict", **flags)
    return list(Predictor(run, strategy.local(replicas), create(run.config)).predict(checkpoint))


@pytest.mark.parametrize(
    "replicas, batch",
    [
        (1, 4),  # a full batch, then 3 rows and 1 of padding
        (1, 7),  # exactly one batch: no padding
        (1, 16),  # one batch, more padding than rows
        # A row a replica: the last batch one replica of a row, one of padding only (the
        # path 8 replicas of a row take: 7 of a row, one of padding only).
        (2, 2),
    ],
    ids=["1x4", "1x7_exact", "1x16_one_padded", "2x2_one_row_each"],
)
def test_n_rows_in_n_rows_out_in_order(checkpoint, rows, replicas, batch):
    path, features = rows
    predictions = predict(checkpoint, replicas, input=path, predict_batch_size=batch)
    assert len(predictions) == 7
    logits = restored_iris(checkpoint)(feature_columns(features), training=False).numpy()
    np.testing.assert_allclose(
        np.stack([p["logits"] for p in predictions]), logits, rtol=1e-5, atol=1e-6
    )
    assert [int(p["class_ids"]) for p in predictions] == logits.argmax(axis=1).tolist()
    for p in predictions:
        assert set(p) == {"class_ids", "probabilities", "logits"}
        assert p["probabilities"].shape == (3,)
        assert isinstance(p["probabilities"], np.ndarray)


def test_without_input_the_models_own_examples(checkpoint):
    assert len(predict(checkpoint, 1)) == len(iris.PREDICTION_EXPECTED)


class Generating(iris.Iris):
    """Iris with a `generate` of its own: rows of what the restored model holds."""

    def generate(self, keras_model, strategy):
        kernel = keras_model.get_layer("logits").kernel.numpy()
        return [{"kernel_sum": float(kernel.sum()), "replicas": strategy.num_replicas_in_sync}]


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_model_with_generate_predicts_its_own_rows_from_the_restored_model(checkpoint, replicas):
    run = iris_run("/unused", "predict")
    (row,) = Predictor(run, strategy.local(replicas), Generating(run.config)).predict(checkpoint)
    expected = restored_iris(checkpoint).get_layer("logits").kernel.numpy().sum()
    assert row == {"kernel_sum": pytest.approx(float(expected)), "replicas": replicas}
    assert tf.distribute.get_strategy() is strategy.local(1).strategy  # left no scope open


# --- --output: streamed into, replaced whole, or refused -----------------------------------


@pytest.fixture(scope="module")
def model_dir(checkpoint) -> Path:
    """A model_dir holding ckpt-7 (untrained Iris): what predict reads."""
    return Path(checkpoint).parent


def predict_to(cli, model_dir: Path, output: str) -> subprocess.CompletedProcess:
    return cli("predict", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}",
               f"--output={output}")  # fmt: skip


def test_output_to_stdout_goes_to_stdout_and_the_summary_to_stderr(tpurun_cli, model_dir):
    result = assert_ok(predict_to(tpurun_cli, model_dir, "/dev/stdout"))
    lines = result.stdout.splitlines()
    assert len(lines) == len(iris.PREDICTION_EXPECTED)
    assert all(json.loads(line)["class_ids"] in (0, 1, 2) for line in lines)
    assert "wrote 3 predictions to /dev/stdout" in result.stderr
    assert os.path.islink("/dev/stdout")  # as it was: not replaced by a file


def test_output_to_a_pipe_or_a_device_streams_into_it(tpurun_cli, model_dir, tmp_path):
    fifo = tmp_path / "predictions.fifo"
    os.mkfifo(fifo)
    received: list[bytes] = []

    def read() -> None:
        with open(fifo, "rb") as f:  # blocks until predict opens it for writing
            received.append(f.read())

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    result = predict_to(tpurun_cli, model_dir, str(fifo))
    if reader.is_alive():  # predict never opened it: let the reader go
        os.close(os.open(fifo, os.O_WRONLY))
    reader.join()
    assert_ok(result)
    assert len(received[0].decode().splitlines()) == 3 and stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert_ok(predict_to(tpurun_cli, model_dir, os.devnull))
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)  # still the device


def test_output_replaces_a_regular_file_whole_even_at_the_model_dirs_top_level(
    tpurun_cli, model_dir, tmp_path
):
    for output in (tmp_path / "old.jsonl", model_dir / "predictions.jsonl"):
        output.write_text("an older prediction\n" * 100)
        assert (
            "wrote 3 predictions"
            in assert_ok(predict_to(tpurun_cli, model_dir, str(output))).stdout
        )
        assert len(output.read_text().splitlines()) == 3
        assert not [p for p in output.parent.iterdir() if "tpurun-tmp" in p.name]
        output.unlink()


def _link_to_a_file(directory: Path) -> None:
    (directory / "kept.jsonl").write_text("the user's")
    (directory / "out").symlink_to(directory / "kept.jsonl")


def _socket(path: Path) -> None:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))
    server.close()  # the socket file stays


# (what is there, what --output names, what the one line says)
REFUSED = {
    "a directory": (lambda d, m: (d / "out").mkdir(), "{d}/out", "is a directory"),
    "a missing directory": (lambda d, m: None, "{d}/none/p.jsonl", "{d}/none does not exist"),
    "a link to a file": (lambda d, m: _link_to_a_file(d), "{d}/out", "is a symbolic link"),
    "a socket": (lambda d, m: _socket(d / "s"), "{d}/s", "is a socket"),
    "a checkpoint": (lambda d, m: None, "{m}/ckpt-7.index", "which tpurun keeps there"),
    "the state file": (lambda d, m: None, "{m}/checkpoint", "which tpurun keeps there"),
    "a record": (lambda d, m: None, "{m}/runs/new.json", "inside runs/"),
    "a checkpoint through a link to the model_dir": (
        lambda d, m: (d / "alias").symlink_to(m),
        "{d}/alias/ckpt-7.data-00000-of-00001",
        "which tpurun keeps there",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_output_never_replaces_what_tpurun_did_not_make_or_keeps(model_dir, tmp_path, case):
    """The rule, case by case (`output_target`, which predict asks before it predicts and
    again when it writes); the test below runs one case through the CLI."""
    make, output, says = REFUSED[case]
    outside = tmp_path / "outside"
    outside.mkdir()
    make(outside, model_dir)
    output = output.format(d=outside, m=model_dir)
    with pytest.raises(UsageError) as refused:
        output_target(output, str(model_dir))
    assert f"--output={output}" in str(refused.value)
    assert says.format(d=outside, m=model_dir) in str(refused.value)


def test_an_output_refused_is_one_line_and_exit_2_before_predicting(tpurun_cli, model_dir):
    index = model_dir / "ckpt-7.index"
    before = index.read_bytes()
    result = predict_to(tpurun_cli, model_dir, str(index))
    line = assert_fails(result, 2, f"--output={index} is 'ckpt-7.index', a file of --model_dir")
    assert "tpurun-tmp" not in line and "Restoring" not in result.stderr
    assert index.read_bytes() == before


@pytest.mark.parametrize(
    "rows, says",
    [
        (
            "5.9,3.0,4.2,1.5\n5.1,3.3," + "9" * 200_000 + "x,0.5\n",
            ["line 2: column PetalLength is '9999", "(200,003 characters)"],
        ),
        ("5.1,3.3,1.7,0.5,0,7\n5.9,3.0,4.2,1.5,1,7\n", ["has 6 columns", "remove the other"]),
    ],
    ids=["a_cell_of_200000_characters", "rows_of_6_columns"],
)
def test_predict_input_quotes_an_excerpt_and_refuses_extra_columns(
    tpurun_cli, model_dir, tmp_path, rows, says
):
    path = tmp_path / "rows.csv"
    path.write_text(rows)
    result = tpurun_cli("predict", "--config=iris", "--use_tpu=false",
                        f"--model_dir={model_dir}", f"--input={path}")  # fmt: skip
    line = assert_fails(result, 1, f"data file {path}", *says)
    assert len(line) < 500
