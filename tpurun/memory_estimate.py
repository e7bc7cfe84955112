"""Per-replica memory of a compiled training step, from shapes alone: will it fit the TPU's HBM?

`estimate(step, specs, weights=..., optimizer_variables=...)` compiles `step` with
XLA for the CPU from `tf.TensorSpec`s - nothing is allocated, so a batch far
beyond this machine's memory can be sized - and reads XLA's buffer assignment:
every buffer the compiled step needs, with its size. Each entry parameter is a
weight (a model variable), optimizer state (slots, iteration counter, learning
rate) or input (the step's arguments); everything else is `other`: gradients,
activations and the outputs not written in place of a variable.

It is an estimate. The CPU compile fuses and lays out differently from the TPU
compile, so `other` can be off either way: XLA:CPU, for one, lowers a max-pool
gradient through a scatter with batch-sized index arrays that a TPU does not
need. The arrays whose shapes are known (weights, optimizer state, inputs) are
also given as a TPU stores them, padded to its tiles (`tpu_padded_bytes`).

`max_batch_that_fits(build, hbm_bytes, lo, hi)` binary-searches the largest batch
whose estimate fits, one compile per probe (seconds each for a small CNN).
"""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tpurun.errors import RunError

WEIGHTS = "weights"  # the model's variables
OPTIMIZER = "optimizer"  # the optimizer's variables: slots, iteration counter, learning rate
INPUT = "input"  # the step's arguments
OTHER = "other"  # temporaries, outputs not aliased to a variable, any other capture
CATEGORIES = (WEIGHTS, OPTIMIZER, INPUT, OTHER)

# How a TPU lays out an array in HBM (XLA's tiled layout,
# https://openxla.org/xla/tiled_layout, "Examples of tiling formats"): the two
# minor dimensions are cut into tiles of (rows x 128 lanes) and the last tile of
# each is padded. Rows by element bit width, as XLA picks them by default before
# TPU7x (JAX's TPU description, jax/_src/pallas/mosaic/tpu_info.py,
# `TpuInfo.get_sublane_tiling`): 8 for 32-bit types; 8 for 16-bit types too (two
# rows packed per 32-bit word: tile (8,128)(2,1)); 8 x 32/bits for narrower ones
# (int8: 32). Every generation of tpurun.tpu_targets (v2 to v6e) uses these; TPU7x
# tiles 16-bit types by 16 rows. The Cloud TPU performance guide
# (https://cloud.google.com/tpu/docs/performance-guide, "Padding") says the same
# for the common case: tensors are tiled into 8 x 128 chunks and padded.
TILE_ROWS: Mapping[int, int] = {64: 8, 32: 8, 16: 8, 8: 32}
LANES = 128
# "TPU small tile format": a second-minor dimension of 1-2 (3-4) is tiled by 2 (4)
# rows instead, to waste less (the same XLA page).
_SMALL_TILE_ROWS = ((2, 2), (4, 4))
# PRED (bool) takes 4 bytes on a TPU (the same page, "TPU 1 bit tile format").
_BOOL_BYTES = 4


class EstimateError(RunError):
    """The step could not be compiled or its buffers not matched to its variables."""


