"""The ResNet-50 input pipelines: ImageNet JPEGs to keyed training crops and exact eval batches.

Two sources of the same JPEGs: imagenet_to_gcs TFRecords (`TFRecordSource`) and
TFDS's imagenet2012 through tpurun.datasets (`TfdsSource`, the JPEG bytes read
undecoded). Training is an endless stream of epochs. Epoch e of input pipeline p
is a pure function of (seed, e, p): its files in an order of the seed and the
epoch, read interleaved (deterministically), the records shuffled in a buffer.
Every record gets a key, (seed, p, e, its index in the epoch), from which its crop
and flip are drawn (`resnet_preprocessing.example_key`). So:

* a resumed run continues the stream exactly: it counts the records of one epoch
  (`epoch_size`), starts at the epoch of its position, and skips to its place
  inside that epoch, reading at most one epoch's records and decoding none of them
  (the epochs before are not read);
* nothing depends on how the stream was read before (no random state), so the
  crops of a resumed run are the crops of an uninterrupted one, bit for bit.

Eval and predict read the files in order, once; the launcher pads the last batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import tensorflow as tf
from tpurun.models import imagenet_records, resnet_preprocessing

from tpurun import datasets
from tpurun.model import InputParams, Mode

# What input_fn yields as features: {"image": [batch, size, size, 3]} pixel values in
# [0, 255], in the dtype the replicas compute in (bfloat16 under mixed_bfloat16: half
# the bytes to move to the device, as resnet_main.py's use_bfloat16).
FEATURE = "image"
# Bytes each training file read buffers (resnet_main.py's, for gs://).
READ_BUFFER = 8 << 20


class TFRecordSource:
    """One input pipeline's share of imagenet_to_gcs TFRecord files.

    Sharded by file when every pipeline gets at least one, else by record (each
    pipeline reads every file and keeps every num_input_pipelines-th record).
    """

    def __init__(
        self, files: Sequence[str], params: InputParams, cycle_length: int, shuffle_buffer: int
    ):
        self.files = sorted(files)
        self.pipelines, self.pipeline = params.num_input_pipelines, params.input_pipeline_id
        self.by_file = self.pipelines > 1 and len(self.files) >= self.pipelines
        self.mine = self.files[self.pipeline :: self.pipelines] if self.by_file else self.files
        self.seed = params.seed
        self.cycle_length = max(1, min(cycle_length, len(self.mine)))
        self.shuffle_buffer = shuffle_buffer

    def keyed_stream(self, first_epoch: tf.Tensor) -> tf.data.Dataset:
        """(epoch, index in it, record) from epoch `first_epoch` (int64) on, endless."""
        return tf.data.Dataset.range(first_epoch, tf.int64.max).flat_map(
            lambda epoch: keyed(epoch, self.epoch(epoch))
        )

    def epoch(self, epoch: tf.Tensor) -> tf.data.Dataset:
        """The serialized records of epoch `epoch` (int64) of this pipeline, shuffled."""
        key = tf.stack([tf.constant(self.seed, tf.int64), epoch])
        names = tf.random.experimental.stateless_shuffle(tf.constant(self.mine), seed=key)
        records = tf.data.Dataset.from_tensor_slices(names).interleave(
            lambda name: tf.data.TFRecordDataset(name, buffer_size=READ_BUFFER),
            cycle_length=self.cycle_length,
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        # The buffer draws alike every epoch (tf.data takes no tensor seed under a global
        # one), but from files in another order: what it mixes differs.
        return self._sharded(records).shuffle(self.shuffle_buffer, seed=self.seed)

    def epoch_size(self) -> tf.Tensor:
        """The records in one epoch of this pipeline (int64): reads its files once."""
        counted = tf.data.TFRecordDataset(
            self.mine, buffer_size=READ_BUFFER, num_parallel_reads=tf.data.AUTOTUNE
        ).reduce(tf.constant(0, tf.int64), lambda count, _: count + 1)
        if self.by_file or self.pipelines == 1:
            return counted
        # Records p, p + P, p + 2P, ... of all of them.
        return (counted - self.pipeline + self.pipelines - 1) // self.pipelines

    def one_pass(self) -> tf.data.Dataset:
        """This pipeline's records, once, in file order (eval, predict)."""
        records = tf.data.Dataset.from_tensor_slices(self.mine).flat_map(tf.data.TFRecordDataset)
        return self._sharded(records)

    def _sharded(self, records: tf.data.Dataset) -> tf.data.Dataset:
        if self.pipelines > 1 and not self.by_file:
            return records.shard(self.pipelines, self.pipeline)
        return records

    @staticmethod
    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return imagenet_records.parse(record)


