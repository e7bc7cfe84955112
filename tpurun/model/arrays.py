"""`TrainArrays`: a model's training examples held in memory, given or declared.

Part of the model interface (`tpurun.model` exports it): what `Model.train_arrays`
returns, and what device data (`tpurun.inputs.device_data`) and `tpurun check` read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from tpurun.errors import RunError


class TrainArrays:
    """A model's training examples held in memory: what `Model.train_arrays` returns.

    `arrays` are numpy arrays (any nested structure) that the launcher places once in
    every replica's memory. By default they are `(features, labels)` with one row per
    example, and a batch is some of their rows. Examples that are not rows (the
    windows of a text) give `count`, how many there are, and `batch(arrays, rows)`:
    the `(features, labels)` of the examples `rows` (int32 [n]) made from `arrays`
    (as tensors). It runs inside the compiled training step: TensorFlow ops only,
    static shapes (`tf.gather`, slicing, arithmetic).

    Arrays too large to make for nothing can be declared instead:
    `TrainArrays.declare(specs, build, count=..., batch=...)` gives their shapes and
    dtypes (`tf.TensorSpec`s in the structure `build()` returns) and `build`, which
    makes them when a run first needs their values. `tpurun check` sizes the
    training step from `specs` alone, and never calls `build`.
    """

    def __init__(
        self,
        arrays: Any = None,
        count: int | None = None,
        batch: Callable[[Any, tf.Tensor], Any] | None = None,
        *,
        specs: Any = None,
        build: Callable[[], Any] | None = None,
    ):
        if (arrays is None) == (build is None):
            raise TypeError("TrainArrays takes the arrays, or (declare) their specs and build")
        if build is not None and specs is None:
            raise TypeError("TrainArrays.declare needs the arrays' specs")
        self._arrays = arrays
        self._specs = specs
        self._build = build
        self.count = count
        self.batch = batch

    @classmethod
    def declare(
        cls,
        specs: Any,
        build: Callable[[], Any],
        count: int | None = None,
        batch: Callable[[Any, tf.Tensor], Any] | None = None,
    ) -> TrainArrays:
        """Arrays known by their `specs` (shapes, dtypes), made by `build()` when needed."""
        return cls(count=count, batch=batch, specs=specs, build=build)

    @property
    def arrays(self) -> Any:
        """The arrays' values (declared ones are built on first use, and checked against
        their specs)."""
        if self._arrays is None:
            assert self._build is not None
            built = self._build()
            _check_built(built, self._specs)
            self._arrays = built
        return self._arrays

    @property
    def specs(self) -> Any:
        """The arrays as `tf.TensorSpec`s, in their structure: nothing is built for them."""
        if self._specs is not None:
            return tf.nest.map_structure(_as_spec, self._specs)
        return tf.nest.map_structure(_spec_of, self._arrays)

    @property
    def num_examples(self) -> int:
        if self.count is not None:
            return self.count
        first = tf.nest.flatten(self.specs)[0]
        return int(first.shape[0])

    def examples(self, arrays: Any, rows: tf.Tensor) -> Any:
        """The `(features, labels)` of the examples `rows` (int32, any shape [..., n])."""
        if self.batch is None:
            return tf.nest.map_structure(lambda t: tf.gather(t, rows), arrays)
        flat = self.batch(arrays, tf.reshape(rows, [-1]))
        return tf.nest.map_structure(lambda t: tf.reshape(t, [*rows.shape, *t.shape[1:]]), flat)

    def batch_spec(self, batch_size: int) -> Any:
        """The `(features, labels)` of `batch_size` examples as `tf.TensorSpec`s: what a
        training step gets from these arrays, through tf.data or from device data.

        Read off the specs, without building the arrays or a dataset of them: a `batch`
        function is traced on them (as training traces it, with autograph), not run.
        """
        if self.batch is None:
            return tf.nest.map_structure(
                lambda spec: tf.TensorSpec([batch_size, *spec.shape[1:]], spec.dtype), self.specs
            )
        rows = tf.TensorSpec([batch_size], tf.int32)
        traced = tf.function(self.examples).get_concrete_function(self.specs, rows)
        return tf.nest.map_structure(
            lambda t: tf.TensorSpec(t.shape, t.dtype), traced.structured_outputs
        )


def _as_spec(spec: Any) -> tf.TensorSpec:
    if isinstance(spec, tf.TensorSpec):
        return spec
    return tf.TensorSpec(spec.shape, tf.as_dtype(spec.dtype))  # np.ndarray or ShapeDtype-like


def _spec_of(array: Any) -> tf.TensorSpec:
    value = array if hasattr(array, "dtype") and hasattr(array, "shape") else np.asarray(array)
    return tf.TensorSpec(np.shape(value), tf.as_dtype(value.dtype))


def _check_built(built: Any, specs: Any) -> None:
    """Declared arrays must be what their specs said: `tpurun check` sized those."""
    try:
        tf.nest.assert_same_structure(built, specs)
    except (ValueError, TypeError) as e:
        raise RunError(
            f"TrainArrays.declare: build() returned another structure than its specs ({e})"
        ) from None
    for value, spec in zip(tf.nest.flatten(built), tf.nest.flatten(specs), strict=True):
        got, want = _spec_of(value), _as_spec(spec)
        if got.shape != want.shape or got.dtype != want.dtype:
            raise RunError(
                f"TrainArrays.declare: build() made a {got.dtype.name}{got.shape.as_list()} "
                f"array where the specs say {want.dtype.name}{want.shape.as_list()}; make "
                "them agree"
            )
