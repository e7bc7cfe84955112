"""Exact, atomic resume: killed at any moment, a run ends with the weights of an uninterrupted one.

The runs that are killed (SIGKILL) are processes of their own; every other run,
the uninterrupted references among them, is in-process. The SIGKILLed runs' end
matching an in-process reference bit for bit also shows that an in-process run
trains as a fresh process does."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import forked
import numpy as np
import pytest
import tensorflow as tf
from conftest import OFFLINE_ENV, REPO, assert_fails, assert_ok, tpurun_in_process

from tpurun.layout import names as layout_names

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


# How far each reference trains: 100 steps on 1 replica (the runs killed below resume to
# it: 10 saves, each a large part of a step's time), 50 on 2 (each of their steps costs
# more). (tests/test_recipes.py and tests/test_gcs_life.py train
# KILLED's 300 steps below.)
STEPS = 100
REFERENCE_STEPS = {"1": STEPS, "2": STEPS // 2}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """Uninterrupted runs: 100 steps on 1 replica, 50 on 2."""
    runs = {}
    for shards, steps in REFERENCE_STEPS.items():
        model_dir = tmp_path_factory.mktemp(f"reference-{shards}")
        assert_ok(
            tpurun_in_process(
                "train",
                *IRIS,
                f"--num_shards={shards}",
                f"--train_steps={steps}",
                f"--model_dir={model_dir}",
            )
        )
        runs[shards] = model_dir / f"ckpt-{steps}"
    return runs


@pytest.mark.parametrize("shards", ["1", "2"])
def test_stopping_and_resuming_gives_bit_identical_weights(tpurun_cli, tmp_path, reference, shards):
    # Stops off the loop boundary (23: a short last loop), then ends the run (on 1 replica at
    # 100; on 2 at 50). (Resumes on the loop boundary: each resume of the tests below.)
    stops = [23, REFERENCE_STEPS[shards]]
    for steps in stops:
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
        if steps != 23:
            # Resumed at 23, the loops end at 33, 43, ...: each passes a multiple of the
            # cadence (10) and saves, as the uninterrupted run did at 30, 40, ...
            assert saved == [str(s) for s in range(33, steps, 10)] + [str(steps)], saved
    assert "Resuming from" in result.stderr and f"ckpt-{stops[-2]}" in result.stderr
    assert_bit_identical(tmp_path / f"ckpt-{stops[-1]}", reference[shards])


def train_process(model_dir: Path, *extra: str, slow_saves: float = 0.0) -> forked.Popen:
    """A 300-step Iris run whose stderr (the log) is read as it goes; `slow_saves`: every
    checkpoint write waits that long twice (tests/slow_saves.py), so a save is in flight."""
    program = ["-m", "tpurun"]
    if slow_saves:
        program = [str(REPO / "tests" / "slow_saves.py"), str(slow_saves)]
    return forked.Popen(
        [sys.executable, *program, "train", *KILLED, f"--model_dir={model_dir}", *extra],
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


def group_survivors(process: forked.Popen) -> bool:
    """Whether any process of `process`'s group is still alive (it is reaped already)."""
    try:
        os.killpg(process.pid, 0)
    except ProcessLookupError:
        return False
    return True


# A line of the log: the host loop that ended at a step, while the save of an earlier one is
# being written in the background.
SAVING = re.compile(r"\] step (\d+)/\d+ .*  saving ckpt-(\d+)")


# The runs killed inside a save (killed_inside_a_save), and the one that ends their work:
# KILLED's flags, to the reference's STEPS.
KILLED_INSIDE = (*IRIS, f"--train_steps={STEPS}", "--keep_checkpoint_max=3")


def killed_inside_a_save(model_dir: Path, point: str, nth: str) -> tuple[int, str, int]:
    """A run with KILLED_INSIDE's flags, in its own process group, that SIGKILLs itself (the
    tpurun process) at `point` of its `nth` save (tests/kill_inside_save.py), run to its end:
    its exit code, stderr and pid; nothing of its group may survive it."""
    process = forked.Popen(
        [sys.executable, str(REPO / "tests" / "kill_inside_save.py"), point, nth, "train",
         *KILLED_INSIDE, f"--model_dir={model_dir}"],
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: what it started is found by it
    )  # fmt: skip
    _, stderr = process.communicate(timeout=300)
    assert not group_survivors(process), "the killed trainer left a process behind"
    return process.returncode, stderr, process.pid


def newest_complete(model_dir: Path) -> int:
    return max(
        int(index.name[len("ckpt-") : -len(".index")]) for index in model_dir.glob("ckpt-*.index")
    )


