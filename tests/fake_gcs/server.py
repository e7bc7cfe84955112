"""A GCS server on 127.0.0.1 for tests: fake-gcs-server behind the proxy, with faults and counts.

`GcsServer.env` is what a process needs for its gs:// paths to land here:
TensorFlow's client through the proxy (`https_proxy`, `CURL_CA_BUNDLE`, a token),
gcsfs and pandas through `STORAGE_EMULATOR_HOST` (the proxy's plain address).

    with GcsServer(tmp_dir) as gcs:
        os.environ.update(gcs.env)            # or pass it to a subprocess
        bucket = gcs.make_bucket("iris")      # 'gs://iris-1a2b3c4d'
        with gcs.counting() as log:
            tf.io.gfile.makedirs(bucket + "/model")
        print(log.summary())                  # '7 requests: 4 metadata, 2 list, 1 upload'
        gcs.fail(503, kind="upload", nth=2)   # the second upload request gets a 503
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

from fake_gcs import certs
from fake_gcs.emulator import json_request
from fake_gcs.proxy import CONTROL, TUNNEL_HOSTS
from fake_gcs.traffic import FaultRule, Request, RequestLog

TOKEN = "fake-gcs-token"
_TESTS = Path(__file__).resolve().parent.parent  # tests/, where the package fake_gcs lives
# (and its parent, the repository, has scripts/offline_env.py)


class Fault:
    """A fault rule the proxy was given (see traffic.FaultRule); `hits` asks how often it acted."""

    def __init__(self, server: GcsServer, rule_id: int, rule: FaultRule):
        self._server, self.id, self.rule = server, rule_id, rule

    @property
    def hits(self) -> int:
        """How many requests it acted on so far."""
        return self._state()["hits"]

    @property
    def seen(self) -> int:
        """How many requests matched it so far."""
        return self._state()["seen"]

    def _state(self) -> dict:
        return self._server._control("GET", f"rules/{self.id}")

    def __repr__(self) -> str:
        return f"Fault({self.id}, {self.rule})"


class GcsServer:
    """Starts with `start()` (or `with GcsServer(directory) as gcs:`), stops with `stop()`.

    The emulator and the proxy run in a server process of their own (__main__.py);
    `directory` receives the throwaway CA and that process's logs.
    """

    def __init__(self, directory: Path):
        self.directory = directory
        self.env: dict[str, str] = {}
        self._process: subprocess.Popen | None = None
        self._proxy_port = self._emulator_port = 0
        self._reset_at = 0  # requests before this index of the proxy's log were reset away

    def start(self) -> GcsServer:
        try:
            ca, cert, key = certs.make_certificates(self.directory, sorted(TUNNEL_HOSTS))
            self._start_process(cert, key)
        except BaseException:
            self.stop()
            raise
        origin = f"http://127.0.0.1:{self._proxy_port}"
        local = "127.0.0.1,localhost,::1"  # the tests' own servers are reached directly
        self.env = {
            "https_proxy": origin,
            "HTTPS_PROXY": origin,
            "no_proxy": local,
            "NO_PROXY": local,
            "CURL_CA_BUNDLE": str(ca),
            "GOOGLE_AUTH_TOKEN_FOR_TESTING": TOKEN,
            "STORAGE_EMULATOR_HOST": origin,
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }
        return self

    @property
    def pid(self) -> int | None:
        """The server process's pid (it runs the emulator and the proxy), once started."""
        return self._process.pid if self._process else None

    def _start_process(self, cert: Path, key: Path) -> None:
        log_path = self.directory / "server.log"
        with open(log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "fake_gcs", f"--cert={cert}", f"--key={key}"]
                + [f"--log={self.directory / 'fake-gcs-server.log'}"],
                stdin=subprocess.PIPE,  # the server process stops when this closes
                stdout=subprocess.PIPE,
                stderr=log,
                env={
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join([str(_TESTS), str(_TESTS.parent)]),
                },
            )
        ports = self._process.stdout.readline().split()  # once both listen; [] if it failed
        if len(ports) != 2:
            raise RuntimeError(f"the GCS server did not start; its log:\n{log_path.read_text()}")
        self._proxy_port, self._emulator_port = map(int, ports)

    def stop(self) -> None:
        if self._process is None:
            return
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()  # the emulator dies with it
            self._process.wait()
        self._process.stdout.close()
        self._process = None

    def __enter__(self) -> GcsServer:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # Buckets

    def make_bucket(self, hint: str = "bucket") -> str:
        """A new empty bucket, named after `hint` and unique; returns 'gs://<name>'."""
        prefix = re.sub(r"[^a-z0-9-]+", "-", hint.lower()).strip("-")[:40] or "bucket"
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        status, body = json_request(self._emulator_port, "POST", "/storage/v1/b", {"name": name})
        if status != 200:
            raise RuntimeError(f"cannot create bucket {name}: {status} {body!r}")
        return f"gs://{name}"

    # Requests

    @property
    def requests(self) -> RequestLog:
        """Every storage request since the last `reset_requests()`."""
        return self._requests_since(self._reset_at)

    def reset_requests(self) -> None:
        self._reset_at = self._total()

    @contextlib.contextmanager
    def counting(self) -> Iterator[RequestLog]:
        """`with gcs.counting() as log: ...` — after the block, `log` holds its requests.

        Requests are logged as they are answered, before the answer goes out: every call
        the block made and returned from is in it; one still in flight when the block ends
        (none, if the block made only synchronous file operations) is left out.
        """
        log, start = RequestLog(), self._total()
        try:
            yield log
        finally:
            log._requests[:] = self._requests_since(start)

    def _requests_since(self, index: int) -> RequestLog:
        answer = self._control("GET", f"requests?since={index}")
        return RequestLog([Request(**r) for r in answer["requests"]])

    def _total(self) -> int:
        """How many requests the proxy has logged since it started."""
        return self._control("GET", "requests/total")["total"]

    # Faults. Each returns its Fault. `kind` is one of traffic.KINDS; `path` is a
    # regex searched in the unescaped request target, e.g.
    # '/upload/storage/v1/b/B/o?uploadType=resumable&name=dir/ckpt-1.index'.

    def fail(
        self,
        status: int,
        *,
        kind: str | None = None,
        method: str | None = None,
        path: str | None = None,
        nth: int = 1,
        times: int | None = 1,
    ) -> Fault:
        """Answers `status` to the nth matching request (and to the `times - 1` after it)."""
        return self._add(
            FaultRule(kind=kind, method=method, path=path, nth=nth, times=times, status=status)
        )

    def unavailable(
        self,
        seconds: float,
        *,
        status: int = 503,
        kind: str | None = None,
        method: str | None = None,
        path: str | None = None,
    ) -> Fault:
        """Answers `status` to every matching request for the next `seconds`."""
        return self._add(
            FaultRule(kind=kind, method=method, path=path, seconds=seconds, status=status)
        )

    def drop_connection(
        self,
        after_bytes: int,
        *,
        kind: str | None = "upload",
        method: str | None = "PUT",
        path: str | None = None,
        nth: int = 1,
        times: int | None = 1,
    ) -> Fault:
        """Closes the connection after `after_bytes` of the nth matching request's body.

        By default TensorFlow's upload of a file's contents (the PUT of a resumable
        upload). A body shorter than `after_bytes` is read whole, then the connection
        is closed without an answer.
        """
        return self._add(
            FaultRule(
                kind=kind, method=method, path=path, nth=nth, times=times, drop_after=after_bytes
            )
        )

    def slow(
        self,
        seconds: float,
        *,
        kind: str | None = None,
        method: str | None = None,
        path: str | None = None,
        nth: int = 1,
        times: int | None = None,
    ) -> Fault:
        """Waits `seconds` before answering matching requests (every one, by default)."""
        return self._add(
            FaultRule(kind=kind, method=method, path=path, nth=nth, times=times, delay=seconds)
        )

    def clear_faults(self) -> None:
        self._control("DELETE", "rules")

    def _add(self, rule: FaultRule) -> Fault:
        fields = {f.name: getattr(rule, f.name) for f in dataclasses.fields(rule) if f.init}
        return Fault(self, self._control("POST", "rules", fields)["id"], rule)

    def _control(self, method: str, route: str, body: dict | None = None) -> dict:
        # http.client, not urllib: urllib would go through the proxy named in the environment.
        connection = http.client.HTTPConnection("127.0.0.1", self._proxy_port, timeout=10)
        try:
            data = None if body is None else json.dumps(body).encode()
            connection.request(method, CONTROL + route, body=data)
            response = connection.getresponse()
            answer = json.loads(response.read())
        finally:
            connection.close()
        if response.status != 200:
            raise RuntimeError(f"the GCS proxy refused {method} {route}: {answer}")
        return answer
