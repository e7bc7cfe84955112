"""A TPU VM's metadata server, faked on 127.0.0.1: the slice attributes a test gives it.

`FakeMetadataServer(attributes)` answers GET /computeMetadata/v1/instance/attributes/<name>
with `attributes[name]` (404 for the rest) and the `Metadata-Flavor: Google` header, as the
real one does; `env` points Google's variables (and tpurun's look-up) at it, and `requests`
lists the paths it was asked for. `slice_attributes` builds what a worker of a slice sees.
"""

from __future__ import annotations

import http.server
import threading

ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"


def slice_attributes(
    accelerator_type: str, worker: int, hosts: int, name: str = "pod"
) -> dict[str, str]:
    """What worker `worker` of a slice of `hosts` hosts reads from its metadata server."""
    endpoints = ",".join(f"{name}-w-{i}:{i}:10.130.0.{10 + i}" for i in range(hosts))
    tpu_env = "\n".join(
        [
            f"ACCELERATOR_TYPE: '{accelerator_type}'",
            "CONSUMER_PROJECT_ID: 'my-project'",
            f"NODE_ID: '{name}'",
            f"WORKER_ID: '{worker}'",
            "ZONE: 'us-central2-b'",
        ]
    )
    return {
        "accelerator-type": accelerator_type,
        "agent-worker-number": str(worker),
        "worker-network-endpoints": endpoints,
        "tpu-env": tpu_env,
    }


class FakeMetadataServer:
    """Serves `attributes` in a thread until `close()` (or the end of a `with` block)."""

    def __init__(self, attributes: dict[str, str]):
        self.attributes = attributes
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.requests.append(self.path)
                name = self.path.removeprefix(ATTRIBUTES)
                value = server.attributes.get(name) if self.path.startswith(ATTRIBUTES) else None
                body = (value if value is not None else "not found").encode()
                self.send_response(200 if value is not None else 404)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # quiet
                pass

        self._http = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self._http.server_address[1]}"
        self.env = {"GCE_METADATA_HOST": self.address, "GCE_METADATA_IP": self.address}
        self._thread = threading.Thread(target=self._http.serve_forever, args=(0.01,), daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()

    def __enter__(self) -> FakeMetadataServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
