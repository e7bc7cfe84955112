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

import numpy as np
import pytest
from conftest import OFFLINE_ENV, RUN_FAILURE, assert_ok, free_local_ports

from tpurun.errors import EXIT_PREEMPTED, EXIT_UNAVAILABLE

pytestmark = pytest.mark.slow

# Both worker scripts run the launcher's own code paths. The train one then saves
# this worker's final weights so the test can compare workers (a non-chief keeps
# no checkpoint of its own).
PRELUDE = """
import logging
import sys
import numpy as np
from absl import logging as absl_logging
from tpurun import cli, commands, model as model_lib
from tpurun.cluster import strategy

run = cli.parse(sys.argv[2], ["tpurun", *sys.argv[3:]])
absl_logging.use_absl_handler()
logging.root.setLevel(logging.INFO)
cluster = strategy.build(run)
"""
TRAIN_WORKER = (
    PRELUDE
    + """
from tpurun.runners.controller import Controller
from tpurun.runners.train import Trainer
if cluster.is_chief:
    commands.prepare_model_dir(run)
    commands.write_record(run)
trainer = Trainer(run, cluster, model_lib.create(run.config))
Controller(run, cluster, trainer).train()
np.savez(sys.argv[1], *[v.numpy() for v in trainer.keras_model.weights])
print("task", cluster.task, "chief", cluster.is_chief, "replicas", cluster.num_replicas)
"""
)
# ...then `tpurun eval` of what it trained, on the same cluster (a process and cluster
# fewer than an eval job of its own; the eval command's code all the same).
TRAIN_THEN_EVAL_WORKER = (
    TRAIN_WORKER
    + """
evaluation = cli.parse(
    "eval",
    ["tpurun", "--config=iris", "--use_tpu=false", "--eval_batch_size=8", f"--model_dir={run.model_dir}"],
)
commands.evaluate(evaluation, cluster, model_lib.create(evaluation.config))
"""
)


