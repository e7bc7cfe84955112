"""storage: tpurun touches only what it made in a model_dir, never through a link, never outside."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import tensorflow as tf

from tpurun import storage
from tpurun.errors import RunError
from tpurun.layout import names as layout
from tpurun.storage import records, removals, writes


@pytest.fixture
def model_dir(tmp_path):
    path = tmp_path / "model"
    path.mkdir()
    return path


@pytest.fixture
def outside(tmp_path):
    """A directory of the user's outside the model_dir, with a file that must survive."""
    path = tmp_path / "outside"
    path.mkdir()
    (path / "sentinel.txt").write_text("the user's\n")
    return path


def assert_untouched(outside) -> None:
    assert (outside / "sentinel.txt").read_text() == "the user's\n"


# --- remove ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, pattern, removed",
    [
        ("ckpt-12_temp", layout.CHECKPOINT_TEMP, True),
        ("ckpt-notes_template", layout.CHECKPOINT_TEMP, False),
        ("ckpt-12_temp.csv", layout.CHECKPOINT_TEMP, False),
        ("ckpt-7.data-00000-of-00001", layout.CHECKPOINT_DATA, True),
        ("ckpt-old.data-00000-of-00001", layout.CHECKPOINT_DATA, False),
        ("ckpt-7.data-notes", layout.CHECKPOINT_DATA, False),
    ],
)
def test_remove_takes_only_names_matching_in_full(model_dir, name, pattern, removed):
    path = model_dir / name
    path.write_text("x")
    assert storage.remove(str(model_dir), str(path), pattern) is removed
    assert path.exists() is not removed


@pytest.mark.parametrize("target", ["../outside/sentinel.txt", "/etc/passwd"])
def test_remove_refuses_a_path_outside_the_model_dir(model_dir, outside, target):
    path = os.path.normpath(os.path.join(model_dir, target))
    with pytest.raises(RunError, match="outside --model_dir"):
        storage.remove(str(model_dir), path, re.compile(".*"))
    assert_untouched(outside)


def test_a_link_in_the_way_is_removed_as_a_link_and_its_target_kept(model_dir, outside):
    link = model_dir / "ckpt-5_temp"
    link.symlink_to(outside, target_is_directory=True)
    assert storage.remove(str(model_dir), str(link), layout.CHECKPOINT_TEMP)
    assert not link.exists() and not link.is_symlink()
    assert_untouched(outside)


def test_a_tree_is_removed_without_following_the_links_inside_it(model_dir, outside):
    tree = model_dir / "ckpt-9_temp"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "part").write_text("x")
    (tree / "sub" / "to_outside").symlink_to(outside, target_is_directory=True)
    (tree / "file_link").symlink_to(outside / "sentinel.txt")
    assert storage.remove(str(model_dir), str(tree), layout.CHECKPOINT_TEMP)
    assert not tree.exists()
    assert_untouched(outside)


def test_remove_on_ram_takes_exact_names_only():
    model_dir = f"ram://storage-{uuid.uuid4().hex}"
    for name in ("ckpt-3_temp/part", "ckpt-notes_template/part"):
        tf.io.gfile.makedirs(f"{model_dir}/{name.split('/')[0]}")
        with tf.io.gfile.GFile(f"{model_dir}/{name}", "w") as f:
            f.write("x")
    assert storage.remove(model_dir, f"{model_dir}/ckpt-3_temp", layout.CHECKPOINT_TEMP)
    assert not storage.remove(model_dir, f"{model_dir}/ckpt-notes_template", layout.CHECKPOINT_TEMP)
    assert tf.io.gfile.exists(f"{model_dir}/ckpt-notes_template/part")
    assert not tf.io.gfile.exists(f"{model_dir}/ckpt-3_temp/part")


# --- writing ---------------------------------------------------------------------------


def test_write_atomically_replaces_a_link_not_its_target(model_dir, outside):
    path = model_dir / "train_config.json"
    path.symlink_to(outside / "sentinel.txt")
    storage.write_atomically(str(path), "{}\n")
    assert not path.is_symlink() and path.read_text() == "{}\n"
    assert_untouched(outside)
    assert sorted(os.listdir(model_dir)) == ["train_config.json"]  # no temporary left


def test_temporaries_are_unique_per_call_and_process(model_dir):
    names = {layout.temporary_path(str(model_dir / "best")) for _ in range(100)}
    assert len(names) == 100
    match = layout.TEMPORARY.fullmatch(os.path.basename(names.pop()))
    assert match and match.group("name") == "best" and int(match.group("pid")) == os.getpid()


