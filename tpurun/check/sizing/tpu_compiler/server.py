"""The TPU compiler's process: compiles XLA programs for a TPU with libtpu, on a machine without one.

`tpurun.check.sizing.tpu_compiler.client` starts this file as a script
(`python .../server.py`, not `-m`: importing the `tpurun.check` package would import
TensorFlow, and TensorFlow and libtpu must not share a process). It imports the
standard library and, once running, jax/jaxlib/libtpu; nothing else, so this
module can also be imported by the client for its protocol without loading jax.

The compiler is libtpu's compile-only client (what MaxText's `train_compile.py`
and AxLearn's AOT compilation use): `jax.experimental.topologies.get_topology_desc`
describes a slice that does not exist here, and its devices compile for it.
`TPU_SKIP_MDS_QUERY=1` keeps libtpu from asking a metadata server what TPU it
runs on (the client also sets it).

Protocol, one request at a time: the parent writes a JSON line, then as many
bytes of payload as the line's "payload_bytes" says; this process answers with
one JSON line on its original stdout (everything else it or libtpu prints goes
to stderr). The first line it writes, unasked, is the hello: the versions, and
whether TensorFlow got imported (it must not). Requests:

* {"op": "capacity", "topology": ..., "options": {...}}: the HBM a device of
  that topology has for a program, as the compiler counts it (it refuses a
  program that needs more: `CompileTimeHbmOom`, with its capacity; a program
  needing a TiB draws that answer in well under a second).
* {"op": "compile", "topology": ..., "options": {...}, "payload_bytes": n} with a
  serialized HloModuleProto as payload: its memory (`memory_analysis`) and cost
  (`cost_analysis`), and each parameter's layout.

Answers: {"id", "ok": true, ...} or {"id", "ok": false, "kind": "oom" | "error",
"message"}. The process ends when its stdin closes.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import time
from typing import Any, BinaryIO, TextIO

PROTOCOL = 1
# A program far larger than any TPU's HBM: its refusal states the device's capacity.
_HUGE_ELEMENTS = 1 << 38  # float32: 1 TiB


def main() -> None:
    answers = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)  # stray prints (libtpu's too) must not corrupt the answers
    sys.stdout = sys.stderr
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    try:
        compiler = Compiler()
    except Exception as e:  # noqa: BLE001 - told to the parent, which falls back
        _send(answers, {"hello": False, "message": _one_line(e)})
        return
    _send(answers, compiler.hello())
    serve(compiler, sys.stdin.buffer, answers)


def serve(compiler: Compiler, requests: BinaryIO, answers: TextIO) -> None:
    while True:
        line = requests.readline()
        if not line:
            return  # the parent closed the pipe (or died): nothing more to do
        request = json.loads(line)
        payload = _read_exactly(requests, int(request.get("payload_bytes", 0)))
        start = time.perf_counter()
        try:
            answer = compiler.handle(request, payload)
        except Exception as e:  # noqa: BLE001 - every failure is an answer
            answer = _failure(e)
        answer["id"] = request.get("id")
        answer["seconds"] = round(time.perf_counter() - start, 3)
        _send(answers, answer)


class Compiler:
    """libtpu's compile-only client, one topology description per (topology, options)."""

    def __init__(self) -> None:
        import jax  # noqa: F401 - the import errors are the extra's, reported as such
        from jax.experimental import topologies

        self._topologies = topologies
        self._devices: dict[str, Any] = {}
        self._capacities: dict[str, int] = {}

    def hello(self) -> dict[str, Any]:
        import jax
        import jaxlib

        return {
            "hello": True,
            "protocol": PROTOCOL,
            "jax": jax.__version__,
            "jaxlib": jaxlib.__version__,
            "libtpu": _version("libtpu"),
            "tensorflow_imported": "tensorflow" in sys.modules,
        }

    def handle(self, request: dict[str, Any], payload: bytes) -> dict[str, Any]:
        op = request.get("op")
        if op == "capacity":
            return self.capacity(request["topology"], request.get("options", {}))
        if op == "compile":
            return self.compile(request["topology"], request.get("options", {}), payload)
        raise ValueError(f"unknown request {op!r}")

    def device(self, topology: str, options: dict[str, Any]) -> Any:
        key = json.dumps([topology, options], sort_keys=True)
        if key not in self._devices:
            description = self._topologies.get_topology_desc(
                platform="tpu", topology_name=topology, **options
            )
            self._devices[key] = description.devices[0]
        return self._devices[key]

    def capacity(self, topology: str, options: dict[str, Any]) -> dict[str, Any]:
        import jax
        import jax.numpy as jnp
        from jax.sharding import SingleDeviceSharding

        device = self.device(topology, options)
        huge = jax.ShapeDtypeStruct(
            (_HUGE_ELEMENTS,), jnp.float32, sharding=SingleDeviceSharding(device)
        )
        try:
            jax.jit(lambda x: x * 2).trace(huge).lower().compile()
        except Exception as e:  # noqa: BLE001 - the refusal is the answer
            return {
                "ok": True,
                "refusal": str(e),
                "device_kind": device.device_kind,
                "platform_version": device.client.platform_version,
            }
        return {"ok": False, "kind": "error", "message": "a 1 TiB program compiled"}

    def compile(self, topology: str, options: dict[str, Any], hlo: bytes) -> dict[str, Any]:
        import numpy as np
        from jax._src.interpreters import mlir as jax_mlir  # its dialects: a private helper
        from jax.extend import mlir
        from jax.extend.mlir import ir
        from jaxlib import xla_client

        device = self.device(topology, options)
        stablehlo = mlir.hlo_to_stablehlo(hlo)
        with jax_mlir.make_ir_context():
            module = ir.Module.parse(stablehlo)
        compile_options = xla_client.CompileOptions()
        compile_options.num_replicas = 1
        compile_options.num_partitions = 1
        compile_options.device_assignment = xla_client.DeviceAssignment.create(
            np.array([[device.id]])
        )
        executable = device.client.compile(
            module,
            executable_devices=xla_client.DeviceList((device,)),
            compile_options=compile_options,
        )
        stats = executable.get_compiled_memory_stats()
        cost = executable.cost_analysis() or {}
        if isinstance(cost, list):  # older jaxlibs: one dict per program
            cost = cost[0] if cost else {}
        return {
            "ok": True,
            "memory": {
                "argument_bytes": stats.argument_size_in_bytes,
                "output_bytes": stats.output_size_in_bytes,
                "alias_bytes": stats.alias_size_in_bytes,
                "temporary_bytes": stats.temp_size_in_bytes,
                "code_bytes": stats.generated_code_size_in_bytes,
            },
            "flops": float(cost.get("flops", 0.0)),
            "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
            "parameter_layouts": [str(layout) for layout in executable.get_parameter_layouts()],
            "device_kind": device.device_kind,
            "platform_version": device.client.platform_version,
        }


def _failure(error: Exception) -> dict[str, Any]:
    text = str(error).strip() or type(error).__name__
    out_of_memory = "RESOURCE_EXHAUSTED" in text and "HbmOom" in text
    return {"ok": False, "kind": "oom" if out_of_memory else "error", "message": text}


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size) if size else b""
    if len(data) != size:
        raise EOFError(f"expected {size} bytes of payload, got {len(data)}")
    return data


def _send(answers: TextIO, message: dict[str, Any]) -> None:
    answers.write(json.dumps(message) + "\n")
    answers.flush()


if __name__ == "__main__":
    main()
