"""The training examples a run's data hold, where the data can count them.

A run that says a length in epochs needs them (`tpurun.run_config.epochs.resolve_length`
turns epochs into steps): in-memory arrays count themselves, and a TFDS dataset's record
counts its train split. Where nothing counts them (a model's own tf.data input), the
config's `data.train_examples` says them.
"""

from __future__ import annotations

from typing import Any

from tpurun.datasets.tfds_reader import train_examples
from tpurun.model import TrainArrays
from tpurun.run_config.epochs import Counted


def counted(config: Any, arrays: TrainArrays | None) -> Counted | None:
    """The training examples counted in the data of `config`'s model, whose in-memory
    training arrays are `arrays` (None: it has none); None where nothing counts them."""
    if arrays is not None:
        return Counted(arrays.num_examples, "counted in the model's train_arrays")
    examples = train_examples(config)
    if examples is not None:
        return Counted(examples, "counted by the prepared TFDS dataset's train split")
    return None
