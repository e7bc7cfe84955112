"""Distributed input: a model's input_fn, called once per input pipeline, fed to the replicas.

* `distributed`: `distribute` (a mode's dataset over the strategy's replicas, resumed at
  a step), `input_params` (what input_fn is told), `gather_replicas`; `train_batches`
  (one pipeline's training batches) and `place` (datasets fed to the replicas), which
  the tf.data service's input (`tpurun.data_service`) is built from too;
* `padding`: static batches: eval and predict batches padded, with a mask of the real rows;
* `arrays`: in-memory training arrays checked, and `seekable_batches` from any position;
* `example_order`: the examples' order, a pure function of (seed, position);
* `device_data`: training arrays kept in every replica's memory, batches gathered there.
"""

from __future__ import annotations

from tpurun.inputs.arrays import BATCHES_PER_CALL, seekable_batches, train_arrays
from tpurun.inputs.distributed import (
    HostDistributedDataset,
    distribute,
    gather_replicas,
    input_params,
    place,
    replicas_share_host_memory,
    train_batches,
    train_dataset,
)
from tpurun.inputs.padding import check_static_batch, pad_batches

__all__ = [
    "BATCHES_PER_CALL",
    "HostDistributedDataset",
    "check_static_batch",
    "distribute",
    "gather_replicas",
    "input_params",
    "pad_batches",
    "place",
    "replicas_share_host_memory",
    "seekable_batches",
    "train_arrays",
    "train_batches",
    "train_dataset",
]
