"""What `tpurun check --target` says: the memory table, a finding per step that does not
fit (with the largest batch that does and the other levers), and the `--report` JSON.

The table's rows are what sized each step: the TPU compiler's (arguments by kind,
outputs and what is written in place of arguments, temporaries, generated code),
or the XLA:CPU estimate's (arguments in TPU tiles, and "other"), with a line
saying why when it is the estimate.
"""

from __future__ import annotations

import json
import math
from typing import Any

from tpurun import storage
from tpurun.check import step_bounds
from tpurun.check.findings import ERROR, STEP_NAMES, Problem
from tpurun.check.input_rules import BATCH_FLAGS
from tpurun.check.memory import INPUT, OPTIMIZER, OTHER, WEIGHTS, format_bytes
from tpurun.check.preflight import PREFETCHED_BATCHES, StepMemory, StepSize, TargetMemory
from tpurun.check.targets import GENERATIONS, Target, larger_slice
from tpurun.check.tpu_compiler.sizing import CompiledStep
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
    rows: dict[str, int | None] = {
        "weights": estimate.padded_bytes(WEIGHTS),
        "optimizer state": estimate.padded_bytes(OPTIMIZER),
        input_label: estimate.padded_bytes(INPUT),
    }
    if isinstance(estimate, CompiledStep):
        refused = estimate.refusal is not None
        rows["outputs"] = None if refused else estimate.output_bytes
        rows["(written in place of arguments)"] = None if refused else -estimate.alias_bytes
        rows["temporaries"] = estimate.temporary_bytes
        rows["generated code"] = None if refused else estimate.code_bytes
    else:
        rows["other"] = estimate.padded_bytes(OTHER)
        rows["(of which TPU tile padding)"] = estimate.padding_bytes
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
                if label == "total" and step.estimate.padded_total_bytes and _refused(step):
                    values.append(f">= {format_bytes(value or 0)}")
                elif label == "total":
                    values.append(format_bytes(value or 0))
                else:
                    values.append(_signed(value))
            rows.append((label, values))
        rows += [
            ("HBM per replica", [step_hbm_text(s) for s in steps]),
            ("headroom", [_headroom(s) for s in steps]),
        ]
        if not all(s.fits for s in steps):
            rows.append(("largest batch that fits", [_largest(s) for s in steps]))
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
    return isinstance(step.estimate, CompiledStep) and step.estimate.refusal is not None


def _signed(n: int | None) -> str:
    if n is None:
        return "?"
    if n < 0:
        return f"-{format_bytes(-n)}"
    return format_bytes(n) if n else "-"


def _batch(step: StepMemory) -> str:
    return f"{step.batch} x {step.micro_batches}" if step.micro_batches > 1 else str(step.batch)


def _headroom(step: StepMemory) -> str:
    if _refused(step):
        return "refused by the compiler"
    if not step.fits:
        return f"-{format_bytes(-step.headroom_bytes)} (does not fit)"
    # Rounded down: 99.96% free is not "100.0%".
    share = math.floor(1000 * step.headroom_bytes / step.hbm_bytes) / 10
    return f"{format_bytes(step.headroom_bytes, 4)} ({share:.1f}%)"


def _largest(step: StepMemory) -> str:
    if step.fits:
        return "-"  # not searched: the batch given fits
    return str(step.max_batch) if step.max_batch is not None else "none"


def _notes(found: TargetMemory, iterations: int) -> list[str]:
    notes = []
    if found.compiler_note:
        notes.append(f"XLA's CPU estimate, not the TPU's compiler: {found.compiler_note}")
    for mode, why in found.fallbacks.items():
        notes.append(
            f"{STEP_NAMES[mode]}*: XLA's CPU estimate: its TPU compile failed: {_one_line(why)}"
        )
    if not found.steps:
        return [f"  note: {note}" for note in notes]
    computes = frozenset().union(*(s.estimate.computes for s in found.steps))
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
    return [f"  note: {note}" for note in notes]


def _one_line(text: str) -> str:
    return " ".join(text.split())


# --- Findings ---------------------------------------------------------------------------


def problems(run: RunConfig, found: TargetMemory) -> list[Problem]:
    """A `memory` error for every step that does not fit, or whose estimate failed."""
    result = []
    for step in found.steps:
        if not step.fits:
            result.append(_too_big(run, found.target, step))
    for mode, why in found.failed.items():
        result.append(
            Problem(
                "memory",
                ERROR,
                "{steps}",
                f"the memory of the {{steps}} on a {found.target.name} could not be "
                f"estimated: {why}",
                "rerun with --verbosity=1 for the details; without --target the other "
                "checks still run",
                mode,
            )
        )
    return result


