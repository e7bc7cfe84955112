"""This process's side of the TPU compiler: one child process (`server.py`) serving many compiles.

`TpuCompiler.compile(topology, hlo)` sends a program's HLO to the child and
returns what the TPU compiler made of it (`Compiled`), or raises `OutOfMemory`
(the compiler refused the program: it does not fit, with the compiler's own
figures) or `CompileError` (the compiler could not be asked, or failed: the
caller falls back to the XLA:CPU estimate). Every request has a time limit; a
child that overruns it is killed, and the next request starts a new one.

The child starts on the first request (about a second: importing jax and
loading libtpu) and serves every compile after it, of this check run and of the
next ones in the same process (`shared()`); it ends with this process, or when
its stdin closes. Answers are cached by (topology, program): a batch search and
the table ask for the same compile more than once.

No network: the child runs with TPU_SKIP_MDS_QUERY=1 (libtpu then does not ask a
GCE metadata server what TPU it is on) and Google's metadata addresses pointed
at 127.0.0.1:1, as the tests' environment has them; compiling for a topology
needs nothing but libtpu.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import hashlib
import importlib.machinery
import json
import os
import re
import select
import subprocess
import sys
import threading
import time
from typing import IO, Any

from absl import logging

from tpurun.check.sizing.tpu_compiler import server

# The distributions of the `tpu-compile` extra (setup.cfg), as they are imported.
EXTRA = ("jax", "jaxlib", "libtpu")
INSTALL = "pip install '.[tpu-compile]' in tpurun's source directory"
START_TIMEOUT_S = 120.0  # importing jax and libtpu: about a second on an idle machine
COMPILE_TIMEOUT_S = 600.0  # the steps tpurun compiles took 1-30 s on a loaded 2-core CPU
_STDERR_LINES = 40  # kept for the message of a child that died
_LONGEST = 400  # characters of a compiler's message in one line
# The child's environment: no metadata server, no GCE probing, no gRPC chatter.
_CHILD_ENV = {
    "TPU_SKIP_MDS_QUERY": "1",
    # libtpu takes /tmp/libtpu_lockfile so that one process drives a TPU; a compiler
    # drives none, and two check runs (or test workers) compile side by side.
    "ALLOW_MULTIPLE_LIBTPU_LOAD": "1",
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:1",
    "GCE_METADATA_IP": "127.0.0.1:1",
    "GRPC_VERBOSITY": "ERROR",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


class CompileError(Exception):
    """The TPU compiler could not give an answer (not installed, failed, too slow)."""


class OutOfMemory(Exception):
    """The TPU compiler refused the program: it needs more HBM than a device has."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
        found = parse_refusal(message)
        self.what: str = found[0] if found else "memory"
        self.needed_bytes: int | None = found[1] if found else None
        self.available_bytes: int | None = found[2] if found else None


@dataclasses.dataclass(frozen=True)
class Topology:
    """What one replica's step is compiled for: libtpu's topology name and its options."""

    name: str  # "v5e:1x1"
    options: tuple[tuple[str, str], ...] = ()  # (("chip_config_name", "megacore"),)

    def request(self) -> dict[str, Any]:
        return {"topology": self.name, "options": dict(self.options)}


@dataclasses.dataclass(frozen=True)
class Compiled:
    """The compiler's answer for one program: memory_analysis and cost_analysis."""

    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs written in place of arguments (updated variables)
    temporary_bytes: int
    code_bytes: int
    flops: float
    bytes_accessed: float
    parameter_layouts: tuple[str, ...]  # each entry parameter's layout: "{1,0:T(8,128)}"
    device_kind: str  # "TPU v5 lite"
    seconds: float  # how long the compile took

    @property
    def total_bytes(self) -> int:
        """What the program holds at its peak: arguments, outputs not aliased, temporaries,
        code (as JAX's `memory_analysis` users add it up)."""
        return (
            self.argument_bytes
            + self.output_bytes
            - self.alias_bytes
            + self.temporary_bytes
            + self.code_bytes
        )


@dataclasses.dataclass(frozen=True)
class Capacity:
    """A device's HBM for a program, as the compiler counts it, and what the device is."""

    bytes: int
    device_kind: str
    platform_version: str


def missing_extra() -> str | None:
    """Which distribution of the `tpu-compile` extra is not installed (None: all are).

    Found on sys.path without importing them: jax and libtpu must not load in
    TensorFlow's process (tpurun/__init__.py makes jax unimportable in it).
    """
    for name in EXTRA:
        if importlib.machinery.PathFinder.find_spec(name) is None:
            return name
    return None


