"""`tpurun predict`: one output per input row, printed or written to --output."""

from __future__ import annotations

import sys

from tpurun.commands.model_dir import chosen_checkpoint
from tpurun.commands.running import Prepared
from tpurun.errors import UsageError
from tpurun.run_config import (
    RunConfig,
)
from tpurun.runners.predict import Predictor, output_target, write_rows


def predict(run: RunConfig, prepared: Prepared) -> None:
    cluster, model = prepared.replicas, prepared.model
    if cluster.num_workers > 1:
        # Each worker would predict only its own shard of the rows.
        raise UsageError(
            "tpurun predict runs on one machine: unset TF_CONFIG (it describes "
            f"{cluster.num_workers} workers) and run it once"
        )
    output = run.config.predict.output
    target = output_target(output, run.model_dir) if output else None
    predictor = Predictor(run, cluster, model)
    if target is not None:  # before predicting, not after
        predictor.check_output(output)
    rows = list(predictor.predict(chosen_checkpoint(run), output))
    if target is not None:
        line = write_rows(target, rows)  # JSON lines, .npz or a .png grid, by its extension
        # Beside the predictions when they went to stdout: on stderr, out of their way.
        print(line, file=sys.stderr if target.to_stdout else sys.stdout)
        return
    for line in model.format_predictions(rows):
        print(line)
