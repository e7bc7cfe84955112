"""The Cloud TPU path (tpurun.cluster.tpu) against a fake Cloud TPU API served on 127.0.0.1.

No test here reaches anything but 127.0.0.1: the TPU "workers" the fake API lists
at 10.x addresses are only resolved, never connected to; in-process tests fail if
any Python socket tries another address; CLI tests run with conftest.OFFLINE_ENV.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import OFFLINE_ENV, error_lines, free_local_ports, metadata_server_watched, run_tpurun

from tpurun.errors import RunError, UsageError
from tpurun.run_config import RunConfig, config_files, merge_flags
from tpurun.tpu_vm import installed

PROJECT = "test-project"
ZONE = "us-central1-b"

# The parts of the Cloud TPU API v1 discovery document that nodes.get needs, copied
# from googleapiclient/discovery_cache/documents/tpu.v1.json (google-api-python-client
# 1.8.0, which cloud-tpu-client pins, predates the bundled documents). rootUrl is
# rewritten to the fake.
DISCOVERY_DOC = {
    "kind": "discovery#restDescription",
    "discoveryVersion": "v1",
    "id": "tpu:v1",
    "name": "tpu",
    "version": "v1",
    "title": "Cloud TPU API",
    "protocol": "rest",
    "rootUrl": "https://tpu.googleapis.com/",
    "servicePath": "",
    "basePath": "",
    "baseUrl": "https://tpu.googleapis.com/",
    "batchPath": "batch",
    "auth": {"oauth2": {"scopes": {"https://www.googleapis.com/auth/cloud-platform": {}}}},
    "parameters": {
        "alt": {
            "default": "json",
            "enum": ["json", "media", "proto"],
            "location": "query",
            "type": "string",
        },
        "fields": {"location": "query", "type": "string"},
        "key": {"location": "query", "type": "string"},
    },
    "resources": {
        "projects": {
            "resources": {
                "locations": {
                    "resources": {
                        "nodes": {
                            "methods": {
                                "get": {
                                    "id": "tpu.projects.locations.nodes.get",
                                    "description": "Gets the details of a node.",
                                    "flatPath": "v1/projects/{projectsId}/locations/{locationsId}/nodes/{nodesId}",
                                    "httpMethod": "GET",
                                    "path": "v1/{+name}",
                                    "parameterOrder": ["name"],
                                    "parameters": {
                                        "name": {
                                            "location": "path",
                                            "pattern": "^projects/[^/]+/locations/[^/]+/nodes/[^/]+$",
                                            "required": True,
                                            "type": "string",
                                        }
                                    },
                                    "response": {"$ref": "Node"},
                                    "scopes": ["https://www.googleapis.com/auth/cloud-platform"],
                                },
                            }
                        }
                    }
                }
            }
        }
    },
    "schemas": {
        "NetworkEndpoint": {
            "id": "NetworkEndpoint",
            "type": "object",
            "properties": {
                "ipAddress": {"type": "string"},
                "port": {"type": "integer", "format": "int32"},
            },
        },
        "Node": {
            "id": "Node",
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "acceleratorType": {"type": "string"},
                "tensorflowVersion": {"type": "string"},
                "state": {"type": "string"},
                "health": {"type": "string"},
                "healthDescription": {"type": "string"},
                "networkEndpoints": {"type": "array", "items": {"$ref": "NetworkEndpoint"}},
            },
        },
    },
}


class FakeCloudTpuApi:
    """Serves the discovery document and nodes.get, like tpu.googleapis.com (v1)."""

    def __init__(self) -> None:
        self.nodes: dict[str, dict] = {}
        self.requests: list[str] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                api.requests.append(self.path)
                path = self.path.split("?")[0]
                if path.startswith("/discovery/"):
                    # Any discovery path: a 404 here would send googleapiclient on to
                    # Google's own discovery service.
                    doc = {**DISCOVERY_DOC, "rootUrl": api.url + "/", "baseUrl": api.url + "/"}
                    self._reply(200, doc)
                elif path.startswith("/v1/") and path[4:] in api.nodes:
                    self._reply(200, api.nodes[path[4:]])
                else:
                    self._reply(
                        404,
                        {
                            "error": {
                                "code": 404,
                                "message": f"Resource '{path[4:]}' was not found",
                                "status": "NOT_FOUND",
                            }
                        },
                    )

            def _reply(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=UTF-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self.discovery_url = self.url + "/discovery/v1/apis/{api}/{apiVersion}/rest"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def add_node(self, name: str, state: str = "READY", workers: int = 1, **fields) -> None:
        full_name = f"projects/{PROJECT}/locations/{ZONE}/nodes/{name}"
        self.nodes[full_name] = {
            "name": full_name,
            "acceleratorType": "v3-8" if workers == 1 else f"v3-{8 * workers}",
            "tensorflowVersion": "2.21.0",
            "state": state,
            "health": "HEALTHY",
            "networkEndpoints": [
                {"ipAddress": f"10.1.2.{3 + i}", "port": 8470} for i in range(workers)
            ],
            **fields,
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


@pytest.fixture
def fake_api(monkeypatch):
    api = FakeCloudTpuApi()
    monkeypatch.setenv("TPU_API_DISCOVERY_URL", api.discovery_url)
    monkeypatch.setenv("TPURUN_TPU_ANONYMOUS_CREDENTIALS", "1")
    yield api
    api.close()


@pytest.fixture(autouse=True)
def only_localhost(monkeypatch):
    """Fails the test if any Python socket connects (or looks up) beyond 127.0.0.1."""
    attempts: list[object] = []
    allowed = ("127.0.0.1", "::1", "localhost")
    real_connect, real_connect_ex = socket.socket.connect, socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def check(sock, address) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and address[0] not in allowed:
            attempts.append(address)
            raise ConnectionRefusedError(f"test blocked a connection to {address}")

    def connect(self, address):
        check(self, address)
        return real_connect(self, address)

    def connect_ex(self, address):
        check(self, address)
        return real_connect_ex(self, address)

    def getaddrinfo(host, *args, **kwargs):
        if host not in allowed:
            attempts.append(host)
            raise socket.gaierror(f"test blocked a lookup of {host}")
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    yield
    assert not attempts, f"tried to reach beyond 127.0.0.1: {attempts}"


def make_run(tpu: str, **fields) -> RunConfig:
    config = merge_flags(config_files.load(config_files.resolve("iris")), {})
    fields.setdefault("tpu_zone", ZONE)
    fields.setdefault("gcp_project", PROJECT)
    return RunConfig(
        command="train",
        config_name="iris",
        config=config,
        model_dir="/tmp/unused",
        use_tpu=True,
        tpu=tpu,
        **fields,
    )


def resolve_error(tpu: str) -> str:
    from tpurun.cluster import tpu as tpu_lib

    with pytest.raises(RunError) as raised:
        tpu_lib.resolve(make_run(tpu))
    assert raised.value.exit_code == 1
    message = str(raised.value)
    assert "\n" not in message
    return message


# --- Resolving a TPU name through the (fake) Cloud TPU API ---------------------------


def test_ready_single_host_resolves_to_its_worker(fake_api):
    from tpurun.cluster import tpu as tpu_lib

    fake_api.add_node("my-tpu")
    resolver = tpu_lib.resolve(make_run("my-tpu"))
    assert resolver.master() == "grpc://10.1.2.3:8470"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.1.2.3:8470"]}
    node_path = f"/v1/projects/{PROJECT}/locations/{ZONE}/nodes/my-tpu"
    assert any(r.startswith(node_path) for r in fake_api.requests)


def test_ready_pod_resolves_to_all_four_workers(fake_api):
    from tpurun.cluster import tpu as tpu_lib

    fake_api.add_node("my-pod", workers=4)
    resolver = tpu_lib.resolve(make_run("my-pod"))
    assert resolver.master() == "grpc://10.1.2.3:8470"
    workers = ["10.1.2.3:8470", "10.1.2.4:8470", "10.1.2.5:8470", "10.1.2.6:8470"]
    assert resolver.cluster_spec().as_dict() == {"worker": workers}


def test_creating_node_says_wait_until_ready(fake_api):
    fake_api.add_node("new-tpu", state="CREATING", health=None, networkEndpoints=[])
    assert resolve_error("new-tpu") == (
        f"the TPU 'new-tpu' (project {PROJECT}, zone {ZONE}) is CREATING, not READY: it is "
        f"still being created; wait until `gcloud compute tpus describe new-tpu "
        f"--zone={ZONE} --project={PROJECT}` shows state: READY, then rerun"
    )


def test_preempted_node_says_recreate_it(fake_api):
    fake_api.add_node("spot-tpu", state="PREEMPTED")
    assert resolve_error("spot-tpu") == (
        f"the TPU 'spot-tpu' (project {PROJECT}, zone {ZONE}) is PREEMPTED, not READY: it "
        f"cannot be restarted; delete it (`gcloud compute tpus delete spot-tpu --zone={ZONE} "
        f"--project={PROJECT}`) and create it again, then rerun (train resumes from the "
        "latest checkpoint in --model_dir)"
    )


def test_stopped_node_says_start_it(fake_api):
    fake_api.add_node("idle-tpu", state="STOPPED")
    message = resolve_error("idle-tpu")
    assert "is STOPPED, not READY" in message
    assert f"gcloud compute tpus start idle-tpu --zone={ZONE} --project={PROJECT}" in message


def test_repairing_node_quotes_the_health_description(fake_api):
    fake_api.add_node("sick-tpu", state="REPAIRING", healthDescription="host maintenance")
    message = resolve_error("sick-tpu")
    assert "is REPAIRING, not READY: it is being repaired by Google (host maintenance)" in message


def test_missing_node_is_a_404_with_where_to_look(fake_api):
    assert resolve_error("no-such-tpu") == (
        f"there is no TPU named 'no-such-tpu' in project {PROJECT}, zone {ZONE} (Cloud TPU "
        f"API: 404 Resource 'projects/{PROJECT}/locations/{ZONE}/nodes/no-such-tpu' was not "
        "found): check --tpu, --tpu_zone and --gcp_project against "
        f"`gcloud compute tpus list --zone={ZONE} --project={PROJECT}`"
    )


def test_ready_but_unhealthy_node_resolves_with_a_warning(fake_api, caplog):
    from tpurun.cluster import tpu as tpu_lib

    fake_api.add_node("sick-tpu", health="UNHEALTHY_TENSORFLOW", healthDescription="no TF server")
    assert tpu_lib.resolve(make_run("sick-tpu")).master() == "grpc://10.1.2.3:8470"
    assert "the TPU 'sick-tpu' is READY but UNHEALTHY_TENSORFLOW (no TF server)" in caplog.text


@pytest.mark.parametrize("change", ["preempted", "deleted"])
def test_node_changing_after_the_lookup_gets_the_same_messages(fake_api, change):
    """cloud-tpu-client re-reads the node in cluster_spec(); its errors map to ours."""
    from tpurun.cluster import tpu as tpu_lib

    fake_api.add_node("my-tpu")
    run = make_run("my-tpu")
    resolver, target = tpu_lib._resolve(run, time.monotonic() + 60)
    full_name = f"projects/{PROJECT}/locations/{ZONE}/nodes/my-tpu"
    if change == "preempted":
        fake_api.nodes[full_name]["state"] = "PREEMPTED"
    else:
        del fake_api.nodes[full_name]
    with pytest.raises(Exception) as raised:  # what TF's connect would see
        resolver.cluster_spec()
    message = str(tpu_lib._failure(run, "connecting to", target, raised.value))
    if change == "preempted":
        assert type(raised.value) is RuntimeError
        assert message.startswith(
            f"the TPU 'my-tpu' (project {PROJECT}, zone {ZONE}) is PREEMPTED, not READY: it "
            "cannot be restarted"
        )
    else:
        assert type(raised.value) is ValueError
        assert message.startswith(
            f"there is no TPU named 'my-tpu' in project {PROJECT}, zone {ZONE} (Cloud TPU API: 404"
        )


def test_missing_credentials_say_how_to_log_in(fake_api, monkeypatch, tmp_path):
    # No anonymous credentials: the Application Default Credentials, of which there are
    # none (no key file, no gcloud login, and the GCE probe goes to 127.0.0.1:1).
    monkeypatch.delenv("TPURUN_TPU_ANONYMOUS_CREDENTIALS")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path))
    fake_api.add_node("my-tpu")
    message = resolve_error("my-tpu")
    assert message.startswith(
        f"no Google Cloud credentials to look up the TPU 'my-tpu' in project {PROJECT}: "
        "run `gcloud auth application-default login`"
    )
    assert not fake_api.requests, "nothing is asked of the API without credentials"


def test_unreachable_api_names_it(monkeypatch):
    (port,) = free_local_ports(1)  # nothing listens there
    monkeypatch.setenv("TPU_API_DISCOVERY_URL", f"http://127.0.0.1:{port}/{{api}}/{{apiVersion}}")
    monkeypatch.setenv("TPURUN_TPU_ANONYMOUS_CREDENTIALS", "1")
    message = resolve_error("my-tpu")
    assert message.startswith(
        f"cannot reach the Cloud TPU API (http://127.0.0.1:{port}) to look up the TPU 'my-tpu'"
    )


# --- grpc:// and local: no API ------------------------------------------------------


def test_grpc_address_is_used_as_is():
    from tpurun.cluster import tpu as tpu_lib

    resolver = tpu_lib.resolve(make_run("grpc://10.9.8.7:8470", tpu_zone=None, gcp_project=None))
    assert resolver.master() == "grpc://10.9.8.7:8470"
    assert resolver.cluster_spec().as_dict() == {"worker": ["10.9.8.7:8470"]}


def test_malformed_grpc_address_is_a_usage_error():
    from tpurun.cluster import tpu as tpu_lib

    with pytest.raises(UsageError, match=r"--tpu=grpc://host/x is not a grpc://HOST:PORT"):
        tpu_lib.resolve(make_run("grpc://host/x"))


def test_local_without_tpu_chips_says_so():
    """The CPU wheel has no TPU kernels; tensorflow-tpu (`make test-tpu-wheel`) has them, and
    finds no TPU."""
    from tpurun.cluster import tpu as tpu_lib

    with pytest.raises(RunError) as raised:
        tpu_lib.connect(make_run("local"))
    detail = (
        "NotFoundError: TPUs not found in the cluster. Failed in initialization: No matching "
        "devices found for '/device:TPU_SYSTEM:0'"
        if installed.tensorflow_tpu()
        else "this TensorFlow has no TPU support (no TPU kernels are registered)"
    )
    assert re.sub(r" \[Op:\w+\]", "", str(raised.value)) == (
        f"initialising the TPU of this TPU VM failed ({detail}): this machine has no TPU "
        "chips (no /dev/accel* or /dev/vfio/*): --tpu=local works only on a Cloud TPU VM; use "
        "--tpu=NAME for a TPU node, or --use_tpu=false"
    )


# --- Through the real CLI -----------------------------------------------------------


def tf_version() -> str:
    """TensorFlow's version, without importing it into the test process (the `tensorflow`
    wheel's, or tensorflow-tpu's under `make test-tpu-wheel`)."""
    return installed.version("tensorflow") or installed.version("tensorflow-tpu") or ""


def tpurun_train(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    """Runs `tpurun train` in a process of its own; returns it and its run time in seconds.

    For the runs that try to connect to a TPU: a connect that cannot succeed stays
    hung in a daemon thread, and a connected one changes TensorFlow's context.
    """
    start = time.monotonic()
    result = run_tpurun(
        "train", f"--model_dir={tmp_path / 'model'}", *args, cwd=tmp_path, timeout=120
    )
    return result, time.monotonic() - start


def tpurun_train_until_exit(tmp_path, *args: str) -> tuple[int, str, float]:
    """Like tpurun_train, but also times how long the process lives after its error line.

    Returns (exit code, stderr, seconds from the error line to the exit). A fresh
    interpreter (not tests/forked): the time to the error line includes TensorFlow's
    import, which a loaded machine slows as much as the exit it is compared with.
    """
    process = subprocess.Popen(
        [sys.executable, "-m", "tpurun", "train", f"--model_dir={tmp_path / 'model'}", *args],
        cwd=tmp_path,
        env={**os.environ, **OFFLINE_ENV},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines, error_at = [], None
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        if ": error: " in line and error_at is None:
            error_at = time.monotonic()
    process.wait(timeout=120)
    assert error_at is not None, "".join(lines)
    return process.returncode, "".join(lines), time.monotonic() - error_at


def test_cli_named_node_refuses_a_local_model_dir_once_its_address_is_known(
    fake_api, tpurun_cli, tmp_path
):
    """--tpu=NAME: the Cloud TPU API gives the node's address (10.1.2.3, a host that
    cannot see this disk); the local model_dir is refused before any connect."""
    fake_api.add_node("node-tpu", tensorflowVersion=tf_version())
    result = tpurun_cli(
        "train",
        f"--model_dir={tmp_path / 'model'}",
        "--tpu=node-tpu",
        f"--tpu_zone={ZONE}",
        f"--gcp_project={PROJECT}",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    (line,) = error_lines(result)
    assert line.startswith(f"tpurun train: error: --model_dir={tmp_path / 'model'} is on this ")
    assert "the TPU node --tpu=node-tpu" in line and "gs://BUCKET" in line, line
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_cli_creating_node_is_one_error_line_and_exit_1(fake_api, tpurun_cli, tmp_path):
    """In-process: the lookup fails before any connect (and only_localhost watches it)."""
    fake_api.add_node("new-tpu", state="CREATING")
    result = tpurun_cli(
        "train",
        f"--model_dir={tmp_path / 'model'}",
        "--tpu=new-tpu",
        f"--tpu_zone={ZONE}",
        f"--gcp_project={PROJECT}",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    assert error_lines(result) == [
        f"tpurun train: error: the TPU 'new-tpu' (project {PROJECT}, zone {ZONE}) is CREATING, "
        f"not READY: it is still being created; wait until `gcloud compute tpus describe "
        f"new-tpu --zone={ZONE} --project={PROJECT}` shows state: READY, then rerun"
    ]
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_cli_unreachable_grpc_address_times_out(tmp_path):
    address = f"grpc://127.0.0.1:{free_local_ports(1)[0]}"
    start = time.monotonic()
    code, stderr, lingered = tpurun_train_until_exit(
        tmp_path, f"--tpu={address}", "--tpu_init_timeout=1"
    )
    elapsed = time.monotonic() - start
    assert code == 1, stderr
    lines = [line for line in stderr.splitlines() if ": error: " in line]
    assert len(lines) == 1, stderr
    assert lines[0] == (
        f"tpurun train: error: gave up after --tpu_init_timeout=1s connecting to the TPU "
        f"worker at {address}: check that this VM can reach the TPU's workers on port 8470 "
        "(same VPC network, firewall); check the address, that the TPU is READY (`gcloud "
        "compute tpus list`) and that it runs TensorFlow "
        f"{tf_version()} like this machine; a large pod may need a longer --tpu_init_timeout"
    )
    # It gave up on its own 1 s (the line says so), not sooner; and the connect still
    # hung in its daemon thread does not keep the process alive: it exits in less time
    # after its error line than it took to get there (start-up and 1 s of waiting),
    # however busy the machine.
    assert elapsed - lingered >= 1, f"took {elapsed:.1f}s"
    assert lingered < elapsed - lingered, f"exited {lingered:.1f}s after its error"
    assert not (tmp_path / "model").exists()


@pytest.mark.slow
def test_cli_ready_node_with_other_tensorflow_times_out_naming_the_mismatch(fake_api, tmp_path):
    port = free_local_ports(1)[0]
    fake_api.add_node(
        "old-tpu",
        tensorflowVersion="2.12.0",
        networkEndpoints=[{"ipAddress": "127.0.0.1", "port": port}],
    )
    result, elapsed = tpurun_train(
        tmp_path,
        "--tpu=old-tpu",
        f"--tpu_zone={ZONE}",
        f"--gcp_project={PROJECT}",
        "--tpu_init_timeout=1",  # a second: the wait is not the subject, its line is
    )
    assert result.returncode == 1, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1, result.stderr
    assert lines[0] == (
        "tpurun train: error: gave up after --tpu_init_timeout=1s connecting to the TPU "
        f"'old-tpu' (v3-8, TensorFlow 2.12.0, grpc://127.0.0.1:{port}): the TPU 'old-tpu' runs "
        f"TensorFlow 2.12.0 but this machine has {tf_version()}, and the two must match: "
        f"reimage the TPU (`gcloud compute tpus reimage old-tpu --version={tf_version()} "
        f"--zone={ZONE} --project={PROJECT}`) or install tensorflow==2.12.* here; check that "
        "this VM can reach the TPU's workers on port 8470 (same VPC network, firewall); a large "
        "pod may need a longer --tpu_init_timeout"
    )
    assert elapsed >= 1, f"took {elapsed:.1f}s"  # it waited, and gave up on its own (the line)


@pytest.mark.slow
def test_cli_use_tpu_without_a_tpu_fails_fast(tpurun_cli, tmp_path, monkeypatch):
    monkeypatch.delenv("TPU_NAME", raising=False)
    with metadata_server_watched() as (env, asked):  # fast: it asks no metadata server
        result = tpurun_cli(
            "train", f"--model_dir={tmp_path / 'model'}", "--use_tpu=true", cwd=tmp_path, env=env
        )
    assert result.returncode == 1, result.stderr
    lines = error_lines(result)
    assert len(lines) == 1 and "no TPU is configured or detected" in lines[0], result.stderr
    assert asked == [False]


@pytest.mark.parametrize("value", ["0", "-5", "nan"])
def test_cli_tpu_init_timeout_must_be_positive(tpurun_cli, tmp_path, value):
    result = tpurun_cli(
        "train",
        f"--model_dir={tmp_path / 'model'}",
        "--tpu=grpc://127.0.0.1:1",
        f"--tpu_init_timeout={value}",
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr
    assert error_lines(result) == [
        f"tpurun train: error: --tpu_init_timeout={value} must be a number of seconds > 0, "
        "at most 2592000"
    ]
