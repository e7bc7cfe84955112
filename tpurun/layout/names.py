"""Every name tpurun gives a file or directory in a model_dir, and the paths made of them.

The one module that spells them (tests/test_layout.py checks that no other does):

    model_dir/
      checkpoint                        the state file: the checkpoints kept, newest last
      ckpt-<step>.index                 a checkpoint (TensorFlow's tensor bundle): its index,
      ckpt-<step>.data-00000-of-00001     its data shards,
      ckpt-<step>_temp/                   and TensorFlow's scratch of a save not yet merged
      train_config.json                 the config the checkpoints were trained with
      trainer.lease                     the running trainer's lease
      events.out.tfevents.*             TensorBoard's events of training
      runs/<time>-<command>.json        a record per run (a train's holds its time account)
      eval/results-<step>.json          the default split's results (and its events)
      eval/<split>/results-<step>.json  a named split's results; eval_<split>/ its events
      best/best.json                    the best checkpoint so far, copied into best/,
      best/results-<split>.json           and `eval --best`'s results of it
      export/<time>/                    SavedModels (--export_dir elsewhere)
      outside/<name>-<hash>/results-<split>.json   eval --checkpoint=PATH's results of a
                                        checkpoint outside model_dir
      damaged/                          damaged checkpoints and records, set aside
      .scratch/<task>                   a non-chief worker's copy of a save, deleted after it
      plugins/profile/                  --profile_steps's traces (TensorFlow's profiler)
      .<name>.tpurun-tmp-<host>-<pid>-<8 hex>   a temporary of <name> (here or in a
                                        directory above), renamed into place when whole

Paths are joined as TensorFlow joins them (`join`): with "/" for `scheme://` paths, as
the operating system joins them on this machine. TensorFlow-free, as the supervisor
and `tpurun report` are.
"""

from __future__ import annotations

import datetime
import os
import posixpath
import re
import socket
import time
import uuid


def exactly(name: str) -> re.Pattern[str]:
    """The pattern of one fixed name (of this module's), for a removal by exact name."""
    return re.compile(re.escape(name))


def join(path: str, *paths: str) -> str:
    """`path` joined with `paths`, as tf.io.gfile.join does it."""
    if "://" in path[1:]:
        return posixpath.join(path, *paths)
    return os.path.join(path, *paths)


def basename(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


# --- Checkpoints ---------------------------------------------------------------------

STATE_FILE = "checkpoint"  # TensorFlow's name: its CheckpointManager reads it too
CHECKPOINT = re.compile(r"ckpt-(?P<step>\d+)")  # a checkpoint's name: its files' prefix
_STEP_AT_END = re.compile(r"ckpt-(\d+)$")
_INDEX = ".index"
_BUNDLE_SUFFIX = r"\.index|\.data-\d{5}-of-\d{5}"  # a checkpoint's files: its name and this
CHECKPOINT_INDEX = re.compile(r"ckpt-(?P<step>\d+)\.index")
CHECKPOINT_DATA = re.compile(r"ckpt-\d+\.data-\d{5}-of-\d{5}")
CHECKPOINT_FILE = re.compile(f"(?:{CHECKPOINT_INDEX.pattern})|(?:{CHECKPOINT_DATA.pattern})")
CHECKPOINT_TEMP = re.compile(r"ckpt-\d+_temp")  # TensorFlow's scratch of an unfinished save
# --checkpoint's value: the checkpoint's name or its step.
_CHECKPOINT_ARGUMENT = re.compile(r"\s*(?:ckpt-)?(\d+)\s*")


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step}"


def checkpoint_path(model_dir: str, step: int) -> str:
    return join(model_dir, checkpoint_name(step))


def checkpoint_step(path: str) -> int | None:
    """The step of the checkpoint `path` (a path ending in its name), else None."""
    match = _STEP_AT_END.search(path)
    return int(match.group(1)) if match else None