def test_sigkill_inside_a_save_leaves_a_resumable_model_dir(tmp_path, reference):
    """Three runs, one after the other in one model_dir, each resuming what the one before
    left and then SIGKILLed: inside its 3rd save's merge, inside its 3rd state-file update
    (one per save), inside its 3rd old-checkpoint deletion (tests/kill_inside_save.py).
    Each leaves what its point leaves, the next resumes from the newest complete checkpoint
    and takes over the dead trainer's lease, and the last resume (in this process) ends
    bit-identical to an uninterrupted run with nothing of a save left over. (Killed by the
    test at a random moment while a save is in flight: tests/test_user_gan.py's on a local
    disk, tests/test_gcs_life.py's on gs://, which also kills inside a save's upload.)"""
    complete, dead = None, None
    for point in ("merge", "state", "delete"):
        code, stderr, pid = killed_inside_a_save(tmp_path, point, "3")
        assert code == -signal.SIGKILL, stderr
        if complete is not None:  # the newest complete one the kill before left, its lease
            assert f"Resuming from {tmp_path / f'ckpt-{complete}'} " in stderr
            assert re.search(rf"Took over the lease of host \S+, pid {dead}, .* is gone", stderr)
        dead = pid  # its lease is left behind, naming it
        assert json.loads((tmp_path / layout_names.LEASE).read_text())["pid"] == dead
        complete = newest_complete(tmp_path)
        # What each kill leaves: tensors not yet merged, a complete checkpoint the state
        # file does not name yet, the .data of an old checkpoint whose .index is gone.
        if point == "merge":
            assert list(tmp_path.glob(f"ckpt-{complete + 10}_temp*"))
        elif point == "state":
            assert latest(tmp_path).name != f"ckpt-{complete}"
        else:
            data, indexes = tmp_path.glob("ckpt-*.data-*"), tmp_path.glob("ckpt-*.index")
            assert len(list(data)) > len(list(indexes))
    err = assert_ok(tpurun_in_process("train", *KILLED_INSIDE, f"--model_dir={tmp_path}")).stderr
    assert f"Resuming from {tmp_path / f'ckpt-{complete}'} " in err
    assert re.search(rf"Took over the lease of host \S+, pid {dead}, .* is gone", err)
    assert not (tmp_path / layout_names.LEASE).exists()  # released at the run's end
    # Iris trains on device data: a run this short on the plain loop, untimed, whatever the
    # machine's load (config.train.xla="auto"), so the runs and their reference choose alike.
    assert "Training data on the device" in err and "too few for XLA's compile" in err
    assert_bit_identical(tmp_path / f"ckpt-{STEPS}", reference["1"])
    assert not [p for p in tmp_path.rglob("*") if re.search(r"_temp|tempstate|tpurun-tmp", p.name)]
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


def test_damaged_newest_checkpoints_are_moved_aside_and_the_one_before_used(
    tpurun_cli, tmp_path, reference
):
    """In a copy of the 100-step reference (checkpoints 60..100), the three newest
    checkpoints each damaged a way of their own (each fails a read of its own kind), and the
    state file garbled: every damaged one is moved aside, the checkpoints are found from
    their files, and the run resumes from the newest intact one."""
    shutil.copytree(reference["1"].parent, tmp_path, dirs_exist_ok=True)
    damages = {100: damage_truncate, 90: damage_flip_bytes, 80: damage_index}
    for step, damage in damages.items():
        damage(tmp_path / f"ckpt-{step}")
    (tmp_path / "checkpoint").write_text("model_checkpoint_path: \x00garbage {{{")
    resumed = assert_ok(
        tpurun_cli("train", *IRIS, f"--train_steps={STEPS}", f"--model_dir={tmp_path}")
    )
    for step in damages:
        assert f"Checkpoint {tmp_path / f'ckpt-{step}'} is damaged" in resumed.stderr
        assert (tmp_path / "damaged" / f"ckpt-{step}.index").exists()
    assert f"Resuming from {tmp_path / 'ckpt-70'} " in resumed.stderr
    assert_bit_identical(tmp_path / "ckpt-100", reference["1"])
    assert latest(tmp_path).name == "ckpt-100"


def test_every_checkpoint_damaged_is_one_clear_error(tpurun_cli, tmp_path, reference):
    shutil.copytree(reference["1"].parent, tmp_path, dirs_exist_ok=True)
    for index in tmp_path.glob("ckpt-*.index"):
        index.write_bytes(b"junk")
    assert_fails(
        tpurun_cli("train", *IRIS, f"--train_steps={STEPS}", f"--model_dir={tmp_path}"),
        1,
        "no checkpoint in",
        "can be restored",
        "damaged",
    )