class TpuCompiler:
    """The TPU compiler in a child process: capacities and compiles, cached, each time-limited."""

    def __init__(
        self,
        start_timeout: float = START_TIMEOUT_S,
        compile_timeout: float = COMPILE_TIMEOUT_S,
        launcher: tuple[str, ...] = (),
    ):
        self.start_timeout = start_timeout
        self.compile_timeout = compile_timeout
        self.launcher = launcher  # a command to run the child under (tests: strace)
        self.versions: dict[str, Any] = {}
        self._process: subprocess.Popen[bytes] | None = None
        self._answers: IO[bytes] | None = None
        self._stderr: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES)
        self._ids = 0
        self._lock = threading.Lock()
        self._compiled: dict[tuple[Topology, str], Compiled | OutOfMemory] = {}
        self._capacities: dict[Topology, Capacity] = {}

    @property
    def pid(self) -> int | None:
        """The child's process id while it runs."""
        return self._process.pid if self._process and self._process.poll() is None else None

    def version_line(self) -> str:
        """The versions, as "libtpu 0.0.52 (jax 0.10.2)", once the child has started."""
        return f"libtpu {self.versions.get('libtpu')} (jax {self.versions.get('jax')})"

    def capacity(self, topology: Topology) -> Capacity:
        if topology not in self._capacities:
            answer = self._ask({"op": "capacity", **topology.request()})
            found = parse_refusal(answer["refusal"])
            if found is None or found[2] is None:
                raise CompileError(
                    f"the TPU compiler did not state a {topology.name} device's HBM: "
                    f"{_first_line(answer['refusal'])}"
                )
            self._capacities[topology] = Capacity(
                found[2], answer["device_kind"], answer["platform_version"]
            )
        return self._capacities[topology]

    def compile(self, topology: Topology, hlo: bytes) -> Compiled:
        """The TPU compiler's memory and cost of `hlo` (a serialized HloModuleProto).

        Raises OutOfMemory when the compiler refuses it for lack of HBM, CompileError
        when there is no answer (then the caller falls back to the XLA:CPU estimate).
        """
        key = (topology, hashlib.sha256(hlo).hexdigest())
        if key not in self._compiled:
            start = time.monotonic()
            try:
                answer = self._ask({"op": "compile", **topology.request()}, hlo)
                self._compiled[key] = Compiled(
                    **answer["memory"],
                    flops=answer["flops"],
                    bytes_accessed=answer["bytes_accessed"],
                    parameter_layouts=tuple(answer["parameter_layouts"]),
                    device_kind=answer["device_kind"],
                    seconds=answer["seconds"],
                )
            except OutOfMemory as e:
                self._compiled[key] = e
            logging.debug(
                "TPU compile for %s: %s in %.1f s",
                topology.name,
                "refused" if isinstance(self._compiled[key], OutOfMemory) else "compiled",
                time.monotonic() - start,
            )
        found = self._compiled[key]
        if isinstance(found, OutOfMemory):
            raise found
        return found

    def close(self) -> None:
        """Ends the child: its stdin closes, and it is killed if it does not exit."""
        process, self._process = self._process, None
        if process is None:
            return
        try:
            if process.stdin:
                process.stdin.close()
            process.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()

    # --- The child -------------------------------------------------------------------------

    def _ask(self, request: dict[str, Any], payload: bytes = b"") -> dict[str, Any]:
        with self._lock:
            self._start()
            process = self._process
            assert process is not None and process.stdin is not None
            self._ids += 1
            request = {**request, "id": self._ids, "payload_bytes": len(payload)}
            try:
                process.stdin.write(json.dumps(request).encode() + b"\n")
                process.stdin.write(payload)
                process.stdin.flush()
            except OSError:
                raise self._died("while it was sent a program") from None
            answer = self._read(
                self.compile_timeout,
                f"compile for {request.get('topology')}",
                "--compile_timeout=SECONDS waits longer",
            )
        if answer.get("ok"):
            return answer
        if answer.get("kind") == "oom":
            raise OutOfMemory(answer["message"])
        raise CompileError(f"the TPU compiler failed: {_first_line(answer.get('message', ''))}")

    def _start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        command = [*self.launcher, sys.executable, "-u", server.__file__]
        self._stderr.clear()
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **_CHILD_ENV},
                # Its own session: a Ctrl-C in the terminal reaches tpurun, which ends it.
                start_new_session=True,
            )
        except OSError as e:
            raise CompileError(f"the TPU compiler's process did not start: {e}") from None
        assert self._process.stdout is not None and self._process.stderr is not None
        self._answers = self._process.stdout
        threading.Thread(target=self._drain, args=(self._process.stderr,), daemon=True).start()
        hello = self._read(self.start_timeout, "start")
        if not hello.get("hello"):
            self.close()
            raise CompileError(f"the TPU compiler did not start: {hello.get('message')}")
        if hello.get("tensorflow_imported"):
            self.close()
            raise CompileError("the TPU compiler's process imported TensorFlow; it must not")
        self.versions = hello

    def _read(self, timeout: float, doing: str, longer: str = "") -> dict[str, Any]:
        """The child's next answer line, within `timeout` seconds (else it is killed and
        the error says `longer`: how to allow more)."""
        assert self._answers is not None
        deadline = time.monotonic() + timeout
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self._answers], [], [], max(left, 0))
            if not ready:
                self._kill()
                raise CompileError(
                    f"the TPU compiler took longer than {timeout:g} s to {doing} (the time "
                    f"limit); it was stopped{f': {longer}' if longer else ''}"
                )
            chunk = os.read(self._answers.fileno(), 1 << 16)
            if not chunk:
                raise self._died(f"during {doing}")
            line += chunk
        return json.loads(line)

    def _drain(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._stderr.append(raw.decode("utf-8", "replace").rstrip())

    def _died(self, when: str) -> CompileError:
        process = self._process
        code = process.wait() if process else None
        self._process = None
        last = next((line for line in reversed(self._stderr) if line.strip()), "")
        detail = f": {last}" if last else ""
        return CompileError(f"the TPU compiler's process ended (exit {code}) {when}{detail}")

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()


# A size as XLA prints it (tsl's HumanReadableNumBytes): "34.71G", "15.75G", "512.00M".
_SIZE = r"([\d.]+)\s*([KMGTP]?)i?B?"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40, "P": 1 << 50}
# The compiler's refusals (https://openxla.org/xla/errors/error_1000), as libtpu 0.0.52
# words them: before compiling, when the temporaries it plans already exceed the HBM
# (the figure is the plan's, before the compiler recomputes activations to save
# memory: "Ran out of memory on HBM, the total memory required for HLO temporaries
# (34.71G) exceeds available HBM (15.75G)"), and after compiling, when the program
# still does not fit ("Ran out of memory in memory space hbm. Used 20.50G of 15.75G
# hbm. Exceeded hbm capacity by 4.75G.").
_PLANNED = re.compile(
    rf"the total memory required for ([\w\s-]+?) \({_SIZE}\) exceeds available HBM "
    rf"\({_SIZE}\)"
)
_USED = re.compile(rf"Ran out of memory in memory space hbm\. Used {_SIZE} of {_SIZE} hbm")
PROGRAM = "program"  # what a refusal after compiling counts: all the program holds


