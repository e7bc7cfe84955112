"""Exact, atomic resume: killed at any moment, a run ends with the weights of an uninterrupted one.

The runs that are killed (SIGKILL) are processes of their own; every other run,
the uninterrupted references among them, is in-process. The SIGKILLed runs' end
matching an in-process reference bit for bit also shows that an in-process run
trains as a fresh process does."""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import OFFLINE_ENV, REPO, assert_fails, assert_ok, tpurun_in_process

pytestmark = pytest.mark.slow

# Iris with a checkpoint every host loop of 10 steps, keeping 3: saves (and the
# deletion of old checkpoints) are a large part of the run, so kills land in them.
IRIS = ("--config=iris", "--use_tpu=false", "--iterations=10", "--save_checkpoints_steps=10")


def weights(checkpoint: Path) -> dict[str, np.ndarray]:
    """Every value in a checkpoint but the save counter (which counts saves, not steps)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(checkpoint))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if not name.startswith("save_counter")
    }


def assert_bit_identical(a: Path, b: Path) -> None:
    first, second = weights(a), weights(b)
    assert first.keys() == second.keys()
    differ = [name for name in first if not np.array_equal(first[name], second[name])]
    assert not differ, f"{len(differ)} of {len(first)} values differ, e.g. {differ[:3]}"


def latest(model_dir: Path) -> Path:
    import tensorflow as tf

    path = tf.train.latest_checkpoint(str(model_dir))
    assert path, f"no checkpoint in {model_dir}"
    return Path(path)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """Uninterrupted runs: 300 steps on 1 replica and on 2."""
    runs = {}
    for shards in ("1", "2"):
        model_dir = tmp_path_factory.mktemp(f"reference-{shards}")
        assert_ok(
            tpurun_in_process(
                "train",
                *IRIS,
                f"--num_shards={shards}",
                "--train_steps=300",
                f"--model_dir={model_dir}",
            )
        )
        runs[shards] = model_dir / "ckpt-300"
    return runs


@pytest.mark.parametrize("shards", ["1", "2"])
def test_stopping_and_resuming_gives_bit_identical_weights(tpurun_cli, tmp_path, reference, shards):
    # Stops off the loop boundary (73: a short last loop) and on it (150).
    for steps in ("73", "150", "300"):
        result = assert_ok(
            tpurun_cli(
                "train",
                *IRIS,
                f"--num_shards={shards}",
                f"--train_steps={steps}",
                f"--model_dir={tmp_path}",
            )
        )
        saved = re.findall(r"Saved checkpoint \S+ckpt-(\d+)\.", result.stderr)
        if steps == "150":
            # Resumed at 73, the loops end at 83, 93, ...: each passes a multiple of
            # the cadence (10) and saves, as the uninterrupted run did at 80, 90, ...
            assert saved == [str(s) for s in range(83, 150, 10)] + ["150"], saved
    assert "Resuming from" in result.stderr and "ckpt-150" in result.stderr
    assert_bit_identical(tmp_path / "ckpt-300", reference[shards])


def train_process(model_dir: Path, *extra: str) -> subprocess.Popen:
    """A 300-step Iris run whose stderr (the log) is read as it goes."""
    return subprocess.Popen(
        [sys.executable, "-m", "tpurun", "train", *KILLED, f"--model_dir={model_dir}", *extra],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: what it started is found by it
    )


# The flags of the runs that are killed (train_process), and of the one that ends their
# work, in this process (`resume_in_process`: nothing kills it).
KILLED = (*IRIS, "--train_steps=300", "--keep_checkpoint_max=3")


def resume_in_process(model_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    """The run that resumes after the kills, with train_process's flags, in this process."""
    return assert_ok(tpurun_in_process("train", *KILLED, f"--model_dir={model_dir}", *extra))


