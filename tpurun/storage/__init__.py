"""The one place that writes, renames and deletes files in a model_dir, and reads its records.

A model_dir is the user's: tpurun may find links, look-alike names and damaged
files there, left by people, crashes and full disks. The rules, on a local disk,
gs:// and ram:// alike:

* Deletes only what it made, by exact name: every removal names the pattern the
  file must match in full (`CHECKPOINT_TEMP`, `CHECKPOINT_DATA`, `TEMPORARY`, ...),
  and a path outside the model_dir it was given is refused, whatever a state file
  or record says.
* Never through a symbolic link (local disks; gs:// and ram:// have none): a link
  in tpurun's way is removed as a link, its target untouched; a directory tree is
  walked without following links; a directory tpurun writes into that is a link
  to elsewhere is refused.
* Temporary names are unique per process (`temporary_path`: host, pid, random)
  and created exclusively, so two processes never share one; a temporary left by
  a process that died is removed by the next run (`remove_leftovers`).
* Records are read through `tpurun.storage.records`: as written, or `DamagedRecord` naming
  the file and what is wrong; each caller recovers or fails with one line.
* A failed storage request is never taken for an answer: TensorFlow's `isdir` and
  `listdir` say "no such directory" when a gs:// request failed (a 503, a reset),
  which would make a run start from step 0 beside its checkpoints, or remove a
  model_dir it thinks it created. `isdir` and `listdir` here raise instead.
* A gs:// bucket is checked once per process before the first directory is made in
  it (`require_bucket`): TensorFlow's makedirs in a bucket that does not exist
  loops forever, asking for the bucket thousands of times a second.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Iterable

import tensorflow as tf
from absl import logging

from tpurun.errors import RunError, storage_errors

# tpurun's names in a model_dir, matched in full (re.fullmatch) against a file's name.
CHECKPOINT_TEMP = re.compile(r"ckpt-\d+_temp")  # TensorFlow's scratch of an unfinished save
CHECKPOINT_INDEX = re.compile(r"ckpt-\d+\.index")
CHECKPOINT_DATA = re.compile(r"ckpt-\d+\.data-\d{5}-of-\d{5}")
_HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"
# `.<name>.tpurun-tmp-<host>-<pid>-<8 hex>`: a temporary of this module, for <name>.
TEMPORARY = re.compile(
    r"\.(?P<name>.+)\.tpurun-tmp-(?P<host>[A-Za-z0-9.-]+)-(?P<pid>\d+)-[0-9a-f]{8}"
)
# A temporary of a process on another machine (a preempted VM, another worker) is
# removed only once it is this old: no write or export of tpurun takes a day.
FOREIGN_TEMPORARY_AGE = 24 * 3600
# Where damaged checkpoints and records are moved, inside the model_dir.
DAMAGED_DIR = "damaged"
# Where tpurun puts temporaries in a model_dir: leftovers are looked for there, and in
# the eval/<split>/ directories.
TEMPORARY_HOMES = ("", "eval", "runs", "export", "best")
_SPLIT_DIR = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


def is_local(path: str) -> bool:
    """A path on this machine's disk (no `scheme://`): the only kind with symbolic links."""
    return "://" not in path


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


def is_link(path: str) -> bool:
    return is_local(path) and os.path.islink(path)


def join(*parts: str) -> str:
    return tf.io.gfile.join(*parts)


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


# --- Directories ---------------------------------------------------------------------


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


def probe_writable(model_dir: str) -> None:
    """Writes and removes a file of this process in model_dir, or raises what failed."""
    probe = temporary_path(join(model_dir, "write-probe"))
    _create(probe, "ok")
    tf.io.gfile.remove(probe)


# --- Writing -------------------------------------------------------------------------


def temporary_path(path: str) -> str:
    """A name beside `path` that no other process uses: `.<name>.tpurun-tmp-<host>-<pid>-<hex>`."""
    parent, _, name = path.rstrip("/").rpartition("/")
    temporary = f".{name}.tpurun-tmp-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return f"{parent}/{temporary}" if parent else temporary


def _create(path: str, text: str | bytes) -> None:
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
        _create(path, text)
        return
    temporary = temporary_path(path)
    try:
        _create(temporary, text)
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
        _require_inside(model_dir, path)
        tf.io.gfile.rename(path, join(destination, basename(path)), overwrite=True)
    return destination


