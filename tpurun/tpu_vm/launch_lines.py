"""The commands that launch a job on a multi-host slice, as `tpurun check --target` prints them.

Google's runbook for TensorFlow on a pod slice (the Model Garden tests on v4-32 and v5e-16 in
GoogleCloudPlatform/ml-auto-solutions): create the slice with the TensorFlow pod runtime,
install tensorflow-tpu on every worker, run the job on worker 0 only with TPU_NAME and
TPU_LOAD_LIBRARY=0. The runtime's name (cloud.google.com/tpu/docs/runtimes) is
`tpu-vm-tf-x.y.z[-pod][-pjrt]`: `-pod` for a multi-host slice, `-pjrt` for the PJRT runtime,
which every TensorFlow from 2.15 on names explicitly; the page gives v5e, v5p and v6e the same
`tpu-vm-tf-x.y.z-pod-pjrt` as v2-v4. `gcloud compute tpus tpu-vm versions list --zone=ZONE`
says which a zone offers.
"""

from __future__ import annotations

from tpurun.tpu_vm.installed import TENSORFLOW_TPU


def runtime_version(multi_host: bool, tensorflow: str = TENSORFLOW_TPU) -> str:
    """The TPU software version a slice is created with for `tensorflow`."""
    return f"tpu-vm-tf-{tensorflow}{'-pod' if multi_host else ''}-pjrt"


def lines(accelerator_type: str, hosts: int, config: str) -> list[str]:
    """The launch of `tpurun train --config=<config>` on a slice of `hosts` hosts, as shell lines
    that read TPU_NAME, ZONE, PROJECT and BUCKET from the caller's shell."""
    zone = "--zone=$ZONE --project=$PROJECT"
    where = f"$TPU_NAME {zone}"
    install = "cd tpurun && pip install -r requirements-tpu.txt && pip install --no-deps ."
    run = (
        "TPU_NAME=$TPU_NAME TPU_LOAD_LIBRARY=0 tpurun train "
        f"--config={config} --tpu_zone=$ZONE --gcp_project=$PROJECT "
        f"--model_dir=gs://$BUCKET/{config}"
    )
    return [
        f"launch on a {accelerator_type} ({hosts} hosts; set TPU_NAME, ZONE, PROJECT and BUCKET "
        "first): the job runs on worker 0, which drives every host's TPU; data and --model_dir "
        "on gs://, which every host reads (docs/tpu.md, Pod slices)",
        f"  gcloud compute tpus tpu-vm create {where} --accelerator-type={accelerator_type} "
        f"--version={runtime_version(multi_host=hosts > 1)}",
        f"  gcloud compute tpus tpu-vm scp --recurse . $TPU_NAME:tpurun {zone} --worker=all",
        f"  gcloud compute tpus tpu-vm ssh {where} --worker=all --command='{install}'",
        f'  gcloud compute tpus tpu-vm ssh {where} --worker=0 --command="{run}"',
        f"  tpurun report --model_dir=gs://$BUCKET/{config}",
    ]
