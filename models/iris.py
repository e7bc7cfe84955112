"""Iris: the DNN classifier of the TPUEstimator tutorial (4 measurements -> 3 species).

Data are the tutorial's CSVs (120 training and 30 test rows, shipped in
`tpurun/models/data/`), read with pandas through `tf.io.gfile`, so a `gs://` path
works as it does for model_dir.
"""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from tpurun.errors import RunError, excerpt
from tpurun.errors.tf_errors import one_line
from tpurun.model import Classifier, InputParams, Mode, TrainArrays, register

FEATURES = ("SepalLength", "SepalWidth", "PetalLength", "PetalWidth")
LABEL = "Species"
SPECIES = ("Setosa", "Versicolor", "Virginica")

# The tutorial's three examples, predicted when no --input is given.
PREDICTION_INPUT = {
    "SepalLength": [5.1, 5.9, 6.9],
    "SepalWidth": [3.3, 3.0, 3.1],
    "PetalLength": [1.7, 4.2, 5.4],
    "PetalWidth": [0.5, 1.5, 2.1],
}
PREDICTION_EXPECTED = ("Setosa", "Versicolor", "Virginica")


def shipped_csv(filename: str) -> str:
    return str(importlib.resources.files("tpurun.models") / "data" / filename)


def read_csv(path: str, with_labels: bool, n_classes: int = len(SPECIES)) -> pd.DataFrame:
    """Reads an Iris CSV: float32 features (and int32 labels), or RunError naming the bad row.

    One output per data row: the first line is a header only when it is one,
    the column names or the tutorial's `120,4,setosa,versicolor,virginica`
    (then columns are taken by position), and data when it is a row of numbers;
    a first line that is neither is refused rather than guessed.
    """
    columns = FEATURES + ((LABEL,) if with_labels else ())
    try:
        # Through TensorFlow's file systems, like every other path of a run (gs://, ...).
        with tf.io.gfile.GFile(path, "rb") as f:
            _refuse_a_wide_first_line(path, f.read(64 << 10))
            f.seek(0)
            frame = pd.read_csv(f, header=None, dtype=str, keep_default_na=False)
    except tf.errors.NotFoundError:
        raise RunError(f"data file {path} does not exist; check the path") from None
    except pd.errors.EmptyDataError:
        raise RunError(f"data file {path} is empty; it needs a header line and rows") from None
    except pd.errors.ParserError as e:
        raise RunError(f"data file {path} is not a valid CSV: {one_line(e)}") from None
    except UnicodeDecodeError:
        raise RunError(
            f"data file {path} is not UTF-8 text; pass a CSV file, saved as UTF-8"
        ) from None
    except (OSError, ValueError, tf.errors.OpError) as e:
        raise RunError(f"cannot read data file {path}: {one_line(e)}") from None
    first = [cell.strip() for cell in frame.iloc[0]]
    header = _header(first, columns)
    if header is None:
        raise RunError(
            f"data file {path}, line 1: {excerpt(repr(','.join(first)))} is neither a header (the column "
            f"names {','.join(columns)}, or the tutorial's count line like "
            f"120,4,setosa,versicolor,virginica) nor a row of {len(columns)} numbers; fix "
            "that line"
        )
    first_row = 2 if header else 1  # the file's line number of the frame's first row
    if header == "names":
        frame.columns = first
        frame = frame.iloc[1:][list(columns)]
    elif len(columns) <= len(frame.columns) <= len(FEATURES) + 1:
        # By position: the features, and the label (which predict leaves out).
        frame = frame.iloc[1:] if header else frame
        frame = frame.iloc[:, : len(columns)]
        frame.columns = list(columns)
    elif len(frame.columns) > len(FEATURES) + 1:
        raise RunError(
            f"data file {path} has {len(frame.columns):,} columns; a row of Iris data has the 4 "
            f"features ({', '.join(FEATURES)}) and, in training and evaluation data, the label "
            f"{LABEL}: remove the other columns, or name the columns in a header line"
        )
    else:
        raise RunError(
            f"data file {path} has {len(frame.columns)} columns; it needs {', '.join(columns)}"
        )
    if frame.empty:
        raise RunError(f"data file {path} has a header but no rows")
    frame = frame.reset_index(drop=True)
    out = pd.DataFrame(index=frame.index)
    for column in columns:
        values = pd.to_numeric(frame[column].str.strip(), errors="coerce")
        with np.errstate(over="ignore"):  # found and said below, not warned about
            # Features are float32: 1e39 is finite here and inf there.
            past_float32 = np.isinf(values.to_numpy(np.float64).astype(np.float32))
        for bad, what in (
            (values.isna(), "not a number (missing or malformed value)"),
            (np.isinf(values), "not a finite number; give every value as a finite number"),
            (
                past_float32,
                f"past float32's range (magnitudes up to {np.finfo(np.float32).max:.3g}), "
                "where it would become infinite; give every value as a finite float32 number",
            ),
        ):
            if bad.any():
                row = int(np.argmax(np.asarray(bad)))
                raise RunError(
                    f"data file {path}, line {row + first_row}: column {column} is "
                    f"{excerpt(repr(frame[column].iloc[row]))}, {what}"
                )
        out[column] = values
    if with_labels:
        labels = out[LABEL]
        bad = (labels != labels.round()) | (labels < 0) | (labels >= n_classes)
        if bad.any():
            row = int(np.argmax(bad.to_numpy()))
            raise RunError(
                # :g, not !r: numpy 2 reprs a label as "np.int64(7)".
                f"data file {path}, line {row + first_row}: label {float(labels.iloc[row]):g} "
                f"is not a class id in 0..{n_classes - 1}; fix that row"
            )
        out[LABEL] = labels.astype(np.int32)
    for column in FEATURES:
        out[column] = out[column].astype(np.float32)
    return out


