"""The Cloud TPU API: looking a TPU node up by name, and what its answer (or failure) means.

`tpurun.cluster.tpu` reads the node here before connecting, so a TPU that does not exist,
is not READY or cannot be read fails at once with its state and the fix.

Environment:
  TPU_API_DISCOVERY_URL: where the Cloud TPU API's discovery document is, as a
      URI template with {api} and {apiVersion} (cloud-tpu-client reads it too).
      Default: Google's discovery service.
  TPURUN_TPU_ANONYMOUS_CREDENTIALS=1: for tests only. Calls the Cloud TPU API
      without credentials (a fake API on 127.0.0.1) instead of with the
      Application Default Credentials.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import tensorflow as tf

from tpurun.errors import RunError
from tpurun.errors.tf_errors import first_line
from tpurun.run_config import RunConfig

DISCOVERY_URL_ENV = "TPU_API_DISCOVERY_URL"
ANONYMOUS_CREDENTIALS_ENV = "TPURUN_TPU_ANONYMOUS_CREDENTIALS"

# Node states (Cloud TPU API v1) that pass by themselves: wait, then rerun.
_PASSING_STATES = {
    "STATE_UNSPECIFIED": "has no state yet",
    "CREATING": "is still being created",
    "STARTING": "is starting",
    "RESTARTING": "is restarting",
    "REIMAGING": "is being reimaged (its software is changing)",
    "REPAIRING": "is being repaired by Google",
    "UNHIDING": "is being unhidden",
}


def credentials(run: RunConfig) -> Any:
    """The credentials cloud-tpu-client would use by default: the Application Default ones.

    Looked up once here, so a missing login fails with its own message and the
    resolver's later API calls use the same credentials.
    """
    if os.environ.get(ANONYMOUS_CREDENTIALS_ENV) == "1":
        import google.auth.credentials

        return google.auth.credentials.AnonymousCredentials()
    try:
        from oauth2client.client import ApplicationDefaultCredentialsError, GoogleCredentials
    except ImportError as e:
        raise RunError(
            f"looking up --tpu={run.tpu} needs the Google API client ({e}): "
            "pip install cloud-tpu-client, or pass --tpu=grpc://HOST:8470"
        ) from None
    try:
        return GoogleCredentials.get_application_default()
    except ApplicationDefaultCredentialsError as e:
        raise RunError(
            f"no Google Cloud credentials to look up the TPU {run.tpu!r} in project "
            f"{run.gcp_project}: run `gcloud auth application-default login`, or set "
            "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file, or run on a GCE VM "
            "whose service account may read TPUs; or pass --tpu=grpc://HOST:8470 to skip the "
            f"lookup ({first_line(e)})"
        ) from None


def get_node(run: RunConfig, credentials: Any, discovery_url: str | None) -> dict[str, Any]:
    """GET projects/P/locations/Z/nodes/NAME from the Cloud TPU API, or a RunError."""
    from googleapiclient import discovery, errors

    node_name = f"projects/{run.gcp_project}/locations/{run.tpu_zone}/nodes/{run.tpu}"
    where = f"the TPU {run.tpu!r} (project {run.gcp_project}, zone {run.tpu_zone})"
    try:
        kwargs = {"discoveryServiceUrl": discovery_url} if discovery_url else {}
        service = discovery.build(
            "tpu", "v1", credentials=credentials, cache_discovery=False, **kwargs
        )
    except errors.HttpError as e:
        raise RunError(
            f"cannot load the Cloud TPU API description from {e.uri} (HTTP {e.resp.status}) to "
            f"look up {where}: check {DISCOVERY_URL_ENV} if set, and network access to Google APIs"
        ) from None
    except Exception as e:  # noqa: BLE001 - socket/httplib2/auth errors all mean "unreachable"
        raise RunError(api_unreachable(run, discovery_url, e)) from None
    try:
        return service.projects().locations().nodes().get(name=node_name).execute()
    except errors.HttpError as e:
        raise RunError(http_error_message(run, e)) from None
    except Exception as e:  # noqa: BLE001
        raise RunError(api_unreachable(run, discovery_url, e)) from None


def http_error_message(run: RunConfig, e: Any) -> str:
    status = e.resp.status
    where = f"the TPU {run.tpu!r} (project {run.gcp_project}, zone {run.tpu_zone})"
    listing = f"gcloud compute tpus list --zone={run.tpu_zone} --project={run.gcp_project}"
    reason = _api_reason(e)
    if status == 404:
        return (
            f"there is no TPU named {run.tpu!r} in project {run.gcp_project}, zone "
            f"{run.tpu_zone} (Cloud TPU API: 404 {reason}): check --tpu, --tpu_zone and "
            f"--gcp_project against `{listing}`"
        )
    if status in (401, 403):
        return (
            f"not allowed to read {where} (Cloud TPU API: {status} {reason}): the credentials "
            f"need the TPU Viewer role (roles/tpu.viewer) on {run.gcp_project}, and the Cloud "
            f"TPU API must be enabled there (`gcloud services enable tpu.googleapis.com "
            f"--project={run.gcp_project}`); `gcloud auth application-default login` renews "
            "expired credentials"
        )
    return (
        f"the Cloud TPU API failed to look up {where} ({status} {reason}); "
        f"retry, or check `{listing}`"
    )


def _api_reason(e: Any) -> str:
    try:
        message = json.loads(e.content.decode("utf-8"))["error"]["message"]
    except (ValueError, KeyError, TypeError, AttributeError):
        message = getattr(e.resp, "reason", "") or ""
    return first_line(message)


def api_unreachable(run: RunConfig, discovery_url: str | None, e: BaseException) -> str:
    if type(e).__module__.startswith(("oauth2client", "google.auth")):
        return (
            f"the Google Cloud credentials were refused while looking up the TPU {run.tpu!r} "
            f"({type(e).__name__}: {first_line(e)}): run `gcloud auth application-default "
            "login`, or point GOOGLE_APPLICATION_CREDENTIALS at a valid service-account key"
        )
    return (
        f"cannot reach the Cloud TPU API ({api_host(discovery_url)}) to look up the TPU "
        f"{run.tpu!r} ({type(e).__name__}: {first_line(e)}): check this machine's network "
        f"access{f' and {DISCOVERY_URL_ENV}' if discovery_url else ''}, or pass "
        "--tpu=grpc://HOST:8470 to skip the lookup"
    )


def api_host(discovery_url: str | None) -> str:
    if not discovery_url:
        return "googleapis.com"
    match = re.match(r"\w+://[^/]+", discovery_url)
    return match.group(0) if match else discovery_url


def endpoints(node: dict[str, Any]) -> list[str]:
    """The workers' host:port, as cloud-tpu-client reads them from a node."""
    endpoints = node.get("networkEndpoints")
    if endpoints is None and node.get("ipAddress"):
        endpoints = [{"ipAddress": node["ipAddress"], "port": node.get("port", "8470")}]
    return [
        f"{e['ipAddress']}:{e.get('port', '8470')}" for e in endpoints or [] if e.get("ipAddress")
    ]


