"""Exact, atomic resume: killed at any moment, a run ends with the weights of an uninterrupted one."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import OFFLINE_ENV, REPO, assert_fails, assert_ok, run_tpurun

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
            run_tpurun(
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
def test_stopping_and_resuming_gives_bit_identical_weights(tmp_path, reference, shards):
    # Stops off the loop boundary (73: a short last loop) and on it (150).
    for steps in ("73", "150", "300"):
        result = assert_ok(
            run_tpurun(
                "train",
                *IRIS,
                f"--num_shards={shards}",
                f"--train_steps={steps}",
                f"--model_dir={tmp_path}",
            )
        )
    assert "Resuming from" in result.stderr and "ckpt-150" in result.stderr
    assert_bit_identical(tmp_path / "ckpt-300", reference[shards])


def train_process(model_dir: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tpurun",
            "train",
            *IRIS,
            "--train_steps=300",
            "--keep_checkpoint_max=3",
            f"--model_dir={model_dir}",
            *extra,
        ],
        env={**__import__("os").environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigkill_at_random_moments_then_resume_gives_bit_identical_weights(tmp_path, reference):
    """Kills each attempt at a random moment after its first save; the last one finishes."""
    rng = random.Random(4)
    kills, starts = 0, []
    while True:
        process = train_process(tmp_path, "--config.train.steps=300")
        # The first save of an attempt is logged; kill a random 0-150 ms later,
        # which is within the run's next ~1-15 loops and saves.
        saw_save = False
        assert process.stderr is not None
        lines = []
        for line in process.stderr:
            lines.append(line)
            if "Resuming from" in line:
                starts.append(int(line.rsplit("step ", 1)[1].split(")")[0]))
            if "Saved checkpoint" in line and not saw_save:
                saw_save = True
                if kills < 5:
                    time.sleep(rng.uniform(0.0, 0.15))
                    process.send_signal(signal.SIGKILL)
                    break
        code = process.wait(timeout=120)
        if code == -signal.SIGKILL:
            kills += 1
            continue
        assert code == 0, "".join(lines)
        break
    assert kills == 5
    assert len(starts) == 5 and starts == sorted(starts), starts  # progress at every attempt
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])
    assert not list(tmp_path.glob("*_temp*"))


# The 6th save (step 60): its merge, or its first state-file update (a save writes
# the state twice: Checkpoint.save, then the manager); the 6th old-checkpoint deletion.
@pytest.mark.parametrize(("point", "nth"), [("merge", "6"), ("state", "11"), ("delete", "6")])
def test_sigkill_inside_a_save_leaves_a_resumable_model_dir(tmp_path, reference, point, nth):
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
        env={**__import__("os").environ, **OFFLINE_ENV},
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
        run_tpurun(
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


@pytest.mark.parametrize("damage", [damage_truncate, damage_flip_bytes, damage_index])
def test_a_damaged_newest_checkpoint_is_moved_aside_and_the_one_before_used(
    tmp_path, reference, damage
):
    assert_ok(run_tpurun("train", *IRIS, "--train_steps=200", f"--model_dir={tmp_path}"))
    damage(tmp_path / "ckpt-200")
    resumed = assert_ok(run_tpurun("train", *IRIS, "--train_steps=300", f"--model_dir={tmp_path}"))
    assert f"Checkpoint {tmp_path / 'ckpt-200'} is damaged" in resumed.stderr
    assert f"Resuming from {tmp_path / 'ckpt-190'} " in resumed.stderr
    assert (tmp_path / "damaged" / "ckpt-200.index").exists()
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])


def test_a_garbled_state_file_does_not_lose_the_checkpoints(tmp_path, reference):
    assert_ok(run_tpurun("train", *IRIS, "--train_steps=200", f"--model_dir={tmp_path}"))
    (tmp_path / "checkpoint").write_text("model_checkpoint_path: \x00garbage {{{")
    resumed = assert_ok(run_tpurun("train", *IRIS, "--train_steps=300", f"--model_dir={tmp_path}"))
    assert f"Resuming from {tmp_path / 'ckpt-200'} " in resumed.stderr
    assert_bit_identical(tmp_path / "ckpt-300", reference["1"])
    assert latest(tmp_path).name == "ckpt-300"


def test_every_checkpoint_damaged_is_one_clear_error(tmp_path):
    assert_ok(run_tpurun("train", *IRIS, "--train_steps=20", f"--model_dir={tmp_path}"))
    for index in tmp_path.glob("ckpt-*.index"):
        index.write_bytes(b"junk")
    assert_fails(
        run_tpurun("train", *IRIS, "--train_steps=30", f"--model_dir={tmp_path}"),
        1,
        "no checkpoint in",
        "can be restored",
        "damaged",
    )
