"""The whole life of a run with its model_dir and data in a gs:// bucket (the test GCS server).

Train with cadence and retention, eval and the best checkpoint (`export --best` of it:
tests/test_gcs_failures.py), predict from and to gs:// (through `tpurun.cli.main`
itself), warm start from gs://, TensorBoard events read back (by a real TensorBoard
server too, from the files uploaded in the background), the eval --continuous sidecar,
mnist TFRecords read from gs://, SIGKILL at random moments while a save is in flight and
inside a save, then resume bit-identically. In this process where a run needs no process
of its own (`tpurun_cli`); kills in subprocesses, with the helpers of tests/test_resume.py.
Every request of the life's runs goes through the proxy, none refused or asking for a
token. (That a fresh process finds its way to the bucket from the environment alone:
tests/test_datasets.py.)
"""

from __future__ import annotations

import functools
import http.client
import json
import logging
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from unittest import mock

import forked
import pytest
import tensorflow as tf
from absl.testing import flagsaver
from conftest import (
    REPO,
    RUN_FAILURE,
    assert_fails,
    assert_ok,
    free_local_ports,
    tpurun_in_process,
)
from test_resume import IRIS as SAVING_EVERY_LOOP
from test_resume import SAVING, assert_bit_identical, group_survivors, train_process
from tpurun.models import iris

from tests.synthetic_images import write_digit_records
from tpurun import cli
from tpurun.layout import names as layout_names
from tpurun.storage.background import events

pytestmark = pytest.mark.slow
# The killed runs': a save every 10-step loop on gs:// costs ~0.3 s. The first is killed
# about half a second after its save of step 30 starts, the second inside its second
# save after that: 80 leaves more loops after both than the kills can take.
STEPS = 80


@pytest.fixture
def iris_on_gcs(bucket) -> list[str]:
    """The common flags of a run whose model_dir and data are in `bucket`."""
    for name in ("iris_training.csv", "iris_test.csv"):
        tf.io.gfile.copy(iris.shipped_csv(name), f"{bucket}/data/{name}")
    return [
        "--config=iris",
        "--use_tpu=false",
        f"--model_dir={bucket}/iris",
        f"--config.data.train_path={bucket}/data/iris_training.csv",
        f"--config.data.eval_path={bucket}/data/iris_test.csv",
    ]


