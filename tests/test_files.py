"""tpurun.files: writes a reader never sees half of, and directory renames, on any TF file system."""

from __future__ import annotations

import uuid

import pytest
import tensorflow as tf

from tpurun.files import rename_dir, write_atomically


@pytest.fixture(params=["local", "ram"])
def root(request, tmp_path) -> str:
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
    write_atomically(path, "first")
    write_atomically(path, "second")
    assert tree(root) == {"results.json": "second"}


def test_a_failed_write_leaves_the_old_file(root, monkeypatch):
    path = tf.io.gfile.join(root, "results.json")
    write_atomically(path, "old")

    def failing_rename(*args, **kwargs):
        raise tf.errors.UnavailableError(None, None, "storage went away")

    monkeypatch.setattr(tf.io.gfile, "rename", failing_rename)
    with pytest.raises(tf.errors.UnavailableError):
        write_atomically(path, "new")
    with tf.io.gfile.GFile(path) as f:
        assert f.read() == "old"


def test_rename_dir_moves_every_file_and_subdirectory(root):
    source, target = tf.io.gfile.join(root, "a"), tf.io.gfile.join(root, "b")
    files = {"best.json": "{}", "ckpt-1.index": "i", "variables/variables.index": "v"}
    for name, text in files.items():
        tf.io.gfile.makedirs(tf.io.gfile.join(source, name.rpartition("/")[0]))
        with tf.io.gfile.GFile(tf.io.gfile.join(source, name), "w") as f:
            f.write(text)
    rename_dir(source, target)
    assert tree(target) == files
    assert not tf.io.gfile.exists(source)
    assert tf.io.gfile.listdir(root) in (["b"], ["b/"])


def test_rename_dir_of_an_empty_directory(root):
    source, target = tf.io.gfile.join(root, "a"), tf.io.gfile.join(root, "b")
    tf.io.gfile.makedirs(source)
    rename_dir(source, target)
    assert tf.io.gfile.isdir(target) and not tf.io.gfile.exists(source)