@dataclasses.dataclass(frozen=True)
class Array:
    """One entry parameter of the compiled step: a variable or an argument."""

    category: str  # WEIGHTS, OPTIMIZER, INPUT or OTHER
    name: str  # the variable's path, or the argument's position ("args[0]['image']")
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # as XLA:CPU allocated it: unpadded
    padded_bytes: int  # in TPU tiles (tpu_padded_bytes)


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What one replica's step needs in device memory, by category, unpadded and padded."""

    arrays: tuple[Array, ...]  # the entry parameters, in parameter order
    temporaries_bytes: int  # every other buffer of the CPU compile (part of OTHER)

    def bytes(self, category: str) -> int:
        """Unpadded bytes of one category (OTHER includes the temporaries)."""
        total = sum(a.bytes for a in self.arrays if a.category == category)
        return total + (self.temporaries_bytes if category == OTHER else 0)

    def padded_bytes(self, category: str) -> int:
        """Bytes of one category with its known arrays in TPU tiles; temporaries as compiled."""
        total = sum(a.padded_bytes for a in self.arrays if a.category == category)
        return total + (self.temporaries_bytes if category == OTHER else 0)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes(c) for c in CATEGORIES)

    @property
    def padded_total_bytes(self) -> int:
        return sum(self.padded_bytes(c) for c in CATEGORIES)

    def fits(self, hbm_bytes: int) -> bool:
        """Whether the padded total fits in `hbm_bytes` (one replica's HBM)."""
        return self.padded_total_bytes <= hbm_bytes

    def summary(self) -> str:
        """One line: each category padded (unpadded), then the totals."""
        parts = []
        for category in CATEGORIES:
            padded, plain = self.padded_bytes(category), self.bytes(category)
            detail = f" ({format_bytes(plain)} unpadded)" if padded != plain else ""
            parts.append(f"{category} {format_bytes(padded)}{detail}")
        return (
            f"{format_bytes(self.padded_total_bytes)} per replica in TPU tiles "
            f"({format_bytes(self.total_bytes)} unpadded): {', '.join(parts)}; an estimate "
            "from XLA's CPU compile of the step"
        )


def estimate(
    fn: Callable[..., Any],
    args_specs: Sequence[Any],
    *,
    weights: Iterable[Any],
    optimizer_variables: Iterable[Any] = (),
    tile_rows: Mapping[int, int] = TILE_ROWS,
) -> MemoryEstimate:
    """Compiles `fn(*args)` for `args_specs` with XLA and classifies its buffers.

    `fn` is the per-replica step (a Python function or a tf.function) as the
    Trainer runs it, on variables of one device (built outside a multi-device
    strategy, as `tpurun check` builds the model for its XLA compile). It may
    create no variables: build the optimizer first
    (`optimizer.build(model.trainable_variables)`). `args_specs` holds one nested
    structure of fully defined `tf.TensorSpec`s per positional argument.
    `weights` are the model's variables (`keras_model.variables`, non-trainable
    ones included), `optimizer_variables` the optimizer's (`optimizer.variables`);
    any other variable the step reads counts as OTHER. `tile_rows` gives the rows
    of a TPU tile by element bit width (TILE_ROWS holds for v2 to v6e).
    """
    flat_specs = tf.nest.flatten(list(args_specs))
    for path, spec in zip(_arg_names(args_specs), flat_specs, strict=True):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(
                f"{path} is {spec!r}: estimate needs a tf.TensorSpec of a fully defined shape"
            )

    def flat_step(*tensors: tf.Tensor) -> Any:
        return fn(*tf.nest.pack_sequence_as(list(args_specs), list(tensors)))

    compiled = tf.function(flat_step, jit_compile=True)
    try:
        concrete = compiled.get_concrete_function(*flat_specs)
    except Exception as e:  # noqa: BLE001 - the user's step: any failure is the user's
        raise EstimateError(f"the step could not be traced: {_one_line(e)}") from e
    hlo = _optimized_hlo(compiled, flat_specs)

    expected = _expected_parameters(
        concrete, args_specs, flat_specs, list(weights), list(optimizer_variables)
    )
    parameters = _entry_parameters(hlo)
    _check_match(expected, parameters)

    arrays = []
    sizes = _parameter_allocation_sizes(hlo)
    for (category, name, shape, dtype), leaf in zip(expected, parameters, strict=True):
        size = sizes.get((leaf.number, leaf.index), 0)
        known = dtype != tf.resource
        arrays.append(
            Array(
                category=category,
                name=name,
                shape=shape,
                dtype=dtype.name,
                bytes=size,
                padded_bytes=tpu_padded_bytes(shape, dtype, tile_rows) if known else size,
            )
        )
    allocations = hlo.buffer_assignment.buffer_allocations
    temporaries = sum(a.size for a in allocations if not a.is_entry_computation_parameter)
    return MemoryEstimate(arrays=tuple(arrays), temporaries_bytes=temporaries)