def step_argument(text: str) -> int | None:
    """The step `--checkpoint=ckpt-N` or `--checkpoint=N` names; None if it names none."""
    match = _CHECKPOINT_ARGUMENT.fullmatch(text)
    return int(match.group(1)) if match else None


def index_file(checkpoint: str) -> str:
    """The index of checkpoint `checkpoint` (a name or path): it exists once the save is whole."""
    return checkpoint + _INDEX


def data_files_glob(checkpoint: str) -> str:
    """A glob of the data shards of checkpoint `checkpoint` (a path)."""
    return checkpoint + ".data-*"


def is_index(file: str) -> bool:
    """Whether `file` (a name or path) is a checkpoint's index file."""
    return file.endswith(_INDEX)


def checkpoint_of(file: str) -> str:
    """The checkpoint (name or path) whose index or data file `file` is."""
    return re.sub(f"(?:{_BUNDLE_SUFFIX})$", "", file)


def is_checkpoint_file(file: str) -> bool:
    """Whether `file` (a name or path) is a checkpoint's index or data file (any prefix:
    tpurun's ckpt-N, a TF1 model.ckpt-N, a SavedModel's variables/variables)."""
    return bool(re.search(f"(?:{_BUNDLE_SUFFIX})$", file))


def is_file_of(checkpoint: str, file: str) -> bool:
    """Whether the file named `file` is the index or a data shard of the checkpoint named
    `checkpoint`, by exact name."""
    suffix = file[len(checkpoint) :]
    return file.startswith(checkpoint) and bool(re.fullmatch(_BUNDLE_SUFFIX, suffix))


# --- Temporaries ---------------------------------------------------------------------

# This machine, as its temporaries name it.
HOST = re.sub(r"[^A-Za-z0-9.-]", "-", socket.gethostname()) or "host"
_TEMPORARY_TAIL = r"\.tpurun-tmp-(?P<host>[A-Za-z0-9.-]+)-(?P<pid>\d+)-[0-9a-f]{8}"
# `.<name>.tpurun-tmp-<host>-<pid>-<8 hex>`: a temporary of <name>, unique per process.
TEMPORARY = re.compile(r"\.(?P<name>.+)" + _TEMPORARY_TAIL)
_TEMPORARY_IN_TEXT = re.compile(r"\.(?P<name>[^/\s]+)" + _TEMPORARY_TAIL)


def temporary_path(path: str) -> str:
    """A name beside `path` that no other process uses: `.<name>.tpurun-tmp-<host>-<pid>-<hex>`."""
    parent, _, name = path.rstrip("/").rpartition("/")
    temporary = f".{name}.tpurun-tmp-{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    return f"{parent}/{temporary}" if parent else temporary


def without_temporaries(text: str) -> str:
    """`text` (an error's message) with every temporary's name replaced by the name it is for."""
    return _TEMPORARY_IN_TEXT.sub(r"\g<name>", text)


# --- Files and directories -----------------------------------------------------------

TRAIN_CONFIG = "train_config.json"
LEASE = "trainer.lease"
WRITE_PROBE = "write-probe"  # a temporary of it shows that model_dir can be written
RUNS_DIR = "runs"
EVAL_DIR = "eval"
# The split of a model that declares none: its results and summaries stay in eval/ (the
# layout before splits had names), so that such a model keeps its model_dir.
LEGACY_SPLIT = "eval"
BEST_DIR = "best"
BEST_RECORD = "best.json"
# Where tpurun before 0.3 kept the old best while renaming the new one into place: still
# read (a replacement killed between its renames), removed by the next update.
PREVIOUS_BEST = ".best.previous"
EXPORT_DIR = "export"
OUTSIDE_DIR = "outside"  # eval's results of checkpoints outside model_dir (--checkpoint=PATH)
DAMAGED_DIR = "damaged"
SCRATCH_DIR = ".scratch"
SCRATCH_TASK = re.compile(r"(chief|worker)-\d+")  # a worker's scratch in it, by task
PROFILE_DIR = "plugins/profile"
# A split's name is a directory name (eval/<split>, eval_<split>) and part of a file's.
SPLIT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
BEST_RESULTS = re.compile(rf"results-{SPLIT.pattern}\.json")
# Where tpurun puts temporaries (besides eval/<split>/): leftovers are looked for there.
TEMPORARY_HOMES = ("", EVAL_DIR, RUNS_DIR, EXPORT_DIR, BEST_DIR)
# What tpurun keeps at a model_dir's top level, besides its directories.
TOP_LEVEL_FILE = re.compile(
    "|".join(
        (
            re.escape(STATE_FILE),
            r"ckpt-\d+.*",
            re.escape(TRAIN_CONFIG),
            re.escape(LEASE),
            r"events\.out\.tfevents\..*",
            r"\..*",  # temporaries, .scratch/, the best's leftovers
        )
    )
)


