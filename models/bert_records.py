"""google-research/bert's TFRecords, read as they are: create_pretraining_data.py's and run_classifier.py's.

Pretraining records (create_pretraining_data.py's write_instance_to_example_files), each
a tf.train.Example of

* `input_ids`, `input_mask`, `segment_ids`: int64 [max_seq_length];
* `masked_lm_positions`, `masked_lm_ids`: int64 [max_predictions_per_seq];
  `masked_lm_weights`: float [max_predictions_per_seq] (1.0 for a prediction, 0.0 for
  the padding after the last);
* `next_sentence_labels`: int64 [1] (0: B follows A, 1: B is a random sentence).

Classifier records (run_classifier.py's file_based_convert_examples_to_features, and
`tpurun.models.bert_text`'s converter): `input_ids`, `input_mask`, `segment_ids` [max_seq_length],
`label_ids` [1], `is_real_example` [1] (0 for the padding examples run_classifier adds
so that TPU batches fill; records of a run_classifier older than it have none: 1).

int64 becomes int32 (a TPU has no int64 matmul inputs) and every shape is static, as
run_pretraining's _decode_record did. The lengths must be those the records were
written with (run_pretraining: "Must match data generation"); a mismatch is named,
with the fix, by `find_bad_record` after the run fails.

Training streams every input pipeline's share of the files (by file, or by record when
there are fewer files than pipelines: `resnet_input.TFRecordSource`, shared with
ResNet-50's records), their order and a shuffle buffer drawn from the seed and the
epoch, so a resumed run continues the stream exactly, starting at its epoch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import tensorflow as tf
from google.protobuf.message import DecodeError
from tpurun.models.image_records import first_bad_record, list_files
from tpurun.models.resnet_input import TFRecordSource, stream_from

from tpurun.errors import RunError
from tpurun.model import InputParams, Mode

PRETRAINING_WRITER = "google-research/bert's create_pretraining_data.py"
CLASSIFIER_WRITER = "python -m tpurun.models.bert_text (or run_classifier.py)"
SEQUENCE_KEYS = ("input_ids", "input_mask", "segment_ids")
IS_REAL = "is_real_example"


def pretraining_spec(max_seq_length: int, max_predictions: int) -> dict[str, Any]:
    """run_pretraining.py's name_to_features."""
    sequence = tf.io.FixedLenFeature([max_seq_length], tf.int64)
    return {
        **{key: sequence for key in SEQUENCE_KEYS},
        "masked_lm_positions": tf.io.FixedLenFeature([max_predictions], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_predictions], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_predictions], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


def classifier_spec(max_seq_length: int) -> dict[str, Any]:
    """run_classifier.py's name_to_features (is_real_example 1 where a record has none)."""
    sequence = tf.io.FixedLenFeature([max_seq_length], tf.int64)
    return {
        **{key: sequence for key in SEQUENCE_KEYS},
        "label_ids": tf.io.FixedLenFeature([], tf.int64),
        IS_REAL: tf.io.FixedLenFeature([], tf.int64, default_value=1),
    }


def parser(spec: Mapping[str, Any]) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """A batch of serialized records -> their features, int64 as int32."""

    def parse(serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        parsed = tf.io.parse_example(serialized, dict(spec))
        return {
            key: tf.cast(value, tf.int32) if value.dtype == tf.int64 else value
            for key, value in parsed.items()
        }

    return parse


def files_for(data: Any, mode: Mode, predict_input: str, writer: str) -> list[str]:
    """config.data.train_files (TRAIN) or eval_files (EVAL, and PREDICT without --input)."""
    if mode is Mode.PREDICT and predict_input:
        return list_files(predict_input, "--input", writer)
    key = "train_files" if mode is Mode.TRAIN else "eval_files"
    if not data[key]:
        raise RunError(
            f"no {'training' if mode is Mode.TRAIN else 'eval'} records: pass "
            f"--config.data.{key}=<glob> (TFRecords as {writer} writes them; several "
            "globs separated by commas, local or gs://)"
        )
    return list_files(data[key], f"config.data.{key}", writer)


def train_dataset(
    files: Sequence[str],
    params: InputParams,
    data: Any,
    parse: Callable[[tf.Tensor], Any],
) -> tf.data.Dataset:
    """Endless static batches of this pipeline's records, from batch `params.start_batch` on."""
    source = TFRecordSource(files, params, data.cycle_length, data.shuffle_buffer)
    records = stream_from(source, params).map(lambda e, i, record: record)
    batches = records.batch(params.batch_size, drop_remainder=True)
    return batches.map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)