def scalars(logdir: str) -> dict[str, list[int]]:
    """The steps of every scalar in the TensorBoard events files directly in `logdir`."""
    found: dict[str, list[int]] = {}
    for path in sorted(tf.io.gfile.glob(f"{logdir}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                found.setdefault(value.tag, []).append(event.step)
    return found


def tensorboard_losses(logdir: str, last: int) -> list[int]:
    """The steps of `loss` that a real TensorBoard server reading `logdir` shows: TensorBoard's
    own server and data ingester, in this process (no second TensorFlow import), loading the
    events once before it serves (`last`: the run is over, every events file uploaded)."""
    from absl.flags import argparse_flags
    from tensorboard import program

    [port] = free_local_ports(1)
    board = program.TensorBoard()
    # TensorBoard's parser inherits this process's absl flags, and tpurun's `--port`
    # (data-service) would clash with its own: a parser that inherits none.
    with mock.patch.object(
        program.argparse_flags,
        "ArgumentParser",
        functools.partial(argparse_flags.ArgumentParser, inherited_absl_flags=None),
    ):
        board.configure(
            argv=[None, f"--logdir={logdir}", f"--port={port}", "--host=127.0.0.1"]
            + ["--load_fast=false", "--reload_interval=0", "--reload_task=blocking"]
        )
    server = board._make_server()  # what `launch()` serves from a thread it keeps
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            connection.request("GET", "/data/plugin/scalars/scalars?run=.&tag=loss")
            answer = connection.getresponse()
            assert answer.status == 200, answer.read()
            steps = [step for _, step, _ in json.loads(answer.read())]
        finally:
            connection.close()
        assert steps[-1] == last, steps
        return steps
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=60)


def test_train_eval_best_export_predict_warm_start_on_gcs(
    bucket,
    gcs,
    iris_on_gcs,
    tpurun_cli,
    monkeypatch,
):
    """Every command of a run's life on gs://, one after the other in this process (main()
    runs several times in one process). Every storage request goes through the proxy: none
    may be refused (a host other than Google's storage API) or ask for a token."""
    model_dir = f"{bucket}/iris"
    # TensorBoard events uploaded in the background after every host loop, each file
    # twice and then the next one.
    monkeypatch.setattr(events, "UPLOADS_PER_FILE", 2)
    result = assert_ok(
        tpurun_cli(
            "train",
            *iris_on_gcs,
            "--train_steps=40",
            "--iterations=10",
            "--save_checkpoints_steps=10",
            "--keep_checkpoint_max=2",
            "--eval_every=20",
            "--config.train.summary_upload_secs=0",
        )
    )
    saved = re.findall(r"Saved checkpoint \S+/ckpt-(\d+)\.", result.stderr)
    assert saved == ["10", "20", "30", "40"]
    # Retention: the two newest are kept, the state file lists them.
    assert tf.train.get_checkpoint_state(model_dir).all_model_checkpoint_paths == [
        f"{model_dir}/ckpt-30",
        f"{model_dir}/ckpt-40",
    ]
    names = tf.io.gfile.listdir(model_dir)
    assert not [n for n in names if re.match(r"ckpt-(10|20)\.", n)], names
    assert "eval at step 40 on test:" in result.stdout and "(30 examples)" in result.stdout
    assert {"results-20.json", "results-40.json"} <= set(
        tf.io.gfile.listdir(f"{model_dir}/eval/test")
    )
    with tf.io.gfile.GFile(f"{model_dir}/eval/test/results-40.json") as f:
        assert json.load(f)["global_step"] == 40

    # TensorBoard on gs://, read back: a loss per host loop, eval metrics at eval steps;
    # the graph's events file, then one per 2 loops, and at the end the run's time account
    # (goodput/*); what a real TensorBoard shows.
    train_scalars = scalars(model_dir)
    assert train_scalars["loss"] == list(range(10, 41, 10))
    assert scalars(f"{model_dir}/eval_test")["accuracy"] == [20, 40]
    assert len(tf.io.gfile.glob(f"{model_dir}/events.out.tfevents.*")) == 1 + 4 // 2 + 1
    assert tensorboard_losses(model_dir, 40) == list(range(10, 41, 10))
    # tpurun report reads the run records on gs:// (through gcsfs, without TensorFlow).
    table = assert_ok(tpurun_cli("report", f"--model_dir={model_dir}")).stdout
    assert "1 train process(es), 0 disruption(s), 0 restart(s), 40 steps kept" in table

    # The best checkpoint, kept apart (ckpt-20 is deleted by retention); `export --best` of
    # a gs:// model_dir, served: tests/test_gcs_failures.py (after a failed export).
    with tf.io.gfile.GFile(f"{model_dir}/best/best.json") as f:
        best = json.load(f)
    assert best["checkpoint"] in ("ckpt-20", "ckpt-40")
    assert tf.io.gfile.exists(f"{model_dir}/best/{best['checkpoint']}.index")

    # predict --input=gs://...csv --output=gs://...jsonl, through `tpurun.cli.main` itself,
    # as a program embedding tpurun calls it, after the runs above in this process.
    rows = f"{bucket}/rows.csv"
    with tf.io.gfile.GFile(rows, "w") as f:
        f.write("SepalLength,SepalWidth,PetalLength,PetalWidth\n5.1,3.3,1.7,0.5\n6.9,3.1,5.4,2.1\n")
    output = f"{bucket}/out/predictions.jsonl"
    # main() sets the levels of the progress lines (the root's and absl's loggers): put
    # back, or a later test of this worker would see no INFO line.
    levels = logging.root.level, logging.getLogger("absl").level
    try:
        with flagsaver.flagsaver():
            predict = ["predict", *iris_on_gcs, f"--input={rows}", f"--output={output}"]
            assert cli.main(["tpurun", *predict]) == 0
    finally:
        logging.root.setLevel(levels[0])
        logging.getLogger("absl").setLevel(levels[1])
    with tf.io.gfile.GFile(output) as f:
        assert [json.loads(line)["class_ids"] for line in f] == [0, 2]

    # --warm_start_from=gs://: a new run starts from these weights at step 0.
    warm = [flag for flag in iris_on_gcs if not flag.startswith("--model_dir")]
    result = assert_ok(
        tpurun_cli(
            "train",
            *warm,
            f"--model_dir={bucket}/warm",
            f"--warm_start_from={model_dir}",
            "--train_steps=10",
            "--iterations=10",
        )
    )
    assert f"from {model_dir}/ckpt-40; training starts at step 0" in result.stderr

    assert not [r for r in gcs.requests if r.kind in ("refused", "auth")], gcs.requests
    leftovers = [
        name
        for root, _, files in tf.io.gfile.walk(bucket)
        for name in files
        if ".tpurun-tmp-" in name or "_temp" in name or ".tmp" in name
    ]
    assert leftovers == []


def test_a_waiting_sidecar_polls_at_a_bounded_request_rate(bucket, gcs, tpurun_cli):
    with gcs.counting() as log:
        started = time.monotonic()
        result = tpurun_cli(
            "eval", "--config=iris", "--continuous", "--eval_timeout=3", f"--model_dir={bucket}/m"
        )
        seconds = time.monotonic() - started
    assert_fails(result, RUN_FAILURE, "no checkpoint appeared")
    # One stat of the state file per 1-second poll (TensorFlow's stat cache may save some).
    assert len(log) <= 2 * seconds + 4, log


def test_mnist_reads_its_tfrecords_from_gcs_and_an_eval_sidecar_evaluates_beside_its_trainer(
    bucket, gcs, tpurun_cli
):
    """mnist's TFRecords on gs://, read by its trainer (in this process) and by an
    `eval --continuous` sidecar (a process of its own) started first, which evaluates each
    checkpoint as it is saved and stops after the final step's."""
    data_dir = write_digit_records(f"{bucket}/data", train=100, test=50)  # type: ignore[arg-type]
    common = (
        "--config=mnist",
        f"--data_dir={data_dir}",
        f"--model_dir={bucket}/mnist",
        "--use_tpu=false",
        "--config.conv_filters=(4, 8)",
        "--config.hidden_units=16",
        "--batch_size=25",
        "--eval_batch_size=25",
        "--train_steps=16",
    )
    sidecar = forked.Popen(
        [sys.executable, "-m", "tpurun", "eval", *common, "--continuous", "--eval_timeout=120"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert sidecar.stderr is not None
        started = []  # its log up to the line that says it waits for a first checkpoint
        for line in sidecar.stderr:
            started.append(line)
            if "Waiting for a checkpoint" in line:
                break
        assert sidecar.poll() is None, "".join(started)
        assert_ok(tpurun_cli("train", *common, "--iterations=8", "--save_checkpoints_steps=8"))
        out, err = sidecar.communicate(timeout=180)
    finally:
        sidecar.kill()
    assert sidecar.returncode == 0, err[-3000:]
    assert re.findall(r"eval at step (\d+) on test:", out) == ["8", "16"], out
    assert out.count("(50 examples)") == 2, out
    assert "stopped after the checkpoint of the final step 16" in out


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted Iris run of STEPS on a local disk, saving every loop (in this
    process: tests/test_resume.py shows it trains as a fresh process does)."""
    model_dir = tmp_path_factory.mktemp("reference")
    assert_ok(
        tpurun_in_process(
            "train", *SAVING_EVERY_LOOP, f"--train_steps={STEPS}", f"--model_dir={model_dir}"
        )
    )
    return model_dir / f"ckpt-{STEPS}"


def test_sigkill_while_a_save_is_in_flight_then_inside_a_save_on_gcs_then_resume_is_bit_identical(
    bucket, gcs, reference, tmp_path, monkeypatch
):
    """Two trainers killed, then one run resumes to the end, bit-identical to `reference`.

    The first is SIGKILLed at a random moment while a save is in flight (every request of
    a save slowed: one is always being written). The second resumes from what it left and
    is killed inside its second background save to gs://, which is written on the local
    disk, then uploaded (.index last): between its uploads, leaving a .data without its
    .index on gs:// and its local directory, both removed by the next run. Each next run
    takes over the lease the killed one left (on a local disk: tests/test_resume.py)."""
    model_dir = f"{bucket}/iris"
    common = (*SAVING_EVERY_LOOP, f"--train_steps={STEPS}", f"--model_dir={model_dir}")
    gcs.slow(0.02, path="ckpt-")
    rng = random.Random(7)
    # At least 3 loops and saves before the end: the kill (0-0.5 s later) finds it running,
    # and the next trainer has two saves to make.
    target = rng.choice(range(20, 50, 10))
    process = train_process(model_dir, f"--train_steps={STEPS}")  # type: ignore[arg-type]
    assert process.stderr is not None
    for line in process.stderr:
        saving = SAVING.search(line)
        if saving and int(saving.group(1)) >= target:
            time.sleep(rng.uniform(0.0, 0.5))  # in a save's requests, at random
            process.send_signal(signal.SIGKILL)
            break
    assert process.wait(timeout=120) == -signal.SIGKILL
    assert not group_survivors(process), "the killed trainer left a process behind"
    gcs.clear_faults()

    local = tmp_path / "tmp"  # the runs' temporary directory (TMPDIR)
    local.mkdir()
    killed = forked.run(
        [sys.executable, str(REPO / "tests" / "kill_inside_save.py"), "upload", "2", "train"]
        + list(common),
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(local)},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = re.search(rf"Resuming from {model_dir}/ckpt-(\d+) ", killed.stderr)
    assert resumed, killed.stderr[-3000:]
    # The lease each killed trainer left (on gs://, an object naming it) is taken over.
    taken = f"Taking over the lease of host {socket.gethostname()}, pid {process.pid}, "
    assert taken in killed.stderr and f"pid {process.pid} of this machine is gone" in killed.stderr
    with tf.io.gfile.GFile(f"{model_dir}/{layout_names.LEASE}") as f:
        dead = json.load(f)["pid"]
    assert dead not in (process.pid, os.getpid())
    inside = int(resumed.group(1)) + 20  # its second save, a loop of 10 steps each
    # What the kill left: the data uploaded, not its .index; the local copy.
    assert tf.io.gfile.exists(f"{model_dir}/ckpt-{inside}.data-00000-of-00001")
    assert not tf.io.gfile.exists(f"{model_dir}/ckpt-{inside}.index")
    (left,) = staging_dirs(local)  # beside it, TensorFlow's GCS client's own upload buffers
    assert re.fullmatch(r"tpurun-ckpt-\d+-\w+", left.name) and (left / "ckpt.index").exists()

    monkeypatch.setattr(tempfile, "tempdir", str(local))
    result = assert_ok(tpurun_in_process("train", *common))
    assert f"Resuming from {model_dir}/ckpt-{inside - 10} (step {inside - 10})" in result.stderr
    assert f"pid {dead} of this machine is gone" in result.stderr
    assert not tf.io.gfile.exists(f"{model_dir}/{layout_names.LEASE}")  # released at the run's end
    assert not tf.io.gfile.exists(f"{model_dir}/ckpt-{inside}_temp")
    assert staging_dirs(local) == []
    assert_bit_identical(f"{model_dir}/ckpt-{STEPS}", reference)  # type: ignore[arg-type]
    names = [name for _, _, files in tf.io.gfile.walk(model_dir) for name in files]
    assert not [n for n in names if "_temp" in n or "tempstate" in n or "tpurun-tmp" in n], names


def staging_dirs(directory: Path) -> list[Path]:
    return [p for p in directory.iterdir() if p.name.startswith("tpurun-ckpt-")]