def max_batch_that_fits(
    build: Callable[[int], MemoryEstimate],
    hbm_bytes: int,
    lo: int,
    hi: int,
    *,
    multiple_of: int = 1,
) -> int | None:
    """The largest batch in [lo, hi] (a multiple of `multiple_of`) whose estimate fits.

    `build(batch)` returns the estimate of one replica's step at that batch; the
    memory must grow with the batch. Binary search: about log2((hi - lo) /
    multiple_of) compiles. None if even `lo` does not fit.
    """
    low = -(-lo // multiple_of)  # in units of multiple_of
    high = hi // multiple_of
    if low > high:
        raise ValueError(f"no multiple of {multiple_of} in [{lo}, {hi}]")

    def fits(units: int) -> bool:
        return build(units * multiple_of).fits(hbm_bytes)

    if not fits(low):
        return None
    if fits(high):
        return high * multiple_of
    while high - low > 1:  # invariant: low fits, high does not
        middle = (low + high) // 2
        if fits(middle):
            low = middle
        else:
            high = middle
    return low * multiple_of


def tpu_padded_bytes(
    shape: Sequence[int], dtype: Any, tile_rows: Mapping[int, int] = TILE_ROWS
) -> int:
    """Bytes of an array laid out in TPU tiles: the two minor dimensions padded.

    Rank >= 2: the minor dimension to a multiple of 128 lanes, the second-minor to
    the tile's rows (TILE_ROWS; 2 or 4 rows when it is that small). Rank 1: to a
    multiple of 128 elements (TPU HLO shows 128- to 1024-element tiles for
    vectors, so this is the least padding). Scalars: unpadded. XLA may choose
    another dimension order for an array, which this cannot know.
    """
    dtype = tf.as_dtype(dtype)
    itemsize = _BOOL_BYTES if dtype == tf.bool else dtype.size
    dims = [int(d) for d in shape]
    if not dims:
        return itemsize
    if len(dims) == 1:
        return _round_up(dims[0], LANES) * itemsize
    *major, second, minor = dims
    rows = tile_rows.get(8 * itemsize, 8)
    for at_most, small in _SMALL_TILE_ROWS:
        if second <= at_most:
            rows = min(rows, small)
            break
    return math.prod(major) * _round_up(second, rows) * _round_up(minor, LANES) * itemsize


def format_bytes(n: int) -> str:
    """Decimal units, as the Cloud TPU docs give HBM: 22.5 MB, 16 GB."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n} B"


# --- Internals --------------------------------------------------------------------

_STAGE = "optimized_hlo_proto_serialized"


def _optimized_hlo(compiled: Any, flat_specs: list[tf.TensorSpec]) -> Any:
    """The step compiled by XLA for the CPU: its optimized HloProto with the buffer assignment.

    From TensorSpecs, experimental_get_compiler_ir compiles without running
    anything or allocating the arguments.
    """
    hlo_proto = _hlo_proto_class()
    try:
        ir = compiled.experimental_get_compiler_ir(*flat_specs)
        serialized = ir(stage=_STAGE, platform_name="CPU")
    except (tf.errors.OpError, ValueError) as e:
        if _STAGE in str(e):
            raise EstimateError(
                f"TensorFlow {tf.__version__} has no compiler IR stage {_STAGE!r}; "
                "tpurun.memory_estimate needs TensorFlow 2.20 or 2.21"
            ) from e
        raise EstimateError(f"the step does not compile with XLA: {_one_line(e)}") from e
    return hlo_proto.FromString(serialized)


def _hlo_proto_class() -> Any:
    """XLA's HloProto message class, which TensorFlow ships privately.

    TF 2.20/2.21 generate it as tensorflow.compiler.xla.service.hlo_pb2; a
    standalone XLA as xla.service.hlo_pb2. If it moves again, the message may
    still be registered under its proto name, "xla.HloProto", by TensorFlow's
    other protos.
    """
    for module in ("tensorflow.compiler.xla.service.hlo_pb2", "xla.service.hlo_pb2"):
        try:
            return importlib.import_module(module).HloProto
        except (ImportError, AttributeError):
            continue
    try:
        from google.protobuf import descriptor_pool, message_factory

        descriptor = descriptor_pool.Default().FindMessageTypeByName("xla.HloProto")
        return message_factory.GetMessageClass(descriptor)
    except (KeyError, ImportError, AttributeError):
        raise EstimateError(
            f"TensorFlow {tf.__version__} does not ship XLA's HloProto where "
            "tpurun.memory_estimate looks (tensorflow.compiler.xla.service.hlo_pb2); "
            "use TensorFlow 2.20 or 2.21, or update _hlo_proto_class"
        ) from None


# An expected parameter: (category, name, shape, dtype).
_Expected = tuple[str, str, tuple[int, ...], tf.DType]


@dataclasses.dataclass(frozen=True)
class _Leaf:
    """One array among the entry computation's parameters (a tuple parameter has several)."""

    number: int  # the parameter number
    index: tuple[int, ...]  # where in a tuple parameter; () for an array parameter
    dims: tuple[int, ...]
    element_type: str  # XLA's name: F32, BF16, S32, PRED, ...


def _expected_parameters(
    concrete: Any,
    args_specs: Sequence[Any],
    flat_specs: list[tf.TensorSpec],
    weights: list[Any],
    optimizer_variables: list[Any],
) -> list[_Expected]:
    """What each entry parameter should be, in order: the arguments, then the captures.

    A tf.function's graph takes its explicit arguments first, then one input per
    captured tensor, in `concrete.captured_inputs` order; TensorFlow hands the
    XLA compile this list in the same order and XLA numbers its entry parameters
    by it (every input is a parameter here: TensorSpec arguments and resource
    variables are never compile-time constants). A captured variable is captured
    as its resource handle, the very object `variable.handle` returns, so
    identity maps a capture to its variable. `_check_match` then verifies every
    parameter's shape and dtype, so a change in this order fails loudly instead
    of misfiling buffers.
    """
    expected: list[_Expected] = [
        (INPUT, name, tuple(spec.shape.as_list()), spec.dtype)
        for name, spec in zip(_arg_names(args_specs), flat_specs, strict=True)
    ]
    owners: dict[int, tuple[str, Any]] = {}
    for category, variables in (
        (WEIGHTS, weights),
        (OPTIMIZER, optimizer_variables),
        (OTHER, list(concrete.variables)),
    ):
        for variable in variables:
            for handle in _handles(variable):
                owners.setdefault(id(handle), (category, variable))
    for capture in concrete.captured_inputs:
        owner = owners.get(id(capture))
        if owner is not None:
            category, variable = owner
            expected.append(
                (
                    category,
                    _variable_name(variable),
                    tuple(int(d) for d in variable.shape),
                    tf.as_dtype(variable.dtype),
                )
            )
        elif capture.dtype == tf.resource:
            expected.append((OTHER, "an unknown captured resource", (), tf.resource))
        else:
            # A tensor the step closes over (a constant): a parameter like any input.
            expected.append((OTHER, "a captured tensor", tuple(capture.shape), capture.dtype))
    return expected


def _handles(variable: Any) -> list[Any]:
    """The resource handles a variable can be captured by: its own, or its tf.Variable's.

    A Keras 3 variable wraps a tf.Variable (`.value`).
    """
    handles = (getattr(v, "handle", None) for v in (variable, getattr(variable, "value", None)))
    return [h for h in handles if h is not None]


def _variable_name(variable: Any) -> str:
    name = getattr(variable, "path", None) or getattr(variable, "name", "")
    return str(name).removesuffix(":0")


def _arg_names(args_specs: Sequence[Any]) -> list[str]:
    """The name of each leaf of the arguments, in tf.nest order: args[0]['image'], args[1]."""
    names: list[str] = []

    def walk(path: str, value: Any) -> None:
        if isinstance(value, Mapping):
            for key in sorted(value):  # tf.nest flattens dicts by sorted key
                walk(f"{path}[{key!r}]", value[key])
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{path}[{i}]", item)
        else:
            names.append(path)

    for i, arg in enumerate(args_specs):
        walk(f"args[{i}]", arg)
    leaves = len(tf.nest.flatten(list(args_specs)))
    if len(names) != leaves:  # a structure tf.nest knows and this walk does not
        return [f"argument leaf {i}" for i in range(leaves)]
    return names


def _entry_parameters(hlo: Any) -> list[_Leaf]:
    """The arrays of the entry computation's parameters, in parameter order."""
    module = hlo.hlo_module
    entry = next(c for c in module.computations if c.id == module.entry_computation_id)
    leaves: list[_Leaf] = []

    def walk(number: int, index: tuple[int, ...], shape: Any) -> None:
        if shape.tuple_shapes:
            for i, inner in enumerate(shape.tuple_shapes):
                walk(number, (*index, i), inner)
            return
        element_types = shape.DESCRIPTOR.fields_by_name["element_type"].enum_type
        name = element_types.values_by_number[shape.element_type].name
        leaves.append(_Leaf(number, index, tuple(shape.dimensions), name))

    parameters = [i for i in entry.instructions if i.opcode == "parameter"]
    for instruction in sorted(parameters, key=lambda i: i.parameter_number):
        walk(instruction.parameter_number, (), instruction.shape)
    return leaves


# TensorFlow dtypes as XLA names its element types.
_XLA_TYPES = {
    tf.float32: "F32",
    tf.bfloat16: "BF16",
    tf.float16: "F16",
    tf.float64: "F64",
    tf.int32: "S32",
    tf.int64: "S64",
    tf.int16: "S16",
    tf.int8: "S8",
    tf.uint8: "U8",
    tf.uint32: "U32",
    tf.uint64: "U64",
    tf.bool: "PRED",
    tf.complex64: "C64",
}


def _check_match(expected: list[_Expected], parameters: list[_Leaf]) -> None:
    if len(expected) != len(parameters):
        raise EstimateError(
            f"the compiled step has {len(parameters)} entry parameters for "
            f"{len(expected)} arguments and captured tensors; TensorFlow "
            f"{tf.__version__} no longer passes them as tpurun.memory_estimate expects"
        )
    for (_, name, shape, dtype), leaf in zip(expected, parameters, strict=True):
        if dtype == tf.resource:
            continue  # an unknown resource: nothing to compare
        if leaf.dims != shape or leaf.element_type != _XLA_TYPES.get(dtype, leaf.element_type):
            raise EstimateError(
                f"entry parameter {leaf.number} of the compiled step is "
                f"{leaf.element_type}{list(leaf.dims)}, but {name} is {dtype.name}{list(shape)}; "
                f"TensorFlow {tf.__version__} no longer orders parameters as "
                "tpurun.memory_estimate expects"
            )


def _parameter_allocation_sizes(hlo: Any) -> dict[tuple[int, tuple[int, ...]], int]:
    sizes = {}
    for allocation in hlo.buffer_assignment.buffer_allocations:
        if allocation.is_entry_computation_parameter:
            key = (allocation.parameter_number, tuple(allocation.parameter_shape_index))
            sizes[key] = allocation.size
    return sizes


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _one_line(error: BaseException) -> str:
    """The line that says what went wrong; for an error in a traced function ("in user
    code:", then a trace), the last "SomeError: ..." line."""
    text = str(getattr(error, "message", None) or error)
    lines = [" ".join(line.split()) for line in text.splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("in user code"):
        raised = [line for line in lines if re.match(r"\w+(Error|Exception): ", line)]
        return raised[-1] if raised else lines[0]
    return lines[0]
