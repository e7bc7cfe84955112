"""Paths in a model_dir: inside it or not, made (never through a link), listed strictly.

A failed storage request is never taken for an answer: TensorFlow's `isdir` and
`listdir` say "no such directory" when a gs:// request failed (a 503, a reset), which
would make a run start from step 0 beside its checkpoints, or remove a model_dir it
thinks it created. `isdir` and `listdir` here raise instead. A gs:// bucket is checked
once per process before the first directory is made in it (`require_bucket`):
TensorFlow's makedirs in a bucket that does not exist loops forever, asking for the
bucket thousands of times a second.
"""

from __future__ import annotations

import os

import tensorflow as tf

from tpurun.errors import RunError, storage_errors
from tpurun.layout.plain_files import is_local


def _normal(path: str) -> str:
    if is_local(path):
        return os.path.normpath(os.path.abspath(path))
    scheme, rest = path.split("://", 1)
    parts = [p for p in rest.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise RunError(f"{path}: a path with '..' in it; give the path without it")
    return f"{scheme}://" + "/".join(parts)


def inside(model_dir: str, path: str) -> bool:
    """Whether `path` is below `model_dir` (by name: links are checked where it matters)."""
    root, target = _normal(model_dir), _normal(path)
    return target != root and target.startswith(root.rstrip("/") + "/")


def require_inside(model_dir: str, path: str) -> None:
    """Refuses a path outside model_dir, whatever a state file or record says."""
    if not inside(model_dir, path):
        raise RunError(
            f"refusing to touch {path}: it is outside --model_dir={model_dir} (a state file "
            "or record that names it is damaged or was edited)"
        )


def is_link(path: str) -> bool:
    return is_local(path) and os.path.islink(path)


_buckets: set[str] = set()  # buckets require_bucket found


def make_dir(model_dir: str, path: str, flag: str = "--model_dir") -> str:
    """Creates `path` (model_dir or a directory below it) unless it exists; returns it.

    On a local disk, a directory between model_dir and `path` that is a symbolic
    link is refused: tpurun writes only inside the model_dir it was given.
    `flag` names where the path came from, for the error of a missing bucket.
    On gs:// a directory is only a prefix of the objects in it, so none is made
    (TensorFlow's makedirs would ask 3 to 6 requests for a placeholder object).
    """
    if path != model_dir and not inside(model_dir, path):
        raise RunError(f"{path} is outside --model_dir={model_dir}; tpurun writes only inside it")
    if is_local(path):
        _refuse_links_between(model_dir, path)
    require_bucket(path, flag)
    if not path.startswith("gs://"):
        tf.io.gfile.makedirs(path)
    return path


def require_bucket(path: str, flag: str = "--model_dir") -> None:
    """Fails with the command that creates it when `path` is in a gs:// bucket that does not exist.

    Asked once per bucket and process. Other failures (no permission, unreachable)
    are raised as TensorFlow's errors, which `storage_errors.explain` words.
    """
    if not path.startswith("gs://"):
        return
    bucket = storage_errors.bucket_of(path)
    if bucket in _buckets:
        return
    try:
        tf.io.gfile.stat(bucket)
    except tf.errors.NotFoundError:
        raise RunError(storage_errors.missing_bucket(bucket, flag)) from None
    _buckets.add(bucket)


def failure(error: BaseException) -> str:
    """A storage error on one line: what it means and the fix for gs://, else its message."""
    message = str(getattr(error, "message", None) or error)
    explained = storage_errors.explain(message, type(error).__name__)
    return explained or f"{type(error).__name__}: {' '.join(message.split())[:300]}"


def isdir(path: str) -> bool:
    """Whether `path` is a directory; a failed request raises (tf.io.gfile.isdir says False)."""
    if is_local(path) or path.startswith("ram://"):
        return tf.io.gfile.isdir(path)
    try:
        return tf.io.gfile.stat(path).is_directory
    except tf.errors.NotFoundError:
        return False


def listdir(directory: str) -> list[str]:
    """The names in `directory` ([] if there is none); a failed request raises.

    tf.io.gfile.listdir answers NotFound both for a missing directory and when
    its check that the directory exists failed: then the strict `isdir` tells.
    """
    try:
        return tf.io.gfile.listdir(directory)
    except tf.errors.NotFoundError:
        if isdir(directory):  # it is there: the listing failed, and raises again
            return tf.io.gfile.listdir(directory)
        return []


def _refuse_links_between(model_dir: str, path: str) -> None:
    root = _normal(model_dir)
    current = _normal(path)
    while current != root and current.startswith(root + os.sep):
        if os.path.islink(current):
            raise RunError(
                f"{current} is a symbolic link (to {os.readlink(current)}); tpurun writes only "
                f"inside --model_dir={model_dir}: remove the link, or use another --model_dir"
            )
        current = os.path.dirname(current)