def test_a_temporary_is_created_exclusively_and_never_through_a_link(model_dir, outside):
    taken = model_dir / "taken"
    taken.write_text("someone's")
    with pytest.raises(FileExistsError):
        writes.create(str(taken), "mine")
    link = model_dir / "link"
    link.symlink_to(outside / "new.txt")
    with pytest.raises(OSError):
        writes.create(str(link), "mine")
    assert taken.read_text() == "someone's" and not (outside / "new.txt").exists()


def test_make_dir_refuses_a_link_below_the_model_dir(model_dir, outside):
    (model_dir / "eval").symlink_to(outside, target_is_directory=True)
    with pytest.raises(RunError, match=r"eval is a symbolic link .* writes only inside"):
        storage.make_dir(str(model_dir), str(model_dir / "eval"))
    assert storage.make_dir(str(model_dir), str(model_dir / "runs")) == str(model_dir / "runs")


def test_rename_dir_moves_everything_on_ram():
    root = f"ram://rename-{uuid.uuid4().hex}"
    tf.io.gfile.makedirs(f"{root}/a/sub")
    for name in ("a/x", "a/sub/y"):
        with tf.io.gfile.GFile(f"{root}/{name}", "w") as f:
            f.write(name)
    storage.rename_dir(f"{root}/a", f"{root}/b")
    assert not tf.io.gfile.exists(f"{root}/a")
    with tf.io.gfile.GFile(f"{root}/b/sub/y") as f:
        assert f.read() == "a/sub/y"


# --- leftovers of processes that died ---------------------------------------------------


def leftover(directory, pid: int, host: str = layout.HOST) -> os.PathLike:
    path = directory / f".train_config.json.tpurun-tmp-{host}-{pid}-0123abcd"
    path.write_text("{")
    return path


def dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid += 1


def test_leftovers_of_dead_processes_go_and_live_ones_stay(model_dir):
    (model_dir / "eval").mkdir()
    dead = leftover(model_dir, dead_pid())
    dead_in_eval = leftover(model_dir / "eval", dead_pid())
    (model_dir / "eval" / "test").mkdir()
    dead_in_split = leftover(model_dir / "eval" / "test", dead_pid())
    live = leftover(model_dir, os.getpid())
    foreign_fresh = leftover(model_dir, 1, host="other-vm")
    foreign_old = model_dir / ".best.tpurun-tmp-other-vm-1-0123abcd"
    foreign_old.mkdir()
    old = time.time() - removals.FOREIGN_TEMPORARY_AGE - 60
    os.utime(foreign_old, (old, old))
    removed = storage.remove_leftovers(str(model_dir))
    assert sorted(removed) == sorted(map(str, (dead, dead_in_eval, dead_in_split, foreign_old)))
    assert live.exists() and foreign_fresh.exists()


def test_a_users_file_that_only_looks_like_a_temporary_stays(model_dir):
    mine = model_dir / "notes.tpurun-tmp-old.txt"
    mine.write_text("mine")
    assert storage.remove_leftovers(str(model_dir)) == []
    assert mine.exists()


# --- records -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content, reason",
    [
        (b"", "empty"),
        (b'{"step": 5', "not JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8 text"),
        (b"[1, 2]", "no step in it"),
    ],
    ids=["empty", "truncated", "binary", "wrong_shape"],
)
def test_a_damaged_record_names_the_file_and_what_is_wrong(model_dir, content, reason):
    path = model_dir / "best.json"
    path.write_bytes(content)
    with pytest.raises(
        records.DamagedRecord, match=re.escape(str(path)) + r" is damaged \(" + reason
    ):
        records.read_json(str(path), keys=("step",))


def test_a_missing_record_is_none(model_dir):
    assert records.read_json(str(model_dir / "best.json")) is None
    assert records.read_text(str(model_dir / "checkpoint")) is None


# --- writes and directory renames, on a local disk and on ram:// ---------------------


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path) -> Iterator[str]:
    """A fresh directory on the local disk, or in TensorFlow's in-memory ram://."""
    if request.param == "local":
        yield str(tmp_path)
        return
    root = f"ram://files-{uuid.uuid4().hex}"
    tf.io.gfile.makedirs(root)
    yield root
    tf.io.gfile.rmtree(root)


def tree(directory: str) -> dict[str, str]:
    """Every file below `directory` by its relative path, with its text."""
    files = {}
    for parent, _, names in tf.io.gfile.walk(directory):
        for name in names:
            path = tf.io.gfile.join(parent, name)
            with tf.io.gfile.GFile(path) as f:
                files[path[len(directory) + 1 :]] = f.read()
    return files


