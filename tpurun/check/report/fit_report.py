"""What `tpurun check --target` prints about memory: the table, and the `--report` JSON.

The table's rows are what sized each step: the TPU compiler's (arguments by kind,
outputs and what is written in place of arguments, temporaries, generated code),
or the XLA:CPU estimate's (arguments in TPU tiles, and "other"), with a line
saying why when it is the estimate. A step the compiler refused has only what its
refusal said; its other rows read "not known". (The finding of a step that does
not fit, with its levers, is `fit_findings`'.)
"""

from __future__ import annotations

import json
import math
from typing import Any

from tpurun import storage
from tpurun.check.bounds import step_bounds
from tpurun.check.rules.findings import STEP_NAMES
from tpurun.check.rules.input_rules import TPU_BATCH_MULTIPLE
from tpurun.check.sizing import batch_search
from tpurun.check.sizing.memory import (
    INPUT,
    OPTIMIZER,
    OTHER,
    WEIGHTS,
    MemoryEstimate,
    format_bytes,
)
from tpurun.check.sizing.preflight import PREFETCHED_BATCHES, StepMemory, StepSize, TargetMemory
from tpurun.check.sizing.tpu_compiler.sizing import RefusedStep
from tpurun.errors import RunError
from tpurun.model import Mode
from tpurun.run_config import RunConfig

_INPUT_LABEL = f"input ({1 + PREFETCHED_BATCHES} batches)"
# Every row a step can have, in table order: the TPU compiler's and XLA:CPU's.
_ORDER = (
    "weights",
    "optimizer state",
    _INPUT_LABEL,
    "outputs",
    "(written in place of arguments)",
    "temporaries",
    "generated code",
    "other",
    "(of which TPU tile padding)",
    "total",
)
NOT_KNOWN = "not known"


def hbm_text(n: int) -> str:
    """HBM in the table's decimal units, and as the Cloud TPU docs give it when they give
    GiB (v2-v4, v5p): "17.2 GB (16 GiB)"; v5e and v6e are documented in GB."""
    return format_bytes(n) + (f" ({n >> 30} GiB)" if n % (1 << 30) == 0 else "")


def step_hbm_text(step: StepMemory) -> str:
    """A replica's HBM for this step: the TPU compiler's own figure names itself so."""
    if step.compiler == "tpu":
        return f"{format_bytes(step.hbm_bytes)} ({step.hbm_bytes / (1 << 30):.2f} GiB)"
    return hbm_text(step.hbm_bytes)


def rows_of(estimate: StepSize, device_data: bool = False) -> dict[str, int | None]:
    """The table's rows of one step, by label (None: not known)."""
    input_label = "input" if device_data else _INPUT_LABEL
    if isinstance(estimate, RefusedStep):  # only what the refusal said
        rows = dict.fromkeys(("weights", "optimizer state", input_label, "outputs"))
        rows["(written in place of arguments)"] = None
        rows["temporaries"] = estimate.temporary_bytes
        rows["generated code"] = None
        rows["total"] = estimate.program_bytes  # printed as ">= ": the input comes on top
        return rows
    rows = {
        "weights": estimate.padded_bytes(WEIGHTS),
        "optimizer state": estimate.padded_bytes(OPTIMIZER),
        input_label: estimate.padded_bytes(INPUT),
    }
    if isinstance(estimate, MemoryEstimate):
        rows["other"] = estimate.padded_bytes(OTHER)
        rows["(of which TPU tile padding)"] = estimate.padding_bytes
    else:
        rows["outputs"] = estimate.output_bytes
        rows["(written in place of arguments)"] = -estimate.alias_bytes
        rows["temporaries"] = estimate.temporary_bytes
        rows["generated code"] = estimate.code_bytes
    rows["total"] = estimate.padded_total_bytes
    return rows


