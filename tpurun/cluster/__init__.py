"""Where a run executes: the Cluster a strategy makes, and the Cloud TPU it may be.

`strategy` builds a Cluster (local devices, a GPU cluster) and `tpu` one for a Cloud TPU;
everything else only reads it (`machines`). Kept apart from both so that neither imports
the other.

* `machines`: `Cluster`, `device_kind`, `replica_sum`, and whether this is a TPU VM or TF_CONFIG's chief;
* `strategy`: the tf.distribute strategy of a run, and its Cluster;
* `tpu`: a Cloud TPU found, connected and initialised, each wait bounded;
* `tpu_api`: the Cloud TPU API (a node's state, health and address);
* `packed_reduction`: the replicas' sums packed into few all-reduces;
* `determinism`: whether a run's kernels are deterministic (its resume bit-identical).
"""

from __future__ import annotations

from tpurun.cluster.machines import (
    Cluster,
    device_kind,
    is_chief_process,
    is_chief_task,
    replica_sum,
    tpu_vm_detected,
)

__all__ = [
    "Cluster",
    "device_kind",
    "is_chief_process",
    "is_chief_task",
    "replica_sum",
    "tpu_vm_detected",
]
