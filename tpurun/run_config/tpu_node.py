"""A TPU node's host reads and writes through gs:// only: a local path of a run is refused
before anything is written (`refuse_local_paths_on_a_tpu_node`)."""

from __future__ import annotations

import re

from tpurun.errors import UsageError
from tpurun.run_config.command_table import COMMAND
from tpurun.run_config.keys.trained_keys import DATA_LOCATION_SUFFIXES
from tpurun.run_config.run import RunConfig

_LOOPBACK = re.compile(r"grpc://(127\.\d+\.\d+\.\d+|localhost|\[::1\])(:\d+)?")


def _local_paths(run: RunConfig) -> list[tuple[str, str]]:
    """(where it was given, path) of every path of the run on this machine's disk."""
    paths = [("--model_dir", run.model_dir), ("--export_dir", run.export_dir or "")]
    config = run.config
    paths += [
        ("--warm_start_from", config.train.warm_start_from or ""),
        ("--input", str(config.predict.get("input") or "")),
        ("--output", str(config.predict.get("output") or "")),
    ]
    data = config.get("data") or {}
    paths += [
        (f"--config.data.{key}", str(value))
        for key, value in data.items()
        if key.endswith(DATA_LOCATION_SUFFIXES) and isinstance(value, str)
    ]
    return [(flag, path) for flag, path in paths if path and "://" not in path]


def refuse_local_paths_on_a_tpu_node(run: RunConfig, address: str | None = None) -> None:
    """A TPU node's host reads data and writes checkpoints itself, through gs:// only.

    It cannot see this machine's disk: TensorFlow fails there, after the TPU was
    reached, with "File system scheme '[local]' not implemented" (tensorflow#32651).
    `address`: the node's grpc:// address once a --tpu=NAME is looked up (checked
    before connecting); without it, a --tpu=grpc:// address is checked before
    anything is written. A worker on this machine (loopback) sees its disk.
    """
    if not COMMAND[run.command].on_tpu or run.use_tpu is False or not run.tpu or run.tpu == "local":
        return
    address = address or (run.tpu if run.tpu.startswith("grpc://") else None)
    if address is None or _LOOPBACK.fullmatch(address):
        return
    local = _local_paths(run)
    if local:
        flag, path = local[0]
        raise UsageError(
            f"{flag}={path} is on this machine's disk, but the TPU node --tpu={run.tpu} reads "
            "and writes through its own host, which sees only Cloud Storage (TensorFlow's "
            "\"File system scheme '[local]' not implemented\"): give a gs://BUCKET/... path, "
            "or run on a TPU VM with --tpu=local"
        )
