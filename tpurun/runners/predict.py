"""The predict runner: N input rows give exactly N output rows, in input order; and --output.

A model that defines `generate` (see `tpurun.model`) predicts its own way instead:
its rows are whatever `generate` returns for the restored model. `write_rows`
writes them to --output by its extension: JSON lines, `.npz` arrays, or a `.png`
grid of the rows' images (a generator's samples), where `output_target` allows.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import stat
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from tpurun import inputs, precision, storage
from tpurun.cluster import Cluster
from tpurun.errors import RunError, UsageError
from tpurun.model import Mode, Model, build_models, has_generate, json_line
from tpurun.run_config import RunConfig
from tpurun.runners import restore
from tpurun.storage import checkpoints, lease, train_config


class Predictor:
    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.strategy = cluster.strategy
        self.model = model
        with self.strategy.scope():
            self.models = build_models(model)
            self.keras_model = self.models[model.serving_model]  # what predicts
            self._averages = restore.averages_of(model, self.models, run.config)
        self._step = tf.function(self._host_step)

    @property
    def weights(self) -> list:
        """The serving model's variables (what the predict step reads)."""
        return list(self.keras_model.variables)

    def replica_step(self, features, mask):
        """One replica's predict step: named predictions of its padded batch, and the mask."""
        outputs = precision.float32(self.keras_model(features, training=False))
        return self.model.predictions(outputs), mask

    def _host_step(self, batch):
        per_replica = self.strategy.run(self.replica_step, args=batch)
        return inputs.gather_replicas(self.strategy, per_replica)

    def check_output(self, path: str) -> None:
        """Refuses, before anything is restored or predicted, an --output the predictions
        cannot be written to: a .png of predictions that are not one image per row (their
        names, dtypes and shapes, from the predict step traced on the input's spec). A
        model's own `generate` is checked on its first row (`predict`)."""
        if _extension(path) != "png" or has_generate(self.model):
            return
        params = inputs.input_params(
            tf.distribute.InputContext(), self.run.predict_batch_size, self.run.seed
        )
        spec = self.model.input_fn(Mode.PREDICT, params).element_spec
        traced = tf.function(lambda features: self.replica_step(features, None)[0])
        outputs = traced.get_concrete_function(spec).structured_outputs
        png_image({name: (t.dtype.as_numpy_dtype, t.shape[1:]) for name, t in outputs.items()})

    def predict(
        self, checkpoint_path: restore.Chosen, output: str = ""
    ) -> Iterator[dict[str, Any]]:
        """Yields one dict of numpy values per input row; padding rows are dropped.

        For a model with its own `generate`: the rows it returns (for a .png `output`,
        the first checked before any other is made).
        """
        restore.restore_weights(
            self.models, checkpoint_path, self._averages, self.model.serving_model
        )
        if has_generate(self.model):
            rows = iter(self.model.generate(self.keras_model, self.strategy))
            first = next(rows, None)
            if first is None:
                return
            if _extension(output) == "png":
                png_image({k: (np.asarray(v).dtype, np.shape(v)) for k, v in first.items()})
            yield first
            yield from rows
            return
        dataset = inputs.distribute(
            self.strategy, self.model, Mode.PREDICT, self.run.predict_batch_size, self.run.seed
        )
        for batch in dataset:
            predictions, mask = self._step(batch)
            predictions = tf.nest.map_structure(lambda t: t.numpy(), predictions)
            keep = mask.numpy() > 0
            for index in np.flatnonzero(keep):
                yield {name: value[index] for name, value in predictions.items()}


# --output: the format by the file's extension -------------------------------------------


def write_rows(target: OutputTarget, rows: list[dict[str, Any]]) -> str:
    """Writes the rows to --output (`output_target`); returns the line to print.

    `.npz`: each prediction stacked over the rows, an array by name (numpy.load reads
    them); `.png`: the rows' images in one grid (tf.io.encode_png); else JSON lines.
    """
    path = target.path
    extension = _extension(path)
    if extension == "npz":
        arrays = stacked(rows)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        target.write(buffer.getvalue())
        shapes = ", ".join(f"{k} {a.dtype}{list(a.shape)}" for k, a in arrays.items())
        return f"wrote {len(rows)} predictions to {path} ({shapes})"
    if extension == "png":
        name, grid = image_grid(rows)
        target.write(tf.io.encode_png(grid).numpy())
        return f"wrote {len(rows)} {name} in a {grid.shape[1]}x{grid.shape[0]} grid to {path}"
    target.write("".join(json_line(row) + "\n" for row in rows).encode())
    return f"wrote {len(rows)} predictions to {path}"