# (A model with Dropout and BatchNorm reading TFRecords, which do not seek, resumed
# bit-identically from a checkpoint of its uninterrupted run: mnist's dropout and input
# skipped forward in tests/test_datasets.py's test_a_resumed_run_is_bit_identical_to_an_
# uninterrupted_one; resnet50's BatchNorm and TFRecords, killed, in
# tests/test_models_resnet50.py's test_sigkill_then_resume_with_the_jpeg_pipeline_is_bit_
# identical; the dropout state under XLA in tests/test_device_data.py.)


# --- a full disk, and saves the loop waits for -------------------------------------------


def fill_the_disk(monkeypatch, where: str) -> None:
    """Makes the save of ckpt-60 fail as a full disk does, while writing its tensors (after
    a part of them, with TensorFlow's error) or its state file (Python's): a save in the
    background and one the loop waits for both go through these."""
    from tensorflow.python.ops import io_ops

    from tpurun.storage import checkpoints

    if where == "tensors":
        save_v2 = io_ops.save_v2

        def full(prefix, *args, **kwargs):
            shard = prefix.numpy().decode()
            if "/ckpt-60_temp/" not in shard:
                return save_v2(prefix, *args, **kwargs)
            partial = Path(f"{shard}.data-00000-of-00001.tempstate1")
            partial.parent.mkdir(parents=True, exist_ok=True)
            partial.write_bytes(b"\0" * 64)  # as far as it got
            raise tf.errors.ResourceExhaustedError(
                None, None, f"{partial}; No space left on device"
            )

        monkeypatch.setattr(io_ops, "save_v2", full)
    else:
        write_state = checkpoints.write_state

        def full(model_dir, paths):
            if paths[-1].endswith("ckpt-60"):
                raise OSError(errno.ENOSPC, "No space left on device")
            write_state(model_dir, paths)

        monkeypatch.setattr(checkpoints, "write_state", full)


def checkpoint_steps(model_dir: Path) -> list[int]:
    return sorted(
        int(p.name[len("ckpt-") : -len(".index")]) for p in model_dir.glob("ckpt-*.index")
    )


def test_a_full_disk_in_a_background_save_is_one_line_keeps_the_maximum_and_resumes(
    tpurun_cli, tmp_path, reference, monkeypatch
):
    """The save of ckpt-60 fails as a full disk does while its tensors are written, then, in
    the run that resumes, while its state file is: each time one line, the model_dir as before
    the save; once the disk has room, the run resumes and ends as an uninterrupted one."""
    common = KILLED_INSIDE
    model_dir = tmp_path / "async"
    for where in ("tensors", "state"):
        with monkeypatch.context() as patch:
            fill_the_disk(patch, where)
            failed = tpurun_cli("train", *common, f"--model_dir={model_dir}")
            line = assert_fails(failed, 1, "No space left on device")
            if where == "tensors":  # the line a save the loop waited for gives
                waited = tpurun_cli(
                    "train",
                    *common,
                    "--config.train.async_checkpoint=false",
                    f"--model_dir={tmp_path}",
                )
                assert assert_fails(waited, 1) == line.replace(str(model_dir), str(tmp_path))
            else:
                assert f"Resuming from {model_dir / 'ckpt-50'} " in failed.stderr
        # As before the failed save: its temporary and its checkpoint gone, 3 kept.
        assert checkpoint_steps(model_dir) == [30, 40, 50]
        assert tf.train.get_checkpoint_state(str(model_dir)).all_model_checkpoint_paths == [
            str(model_dir / f"ckpt-{step}") for step in (30, 40, 50)
        ]
        assert not [p for p in model_dir.rglob("*") if re.search(r"_temp|tempstate|tmp", p.name)]
    resumed = assert_ok(tpurun_cli("train", *common, f"--model_dir={model_dir}"))
    assert f"Resuming from {model_dir / 'ckpt-50'} " in resumed.stderr
    assert checkpoint_steps(model_dir) == [80, 90, 100]
    assert latest(model_dir).name == "ckpt-100"
    assert_bit_identical(model_dir / "ckpt-100", reference["1"])


def test_async_checkpoint_false_waits_for_every_save_and_writes_the_same_checkpoints(
    tpurun_cli, tmp_path, reference
):
    result = assert_ok(
        tpurun_cli(
            "train",
            *IRIS,
            f"--train_steps={STEPS}",
            "--config.train.async_checkpoint=false",
            f"--model_dir={tmp_path}",
        )
    )
    saved = re.findall(
        r"Saved checkpoint \S+ckpt-(\d+)\. \(written in \S+ while training waited\)", result.stderr
    )
    assert saved == [str(step) for step in range(10, STEPS + 1, 10)], result.stderr
    assert "saving ckpt-" not in result.stderr and "in the background" not in result.stderr
    # The same values as the background saves of the reference run, save counter included.
    assert checkpoint_steps(tmp_path) == checkpoint_steps(reference["1"].parent)
    for step in checkpoint_steps(tmp_path):
        ours = tf.train.load_checkpoint(str(tmp_path / f"ckpt-{step}"))
        theirs = tf.train.load_checkpoint(str(reference["1"].parent / f"ckpt-{step}"))
        names = ours.get_variable_to_shape_map()
        assert names.keys() == theirs.get_variable_to_shape_map().keys()
        assert all(np.array_equal(ours.get_tensor(n), theirs.get_tensor(n)) for n in names)


