"""A step as the TPU compiler takes it: TensorFlow's HLO of the step, and what each parameter is.

`step_program(step, args_specs, weights=..., optimizer_variables=...)` lowers the
per-replica step with tf2xla from TensorSpecs (nothing runs, nothing is
allocated) to an unoptimized HloModuleProto, the bytes the compiler's process
takes, and names each entry parameter (an input, a weight, an optimizer variable)
as `tpurun.check.sizing.buffers` does for the XLA:CPU estimate.

Two facts of TensorFlow's HLO shape this. Its `copy` instructions (same shape in,
same shape out: the default layouts are all alike here) are refused by the
HLO->StableHLO converter ("failed to legalize operation 'mhlo.copy'"); they
become `reshape`s to the same shape, which mean the same and convert. And the
parameters keep the order `buffers.expected_parameters` documents, checked
against the program's own shapes (`buffers.check_match`).

`layout_bytes(dims, element_type, layout)` is what a parameter takes in the
layout the compiler chose ("{0,3,2,1:T(1,128)}"): its dimensions in that order,
the minor ones padded to the first tile; summed over the parameters it equals the
compiler's own argument size (tests/test_check_tpu_compiler.py checks it).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import tensorflow as tf

from tpurun.check.rules import introspection
from tpurun.check.sizing import buffers
from tpurun.check.sizing.buffers import EstimateError, Expected
from tpurun.errors.tf_errors import user_code_line

STAGE = "hlo_serialized"

# Bytes per element of XLA's element types (PRED as a TPU stores it: a 32-bit word
# unless the layout says otherwise with E(bits)).
_ELEMENT_BYTES = {
    "PRED": 4,
    "S8": 1,
    "U8": 1,
    "S16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "S32": 4,
    "U32": 4,
    "F32": 4,
    "S64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
    "C128": 16,
}
_LAYOUT = re.compile(r"\{([\d,\s]*)(?::(.*))?\}")
_TILE = re.compile(r"T\(([\d,\s]+)\)")
_ELEMENT_BITS = re.compile(r"E\((\d+)\)")


@dataclasses.dataclass(frozen=True)
class Parameter:
    """One entry parameter: what it is, and its shape as the program declares it."""

    category: str  # buffers.WEIGHTS, OPTIMIZER, INPUT or OTHER
    name: str
    dims: tuple[int, ...]
    element_type: str  # XLA's name: F32, BF16, S32, ...
    dtype: str  # TensorFlow's name: float32, ... ("resource" for an unknown capture)


@dataclasses.dataclass(frozen=True)
class StepProgram:
    """The step's unoptimized HLO, ready for the TPU compiler, and its parameters in order."""

    hlo: bytes
    parameters: tuple[Parameter, ...]


def step_program(
    fn: Callable[..., Any],
    args_specs: Sequence[Any],
    *,
    weights: Iterable[Any],
    optimizer_variables: Iterable[Any] = (),
) -> StepProgram:
    """`fn(*args)` for `args_specs` as TensorFlow hands it to XLA, for the TPU compiler.

    The same contract as `tpurun.check.sizing.memory.estimate`: `fn` is the per-replica
    step on one device's variables, creating none; `args_specs` one nested
    structure of fully defined TensorSpecs per positional argument.
    """
    flat_specs = tf.nest.flatten(list(args_specs))
    for path, spec in zip(buffers.arg_names(args_specs), flat_specs, strict=True):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(f"{path} is {spec!r}: a TPU compile needs a fully defined TensorSpec")

    def flat_step(*tensors: tf.Tensor) -> Any:
        return fn(*tf.nest.pack_sequence_as(list(args_specs), list(tensors)))

    compiled = tf.function(flat_step, jit_compile=True)
    try:
        concrete = compiled.get_concrete_function(*flat_specs)
    except Exception as e:  # noqa: BLE001 - the user's step: any failure is the user's
        raise EstimateError(f"the step could not be traced: {user_code_line(e)}") from e
    module = _hlo_module(compiled, flat_specs)
    expected = buffers.expected_parameters(
        concrete, args_specs, flat_specs, list(weights), list(optimizer_variables)
    )
    leaves = buffers.module_parameters(module)
    buffers.check_match(expected, leaves)
    _copies_as_reshapes(module)
    return StepProgram(
        hlo=module.SerializeToString(),
        parameters=tuple(
            _parameter(entry, leaf) for entry, leaf in zip(expected, leaves, strict=True)
        ),
    )


def _parameter(entry: Expected, leaf: buffers.Leaf) -> Parameter:
    category, name, _, dtype = entry
    return Parameter(category, name, leaf.dims, leaf.element_type, dtype.name)


def _hlo_module(compiled: Any, flat_specs: list[tf.TensorSpec]) -> Any:
    module_class = introspection.hlo_module_proto_class()
    if module_class is None:
        raise EstimateError(
            f"TensorFlow {tf.__version__} does not ship XLA's HloModuleProto where tpurun "
            "looks (tensorflow.compiler.xla.service.hlo_pb2); use TensorFlow 2.20 or 2.21"
        )
    try:
        serialized = compiled.experimental_get_compiler_ir(*flat_specs)(stage=STAGE)
    except (tf.errors.OpError, ValueError) as e:
        raise EstimateError(f"the step does not compile with XLA: {user_code_line(e)}") from e
    return module_class.FromString(serialized)


def _copies_as_reshapes(module: Any) -> None:
    """TensorFlow's `copy`s as same-shape `reshape`s, which the StableHLO converter takes."""
    for computation in module.computations:
        for instruction in computation.instructions:
            if instruction.opcode == "copy":
                instruction.opcode = "reshape"


def layout_bytes(dims: Sequence[int], element_type: str, layout: str) -> int:
    """Bytes of an array of `dims` in a TPU layout as the compiler prints it.

    "{0,3,2,1:T(1,128)}": minor-to-major dimension order, then tiles. The first
    tile pads the minor dimensions (in that order) to its multiples; an array of
    lower rank than the tile counts as having leading dimensions of 1 (a scalar
    with T(128) takes 128 elements). Later tiles (T(2,1): packing within a
    tile) and memory spaces change nothing here; E(bits) sets the element size.
    """
    match = _LAYOUT.fullmatch(layout.strip())
    if match is None:
        raise ValueError(f"unexpected layout {layout!r}")
    order = [int(d) for d in match.group(1).replace(" ", "").split(",") if d]
    attributes = match.group(2) or ""
    physical = [int(dims[d]) for d in reversed(order)] if order else [int(d) for d in dims]
    tiles = _TILE.findall(attributes)
    if tiles:
        tile = [int(t) for t in tiles[0].replace(" ", "").split(",") if t]
        physical = [1] * max(0, len(tile) - len(physical)) + physical
        for i, size in enumerate(reversed(tile), start=1):
            physical[-i] = -(-physical[-i] // size) * size
    bits = _ELEMENT_BITS.search(attributes)
    if bits:
        itemsize = max(1, int(bits.group(1)) // 8)
    else:
        itemsize = _ELEMENT_BYTES.get(element_type, 4)
    return math.prod(physical) * itemsize


def plain_bytes(dims: Sequence[int], element_type: str) -> int:
    """Bytes of the array unpadded (PRED as one byte): what its values take."""
    size = 1 if element_type == "PRED" else _ELEMENT_BYTES.get(element_type, 4)
    return math.prod(int(d) for d in dims) * size
