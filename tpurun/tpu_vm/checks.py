"""`prepare`: the checks `tpurun.cli` runs on this machine for a run, after parsing and before
anything imports TensorFlow or starts a trainer process."""

from __future__ import annotations

from collections.abc import Sequence

from tpurun.errors import UsageError
from tpurun.run_config import RunConfig
from tpurun.tpu_vm import installed, metadata, slice_rules
from tpurun.tpu_vm.devices import tpu_device_files


def prepare(argv: Sequence[str], run: RunConfig) -> None:
    """Checks this machine for `run` before TensorFlow starts.

    Raises UsageError (exit 2) for what cannot run here: a job on a multi-host slice started
    with --tpu=local or on a worker other than 0, or a tensorflow-tpu whose libtpu would abort
    it. Sets TPU_LOAD_LIBRARY=0 on worker 0 of a multi-host slice, unless the user set it.
    """
    chips = bool(tpu_device_files())
    if slice_rules.uses_tpu(run, chips) and (chips or run.tpu == "local"):
        facts = metadata.read_slice()
        if facts is not None:
            slice_rules.apply(argv, run, facts)
    unloadable = installed.unloadable_libtpu()
    if unloadable:
        raise UsageError(unloadable)
