"""`tpurun export`: a checkpoint as a SavedModel for serving."""

from __future__ import annotations

from tpurun.commands.model_dir import chosen_checkpoint
from tpurun.commands.running import Prepared
from tpurun.run_config import (
    RunConfig,
)
from tpurun.runners.export import export


def export_command(run: RunConfig, prepared: Prepared) -> None:
    print(export(run, prepared.model, chosen_checkpoint(run)))  # serving has no replicas
