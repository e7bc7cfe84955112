"""How many tf.data service workers would feed a slice whose hosts do not (no TensorFlow).

`tpurun check --target` measures the training input here, per CPU-second
(`tpurun.check.host_input`), and bounds the examples/s the slice's train step takes.
Where a host's CPUs fall short, the input can be made by a tf.data service's workers
on CPU VMs instead: each makes about its vCPUs x the rate per CPU-second, less what
the service itself costs a worker (SERVICE_SHARE: its batches compressed and sent),
and together they must make what every host of the slice takes. `lines` says how
many workers of WORKER_MACHINE, and the commands that start them (docs/data-service.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from tpurun.run_config.keys.service_keys import DISPATCHER_PORT, WORKER_PORT

# The CPU VM the sizing counts in: an n2-standard-32 (32 vCPUs, 128 GB), a common size
# for input workers; another size scales the count by its vCPUs.
WORKER_MACHINE = "n2-standard-32"
WORKER_VCPUS = 32
# The share of a worker's CPU left to the pipeline once the service's own work (each
# batch compressed and sent over gRPC) is paid: an allowance, above the ~2% a step-bound
# mnist lost to the round trip in scripts/bench_data_service.py (docs/benchmarks.md),
# which one machine measures on the trainer's side only.
SERVICE_SHARE = 0.8


@dataclasses.dataclass(frozen=True)
class Sizing:
    """The service workers that would feed a slice."""

    workers: int
    per_worker: float  # examples/s one worker makes
    needed: float  # examples/s the slice's train step takes at its bound

    @classmethod
    def of(cls, per_cpu_second: float, step_rate_per_host: float, hosts: int) -> Sizing:
        per_worker = per_cpu_second * WORKER_VCPUS * SERVICE_SHARE
        needed = step_rate_per_host * hosts
        return cls(max(1, math.ceil(needed / per_worker)), per_worker, needed)


def lines(
    sizing: Sizing, config: str, python_calls: list[str], rate: Callable[[float], str]
) -> list[str]:
    """What check prints under an input-bound verdict: the workers and their commands.
    `python_calls`: what Python the input calls (the service cannot run it); `rate`: how
    check writes examples/s (`host_input.rate`)."""
    if python_calls:
        return [
            f"  tf.data service: cannot make this input: input_fn(train) calls "
            f"{' and '.join(python_calls)}, Python that the service's workers cannot run"
        ]
    n = sizing.workers
    zone = "--zone=$ZONE --project=$PROJECT"
    names = f"tpurun-data-dispatcher $(seq -f 'tpurun-data-%g' 1 {n})"
    # Debian 12's Python refuses pip outside a venv (PEP 668): tpurun in ~/env.
    install = (
        "sudo apt-get update -qq && sudo apt-get install -y -qq python3-venv && "
        "python3 -m venv ~/env && ~/env/bin/pip install -q ./tpurun"
    )
    work_dir = "gs://$BUCKET/data-service"
    dispatcher = f"tpurun-data-dispatcher:{DISPATCHER_PORT}"
    # Double quotes: $BUCKET is the caller's; stdin from /dev/null, so that ssh returns.
    start = "nohup {} > data-service.log 2>&1 < /dev/null &"
    return [
        f"  tf.data service: {n} worker{'s' * (n > 1)} of {WORKER_VCPUS} vCPUs ({WORKER_MACHINE},"
        f" ~{rate(sizing.per_worker)} examples/s each at this CPU's rate per CPU-second, "
        f"{SERVICE_SHARE:.0%} of it left by the service's own work) would make the "
        f"{rate(sizing.needed)} examples/s the slice's train step takes at its bound; "
        "a dispatcher beside them (docs/data-service.md). Set ZONE, PROJECT and BUCKET, then:",
        f"    gcloud compute instances create {names} {zone} "
        f"--machine-type={WORKER_MACHINE} --image-family=debian-12 --image-project=debian-cloud",
        f"    for vm in {names}; do gcloud compute scp --recurse . $vm:tpurun {zone} && "
        f"gcloud compute ssh $vm {zone} --command='{install}'; done",
        f'    gcloud compute ssh tpurun-data-dispatcher {zone} --command="'
        + start.format(
            f"~/env/bin/tpurun data-service dispatcher --port={DISPATCHER_PORT} "
            f"--work_dir={work_dir}"
        )
        + '"',
        f'    for i in $(seq 1 {n}); do gcloud compute ssh tpurun-data-$i {zone} --command="'
        + start.format(
            f"~/env/bin/tpurun data-service worker --dispatcher={dispatcher} --port={WORKER_PORT}"
        )
        + '"; done',
        f"    then train with --config={config} --config.data.service=grpc://{dispatcher} "
        "(a service-fed run does not resume exactly)",
    ]