# --- Removing ------------------------------------------------------------------------


def _require_inside(model_dir: str, path: str) -> None:
    if not inside(model_dir, path):
        raise RunError(
            f"refusing to touch {path}: it is outside --model_dir={model_dir} (a state file "
            "or record that names it is damaged or was edited)"
        )


def remove(model_dir: str, path: str, names: re.Pattern[str]) -> bool:
    """Removes `path`, a file or directory tpurun made in model_dir; returns whether it did.

    `names` is the pattern tpurun's name for it matches in full; anything else is
    left alone (and logged). A symbolic link is removed as a link.
    """
    _require_inside(model_dir, path)
    name = basename(path)
    if not names.fullmatch(name):
        logging.warning("Left %s alone: not a name tpurun makes (%s).", path, names.pattern)
        return False
    if is_link(path):
        target = os.readlink(path)
        os.unlink(path)
        logging.warning("Removed the symbolic link %s (to %s, left untouched).", path, target)
        return True
    if tf.io.gfile.isdir(path):
        remove_tree(path)
    elif tf.io.gfile.exists(path):
        tf.io.gfile.remove(path)
    else:
        return False
    return True


def remove_file(model_dir: str, path: str, names: re.Pattern[str]) -> None:
    """Removes a file tpurun made in model_dir whose name matches `names` (else leaves it).

    One request on gs:// (no existence check first); a file already gone is fine.
    """
    _require_inside(model_dir, path)
    if not names.fullmatch(basename(path)):
        logging.warning("Left %s alone: not a name tpurun makes (%s).", path, names.pattern)
        return
    try:
        if is_link(path):
            os.unlink(path)
        else:
            tf.io.gfile.remove(path)
    except (tf.errors.NotFoundError, FileNotFoundError):
        pass


def remove_file_quietly(model_dir: str, path: str, names: re.Pattern[str]) -> None:
    """remove_file for clean-ups: storage that fails is only logged."""
    try:
        remove_file(model_dir, path, names)
    except (OSError, tf.errors.OpError) as e:
        logging.warning("Could not remove %s (the next update will): %s", path, e)


def remove_tree(path: str) -> None:
    """Deletes a directory tree, never following a symbolic link out of it.

    TensorFlow's local rmtree follows links to directories and empties their
    targets; on a local disk this walks the tree itself, unlinking links.
    """
    if not is_local(path):
        tf.io.gfile.rmtree(path)  # gs:// and ram:// have no links
        return
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
        return
    shutil.rmtree(path)  # uses the fd-based walk (rmtree.avoids_symlink_attacks) on Linux


def remove_leftovers(model_dir: str) -> list[str]:
    """Removes the temporaries that processes of tpurun which died left in model_dir.

    One of this machine's processes is dead when its pid is gone; one of another
    machine when it is older than FOREIGN_TEMPORARY_AGE. Returns what was removed.
    """
    removed = []
    top = listdir(model_dir)
    present = {name.rstrip("/") for name in top}
    homes = list(TEMPORARY_HOMES)
    while homes:
        home = homes.pop(0)
        if home and "/" not in home and home not in present:
            continue  # one listing fewer (a request each on gs://)
        directory = join(model_dir, home) if home else model_dir
        for name in top if not home else listdir(directory):
            match = TEMPORARY.fullmatch(name.rstrip("/"))
            path = join(directory, name.rstrip("/"))
            if match and _died(match, path) and remove(model_dir, path, TEMPORARY):
                removed.append(path)
            elif home == "eval" and _SPLIT_DIR.fullmatch(name.rstrip("/")):
                # eval/<split>/ of a named split; gs:// lists a directory with its "/"
                # (no request per results file), a local disk is asked.
                if name.endswith("/") or (is_local(path) and os.path.isdir(path)):
                    homes.append(f"eval/{name.rstrip('/')}")
    for path in removed:
        logging.info("Removed %s, left by a tpurun process that died.", path)
    return removed


def _died(match: re.Match[str], path: str) -> bool:
    if match.group("host") == _HOST:
        return not process_alive(int(match.group("pid")))
    try:
        age = time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
    except tf.errors.OpError:
        return False
    return age > FOREIGN_TEMPORARY_AGE


def process_alive(pid: int) -> bool:
    """Whether process `pid` of this machine is running (this process is)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process
    return True
