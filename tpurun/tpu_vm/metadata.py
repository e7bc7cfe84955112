"""The TPU VM's metadata server: which slice this machine is part of, which worker it is, its hosts.

Every Cloud TPU VM answers at its own metadata address with the attributes of its slice, under
computeMetadata/v1/instance/attributes/ (the names Google's own launchers read: JAX's
`cloud_tpu_cluster`, MaxText's multi-host job script):

* `accelerator-type`: the slice, "v4-32";
* `agent-worker-number`: this VM's worker number in it, "2";
* `worker-network-endpoints`: every worker's address, comma-separated, each "IP" or
  "name:id:IP", in worker order;
* `tpu-env`: `KEY: 'value'` lines, among them NODE_ID (the TPU's name), ZONE and
  CONSUMER_PROJECT_ID.

The address is GCE_METADATA_HOST, else GCE_METADATA_IP (the variables Google's libraries
honour; tests point them at a fake server on 127.0.0.1), else the link-local 169.254.169.254
(an IP: no DNS lookup). Requests go straight there (no proxy) and each waits at most TIMEOUT_S;
where nothing answers, the first refused or timed-out request ends the look-up and nothing
changes. Callers ask only on a machine that shows TPU chips or was given --tpu=local
(`tpurun.tpu_vm.wanted`): a laptop asks nothing and waits for nothing.
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import re

DEFAULT_ADDRESS = "169.254.169.254"
ADDRESS_ENVS = ("GCE_METADATA_HOST", "GCE_METADATA_IP")
ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"
# A metadata server answers in milliseconds; a second is already its failure.
TIMEOUT_S = 1.0


@dataclasses.dataclass(frozen=True)
class SliceFacts:
    """What the metadata server says about this TPU VM's slice."""

    accelerator_type: str  # "v4-32"
    worker: int  # agent-worker-number
    worker_addresses: tuple[str, ...]  # every worker's IP, worker 0 first
    name: str | None = None  # the TPU's name (tpu-env's NODE_ID)
    zone: str | None = None
    project: str | None = None

    @property
    def hosts(self) -> int:
        return max(1, len(self.worker_addresses))

    @property
    def multi_host(self) -> bool:
        return self.hosts > 1

    def describe(self) -> str:
        """For messages: "worker 2 of the v4-32 slice 'my-slice' (4 hosts)"."""
        name = f" {self.name!r}" if self.name else ""
        hosts = f"{self.hosts} hosts" if self.multi_host else "one host"
        return f"worker {self.worker} of the {self.accelerator_type} slice{name} ({hosts})"


def address() -> str:
    """host[:port] of this VM's metadata server."""
    for name in ADDRESS_ENVS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return DEFAULT_ADDRESS


class _NoServer(Exception):
    """Nothing answered at the metadata address, or what answered is not a metadata server."""


def read_slice(timeout: float = TIMEOUT_S) -> SliceFacts | None:
    """This TPU VM's slice, or None where no metadata server answers, or it describes no TPU VM."""
    try:
        accelerator = _attribute("accelerator-type", timeout)
        if not accelerator:
            return None  # a GCE VM without a TPU
        worker = _attribute("agent-worker-number", timeout) or "0"
        endpoints = _attribute("worker-network-endpoints", timeout) or ""
        env = _tpu_env(_attribute("tpu-env", timeout) or "")
    except _NoServer:
        return None
    if not worker.isdigit():
        return None
    return SliceFacts(
        accelerator_type=accelerator,
        worker=int(worker),
        worker_addresses=tuple(_endpoint_address(e) for e in endpoints.split(",") if e.strip()),
        name=env.get("NODE_ID") or None,
        zone=env.get("ZONE") or None,
        project=env.get("CONSUMER_PROJECT_ID") or None,
    )


def _attribute(name: str, timeout: float) -> str | None:
    """One attribute's value; None when the server has no such attribute (404)."""
    connection = http.client.HTTPConnection(address(), timeout=timeout)
    try:
        connection.request("GET", ATTRIBUTES + name, headers={"Metadata-Flavor": "Google"})
        response = connection.getresponse()
        body = response.read().decode("utf-8", "replace").strip()
    except (OSError, http.client.HTTPException) as e:
        raise _NoServer(str(e)) from None
    finally:
        connection.close()
    # Google's libraries trust only an answer that says it is the metadata server.
    if response.getheader("Metadata-Flavor") != "Google":
        raise _NoServer("the answer is not a metadata server's")
    if response.status == 404:
        return None
    if response.status != 200:
        raise _NoServer(f"HTTP {response.status}")
    return body


def _endpoint_address(endpoint: str) -> str:
    """An endpoint's IP: the entry itself, or the last of "name:id:IP"."""
    return endpoint.strip().rsplit(":", 1)[-1]


def _tpu_env(text: str) -> dict[str, str]:
    """tpu-env's `KEY: 'value'` lines as a dict."""
    found = {}
    for line in text.splitlines():
        match = re.fullmatch(r"\s*([A-Z0-9_]+)\s*:\s*'?(.*?)'?\s*", line)
        if match:
            found[match.group(1)] = match.group(2)
    return found
