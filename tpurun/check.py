"""`tpurun check`: would this model run on a TPU? Its steps are traced on the CPU; nothing trains.

A model that trains locally may still fail on a TPU, where every step is compiled
by XLA for 8 (or more) cores: shapes must be static, every op needs an XLA
kernel, int64/float64/string tensors do not cross to the TPU, and the batch must
split evenly. `run_checks` builds what `tpurun train/eval/predict` build for a
v3-8 - 8 replicas (MirroredStrategy over 8 logical CPU devices, or
`--num_shards` of them), the model's input pipelines as `tpurun.inputs` feeds
them, the Trainer/Evaluator/Predictor with their optimizer and metrics - and
then only traces each replica step:

* the input batches' `element_spec` (rules `static-batch`, `dtype`) and the
  batch split (`batch-split`, `batch-padding`);
* the replicated step's graph, walked op by op, nested functions (while bodies,
  cond branches, inner tf.functions) included (`dynamic-shape`, `summary`,
  `dtype`, `xla-unsupported`);
* the replica step compiled by XLA for the CPU (`xla-unsupported`, `xla-compile`).

No step runs: no variable changes, nothing is written (no model_dir, no
checkpoint). Every problem is a `Finding` with the fix; `report` prints them.
`tpurun check` exits 1 if any finding is an error; warnings alone exit 0.

Flags: `--num_shards=N` checks N replicas instead of 8 (e.g. 32 for a v3-32);
the batch flags and `--config.<key>` overrides apply as for train/eval/predict.
`--use_tpu`, `--tpu` and `--model_dir` are accepted but unused: check always
runs on the CPU and neither reads nor writes a model_dir.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging as std_logging
import os
import re
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import keras
import tensorflow as tf
from absl import logging

from tpurun import inputs
from tpurun import model as model_lib
from tpurun import strategy as strategy_lib
from tpurun.cluster import Cluster
from tpurun.errors import RunError
from tpurun.model import InputParams, Mode, Model
from tpurun.run_config import RunConfig

# The cores of a Cloud TPU v2-8 / v3-8: what `tpurun check` checks for by default.
DEFAULT_REPLICAS = 8
ERROR = "error"
WARNING = "warning"
# XLA tiles the second-to-last dimension of a TPU array by 8: a per-core batch
# that is not a multiple of it is padded up, and the padding computed for nothing.
TPU_BATCH_MULTIPLE = 8


@dataclasses.dataclass(frozen=True)
class Finding:
    """One problem: which rule found it, where, what it is, and how to fix it."""

    rule: str  # static-batch, dynamic-shape, xla-unsupported, dtype, batch-split, ...
    severity: str  # ERROR (the TPU run fails) or WARNING (it runs, but wastefully)
    where: str  # the step(s), and the layer, op or input concerned
    message: str  # what was found
    fix: str  # what to change

    def __str__(self) -> str:
        return f"[{self.rule}] {self.severity}: {self.message}. Fix: {self.fix}"


def run_checks(run: RunConfig) -> list[Finding]:
    """Traces the model's train, eval and predict steps as on a TPU; returns every problem.

    Must be called before TensorFlow has run an op (the CPU is split into replicas).
    """
    replicas = run.num_shards or DEFAULT_REPLICAS
    if run.use_tpu or run.tpu:
        logging.info("tpurun check traces on the CPU; --use_tpu/--tpu are not used.")
    cluster = _cpu_cluster(replicas)
    model = model_lib.create(run.config)
    keras.utils.set_random_seed(run.seed)
    with _quiet_tensorflow_info():
        checker = _Checker(run, cluster, model)
        problems = checker.batch_split()
        for mode in Mode:
            problems += checker.check_mode(mode)
    return _merge(problems)


@contextlib.contextmanager
def _quiet_tensorflow_info() -> Iterator[None]:
    """Hides TensorFlow's INFO lines while tracing (each replica's device list, and the
    traceback of every failure, which becomes a finding), unless --verbosity>=1."""
    tf_logger = std_logging.getLogger("tensorflow")
    level = tf_logger.level
    if not std_logging.getLogger().isEnabledFor(std_logging.DEBUG):
        tf_logger.setLevel(max(level, std_logging.WARNING))
    try:
        yield
    finally:
        tf_logger.setLevel(level)


def report(findings: list[Finding], out: TextIO = sys.stdout) -> int:
    """Prints the findings, errors first; returns the exit code (1 if any is an error)."""
    errors = [f for f in findings if f.severity == ERROR]
    for finding in errors + [f for f in findings if f.severity != ERROR]:
        print(finding, file=out)
    return 1 if errors else 0


def main(run: RunConfig, out: TextIO = sys.stdout) -> None:
    """`tpurun check`: prints the findings and a verdict; raises RunError (exit 1) on errors."""
    replicas = run.num_shards or DEFAULT_REPLICAS
    layout = f"{replicas} replica{'s' if replicas > 1 else ''}"
    layout += " (a v3-8)" if replicas == DEFAULT_REPLICAS else ""
    findings = run_checks(run)
    errors = sum(f.severity == ERROR for f in findings)
    warnings = len(findings) - errors
    if report(findings, out):
        raise RunError(
            f"{errors} error(s) and {warnings} warning(s) above: {run.config_name} would fail "
            f"on a TPU with {layout}; fix the errors and rerun `tpurun check`"
        )
    note = f" ({warnings} warning(s) above)" if warnings else ""
    print(
        f"tpurun check: clean: the train, eval and predict steps of {run.config_name} traced "
        f"and compiled as on a TPU with {layout}, with no errors{note}",
        file=out,
    )


# --- Internals --------------------------------------------------------------------

_STEP_NAMES = {Mode.TRAIN: "train", Mode.EVAL: "eval", Mode.PREDICT: "predict"}


@dataclasses.dataclass(frozen=True)
class _Problem:
    """A finding in one step; `_merge` joins equal problems of several steps.

    `message` and `where` contain "{steps}", filled in with the step names.
    """

    rule: str
    severity: str
    where: str
    message: str
    fix: str
    step: Mode
    op_type: str = dataclasses.field(default="", compare=False)  # for de-duplication
    op_name: str = dataclasses.field(default="", compare=False)


def _merge(problems: list[_Problem]) -> list[Finding]:
    steps: dict[tuple[str, str, str, str, str], list[Mode]] = {}
    for p in problems:
        modes = steps.setdefault((p.rule, p.severity, p.where, p.message, p.fix), [])
        if p.step not in modes:
            modes.append(p.step)
    findings = []
    for (rule, severity, where, message, fix), modes in steps.items():
        names = [_STEP_NAMES[m] for m in Mode if m in modes]
        text = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
        text += " step" if len(names) == 1 else " steps"
        findings.append(
            # replace, not format: messages quote user code and errors, braces included
            Finding(
                rule,
                severity,
                where.replace("{steps}", text),
                message.replace("{steps}", text),
                fix,
            )
        )
    return findings


def _cpu_cluster(replicas: int) -> Cluster:
    """`replicas` logical CPU devices under MirroredStrategy, as `--num_shards` gives locally."""
    try:
        # The TPU's stand-in is the CPU, even on a machine with GPUs.
        tf.config.set_visible_devices([], "GPU")
    except RuntimeError:
        pass  # TensorFlow already initialised: _local says if the CPU split is missing
    return strategy_lib.local(replicas)


class _Checker:
    def __init__(self, run: RunConfig, cluster: Cluster, model: Model):
        self.run = run
        self.cluster = cluster
        self.model = model
        self.name = type(model).__name__
        self.replicas = cluster.num_replicas
        self.single = Cluster(tf.distribute.get_strategy(), "1 CPU (XLA compile)")
        self.scopes = _LayerScopes()
        self._uids = _KerasNames()
        _populate_xla_registry()

    def global_batch(self, mode: Mode) -> int:
        return {
            Mode.TRAIN: self.run.train_batch_size,
            Mode.EVAL: self.run.eval_batch_size,
            Mode.PREDICT: self.run.predict_batch_size,
        }[mode]

    # Rule: batch-split (error) and batch-padding (warning).
    def batch_split(self) -> list[_Problem]:
        problems = []
        flags = {Mode.TRAIN: "--batch_size", Mode.EVAL: "--eval_batch_size"}
        flags[Mode.PREDICT] = "--predict_batch_size"
        for mode, flag in flags.items():
            size, n = self.global_batch(mode), self.replicas
            if size % n:
                lower = size // n * n
                example = f"{flag}={lower} or {lower + n}" if lower else f"{flag}={n}"
                problems.append(
                    _Problem(
                        "batch-split",
                        ERROR,
                        f"{flag}",
                        f"{flag}={size} does not split over the {n} replicas of the {{steps}}: "
                        "every TPU core needs the same static per-core batch",
                        f"use a multiple of {n} (e.g. {example})",
                        mode,
                    )
                )
            elif (size // n) % TPU_BATCH_MULTIPLE:
                per = size // n
                better = -(-per // TPU_BATCH_MULTIPLE) * TPU_BATCH_MULTIPLE
                problems.append(
                    _Problem(
                        "batch-padding",
                        WARNING,
                        f"{flag}",
                        f"{flag}={size} gives {per} example{'s' if per > 1 else ''} per "
                        f"replica in the {{steps}}, "
                        f"not a multiple of {TPU_BATCH_MULTIPLE}: the TPU pads each core's "
                        f"batch to {better} rows and computes the padding for nothing",
                        f"use a multiple of {n * TPU_BATCH_MULTIPLE} "
                        f"(e.g. {flag}={better * n}) if the data allows",
                        mode,
                    )
                )
        return problems

    def check_mode(self, mode: Mode) -> list[_Problem]:
        step = _STEP_NAMES[mode]
        problems: list[_Problem] = []
        per_replica = max(1, self.global_batch(mode) // self.replicas)
        try:
            spec = self.per_replica_spec(mode, per_replica)
        except Exception as e:  # noqa: BLE001 - the user's input_fn: any failure is a finding
            logging.debug("input_fn(%s) failed:", step, exc_info=True)
            return [
                _Problem(
                    "input",
                    ERROR,
                    f"{self.name}.input_fn({step})",
                    f"{self.name}.input_fn({step}) failed in the {{steps}}: {_one_line(e)}",
                    f"fix the input function (`tpurun {step}` would fail the same way; rerun "
                    "with --verbosity=1 for the traceback)",
                    mode,
                )
            ]
        problems += self.check_spec(mode, spec, per_replica)
        if not any(p.rule == "static-batch" for p in problems):
            problems += self.check_distribute(mode)
        trace_spec = _static_batch(spec, per_replica)
        problems += self.check_graph(mode, trace_spec)
        if any(p.rule == "trace" for p in problems):
            return problems  # the compile would only fail the same way
        # The XLA compile stops at the first problem, which the graph may have shown already.
        unsupported = {p.op_type for p in problems if p.rule == "xla-unsupported"}
        ops = {p.op_name for p in problems if p.op_name}
        for problem in self.check_xla(mode, trace_spec):
            if problem.op_type in unsupported or problem.op_name in ops:
                continue
            problems.append(problem)
        return problems

    def per_replica_spec(self, mode: Mode, per_replica: int) -> Any:
        """What one replica receives per step, as `tpurun.inputs.distribute` builds it.

        TRAIN: the input function's dataset as is; EVAL/PREDICT: after the launcher's
        padding, so (features, labels, mask) / (features, mask).
        """
        params = self.input_params(mode, per_replica)
        dataset = self.model.input_fn(mode, params)
        if not isinstance(dataset, tf.data.Dataset):
            raise TypeError(f"returned {type(dataset).__name__}; return a tf.data.Dataset")
        if mode is Mode.TRAIN:
            return dataset.element_spec
        return inputs.pad_batches(dataset, per_replica, self.replicas).element_spec

    def input_params(self, mode: Mode, per_replica: int) -> InputParams:
        """As `tpurun.inputs` makes them for one host feeding every replica."""
        ctx = tf.distribute.InputContext(
            num_input_pipelines=1, input_pipeline_id=0, num_replicas_in_sync=self.replicas
        )
        # The rounded-down batch when it does not split (batch-split reports that), so
        # the other checks still run.
        params = inputs.input_params(ctx, per_replica * self.replicas, self.run.seed)
        return dataclasses.replace(params, global_batch_size=self.global_batch(mode))

    # Rules: static-batch and dtype (of what crosses to the TPU).
    def check_spec(self, mode: Mode, spec: Any, per_replica: int) -> list[_Problem]:
        problems = []
        for path, leaf in _spec_leaves(mode, spec):
            where = f"{path} from {self.name}.input_fn"
            shape = leaf.shape
            if mode is Mode.TRAIN:
                static = (
                    shape.rank is not None
                    and shape.rank > 0
                    and shape.is_fully_defined()
                    and shape[0] == per_replica
                )
                if not static:
                    problems.append(
                        _Problem(
                            "static-batch",
                            ERROR,
                            where,
                            f"{where} has shape {_shape(shape)} in the {{steps}}: a TPU "
                            f"needs every batch to have one static shape, ({per_replica}, ...) "
                            f"here (the per-replica batch, then fixed dimensions)",
                            _train_batch_fix(shape, per_replica),
                            mode,
                        )
                    )
            elif shape.rank is None or not shape[1:].is_fully_defined():
                problems.append(
                    _Problem(
                        "static-batch",
                        ERROR,
                        where,
                        f"{where} has shape {_shape(shape)} in the {{steps}}: the launcher "
                        "pads the batch dimension, but the other dimensions must be static",
                        "give every example the same shape: pad or crop variable-length "
                        "features to a fixed length (dataset.padded_batch(params.batch_size, "
                        "padded_shapes=<fixed shapes>), or tf.ensure_shape / set_shape in a map)",
                        mode,
                    )
                )
            fix = _DTYPE_FIXES.get(leaf.dtype)
            if fix:
                problems.append(
                    _Problem(
                        "dtype",
                        ERROR,
                        where,
                        f"{where} is {leaf.dtype.name} in the {{steps}}: {fix[0]}",
                        fix[1],
                        mode,
                    )
                )
        return problems

    def check_distribute(self, mode: Mode) -> list[_Problem]:
        """The launcher's own distribution of the input (also its checks, e.g. a finite eval)."""
        if self.global_batch(mode) % self.replicas:
            return []  # batch-split already says so; distributing would only fail on it
        try:
            inputs.distribute(
                self.cluster.strategy,
                self.model,
                mode,
                self.global_batch(mode),
                self.run.seed,
                exact_pass=not (mode is Mode.EVAL and self.run.config.eval.steps),
            )
        except Exception as e:  # noqa: BLE001 - reported, the other checks still run
            step = _STEP_NAMES[mode]
            return [
                _Problem(
                    "input",
                    ERROR,
                    f"{self.name}.input_fn({step})",
                    f"distributing {self.name}.input_fn({step}) over {self.replicas} "
                    f"replicas failed in the {{steps}}: {_one_line(e)}",
                    f"fix what the message says; `tpurun {step}` would fail the same way",
                    mode,
                )
            ]
        return []

    def build_step(self, mode: Mode, cluster: Cluster) -> Callable[..., Any]:
        """The launcher's replica step for `mode`, built as Trainer/Evaluator/Predictor do."""
        self._uids.reset()  # layer names as in a real run, whichever build this is
        if mode is Mode.TRAIN:
            from tpurun.train import Trainer

            return Trainer(self.run, cluster, self.model).replica_step
        if mode is Mode.EVAL:
            from tpurun.evaluate import Evaluator

            return Evaluator(self.run, cluster, self.model).replica_step
        from tpurun.predict import Predictor

        return Predictor(self.run, cluster, self.model).replica_step

    # Rules: dynamic-shape, summary, dtype (float64 inside), xla-unsupported (kernel registry).
    def check_graph(self, mode: Mode, spec: Any) -> list[_Problem]:
        strategy = self.cluster.strategy
        try:
            replica_step = self.build_step(mode, self.cluster)

            @tf.function
            def replicated(*args: Any) -> Any:
                return strategy.run(replica_step, args=args)

            with contextlib.ExitStack() as stack:
                logdir = stack.enter_context(tempfile.TemporaryDirectory())
                # A default writer, so that tf.summary calls leave ops to find.
                writer = tf.summary.create_file_writer(logdir)
                stack.enter_context(writer.as_default(step=tf.constant(0, tf.int64)))
                stack.enter_context(tf.summary.record_if(True))
                stack.enter_context(self.scopes.recording())
                graph = replicated.get_concrete_function(*spec).graph
                writer.close()
        except Exception as e:  # noqa: BLE001 - the user's model: any failure is a finding
            return [_trace_failure(self.name, mode, e)]
        walker = _GraphWalker(graph, self.scopes)
        return walker.problems(mode)

    # Rules: xla-unsupported and xla-compile, from a real XLA compile of one replica's step.
    def check_xla(self, mode: Mode, spec: Any) -> list[_Problem]:
        flat = tf.nest.flatten(spec)
        if not all(s.shape.is_fully_defined() for s in flat):
            return []  # static-batch reported it; XLA cannot compile an unknown shape
        try:
            replica_step = self.build_step(mode, self.single)
        except Exception as e:  # noqa: BLE001
            return [_trace_failure(self.name, mode, e)]

        def flat_step(*tensors: tf.Tensor) -> Any:
            return replica_step(*tf.nest.pack_sequence_as(spec, list(tensors)))

        compiled = tf.function(flat_step, jit_compile=True)
        try:
            with self.scopes.recording():
                compiled.experimental_get_compiler_ir(*flat)(stage="hlo")
        except Exception as e:  # noqa: BLE001 - tf2xla raises ValueError/InvalidArgumentError
            return _xla_problems(mode, e, self.scopes)
        return []


def _trace_failure(name: str, mode: Mode, error: BaseException) -> _Problem:
    logging.debug("Building the %s step failed:", _STEP_NAMES[mode], exc_info=error)
    message = _one_line(error)
    if not re.match(r"\w+(Error|Exception|Exit|Interrupt)\b", message):
        message = f"{type(error).__name__}: {message}"
    return _Problem(
        "trace",
        ERROR,
        "{steps}",
        f"building and tracing the {{steps}} of {name} failed: {message}",
        "fix the model: `tpurun train/eval/predict` build the same steps and would fail the "
        "same way (rerun with --verbosity=1 for the traceback)",
        mode,
    )


def _spec_leaves(mode: Mode, spec: Any) -> Iterator[tuple[str, tf.TensorSpec]]:
    """(description, spec) of every features/labels tensor; the launcher's mask is skipped."""
    parts = spec if isinstance(spec, tuple) else (spec,)
    if mode is not Mode.TRAIN:
        parts = parts[:-1]  # the padding mask the launcher appends
    expected = ["features"] if mode is Mode.PREDICT else ["features", "labels"]
    names = expected if len(parts) == len(expected) else []
    for index, part in enumerate(parts):
        base = names[index] if names else f"element[{index}]"
        for path, leaf in _flatten_with_paths(part):
            if isinstance(leaf, tf.TensorSpec):
                yield base + path, leaf


def _flatten_with_paths(structure: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(structure, dict):
        for key in sorted(structure):
            for path, leaf in _flatten_with_paths(structure[key]):
                yield f"[{key!r}]" + path, leaf
    elif isinstance(structure, (tuple, list)):
        for index, item in enumerate(structure):
            for path, leaf in _flatten_with_paths(item):
                yield f"[{index}]" + path, leaf
    else:
        yield "", structure


def _static_batch(spec: Any, per_replica: int) -> Any:
    """The spec with the batch dimension set to the static per-replica batch, for tracing.

    A dynamic batch is reported by static-batch; tracing with it would only make every
    tensor of the step dynamic and hide the problems the step itself has.
    """

    def fix(leaf: Any) -> Any:
        if isinstance(leaf, tf.TensorSpec) and leaf.shape.rank:
            return tf.TensorSpec([per_replica, *leaf.shape[1:]], leaf.dtype, name=leaf.name)
        return leaf

    return tf.nest.map_structure(fix, spec)


def _train_batch_fix(shape: tf.TensorShape, per_replica: int) -> str:
    if shape.rank == 0:
        return "batch the dataset: dataset.batch(params.batch_size, drop_remainder=True)"
    if shape.rank is not None and shape[0] is not None and shape[0] != per_replica:
        return (
            f"batch by params.batch_size (the per-replica batch, {per_replica}), not by "
            "params.global_batch_size or a constant: "
            "dataset.batch(params.batch_size, drop_remainder=True)"
        )
    if shape.rank is not None and shape[0] is None:
        return (
            "batch with dataset.batch(params.batch_size, drop_remainder=True) (without "
            "drop_remainder the last batch may be smaller, so the batch dimension is unknown)"
            + ("" if shape[1:].is_fully_defined() else "; and give every example the same shape")
        )
    return (
        "give every example the same shape: pad or crop variable-length features to a fixed "
        "length (dataset.padded_batch(params.batch_size, padded_shapes=<fixed shapes>, "
        "drop_remainder=True))"
    )


_DTYPE_FIXES = {
    tf.int64: (
        "TPUs take no int64 input (the infeed rejects it, or it is emulated slowly)",
        "cast it to int32 in the input function: dataset.map(lambda f, l: (f, tf.cast(l, "
        "tf.int32))), or build the numpy arrays as int32",
    ),
    tf.float64: (
        "TPUs have no float64",
        "cast it to float32 in the input function (numpy arrays default to float64: "
        "np.asarray(x, np.float32))",
    ),
    tf.string: (
        "TPUs have no string type",
        "turn strings into int32 ids (or numbers) in the input function, e.g. with a "
        "tf.lookup.StaticHashTable in dataset.map",
    ),
}


# --- The traced graph --------------------------------------------------------------

_SUMMARY_OPS = frozenset(
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
# Ops whose output size depends on the values of their input, with the usual fix.
_DATA_DEPENDENT = {
    "Where": "keep the shape: multiply by a 0/1 mask (x * tf.cast(mask, x.dtype)), or use "
    "tf.where(cond, x, y) with three arguments",
    "Unique": "avoid tf.unique in the step: count or deduplicate with fixed-size ops (e.g. "
    "tf.math.unsorted_segment_sum with a constant num_segments), or in the input function",
    "UniqueV2": None,
    "UniqueWithCounts": None,
    "UniqueWithCountsV2": None,
    "ListDiff": "tf.sets / tf.setdiff1d return data-dependent sizes; use masks of fixed size",
    "DynamicPartition": "use masks (tf.where(cond, x, y)) instead of tf.dynamic_partition",
    "DynamicStitch": None,
    "NonMaxSuppression": "use tf.image.non_max_suppression_padded (fixed-size output)",
    "NonMaxSuppressionV2": None,
    "NonMaxSuppressionV3": None,
    "NonMaxSuppressionV4": None,
    "NonMaxSuppressionV5": None,
    "Bincount": "use tf.math.bincount with minlength = maxlength = a constant, or "
    "tf.math.unsorted_segment_sum with a constant num_segments",
    "DenseBincount": None,
    "StringSplit": "split strings in the input function",
    "StringSplitV2": None,
    "DenseToDenseSetOperation": "tf.sets ops return data-dependent sizes; use masks",
    "DenseToSparseSetOperation": None,
}
_GENERIC_DYNAMIC_FIX = (
    "compute it with a fixed size: pad or mask to a static maximum instead of selecting "
    "a data-dependent number of elements, and take sizes from constants or tensor.shape, "
    "not from tensor values"
)
_CONTROL_FLOW = frozenset({"While", "StatelessWhile", "If", "StatelessIf", "Case", "StatelessCase"})
# Ops that compute nothing on the TPU (function arguments, variable handles).
_NOT_COMPUTED = frozenset({"Placeholder", "NoOp", "VarHandleOp", "_Arg", "_Retval"})
_NO_VALUE_DTYPES = (tf.resource, tf.variant)
# Ops whose integer inputs pick elements but do not size the output.
_INDEXING_OP = re.compile(r"TensorList\w*|(Resource)?Gather(V2|Nd)?")
_REPLICA_PREFIX = re.compile(r"(^|/)replica_\d+/")


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


class _GraphWalker:
    """Walks a traced step's graph and its nested functions; finds the rules' ops."""

    def __init__(self, graph: tf.Graph, scopes: _LayerScopes):
        self.graph = graph
        self.scopes = scopes
        # Tensors whose *shape* is data-dependent, and tensors whose *value* derives from
        # such a shape (already reported, so not a new problem); tensors whose value is
        # known at compile time (constants, static shapes) never make a shape dynamic.
        self.tainted: _TensorSet = _TensorSet()
        self.value_tainted: _TensorSet = _TensorSet()
        self.constant: _TensorSet = _TensorSet()
        self.found: list[tuple[str, tf.Operation, str, Any]] = []

    def problems(self, mode: Mode) -> list[_Problem]:
        self.walk(self.graph, prefix="")
        # What a tf.summary call computes for itself (a histogram's buckets: float64,
        # dynamic shapes) is part of the summary problem, not a problem of its own.
        summary_scopes = tuple(
            display.rsplit("/", 1)[0] + "/"
            for rule, _, display, _ in self.found
            if rule == "summary" and "/" in display
        )
        problems: list[_Problem] = []
        reported: set[tuple[str, str, str | None]] = set()
        float64_ops: dict[str | None, int] = {}
        for rule, op, display, detail in self.found:
            if rule != "summary" and display.startswith(summary_scopes):
                continue
            layer = self.scopes.layer_of(display)
            if rule == "dtype":
                # One finding per layer: a float64 constant makes every op after it float64.
                float64_ops[layer] = float64_ops.get(layer, 0) + 1
                if float64_ops[layer] > 1:
                    continue
            # The gradient of an op the forward pass already has is the same problem.
            is_gradient = display.split("/", 1)[0] in ("gradient_tape", "gradients")
            if is_gradient and (rule, op.type, layer) in reported:
                continue
            reported.add((rule, op.type, layer))
            problem = self.problem(mode, rule, op, display, layer, detail)
            problems.append(dataclasses.replace(problem, op_name=display))
        return problems

    @staticmethod
    def problem(
        mode: Mode, rule: str, op: tf.Operation, display: str, layer: str | None, detail: Any
    ) -> _Problem:
        where = "{steps}: " + (f"layer {layer}, " if layer else "") + f"op {display}"
        about = f"op '{display}' ({op.type}" + (f", layer {layer}" if layer else "") + ")"
        at = _created_at(op)
        created = f" (created at {at})" if at else ""
        if rule == "dynamic-shape":
            return _Problem(
                rule,
                ERROR,
                where,
                f"{about} has output shape {_shape(detail)} in the {{steps}}{created}: "
                "tensors inside a TPU step need static shapes",
                _dynamic_fix(op, display),
                mode,
            )
        if rule == "summary":
            return _Problem(
                rule,
                ERROR,
                where,
                f"{about} writes a summary inside the replicated {{steps}}{created}: "
                "tf.summary cannot run inside a TPU step",
                "remove the tf.summary call from the model's layers, loss and predictions; "
                "report the value as an eval metric (Model.metrics) instead",
                mode,
            )
        if rule == "dtype":
            return _Problem(
                rule,
                ERROR,
                where,
                f"{about} makes float64 tensors inside the {{steps}}{created}: "
                "TPUs have no float64",
                "use float32: tf.constant(x, tf.float32), np.float32 arrays, "
                "dtype='float32' for layers and variables, no tf.cast(x, tf.float64)",
                mode,
            )
        return _unsupported_problem(mode, about, created, where, op.type)

    def walk(self, graph: tf.Graph, prefix: str) -> None:
        for op in graph.get_operations():
            if _REPLICA_PREFIX.search(op.name):
                continue  # replicas 1..n-1 trace the same ops as replica 0
            display = prefix + op.name if not op.name.startswith(prefix) else op.name
            nested = list(_nested_graphs(op))
            # Inside first: a control-flow op's dynamic output may come from a cause inside.
            for sub in nested:
                self.bind_inputs(op, sub)
                self.walk(sub, prefix=_nested_prefix(op.name, prefix))
            self.classify(op, display, nested)
            for sub in nested:
                self.bind_outputs(op, sub)

    def classify(self, op: tf.Operation, display: str, nested: list[tf.Graph]) -> None:
        if op.type in _SUMMARY_OPS:
            self.found.append(("summary", op, display, None))
            return
        if op.type not in _NOT_COMPUTED and not nested and not _has_xla_kernel(op.type):
            self.found.append(("xla-unsupported", op, display, None))
        values = [t for t in op.outputs if t.dtype not in _NO_VALUE_DTYPES]
        ins = list(op.inputs)
        if (
            any(t.dtype == tf.float64 for t in values)
            and not any(t.dtype == tf.float64 for t in ins)
            and op.type not in ("Placeholder",)
        ):
            self.found.append(("dtype", op, display, None))
        if op.type == "Placeholder":
            return  # arguments: bound from the caller (bind_inputs), or captured
        if ins and not op._is_stateful and all(t in self.constant for t in ins):
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
            if op.type in _DATA_DEPENDENT or data_sized or op.type in _CONTROL_FLOW:
                if op.type in _CONTROL_FLOW and self._nested_tainted(nested):
                    self.tainted.add(tensor)  # the cause, inside, is reported there
                    continue
                self.tainted.add(tensor)
                self.found.append(("dynamic-shape", op, display, tensor.shape))
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


def _nested_graphs(op: tf.Operation) -> Iterator[tf.Graph]:
    """The FuncGraphs an op calls: while cond/body, cond branches, inner tf.functions."""
    seen = set()
    for attr in op.node_def.attr.values():
        names = [attr.func.name] if attr.HasField("func") else []
        if attr.HasField("list"):
            names += [f.name for f in attr.list.func]
        for name in names:
            if not name or name in seen:
                continue
            seen.add(name)
            graph = _function_graph(op.graph, name)
            if graph is not None:
                yield graph


def _function_graph(graph: tf.Graph, name: str) -> tf.Graph | None:
    while graph is not None:
        get = getattr(graph, "_get_function", None)
        function = get(name) if get else None
        if function is not None:
            return getattr(function, "graph", None)
        graph = getattr(graph, "outer_graph", None)
    return None


def _nested_prefix(op_name: str, prefix: str) -> str:
    return prefix if op_name.startswith(prefix) else prefix + op_name.rsplit("/", 1)[0] + "/"


def _dynamic_fix(op: tf.Operation, display: str) -> str:
    if "boolean_mask" in display:
        return (
            "replace tf.boolean_mask by multiplying with a 0/1 mask "
            "(x * tf.cast(mask, x.dtype)), keeping the shape"
        )
    if op.type in _DATA_DEPENDENT:
        fix = _DATA_DEPENDENT[op.type]
        if fix is None:  # a variant of an op above: the same fix
            base = re.sub(r"(V\d+|WithCounts(V\d+)?)$", "", op.type)
            fix = _DATA_DEPENDENT.get(base) or _DATA_DEPENDENT.get(base + "Split")
        return fix or _GENERIC_DYNAMIC_FIX
    if op.type in ("While", "StatelessWhile"):
        return (
            "keep every tf.while_loop variable the same static shape (no None in "
            "shape_invariants): preallocate the full size and write into it"
        )
    if op.type in _CONTROL_FLOW:
        return "make both branches of tf.cond return tensors of the same static shape"
    return _GENERIC_DYNAMIC_FIX


def _unsupported_problem(
    mode: Mode, about: str, created: str, where: str, op_type: str
) -> _Problem:
    if op_type in ("EagerPyFunc", "PyFunc", "PyFuncStateless"):
        fix = (
            "tf.py_function / tf.numpy_function run Python, which a TPU cannot: write it "
            "with TensorFlow ops, or move it into the input function (dataset.map)"
        )
    elif op_type in ("PrintV2", "Print", "StringFormat"):
        fix = "remove tf.print from the model (print in the input function, or evaluate a metric)"
    elif op_type.startswith(("String", "AsString", "Regex", "Substr", "Unicode", "Decode")):
        fix = "do string processing in the input function (dataset.map), outside the step"
    else:
        fix = (
            f"replace the op that makes {op_type} by ops XLA supports, or move it into the "
            "input function"
        )
    return _Problem(
        "xla-unsupported",
        ERROR,
        where,
        f"{about} has no XLA kernel, so the {{steps}} cannot be compiled for a TPU{created}",
        fix,
        mode,
        op_type=op_type,
    )


_UNSUPPORTED = re.compile(
    r"No registered '([\w.>-]+)' OpKernel for (\w+) devices compatible with node "
    r"\{\{node ([^}]+)\}\}"
)


def _xla_problems(mode: Mode, error: BaseException, scopes: _LayerScopes) -> list[_Problem]:
    """Findings from a failed XLA compile: unsupported ops, else the compiler's message."""
    text = str(error)
    created = _created_at_from_text(text)
    at = f" (created at {created})" if created else ""
    problems = []
    for op_type, _device, node in dict.fromkeys(_UNSUPPORTED.findall(text)):
        if op_type in _SUMMARY_OPS:
            continue
        layer = scopes.layer_of(node)
        about = f"op '{node}' ({op_type}" + (f", layer {layer}" if layer else "") + ")"
        where = "{steps}: " + (f"layer {layer}, " if layer else "") + f"op {node}"
        problem = _unsupported_problem(mode, about, at, where, op_type)
        problems.append(dataclasses.replace(problem, op_name=node))
    if problems:
        return problems
    message = text.replace("Failed getting HLO text:", "").strip().strip("'\"")
    first = " ".join(message.splitlines()[0].split()) if message else type(error).__name__
    node_match = re.search(r"node `([^`]+)`|\{\{node ([^}]+)\}\}", first)
    node = (node_match.group(1) or node_match.group(2)) if node_match else ""
    layer = scopes.layer_of(node) if node else None
    where = "{steps}" + (f": layer {layer}" if layer else "") + (f", op {node}" if node else "")
    return [
        _Problem(
            "xla-compile",
            ERROR,
            where,
            f"XLA cannot compile the {{steps}}: {first.rstrip('.')}"
            + (f" (layer {layer})" if layer else "")
            + at,
            "make the step XLA-compilable: sizes, axes and shapes must be constants or "
            "come from tensor.shape, not from tensor values",
            mode,
            op_name=node,
        )
    ]


# --- Where an op comes from ------------------------------------------------------

_TPURUN_DIR = os.path.dirname(os.path.abspath(__file__))
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _is_user_file(filename: str) -> bool:
    path = filename if filename.startswith(os.sep) else os.sep + filename
    if any(marker in path for marker in _LIBRARY_MARKERS) or path.startswith(os.sep + "<"):
        return False
    if os.path.dirname(path) == _TPURUN_DIR or "/lib/python3" in path:
        return False
    return True


def _created_at(op: tf.Operation) -> str | None:
    """file:line of the innermost frame of the model's own code that created `op`."""
    try:
        frames = list(op.traceback)
    except Exception:  # noqa: BLE001 - tracebacks are a nicety
        return None
    for frame in reversed(frames):
        if _is_user_file(frame.filename):
            return f"{_relative(frame.filename)}:{frame.lineno}"
    return None


def _created_at_from_text(text: str) -> str | None:
    """The innermost user frame of the "The op is created at:" trace in an XLA error."""
    if "The op is created at" not in text:
        return None
    frames = re.findall(r'File "([^"]+)", line (\d+)', text.split("The op is created at")[1])
    for filename, line in reversed(frames):
        if _is_user_file(filename):
            path = filename if filename.startswith(os.sep) else os.sep + filename
            return f"{_relative(path)}:{line}"
    return None


def _relative(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return relative if not relative.startswith("..") else path


# --- Layer names and kernels ------------------------------------------------------


class _LayerScopes:
    """Maps the TF name scopes Keras opens while tracing to the layers that opened them.

    TF makes scope names unique (a layer `dense` may trace as `dense_1`), so the
    layer of an op cannot be read off its name reliably; this records it instead.
    """

    def __init__(self) -> None:
        self.layers: dict[str, str] = {}
        self._lock = threading.Lock()
        self._depth = 0
        self._original: Any = None

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        scope_class = _keras_tf_name_scope()
        if scope_class is None:
            yield
            return
        with self._lock:
            self._depth += 1
            if self._depth == 1:
                self.layers.clear()  # one traced graph at a time
                self._original = scope_class.__enter__
                original, layers = self._original, self.layers

                def enter(scope: Any) -> Any:
                    result = original(scope)
                    caller = getattr(scope, "caller", None)
                    if getattr(scope, "_pop_on_exit", False) and isinstance(
                        caller, keras.layers.Layer
                    ):
                        current = tf.get_current_name_scope()
                        if current:
                            layers[current] = caller.name
                    return result

                scope_class.__enter__ = enter
        try:
            yield
        finally:
            with self._lock:
                self._depth -= 1
                if self._depth == 0:
                    scope_class.__enter__ = self._original

    def layer_of(self, op_name: str) -> str | None:
        """The innermost Keras layer whose scope contains `op_name`, if any."""
        name = _REPLICA_PREFIX.sub(r"\1", op_name)
        parts = name.split("/")
        candidates = [parts]
        if parts[0] in ("gradient_tape", "gradients"):
            candidates.append(parts[1:])
        for parts in candidates:
            for end in range(len(parts) - 1, 0, -1):
                layer = self.layers.get("/".join(parts[:end]))
                if layer is not None:
                    return layer
        return None


def _keras_tf_name_scope() -> Any:
    try:
        from keras.src.backend.tensorflow import core
    except ImportError:
        return None
    scope = getattr(core, "name_scope", None)
    return scope if isinstance(scope, type) and hasattr(scope, "__enter__") else None


class _KerasNames:
    """Resets Keras's automatic layer-name counters before each build.

    `check` builds the model six times (train, eval and predict, on the replicas and
    for the XLA compile); with the counters reset, each build names its layers as a
    real run does (dense, dense_1, ...), so findings name the layers the user knows.
    Keras keeps the counters in private state; without it, only names in messages change.
    """

    _KEY = "object_name_uids"  # keras.src.utils.naming

    def __init__(self) -> None:
        try:
            from keras.src.backend.common import global_state
        except ImportError:
            global_state = None
        self._state = global_state
        uids = global_state.get_global_attribute(self._KEY) if global_state else None
        self._initial = dict(uids) if isinstance(uids, dict) else {}

    def reset(self) -> None:
        if self._state is not None:
            self._state.set_global_attribute(self._KEY, collections.defaultdict(int, self._initial))


_XLA_DEVICE = "XLA_CPU_JIT"
_kernel_cache: dict[str, bool] = {}


def _populate_xla_registry() -> None:
    """XLA registers its kernels on first use; compile a trivial function so it has."""
    try:
        tf.function(
            lambda: tf.constant(1.0) + 1.0, jit_compile=True
        ).experimental_get_compiler_ir()(stage="hlo")
    except Exception as e:  # noqa: BLE001 - then only the real compiles find unsupported ops
        logging.warning("Could not initialise XLA: %s", _one_line(e))


def _has_xla_kernel(op_type: str) -> bool:
    if op_type not in _kernel_cache:
        try:
            from tensorflow.python.framework import kernels

            registered = kernels.get_registered_kernels_for_op(op_type).kernel
            _kernel_cache[op_type] = any(k.device_type == _XLA_DEVICE for k in registered)
        except Exception:  # noqa: BLE001 - unknown: let the XLA compile decide
            _kernel_cache[op_type] = True
    return _kernel_cache[op_type]


def _shape(shape: tf.TensorShape | None) -> str:
    if shape is None or shape.rank is None:
        return "<unknown rank>"
    dims = tuple(shape.as_list())
    return str(dims) if len(dims) != 1 else f"({dims[0]},)"


def _one_line(error: BaseException) -> str:
    """The informative line of an error message (autograph's "in user code:" is not)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(getattr(error, "message", None) or error))
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("in user code"):
        raised = [i for i, line in enumerate(lines) if re.match(r"\w+(Error|Exception): ", line)]
        if raised:
            lines = lines[raised[-1] :]
            if "Exception encountered when calling" in lines[0] and len(lines) > 1:
                return f"{lines[0]} {lines[1]}"
    return lines[0]