def run_workers(script: str, command: str, tmp_path: Path, *args: str) -> list[tuple[str, str]]:
    """Runs `script` as worker 0 and worker 1 of one cluster; returns their (stdout, stderr)."""
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]
    processes = []
    for index in range(2):
        tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        env = {**os.environ, **OFFLINE_ENV, "TF_CONFIG": json.dumps(tf_config)}
        argv = [sys.executable, "-c", script, str(tmp_path / f"weights-{index}.npz"), command]
        processes.append(
            subprocess.Popen(
                [*argv, "--config=iris", "--use_tpu=false", *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    try:
        outputs = [p.communicate(timeout=300) for p in processes]
    except subprocess.TimeoutExpired:
        for process in processes:
            process.kill()
        tails = "\n".join(
            f"--- worker {i}\n{p.communicate()[1][-3000:]}" for i, p in enumerate(processes)
        )
        pytest.fail(f"workers still running after 300s:\n{tails}")
    for process, (_, err) in zip(processes, outputs, strict=True):
        assert process.returncode == 0, err[-4000:]
    return outputs


def wait_all(started: list[tuple[subprocess.Popen, Path]], timeout: float) -> list[int]:
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


def test_two_workers_train_to_identical_weights_and_eval_exactly(tpurun_cli, tmp_path):
    model_dir = tmp_path / "model"
    outputs = run_workers(
        TRAIN_THEN_EVAL_WORKER,
        "train",
        tmp_path,
        "--train_steps=40",
        "--iterations=10",
        "--config.train.save_checkpoints_steps=20",
        f"--model_dir={model_dir}",
    )
    assert "task worker-0 chief True replicas 2" in outputs[0][0]
    assert "task worker-1 chief False replicas 2" in outputs[1][0]

    chief = np.load(tmp_path / "weights-0.npz")
    other = np.load(tmp_path / "weights-1.npz")
    assert len(chief.files) == 6
    for name in chief.files:
        np.testing.assert_array_equal(chief[name], other[name])

    # Only the chief's checkpoints and one run record; the worker's scratch copies are gone.
    assert (model_dir / "ckpt-20.index").exists() and (model_dir / "ckpt-40.index").exists()
    assert len(list((model_dir / "runs").iterdir())) == 1
    scratch = model_dir / ".scratch"
    assert not scratch.exists() or not any(scratch.rglob("*.index"))
    assert "Saved checkpoint" in outputs[0][1] and "Saved checkpoint" not in outputs[1][1]

    # Each worker evaluates its half of the 30 rows (padded, masked); the metric
    # state is summed across workers, so both report what one process reports.
    reference = assert_ok(
        tpurun_cli("eval", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}")
    )
    expected = next(line for line in reference.stdout.splitlines() if line.startswith("eval at"))
    assert expected.endswith("(30 examples)")
    for out, _ in outputs:
        assert expected in out


def start_worker(
    workers: list[str], index: int, log: Path, *args: str
) -> tuple[subprocess.Popen, Path]:
    """Starts `tpurun train --config=iris` as worker `index` of `workers`, stderr to `log`."""
    tf_config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
    env = {**os.environ, **OFFLINE_ENV, "TF_CONFIG": json.dumps(tf_config)}
    command = [sys.executable, "-m", "tpurun", "train", "--config=iris", "--use_tpu=false"]
    process = subprocess.Popen(
        [*command, "--iterations=10", *args],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    return process, log


def wait_for_line(started: tuple[subprocess.Popen, Path], text: str, timeout: float = 300) -> None:
    process, log = started
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        assert process.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)


@pytest.fixture(scope="module")
def preempted_then_chief_lost(tmp_path_factory) -> dict:
    """One cluster's life: a worker SIGTERMed (a preemption) stops both; the job restarted
    at the same addresses resumes, trains on, and loses its chief (SIGKILL, without
    notice). What each test below asserts on."""
    tmp_path = tmp_path_factory.mktemp("preempted")
    model_dir = tmp_path / "model"
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]

    def start(index: int, attempt: int) -> tuple[subprocess.Popen, Path]:
        log = tmp_path / f"worker-{index}-{attempt}.log"
        # Still training when signalled or killed, however fast.
        return start_worker(
            workers, index, log, f"--model_dir={model_dir}", "--train_steps=100000000"
        )

    first = [start(i, 0) for i in range(2)]
    wait_for_line(first[0], "step 50/")
    first[1][0].send_signal(signal.SIGTERM)  # the non-chief worker only
    first_codes = wait_all(first, timeout=300)
    first_logs = [log.read_text() for _, log in first]
    found = [re.search(r"saved a checkpoint at step (\d+)", log) for log in first_logs]
    assert all(found), first_logs[0][-3000:] + first_logs[1][-3000:]
    saved = [int(f.group(1)) for f in found if f]
    import tensorflow as tf

    latest = tf.train.latest_checkpoint(str(model_dir))
    second = [start(i, 1) for i in range(2)]  # the same addresses, as a restarted job has
    wait_for_line(second[0], f"step {saved[0] + 20}/")  # resumed and trained on
    second[0][0].kill()  # the chief
    second_codes = wait_all(second, timeout=300)
    return {
        "model_dir": model_dir,
        "first_codes": first_codes,
        "first_logs": first_logs,
        "saved": saved,
        "latest": latest,
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


def test_a_chief_alone_gives_up_after_the_start_timeout_and_removes_its_model_dir(tmp_path):
    """TensorFlow alone waits forever for a worker that never comes (one that failed at start)."""
    model_dir = tmp_path / "model"
    workers = [f"127.0.0.1:{port}" for port in free_local_ports(2)]
    chief = start_worker(
        workers, 0, tmp_path / "chief.log", f"--model_dir={model_dir}", "--tpu_init_timeout=3"
    )
    assert wait_all([chief], timeout=300) == [RUN_FAILURE]
    log = chief[1].read_text()
    (line,) = [line for line in log.splitlines() if ": error: " in line]
    assert "worker-0 waited 3s for the other workers of TF_CONFIG" in line, log[-3000:]
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