def table(found: TargetMemory, iterations: int) -> list[str]:
    """The size of each step, one column per step, and what the rows mean."""
    target = found.target
    if found.compiler:
        how = found.compiler
    else:
        how = "an estimate: XLA's CPU compile of each step, its arrays padded to TPU tiles"
    lines = [
        f"Memory per replica on a {target.name}: {target.replicas} replicas with "
        f"{hbm_text(target.hbm_bytes_per_replica)} of HBM each ({how})"
    ]
    steps = found.steps
    if steps:
        columns = [rows_of(s.estimate, s.device_data) for s in steps]
        order = list(_ORDER)
        if any(s.device_data for s in steps):
            order[order.index(_INPUT_LABEL)] = "input"  # the notes say what it holds
            for column in columns:
                column["input"] = column.pop(_INPUT_LABEL, column.get("input"))
        rows: list[tuple[str, list[str]]] = [("batch per replica", [_batch(s) for s in steps])]
        for label in order:
            if not any(label in c for c in columns):
                continue
            values = []
            for step, column in zip(steps, columns, strict=True):
                value = column.get(label)
                if label not in column:
                    values.append("")  # a row of the other kind of sizing
                elif label == "total" and value is not None and _refused(step):
                    values.append(f">= {format_bytes(value)}")
                elif label == "total" and value is not None:
                    values.append(format_bytes(value))
                else:
                    values.append(_signed(value))
            rows.append((label, values))
        rows += [
            ("HBM per replica", [step_hbm_text(s) for s in steps]),
            ("headroom", [_headroom(s) for s in steps]),
        ]
        if not all(s.fits for s in steps):
            rows.append(("largest batch found to fit", [_largest(s) for s in steps]))
        width = max(12, *(len(v) for _, values in rows for v in values))
        label_width = max(len(label) for label, _ in rows)
        header = " " * (label_width + 2) + "".join(
            f"{STEP_NAMES[s.mode] + ('*' if s.mode in found.fallbacks else ''):>{width + 2}}"
            for s in steps
        )
        lines.append(header)
        for label, values in rows:
            lines.append(f"  {label:<{label_width}}" + "".join(f"{v:>{width + 2}}" for v in values))
    for mode, why in {**found.skipped, **found.failed}.items():
        lines.append(f"  {STEP_NAMES[mode]}: {why}")
    lines += _notes(found, iterations)
    return lines


def _refused(step: StepMemory) -> bool:
    return isinstance(step.estimate, RefusedStep)


def _signed(n: int | None) -> str:
    if n is None:
        return NOT_KNOWN
    if n < 0:
        return f"-{format_bytes(-n)}"
    return format_bytes(n) if n else "-"


def _batch(step: StepMemory) -> str:
    return f"{step.batch} x {step.micro_batches}" if step.micro_batches > 1 else str(step.batch)


def _headroom(step: StepMemory) -> str:
    headroom = step.headroom_bytes
    if headroom is None:
        return "refused by the compiler"
    if not step.fits:
        return f"-{format_bytes(-headroom)} (does not fit)"
    # Rounded down: 99.96% free is not "100.0%".
    share = math.floor(1000 * headroom / step.hbm_bytes) / 10
    return f"{format_bytes(headroom, 4)} ({share:.1f}%)"


def _largest(step: StepMemory) -> str:
    if step.fits:
        return "-"  # not searched: the batch given fits
    return str(step.max_batch) if step.max_batch is not None else "none"


def _notes(found: TargetMemory, iterations: int) -> list[str]:
    """The lines under the table: what sized the steps, then what their input holds, then
    what its rows count."""
    notes = []
    if found.compiler_note:
        notes.append(f"XLA's CPU estimate, not the TPU's compiler: {found.compiler_note}")
    for mode, why in found.fallbacks.items():
        notes.append(
            f"{STEP_NAMES[mode]}*: XLA's CPU estimate: its TPU compile failed: {_one_line(why)}"
        )
    if found.steps:
        notes += _input_notes(found, iterations) + _row_notes(found)
    return [f"  note: {note}" for note in notes]


