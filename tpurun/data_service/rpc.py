"""What the tf.data service's servers answer, asked over gRPC with a deadline (no TensorFlow).

TensorFlow's own client retries a silent dispatcher for ever (its deadline is the
largest int64) and has no public call that lists the workers. Two calls of the
service's gRPC API (tensorflow/core/data/service/dispatcher.proto and worker.proto)
say what tpurun needs, each within a deadline:

* `DispatcherService/GetWorkers`: the dispatcher answers, and the workers it knows
  (it keeps a worker it lost: whether one still serves is asked of the worker);
* `WorkerService/GetWorkerTasks`: the worker answers.

Both requests are empty messages; of the answers only what is read is declared here
(the workers' addresses, the worker's tasks as bytes): proto3 keeps the fields it
does not declare as unknown ones.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from tpurun import errors
from tpurun.run_config.keys.service_keys import Service

GET_WORKERS = "/tensorflow.data.DispatcherService/GetWorkers"
GET_WORKER_TASKS = "/tensorflow.data.WorkerService/GetWorkerTasks"


def _answers() -> tuple[type, type]:
    """GetWorkersResponse { repeated WorkerInfo workers = 1; } (WorkerInfo: its address) and
    GetWorkerTasksResponse { repeated TaskInfo tasks = 1; } (each task as its bytes)."""
    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(
        name="tpurun_data_service_answers.proto", package="tpurun.data_service", syntax="proto3"
    )
    info = proto.message_type.add(name="WorkerInfo")
    info.field.add(name="address", number=1, type=field.TYPE_STRING, label=field.LABEL_OPTIONAL)
    workers = proto.message_type.add(name="GetWorkersResponse")
    workers.field.add(
        name="workers",
        number=1,
        type=field.TYPE_MESSAGE,
        label=field.LABEL_REPEATED,
        type_name=".tpurun.data_service.WorkerInfo",
    )
    tasks = proto.message_type.add(name="GetWorkerTasksResponse")
    tasks.field.add(name="tasks", number=1, type=field.TYPE_BYTES, label=field.LABEL_REPEATED)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return tuple(  # type: ignore[return-value]
        message_factory.GetMessageClass(pool.FindMessageTypeByName(f"tpurun.data_service.{name}"))
        for name in ("GetWorkersResponse", "GetWorkerTasksResponse")
    )


_WorkersResponse, _TasksResponse = _answers()


class Unanswered(Exception):
    """A server did not answer within the deadline (or refused: nothing listens there)."""


CALL_DEADLINE = 2.0  # seconds one question to a server may take, at most


class Servers:
    """gRPC channels to a dispatcher and its workers, kept open between calls (a channel
    reconnects by itself when a server comes back)."""

    def __init__(self, dispatcher: str, deadline: float = CALL_DEADLINE):
        """`dispatcher`: HOST:PORT; `deadline`: seconds each call may take."""
        self.dispatcher = dispatcher
        self.deadline = deadline
        self._channels: dict[str, grpc.Channel] = {}
        self._lock = threading.Lock()

    @classmethod
    def of(cls, service: Service) -> Servers:
        """The servers of a run's `service`: each call within CALL_DEADLINE and half the
        service's timeout, so that a silent server leaves time to ask again."""
        return cls(service.address, min(CALL_DEADLINE, service.timeout / 2))

    def _channel(self, address: str) -> grpc.Channel:
        with self._lock:
            if address not in self._channels:
                self._channels[address] = grpc.insecure_channel(address)
            return self._channels[address]

    def _ask(self, address: str, method: str, answer: Any) -> Any:
        call = self._channel(address).unary_unary(
            method,
            request_serializer=lambda request: request,  # the empty message: no bytes
            response_deserializer=answer.FromString,
        )
        try:
            return call(b"", timeout=self.deadline)
        except grpc.RpcError as e:
            if errors.sigterm_seen() and threading.current_thread() is threading.main_thread():
                # SIGTERM's StoppedBySigterm, raised inside gRPC's wait, comes out as a
                # cancelled call: the stop it asked for, not a silent server.
                raise errors.StoppedBySigterm() from None
            raise Unanswered(_reason(e)) from None

    def workers(self) -> list[str]:
        """The addresses of the workers the dispatcher knows, in its order; Unanswered."""
        return [
            w.address for w in self._ask(self.dispatcher, GET_WORKERS, _WorkersResponse).workers
        ]

    def worker_tasks(self, address: str) -> int:
        """The tasks the worker at HOST:PORT serves; Unanswered."""
        return len(self._ask(address, GET_WORKER_TASKS, _TasksResponse).tasks)

    def worker_answers(self, address: str) -> bool:
        """Whether the worker at HOST:PORT answers within the deadline."""
        try:
            self.worker_tasks(address)
        except Unanswered:
            return False
        return True

    def close(self) -> None:
        with self._lock:
            for channel in self._channels.values():
                channel.close()
            self._channels.clear()


def _reason(error: grpc.RpcError) -> str:
    """`connection refused`, `no answer within 2 s`: why a call failed, short."""
    code = error.code() if hasattr(error, "code") else None
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return "no answer within the deadline"
    details = (error.details() if hasattr(error, "details") else "") or ""
    if "refused" in details.lower():
        return "connection refused: nothing listens at that port"
    return f"{code.name.lower() if code else 'failed'}: {' '.join(details.split())[:200]}"