def state_message(run: RunConfig, state: str, health_description: str | None) -> str:
    flags = f"--zone={run.tpu_zone} --project={run.gcp_project}"
    where = f"the TPU {run.tpu!r} (project {run.gcp_project}, zone {run.tpu_zone}) is {state}"
    why = f" ({first_line(health_description)})" if health_description else ""
    if state in _PASSING_STATES:
        return (
            f"{where}, not READY: it {_PASSING_STATES[state]}{why}; wait until `gcloud compute "
            f"tpus describe {run.tpu} {flags}` shows state: READY, then rerun"
        )
    if state in ("STOPPED", "STOPPING"):
        return (
            f"{where}, not READY{why}: start it with `gcloud compute tpus start {run.tpu} "
            f"{flags}`, then rerun"
        )
    if state in ("PREEMPTED", "TERMINATED"):
        return (
            f"{where}, not READY{why}: it cannot be restarted; delete it (`gcloud compute tpus "
            f"delete {run.tpu} {flags}`) and create it again, then rerun (train resumes from "
            "the latest checkpoint in --model_dir)"
        )
    if state in ("DELETING", "HIDING", "HIDDEN"):
        return (
            f"{where}, not READY{why}: it is going away; create a new TPU "
            "(`gcloud compute tpus create ...`) and pass its name with --tpu"
        )
    return (
        f"{where}, not READY{why}: wait until `gcloud compute tpus describe {run.tpu} {flags}` "
        "shows state: READY, or recreate it"
    )


def health_note(node: dict[str, Any]) -> str | None:
    health = node.get("health")
    if not health or health in ("HEALTHY", "HEALTH_UNSPECIFIED"):
        return None
    why = f" ({first_line(node['healthDescription'])})" if node.get("healthDescription") else ""
    return f"the TPU {node.get('name', '').rsplit('/', 1)[-1]!r} is READY but {health}{why}"


def version_note(tpu_version: str | None, run: RunConfig) -> str | None:
    """Says so when the TPU runs another TensorFlow (major.minor) than this machine."""
    ours = re.match(r"(\d+)\.(\d+)", tf.__version__)
    theirs = re.search(r"(\d+)\.(\d+)", tpu_version or "")
    if not (ours and theirs) or ours.groups() == theirs.groups():
        return None
    flags = f"--zone={run.tpu_zone} --project={run.gcp_project}"
    return (
        f"the TPU {run.tpu!r} runs TensorFlow {tpu_version} but this machine has "
        f"{tf.__version__}, and the two must match: reimage the TPU (`gcloud compute tpus "
        f"reimage {run.tpu} --version={tf.__version__} {flags}`) or install "
        f"tensorflow=={theirs.group(1)}.{theirs.group(2)}.* here"
    )
