"""inputs.pad_batches, check_static_batch and seekable_batches on small eager datasets.

Eval and predict batches become static: the last partial batch is padded with
copies of real rows, a 0/1 mask marks the real ones, and whole padding batches
(mask all zeros) are added so every replica gets a batch on every step.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import tensorflow as tf

from tpurun import inputs
from tpurun.errors import RunError, tf_errors
from tpurun.model import InputParams, Mode, Model, TrainArrays


def features_and_labels(rows: int, batch: int, as_dict: bool = False) -> tf.data.Dataset:
    """Rows 1..rows (never 0, so a zero in the output can only be padding made of zeros)."""
    values = np.arange(1, rows + 1, dtype=np.float32)
    features = {"x": values, "pair": np.stack([values, -values], axis=1)} if as_dict else values
    labels = np.arange(1, rows + 1, dtype=np.int32) * 10
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch)


# Each case's batches are read by the four tests below: made once (an 8-replica padding is a
# tf.data pipeline of a few maps; nothing here changes the arrays it returns).
@functools.cache
def padded(rows: int, batch: int, replicas: int, as_dict: bool = False) -> list[tuple]:
    dataset = inputs.pad_batches(features_and_labels(rows, batch, as_dict), batch, replicas)
    return list(dataset.as_numpy_iterator())


def expected_batches(rows: int, batch: int, replicas: int) -> int:
    return math.ceil(math.ceil(rows / batch) / replicas) * replicas


# (rows, batch, replicas): a partial last batch; padding batches to fill 8 replicas;
# fewer rows than one batch; an exact fit that needs no padding at all.
CASES = [(30, 4, 1), (30, 4, 8), (30, 2, 8), (3, 2, 8), (3, 4, 2), (32, 4, 8)]
IDS = [
    "30x4_1replica",
    "30x4_8replicas",
    "30x2_8replicas",
    "3x2_8replicas",
    "3x4_2replicas",
    "32x4_exact",
]


def test_30_rows_by_4_give_8_batches_of_4_with_masks_summing_to_30():
    batches = padded(30, 4, replicas=1)
    assert len(batches) == 8
    assert all(f.shape == (4,) and y.shape == (4,) and m.shape == (4,) for f, y, m in batches)
    assert sum(m.sum() for _, _, m in batches) == 30
    np.testing.assert_array_equal(batches[-1][2], [1, 1, 0, 0])


@pytest.mark.parametrize(
    "replicas",
    [
        1,
        8,
    ],
    ids=["1replica", "8replicas"],
)
def test_every_component_has_the_static_batch_shape(replicas):
    dataset = inputs.pad_batches(features_and_labels(30, 4, as_dict=True), 4, replicas)
    shapes = [spec.shape.as_list() for spec in tf.nest.flatten(dataset.element_spec)]
    assert shapes == [[4, 2], [4], [4], [4]]  # pair, x, labels, mask


@pytest.mark.parametrize("rows, batch, replicas", CASES, ids=IDS)
def test_batch_count_is_a_multiple_of_the_replicas(rows, batch, replicas):
    batches = padded(rows, batch, replicas)
    assert len(batches) == expected_batches(rows, batch, replicas)
    assert len(batches) % replicas == 0


@pytest.mark.parametrize("rows, batch, replicas", CASES, ids=IDS)
def test_masks_count_every_real_row_once_in_order(rows, batch, replicas):
    batches = padded(rows, batch, replicas)
    assert sum(m.sum() for _, _, m in batches) == rows
    real = np.concatenate([f[m == 1] for f, _, m in batches])
    np.testing.assert_array_equal(real, np.arange(1, rows + 1))
    labels = np.concatenate([y[m == 1] for _, y, m in batches])
    np.testing.assert_array_equal(labels, real.astype(np.int32) * 10)


@pytest.mark.parametrize("rows, batch, replicas", CASES, ids=IDS)
def test_whole_padding_batches_have_all_zero_masks(rows, batch, replicas):
    batches = padded(rows, batch, replicas)
    real_batches = math.ceil(rows / batch)
    for features, _, mask in batches[real_batches:]:
        assert features.shape == (batch,)
        np.testing.assert_array_equal(mask, np.zeros(batch))
    assert all(m.sum() > 0 for _, _, m in batches[:real_batches])


@pytest.mark.parametrize("rows, batch, replicas", CASES, ids=IDS)
def test_padded_rows_are_copies_of_real_rows(rows, batch, replicas):
    batches = padded(rows, batch, replicas)
    padding = np.concatenate([f[m == 0] for f, _, m in batches] + [np.zeros(0, np.float32)])
    padding_labels = np.concatenate([y[m == 0] for _, y, m in batches] + [np.zeros(0, np.int32)])
    assert len(padding) == expected_batches(rows, batch, replicas) * batch - rows
    assert np.all(padding != 0), "padding must repeat real rows, not add zeros"
    assert set(padding.tolist()) <= set(range(1, rows + 1))
    # A padded row is one real row: its label comes with it.
    np.testing.assert_array_equal(padding_labels, padding.astype(np.int32) * 10)


@pytest.mark.parametrize("replicas", [1, 8], ids=["1replica", "8replicas"])
def test_dict_features_are_padded_key_by_key(replicas):
    batches = padded(7, 4, replicas, as_dict=True)
    assert len(batches) == expected_batches(7, 4, replicas)
    for features, labels, _ in batches:
        assert set(features) == {"x", "pair"}
        assert features["x"].shape == (4,) and features["pair"].shape == (4, 2)
        # Rows stay whole: each pair row still belongs to the same x.
        np.testing.assert_array_equal(features["pair"][:, 0], features["x"])
        np.testing.assert_array_equal(features["pair"][:, 1], -features["x"])
        np.testing.assert_array_equal(labels, features["x"].astype(np.int32) * 10)
        assert np.all(features["x"] != 0)
    real = np.concatenate([f["x"][m == 1] for f, _, m in batches])
    np.testing.assert_array_equal(real, np.arange(1, 8))


def test_batches_larger_than_a_replicas_are_refused_not_cut():
    """Padding would keep a replica's rows of a larger batch and drop the rest, and the
    eval count the rest as never seen: refused, when the static size says so at once."""
    static = features_and_labels(30, 6).rebatch(6, drop_remainder=True)
    with pytest.raises(RunError, match=r"batches of 6 rows, more than the 4 of a replica: batch"):
        inputs.pad_batches(static, 4, 1)
    dynamic = inputs.pad_batches(features_and_labels(30, 6), 4, 2)  # batches of [None] rows
    with pytest.raises(tf.errors.InvalidArgumentError) as raised:
        list(dynamic.as_numpy_iterator())
    assert tf_errors.describe(raised.value)[0] == (
        "InvalidArgumentError: the input yields a batch of 6 rows, more than the 4 of a replica: "
        "batch it with params.batch_size (the per-replica batch), not params.global_batch_size"
    )


def test_predict_elements_without_labels_get_a_mask_too():
    dataset = tf.data.Dataset.from_tensor_slices({"x": np.arange(1, 6, dtype=np.float32)}).batch(2)
    batches = list(inputs.pad_batches(dataset, 2, replicas=2).as_numpy_iterator())
    assert len(batches) == 4
    assert all(len(element) == 2 for element in batches)  # (features, mask)
    np.testing.assert_array_equal(np.concatenate([m for _, m in batches]), [1, 1, 1, 1, 1, 0, 0, 0])


def train_dataset(batch: int, drop_remainder: bool, as_dict: bool = False) -> tf.data.Dataset:
    return features_and_labels(30, 1, as_dict).unbatch().batch(batch, drop_remainder)


@pytest.mark.parametrize(
    "dataset_fn",
    [
        lambda: train_dataset(4, drop_remainder=True),
        lambda: train_dataset(4, drop_remainder=True, as_dict=True),
        lambda: train_dataset(4, drop_remainder=True).repeat(),
    ],
    ids=["tensor", "dict", "repeated"],
)
def test_check_static_batch_accepts_drop_remainder(dataset_fn):
    assert inputs.check_static_batch(dataset_fn(), 4, "Iris") is None


@pytest.mark.parametrize(
    "dataset_fn, shape",
    [
        (lambda: train_dataset(4, drop_remainder=False), "(None,)"),
        (lambda: train_dataset(4, drop_remainder=False, as_dict=True), "(None,"),
        (lambda: train_dataset(8, drop_remainder=True), "(8,)"),
        (lambda: train_dataset(4, drop_remainder=True).unbatch(), "()"),
    ],
    ids=["no_drop_remainder", "dict_no_drop_remainder", "wrong_batch", "unbatched"],
)
def test_check_static_batch_rejects(dataset_fn, shape):
    with pytest.raises(RunError) as raised:
        inputs.check_static_batch(dataset_fn(), 4, "Iris")
    message = str(raised.value)
    assert message.startswith(f"Iris.input_fn(train) yields batches of shape {shape}")
    assert "the static per-replica batch 4" in message
    assert "dataset.batch(params.batch_size, drop_remainder=True)" in message


# seekable_batches: the TRAIN stream as a pure function of (seed, position).
def seekable(rows: int, batch: int, start: int = 0, pipelines: int = 1, pipeline: int = 0):
    params = InputParams(batch, batch * pipelines, pipelines, pipeline, pipelines, 7, start)
    return inputs.seekable_batches({"x": np.arange(rows)}, params)


def take(dataset: tf.data.Dataset, count: int) -> list[np.ndarray]:
    return [element["x"] for element in dataset.take(count).as_numpy_iterator()]


@functools.cache
def stream_of_40_batches() -> list[np.ndarray]:
    return take(seekable(10, 4), 40)


# Inside and across the 16-batch chunks one map call makes.
@pytest.mark.parametrize("start", [1, 5, 11, 16, 17, 33, 39])
def test_seekable_batches_start_anywhere_in_the_same_stream(start):
    np.testing.assert_array_equal(take(seekable(10, 4, start), 1)[0], stream_of_40_batches()[start])


def test_seekable_batches_visit_every_row_once_per_epoch_in_a_new_order_each_epoch():
    rows = np.concatenate(take(seekable(12, 4), 9))  # 3 epochs of 12 rows
    epochs = rows.reshape(3, 12)
    for epoch in epochs:
        assert sorted(epoch) == list(range(12))
    assert not np.array_equal(epochs[0], epochs[1])


def test_seekable_batches_share_the_epochs_between_pipelines_without_overlap():
    first = np.concatenate(take(seekable(12, 3, pipelines=2, pipeline=0), 2))
    second = np.concatenate(take(seekable(12, 3, pipelines=2, pipeline=1), 2))
    assert sorted([*first, *second]) == list(range(12))
    single = np.concatenate(take(seekable(12, 6), 2))
    np.testing.assert_array_equal(single[0::2], first)  # pipeline p takes every 2nd position
    np.testing.assert_array_equal(single[1::2], second)


@pytest.mark.parametrize("with_batch_function", [False, True], ids=["rows", "windows"])
def test_a_batch_spec_of_arrays_is_the_element_spec_of_their_stream(with_batch_function):
    """TrainArrays.batch_spec (what the TensorBoard graph and `tpurun check` trace the step
    on) is what seekable_batches yields, read off the specs without building a dataset."""
    text = np.arange(40, dtype=np.int32)

    def windows(arrays, rows):  # examples that are not rows: windows of 5 and their next
        starts = rows[:, None] + tf.range(5)
        return {"tokens": tf.gather(arrays, starts)}, tf.gather(arrays, rows + 5)

    if with_batch_function:
        arrays = TrainArrays(text, count=35, batch=windows)
    else:
        arrays = TrainArrays(({"x": text.reshape(20, 2).astype(np.float64)}, text[:20]))
    params = InputParams(4, 8, 2, 0, 2, 7, 0)
    assert arrays.batch_spec(4) == inputs.seekable_batches(arrays, params).element_spec


def test_a_resumed_stream_of_a_model_that_does_not_seek_is_skipped_forward():
    class Counting(Model):
        def input_fn(self, mode, params):
            return tf.data.Dataset.range(1000).batch(params.batch_size, drop_remainder=True)

        def build(self):
            raise NotImplementedError

        def loss(self, labels, outputs):
            raise NotImplementedError

    strategy = tf.distribute.get_strategy()
    model = Counting(None)
    dataset = inputs.distribute(strategy, model, Mode.TRAIN, 4, seed=0, start_step=3)
    np.testing.assert_array_equal(next(iter(dataset)), [12, 13, 14, 15])