def _input_notes(found: TargetMemory, iterations: int) -> list[str]:
    """The train step's host loop and micro-batches, and what each step's input holds."""
    notes = []
    train = found.step(Mode.TRAIN)
    if train is not None:
        notes.append(
            f"train: one compiled step, called --iterations={iterations} times per host loop; "
            "TensorFlow keeps that loop on the host, and each call re-uses the step's "
            "buffers, so the loop needs what one step needs"
        )
        if train.micro_batches > 1:
            notes.append(
                f"train: each step accumulates the gradients of {train.micro_batches} "
                f"micro-batches of {train.batch} per replica (train.accumulate_steps); its "
                "input holds all of them"
            )
    if train is not None and train.device_data:
        notes.append(
            "input of train: the training arrays and their order's table, which each "
            "replica holds for the whole run and gathers its batches from (device data, "
            "config.train.device_data); nothing is prefetched"
        )
    batches = [STEP_NAMES[s.mode] for s in found.steps if not s.device_data]
    if batches:
        of = "" if len(batches) == len(found.steps) else f" of {' and '.join(batches)}"
        notes.append(
            f"input{of}: the step's batch, and the next one, which TensorFlow prefetches "
            "into each replica's memory meanwhile"
        )
    return notes


def _row_notes(found: TargetMemory) -> list[str]:
    """What the rows count, as the TPU compiler or XLA:CPU sized the steps, and how the
    largest batch was found."""
    notes = []
    computes = frozenset().union(*(s.estimate.computes for s in found.steps))
    compiled = [s for s in found.steps if s.compiler == "tpu"]
    estimated = [s for s in found.steps if s.compiler != "tpu"]
    if compiled:
        notes.append(
            "outputs: the loss and the updated weights and optimizer state, most of them "
            "written in place of the arguments they update; temporaries: activations, "
            "gradients and the rest, as the TPU compiler schedules them; total: arguments + "
            "outputs - written in place + temporaries + generated code"
        )
        notes.append(
            "HBM per replica: what the TPU compiler lets a program use (it refuses a "
            "program that needs more)"
        )
    notes += [_refused_note(s) for s in found.steps if isinstance(s.estimate, RefusedStep)]
    searched = [s for s in found.steps if s.search is not None]
    if searched:
        counts = ", ".join(
            f"{STEP_NAMES[s.mode]} {s.search.compiles} of at most {s.search.bound}"
            for s in searched
            if s.search is not None
        )
        notes.append(
            f"largest batch found to fit: by compiling the step at a few batches ({counts}, "
            f"at most ceil(log2(batch / {TPU_BATCH_MULTIPLE})) + {batch_search.EXTRA_PROBES}); "
            "a batch that compiled and fits, next to a larger one that does not. Near the "
            "HBM the compiler recomputes activations rather than keep them, so memory is "
            "not monotonic in the batch: a still larger batch may fit"
        )
    if estimated:
        notes.append(
            "other: gradients, activations and temporaries as XLA:CPU assigns them; the TPU's "
            "compiler fuses and schedules differently, so take it as the rough part"
        )
    if "scatter" in computes:
        notes.append(
            "this model's XLA:CPU program scatters (max-pool gradients, lowered with index "
            "arrays as large as the activations, which a TPU does not make): 'other' errs high"
        )
    if "bfloat16-convolution" in computes:
        notes.append(
            "XLA:CPU computes bfloat16 convolutions in float32, so 'other' shows little of "
            "what bfloat16 saves on a TPU"
        )
    if estimated:
        notes.append(
            "padding: weights, optimizer state and input as a TPU lays them out, the two minor "
            "dimensions in tiles of 8 x 128 (32 rows for 8-bit types); a TPU may pick another "
            "layout for an array"
        )
    return notes