def test_write_atomically_writes_and_overwrites_leaving_no_temporary_file(root):
    path = tf.io.gfile.join(root, "results.json")
    storage.write_atomically(path, "first")
    storage.write_atomically(path, "second")
    assert tree(root) == {"results.json": "second"}


def test_a_failed_write_leaves_the_old_file_and_no_temporary(root, monkeypatch):
    path = tf.io.gfile.join(root, "results.json")
    storage.write_atomically(path, "old")

    def failing_rename(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "storage went away")

    monkeypatch.setattr(tf.io.gfile, "rename", failing_rename)
    with pytest.raises(tf.errors.UnavailableError):
        storage.write_atomically(path, "new")
    monkeypatch.undo()
    assert tree(root) == {"results.json": "old"}


def test_rename_dir_moves_every_file_and_subdirectory(root):
    source, target = tf.io.gfile.join(root, "a"), tf.io.gfile.join(root, "b")
    files = {"best.json": "{}", "ckpt-1.index": "i", "variables/variables.index": "v"}
    for name, text in files.items():
        tf.io.gfile.makedirs(tf.io.gfile.join(source, name.rpartition("/")[0]))
        with tf.io.gfile.GFile(tf.io.gfile.join(source, name), "w") as f:
            f.write(text)
    storage.rename_dir(source, target)
    assert tree(target) == files
    assert not tf.io.gfile.exists(source)
    assert tf.io.gfile.listdir(root) in (["b"], ["b/"])


def test_rename_dir_of_an_empty_directory(root):
    source, target = tf.io.gfile.join(root, "a"), tf.io.gfile.join(root, "b")
    tf.io.gfile.makedirs(source)
    storage.rename_dir(source, target)
    assert tf.io.gfile.isdir(target) and not tf.io.gfile.exists(source)


# --- gs:// read fresh ------------------------------------------------------------------


def test_importing_tpurun_turns_tensorflows_gcs_stat_cache_off_unless_the_user_set_it():
    """Before TensorFlow is imported (it reads the setting once, then), in a fresh process."""
    show = (
        "import os, sys, tpurun; "
        "print(os.environ['GCS_STAT_CACHE_MAX_AGE'], 'tensorflow' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "GCS_STAT_CACHE_MAX_AGE"}
    for setting, shown in ((None, "0 False"), ("7", "7 False")):
        extra = {"GCS_STAT_CACHE_MAX_AGE": setting} if setting else {}
        result = subprocess.run(
            [sys.executable, "-c", show], env={**env, **extra}, capture_output=True, text=True
        )
        assert result.stdout.strip() == shown, result.stderr


def test_a_tpurun_process_sees_at_once_what_another_process_removed_and_saved(bucket):
    """A resume's removal of ckpt-60_temp/ and the next save's state file, seen by a process
    that looked before: fresh with tpurun's setting. (A user's own cache age is kept:
    test_importing_tpurun_turns_tensorflows_gcs_stat_cache_off_unless_the_user_set_it; the
    cache then answers as TensorFlow's does, stale, which is TensorFlow's to test.)"""
    from tpurun.storage import checkpoints

    model_dir = f"{bucket}/iris"
    temp = f"{model_dir}/ckpt-60_temp"
    with tf.io.gfile.GFile(f"{temp}/part-00000-of-00001.index", "w") as f:
        f.write("what a killed save left")
    checkpoints.write_state(model_dir, [f"{model_dir}/ckpt-50"])
    env = {k: v for k, v in os.environ.items() if k != "GCS_STAT_CACHE_MAX_AGE"}
    reader = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("reads_again.py")), model_dir],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert reader.stdout is not None and reader.stdin is not None
        first = json.loads(reader.stdout.readline() or "null")
        assert first == {
            "cache_age": "0",
            "temp_dir": True,
            "checkpoints": ["ckpt-50"],
        }, reader.stderr.read() if first is None else first
        tf.io.gfile.rmtree(temp)
        checkpoints.write_state(model_dir, [f"{model_dir}/ckpt-50", f"{model_dir}/ckpt-60"])
        out, err = reader.communicate("\n", timeout=120)
    finally:
        reader.kill()
    assert reader.returncode == 0, err
    again = json.loads(out)
    assert again == {"cache_age": "0", "temp_dir": False, "checkpoints": ["ckpt-50", "ckpt-60"]}
