"""What the slice a TPU VM is part of means for a run, decided before TensorFlow starts.

A multi-host slice (v4-16 and up, v5e-16 and up) is driven the way Google runs TensorFlow on
one: tensorflow-tpu on every worker, the job on worker 0 only, with `--tpu=<the slice's name>`
(TPUClusterResolver then reaches every worker over the slice's network) and TPU_LOAD_LIBRARY=0
(the process on worker 0 is a client: the workers' TPU runtime drives the chips). So:

* `--tpu=local` there (or no --tpu on a TPU VM, which means local) is refused with the command
  to run instead: TensorFlow's local TPU is this host's chips alone, and its resolver fails on a
  pod ("TPU cores on each host is not same", tensorflow/tensorflow#56760);
* a job started on another worker (`gcloud ... ssh --worker=all` runs it on every one) is
  refused in one line saying it runs from worker 0, before anything touches the model_dir;
* on worker 0, TPU_LOAD_LIBRARY=0 is set unless the user set it.

A single-host slice changes nothing.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from tpurun.errors import UsageError
from tpurun.run_config import RunConfig
from tpurun.run_config.command_table import COMMAND
from tpurun.tpu_vm.installed import LOAD_LIBRARY_ENV
from tpurun.tpu_vm.metadata import SliceFacts


def uses_tpu(run: RunConfig, tpu_chips: bool) -> bool:
    """Whether `run` would run on a TPU, as `tpurun.cluster.strategy.build` decides it."""
    if not COMMAND[run.command].on_tpu or run.use_tpu is False:
        return False
    return run.use_tpu is True or bool(run.tpu) or tpu_chips


def apply(argv: Sequence[str], run: RunConfig, facts: SliceFacts) -> None:
    """Refuses what cannot run on this slice (UsageError); sets up what a multi-host slice needs.

    `argv` is the command line as given (argv[0] the program), for the command to run instead.
    """
    if not facts.multi_host:
        return
    local = run.tpu in (None, "local")
    if facts.worker != 0:
        raise UsageError(
            f"this is {facts.describe()}: a job on a multi-host slice runs from worker 0 only, "
            "which drives every host's TPU; run it there: "
            f"{_on_worker_0(facts, _instead(argv, facts) if local else _command(argv))}"
        )
    if local:
        given = "--tpu=local" if run.tpu else "no --tpu (on a TPU VM: --tpu=local)"
        raise UsageError(
            f"{given} cannot drive {facts.describe()}: TensorFlow's local TPU is this host's "
            f"chips alone; run, on this worker 0: {_instead(argv, facts)}"
        )
    os.environ.setdefault(LOAD_LIBRARY_ENV, "0")


def _instead(argv: Sequence[str], facts: SliceFacts) -> str:
    """argv with `--tpu=<the slice's name>` (and its zone and project) for --tpu=local."""
    kept: list[str] = []
    args = iter(argv[1:])
    for arg in args:
        if arg == "--tpu":
            next(args, None)
        elif not arg.startswith("--tpu="):
            kept.append(arg)
    given = " ".join(kept)
    added = [f"--tpu={facts.name or '<the slice name>'}"]
    if "--tpu_zone" not in given:
        added.append(f"--tpu_zone={facts.zone or '<zone>'}")
    if "--gcp_project" not in given:
        added.append(f"--gcp_project={facts.project or '<project>'}")
    return "tpurun " + shlex.join([*kept, *added])


def _command(argv: Sequence[str]) -> str:
    return "tpurun " + shlex.join(argv[1:])


def _on_worker_0(facts: SliceFacts, command: str) -> str:
    """`command` run on worker 0 through gcloud, from any machine with the Cloud SDK."""
    where = " ".join(
        [
            facts.name or "<the slice name>",
            f"--zone={facts.zone or '<zone>'}",
            f"--project={facts.project or '<project>'}",
        ]
    )
    return f"gcloud compute tpus tpu-vm ssh {where} --worker=0 --command={shlex.quote(command)}"