def profile_dir(logdir: str) -> str:
    """Where TensorFlow's profiler writes the traces of a profile into `logdir`."""
    return join(logdir, PROFILE_DIR)


def events_file(start: float, number: int) -> str:
    """The name of this process's `number`th TensorBoard events file (of a writer started at
    `start`), sorting after the ones before it, as TensorBoard expects."""
    return f"events.out.tfevents.{int(start)}.{socket.gethostname()}.{os.getpid()}.{number:06d}.v2"


# --- Run records ---------------------------------------------------------------------

TRAIN_RECORD = re.compile(r"\d{8}T\d{6}\.\d{6}Z-train\.json")
RUN_RECORD = re.compile(r"\d{8}T\d{6}\.\d{6}Z-[a-z]+\.json")


def run_record_name(command: str, at: float | None = None) -> str:
    """A run record's name: `<UTC time to the microsecond>-<command>.json`, of now or of
    `at` (epoch seconds); TRAIN_RECORD matches a train's."""
    moment = datetime.datetime.fromtimestamp(
        time.time() if at is None else at, datetime.timezone.utc
    )
    return f"{moment.strftime('%Y%m%dT%H%M%S.%fZ')}-{command}.json"


def runs_dir(model_dir: str) -> str:
    return join(model_dir, RUNS_DIR)


# --- Evaluation results and the best checkpoint -------------------------------------


def eval_results_dir(model_dir: str, split: str) -> str:
    """eval/<split>; eval/ itself for LEGACY_SPLIT, the split of a model that declares none."""
    return join(model_dir, EVAL_DIR) if split == LEGACY_SPLIT else join(model_dir, EVAL_DIR, split)


def eval_results_path(model_dir: str, step: int, split: str) -> str:
    return join(eval_results_dir(model_dir, split), f"results-{step}.json")


def eval_results_globs(model_dir: str) -> tuple[str, ...]:
    """Glob patterns of every split's results files: eval/<split>/ and the default's eval/."""
    return tuple(join(model_dir, EVAL_DIR, p) for p in ("results-*.json", "*/results-*.json"))


def eval_summaries_dir(model_dir: str, split: str) -> str:
    """eval_<split>, so TensorBoard shows each split as a run of its own (eval_val,
    eval_test); eval/ for LEGACY_SPLIT."""
    return join(model_dir, EVAL_DIR if split == LEGACY_SPLIT else f"{EVAL_DIR}_{split}")


def best_results_path(model_dir: str, split: str) -> str:
    """Where `eval --best --split=S` records its results: best/results-<S>.json."""
    return join(model_dir, BEST_DIR, f"results-{split}.json")


def outside_results_path(model_dir: str, checkpoint: str, split: str) -> str:
    """Where `eval --checkpoint=PATH` records the results of a checkpoint outside model_dir:
    outside/<checkpoint>/results-<split>.json (`checkpoint`: a name told apart by its
    source's hash), never among model_dir's own steps' nor best/'s."""
    return join(model_dir, OUTSIDE_DIR, checkpoint, f"results-{split}.json")


def export_path(model_dir: str, stamp: int) -> str:
    """export/<stamp>: a SavedModel, by the time it was made."""
    return join(model_dir, EXPORT_DIR, str(stamp))