def group_survivors(process: subprocess.Popen) -> bool:
    """Whether any process of `process`'s group is still alive (it is reaped already)."""
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_sigkill_at_random_moments_then_resume_gives_bit_identical_weights(tmp_path, reference):
    """Three attempts killed at random steps (plus 0-20 ms: in a loop, a save or a deletion)."""
    rng = random.Random(4)
    targets = sorted(rng.sample(range(30, 280, 10), 3))
    starts, last_saved = [], []
    for target in targets:
        process = train_process(tmp_path)
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "Resuming from" in line:
                starts.append(int(line.rsplit("step ", 1)[1].split(")")[0]))
            if re.search(rf"\] step {target}/300 ", line):
                time.sleep(rng.uniform(0.0, 0.02))
                process.send_signal(signal.SIGKILL)
                break
        assert process.wait(timeout=120) == -signal.SIGKILL, "".join(lines)[-3000:]
        assert not group_survivors(process), "the killed trainer left a process behind"
        # What it logged until it died (it may have trained on while this process read).
        log = "".join(lines) + process.stderr.read()
        last_saved.append(int(re.findall(r"Saved checkpoint \S+/ckpt-(\d+)\.", log)[-1]))
    err = resume_in_process(tmp_path).stderr
    # Iris trains on device data, with its host loop compiled by XLA.
    assert "Training data on the device" in err and "compiled by XLA" in err
    starts.append(int(re.search(r"Resuming from \S+ \(step (\d+)\)", err).group(1)))
    # Every attempt resumed from the last checkpoint the killed one saved (or the one
    # it completed but was killed before logging): no more than one loop of work redone
    # per kill, wherever the kill landed (it reached the target's step before).
    for target, saved, start in zip(targets, last_saved, starts[-3:], strict=True):
        assert target - 10 <= start and start in (saved, saved + 10), (targets, last_saved, starts)
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])
    assert not list(tmp_path.glob("*_temp*"))


# The 6th save (step 60): its merge, or its state-file update (one per save); the
# 6th old-checkpoint deletion.
@pytest.mark.parametrize(("point", "nth"), [("merge", "6"), ("state", "6"), ("delete", "6")])
def test_sigkill_inside_a_save_leaves_a_resumable_model_dir(
    tpurun_cli, tmp_path, reference, point, nth
):
    killed = subprocess.run(
        [
            sys.executable,
            str(REPO / "tests" / "kill_inside_save.py"),
            point,
            nth,
            "train",
            *IRIS,
            "--train_steps=300",
            "--keep_checkpoint_max=3",
            f"--model_dir={tmp_path}",
        ],
        env={**os.environ, **OFFLINE_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    complete = max(
        int(index.name[len("ckpt-") : -len(".index")]) for index in tmp_path.glob("ckpt-*.index")
    )
    # What each kill leaves: tensors not yet merged, a complete checkpoint the state
    # file does not name yet, the .data of an old checkpoint whose .index is gone.
    if point == "merge":
        assert list(tmp_path.glob(f"ckpt-{complete + 10}_temp*"))
    elif point == "state":
        assert latest(tmp_path).name != f"ckpt-{complete}"
    else:
        assert len(list(tmp_path.glob("ckpt-*.data-*"))) > len(list(tmp_path.glob("ckpt-*.index")))
    resumed = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            "--train_steps=300",
            "--keep_checkpoint_max=3",
            f"--model_dir={tmp_path}",
        )
    )
    assert f"Resuming from {tmp_path / f'ckpt-{complete}'} " in resumed.stderr, resumed.stderr
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])
    assert not list(tmp_path.glob("*_temp*"))
    assert len(list(tmp_path.glob("ckpt-*.data-*"))) == len(list(tmp_path.glob("ckpt-*.index")))


def damage_truncate(path: Path) -> None:
    data = next(path.parent.glob(path.name + ".data-*"))
    data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])


def damage_flip_bytes(path: Path) -> None:
    data = next(path.parent.glob(path.name + ".data-*"))
    raw = bytearray(data.read_bytes())
    for i in range(0, len(raw), 97):
        raw[i] ^= 0xFF
    data.write_bytes(bytes(raw))