class TfdsSource:
    """One input pipeline's share of a TFDS image dataset (imagenet2012's `image`, `label`
    0..999), the JPEGs undecoded: tpurun.datasets shards it and orders its files.

    The files' order changes every epoch, from a seed of the run's: TFDS draws the k-th
    order for the k-th pass over the examples (a seeded reshuffle), so a stream that
    starts at epoch e first makes e passes of one record each (`keyed_stream`).
    """

    def __init__(self, data: Any, split: str, params: InputParams, shuffle_buffer: int):
        import tensorflow_datasets as tfds

        self.data, self.split, self.params = data, split, params
        self.shuffle_buffer = shuffle_buffer
        self.decoders = {"image": tfds.decode.SkipDecoding()}

    def _examples(self, shuffle_files: bool) -> tf.data.Dataset:
        return datasets.tfds_examples(
            self.data, self.split, self.params, shuffle_files=shuffle_files, decoders=self.decoders
        )

    def keyed_stream(self, first_epoch: tf.Tensor) -> tf.data.Dataset:
        examples = self._examples(shuffle_files=True)  # one dataset: its passes are the epochs
        passed = tf.data.Dataset.range(first_epoch).flat_map(lambda _: examples.take(1))
        # The buffer draws alike every epoch (as TFRecordSource's): a reshuffling buffer
        # would draw by its own count of passes, which a resumed stream does not repeat.
        shuffled = examples.shuffle(
            self.shuffle_buffer, seed=self.params.seed, reshuffle_each_iteration=False
        )
        epochs = tf.data.Dataset.range(first_epoch, tf.int64.max).flat_map(
            lambda epoch: keyed(epoch, shuffled)
        )
        none = tf.constant(-1, tf.int64)
        skipped = passed.skip(first_epoch).map(lambda example: (none, none, example))
        return skipped.concatenate(epochs)  # (the passes yield nothing: all skipped)

    def epoch_size(self) -> tf.Tensor:
        """The examples in one epoch of this pipeline: the split's own count on one
        pipeline, else its share read once."""
        if self.params.num_input_pipelines == 1:
            return tf.constant(datasets.num_examples(self.data, self.split), tf.int64)
        return self._examples(shuffle_files=False).reduce(
            tf.constant(0, tf.int64), lambda count, _: count + 1
        )

    def one_pass(self) -> tf.data.Dataset:
        return self._examples(shuffle_files=False)

    @staticmethod
    def parse(example: dict[str, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        return example["image"], tf.cast(example["label"], tf.int32)


def keyed(epoch: tf.Tensor, records: tf.data.Dataset) -> tf.data.Dataset:
    """(epoch, index, record) for the records of one epoch."""
    return records.enumerate().map(lambda index, record: (epoch, index, record))


def stream_from(source: Any, params: InputParams) -> tf.data.Dataset:
    """`source`'s keyed stream (epoch, index, record) from the record this pipeline's
    `params.start_batch` starts at: the epoch it falls in, the records before it in that
    epoch skipped (read, not decoded)."""
    start = params.start_batch * params.batch_size  # records this pipeline already gave
    if start:
        size = source.epoch_size()
        first_epoch, skip = start // size, start % size
    else:
        first_epoch, skip = tf.constant(0, tf.int64), tf.constant(0, tf.int64)
    return source.keyed_stream(first_epoch).skip(skip)


def train_dataset(
    source: Any, params: InputParams, image_size: int, dtype: tf.DType
) -> tf.data.Dataset:
    """Endless static batches ({"image": [b, size, size, 3]}, labels [b]) from the keyed
    stream of `source`'s epochs, starting at `params.start_batch` (see the module docstring).
    """
    stream = stream_from(source, params)

    def preprocess(epoch: tf.Tensor, index: tf.Tensor, record: Any) -> tuple[Any, tf.Tensor]:
        image_bytes, label = source.parse(record)
        key = resnet_preprocessing.example_key(params.seed, params.input_pipeline_id, epoch, index)
        image = resnet_preprocessing.train_image(image_bytes, key, image_size)
        return tf.cast(image, dtype), label

    batches = stream.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    batches = batches.batch(params.batch_size, drop_remainder=True)
    return batches.map(lambda images, labels: ({FEATURE: images}, labels)).prefetch(
        tf.data.AUTOTUNE
    )


def eval_dataset(
    source: Any, mode: Mode, params: InputParams, image_size: int, dtype: tf.DType
) -> tf.data.Dataset:
    """One pass of centre crops, batched (the last batch partial: the launcher pads it);
    PREDICT yields the features alone."""

    def preprocess(record: Any) -> tuple[Any, tf.Tensor]:
        image_bytes, label = source.parse(record)
        image = resnet_preprocessing.eval_image(image_bytes, image_size)
        return {FEATURE: tf.cast(image, dtype)}, label

    batches = source.one_pass().map(
        preprocess, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    batches = batches.batch(params.batch_size)
    if mode is Mode.PREDICT:
        batches = batches.map(lambda features, labels: features)
    return batches.prefetch(tf.data.AUTOTUNE)
