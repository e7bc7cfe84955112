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

    def predict(self, checkpoint_path: str) -> Iterator[dict[str, Any]]:
        """Yields one dict of numpy values per input row; padding rows are dropped.

        For a model with its own `generate`: the rows it returns.
        """
        restore.restore_weights(self.models, checkpoint_path, self._averages)
        if has_generate(self.model):
            yield from self.model.generate(self.keras_model, self.strategy)
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
    extension = path.rsplit("/", 1)[-1].rpartition(".")[2].lower()
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


def image_grid(rows: list[dict[str, Any]], gap: int = 2) -> tuple[str, np.ndarray]:
    """(name, uint8 [H, W, C]): the rows' images (a uint8 prediction of shape [h, w] or
    [h, w, 1|3|4]) side by side in a near-square grid, `gap` grey pixels apart."""
    arrays = stacked(rows)

    def is_image(a: np.ndarray) -> bool:
        return a.dtype == np.uint8 and (a.ndim == 3 or (a.ndim == 4 and a.shape[-1] in (1, 3, 4)))

    images = {k: a for k, a in arrays.items() if is_image(a)}
    if len(images) != 1:
        found = ", ".join(images) or "none"
        raise UsageError(
            "--output=*.png writes the predictions' images in a grid: it needs exactly one uint8 "
            f"prediction of shape [height, width] or [height, width, channels] (found: {found}); "
            "write .npz or .jsonl instead"
        )
    (name, batch), *_ = images.items()
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
