"""Writing files so that a reader never sees half of one, on any TensorFlow file system."""

from __future__ import annotations

import tensorflow as tf


def write_atomically(path: str, text: str) -> None:
    """Writes `text` to `path` through a temporary file and a rename.

    A process killed mid-write leaves the old file (or none), never a truncated one.
    """
    tmp = path + ".tmp"
    with tf.io.gfile.GFile(tmp, "w") as f:
        f.write(text)
    tf.io.gfile.rename(tmp, path, overwrite=True)


def rename_dir(source: str, target: str) -> None:
    """Renames a directory with its contents, on any TensorFlow file system.

    A local disk renames it at once and GCS object by object, but TensorFlow's
    in-memory ram:// renames only the directory's own entry and leaves what is in it
    under the old name: there the files are moved one by one.
    """
    tf.io.gfile.rename(source, target)
    if not tf.io.gfile.exists(source):
        return
    for directory, _, files in tf.io.gfile.walk(source):
        moved_to = target + directory[len(source) :]
        tf.io.gfile.makedirs(moved_to)
        for name in files:
            tf.io.gfile.rename(tf.io.gfile.join(directory, name), tf.io.gfile.join(moved_to, name))
    # Left behind: empty subdirectories, through which alone the source still exists
    # (without any, as for the flat model_dir/best, it is already gone).
    if not tf.io.gfile.exists(source):
        return
    for child in tf.io.gfile.listdir(source):
        tf.io.gfile.rmtree(tf.io.gfile.join(source, child))
