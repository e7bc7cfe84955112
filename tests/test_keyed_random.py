"""tpurun.training_step.keyed_random: draws keyed on (seed, step, example), the same however split.

The values of an example do not depend on which other rows are drawn with it (so
a replica's share equals a single replica's rows), XLA computes the same bits,
the uniforms and normals have the moments and independence noise needs, and
KeyedDropout draws its masks from the source of the step being traced.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import needs_xla_cpu

from tpurun.training_step import KeyedDropout, KeyedRandom, keyed_random


def rows(start: int, stop: int) -> tf.Tensor:
    return tf.range(start, stop, dtype=tf.int64)


def test_an_examples_values_do_not_depend_on_the_rows_drawn_with_it():
    whole = keyed_random.normal(7, 12, rows(0, 8), [3, 2], "noise").numpy()
    halves = [keyed_random.normal(7, 12, rows(a, a + 4), [3, 2], "noise") for a in (0, 4)]
    assert whole.shape == (8, 3, 2)
    np.testing.assert_array_equal(whole, np.concatenate(halves))


@pytest.mark.parametrize(
    "seed, step, name, words, drawn",
    [
        # Python ints up to the rows: the chain absorbed in Python.
        (7, 12, "noise", (), [[2616203074, 1299319243], [3047735590, 203240742]]),
        # A tensor step: the chain in ops from there, a Python and a tensor word after it.
        (2**40 + 5, "99", "drop", (0, "5"), [[2010441054, 229766190], [9820757, 397941713]]),
    ],
    ids=["python_key", "tensor_step"],
)
def test_the_draws_are_a_fixed_function_of_their_keys(seed, step, name, words, drawn):
    """Pinned values: a run resumed by another tpurun release draws what the first drew
    (rows 3 and 4, two words each; a key given as text is that value as a tensor)."""

    def key(value):
        return tf.constant(int(value), tf.int64) if isinstance(value, str) else value

    got = keyed_random.bits(seed, key(step), rows(3, 5), 2, name, [key(w) for w in words])
    assert got.numpy().tolist() == drawn


@needs_xla_cpu
def test_xla_computes_the_same_bits():
    def draw():
        return (
            keyed_random.uniform(3, tf.constant(5, tf.int64), rows(0, 16), [4], "u"),
            keyed_random.normal(3, tf.constant(5, tf.int64), rows(0, 16), [4], "n"),
        )

    eager = draw()
    compiled = tf.function(draw, jit_compile=True)()
    for one, other in zip(eager, compiled, strict=True):
        np.testing.assert_allclose(one.numpy(), other.numpy(), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(eager[0].numpy(), compiled[0].numpy())  # integer ops, exact


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 8},
        {"step": 13},
        {"name": "other"},
        {"words": [1]},
        {"rows": (100, 108)},
    ],
    ids=["seed", "step", "name", "words", "examples"],
)
def test_every_key_changes_the_draw(change):
    key = {"seed": 7, "step": 12, "name": "noise", "words": [], "rows": (0, 8)}
    base = keyed_random.uniform(key["seed"], key["step"], rows(*key["rows"]), [64], key["name"])
    key.update(change)
    other = keyed_random.uniform(
        key["seed"], key["step"], rows(*key["rows"]), [64], key["name"], key["words"]
    )
    assert np.mean(base.numpy() == other.numpy()) < 0.01


def test_uniforms_and_normals_have_the_moments_and_independence_of_noise():
    u = keyed_random.uniform(1, 0, rows(0, 4096), [64], "u").numpy()
    assert 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    counts, _ = np.histogram(u, bins=32, range=(0, 1))
    expected = u.size / 32
    chi_square = float(((counts - expected) ** 2 / expected).sum())
    assert chi_square < 70  # 31 degrees of freedom: p ~ 1e-4
    # Neighbouring examples and neighbouring positions are uncorrelated.
    for a, b in ((u[:-1], u[1:]), (u[:, :-1], u[:, 1:])):
        assert abs(np.corrcoef(a.ravel(), b.ravel())[0, 1]) < 0.01
    z = keyed_random.normal(1, 0, rows(0, 4096), [64], "z").numpy()
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1) < 0.01
    assert abs(np.mean(z**4) - 3) < 0.1  # the normal's kurtosis
    assert abs(np.corrcoef(z[:-1].ravel(), z[1:].ravel())[0, 1]) < 0.01


def test_each_call_draws_anew_and_fold_keys_a_loop_index():
    source = KeyedRandom(0, tf.constant(3, tf.int64), lambda: rows(0, 4))
    first, second = source.normal([8], "noise"), source.normal([8], "noise")
    assert not np.allclose(first, second)
    with source.fold(tf.constant(1)):
        folded = source.normal([8], "noise")
    replay = KeyedRandom(0, tf.constant(3, tf.int64), lambda: rows(0, 4))
    np.testing.assert_array_equal(first, replay.normal([8], "noise"))
    np.testing.assert_array_equal(second, replay.normal([8], "noise"))
    with replay.fold(tf.constant(1)):
        np.testing.assert_array_equal(folded, replay.normal([8], "noise"))


def test_keyed_dropout_draws_from_the_active_source_and_is_keras_dropout_outside():
    layer = KeyedDropout(0.5, seed=1, name="drop")
    x = tf.ones([4, 256])
    np.testing.assert_array_equal(layer(x, training=False), x)
    outside = layer(x, training=True).numpy()  # Keras' own dropout
    assert set(np.unique(outside)) == {0.0, 2.0}
    source = KeyedRandom(0, tf.constant(9, tf.int64), lambda: rows(4, 8))
    with keyed_random.active(source):
        masked = layer(x, training=True).numpy()
    assert keyed_random.current() is None
    # The mask is the source's uniform draw for the layer's name, kept where >= rate.
    keep = keyed_random.uniform(0, 9, rows(4, 8), [256], "drop", [0]).numpy() >= 0.5
    np.testing.assert_array_equal(masked, np.where(keep, 2.0, 0.0))
    with keyed_random.active(KeyedRandom(0, tf.constant(9, tf.int64), lambda: rows(0, 2))):
        with pytest.raises(ValueError, match="one mask per example"):
            layer(x, training=True)


def test_keyed_dropout_in_a_functional_model_keeps_its_config():
    inputs = keras.Input((3,))
    model = keras.Model(inputs, KeyedDropout(0.25, name="d")(inputs))
    layer = model.get_layer("d")
    assert layer.get_config()["rate"] == 0.25
    assert KeyedDropout.from_config(layer.get_config()).rate == 0.25