# What --output may be. tpurun writes only what it was given and replaces only a regular
# file: streams are written into, everything else that exists is refused.
_STREAMS = {stat.S_IFIFO: "a pipe", stat.S_IFCHR: "a character device"}
_REFUSED = {
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symbolic link",
    stat.S_IFSOCK: "a socket",
    stat.S_IFBLK: "a block device",
}
# The files tpurun keeps at a model_dir's top level (any directory in it is tpurun's
# too: runs/, eval/, export/, best/, damaged/, plugins/): never an --output.
_MODEL_DIR_FILES = re.compile(
    "|".join(
        (
            re.escape(checkpoints.STATE_FILE),
            r"ckpt-\d+.*",
            re.escape(train_config.FILE),
            re.escape(lease.FILE),
            r"events\.out\.tfevents\..*",
            r"\..*",  # temporaries, .scratch/, the best's leftovers
        )
    )
)


@dataclasses.dataclass(frozen=True)
class OutputTarget:
    """--output checked (`output_target`): a file replaced whole, or a stream written into
    (`fd`: this process's stdout or stderr; else `path` opened for writing)."""

    path: str
    model_dir: str
    stream: bool = False
    fd: int | None = None

    def write(self, data: bytes) -> None:
        """Writes `data`, checking the path again first (it may have changed meanwhile)."""
        target = output_target(self.path, self.model_dir)
        try:
            if target.fd is not None:
                for stream in (sys.stdout, sys.stderr):
                    stream.flush()
                _write_all(target.fd, data)
            elif target.stream:
                descriptor = os.open(self.path, os.O_WRONLY | os.O_NOCTTY)
                try:
                    _write_all(descriptor, data)
                finally:
                    os.close(descriptor)
            else:
                storage.write_atomically(self.path, data)
        except (OSError, tf.errors.OpError) as e:
            # The cause, without the name of tpurun's temporary file beside the path.
            cause = e.strerror if isinstance(e, OSError) and e.strerror else storage.failure(e)
            cause = re.sub(r"\.([^/\s]+)\.tpurun-tmp-[A-Za-z0-9.-]+-\d+-[0-9a-f]{8}", r"\1", cause)
            raise RunError(f"cannot write --output={self.path}: {cause}") from None

    @property
    def to_stdout(self) -> bool:
        return self.fd == 1


def _write_all(descriptor: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(descriptor, view) :]


