"""ImageNet as tensorflow/tpu's imagenet_to_gcs.py writes it: sharded TFRecords of JPEG tf.Examples.

The files are `train-00000-of-01024` ... `train-01023-of-01024` (1,281,167 examples)
and `validation-00000-of-00128` ... (50,000), in one directory (`--data_dir`, local
or gs://). Each record is a tf.train.Example with, among others (imagenet_to_gcs's
`_convert_to_example`):

* `image/encoded`: bytes, the image as a JPEG (imagenet_to_gcs re-encodes the few
  PNG and CMYK images of the original archives);
* `image/class/label`: int64, the class 1..1000 (0 is kept for a background class):
  read here as 0..999;
* `image/format` ("JPEG"), `image/class/synset` ("n01440764"), `image/height`,
  `image/width`, `image/colorspace`, `image/channels`, `image/filename`: not read.

`find_bad_record` names the first record a run would fail on, after it failed.
"""

from __future__ import annotations

from collections.abc import Sequence

import tensorflow as tf
from google.protobuf.message import DecodeError
from tpurun.models.image_records import first_bad_record, list_files

from tpurun.errors import RunError
from tpurun.model import Mode

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
# imagenet_to_gcs's labels start at 1: the model's classes are label - 1.
FIRST_LABEL = 1
# The files of each split in a data_dir, as imagenet_to_gcs.py names them.
PATTERNS = {Mode.TRAIN: "train-*-of-*", Mode.EVAL: "validation-*-of-*"}
WRITER = "tensorflow/tpu's tools/datasets/imagenet_to_gcs.py"
FEATURE_SPEC = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string, default_value=""),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64, default_value=-1),
}


def files_for(data, mode: Mode, predict_input: str = "") -> list[str]:
    """The files of `mode` from the config's `data` section: `train_files` / `eval_files`
    globs win, else imagenet_to_gcs's names in `data_dir`; PREDICT reads `predict_input`
    if given, else the validation files."""
    if mode is Mode.PREDICT and predict_input:
        return list_files(predict_input, "--input", WRITER)
    mode = Mode.TRAIN if mode is Mode.TRAIN else Mode.EVAL
    key = "train_files" if mode is Mode.TRAIN else "eval_files"
    patterns = data[key]
    if not patterns and data.data_dir:
        patterns = tf.io.gfile.join(data.data_dir, PATTERNS[mode])
    if not patterns:
        raise RunError(
            f"no {mode.value} data: pass --data_dir (a directory with {PATTERNS[mode]}, as "
            f"{WRITER} writes them), --config.data.{key}=<glob>, or "
            "--config.data.tfds_name=imagenet2012 with --config.data.tfds_data_dir"
        )
    return list_files(patterns, f"config.data.{key}" if data[key] else "--data_dir", WRITER)


def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A serialized Example -> (JPEG bytes, int32 class 0..999)."""
    parsed = tf.io.parse_single_example(record, FEATURE_SPEC)
    return parsed[IMAGE_KEY], tf.cast(parsed[LABEL_KEY] - FIRST_LABEL, tf.int32)


def find_bad_record(files: Sequence[str], mode: Mode, num_classes: int) -> str | None:
    """The first record of `files` a run would fail on, as one line (file, record from 1,
    what is wrong, the fix), or None. Reads every record: only after a failure."""
    return first_bad_record(files, lambda record: record_problem(record, mode, num_classes))


SCHEMA_FIX = f"write {IMAGE_KEY} as one JPEG and {LABEL_KEY} as one int64 1..N ({WRITER})"


def record_problem(record: bytes, mode: Mode, num_classes: int) -> str | None:
    """What parsing, decoding or the loss would reject in one record, or None."""
    try:
        features = tf.train.Example.FromString(record).features.feature
    except DecodeError:
        return f"not a serialized tf.train.Example; {SCHEMA_FIX}"
    image = features[IMAGE_KEY].bytes_list.value if IMAGE_KEY in features else []
    if len(image) != 1:
        return f"{IMAGE_KEY} holds {len(image)} byte strings, not one; {SCHEMA_FIX}"
    try:
        tf.image.extract_jpeg_shape(image[0])
    except tf.errors.InvalidArgumentError:
        return f"{IMAGE_KEY} is not a JPEG; {SCHEMA_FIX}"
    if mode is Mode.PREDICT:
        return None  # predict reads no label
    labels = features[LABEL_KEY].int64_list.value if LABEL_KEY in features else []
    if len(labels) != 1:
        return f"{LABEL_KEY} holds {len(labels)} integers, not one; {SCHEMA_FIX}"
    if not FIRST_LABEL <= labels[0] < FIRST_LABEL + num_classes:
        return (
            f"label {labels[0]} is not a class 1..{num_classes} (imagenet_to_gcs counts from "
            "1); fix the label, or config.num_classes"
        )
    return None
