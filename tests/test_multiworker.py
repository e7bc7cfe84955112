"""MultiWorkerMirroredStrategy from TF_CONFIG: two worker processes on 127.0.0.1 work together."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import forked
import numpy as np
import pytest
from conftest import OFFLINE_ENV, RUN_FAILURE, assert_ok, free_local_ports

from tpurun.errors import EXIT_PREEMPTED, EXIT_UNAVAILABLE

pytestmark = pytest.mark.slow

# `python -m tpurun` itself, which also saves this worker's weights where its
# Controller.train ends (a preemption too), so the test can compare workers (a non-chief
# keeps no checkpoint of its own).
SAVING_WEIGHTS = """
import sys
import numpy as np
from tpurun.runners import controller

train = controller.Controller.train


def train_then_save_weights(self):
    try:
        return train(self)
    finally:
        np.savez(weights, *[v.numpy() for v in self.trainer.keras_model.weights])


controller.Controller.train = train_then_save_weights
weights = sys.argv.pop(1)
sys.argv[0] = "tpurun"
from tpurun.__main__ import main

main()
"""


def wait_all(started: list[tuple[forked.Popen, Path]], timeout: float) -> list[int]:
    """Exit codes of all workers; on a timeout, kills them and fails with the end of each log."""
    deadline = time.monotonic() + timeout
    try:
        return [
            process.wait(timeout=max(0.0, deadline - time.monotonic())) for process, _ in started
        ]
    except subprocess.TimeoutExpired:
        for process, _ in started:
            process.kill()
            process.wait()
        tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for _, log in started)
        pytest.fail(f"workers still running after {timeout}s:\n{tails}")


def start_worker(
    workers: list[str], index: int, log: Path, *args: str, weights: Path | None = None
) -> tuple[forked.Popen, Path]:
    """Starts `tpurun train --config=iris` as worker `index` of `workers`, stderr to `log`
    (stdout to `log` with .out for .log); with `weights`, saving its weights there."""
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    env = {**os.environ, **OFFLINE_ENV, "TF_CONFIG": json.dumps(tf_config)}
    tpurun = ["-m", "tpurun"] if weights is None else ["-c", SAVING_WEIGHTS, str(weights)]
    command = [sys.executable, *tpurun, "train", "--config=iris", "--use_tpu=false"]
    process = forked.Popen(
        [*command, "--iterations=10", *args],
        env=env,
        stdout=log.with_suffix(".out").open("w"),
        stderr=log.open("w"),
    )
    return process, log


def wait_for_line(started: tuple[forked.Popen, Path], text: str, timeout: float = 300) -> None:
    process, log = started
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def preempted_then_chief_lost(tmp_path_factory) -> dict:
    """One cluster's life: two workers train (saving every 20 steps, evaluating every 40,
    on both: the first evaluation traces the eval step, each costs seconds); one
    SIGTERMed (a preemption) stops both, each saving its weights where its training ended;
    the job restarted at the same addresses resumes, trains on, and loses its chief
    (SIGKILL, without notice). What each test below asserts on."""
    tmp_path = tmp_path_factory.mktemp("preempted")
    model_dir = tmp_path / "model"
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]

    def start(index: int, attempt: int, *args: str, **weights: Path):
        log = tmp_path / f"worker-{index}-{attempt}.log"
        # Still training when signalled or killed, however fast.
        return start_worker(
            workers,
            index,
            log,
            f"--model_dir={model_dir}",
            "--train_steps=100000000",
            *args,
            **weights,
        )

    evaluating = (
        "--save_checkpoints_steps=20",
        "--eval_every=40",
        "--keep_checkpoint_max=1000",  # ckpt-40 kept, evaluated again by the test
    )
    first = [start(i, 0, *evaluating, weights=tmp_path / f"weights-{i}.npz") for i in range(2)]
    wait_for_line(first[0], "step 50/")
    first[1][0].send_signal(signal.SIGTERM)  # the non-chief worker only
    first_codes = wait_all(first, timeout=300)
    first_logs = [log.read_text() for _, log in first]
    found = [re.search(r"saved a checkpoint at step (\d+)", log) for log in first_logs]
    assert all(found), first_logs[0][-3000:] + first_logs[1][-3000:]
    saved = [int(f.group(1)) for f in found if f]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(model_dir))
    runs = sorted(path.name for path in (model_dir / "runs").iterdir())
    scratch = model_dir / ".scratch"
    scratch_checkpoints = list(scratch.rglob("*.index")) if scratch.exists() else []
    second = [start(i, 1) for i in range(2)]  # the same addresses, as a restarted job has
    wait_for_line(second[0], f"step {saved[0] + 20}/")  # resumed and trained on
    second[0][0].kill()  # the chief
    second_codes = wait_all(second, timeout=300)
    return {
        "tmp_path": tmp_path,
        "model_dir": model_dir,
        "first_codes": first_codes,
        "first_logs": first_logs,
        "first_stdouts": [log.with_suffix(".out").read_text() for _, log in first],
        "saved": saved,
        "latest": latest,
        "runs": runs,
        "scratch_checkpoints": scratch_checkpoints,
        "second_codes": second_codes,
        "second_logs": [log.read_text() for _, log in second],
    }


def test_sigterm_to_one_worker_stops_both_at_the_same_saved_step(preempted_then_chief_lost):
    """A preempted worker must not stop alone: the others would block in their next all-reduce."""
    run = preempted_then_chief_lost
    logs = run["first_logs"]
    assert run["first_codes"] == [EXIT_PREEMPTED, EXIT_PREEMPTED], logs[0][-3000:] + logs[1][-3000:]
    steps = run["saved"]
    assert steps[0] == steps[1], steps
    assert run["latest"].endswith(f"ckpt-{steps[0]}")
    resumed = run["second_logs"][0]
    assert f"Resuming from {run['model_dir'] / f'ckpt-{steps[0]}'} (step {steps[0]})" in resumed


def test_two_workers_train_to_identical_weights_and_eval_exactly(
    preempted_then_chief_lost, tpurun_cli
):
    run = preempted_then_chief_lost
    logs = run["first_logs"]
    assert "Running on 2 workers, 2 replicas (MultiWorkerMirroredStrategy) as worker-0" in logs[0]
    assert "Running on 2 workers, 2 replicas (MultiWorkerMirroredStrategy) as worker-1" in logs[1]

    chief = np.load(run["tmp_path"] / "weights-0.npz")
    other = np.load(run["tmp_path"] / "weights-1.npz")
    assert len(chief.files) == 6
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])

    # Only the chief's checkpoints and one run record; the worker's scratch copies are gone.
    model_dir = run["model_dir"]
    assert (model_dir / "ckpt-20.index").exists() and (model_dir / "ckpt-40.index").exists()
    assert len(run["runs"]) == 1, run["runs"]
    assert not run["scratch_checkpoints"]
    assert "Saved checkpoint" in logs[0] and "Saved checkpoint" not in logs[1]

    # Each worker evaluates its half of the 30 rows (padded, masked); the metric
    # state is summed across workers, so both report what one process reports.
    reference = assert_ok(
        tpurun_cli(
            "eval",
            "--config=iris",
            "--use_tpu=false",
            f"--model_dir={model_dir}",
            "--checkpoint=40",
            "--split=test",
        )
    )
    expected = next(line for line in reference.stdout.splitlines() if line.startswith("eval at"))
    assert expected.startswith("eval at step 40 ") and expected.endswith("(30 examples)")
    for out in run["first_stdouts"]:
        assert expected in out, out


def test_a_chief_alone_gives_up_after_the_start_timeout_and_removes_its_model_dir(tmp_path):
    """TensorFlow alone waits forever for a worker that never comes (one that failed at start).
    (It never comes, so how long the chief waits does not change what happens: 1 s.)"""
    model_dir = tmp_path / "model"
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]
    chief = start_worker(
        workers, 0, tmp_path / "chief.log", f"--model_dir={model_dir}", "--tpu_init_timeout=1"
    )
    assert wait_all([chief], timeout=300) == [RUN_FAILURE]
    log = chief[1].read_text()
    (line,) = [line for line in log.splitlines() if ": error: " in line]
    assert "worker-0 waited 1s for the other workers of TF_CONFIG" in line, log[-3000:]
    assert all(address in line for address in workers) and "--tpu_init_timeout" in line
    assert "Traceback" not in log
    assert not model_dir.exists()


def test_a_worker_that_dies_mid_run_makes_the_other_fail_with_a_message(
    preempted_then_chief_lost,
):
    run = preempted_then_chief_lost
    # The chief killed; exit 69 for the other: a transient failure, which
    # `train --max_restarts` restarts.
    assert run["second_codes"] == [-signal.SIGKILL, EXIT_UNAVAILABLE], run["second_logs"][1][-3000:]
    log = run["second_logs"][1]
    (line,) = [line for line in log.splitlines() if ": error: " in line]
    assert "lost contact with another worker of the cluster" in line, log[-3000:]
    assert "restart every worker with the same command" in line
    assert "Traceback" not in log
