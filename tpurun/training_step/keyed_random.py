"""Random numbers keyed on (seed, step, example): the same draws on 1 or 8 replicas, and on resume.

A GAN's noise, a gradient penalty's interpolation weights and dropout masks are
random, and `tf.random.normal` (or Keras' seed generators) draws from a state
each replica keeps for itself: 1 and 8 replicas then train different models, and
a resumed run draws what the killed one had not. Here every value is a pure
function of

    (run seed, global step, the example's index in the global batch, a name,
     the how-many-th draw of that name in the step, any `fold` values, the
     value's position in the example's draw)

computed element by element in 32-bit integer ops (a counter-based hash: murmur3's
finalizer chained over the key words, as Philox or Threefry chain their rounds),
so a replica computes only its own rows, the values do not depend on how the global
batch is split, XLA compiles them (a TPU step must be compiled), and nothing is
stored: a resumed step recomputes what it drew. The hash is not cryptographic;
its output passes the uniformity and independence checks of
tests/test_keyed_random.py, which is what noise and masks need.

`KeyedRandom` is what `Step.random` hands a training step: draws of shape
`[batch, *shape]`, one row per example of the replica's batch. `KeyedDropout` is
Dropout whose mask comes from the step's source (Keras' own Dropout draws per
replica). `uniform` and `normal` are the same draws as plain functions of their
keys, for an input pipeline (e.g. the noise a generator's eval or predict input
carries, keyed on the record's index).
"""

from __future__ import annotations

import contextlib
import math
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import keras
import tensorflow as tf

# murmur3's fmix32 constants and the golden ratio (as in boost's hash_combine).
_M1, _M2, _GOLDEN = 0x85EBCA6B, 0xC2B2AE35, 0x9E3779B9
_START = 0x2545F491  # the chain's first word: any odd constant


def _u32(value: Any) -> tf.Tensor:
    return tf.constant(value & 0xFFFFFFFF, tf.uint32)


def _fmix_int(h: int) -> int:
    """`_Hash.fmix` on a Python int: the same uint32 arithmetic, no op made."""
    h ^= h >> 16
    h = (h * _M1) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * _M2) & 0xFFFFFFFF
    return h ^ (h >> 16)


def _absorb_int(h: int, word: int) -> int:
    return _fmix_int(h ^ _fmix_int((word + _GOLDEN) & 0xFFFFFFFF))


class _Hash:
    """The chain's steps in uint32 ops, with their constants made once per `bits` call.

    A trace costs by the ops it makes, and every draw of a step is traced: with its
    constants shared, an absorbed word is 18 ops, not 29.
    """

    def __init__(self) -> None:
        self._16, self._13 = _u32(16), _u32(13)
        self._m1, self._m2, self._golden = _u32(_M1), _u32(_M2), _u32(_GOLDEN)

    def fmix(self, h: tf.Tensor) -> tf.Tensor:
        """murmur3's 32-bit finalizer: a bijection whose every input bit flips half the output."""
        xor, shift = tf.bitwise.bitwise_xor, tf.bitwise.right_shift
        h = xor(h, shift(h, self._16)) * self._m1
        h = xor(h, shift(h, self._13)) * self._m2
        return xor(h, shift(h, self._16))

    def absorb(self, h: tf.Tensor, word: tf.Tensor) -> tf.Tensor:
        """The chain state after one more 32-bit word (uint32, broadcast against `h`)."""
        return self.fmix(tf.bitwise.bitwise_xor(h, self.fmix(word + self._golden)))


def _words(value: Any) -> list[Any]:
    """An integer (Python or tensor, up to 64 bits) as its low and high 32-bit words
    (Python ints for a Python int)."""
    if isinstance(value, int):
        return [value & 0xFFFFFFFF, (value >> 32) & 0xFFFFFFFF]
    value = tf.cast(value, tf.int64)
    low = tf.cast(tf.bitwise.bitwise_and(value, 0xFFFFFFFF), tf.uint32)
    high = tf.cast(tf.bitwise.right_shift(value, 32), tf.uint32)  # arithmetic: -1 -> all ones
    return [low, high]


def name_word(name: str) -> int:
    """A draw's name as a key word: CRC-32 of its UTF-8 bytes (the same in every process)."""
    return zlib.crc32(name.encode("utf-8"))


