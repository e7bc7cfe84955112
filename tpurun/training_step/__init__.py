"""A model's own training step: what the launcher hands it, and random draws keyed on the example.

* `Step` (step.py): one replica's view of a training step, what `Model.train_step`
  gets: the models, the named optimizers, the global-batch scaling, the keyed draws;
* `KeyedRandom`, `KeyedDropout` (keyed_random.py): random numbers keyed on (seed,
  step, example), the same on 1 or 8 replicas and on resume;
* `supervised_step` (supervised.py): the default `train_step`, written with `Step`.
"""

from tpurun.training_step.keyed_random import KeyedDropout, KeyedRandom
from tpurun.training_step.step import Step
from tpurun.training_step.supervised import OPTIMIZER, supervised_step

__all__ = ["OPTIMIZER", "KeyedDropout", "KeyedRandom", "Step", "supervised_step"]
