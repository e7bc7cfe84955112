"""The peak FLOP/s of a run's devices, MFU's denominator: the TPU table of `targets`, a GPU
table; a CPU has none."""

from __future__ import annotations

import re

import tensorflow as tf

from tpurun.check import targets
from tpurun.cluster import Cluster

TERA = 1e12
# Dense bfloat16 (float16 on V100/T4, which have no bfloat16) tensor-core peaks per GPU, from
# the vendors' data sheets; matched on the name TensorFlow reports for the device.
GPU_PEAKS = (
    ("H100", 989 * TERA),  # SXM; the PCIe card: 756
    ("A100", 312 * TERA),
    ("L4", 121 * TERA),
    ("A10", 125 * TERA),
    ("V100", 125 * TERA),
    ("T4", 65 * TERA),
)
_TPU_TYPE = re.compile(r"\b(v\d+[a-z]*-\d+)\b")


def peak_flops(cluster: Cluster) -> tuple[float | None, str | None]:
    """The peak FLOP/s of all the run's replicas together, or None and why not."""
    kind = cluster.replica_kind
    if cluster.is_tpu or kind == "TPU":
        return _tpu_peak(cluster)
    if kind == "GPU":
        names = [
            tf.config.experimental.get_device_details(gpu).get("device_name", "")
            for gpu in tf.config.list_physical_devices("GPU")
        ]
        for name, peak in GPU_PEAKS:
            if names and name in names[0]:
                return peak * cluster.num_replicas, None
        return None, f"no peak FLOP/s known for the GPU {names[0] if names else '?'}"
    return None, "a CPU has no peak FLOP/s table"


def _tpu_peak(cluster: Cluster) -> tuple[float | None, str | None]:
    found = _TPU_TYPE.search(cluster.description)
    if not found:
        return None, "the TPU's type is unknown (--tpu=local or an address: no Cloud TPU API)"
    try:
        target = targets.parse(found.group(1))
    except Exception:  # noqa: BLE001 - an unknown type: no peak
        return None, f"no peak FLOP/s known for {found.group(1)}"
    generation = next(g for g in targets.GENERATIONS if g.name == target.generation)
    per_replica = generation.peak_flops_per_replica  # bfloat16, `targets`' table
    if not per_replica:
        return None, generation.missing_peaks or f"no peak FLOP/s for TPU {generation.name}"
    return per_replica * cluster.num_replicas, None
