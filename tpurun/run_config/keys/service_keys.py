"""config.data's tf.data service keys, checked before TensorFlow loads (docs/data-service.md).

`config.data.service` names a dispatcher as grpc://HOST:PORT ("" = off);
`config.data.service_processing_mode` is one of PROCESSING_MODES; `config.data.
service_timeout` is the seconds the service may stay silent. A config whose `data`
section lacks them (one that set its own) reads its input here, as with "".
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from tpurun.errors import UsageError
from tpurun.run_config.bounds import MAX_SECONDS

# The ports `tpurun data-service dispatcher|worker` listen on by default.
DISPATCHER_PORT, WORKER_PORT = 5050, 5051
PROCESSING_MODES = ("distributed_epoch", "parallel_epochs")
DEFAULT_MODE = "distributed_epoch"
DEFAULT_TIMEOUT = 120.0
# A host name or IPv4 address, or an IPv6 address in brackets; then a port.
_ADDRESS = re.compile(r"grpc://(\[[0-9a-fA-F:.]+\]|[A-Za-z0-9][A-Za-z0-9.-]*):(\d{1,5})")


@dataclasses.dataclass(frozen=True)
class Service:
    """The service a run's training input goes through."""

    address: str  # HOST:PORT of the dispatcher (what gRPC dials)
    processing_mode: str
    timeout: float  # seconds

    @property
    def target(self) -> str:
        """grpc://HOST:PORT, as the config says it and tf.data takes it."""
        return f"grpc://{self.address}"


def service(config: Any) -> Service | None:
    """The run's tf.data service, or None when its input is made here; raises UsageError
    for a key's value that is not one."""
    data = config.get("data") if hasattr(config, "get") else None
    if not data or not hasattr(data, "get") or not data.get("service"):
        return None
    given = data.get("service")
    match = _ADDRESS.fullmatch(given) if isinstance(given, str) else None
    if match is None or not 0 < int(match.group(2)) < 65536:
        raise UsageError(
            f"config.data.service={given!r} is not a dispatcher address: give grpc://HOST:PORT "
            "(e.g. --config.data.service=grpc://10.128.0.5:5050, where `tpurun data-service "
            "dispatcher --port=5050` runs), or '' to read the input here"
        )
    mode = data.get("service_processing_mode", DEFAULT_MODE)
    if mode not in PROCESSING_MODES:
        raise UsageError(
            f"config.data.service_processing_mode={mode!r} is not a processing mode: use "
            f"{' or '.join(PROCESSING_MODES)} (docs/data-service.md says what each guarantees)"
        )
    timeout = data.get("service_timeout", DEFAULT_TIMEOUT)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        timeout = None
    if timeout is None or not 0 < timeout <= MAX_SECONDS:
        raise UsageError(
            f"config.data.service_timeout={data.get('service_timeout')!r} must be seconds, "
            f"above 0 and at most {MAX_SECONDS:g} (how long the service may stay silent "
            "before the run ends with exit 69)"
        )
    return Service(f"{match.group(1)}:{match.group(2)}", mode, float(timeout))


def check(config: Any) -> None:
    """Refuses a config whose service keys are not valid (one UsageError line)."""
    service(config)
