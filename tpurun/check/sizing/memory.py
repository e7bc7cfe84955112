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

The largest batch whose estimate fits is searched by `tpurun.check.sizing.batch_search`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import tensorflow as tf

from tpurun.check.rules.step_builds import jit_flat
from tpurun.check.sizing import buffers
from tpurun.check.sizing.buffers import (
    CATEGORIES,
    INPUT,
    OPTIMIZER,
    OTHER,
    WEIGHTS,
    EstimateError,
)
from tpurun.errors.tf_errors import user_code_line

__all__ = [
    "CATEGORIES",
    "INPUT",
    "OPTIMIZER",
    "OTHER",
    "WEIGHTS",
    "Array",
    "EstimateError",
    "MemoryEstimate",
    "estimate",
    "format_bytes",
    "tpu_padded_bytes",
]

# How a TPU lays out an array in HBM (XLA's tiled layout,
# https://openxla.org/xla/tiled_layout, "Examples of tiling formats"): the two
# minor dimensions are cut into tiles of (rows x 128 lanes) and the last tile of
# each is padded. Rows by element bit width, as XLA picks them by default before
# TPU7x (JAX's TPU description, jax/_src/pallas/mosaic/tpu_info.py,
# `TpuInfo.get_sublane_tiling`): 8 for 32-bit types; 8 for 16-bit types too (two
# rows packed per 32-bit word: tile (8,128)(2,1)); 8 x 32/bits for narrower ones
# (int8: 32). Every generation of tpurun.check.targets (v2 to v6e) uses these; TPU7x
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


@dataclasses.dataclass(frozen=True)
class Array:
    """One entry parameter of the compiled step: a variable or an argument."""

    category: str  # WEIGHTS, OPTIMIZER, INPUT or OTHER
    name: str  # the variable's path, or the argument's position ("args[0]['image']")
    shape: tuple[int, ...]
    dtype: str
    bytes: int  # as XLA:CPU allocated it: unpadded
    padded_bytes: int  # in TPU tiles (tpu_padded_bytes)


class StepBytes:
    """One replica's step memory by category, unpadded and padded, and its totals: what
    the CPU compile's estimate (`MemoryEstimate`) and the TPU compiler's (`CompiledStep`)
    share. A subclass holds `arrays` (the entry parameters) and `input_batches` (the
    step's batch and those prefetched meanwhile: INPUT counts each), and says in
    `other_bytes` what OTHER holds beyond its arrays."""

    arrays: tuple[Array, ...]
    input_batches: int

    def other_bytes(self) -> int:
        """What OTHER holds beyond the arrays of that category (temporaries, code...)."""
        raise NotImplementedError

    def bytes(self, category: str) -> int:
        """Unpadded bytes of one category (OTHER with `other_bytes`)."""
        return self._sum(category, padded=False)

    def padded_bytes(self, category: str) -> int:
        """Bytes of one category with its arrays as the TPU lays them out (OTHER with
        `other_bytes`)."""
        return self._sum(category, padded=True)

    def _sum(self, category: str, padded: bool) -> int:
        total = sum(
            a.padded_bytes if padded else a.bytes for a in self.arrays if a.category == category
        )
        if category == INPUT:
            total *= self.input_batches
        return total + (self.other_bytes() if category == OTHER else 0)

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes(c) for c in CATEGORIES)

    @property
    def padded_total_bytes(self) -> int:
        """The total for one replica, with the prefetched batches."""
        return sum(self.padded_bytes(c) for c in CATEGORIES)

    @property
    def padding_bytes(self) -> int:
        """What the TPU's tiles add to the arrays of known shape."""
        return self.padded_total_bytes - self.total_bytes

    def fits(self, hbm_bytes: int) -> bool:
        """Whether the padded total fits in `hbm_bytes` (one replica's HBM)."""
        return self.padded_total_bytes <= hbm_bytes


@dataclasses.dataclass(frozen=True)
class MemoryEstimate(StepBytes):
    """What one replica's step needs in device memory, by category, unpadded and padded:
    an estimate from XLA's CPU compile (its temporaries as compiled, in OTHER)."""

    arrays: tuple[Array, ...]  # the entry parameters, in parameter order
    temporaries_bytes: int  # every other buffer of the CPU compile (part of OTHER)
    # Batches of input in device memory at once: the step's own, and those an input
    # pipeline prefetches to the device meanwhile (INPUT counts each).
    input_batches: int = 1
    # What the program computes that XLA:CPU handles unlike a TPU ("convolution",
    # "bfloat16"; `buffers.computes`): OTHER is then less like a TPU's.
    computes: frozenset[str] = frozenset()

    def other_bytes(self) -> int:
        return self.temporaries_bytes

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
    compiled: Any = None,
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
    any other variable the step reads counts as OTHER. Arrays are padded to the
    TPU tiles of TILE_ROWS (v2 to v6e). `compiled`: `jit_flat(fn, args_specs)` when the
    caller has it already (traced once, for its XLA rules: not traced again here).
    """
    flat_specs = tf.nest.flatten(list(args_specs))
    for path, spec in zip(buffers.arg_names(args_specs), flat_specs, strict=True):
        if not isinstance(spec, tf.TensorSpec) or not spec.shape.is_fully_defined():
            raise ValueError(
                f"{path} is {spec!r}: estimate needs a tf.TensorSpec of a fully defined shape"
            )

    compiled = compiled or jit_flat(fn, args_specs)
    try:
        concrete = compiled.get_concrete_function(*flat_specs)
    except Exception as e:  # noqa: BLE001 - the user's step: any failure is the user's
        raise EstimateError(f"the step could not be traced: {user_code_line(e)}") from e
    hlo = buffers.optimized_hlo(compiled, flat_specs)

    expected = buffers.expected_parameters(
        concrete, args_specs, flat_specs, list(weights), list(optimizer_variables)
    )
    parameters = buffers.entry_parameters(hlo)
    buffers.check_match(expected, parameters)

    arrays = []
    sizes = buffers.parameter_sizes(hlo)
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
                padded_bytes=tpu_padded_bytes(shape, dtype) if known else size,
            )
        )
    return MemoryEstimate(
        arrays=tuple(arrays),
        temporaries_bytes=buffers.temporaries_bytes(hlo),
        computes=buffers.computes(hlo),
    )


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


def format_bytes(n: int, digits: int = 3) -> str:
    """Decimal units, as the Cloud TPU docs give HBM: 22.5 MB, 16 GB (`digits` significant)."""
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{n / size:.{digits}g} {unit}"
    return f"{n} B"


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple
