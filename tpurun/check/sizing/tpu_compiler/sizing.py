"""A step's memory and cost from the TPU compiler: `TpuSizer.size(step, specs, ...)` -> `CompiledStep`.

`CompiledStep` answers what `tpurun.check.sizing.memory.MemoryEstimate` answers (bytes by
category, total, whether it fits a replica), so `tpurun.check.sizing.preflight` searches
batches and `fit_report` prints tables with either; here every figure is the
compiler's: the arguments in the layouts it chose (weights, optimizer state and
input: the entry parameters, `program.layout_bytes`), the outputs and how much of
them it writes in place of arguments (updated weights and slots), its
temporaries and its generated code. The total is what JAX users take from
`memory_analysis`: arguments + outputs - aliased + temporaries + code, plus the
next input batch a TPU prefetches meanwhile (as the XLA:CPU estimate counts it).
It also has the step's FLOPs and bytes accessed (`cost_analysis`), for the time
bound (`tpurun.check.bounds.step_bounds`).

A program that does not fit is refused by the compiler (CompileTimeHbmOom): a
`RefusedStep`, which holds only what the refusal says (what its HLO temporaries
need, or what the whole program used, and the HBM it has). The compiler chooses no
layouts for a program it refuses, so the arguments' sizes are not known then, and
none is made up.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from tpurun.check.sizing.buffers import CATEGORIES
from tpurun.check.sizing.memory import Array, StepBytes, format_bytes
from tpurun.check.sizing.tpu_compiler import program as program_lib
from tpurun.check.sizing.tpu_compiler.client import (
    PROGRAM,
    Capacity,
    CompileError,
    OutOfMemory,
    Topology,
    TpuCompiler,
)
from tpurun.check.targets import Generation

TPU = "tpu"
XLA_CPU = "xla:cpu"


@dataclasses.dataclass(frozen=True)
class CompiledStep(StepBytes):
    """One replica's step as the TPU compiler compiled it (or refused it for lack of HBM)."""

    arrays: tuple[Array, ...]  # the entry parameters; padded_bytes as the TPU lays them out
    output_bytes: int
    alias_bytes: int  # outputs written in place of arguments
    temporary_bytes: int
    code_bytes: int
    flops: float | None  # per step, None when refused
    bytes_accessed: float | None
    input_batches: int = 1  # the step's batch, and those prefetched meanwhile
    compiler: str = TPU
    computes: frozenset[str] = frozenset()  # (MemoryEstimate's: XLA:CPU's biases; none here)

    def other_bytes(self) -> int:
        """OTHER as compiled: the outputs not written in place, temporaries and code."""
        return self.outputs_not_aliased + self.temporary_bytes + self.code_bytes

    @property
    def outputs_not_aliased(self) -> int:
        return self.output_bytes - self.alias_bytes

    def summary(self) -> str:
        parts = [f"{c} {format_bytes(self.padded_bytes(c))}" for c in CATEGORIES]
        return (
            f"{format_bytes(self.padded_total_bytes)} per replica: {', '.join(parts)}; "
            "compiled by the TPU compiler"
        )


@dataclasses.dataclass(frozen=True)
class RefusedStep:
    """One replica's step that the TPU compiler refused for lack of HBM: what it said.

    Before compiling, libtpu refuses a program whose planned HLO temporaries exceed
    the HBM (`what` = "HLO temporaries", its plan's figure, made before it would
    recompute activations to save memory); after compiling, one that still does not
    fit (`what` = client.PROGRAM: what the program used). Nothing else is known.
    """

    what: str  # "HLO temporaries", client.PROGRAM, or "memory" (the message gave no figure)
    needed_bytes: int | None  # what the compiler said `what` needs; None: no figure
    available_bytes: int  # a device's HBM, as the compiler counts it
    message: str  # the compiler's message, on one line
    input_batches: int = 1  # (as CompiledStep's: the input is not known here)
    compiler: str = TPU
    computes: frozenset[str] = frozenset()
    flops: None = None  # no program, no cost
    bytes_accessed: None = None

    def fits(self, hbm_bytes: int) -> bool:
        return False

    @property
    def temporary_bytes(self) -> int | None:
        """The compiler's figure for the temporaries, when the refusal gives one."""
        return self.needed_bytes if self.what == "HLO temporaries" else None

    @property
    def program_bytes(self) -> int | None:
        """What the compiled program used, when the refusal came after compiling."""
        return self.needed_bytes if self.what == PROGRAM else None

    @property
    def stated(self) -> str:
        """What the refusal said: "its HLO temporaries need 34.7 GB, more than the 16.9 GB
        of HBM it has"."""
        if self.needed_bytes is None:
            return f"it gave no figure ({self.message})"
        needed, available = format_bytes(self.needed_bytes), format_bytes(self.available_bytes)
        if self.what == PROGRAM:
            return f"it used {needed} of the {available} of HBM it has"
        return f"its {self.what} need {needed}, more than the {available} of HBM it has"

    @property
    def refusal(self) -> str:
        """The refusal as a finding says it."""
        return f"the TPU compiler refused it: {self.stated}"