def output_target(path: str, model_dir: str) -> OutputTarget:
    """Where --output=`path` writes, or UsageError when tpurun must not write there.

    This process's stdout or stderr (`/dev/stdout`, `/dev/fd/1`, the file it is
    redirected to), a pipe or a character device (`/dev/null`) are streamed into; a
    regular file is replaced whole (atomically), and a new name is made in an existing
    directory. Refused: anything else that exists (a directory, a symbolic link to
    anything but a stream, a socket), a missing directory, and a file tpurun keeps in
    the model_dir (its checkpoints, records and directories).
    """
    storage.require_bucket(path, "--output")
    kept = _kept_by_tpurun(path, model_dir)
    if kept:
        raise UsageError(
            f"--output={path} is {kept} of --model_dir={model_dir}, which tpurun keeps there; "
            "write the predictions outside the model_dir, or to a new name at its top level"
        )
    if not storage.is_local(path):
        return OutputTarget(path, model_dir)
    try:
        found = os.stat(path)  # through links: what a write would reach
    except FileNotFoundError:
        found = None
    except OSError as e:
        raise UsageError(f"--output={path}: {e.strerror}; give a file path you can write") from None
    if found is not None:
        for fd in (1, 2):  # this process's own output, by any name
            if _same_file(found, fd):
                return OutputTarget(path, model_dir, stream=True, fd=fd)
        if stat.S_IFMT(found.st_mode) in _STREAMS:
            return OutputTarget(path, model_dir, stream=True)
    kind = stat.S_IFMT(os.lstat(path).st_mode) if os.path.lexists(path) else None
    if kind is not None and kind != stat.S_IFREG:
        what = _REFUSED.get(kind, "not a regular file")
        target = f" (to {os.readlink(path)})" if kind == stat.S_IFLNK else ""
        name = {
            stat.S_IFDIR: f"a file in it (--output={path.rstrip('/')}/predictions.jsonl)",
            stat.S_IFLNK: "the path of its target, or another name",
        }.get(kind, "another name")
        raise UsageError(
            f"--output={path} is {what}{target}; tpurun replaces only a regular file (or "
            f"streams into a pipe or a device): give {name}"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UsageError(
            f"--output={path}: its directory {parent} does not exist; create it first "
            f"(mkdir -p {parent})"
        )
    return OutputTarget(path, model_dir)


def _same_file(found: os.stat_result, fd: int) -> bool:
    try:
        mine = os.fstat(fd)
    except OSError:
        return False
    return (found.st_dev, found.st_ino) == (mine.st_dev, mine.st_ino)


def _kept_by_tpurun(path: str, model_dir: str) -> str | None:
    """What `path` is to tpurun when it names a file tpurun keeps in model_dir, else None.

    A local path is compared through its directory's real path: a link to the model_dir
    is the model_dir."""
    if storage.is_local(path) and storage.is_local(model_dir):
        path = os.path.join(
            os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.basename(path)
        )
        model_dir = os.path.realpath(model_dir)
    if not storage.inside(model_dir, path):
        return None
    relative = path[len(model_dir.rstrip("/")) + 1 :].strip("/")
    if "/" in relative:
        return f"inside {relative.split('/')[0]}/, a directory"
    return f"{relative!r}, a file" if _MODEL_DIR_FILES.fullmatch(relative) else None


def stacked(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Each prediction of the rows stacked along a first dimension, by name."""
    if not rows:
        raise RunError("no predictions to write: the predict input had no rows")
    return {key: np.stack([np.asarray(row[key]) for row in rows]) for key in rows[0]}


def _extension(path: str) -> str:
    """--output's extension, which chooses the format ("" when it has none)."""
    name = path.rsplit("/", 1)[-1]
    return name.rpartition(".")[2].lower() if "." in name else ""


def png_image(rows: dict[str, tuple[Any, Any]]) -> str:
    """The one prediction --output=*.png draws, from each prediction's (dtype, shape of a row):
    a uint8 [height, width] or [height, width, 1|3|4]; else a UsageError saying what
    there is."""

    def is_image(dtype: Any, shape: Any) -> bool:
        dims = tuple(shape)
        return np.dtype(dtype) == np.uint8 and (
            len(dims) == 2 or (len(dims) == 3 and dims[-1] in (1, 3, 4))
        )

    images = [name for name, (dtype, shape) in rows.items() if is_image(dtype, shape)]
    if len(images) != 1:
        found = ", ".join(
            f"{name} {np.dtype(dtype).name} {list(tuple(shape))}"
            for name, (dtype, shape) in rows.items()
        )
        raise UsageError(
            "--output=*.png writes the predictions' images in a grid: it needs exactly one uint8 "
            "prediction of shape [height, width] or [height, width, channels] per row (found: "
            f"{found or 'no predictions'}); write .npz or .jsonl instead"
        )
    return images[0]


def image_grid(rows: list[dict[str, Any]], gap: int = 2) -> tuple[str, np.ndarray]:
    """(name, uint8 [H, W, C]): the rows' images (a uint8 prediction of shape [h, w] or
    [h, w, 1|3|4]) side by side in a near-square grid, `gap` grey pixels apart."""
    arrays = stacked(rows)
    name = png_image({k: (a.dtype, a.shape[1:]) for k, a in arrays.items()})
    batch = arrays[name]
    if batch.ndim == 3:
        batch = batch[..., None]
    count, height, width, channels = batch.shape
    columns = math.ceil(math.sqrt(count))
    lines = math.ceil(count / columns)
    grid = np.full(
        (lines * (height + gap) + gap, columns * (width + gap) + gap, channels), 96, np.uint8
    )
    for index, image in enumerate(batch):
        top, left = (
            gap + (index // columns) * (height + gap),
            gap + (index % columns) * (width + gap),
        )
        grid[top : top + height, left : left + width] = image
    return name, grid
