"""The Cloud TPU VM as tpurun meets it before TensorFlow starts: what is installed, which slice.

* `installed`: tensorflow-tpu and libtpu as their distributions' metadata say, unimported: a
  pair that would abort `import tensorflow` is refused in one line with the fix;
* `metadata`: the TPU VM's metadata server (the slice, this worker, its hosts), asked only on
  a machine that shows TPU chips (`devices`) or was given --tpu=local;
* `slice_rules`: what a multi-host slice means for a run (the job runs from worker 0 with
  `--tpu=<the slice's name>` and TPU_LOAD_LIBRARY=0);
* `launch_lines`: the gcloud commands that launch a job on a slice (`tpurun check --target`).

`checks.prepare` is the one hook `tpurun.cli` calls, after parsing and before anything
imports TensorFlow or starts a trainer process; `devices` finds TPU chips on this machine.
Nothing here imports TensorFlow.
"""

from __future__ import annotations

from tpurun.tpu_vm.checks import prepare

__all__ = ["prepare"]