# --- Storage that fails under a background save, for real ---------------------------------


@pytest.fixture
def small_disk(tmp_path) -> Iterator[Path]:
    """A file system of its own (a 4 MiB tmpfs) where a test can fill the disk or make it
    read-only for real; skipped where this process may not mount one (not root, or no
    CAP_SYS_ADMIN: the injected full disk above stands in for it there)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * (64 << 10))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC


def _unwritable(directory: Path, writable: bool = False) -> None:
    """Takes the write permission on `directory` away (or gives it back): for root, to whom
    permissions do not apply, with the immutable attribute (`chattr +i`)."""
    if os.geteuid() != 0:
        directory.chmod(0o755 if writable else 0o555)
    elif subprocess.run(["chattr", "-i" if writable else "+i", str(directory)]).returncode:
        pytest.skip(f"chattr +i does not work on {directory}'s file system")


# (where the model_dir is, what happens to it as ckpt-50 is about to be written, what the
# line says, how the cause goes away)
BROKEN_STORAGE = {
    "the disk fills": (
        "small_disk",
        lambda d: _fill(d),
        ("the disk is full (No space left on device)", "make room on it"),
        lambda d: (d / "filler").unlink(),
    ),
    "the write permission is lost": (
        "tmp_path",
        lambda d: _unwritable(d / "model"),
        ("writing there is not permitted", "make it writable for this user"),
        lambda d: _unwritable(d / "model", writable=True),
    ),
}


@pytest.mark.parametrize("case", BROKEN_STORAGE)
def test_storage_that_breaks_under_a_background_save_is_one_line_and_a_rerun_resumes(
    tpurun_cli, request, reference, monkeypatch, case
):
    """The save of ckpt-50, in the background, meets a full disk or a model_dir it may no
    longer write (for real): the line names the model_dir, the cause, its fix and the last
    good checkpoint; nothing of the save is left; once the cause is gone the rerun resumes
    from that checkpoint and ends bit-identical to an uninterrupted run."""
    from tpurun.storage import checkpoints

    where, breaks, says, mend = BROKEN_STORAGE[case]
    disk = request.getfixturevalue(where)
    model_dir = disk / "model"
    common = (*KILLED_INSIDE, f"--model_dir={model_dir}")
    commit = checkpoints.Saver.commit

    def breaking(self, snapshot):
        if snapshot.path.endswith("/ckpt-50"):
            breaks(disk)
        return commit(self, snapshot)

    try:
        with monkeypatch.context() as patch:
            patch.setattr(checkpoints.Saver, "commit", breaking)
            line = assert_fails(tpurun_cli("train", *common), 1, f"--model_dir={model_dir}", *says)
    finally:
        mend(disk)
    assert "could not save ckpt-50" in line
    assert (
        "the last good checkpoint is ckpt-40 (intact: nothing of the failed save is left)" in line
    )
    assert checkpoint_steps(model_dir) == [20, 30, 40]
    assert not [p for p in model_dir.rglob("*") if re.search(r"_temp|tempstate|tpurun-tmp", p.name)]
    resumed = assert_ok(tpurun_cli("train", *common))
    assert f"Resuming from {model_dir / 'ckpt-40'} " in resumed.stderr
    assert_bit_identical(model_dir / "ckpt-100", reference["1"])


def test_a_model_dir_removed_under_a_background_save_is_one_line(tpurun_cli, tmp_path, monkeypatch):
    from tpurun.storage import checkpoints

    model_dir = tmp_path / "model"
    common = (*IRIS, f"--train_steps={STEPS}", f"--model_dir={model_dir}")
    commit = checkpoints.Saver.commit

    def removing(self, snapshot):
        if snapshot.path.endswith("/ckpt-50"):
            shutil.rmtree(model_dir)
        return commit(self, snapshot)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoints.Saver, "commit", removing)
        assert_fails(
            tpurun_cli("train", *common),
            1,
            f"could not save ckpt-50 in --model_dir={model_dir}: the model_dir is gone",
            "rerun the same command to train from step 0",
        )
    assert not model_dir.exists()  # nothing made again by the failed run
