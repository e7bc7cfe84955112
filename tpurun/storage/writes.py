"""Writing in a model_dir: new files created exclusively, records replaced atomically.

Temporary names are unique per process (`tpurun.layout.names.temporary_path`: host,
pid, random) and created exclusively, never through a link, so two processes never
share one; a temporary left by a process that died is removed by the next run
(`tpurun.storage.removals.remove_leftovers`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import tensorflow as tf

from tpurun.layout import names
from tpurun.layout.names import basename, join
from tpurun.layout.plain_files import is_local
from tpurun.storage.paths import make_dir, require_inside


def probe_writable(model_dir: str) -> None:
    """Writes and removes a file of this process in model_dir, or raises what failed."""
    probe = names.temporary_path(join(model_dir, names.WRITE_PROBE))
    create(probe, "ok")
    tf.io.gfile.remove(probe)


def create(path: str, text: str | bytes) -> None:
    """Creates a new file with `text`; on a local disk exclusively and never through a link."""
    mode = "wb" if isinstance(text, bytes) else "w"
    if not is_local(path):
        with tf.io.gfile.GFile(path, mode) as f:
            f.write(text)
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    descriptor = os.open(path, flags, 0o644)
    with os.fdopen(descriptor, mode, encoding=None if "b" in mode else "utf-8") as f:
        f.write(text)


def write_atomically(path: str, text: str | bytes) -> None:
    """Writes `text` (or bytes) to `path` through a temporary of this process and a rename.

    A process killed mid-write leaves the old file (or none), never a truncated
    one. Where `path` is a symbolic link, the link is replaced, not its target.
    On gs:// an upload is atomic by itself (the object appears whole when the
    upload completes, or not at all), and a rename is a copy and a delete: the
    file is uploaded in place.
    """
    if path.startswith("gs://"):
        create(path, text)
        return
    temporary = names.temporary_path(path)
    try:
        create(temporary, text)
        tf.io.gfile.rename(temporary, path, overwrite=True)
    except BaseException:
        _remove_quietly(temporary)
        raise


def _remove_quietly(path: str) -> None:
    try:
        if is_local(path):
            os.unlink(path)
        elif tf.io.gfile.exists(path):
            tf.io.gfile.remove(path)
    except (OSError, tf.errors.OpError):
        pass  # never made, or already gone


def rename_dir(source: str, target: str) -> None:
    """Renames a directory with its contents, on any TensorFlow file system.

    A local disk renames it at once and GCS object by object, but TensorFlow's
    in-memory ram:// renames only the directory's own entry and leaves what is in it
    under the old name: there the files are moved one by one.
    """
    tf.io.gfile.rename(source, target)
    if is_local(source) or not tf.io.gfile.exists(source):
        return
    for directory, _, files in tf.io.gfile.walk(source):
        moved_to = target + directory[len(source) :]
        tf.io.gfile.makedirs(moved_to)
        for name in files:
            tf.io.gfile.rename(join(directory, name), join(moved_to, name))
    # Left behind: empty subdirectories, through which alone the source still exists
    # (without any, as for the flat model_dir/best, it is already gone).
    if tf.io.gfile.exists(source):
        for child in tf.io.gfile.listdir(source):
            tf.io.gfile.rmtree(join(source, child))


def move_into(model_dir: str, paths: Iterable[str], directory: str) -> str:
    """Moves tpurun's files `paths` (inside model_dir) into model_dir/`directory`; returns it."""
    destination = make_dir(model_dir, join(model_dir, directory))
    for path in paths:
        require_inside(model_dir, path)
        tf.io.gfile.rename(path, join(destination, basename(path)), overwrite=True)
    return destination
