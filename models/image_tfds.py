"""28x28 grey images from TensorFlow Datasets (mnist, fashion_mnist as `tfds build` prepares them), batched.

The same batches as the TFRecords of `image_records` give, from a dataset named by
`config.data.tfds_name` (tpurun.datasets): its `image` feature (uint8 [28, 28, 1])
and `label` (a class id), read for this input pipeline. TRAIN: files shuffled by
the run's seed, examples shuffled (`data.shuffle_buffer`), repeated, static batches;
EVAL / PREDICT: one pass in the dataset's order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ml_collections
import tensorflow as tf

from tpurun import datasets
from tpurun.errors import UsageError
from tpurun.model import InputParams, Mode

IMAGE, LABEL = "image", "label"  # the features of TFDS's mnist and fashion_mnist
SHAPE = (28, 28, 1)


def reads_tfds(config: ml_collections.ConfigDict, mode: Mode) -> bool:
    """Whether `mode` reads the TFDS dataset config.data names (predict --input still reads
    TFRecords)."""
    predict_input = mode is Mode.PREDICT and config.predict.input
    return bool(config.data.get("tfds_name")) and not predict_input


def dataset(
    data: ml_collections.ConfigDict,
    mode: Mode,
    params: InputParams,
    eval_split: str,
    to_features: Callable[[tf.Tensor, tf.Tensor], Any],
) -> tf.data.Dataset:
    """Batches of tpurun's train split (TRAIN) or `eval_split` of the dataset:
    `to_features(pixels uint8 [batch, 784], labels)` makes each batch's (features,
    labels); PREDICT yields the features only."""
    train = mode is Mode.TRAIN
    split = "train" if train else eval_split
    examples = datasets.tfds_examples(data, split, params, shuffle_files=train)
    _check_features(data, examples.element_spec)
    if train:
        examples = examples.repeat().shuffle(data.shuffle_buffer, seed=params.seed)
    batches = examples.batch(params.batch_size, drop_remainder=train)

    def features(batch: dict[str, tf.Tensor]) -> Any:
        pixels = tf.reshape(batch[IMAGE], [-1, SHAPE[0] * SHAPE[1]])
        return to_features(pixels, batch[LABEL])

    batches = batches.map(features, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if mode is Mode.PREDICT:
        batches = batches.map(lambda features, labels: features)
    return batches.prefetch(tf.data.AUTOTUNE)


def _check_features(data: ml_collections.ConfigDict, spec: Any) -> None:
    """A UsageError unless the examples have a uint8 28x28x1 `image` and an integer `label`."""
    features = spec if isinstance(spec, dict) else {}
    image, label = features.get(IMAGE), features.get(LABEL)
    fits = (
        image is not None
        and tuple(image.shape) == SHAPE
        and image.dtype == tf.uint8
        and label is not None
        and label.dtype.is_integer
    )
    if not fits:
        found = {k: f"{v.dtype.name}{list(v.shape)}" for k, v in features.items()}
        raise UsageError(
            f"config.data.tfds_name={data.tfds_name}: its examples are {found}; the 28x28 "
            f"image models read a uint8 {IMAGE} of shape {list(SHAPE)} and an integer "
            f"{LABEL}, as TFDS's mnist and fashion_mnist have"
        )
