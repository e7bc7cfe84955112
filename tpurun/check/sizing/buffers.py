"""Reading XLA's buffer assignment of a compiled step: which buffer holds which variable.

`optimized_hlo` compiles a jit_compile tf.function for the CPU from TensorSpecs
(nothing runs, nothing is allocated) and returns its optimized `HloProto`, which
holds every buffer allocation with its size. `expected_parameters` says what
each entry parameter of that program is (an argument, a weight, an optimizer
variable) and `check_match` verifies it against the program's own parameter
shapes, so a TensorFlow that orders them differently fails loudly instead of
misfiling buffers. `tpurun.check.sizing.memory` adds them up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import tensorflow as tf

from tpurun.check.rules import introspection
from tpurun.errors import RunError
from tpurun.errors.tf_errors import user_code_line

# What each buffer of a step holds.
WEIGHTS = "weights"  # the model's variables
OPTIMIZER = "optimizer"  # the optimizer's variables: slots, iteration counter, learning rate
INPUT = "input"  # the step's arguments
OTHER = "other"  # temporaries, outputs not aliased to a variable, any other capture
CATEGORIES = (WEIGHTS, OPTIMIZER, INPUT, OTHER)


class EstimateError(RunError):
    """The step could not be compiled or its buffers not matched to its variables."""


STAGE = "optimized_hlo_proto_serialized"


def optimized_hlo(compiled: Any, flat_specs: list[tf.TensorSpec]) -> Any:
    """The step compiled by XLA for the CPU: its optimized HloProto with the buffer assignment.

    From TensorSpecs, experimental_get_compiler_ir compiles without running
    anything or allocating the arguments.
    """
    hlo_proto = introspection.hlo_proto_class()
    if hlo_proto is None:
        raise EstimateError(
            f"TensorFlow {tf.__version__} does not ship XLA's HloProto where tpurun looks "
            "(tensorflow.compiler.xla.service.hlo_pb2), so the memory of a step cannot be "
            "read; use TensorFlow 2.20 or 2.21 for --target"
        )
    try:
        ir = compiled.experimental_get_compiler_ir(*flat_specs)
        serialized = ir(stage=STAGE, platform_name="CPU")
    except (tf.errors.OpError, ValueError) as e:
        if STAGE in str(e):
            raise EstimateError(
                f"TensorFlow {tf.__version__} has no compiler IR stage {STAGE!r}; "
                "use TensorFlow 2.20 or 2.21 for --target"
            ) from e
        raise EstimateError(f"the step does not compile with XLA: {user_code_line(e)}") from e
    return hlo_proto.FromString(serialized)


def temporaries_bytes(hlo: Any) -> int:
    """Every allocation of the program that is not an entry parameter."""
    allocations = hlo.buffer_assignment.buffer_allocations
    return sum(a.size for a in allocations if not a.is_entry_computation_parameter)


def computes(hlo: Any) -> frozenset[str]:
    """What in the program makes XLA:CPU's temporaries larger than a TPU's would be.

    "scatter": XLA:CPU lowers a max-pool gradient to a scatter with four index
    arrays as large as the pooled activations (10 of the 64 largest temporaries of
    mnist's train step); "bfloat16-convolution": it computes bfloat16 convolutions
    in float32 (the optimized program has F32 convolutions between converts), so
    mixed_bfloat16 shrinks a CNN's estimate far less than it shrinks the TPU's.
    """
    opcodes, bfloat16 = set(), False
    for computation in hlo.hlo_module.computations:
        for instruction in computation.instructions:
            opcodes.add(instruction.opcode)
            bfloat16 = bfloat16 or _element_type(instruction.shape) == "BF16"
    found = {"scatter"} & opcodes
    if bfloat16 and "convolution" in opcodes:
        found.add("bfloat16-convolution")
    return frozenset(found)


def _element_type(shape: Any) -> str:
    types = shape.DESCRIPTOR.fields_by_name["element_type"].enum_type
    return types.values_by_number[shape.element_type].name


# An expected parameter: (category, name, shape, dtype).
Expected = tuple[str, str, tuple[int, ...], tf.DType]


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One array among the entry computation's parameters (a tuple parameter has several)."""

    number: int  # the parameter number
    index: tuple[int, ...]  # where in a tuple parameter; () for an array parameter
    dims: tuple[int, ...]
    element_type: str  # XLA's name: F32, BF16, S32, PRED, ...


def expected_parameters(
    concrete: Any,
    args_specs: Sequence[Any],
    flat_specs: list[tf.TensorSpec],
    weights: list[Any],
    optimizer_variables: list[Any],
) -> list[Expected]:
    """What each entry parameter should be, in order: the arguments, then the captures.

    A tf.function's graph takes its explicit arguments first, then one input per
    captured tensor, in `concrete.captured_inputs` order; TensorFlow hands the
    XLA compile this list in the same order and XLA numbers its entry parameters
    by it (every input is a parameter here: TensorSpec arguments and resource
    variables are never compile-time constants). A captured variable is captured
    as its resource handle, the very object `variable.handle` returns, so
    identity maps a capture to its variable. `check_match` then verifies every
    parameter's shape and dtype, so a change in this order fails loudly instead
    of misfiling buffers.
    """
    expected: list[Expected] = [
        (INPUT, name, tuple(spec.shape.as_list()), spec.dtype)
        for name, spec in zip(arg_names(args_specs), flat_specs, strict=True)
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


def arg_names(args_specs: Sequence[Any]) -> list[str]:
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


def entry_parameters(hlo: Any) -> list[Leaf]:
    """The arrays of the entry computation's parameters, in parameter order."""
    return module_parameters(hlo.hlo_module)


def module_parameters(module: Any) -> list[Leaf]:
    """The entry parameters' arrays of an HloModuleProto (optimized or not), in order."""
    entry = next(c for c in module.computations if c.id == module.entry_computation_id)
    leaves: list[Leaf] = []

    def walk(number: int, index: tuple[int, ...], shape: Any) -> None:
        if shape.tuple_shapes:
            for i, inner in enumerate(shape.tuple_shapes):
                walk(number, (*index, i), inner)
            return
        leaves.append(Leaf(number, index, tuple(shape.dimensions), _element_type(shape)))

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


def check_match(expected: list[Expected], parameters: list[Leaf]) -> None:
    if len(expected) != len(parameters):
        raise EstimateError(
            f"the compiled step has {len(parameters)} entry parameters for "
            f"{len(expected)} arguments and captured tensors; TensorFlow "
            f"{tf.__version__} no longer passes them as tpurun.check.sizing.buffers expects"
        )
    for (_, name, shape, dtype), leaf in zip(expected, parameters, strict=True):
        if dtype == tf.resource:
            continue  # an unknown resource: nothing to compare
        if leaf.dims != shape or leaf.element_type != _XLA_TYPES.get(dtype, leaf.element_type):
            raise EstimateError(
                f"entry parameter {leaf.number} of the compiled step is "
                f"{leaf.element_type}{list(leaf.dims)}, but {name} is {dtype.name}{list(shape)}; "
                f"TensorFlow {tf.__version__} no longer orders parameters as "
                "tpurun.check.sizing.buffers expects"
            )


def parameter_sizes(hlo: Any) -> dict[tuple[int, tuple[int, ...]], int]:
    sizes = {}
    for allocation in hlo.buffer_assignment.buffer_allocations:
        if allocation.is_entry_computation_parameter:
            key = (allocation.parameter_number, tuple(allocation.parameter_shape_index))
            sizes[key] = allocation.size
    return sizes