def _refused_note(step: StepMemory) -> str:
    refused = step.estimate
    assert isinstance(refused, RefusedStep)
    if refused.program_bytes is not None:
        said = "what the compiled program used (the total is at least that)"
    elif refused.temporary_bytes is not None:
        said = (
            "what it planned for the HLO temporaries, before it would recompute activations "
            "to save memory"
        )
    else:
        said = "that it does not fit"
    return (
        f"{STEP_NAMES[step.mode]} at {step.batch} per replica: refused by the TPU compiler, "
        f"whose refusal states only {said}; the rows '{NOT_KNOWN}' are figures it gives only "
        "for a program it compiles"
    )


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- The JSON report --------------------------------------------------------------------


def report(run: RunConfig, found: TargetMemory) -> dict[str, Any]:
    """`--report`: per step its memory in bytes as a TPU lays the arrays out (the TPU
    compiler's figures, or the XLA:CPU estimate) and its time bound; the run's bounds."""
    target = found.target
    bounds, whole = step_bounds.report(run, found)
    steps = {}
    for step in found.steps:
        name = STEP_NAMES[step.mode]
        steps[name] = {
            **step_bytes(step.batch, step.estimate),
            **({"accumulate_steps": step.micro_batches} if step.mode is Mode.TRAIN else {}),
            **({"device_data": True} if step.device_data else {}),
            "fits": step.fits,
            "max_batch_per_replica": step.max_batch,
            "hbm_bytes": step.hbm_bytes,
            **bounds[name],
        }
        if step.search is not None:  # the largest batch found, and what the search cost
            steps[name]["batch_search"] = {
                "refused_above": step.search.refused_above,
                "compiles": step.search.compiles,
                "compile_bound": step.search.bound,
            }
        if step.mode in found.fallbacks:
            steps[name]["tpu_compile_failed"] = found.fallbacks[step.mode]
    data: dict[str, Any] = {
        "config": run.config_name,
        "target": target.name,
        "replicas": target.replicas,
        "hbm_bytes_per_replica": target.hbm_bytes_per_replica,
        **whole,
        "compiled_by": found.compiler,
        "steps": steps,
    }
    if found.compiler_note:
        data["compiler_note"] = found.compiler_note
    if found.usable_hbm:
        data["usable_hbm_bytes_per_replica"] = found.usable_hbm
    not_estimated = {**found.skipped, **found.failed}
    if not_estimated:
        data["not_estimated"] = {STEP_NAMES[m]: why for m, why in not_estimated.items()}
    return data


def step_bytes(batch: int, estimate: StepSize) -> dict[str, Any]:
    """One step's memory in the report's (and the run record's) keys (null: not known)."""
    data: dict[str, Any] = {"batch_per_replica": batch}
    if isinstance(estimate, RefusedStep):  # only what the refusal said
        keys = ("weights", "optimizer", "input", "other", "total", "padding", "output", "alias")
        data.update({f"{key}_bytes": None for key in keys})
        data.update(
            temporary_bytes=estimate.temporary_bytes,
            program_bytes=estimate.program_bytes,
            code_bytes=None,
            refused=estimate.refusal,
        )
        return data
    data.update(
        weights_bytes=estimate.padded_bytes(WEIGHTS),
        optimizer_bytes=estimate.padded_bytes(OPTIMIZER),
        input_bytes=estimate.padded_bytes(INPUT),
        other_bytes=estimate.padded_bytes(OTHER),
        total_bytes=estimate.padded_total_bytes,
        padding_bytes=estimate.padding_bytes,
    )
    if not isinstance(estimate, MemoryEstimate):
        data.update(
            output_bytes=estimate.output_bytes,
            alias_bytes=estimate.alias_bytes,
            temporary_bytes=estimate.temporary_bytes,
            code_bytes=estimate.code_bytes,
            refused=None,
        )
    return data


def write_report(path: str, data: dict[str, Any]) -> None:
    try:
        storage.write_atomically(path, json.dumps(data, indent=2) + "\n")
    except Exception as e:  # noqa: BLE001 - tf.errors.OpError or OSError: the path is the user's
        raise RunError(
            f"cannot write --report={path} ({storage.failure(e)}); choose a file in a "
            "directory you can write"
        ) from None