def damage_index(path: Path) -> None:
    Path(str(path) + ".index").write_bytes(b"not an index")


@pytest.fixture(scope="module")
def trained_to_200(tmp_path_factory) -> Path:
    """Iris trained to step 200 (checkpoints 160..200), for tests to copy and then damage."""
    model_dir = tmp_path_factory.mktemp("trained-to-200")
    assert_ok(tpurun_in_process("train", *IRIS, "--train_steps=200", f"--model_dir={model_dir}"))
    return model_dir


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip_bytes, damage_index])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_one_before_used(
    tpurun_cli, tmp_path, reference, trained_to_200, damage
):
    shutil.copytree(trained_to_200, tmp_path, dirs_exist_ok=True)
    damage(tmp_path / "ckpt-200")
    resumed = assert_ok(tpurun_cli("train", *IRIS, "--train_steps=300", f"--model_dir={tmp_path}"))
    assert f"Checkpoint {tmp_path / 'ckpt-200'} is damaged" in resumed.stderr
    assert f"Resuming from {tmp_path / 'ckpt-190'} " in resumed.stderr
    assert (tmp_path / "damaged" / "ckpt-200.index").exists()
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])


def test_a_garbled_state_file_does_not_lose_the_checkpoints(
    tpurun_cli, tmp_path, reference, trained_to_200
):
    shutil.copytree(trained_to_200, tmp_path, dirs_exist_ok=True)
    (tmp_path / "checkpoint").write_text("model_checkpoint_path: \x00garbage {{{")
    resumed = assert_ok(tpurun_cli("train", *IRIS, "--train_steps=300", f"--model_dir={tmp_path}"))
    assert f"Resuming from {tmp_path / 'ckpt-200'} " in resumed.stderr
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])
    assert latest(tmp_path).name == "ckpt-300"


def test_every_checkpoint_damaged_is_one_clear_error(tpurun_cli, tmp_path, trained_to_200):
    shutil.copytree(trained_to_200, tmp_path, dirs_exist_ok=True)
    for index in tmp_path.glob("ckpt-*.index"):
        index.write_bytes(b"junk")
    assert_fails(
        tpurun_cli("train", *IRIS, "--train_steps=300", f"--model_dir={tmp_path}"),
        1,
        "no checkpoint in",
        "can be restored",
        "damaged",
    )


def test_a_dropout_and_batchnorm_model_reading_tfrecords_resumes_bit_identically(
    tpurun_cli, tmp_path
):
    """fashion_mnist: Dropout's random state is checkpointed, and its TFRecord input (which
    does not seek) is skipped forward to the step."""
    from synthetic_images import write_digit_records

    data = write_digit_records(tmp_path / "data", train=200, test=20)
    common = (
        "--config=fashion_mnist",
        "--use_tpu=false",
        f"--data_dir={data}",
        "--config.conv_filters=(4, 4, 4)",
        "--config.hidden_units=8",
        "--batch_size=16",
        "--iterations=5",
    )
    assert_ok(tpurun_cli("train", *common, "--train_steps=30", f"--model_dir={tmp_path / 'a'}"))
    assert_ok(tpurun_cli("train", *common, "--train_steps=15", f"--model_dir={tmp_path / 'b'}"))
    resumed = assert_ok(
        tpurun_cli("train", *common, "--train_steps=30", f"--model_dir={tmp_path / 'b'}")
    )
    assert "Skipping 15 batches" in resumed.stderr
    # Every model variable, the dropout layers' seed_generator_state among them.
    saved = [n for n in weights(tmp_path / "a" / "ckpt-30") if n.startswith("model_variables/")]
    assert len(saved) == 26, saved  # weights, BatchNorm statistics, 4 dropout RNG states
    assert_bit_identical(tmp_path / "b" / "ckpt-30", tmp_path / "a" / "ckpt-30")
