"""Removing in a model_dir: only what tpurun made, by exact name, never through a link.

Every removal names the pattern (`tpurun.layout.names`) the file's name must match in
full, and a path outside the model_dir it was given is refused, whatever a state file
or record says. A link in tpurun's way is removed as a link, its target untouched; a
directory tree is walked without following links.
"""

from __future__ import annotations

import os
import re
import shutil
import time

import tensorflow as tf
from absl import logging

from tpurun.layout import names
from tpurun.layout.names import basename, join
from tpurun.layout.plain_files import is_local, process_alive
from tpurun.storage.paths import is_link, listdir, require_inside

# A temporary of a process on another machine (a preempted VM, another worker) is
# removed only once it is this old: no write or export of tpurun takes a day.
FOREIGN_TEMPORARY_AGE = 24 * 3600


def remove(model_dir: str, path: str, pattern: re.Pattern[str]) -> bool:
    """Removes `path`, a file or directory tpurun made in model_dir; returns whether it did.

    `pattern` is the pattern tpurun's name for it matches in full; anything else is
    left alone (and logged). A symbolic link is removed as a link.
    """
    require_inside(model_dir, path)
    name = basename(path)
    if not pattern.fullmatch(name):
        logging.warning("Left %s alone: not a name tpurun makes (%s).", path, pattern.pattern)
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


def remove_file(model_dir: str, path: str, pattern: re.Pattern[str]) -> None:
    """Removes a file tpurun made in model_dir whose name matches `pattern` (else leaves it).

    One request on gs:// (no existence check first); a file already gone is fine.
    """
    require_inside(model_dir, path)
    if not pattern.fullmatch(basename(path)):
        logging.warning("Left %s alone: not a name tpurun makes (%s).", path, pattern.pattern)
        return
    try:
        if is_link(path):
            os.unlink(path)
        else:
            tf.io.gfile.remove(path)
    except (tf.errors.NotFoundError, FileNotFoundError):
        pass


def remove_file_quietly(model_dir: str, path: str, pattern: re.Pattern[str]) -> None:
    """remove_file for clean-ups: storage that fails is only logged."""
    try:
        remove_file(model_dir, path, pattern)
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
    homes = list(names.TEMPORARY_HOMES)
    while homes:
        home = homes.pop(0)
        if home and "/" not in home and home not in present:
            continue  # one listing fewer (a request each on gs://)
        directory = join(model_dir, home) if home else model_dir
        for name in top if not home else listdir(directory):
            match = names.TEMPORARY.fullmatch(name.rstrip("/"))
            path = join(directory, name.rstrip("/"))
            if match and _died(match, path) and remove(model_dir, path, names.TEMPORARY):
                removed.append(path)
            elif home == names.EVAL_DIR and names.SPLIT.fullmatch(name.rstrip("/")):
                # eval/<split>/ of a named split; gs:// lists a directory with its "/"
                # (no request per results file), a local disk is asked.
                if name.endswith("/") or (is_local(path) and os.path.isdir(path)):
                    homes.append(join(names.EVAL_DIR, name.rstrip("/")))
    for path in removed:
        logging.info("Removed %s, left by a tpurun process that died.", path)
    return removed


def _died(match: re.Match[str], path: str) -> bool:
    if match.group("host") == names.HOST:
        return not process_alive(int(match.group("pid")))
    try:
        age = time.time() - tf.io.gfile.stat(path).mtime_nsec / 1e9
    except tf.errors.OpError:
        return False
    return age > FOREIGN_TEMPORARY_AGE