# do_not_convert (here and below): no tensor-dependent Python control flow, no user
# code; why it pays, at tpurun.precision.float32.
@tf.autograph.experimental.do_not_convert
def bits(
    seed: int, step: Any, rows: tf.Tensor, size: int, name: str, words: Sequence[Any] = ()
) -> tf.Tensor:
    """uint32 [len(rows), size]: `size` hashed words for each example of `rows` (int64 [n]).

    The key: the seed, the step, the name, then `words` (ints or integer tensors,
    e.g. a draw counter or a loop index), then the example's row and the word's
    position in it. Everything before the row is one scalar chain, shared by the
    rows; each row then costs two words, each element one. The chain's words up to
    the first tensor are absorbed in Python (the same values, no ops).
    """
    key = [*_words(seed), *_words(step), name_word(name)]
    for value in words:
        key.extend(_words(value))
    h: Any = _START
    while key and isinstance(key[0], int):
        h = _absorb_int(h, key.pop(0))
    chain = _Hash()
    h = _u32(h)
    for word in key:
        h = chain.absorb(h, _u32(word) if isinstance(word, int) else word)
    low, high = _words(rows)
    per_row = chain.absorb(chain.absorb(h, low), high)  # [n]
    positions = tf.range(size, dtype=tf.int32)
    return chain.absorb(per_row[:, None], tf.cast(positions, tf.uint32)[None, :])


def _unit(words: tf.Tensor) -> tf.Tensor:
    """float32 in [0, 1): the top 24 bits (a float32's mantissa holds them exactly)."""
    return tf.cast(tf.bitwise.right_shift(words, _u32(8)), tf.float32) * (1.0 / (1 << 24))


@tf.autograph.experimental.do_not_convert
def uniform(
    seed: int,
    step: Any,
    rows: tf.Tensor,
    shape: Sequence[int],
    name: str,
    words: Sequence[Any] = (),
    minval: float = 0.0,
    maxval: float = 1.0,
    dtype: tf.DType = tf.float32,
) -> tf.Tensor:
    """[len(rows), *shape] uniform in [minval, maxval), keyed as `bits` says."""
    size = math.prod(shape)
    values = _unit(bits(seed, step, rows, size, name, words))
    values = minval + (maxval - minval) * values
    return tf.cast(tf.reshape(values, [-1, *shape]), dtype)


@tf.autograph.experimental.do_not_convert
def normal(
    seed: int,
    step: Any,
    rows: tf.Tensor,
    shape: Sequence[int],
    name: str,
    words: Sequence[Any] = (),
    mean: float = 0.0,
    stddev: float = 1.0,
    dtype: tf.DType = tf.float32,
) -> tf.Tensor:
    """[len(rows), *shape] standard normal (scaled to mean, stddev): Box-Muller on two
    uniform words per value; |z| < 5.8 (the uniforms have 24 bits)."""
    size = math.prod(shape)
    pairs = bits(seed, step, rows, 2 * size, name, words)
    radius_word, angle_word = pairs[:, :size], pairs[:, size:]
    u = 1.0 - _unit(radius_word)  # (0, 1]: log is finite
    radius = tf.sqrt(-2.0 * tf.math.log(u))
    values = radius * tf.cos((2.0 * math.pi) * _unit(angle_word))
    return tf.cast(tf.reshape(mean + stddev * values, [-1, *shape]), dtype)


