"""The optimizer a config describes: schedule, warmup, batch scaling, weight decay, clipping, EMA.

`build_optimizer(config, global_batch_size)` returns a Keras optimizer that the
training loop uses as any other: build it on the trainable variables in the
strategy's scope, call `apply_gradients` inside `strategy.run` with each replica's
own (not yet summed) gradients.

* `building`: `build_optimizer`, the Keras class a recipe names with tpurun's recipe
  mixed in, and the recipe's other keys passed to its constructor;
* `recipe_optimizer`: the mixin: clipping by the global norm of the summed gradients,
  weight decay excluded by a regex, L2 in the gradient, the all-reduce without its
  gradient (and why Keras' own do not do);
* `adam_weight_decay`: google-research/bert's AdamWeightDecay (`name="adamweightdecay"`),
  Adam without bias correction, for its recipes (configs/bert.py);
* `schedules`: the learning rate over the steps (one Keras schedule);
* `step_schedule`: the schedule evaluated at the run's global step, and the rate at a step;
* `ema`: the moving averages of the weights, read, swapped in and restored;
* `keras_private`: the private Keras attributes all this relies on (`missing`).
"""

from __future__ import annotations

from tpurun.optimization import schedules
from tpurun.optimization.building import build_optimizer, optimizer_classes, recipe_of
from tpurun.optimization.ema import MovingAverages, ema_pairs, restore_ema_weights, swap_in_ema
from tpurun.optimization.keras_private import missing
from tpurun.optimization.recipe_optimizer import (
    RecipeOptimizer,
    clip_by_global_norm,
    sum_over_replicas,
)
from tpurun.optimization.step_schedule import StepSchedule, follow_step, learning_rate_at

__all__ = [
    "MovingAverages",
    "RecipeOptimizer",
    "StepSchedule",
    "build_optimizer",
    "clip_by_global_norm",
    "ema_pairs",
    "follow_step",
    "learning_rate_at",
    "missing",
    "optimizer_classes",
    "recipe_of",
    "restore_ema_weights",
    "schedules",
    "sum_over_replicas",
    "swap_in_ema",
]
