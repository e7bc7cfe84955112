"""28x28 grey images as TFRecords of tf.train.Example: the MNIST / Fashion-MNIST data of tpurun.

The schema is that of TensorFlow's `convert_to_records.py` MNIST example:

* `image_raw`: bytes, the 784 uint8 pixels of a 28x28 image, row by row;
* `label`: int64, the class id 0..9;
* `height`, `width`, `depth`: int64 (28, 28, 1), written for compatibility, not read.

Reading (`dataset`) decodes the pixels with `tf.io.decode_raw`, scales them to
float32 in [-0.5, 0.5] as that example does, and casts the label to int32 (a TPU
takes no int64). Writing (`write_records`) shards examples into files named
`<split>-00000-of-00006.tfrecord`; `read_idx` and `read_split` read the official
IDX files and keras' `mnist.npz`, for `scripts/convert_mnist.py`. After a run
fails on the data, `find_bad_record` names the first record the reader rejects
and why (`ImageClassifier.diagnose_data`).
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from google.protobuf.message import DecodeError
from tpurun.models import image_tfds

from tpurun.errors import RunError, UsageError
from tpurun.errors.tf_errors import one_line
from tpurun.model import Classifier, InputParams, Mode, to_json

HEIGHT = WIDTH = 28
PIXELS = HEIGHT * WIDTH
NUM_CLASSES = 10
IMAGE_KEY = "image_raw"
LABEL_KEY = "label"
# What input_fn yields as features: {"image": float32 [batch, 784]}.
FEATURE = "image"
# The exported signature's input with config.serving_input="tf_example".
SERVING_EXAMPLES = "examples"
FEATURE_SPEC = {
    IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
    LABEL_KEY: tf.io.FixedLenFeature([], tf.int64, default_value=0),
}
# The splits of the official files (IDX names, npz arrays) and their TFRecord prefix.
SPLITS = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "x_train", "y_train"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", "x_test", "y_test"),
}
DEFAULT_PATTERNS = {Mode.TRAIN: "train-*.tfrecord", Mode.EVAL: "test-*.tfrecord"}


# Reading -----------------------------------------------------------------------------


def list_files(patterns: str, what: str, writer: str = "scripts/convert_mnist.py") -> list[str]:
    """The sorted files matching comma-separated globs (local or gs://), or a RunError;
    `writer`: what makes such files, for the error."""
    globs = [p.strip() for p in patterns.split(",") if p.strip()]
    files: set[str] = set()
    for pattern in globs:
        try:
            files.update(tf.io.gfile.glob(pattern))
        except tf.errors.OpError as e:
            raise RunError(f"{what}: cannot list {pattern}: {one_line(e)}") from None
    if not files:
        raise RunError(
            f"{what}: no file matches {patterns!r}; make TFRecords with "
            f"{writer} and point --data_dir (or the config's file globs) at them"
        )
    listed = sorted(files)
    require_data(listed, what, writer)
    return listed


def require_data(files: Sequence[str], what: str, writer: str = "scripts/convert_mnist.py") -> None:
    """A RunError when every file is empty: training would wait forever for a record.

    Stops at the first file with data, so a normal run pays for one stat.
    """
    for path in files:
        try:
            if tf.io.gfile.stat(path).length:
                return
        except tf.errors.OpError as e:
            raise RunError(f"{what}: cannot read {path}: {one_line(e)}") from None
    shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
    are = "file is" if len(files) == 1 else "files are"
    raise RunError(
        f"{what}: no examples: the data {are} empty (0 bytes): {shown}; write the records "
        f"again ({writer}) or point at the right files"
    )


def files_for(data_config, mode: Mode, predict_input: str = "") -> list[str]:
    """The files of `mode` from a config's `data` section (see configs/mnist.py).

    `train_files` / `eval_files` globs win; else the default patterns in `data_dir`.
    PREDICT reads `predict_input` if given, else the eval files.
    """
    if mode is Mode.PREDICT and predict_input:
        return list_files(predict_input, "--input")
    mode = Mode.TRAIN if mode is Mode.TRAIN else Mode.EVAL
    key = "train_files" if mode is Mode.TRAIN else "eval_files"
    patterns = data_config[key]
    if not patterns and data_config.data_dir:
        patterns = tf.io.gfile.join(data_config.data_dir, DEFAULT_PATTERNS[mode])
    if not patterns:
        raise RunError(
            f"no {mode.value} data: pass --data_dir (a directory with {DEFAULT_PATTERNS[mode]}) "
            f"or --config.data.{key}=<glob>; scripts/convert_mnist.py writes such files"
        )
    return list_files(patterns, f"config.data.{key}" if data_config[key] else "--data_dir")


def parse_batch(serialized: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """A batch of serialized Examples -> ({"image": float32 [b, 784] in [-0.5, 0.5]}, int32 [b])."""
    parsed = tf.io.parse_example(serialized, FEATURE_SPEC)
    pixels = tf.io.decode_raw(parsed[IMAGE_KEY], tf.uint8)
    pixels = tf.ensure_shape(pixels, [None, PIXELS])  # a record of another size fails here
    return features_of(pixels, parsed[LABEL_KEY])


def features_of(pixels: tf.Tensor, labels: tf.Tensor) -> tuple[dict[str, tf.Tensor], tf.Tensor]:
    """uint8 pixels [b, 784] and class ids -> ({"image": float32 in [-0.5, 0.5]}, int32 [b])."""
    image = tf.cast(pixels, tf.float32) * (1.0 / 255) - 0.5
    return {FEATURE: image}, tf.cast(labels, tf.int32)


def dataset(
    files: Sequence[str],
    mode: Mode,
    params: InputParams,
    shuffle_buffer: int = 10_000,
    cycle_length: int = 4,
) -> tf.data.Dataset:
    """Batches of `files` as the model interface wants them for `mode`.

    Sharded over input pipelines by file when every pipeline gets at least one
    file, else by record. TRAIN: file order shuffled with `params.seed`, files
    interleaved (deterministically), records shuffled, repeated, static batches.
    EVAL / PREDICT: files in sorted order, records in file order, one pass
    (PREDICT yields features only: N records in, N predictions out, in order).
    """
    files = list(files)
    pipelines, pipeline = params.num_input_pipelines, params.input_pipeline_id
    by_file = pipelines > 1 and len(files) >= pipelines
    names = tf.data.Dataset.from_tensor_slices(files)
    if by_file:
        names = names.shard(pipelines, pipeline)
    if mode is Mode.TRAIN:
        names = names.shuffle(len(files), seed=params.seed, reshuffle_each_iteration=True)
        names = names.repeat()
        records = names.interleave(
            tf.data.TFRecordDataset,
            cycle_length=max(1, min(cycle_length, len(files))),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    else:
        # One file after the other: the order of the records is the order of the files.
        records = names.flat_map(tf.data.TFRecordDataset)
    if pipelines > 1 and not by_file:
        records = records.shard(pipelines, pipeline)
    if mode is Mode.TRAIN:
        records = records.shuffle(shuffle_buffer, seed=params.seed)
        batches = records.batch(params.batch_size, drop_remainder=True)
    else:
        batches = records.batch(params.batch_size)
    # Parse whole batches: one vectorised parse_example per batch, not one per record.
    batches = batches.map(parse_batch, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if mode is Mode.PREDICT:
        batches = batches.map(lambda features, labels: features)
    return batches.prefetch(tf.data.AUTOTUNE)


def read_arrays(files: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Every record of `files`, in order: uint8 images [n, 28, 28] and int64 labels [n]."""
    images, labels = [], []
    for record in tf.data.TFRecordDataset(list(files)):
        example = tf.train.Example.FromString(record.numpy())
        feature = example.features.feature
        images.append(np.frombuffer(feature[IMAGE_KEY].bytes_list.value[0], np.uint8))
        labels.append(feature[LABEL_KEY].int64_list.value[0])
    return (
        np.stack(images).reshape(-1, HEIGHT, WIDTH) if images else np.zeros((0, HEIGHT, WIDTH)),
        np.asarray(labels, np.int64),
    )


# Diagnosing ----------------------------------------------------------------------------

SCHEMA_FIX = (
    "write image_raw as the 784 bytes of a 28x28 uint8 image and label as one int64 "
    "(the schema scripts/convert_mnist.py writes)"
)


def find_bad_record(files: Sequence[str], mode: Mode) -> str | None:
    """The first record of `files` that `dataset` would fail on, or None if all are fine
    (`first_bad_record`)."""
    return first_bad_record(files, lambda record: record_problem(record, mode))


def first_bad_record(files: Sequence[str], problem_of: Callable[[bytes], str | None]) -> str | None:
    """The first record of `files` whose `problem_of` is not None, or one TFRecordDataset
    cannot read; None if all are fine.

    One line: the file, the record (counted from 1), what is wrong and the fix. Reads
    every record, one at a time: for after a failure (`Model.diagnose_data`), never
    for the happy path. The records' readers of the other models use it too.
    """
    for path in files:
        count = 0  # records read whole from this file
        try:
            for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
                count += 1
                problem = problem_of(record)
                if problem:
                    return f"data file {path}, record {count}: {problem}"
        except tf.errors.DataLossError as e:
            return f"data file {path}, record {count + 1}: {framing_problem(e, count)}"
    return None


def framing_problem(error: tf.errors.DataLossError, records_before: int) -> str:
    """Why TFRecordDataset could not read the next record of a file."""
    if "truncated" in error.message:
        return (
            "the file ends inside this record (truncated: an interrupted write or copy?); "
            "write or copy the file again"
        )
    if records_before == 0:
        return (
            "not a TFRecord file (or a compressed one; tpurun reads uncompressed TFRecords); "
            "pass only TFRecord files of tf.train.Example"
        )
    return "corrupted data (TFRecord checksum mismatch); write or copy the file again"


def record_problem(record: bytes, mode: Mode) -> str | None:
    """What `parse_batch` (or the loss, for labels) would reject in one record, or None."""
    try:
        features = tf.train.Example.FromString(record).features.feature
    except DecodeError:
        return f"not a serialized tf.train.Example; {SCHEMA_FIX}"
    if IMAGE_KEY not in features:
        return f"no feature {IMAGE_KEY!r}; {SCHEMA_FIX}"
    problem = _not_one_value(IMAGE_KEY, features[IMAGE_KEY], "bytes_list")
    if problem:
        return problem
    size = len(features[IMAGE_KEY].bytes_list.value[0])
    if size != PIXELS:
        return f"feature {IMAGE_KEY!r} has {size} bytes, not {PIXELS}; {SCHEMA_FIX}"
    if LABEL_KEY in features:  # optional: parse_batch reads a missing label as 0
        problem = _not_one_value(LABEL_KEY, features[LABEL_KEY], "int64_list")
        if problem:
            return problem
        label = features[LABEL_KEY].int64_list.value[0]
        # Predict ignores labels; train and eval fail on them (the loss on a CPU) or,
        # on a TPU, silently learn from garbage.
        if mode is not Mode.PREDICT and not 0 <= label < NUM_CLASSES:
            return f"label {label} is not a class id in 0..{NUM_CLASSES - 1}; fix the label"
    return None


def _not_one_value(key: str, feature: tf.train.Feature, kind: str) -> str | None:
    """A message unless `feature` holds exactly one value of `kind` (what parse_example needs)."""
    found = feature.WhichOneof("kind")
    count = len(getattr(feature, found).value) if found else 0
    if found == kind and count == 1:
        return None
    holds = (
        f"{count} {found.removesuffix('_list')} value{'s' * (count != 1)}" if found else "nothing"
    )
    return (
        f"feature {key!r} holds {holds}, not one {kind.removesuffix('_list')} value; {SCHEMA_FIX}"
    )


# Writing -----------------------------------------------------------------------------


def example(image: np.ndarray, label: int) -> tf.train.Example:
    """One tf.train.Example of the schema above from a uint8 28x28 (or 784) image."""
    image = np.asarray(image)
    if image.dtype != np.uint8 or image.size != PIXELS:
        raise ValueError(f"image must be {HEIGHT}x{WIDTH} uint8, got {image.dtype} {image.shape}")

    def int64(value: int) -> tf.train.Feature:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    return tf.train.Example(
        features=tf.train.Features(
            feature={
                IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
                LABEL_KEY: int64(label),
                "height": int64(HEIGHT),
                "width": int64(WIDTH),
                "depth": int64(1),
            }
        )
    )


def write_records(
    images: np.ndarray,
    labels: np.ndarray,
    output_dir: str,
    split: str,
    examples_per_file: int = 10_000,
) -> list[str]:
    """Writes `<output_dir>/<split>-0000i-of-0000n.tfrecord` files; returns their paths.

    Each file is written under a temporary name and renamed when complete.
    """
    images, labels = np.asarray(images), np.asarray(labels)
    if len(images) != len(labels):
        raise ValueError(f"{len(images)} images but {len(labels)} labels")
    if examples_per_file < 1:
        raise ValueError(f"examples_per_file={examples_per_file} must be >= 1")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"labels must be class ids in 0..{NUM_CLASSES - 1}")
    tf.io.gfile.makedirs(output_dir)
    num_files = max(1, -(-len(images) // examples_per_file))
    paths = []
    for index in range(num_files):
        path = tf.io.gfile.join(output_dir, f"{split}-{index:05d}-of-{num_files:05d}.tfrecord")
        tmp = path + ".tmp"
        start = index * examples_per_file
        with tf.io.TFRecordWriter(tmp) as writer:
            for image, label in zip(
                images[start : start + examples_per_file],
                labels[start : start + examples_per_file],
                strict=True,
            ):
                writer.write(example(image, int(label)).SerializeToString())
        tf.io.gfile.rename(tmp, path, overwrite=True)
        paths.append(path)
    return paths


# The official files --------------------------------------------------------------------

_IDX_DTYPES = {0x08: np.uint8}


def read_idx(path: str) -> np.ndarray:
    """An IDX file (the MNIST distribution format), gzipped or plain, as a uint8 array."""
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    if len(data) < 4 or data[:2] != b"\0\0" or data[2] not in _IDX_DTYPES:
        raise RunError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = data[3]
    header = 4 + 4 * ndim
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(data) != header + int(np.prod(dims)):
        raise RunError(
            f"{path}: header says {'x'.join(map(str, dims))} bytes of data, "
            f"the file has {len(data) - header}; is it truncated?"
        )
    return np.frombuffer(data, np.uint8, offset=header).reshape(dims)


def find_idx(directory: str, name: str) -> str:
    """`name` or `name.gz` in `directory`, also spelled `train-images.idx3-ubyte` as some mirrors do."""
    dotted = name.replace("-idx", ".idx")
    candidates = [name, name + ".gz", dotted, dotted + ".gz"]
    for candidate in candidates:
        path = tf.io.gfile.join(directory, candidate)
        if tf.io.gfile.exists(path):
            return path
    raise RunError(f"{directory} has none of {', '.join(candidates)}")


def read_split(source: str, split: str) -> tuple[np.ndarray, np.ndarray]:
    """Images [n, 28, 28] uint8 and labels [n] of a split from an IDX directory or a .npz file."""
    images_name, labels_name, x_key, y_key = SPLITS[split]
    if source.endswith(".npz"):
        with tf.io.gfile.GFile(source, "rb") as f, np.load(f) as arrays:
            missing = {x_key, y_key} - set(arrays.files)
            if missing:
                raise RunError(f"{source} has no array {', '.join(sorted(missing))}")
            images, labels = arrays[x_key], arrays[y_key]
    else:
        images = read_idx(find_idx(source, images_name))
        labels = read_idx(find_idx(source, labels_name))
    images = np.asarray(images)
    if images.shape[1:] != (HEIGHT, WIDTH) and images.shape[1:] != (PIXELS,):
        raise RunError(f"{split} images have shape {images.shape}; expected [n, 28, 28]")
    if images.dtype != np.uint8:
        if images.min() < 0 or images.max() > 255 or not np.all(images == np.round(images)):
            raise RunError(f"{split} images are {images.dtype}, not pixel values 0..255")
        images = images.astype(np.uint8)
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    if len(labels) != len(images):
        raise RunError(f"{split}: {len(images)} images but {len(labels)} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise RunError(f"{split} labels are not class ids in 0..{NUM_CLASSES - 1}")
    return images.reshape(-1, HEIGHT, WIDTH), labels


def convert(source: str, output_dir: str, examples_per_file: int = 10_000) -> dict[str, list[str]]:
    """Converts both splits of `source` (IDX directory or .npz) to TFRecords in output_dir."""
    written = {}
    for split in SPLITS:
        images, labels = read_split(source, split)
        written[split] = write_records(images, labels, output_dir, split, examples_per_file)
    return written


# The models' shared half -----------------------------------------------------------------


class ImageClassifier(Classifier):
    """A classifier of 28x28 images read from these TFRecords; subclasses define `build`.

    Features are `{"image": float32 [batch, 784]}` in every mode, labels int32 class
    ids; the config needs a `data` section with `data_dir`, `train_files`,
    `eval_files`, `shuffle_buffer` and `cycle_length`, and `serving_input`: what the
    exported signature takes (`tf_example` strings, parsed in the SavedModel, or
    the `image` floats).
    """

    class_names: tuple[str, ...] = ()  # shown by `tpurun predict` when set
    # The official files have train and test only (test-*.tfrecord, or
    # config.data.eval_files): the best is chosen on test unless a user adds a split.
    eval_splits = ("test",)

    def _serves_examples(self) -> bool:
        setting = self.config.serving_input
        if setting not in ("tf_example", "image"):
            raise UsageError(f"config.serving_input={setting!r}: use tf_example or image")
        return setting == "tf_example"

    def input_fn(self, mode: Mode, params: InputParams) -> tf.data.Dataset:
        data = self.config.data
        if image_tfds.reads_tfds(self.config, mode):  # a TFDS dataset by name
            split = params.split or self.eval_splits[0]
            return image_tfds.dataset(data, mode, params, split, features_of)
        files = files_for(data, mode, self.config.predict.input)
        return dataset(files, mode, params, data.shuffle_buffer, data.cycle_length)

    def train_record_files(self) -> list[str] | None:
        """One image per record: a run counting in epochs counts them."""
        if image_tfds.reads_tfds(self.config, Mode.TRAIN):
            return None  # TFDS's record counts its train split
        return files_for(self.config.data, Mode.TRAIN)

    def diagnose_data(self, mode: Mode) -> str | None:
        if image_tfds.reads_tfds(self.config, mode):
            return None  # TFDS checked its examples when it prepared them
        return find_bad_record(files_for(self.config.data, mode, self.config.predict.input), mode)

    def serving_input_spec(self, predict_spec: Any) -> Any:
        """`tf_example`: serialized tf.Example strings of the TFRecord schema, as
        `examples` [batch]; `image`: the float32 pixels, as `image` [batch, 784]."""
        if self._serves_examples():
            return {SERVING_EXAMPLES: tf.TensorSpec([None], tf.string, name=SERVING_EXAMPLES)}
        return super().serving_input_spec(predict_spec)

    def serving_features(self, inputs: Any) -> Any:
        if self._serves_examples():
            features, _ = parse_batch(inputs[SERVING_EXAMPLES])
            return features
        return inputs

    def format_predictions(self, rows: list[dict[str, np.ndarray]]) -> list[str]:
        lines = []
        for row in rows:
            out = to_json(row)
            if self.class_names:
                out["class_name"] = self.class_names[out["class_ids"]]
            lines.append(json.dumps(out, allow_nan=False))
        return lines


def image_input() -> tuple[dict[str, keras.KerasTensor], keras.KerasTensor]:
    """The Keras inputs `{"image": [batch, 784]}` and the images reshaped to [batch, 28, 28, 1]."""
    inputs = {FEATURE: keras.Input(shape=(PIXELS,), dtype="float32", name=FEATURE)}
    images = keras.layers.Reshape((HEIGHT, WIDTH, 1))(inputs[FEATURE])
    return inputs, images