def _too_big(run: RunConfig, target: Target, step: StepMemory) -> Problem:
    estimate = step.estimate
    if isinstance(estimate, CompiledStep) and estimate.refusal is not None:
        message = (
            f"the {{steps}} does not fit a {target.name} replica at a per-replica batch of "
            f"{step.batch}: {estimate.refusal}"
        )
    else:
        how = (
            "by the TPU compiler" if step.compiler == "tpu" else "estimated from the compiled step"
        )
        message = (
            f"the {{steps}} needs {format_bytes(estimate.padded_total_bytes)} per replica at "
            f"a per-replica batch of {step.batch}, and a {target.name} replica has "
            f"{step_hbm_text(step)} ({how})"
        )
    if step.max_batch is None:
        fix = _nothing_fits(run, step)
    else:
        fix = levers(run, step.mode, step.batch, step.max_batch, target.replicas, target)
    return Problem("memory", ERROR, "{steps}", message, fix, step.mode)


def levers(
    run: RunConfig,
    mode: Mode,
    batch: int,
    max_batch: int,
    replicas: int,
    target: Target | None,
    about: str = "",
) -> str:
    """What makes a step that needs too much memory fit: the largest per-replica batch that
    fits (`about`: "about " when it is a rough one), then bfloat16, gradient accumulation
    and more replicas (of the `target`'s generation, when known)."""
    flag = BATCH_FLAGS[mode]
    found = [
        f"the largest per-replica batch that fits is {about}{max_batch}: "
        f"{flag}={max_batch * replicas} ({replicas} replica{'s' if replicas > 1 else ''})"
    ]
    precision = _precision_lever(run)
    if precision:
        found.append(precision)
    if mode is Mode.TRAIN:
        accumulation = _accumulation_lever(run, batch, max_batch, replicas)
        if accumulation:
            found.append(accumulation)
    global_batch = batch * replicas
    larger = larger_slice(target, global_batch, max_batch) if target else None
    if larger is not None:
        found.append(
            f"more replicas: a {larger.name} splits {flag}={global_batch} into "
            f"{global_batch // larger.replicas} per replica"
        )
    elif target is None:
        found.append(f"more replicas (a larger slice), each with a smaller share of {flag}")
    return "; or ".join(found)


def _precision_lever(run: RunConfig) -> str | None:
    """bfloat16 activations (the TPU's own 16-bit type), unless the run has them already."""
    if run.config.precision == "mixed_bfloat16":
        return None
    return "bfloat16 activations: --precision=mixed_bfloat16"


def _accumulation_lever(run: RunConfig, batch: int, max_batch: int, replicas: int) -> str | None:
    """The same examples per update in more, smaller micro-batches (a train step
    accumulates train.accumulate_steps micro-batches of --batch_size), when they split
    evenly."""
    accumulate = run.config.train.accumulate_steps
    per_update = batch * accumulate  # per replica
    more = next(
        (
            k
            for k in range(accumulate + 1, per_update + 1)
            if per_update % k == 0 and per_update // k <= max_batch
        ),
        None,
    )
    if more is None:
        return None
    return (
        f"gradient accumulation: --batch_size={per_update // more * replicas} "
        f"--config.train.accumulate_steps={more} keeps {per_update * replicas} examples per "
        "update"
    )


def _nothing_fits(run: RunConfig, step: StepMemory) -> str:
    state = step.estimate.padded_bytes(WEIGHTS) + step.estimate.padded_bytes(OPTIMIZER)
    bigger = [
        f"{g.prefix} with {hbm_text(g.hbm_bytes_per_replica)}"
        for g in GENERATIONS
        if g.hbm_bytes_per_replica > step.hbm_bytes
    ]
    fix = (
        f"not even a per-replica batch of 1 fits: the weights and optimizer state alone take "
        f"{format_bytes(state)}; use a smaller model"
    )
    if bigger:
        fix += f", or a TPU with more HBM per replica: {', '.join(bigger)}"
    precision = _precision_lever(run)
    return fix + (f"; or {precision}" if precision else "")


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
    not_estimated = {**found.skipped, **found.failed}
    if not_estimated:
        data["not_estimated"] = {STEP_NAMES[m]: why for m, why in not_estimated.items()}
    return data


def step_bytes(batch: int, estimate: StepSize) -> dict[str, Any]:
    """One step's memory in the report's (and the run record's) keys."""
    data: dict[str, Any] = {
        "batch_per_replica": batch,
        "weights_bytes": estimate.padded_bytes(WEIGHTS),
        "optimizer_bytes": estimate.padded_bytes(OPTIMIZER),
        "input_bytes": estimate.padded_bytes(INPUT),
        "other_bytes": estimate.padded_bytes(OTHER),
        "total_bytes": estimate.padded_total_bytes,
        "padding_bytes": estimate.padding_bytes,
    }
    if isinstance(estimate, CompiledStep):
        refused = estimate.refusal is not None
        data.update(
            output_bytes=None if refused else estimate.output_bytes,
            alias_bytes=None if refused else estimate.alias_bytes,
            temporary_bytes=estimate.temporary_bytes,
            code_bytes=None if refused else estimate.code_bytes,
            refused=estimate.refusal,
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