class KeyedRandom:
    """One replica's random draws in one training step: `Step.random`.

    Every draw has a row per example of the replica's (micro-)batch, keyed on the
    example's index in the global batch (`rows`), so replica r draws exactly the
    rows a single replica would draw for those examples. Each call draws anew: the
    n-th call with a name in a step is keyed on n, counted as the step is traced
    (the same in every step and every process). A `tf.range` loop's body is traced
    once, so its iterations would draw alike: key them with `fold(i)`.
    """

    def __init__(self, seed: int, step: Any, rows: Callable[[], tf.Tensor]):
        self._seed = seed
        self._step = step  # the global step, or a function giving it (read per draw)
        self._rows = rows  # called per draw: the micro-batch may change between draws
        self._counts: dict[str, int] = {}
        self._folded: list[Any] = []

    @property
    def rows(self) -> tf.Tensor:
        """int64 [batch]: the index in the global batch of each example of this replica's batch."""
        return self._rows()

    def _step_now(self) -> Any:
        return self._step() if callable(self._step) else self._step

    def _key(self, name: str) -> list[Any]:
        count = self._counts.get(name, 0)
        self._counts[name] = count + 1
        return [count, *self._folded]

    def uniform(
        self,
        shape: Sequence[int],
        name: str,
        minval: float = 0.0,
        maxval: float = 1.0,
        dtype: tf.DType = tf.float32,
    ) -> tf.Tensor:
        """[batch, *shape] uniform in [minval, maxval) for the replica's examples."""
        key = self._key(name)
        return uniform(
            self._seed, self._step_now(), self._rows(), shape, name, key, minval, maxval, dtype
        )

    def normal(
        self,
        shape: Sequence[int],
        name: str,
        mean: float = 0.0,
        stddev: float = 1.0,
        dtype: tf.DType = tf.float32,
    ) -> tf.Tensor:
        """[batch, *shape] normal(mean, stddev) for the replica's examples."""
        key = self._key(name)
        return normal(
            self._seed, self._step_now(), self._rows(), shape, name, key, mean, stddev, dtype
        )

    @contextlib.contextmanager
    def fold(self, *values: Any) -> Iterator[None]:
        """Within the block, draws are keyed on `values` too (ints or integer tensors):
        `with step.random.fold(i):` in a `tf.range(n)` loop gives each iteration its own."""
        self._folded.extend(values)
        try:
            yield
        finally:
            del self._folded[len(self._folded) - len(values) :]


# The source of the step being traced, per thread: MirroredStrategy traces each
# replica's step in a thread of its own, and each has its own rows.
_current = threading.local()


def current() -> KeyedRandom | None:
    """The keyed source of the training step being traced in this thread (None outside one)."""
    return getattr(_current, "source", None)


@contextlib.contextmanager
def active(source: KeyedRandom) -> Iterator[KeyedRandom]:
    """Makes `source` what `current()` gives (and so what KeyedDropout draws from)."""
    previous = current()
    _current.source = source
    try:
        yield source
    finally:
        _current.source = previous


@keras.saving.register_keras_serializable(package="tpurun")
class KeyedDropout(keras.layers.Layer):
    """Dropout whose masks come from the launcher's keyed source (`KeyedRandom`).

    Inside tpurun's training step a mask is keyed on (seed, step, example, this
    layer's name, the how-many-th call of it in the step), so 1 and 8 replicas drop
    the same units of each example and a resumed run drops what an uninterrupted
    one would. Keras' Dropout draws from a seed generator of each replica, which
    makes them different models. Give the layer a name that does not depend on
    what else the process built (the masks are keyed on it). Outside tpurun's step
    (a plain `model(x, training=True)`) it is Keras' Dropout with `seed`.
    The inputs' first dimension must be the step's batch: one row per example.
    """

    def __init__(self, rate: float, seed: int | None = None, **kwargs: Any):
        super().__init__(**kwargs)
        if not 0 <= rate < 1:
            raise ValueError(f"KeyedDropout rate={rate} must be in [0, 1)")
        self.rate = float(rate)
        self.seed = seed
        self.supports_masking = True
        self.seed_generator = keras.random.SeedGenerator(seed) if rate > 0 else None

    def call(self, inputs: Any, training: bool | None = None) -> Any:
        if not training or self.rate == 0:
            return inputs
        source = current()
        if source is None:
            return keras.random.dropout(inputs, self.rate, seed=self.seed_generator)
        rows = inputs.shape[0]
        batch = source.rows.shape[0]
        if rows is not None and batch is not None and rows != batch:
            raise ValueError(
                f"KeyedDropout {self.name!r} got {rows} rows in a step whose replica batch is "
                f"{batch}: it draws one mask per example; call the model on batch-sized inputs"
            )
        keep = source.uniform(inputs.shape[1:], self.name) >= self.rate
        scaled = inputs / tf.cast(1.0 - self.rate, inputs.dtype)
        return tf.where(keep, scaled, tf.zeros_like(inputs))

    def compute_output_shape(self, input_shape: Any) -> Any:
        return input_shape

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "rate": self.rate, "seed": self.seed}
