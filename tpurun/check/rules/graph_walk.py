"""The walk over a traced step's graph (nested functions included), op by op.

It returns raw findings: (rule, op, display name, detail) for every op that makes
a tensor shape depend on the data (`dynamic-shape`), writes a summary (`summary`),
makes float64 (`dtype`) or has no XLA kernel (`xla-unsupported`). What they mean
and how to fix them is `tpurun.check.rules.fixes`, which imports this module (never the
other way round).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import tensorflow as tf

from tpurun.check.rules.introspection import has_xla_kernel, is_stateful, nested_graphs

# Control-flow ops whose output shapes are those of their branches or loop variables.
CONTROL_FLOW_OPS = frozenset(
    {"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"}
)
# Ops whose output size depends on the values of their input (`fixes.DATA_DEPENDENT_FIXES`
# says how to avoid each).
DATA_DEPENDENT_OPS = frozenset(
    {
        "Where",
        "Unique",
        "UniqueV2",
        "UniqueWithCounts",
        "UniqueWithCountsV2",
        "ListDiff",
        "DynamicPartition",
        "DynamicStitch",
        "NonMaxSuppression",
        "NonMaxSuppressionV2",
        "NonMaxSuppressionV3",
        "NonMaxSuppressionV4",
        "NonMaxSuppressionV5",
        "Bincount",
        "DenseBincount",
        "StringSplit",
        "StringSplitV2",
        "DenseToDenseSetOperation",
        "DenseToSparseSetOperation",
    }
)
SUMMARY_OPS = frozenset(
    {
        "WriteSummary",
        "WriteScalarSummary",
        "WriteHistogramSummary",
        "WriteImageSummary",
        "WriteAudioSummary",
        "WriteGraphSummary",
        "WriteRawProtoSummary",
        "ScalarSummary",
        "HistogramSummary",
        "ImageSummary",
        "AudioSummary",
        "AudioSummaryV2",
        "TensorSummary",
        "TensorSummaryV2",
        "MergeSummary",
        "CreateSummaryFileWriter",
        "CreateSummaryDbWriter",
        "FlushSummaryWriter",
        "CloseSummaryWriter",
        "ImportEvent",
    }
)
# Ops that compute nothing on the TPU (function arguments, variable handles).
_NOT_COMPUTED = frozenset({"Placeholder", "NoOp", "VarHandleOp", "_Arg", "_Retval"})
_NO_VALUE_DTYPES = (tf.resource, tf.variant)
# Ops whose integer inputs pick elements but do not size the output.
_INDEXING_OP = re.compile(r"TensorList\w*|(Resource)?Gather(V2|Nd)?")
REPLICA_PREFIX = re.compile(r"(^|/)replica_\d+/")


class RawFinding(NamedTuple):
    rule: str  # dynamic-shape, summary, dtype, xla-unsupported
    op: tf.Operation
    display: str  # the op's name, with the names of the functions it is nested in
    detail: Any  # dynamic-shape: the op's output shape


class _TensorSet:
    """A set of graph tensors (tf.Tensor is not hashable; its ref() is)."""

    def __init__(self) -> None:
        self._refs: set[Any] = set()

    def __contains__(self, tensor: tf.Tensor) -> bool:
        return tensor.ref() in self._refs

    def add(self, tensor: tf.Tensor) -> None:
        self._refs.add(tensor.ref())

    def update(self, tensors: Any) -> None:
        self._refs.update(t.ref() for t in tensors)


class GraphWalker:
    """Walks a traced step's graph and its nested functions; finds the rules' ops."""

    def __init__(self, graph: tf.Graph):
        self.graph = graph
        # Tensors whose *shape* is data-dependent, and tensors whose *value* derives from
        # such a shape (already reported, so not a new problem); tensors whose value is
        # known at compile time (constants, static shapes) never make a shape dynamic.
        self.tainted: _TensorSet = _TensorSet()
        self.value_tainted: _TensorSet = _TensorSet()
        self.constant: _TensorSet = _TensorSet()
        self.found: list[RawFinding] = []

    def findings(self) -> list[RawFinding]:
        """Walks the whole graph; what it found, in graph order."""
        self.walk(self.graph, prefix="")
        return self.found

    def walk(self, graph: tf.Graph, prefix: str) -> None:
        for op in graph.get_operations():
            if REPLICA_PREFIX.search(op.name):
                continue  # replicas 1..n-1 trace the same ops as replica 0
            display = prefix + op.name if not op.name.startswith(prefix) else op.name
            nested = list(nested_graphs(op))
            # Inside first: a control-flow op's dynamic output may come from a cause inside.
            for sub in nested:
                self.bind_inputs(op, sub)
                self.walk(sub, prefix=_nested_prefix(op.name, prefix))
            self.classify(op, display, nested)
            for sub in nested:
                self.bind_outputs(op, sub)

    def classify(self, op: tf.Operation, display: str, nested: list[tf.Graph]) -> None:
        if op.type in SUMMARY_OPS:
            self.found.append(RawFinding("summary", op, display, None))
            return
        if op.type not in _NOT_COMPUTED and not nested and not has_xla_kernel(op.type):
            self.found.append(RawFinding("xla-unsupported", op, display, None))
        values = [t for t in op.outputs if t.dtype not in _NO_VALUE_DTYPES]
        ins = list(op.inputs)
        if (
            any(t.dtype == tf.float64 for t in values)
            and not any(t.dtype == tf.float64 for t in ins)
            and op.type not in ("Placeholder",)
        ):
            self.found.append(RawFinding("dtype", op, display, None))
        if op.type == "Placeholder":
            return  # arguments: bound from the caller (bind_inputs), or captured
        if ins and not is_stateful(op) and all(t in self.constant for t in ins):
            self.constant.update(op.outputs)
            return
        if op.type == "Const":
            self.constant.update(op.outputs)
            return
        if op.type in ("Shape", "ShapeN", "Size", "Rank"):
            if any(t in self.tainted for t in ins):
                self.value_tainted.update(op.outputs)
            else:
                self.constant.update(op.outputs)
            return
        input_tainted = any(t in self.tainted for t in ins)
        input_value_tainted = any(t in self.value_tainted for t in ins)
        if input_value_tainted:
            self.value_tainted.update(op.outputs)
        for tensor in values:
            if tensor.shape.is_fully_defined():
                continue
            if input_tainted or input_value_tainted:
                self.tainted.add(tensor)
                continue
            data_sized = not _INDEXING_OP.fullmatch(op.type) and any(
                t.dtype.is_integer and t not in self.constant and t.dtype not in _NO_VALUE_DTYPES
                for t in ins
            )
            if op.type in DATA_DEPENDENT_OPS or data_sized or op.type in CONTROL_FLOW_OPS:
                if op.type in CONTROL_FLOW_OPS and self._nested_tainted(nested):
                    self.tainted.add(tensor)  # the cause, inside, is reported there
                    continue
                self.tainted.add(tensor)
                self.found.append(RawFinding("dynamic-shape", op, display, tensor.shape))
                return  # one finding per op

    def _nested_tainted(self, nested: list[tf.Graph]) -> bool:
        return any(t in self.tainted for g in nested for t in g.outputs)

    def bind_inputs(self, op: tf.Operation, sub: tf.Graph) -> None:
        """The nested function's arguments carry the state of the op's inputs."""
        ins = list(op.inputs)
        if op.type in ("If", "StatelessIf", "Case", "StatelessCase"):
            ins = ins[1:]  # the predicate / branch index
        for arg, source in zip(sub.inputs, ins, strict=False):
            if source in self.tainted:
                self.tainted.add(arg)
            if source in self.value_tainted:
                self.value_tainted.add(arg)
            if source in self.constant and op.type not in ("While", "StatelessWhile"):
                self.constant.add(arg)

    def bind_outputs(self, op: tf.Operation, sub: tf.Graph) -> None:
        for result, source in zip(op.outputs, sub.outputs, strict=False):
            if source in self.tainted and not result.shape.is_fully_defined():
                self.tainted.add(result)
            if source in self.value_tainted:
                self.value_tainted.add(result)


def _nested_prefix(op_name: str, prefix: str) -> str:
    return prefix if op_name.startswith(prefix) else prefix + op_name.rsplit("/", 1)[0] + "/"
