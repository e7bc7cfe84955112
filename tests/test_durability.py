"""Guard rails of a training run: NaN stops it cleanly; SIGTERM saves and says "restart me".

In-process, but for the SIGTERM, which goes to a training process of its own (the
controller's handling of it is unit-tested in test_controller.py)."""

from __future__ import annotations

import filecmp
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import forked
import numpy as np
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, assert_ok, error_lines, tpurun_in_process
from conftest import tensorboard_scalars as scalars

from tpurun import report
from tpurun.errors import EXIT_PREEMPTED

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Iris trained to step 200 in host loops of 50 (ckpt-200), in this process: the tests
    below read its summaries, or copy it to resume."""
    model_dir = tmp_path_factory.mktemp("trained") / "model"
    assert_ok(tpurun_in_process("train", "--config=iris", "--use_tpu=false", "--train_steps=200",
                                "--iterations=50", f"--model_dir={model_dir}"))  # fmt: skip
    return model_dir


def test_exploding_learning_rate_stops_with_the_step_range_and_keeps_the_good_checkpoint(
    tpurun_cli, tmp_path, trained
):
    model_dir = Path(shutil.copytree(trained, tmp_path / "model"))
    result = tpurun_cli(
        # 2 replicas: the resumed learning rate is a MirroredVariable there.
        "train",
        "--config=iris",
        "--use_tpu=false",
        "--iterations=50",
        f"--model_dir={model_dir}",
        "--train_steps=400",
        "--config.optimizer.learning_rate=1e30",
        "--num_shards=2",
    )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = error_lines(result)
    assert "between steps 201 and 250" in line
    assert f"{model_dir / 'ckpt-200'}" in line and "lower config.optimizer.learning_rate" in line

    assert tf.train.latest_checkpoint(str(model_dir)).endswith("ckpt-200")
    assert not list(model_dir.glob("ckpt-250*")) and not list(model_dir.glob("ckpt-400*"))
    reader = tf.train.load_checkpoint(str(model_dir / "ckpt-200"))
    for name in reader.get_variable_to_shape_map():
        if name.endswith("VARIABLE_VALUE"):
            assert np.all(np.isfinite(reader.get_tensor(name))), name


# --- SIGTERM at any moment: exit 75 from the first line of tpurun's own code -------------


def _catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler for SIGTERM (its SigCgt mask in /proc)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(re.search(r"^SigCgt:\s*([0-9a-f]+)", status, re.MULTILINE).group(1), 16)
    return bool(mask & (1 << (signal.SIGTERM - 1)))


def _maps_tensorflow(pid: int) -> bool:
    return "libtensorflow" in Path(f"/proc/{pid}/maps").read_text()


# The moments of a start-up a test can see, and what the process is doing right then:
# (how the moment shows, what it means). The first two come before or during TensorFlow's
# import: a fresh interpreter's; the others after it, the same code in a process forked
# from one that imported TensorFlow and tpurun already (tests/forked), which saves two
# imports.
FRESH_MOMENTS = ("imports", "tensorflow's import")
STARTUP_MOMENTS = {
    # tpurun's handler is in place (its first line): the CLI's and TensorFlow's imports follow.
    "imports": (_catches_sigterm, None),
    # TensorFlow's library is mapped: its import goes on for seconds.
    "tensorflow's import": (_maps_tensorflow, None),
    # The run record is written: the Keras model, the input and the restore come next.
    "before the model is built": (None, "tpurun train: model_dir "),
    # The trainer is being built: the model, then the restore and the input's start.
    "the build, the restore, the input": (None, "Global batch 32 split over"),
    # (In the training loop, where a SIGTERM saves at the current step and the next run loses
    # no step: tests/test_supervisor.py's test_sigterm_to_tpurun_is_one_save_exit_75_and_...,
    # forwarded by the supervisor to a trainer like these.)
}


def test_sigterm_at_every_moment_of_a_run_exits_75_and_loses_nothing(trained, tmp_path):
    """Four `tpurun train` processes resume at once; each gets SIGTERM as soon as the test
    sees its moment (polled: its /proc entries, its log lines), then must exit 75 with one
    line, leave nothing running, and keep its checkpoint intact."""
    runs = {}
    for moment in STARTUP_MOMENTS:
        model_dir = Path(shutil.copytree(trained, tmp_path / moment.replace(" ", "-")))
        starts = subprocess.Popen if moment in FRESH_MOMENTS else forked.Popen
        process = starts(
            [sys.executable, "-m", "tpurun", "train", "--config=iris", "--use_tpu=false",
             "--train_steps=100000000", "--save_checkpoints_steps=100000000",
             f"--model_dir={model_dir}"],
            env={**os.environ, **OFFLINE_ENV}, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        lines: list[str] = []
        reader = threading.Thread(
            target=lambda p=process, ls=lines: ls.extend(p.stderr), daemon=True
        )
        reader.start()
        runs[moment] = (process, lines, reader, model_dir)
    waiting = set(runs)
    deadline = time.monotonic() + 600
    while waiting:
        assert time.monotonic() < deadline, f"never seen: {waiting}"
        for moment in list(waiting):
            process, lines, _, _ = runs[moment]
            seen, line = STARTUP_MOMENTS[moment]
            assert process.poll() is None, f"{moment}: ended before its moment: {lines[-5:]}"
            if (seen and seen(process.pid)) or (line and any(line in x for x in list(lines))):
                process.send_signal(signal.SIGTERM)
                waiting.discard(moment)
    for moment, (process, lines, reader, model_dir) in runs.items():
        code = process.wait(timeout=300)
        reader.join(timeout=60)
        log = "".join(lines)
        assert code == EXIT_PREEMPTED, f"{moment}: exit {code}\n{log[-3000:]}"
        (line,) = [x for x in lines if ": error: " in x]
        assert "SIGTERM" in line and "rerun the same command" in line, line
        assert "Traceback" not in log, log[-3000:]
        with pytest.raises(ProcessLookupError):  # nothing of its process group is left
            os.killpg(process.pid, 0)
        # Nothing lost: ckpt-200 as it was (or a newer one, saved at the SIGTERM), whole.
        newest = tf.train.latest_checkpoint(str(model_dir))
        assert filecmp.cmp(trained / "ckpt-200.index", model_dir / "ckpt-200.index", shallow=False)
        tf.train.load_checkpoint(newest).get_variable_to_shape_map()
        assert not [p for p in model_dir.rglob("*") if re.search(r"_temp|tpurun-tmp", p.name)]


def test_train_and_eval_summaries_read_back_by_tag(tpurun_cli, tmp_path, trained):
    model_dir = Path(shutil.copytree(trained, tmp_path / "model"))
    assert_ok(tpurun_cli("eval", "--config=iris", "--use_tpu=false", f"--model_dir={model_dir}"))

    train = scalars(model_dir)
    # At the end, the run's time account (tpurun report's; no FLOPs: the suite does not
    # count them, so no mfu).
    account = {"goodput/goodput_share", "goodput/goodput_s"}
    account |= {f"goodput/{name}_s" for name in report.CATEGORIES}
    assert set(train) == {
        "loss",
        "learning_rate",
        "global_step/sec",
        "examples/sec",
        "input_wait_share",
        *account,
    }
    assert all([step for step, _ in train[tag]] == [200] for tag in account)
    assert 0 < train["goodput/goodput_share"][0][1] < 1
    assert [step for step, _ in train["loss"]] == [50, 100, 150, 200]
    assert all(value == pytest.approx(0.1) for _, value in train["learning_rate"])
    assert train["loss"][-1][1] < train["loss"][0][1]

    evaluation = scalars(model_dir / "eval_test")
    assert {"accuracy", "loss", "num_examples"} <= set(evaluation)
    assert evaluation["num_examples"] == [(200, 30.0)]
    assert not any(tag.startswith("while") for tag in (*train, *evaluation))