# The most columns a CSV with a header line of names may have (the others than Iris's are
# left out): pandas takes minutes over a line of a million.
MAX_COLUMNS = 1000


def _refuse_a_wide_first_line(path: str, head: bytes) -> None:
    """Refuses a first line of more than MAX_COLUMNS fields before pandas reads it (the
    first line sets the table's width; a later wider row is pandas' ParserError)."""
    fields = head.split(b"\n", 1)[0].count(b",") + 1
    if fields > MAX_COLUMNS:
        more = "" if b"\n" in head else " or more"
        raise RunError(
            f"data file {path}, line 1: {fields:,}{more} columns; a row of Iris data has "
            f"{len(FEATURES)} features and a label, and a header line at most {MAX_COLUMNS} "
            "named columns: fix that line"
        )


def _header(first: list[str], columns: tuple[str, ...]) -> str | None:
    """What the first line of an Iris CSV is: "names", "count" (the tutorial's
    `120,4,setosa,...`), "" (data: a row of numbers), or None (none of these)."""
    if set(columns) <= set(first):
        return "names"
    numbers = [_is_number(cell) for cell in first]
    if len(first) >= len(columns) and all(numbers[: len(columns)]):
        return ""
    counts = len(first) >= 3 and all(cell.isdigit() for cell in first[:2])
    if counts and not any(numbers[2:]) and all(first[2:]):
        return "count"
    return None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@register("iris")
class Iris(Classifier):
    """Dense 10-10 ReLU network over the four measurements; logits for three species."""

    # iris_test.csv (or config.data.eval_path): there is no validation file, so the
    # best checkpoint is chosen on test, as it always was here.
    eval_splits = ("test",)

    def _path(self, mode: Mode) -> str:
        if mode is Mode.TRAIN:
            return self.config.data.train_path or shipped_csv("iris_training.csv")
        return self.config.data.eval_path or shipped_csv("iris_test.csv")

    def _predict_features(self) -> dict[str, np.ndarray]:
        if self.config.predict.input:
            frame = read_csv(self.config.predict.input, with_labels=False)
            return {name: frame[name].to_numpy() for name in FEATURES}
        return {name: np.asarray(v, np.float32) for name, v in PREDICTION_INPUT.items()}

    def train_arrays(self) -> TrainArrays:
        # 120 rows: kept on the device, where the step gathers its own batches.
        frame = read_csv(self._path(Mode.TRAIN), with_labels=True, n_classes=self.config.n_classes)
        return TrainArrays(
            ({name: frame[name].to_numpy() for name in FEATURES}, frame[LABEL].to_numpy())
        )

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        """EVAL and PREDICT; TRAIN comes from train_arrays."""
        if mode is Mode.PREDICT:
            dataset = tf.data.Dataset.from_tensor_slices(self._predict_features())
            dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
            return dataset.batch(params.batch_size)
        frame = read_csv(self._path(mode), with_labels=True, n_classes=self.config.n_classes)
        features = {name: frame[name].to_numpy() for name in FEATURES}
        dataset = tf.data.Dataset.from_tensor_slices((features, frame[LABEL].to_numpy()))
        dataset = dataset.shard(params.num_input_pipelines, params.input_pipeline_id)
        return dataset.batch(params.batch_size).prefetch(tf.data.AUTOTUNE)

    def build(self) -> keras.Model:
        inputs = {name: keras.Input(shape=(), dtype="float32", name=name) for name in FEATURES}
        net = keras.ops.stack([inputs[name] for name in FEATURES], axis=-1)
        for units in self.config.hidden_units:
            net = keras.layers.Dense(units, activation="relu")(net)
        logits = keras.layers.Dense(self.config.n_classes, name="logits")(net)
        return keras.Model(inputs=inputs, outputs=logits, name="iris")

    def predictions(self, outputs: tf.Tensor) -> dict[str, tf.Tensor]:
        return {**super().predictions(outputs), "logits": outputs}

    def format_predictions(self, rows: list[Mapping[str, np.ndarray]]) -> list[str]:
        if self.config.predict.input:
            return super().format_predictions([dict(r) for r in rows])
        lines = []
        for row, expected in zip(rows, PREDICTION_EXPECTED, strict=True):
            class_id = int(row["class_ids"])
            probability = float(row["probabilities"][class_id])
            lines.append(
                f'Prediction is "{SPECIES[class_id]}" ({100 * probability:.1f}%), '
                f'expected "{expected}"'
            )
        return lines


__all__ = ["Iris", "read_csv"]
