"""The predict runner: N input rows give exactly N output rows, in input order; and --output.

A model that defines `generate` (see `tpurun.model`) predicts its own way instead:
its rows are whatever `generate` returns for the restored model. `write_rows`
writes them to --output by its extension: JSON lines, `.npz` arrays, or a `.png`
grid of the rows' images (a generator's samples).
"""

from __future__ import annotations

import io
import math
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

    def predict(self, checkpoint_path: str, output: str = "") -> Iterator[dict[str, Any]]:
        """Yields one dict of numpy values per input row; padding rows are dropped.

        For a model with its own `generate`: the rows it returns (for a .png `output`,
        the first checked before any other is made).
        """
        restore.restore_weights(self.models, checkpoint_path, self._averages)
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


def write_rows(path: str, rows: list[dict[str, Any]]) -> str:
    """Writes the rows to `path` (--output), atomically; returns the line to print.

    `.npz`: each prediction stacked over the rows, an array by name (numpy.load reads
    them); `.png`: the rows' images in one grid (tf.io.encode_png); else JSON lines.
    """
    extension = _extension(path)
    if extension == "npz":
        arrays = stacked(rows)
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        storage.write_atomically(path, buffer.getvalue())
        shapes = ", ".join(f"{k} {a.dtype}{list(a.shape)}" for k, a in arrays.items())
        return f"wrote {len(rows)} predictions to {path} ({shapes})"
    if extension == "png":
        name, grid = image_grid(rows)
        storage.write_atomically(path, tf.io.encode_png(grid).numpy())
        return f"wrote {len(rows)} {name} in a {grid.shape[1]}x{grid.shape[0]} grid to {path}"
    storage.write_atomically(path, "".join(json_line(row) + "\n" for row in rows))
    return f"wrote {len(rows)} predictions to {path}"


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
