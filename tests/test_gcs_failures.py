"""Storage failures on gs:// end as one line naming the cause and the fix, and leave nothing half-written.

Each failure is injected by the test GCS server's proxy (tests/fake_gcs); the CLI
runs in this process (`tpurun_cli`), except where the watchdog's os._exit needs a
process of its own.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import forked
import pytest
import tensorflow as tf
from conftest import (
    OFFLINE_ENV,
    RUN_FAILURE,
    assert_fails,
    assert_ok,
    tensorboard_scalars,
    tpurun_in_process,
)

from tpurun.errors import EXIT_HUNG, EXIT_UNAVAILABLE, storage_errors

IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10")


def files(directory: str) -> list[str]:
    """Every object below `directory`, relative to it."""
    return sorted(
        tf.io.gfile.join(root, name)[len(directory) + 1 :]
        for root, _, names in tf.io.gfile.walk(directory)
        for name in names
    )


def leftovers(directory: str) -> list[str]:
    """What a failed or killed operation may leave: temporaries and unfinished saves."""
    return [
        name
        for name in files(directory)
        if ".tpurun-tmp-" in name or "_temp" in name or ".best.previous" in name
    ]


@pytest.fixture(scope="module")
def trained(gcs_server) -> str:
    """A model_dir in a bucket of its own trained to step 20 (checkpoints 10 and 20) and
    evaluated there (its best kept), shared by the tests below: each leaves it as a model_dir
    the next can use (an export added, a longer training)."""
    model_dir = f"{gcs_server.make_bucket('failures-trained')}/iris"
    assert_ok(
        tpurun_in_process(
            "train", *IRIS, "--train_steps=20", "--eval_every=20", f"--model_dir={model_dir}"
        )
    )
    return model_dir


def test_a_bucket_that_does_not_exist_is_one_line_with_the_command_that_creates_it(gcs, tpurun_cli):
    # TensorFlow alone loops forever here, asking for the bucket thousands of times a second.
    result = tpurun_cli("train", *IRIS, "--train_steps=10", "--model_dir=gs://no-such-bucket/iris")
    assert_fails(
        result,
        RUN_FAILURE,
        "bucket gs://no-such-bucket does not exist",
        "gcloud storage buckets create gs://no-such-bucket",
        "--model_dir",
    )
    assert len(gcs.requests) < 10, gcs.requests


@pytest.mark.parametrize(
    ("status", "keywords", "exit_code"),
    [
        (401, ["no Google Cloud credentials", "gcloud auth application-default login"], 1),
        (403, ["permission denied", "roles/storage.objectAdmin", "add-iam-policy-binding"], 1),
        # Storage failing past its retries passes by itself: exit 69 (--max_restarts restarts).
        (503, ["unreachable or failing", "HTTP 503", "rerun"], EXIT_UNAVAILABLE),
    ],
)
def test_refused_or_failing_storage_is_one_line_with_the_fix(
    bucket, gcs, tpurun_cli, status, keywords, exit_code
):
    model_dir = f"{bucket}/iris"
    gcs.fail(status, times=None, path="/o")
    result = tpurun_cli("train", *IRIS, "--train_steps=10", f"--model_dir={model_dir}")
    line = assert_fails(result, exit_code, *keywords)
    assert bucket in line


def test_explain_words_a_real_anonymous_403():
    message = (
        'Error executing an HTTP request: HTTP response code 403 with body \'{"error": '
        '{"code": 403, "message": "Anonymous caller does not have storage.objects.get access '
        "to the Google Cloud Storage object.\"}}' when reading metadata of gs://b/iris/checkpoint"
    )
    line = storage_errors.explain(message, "PermissionDeniedError")
    assert line is not None and "gcloud auth application-default login" in line
    assert "gs://b/iris/checkpoint" in line


def test_a_failed_save_leaves_no_temporary_and_the_next_run_resumes(trained, gcs, tpurun_cli):
    """The run resumed at step 20 fails in its first save; the next resumes there again."""
    model_dir = trained
    common = (*IRIS, "--save_checkpoints_steps=10", f"--model_dir={model_dir}")
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"  # the first test here
    gcs.fail(503, kind="upload", path=r"ckpt-30", times=None)
    result = tpurun_cli("train", *common, "--train_steps=40")
    assert_fails(result, EXIT_UNAVAILABLE, "unreachable or failing", "ckpt-30")
    assert leftovers(model_dir) == []
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-20"
    # The TensorBoard events pending in memory (step 30's) were uploaded before the exit.
    assert [step for step, _ in tensorboard_scalars(model_dir)["loss"]][:3] == [10, 20, 30]
    gcs.clear_faults()
    result = assert_ok(tpurun_cli("train", *common, "--train_steps=40"))
    assert f"Resuming from {model_dir}/ckpt-20 (step 20)" in result.stderr
    assert tf.train.latest_checkpoint(model_dir) == f"{model_dir}/ckpt-40"


def test_a_failed_export_leaves_nothing_and_the_next_export_works(trained, gcs, tpurun_cli):
    gcs.fail(503, kind="upload", path=r"variables", times=None)
    result = tpurun_cli("export", *IRIS, f"--model_dir={trained}")
    assert_fails(result, RUN_FAILURE, "cannot write the export", "nothing was left behind")
    assert [n for n in files(trained) if n.startswith("export/")] == []
    gcs.clear_faults()
    # The next export, of the best checkpoint (kept apart by the fixture's eval), served.
    result = assert_ok(tpurun_cli("export", *IRIS, "--best", f"--model_dir={trained}"))
    assert "The best checkpoint: step 20" in result.stderr
    [export_dir] = result.stdout.split()
    assert export_dir.startswith(f"{trained}/export/")
    serving = tf.saved_model.load(export_dir).signatures["serving_default"]
    served = serving(
        SepalLength=tf.constant([5.1]),
        SepalWidth=tf.constant([3.3]),
        PetalLength=tf.constant([1.7]),
        PetalWidth=tf.constant([0.5]),
    )
    assert served["class_ids"].shape == (1,)


def test_a_failed_best_copy_keeps_the_previous_best_and_leaves_no_temporary(
    trained, gcs, tpurun_cli
):
    # The report: a 404 to one request left gs://bucket/iris/.best.tmp/ behind.
    with tf.io.gfile.GFile(f"{trained}/best/best.json") as f:  # the fixture's eval kept it
        before = json.load(f)
    # Trained on (in 2 host loops) to a better step, which eval then offers to best/.
    assert_ok(
        tpurun_cli("train", *IRIS, "--train_steps=200", "--iterations=90", f"--model_dir={trained}")
    )
    gcs.fail(404, kind="upload", path=r"name=iris/best/ckpt-200\.data-")  # copying the checkpoint
    result = assert_ok(tpurun_cli("eval", *IRIS, f"--model_dir={trained}"))
    assert "Could not write the eval summaries or the best checkpoint" in result.stderr
    assert leftovers(trained) == []
    with tf.io.gfile.GFile(f"{trained}/best/best.json") as f:
        assert json.load(f) == before
    step = before["checkpoint"]
    assert files(f"{trained}/best") == sorted(
        ["best.json", f"{step}.data-00000-of-00001", f"{step}.index"]
    )


def storage_gone_after_the_first_save(model_dir: str, gcs, hang_timeout: int) -> tuple[int, str]:
    """A train whose every request after its first save hangs: its exit code and stderr
    (stderr "" when it ended before that save)."""
    # The plain host loop: XLA's ("auto"'s pick for Iris) is compiled and timed in the
    # first loop, which the watchdog's time must cover too; the loop is not the subject.
    process = forked.Popen(
        [sys.executable, "-m", "tpurun", "train", *IRIS, "--train_steps=1000000"]
        + ["--config.train.xla=false"]
        + ["--save_checkpoints_steps=10", f"--hang_timeout={hang_timeout}"]
        + [f"--model_dir={model_dir}"],
        env={**__import__("os").environ, **OFFLINE_ENV, **gcs.env},
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        if "Saved checkpoint" in line:
            gcs.slow(600)  # far past the watchdog's time
            break
    saved = bool(lines) and "Saved checkpoint" in lines[-1]
    rest = process.communicate(timeout=120)[1]
    gcs.clear_faults()
    return process.returncode, ("".join(lines) + rest) if saved else ""


def test_storage_gone_past_hang_timeout_ends_the_run_with_exit_3(bucket, gcs):
    """Every request after the first save hangs: the watchdog ends the run (its own process).

    4 s is past a host loop here, but the first one also traces the step: on a machine
    too busy to do that in 4 s the watchdog ends the run before its first save, and it
    runs again with more time for that (15 s, then 60 s under a heavy load: each wait is
    spent in full once storage hangs, so the shortest that works is tried first)."""
    for attempt, hang_timeout in enumerate((4, 15, 60)):
        code, stderr = storage_gone_after_the_first_save(
            f"{bucket}/iris{attempt}", gcs, hang_timeout
        )
        if stderr:
            break
    assert code == EXIT_HUNG, stderr
    match = re.search(rf"no progress for --hang_timeout={hang_timeout}s at step (\d+)", stderr)
    assert match and int(match.group(1)) >= 10, stderr
    assert f"the latest checkpoint is {bucket}/iris{attempt}/ckpt-" in stderr


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--model_dir={tmp}/iris"], "--model_dir={tmp}/iris"),
        (
            ["--model_dir=gs://b/iris", "--config.data.train_path={tmp}/train.csv"],
            "--config.data.train_path={tmp}/train.csv",
        ),
        (["--model_dir=gs://b/iris", "--warm_start_from={tmp}/old"], "--warm_start_from="),
    ],
    ids=["model_dir", "data_path", "warm_start_from"],
)
def test_a_tpu_node_refuses_local_paths_before_connecting(tpurun_cli, tmp_path, flags, named):
    # A --tpu=NAME is checked the same way once the Cloud TPU API gave its address.
    args = [flag.format(tmp=tmp_path) for flag in flags]
    result = tpurun_cli("train", "--config=iris", "--tpu=grpc://10.0.0.2:8470", *args, cwd=tmp_path)
    assert_fails(
        result, 2, named.format(tmp=tmp_path), "gs://BUCKET", "File system scheme '[local]'"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_tpu_node_refuses_a_local_predict_output_and_export_dir(tpurun_cli, tmp_path):
    tpu = "--tpu=grpc://10.0.0.2:8470"
    result = tpurun_cli("predict", tpu, "--model_dir=gs://b/iris", f"--output={tmp_path}/p.jsonl")
    assert_fails(result, 2, f"--output={tmp_path}/p.jsonl")
    result = tpurun_cli("export", tpu, "--model_dir=gs://b/iris", f"--export_dir={tmp_path}/e")
    assert_fails(result, 2, f"--export_dir={tmp_path}/e")
