"""`RecipeOptimizer`, mixed into a Keras optimizer: tpurun's clipping, weight-decay exclusion and L2.

What Keras 3 (TensorFlow backend) does under tf.distribute, and what tpurun adds:

* Clipping. `apply_gradients` in replica context runs `_clip_gradients` (clipnorm,
  global_clipnorm) on each replica's gradients *before* `_backend_update_step`
  all-reduces them (`_all_reduce_sum_gradients`, keras/src/backend/tensorflow/
  optimizer.py). Each replica's part of the batch is clipped on its own, so 1 and 4
  replicas take different steps (tests/test_optimization.py shows it), and Keras 3
  has no `skip_gradients_aggregation` / `experimental_aggregate_gradients` to all-reduce
  first and apply the sum (keras-team/keras#19308). Calling `apply_gradients` from a
  merge_call (cross-replica context) fails inside Keras (`maybe_merge_call` then finds
  no replica context). So tpurun's optimizers clip in `_all_reduce_sum_gradients`
  itself, right after the one all-reduce: every replica clips the same summed
  gradients by their global norm, at no extra communication.
* Weight decay. Keras decays every variable not excluded, by `variable x rate x
  weight_decay` before each update. `exclude_from_weight_decay(var_names=...)` matches
  substrings of `variable.name` ("bias", without the layer); tpurun's regex is searched
  in `variable.path` ("dense/bias") when the optimizer is built, and the matches are
  excluded by identity (`var_list=`).
* The all-reduce. Keras sums the replicas' gradients with `ReplicaContext.all_reduce`,
  which wraps it in a `tf.custom_gradient` (so that the sum is differentiable); in a
  graph that wrapper walks back from the summed gradients to every op they depend on,
  with a list for the ops seen (op_selector.get_backward_walk_ops: quadratic), and
  under a MirroredStrategy, which traces the step once per replica, the sum depends
  on every replica's forward and backward pass: tracing ResNet-50's train step on 8
  replicas (`tpurun check --target=v5e-8`) took over 40 minutes in it. Nothing
  differentiates the sum of gradients, so tpurun sums them without the wrapper
  (`sum_over_replicas`: the same reduction, as all_reduce itself calls it).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from tpurun.optimization.keras_private import REDUCE_PATHS


def sum_over_replicas(values: list[Any]) -> list[Any]:
    """ReplicaContext.all_reduce(SUM, values) in a replica context, without the gradient
    TensorFlow wraps it in (see the module docstring); all_reduce itself where the
    private paths it takes moved (`missing` says so)."""
    context = tf.distribute.get_replica_context()
    extended = context.strategy.extended
    total = tf.distribute.ReduceOp.SUM
    if not all(hasattr(extended, name) for name in REDUCE_PATHS):
        return list(context.all_reduce(total, values))
    if not extended._use_merge_call():  # e.g. TPUStrategy: in the replica context
        options = tf.distribute.experimental.CommunicationOptions()
        return list(extended._replica_ctx_all_reduce(total, values, options))

    def batch_sum(strategy: tf.distribute.Strategy, *parts: Any) -> Any:
        # Each sum where its part is (a tensor's device), as all_reduce reduces them.
        destinations = [p.device if isinstance(p, tf.Tensor) else p for p in parts]
        return strategy.extended.batch_reduce_to(total, list(zip(parts, destinations, strict=True)))

    return list(context.merge_call(batch_sum, args=tuple(values)))


class RecipeOptimizer:
    """Mixed into a Keras optimizer class: tpurun's clipping and weight-decay exclusion.

    The MRO is (RecipeOptimizer, keras class): `build` and `_all_reduce_sum_gradients`
    run here first, then Keras'. Everything else is the Keras optimizer's own.
    """

    clip_norm: float = 0.0
    weight_decay_exclude: str = ""
    l2_weight_decay: float = 0.0

    def build(self, variables: Sequence[Any]) -> None:
        pattern = re.compile(self.weight_decay_exclude)
        excluded = [v for v in variables if pattern.search(v.path)]
        if self.weight_decay:  # type: ignore[attr-defined]
            self.exclude_from_weight_decay(var_list=excluded)  # type: ignore[attr-defined]
        # The update sees the variables' values (what Keras' _backend_update_step passes):
        # the L2-decayed ones are known by those.
        self._l2_decayed = {id(v.value) for v in variables if not any(v is e for e in excluded)}
        super().build(variables)  # type: ignore[misc]

    def _all_reduce_sum_gradients(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        # Keras all-reduces here, after its own (per-replica) clipping and before the
        # update (module docstring); tpurun sums without all_reduce's gradient. The summed
        # gradients get the L2 term and are clipped right after, as if the L2 term were in
        # the loss (as TF1 programs put it).
        pairs = list(grads_and_vars)
        present = [g for g, _ in pairs if g is not None]
        if tf.distribute.get_replica_context() is None or not present:
            summed = list(super()._all_reduce_sum_gradients(pairs))  # type: ignore[misc]
        else:
            sums = iter(sum_over_replicas(present))
            summed = [(None if g is None else next(sums), v) for g, v in pairs]
        if self.l2_weight_decay:
            summed = [(self._with_l2(g, v), v) for g, v in summed]
        if not self.clip_norm:
            return summed
        grads = clip_by_global_norm([g for g, _ in summed], self.clip_norm)
        return [(g, v) for g, (_, v) in zip(grads, summed, strict=True)]

    def _with_l2(self, grad: Any, variable: Any) -> Any:
        """grad + l2_weight_decay x variable: the gradient of l2_weight_decay x sum(w^2) / 2."""
        if grad is None or id(variable) not in self._l2_decayed:
            return grad
        decay = tf.cast(self.l2_weight_decay, variable.dtype) * tf.convert_to_tensor(variable)
        if isinstance(grad, tf.IndexedSlices):  # an embedding's: every row decays
            grad = tf.convert_to_tensor(grad)
        return grad + tf.cast(decay, grad.dtype)


def clip_by_global_norm(grads: Sequence[Any], clip_norm: float) -> list[Any]:
    """Scales the gradients so that their global norm is at most clip_norm (None stays None).

    The norm is computed in float32 from dense values: an IndexedSlices (an embedding's
    gradient) may repeat an index, whose rows add up, so the norm of its `values`
    would overstate it. The slices themselves stay sparse.
    """
    present = [g for g in grads if g is not None]
    squares = [
        tf.reduce_sum(tf.square(tf.cast(tf.convert_to_tensor(g), tf.float32))) for g in present
    ]
    norm = tf.sqrt(tf.add_n(squares))
    # Never above 1; NaN when the norm is NaN or Inf, so a blown-up step shows as NaN
    # weights (the loop stops on them) rather than a silent zero update.
    scale = clip_norm / tf.maximum(norm, clip_norm) + 0.0 * (norm - norm)

    def scaled(g: Any) -> Any:
        if g is None:
            return None
        if isinstance(g, tf.IndexedSlices):
            return tf.IndexedSlices(g.values * tf.cast(scale, g.dtype), g.indices, g.dense_shape)
        return g * tf.cast(scale, g.dtype)

    return [scaled(g) for g in grads]