def parse_refusal(message: str) -> tuple[str, int, int] | None:
    """(what needs the memory, its bytes, the device's bytes) from a CompileTimeHbmOom:
    ("HLO temporaries", ...) before compiling, (PROGRAM, ...) after."""
    text = " ".join(message.split())
    if match := _PLANNED.search(text):
        what, needed, needed_unit, available, available_unit = match.groups()
    elif match := _USED.search(text):
        what = PROGRAM
        needed, needed_unit, available, available_unit = match.groups()
    else:
        return None
    return (
        what,
        int(float(needed) * _UNITS[needed_unit]),
        int(float(available) * _UNITS[available_unit]),
    )


def _first_line(text: str) -> str:
    """The compiler's message on one line: its first, and the first that says "error:"
    (MLIR puts the reason there: "failed to legalize operation 'mhlo.copy'")."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return "no message"
    detail = next((line for line in lines[1:] if "error:" in line), None)
    if detail is not None:
        detail = re.sub(r"^.*?error:\s*(loc\([^)]*\):\s*)?", "", detail)
        lines[0] = f"{lines[0].rstrip(';')}: {detail}"
    return lines[0] if len(lines[0]) <= _LONGEST else lines[0][: _LONGEST - 3] + "..."


_SHARED: TpuCompiler | None = None


def shared() -> TpuCompiler:
    """The process's TPU compiler, started on its first request and ended with the process."""
    global _SHARED
    if _SHARED is None:
        _SHARED = TpuCompiler()
        atexit.register(_SHARED.close)
    return _SHARED