def one_pass(
    files: Sequence[str],
    params: InputParams,
    parse: Callable[[tf.Tensor], Any],
    keep: Callable[[tf.Tensor], tf.Tensor] | None = None,
) -> tf.data.Dataset:
    """This pipeline's records once, in file order, batched (the launcher pads the last);
    `keep`: a predicate on each serialized record (the padding examples left out)."""
    source = TFRecordSource(files, params, cycle_length=1, shuffle_buffer=1)
    records = source.one_pass()
    if keep is not None:
        records = records.filter(keep)
    return records.batch(params.batch_size).map(parse).prefetch(tf.data.AUTOTUNE)


def is_real_example(serialized: tf.Tensor) -> tf.Tensor:
    """Whether a classifier record is a real example (not run_classifier's padding)."""
    spec = {IS_REAL: tf.io.FixedLenFeature([], tf.int64, default_value=1)}
    return tf.io.parse_single_example(serialized, spec)[IS_REAL] != 0


# The integer features' bounds a record must keep: key -> (its upper bound's name in the
# error, the bound), filled in by the model from its config.
Bounds = Mapping[str, tuple[str, int]]


def find_bad_record(
    files: Sequence[str], spec: Mapping[str, Any], bounds: Bounds, writer: str
) -> str | None:
    """The first record of `files` the run would fail on, as one line (file, record from 1,
    what is wrong, the fix), or None. Reads every record: only after a failure."""
    return first_bad_record(files, lambda record: record_problem(record, spec, bounds, writer))


# The config key that sets each feature's length, for the fix.
LENGTH_KEYS = {
    **{key: "max_seq_length" for key in SEQUENCE_KEYS},
    "masked_lm_positions": "max_predictions_per_seq",
    "masked_lm_ids": "max_predictions_per_seq",
    "masked_lm_weights": "max_predictions_per_seq",
}


def record_problem(
    record: bytes, spec: Mapping[str, Any], bounds: Bounds, writer: str
) -> str | None:
    """What parsing or the model would reject in one record, or None."""
    try:
        features = tf.train.Example.FromString(record).features.feature
    except DecodeError:
        return f"not a serialized tf.train.Example; write the records with {writer}"
    for key, feature_spec in spec.items():
        if key not in features:
            if feature_spec.default_value is not None:
                continue
            return f"no feature {key!r}; write the records with {writer}"
        kind = "float_list" if feature_spec.dtype == tf.float32 else "int64_list"
        values = list(getattr(features[key], kind).value)
        length = feature_spec.shape[0] if feature_spec.shape else 1
        if len(values) != length:
            if key in LENGTH_KEYS:
                return (
                    f"{key} holds {len(values)} values, not {LENGTH_KEYS[key]}={length}: "
                    f"set --config.{LENGTH_KEYS[key]}={len(values)} (the length the records "
                    "were written with)"
                )
            return (
                f"{key} holds {len(values)} values, not {length}; write the records with {writer}"
            )
        if key in bounds:
            name, bound = bounds[key]
            bad = [v for v in values if not 0 <= v < bound]
            if bad:
                return (
                    f"{key} holds {bad[0]}, outside [0, {name}={bound}); fix the records or {name}"
                )
    return None