class TpuSizer:
    """Sizes steps with the TPU compiler of one generation (`generation.compile_topology`)."""

    def __init__(self, compiler: TpuCompiler, generation: Generation):
        self.compiler = compiler
        self.generation = generation
        self.topology = Topology(generation.compile_topology, generation.compile_options)
        self._capacity: Capacity | None = None

    @property
    def capacity(self) -> Capacity:
        """A replica's HBM as the compiler counts it (raises CompileError without an answer)."""
        if self._capacity is None:
            self._capacity = self.compiler.capacity(self.topology)
        return self._capacity

    def header(self) -> str:
        """What compiled the steps, as the table's header says it: "compiled by the TPU
        compiler, libtpu 0.0.52 (jax 0.10.2), for TPU v5 lite"."""
        device = self.capacity.device_kind  # first: it starts the compiler's process
        return f"compiled by the TPU compiler, {self.compiler.version_line()}, for {device}"

    def size(
        self,
        fn: Callable[..., Any],
        args_specs: Sequence[Any],
        *,
        weights: Iterable[Any],
        optimizer_variables: Iterable[Any] = (),
    ) -> CompiledStep | RefusedStep:
        """The step compiled for one replica, or refused (CompileError: no answer;
        EstimateError: the step does not lower to HLO)."""
        step = program_lib.step_program(
            fn, args_specs, weights=weights, optimizer_variables=optimizer_variables
        )
        try:
            compiled = self.compiler.compile(self.topology, step.hlo)
        except OutOfMemory as e:
            return RefusedStep(
                what=e.what,
                needed_bytes=e.needed_bytes,
                available_bytes=e.available_bytes or self.capacity.bytes,
                message=e.message.strip().splitlines()[0] if e.message.strip() else "",
            )
        if len(compiled.parameter_layouts) != len(step.parameters):
            raise CompileError(
                f"the TPU compiler gave {len(compiled.parameter_layouts)} parameter layouts for "
                f"{len(step.parameters)} parameters"
            )
        arrays = tuple(
            _array(p, program_lib.layout_bytes(p.dims, p.element_type, layout))
            for p, layout in zip(step.parameters, compiled.parameter_layouts, strict=True)
        )
        found = sum(a.padded_bytes for a in arrays)
        if found != compiled.argument_bytes:
            raise CompileError(
                f"the parameters' layouts add up to {found} bytes, and the TPU compiler counts "
                f"{compiled.argument_bytes}: tpurun reads this libtpu's layouts wrongly"
            )
        return CompiledStep(
            arrays=arrays,
            output_bytes=compiled.output_bytes,
            alias_bytes=compiled.alias_bytes,
            temporary_bytes=compiled.temporary_bytes,
            code_bytes=compiled.code_bytes,
            flops=compiled.flops,
            bytes_accessed=compiled.bytes_accessed,
        )


def _array(parameter: program_lib.Parameter, laid_out: int) -> Array:
    return Array(
        category=parameter.category,
        name=parameter.name,
        shape=parameter.dims,
        dtype=parameter.dtype,
        bytes=program_lib.plain_bytes(parameter.dims, parameter.element_type),
        padded_bytes=laid_out,
    )
