"""The `memory` finding of `tpurun check --target`: what a step that does not fit needs, and
the levers that make it fit.

One error line per step: what the TPU compiler said (its refusal, or its total
against the HBM it allows), or XLA:CPU's estimate, named as such, with how to get
the compiler's; then the levers: the largest per-replica batch the search found
to fit (`tpurun.check.sizing.batch_search`), bfloat16 activations, gradient
accumulation, more replicas. When not even a batch of 1 fits, the TPUs whose
usable HBM exceeds what the step needs (each generation's, as its compiler counts
it), or that none does.
"""

from __future__ import annotations

from tpurun.check.report.fit_report import hbm_text, step_hbm_text
from tpurun.check.rules.findings import ERROR, Problem
from tpurun.check.rules.input_rules import BATCH_FLAGS
from tpurun.check.sizing.memory import OPTIMIZER, WEIGHTS, MemoryEstimate, format_bytes
from tpurun.check.sizing.preflight import StepMemory, TargetMemory
from tpurun.check.sizing.tpu_compiler import client
from tpurun.check.sizing.tpu_compiler.sizing import RefusedStep
from tpurun.check.targets import GENERATIONS, Target, larger_slice
from tpurun.model import Mode
from tpurun.run_config import RunConfig


def problems(run: RunConfig, found: TargetMemory) -> list[Problem]:
    """A `memory` error for every step that does not fit, or whose estimate failed."""
    result = []
    for step in found.steps:
        if not step.fits:
            result.append(_too_big(run, found, step))
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


def cpu_estimate(found: TargetMemory, mode: Mode) -> str:
    """What an XLA:CPU figure is, said where it is given: the estimate, not the TPU
    compiler's figure, and how to get that (or why there is none)."""
    if mode in found.fallbacks:
        return "XLA:CPU's estimate: the TPU compile of this step failed (see the note)"
    if client.missing_extra() is not None:
        return f"XLA:CPU's estimate, not the TPU compiler's; {client.INSTALL} gives the compiler's"
    return f"XLA:CPU's estimate, not the TPU compiler's: {found.compiler_note or 'none ran'}"


def _too_big(run: RunConfig, found: TargetMemory, step: StepMemory) -> Problem:
    target, estimate = found.target, step.estimate
    if isinstance(estimate, RefusedStep):
        message = (
            f"the {{steps}} does not fit a {target.name} replica at a per-replica batch of "
            f"{step.batch}: {estimate.refusal}"
        )
    else:
        how = (
            "the TPU compiler's total" if step.compiler == "tpu" else cpu_estimate(found, step.mode)
        )
        message = (
            f"the {{steps}} needs {format_bytes(estimate.padded_total_bytes)} per replica at "
            f"a per-replica batch of {step.batch}, and a {target.name} replica has "
            f"{step_hbm_text(step)} ({how})"
        )
    if step.search is None or step.search.batch is None:
        fix = _nothing_fits(run, found, step)
    else:
        largest = largest_found(step.search.batch, step.search.refused_above)
        if step.compiler != "tpu":
            largest += " by that estimate"
        fix = levers(
            run, step.mode, step.batch, largest, step.search.batch, target.replicas, target
        )
    return Problem("memory", ERROR, "{steps}", message, fix, step.mode)


def largest_found(batch: int, refused_above: int) -> str:
    """The search's answer as the fix says it: the largest batch it found, not a proof."""
    return (
        f"the largest per-replica batch found to fit is {batch} (the search's answer, not a "
        f"proof: {refused_above} does not fit, a larger batch might)"
    )


def levers(
    run: RunConfig,
    mode: Mode,
    batch: int,
    largest: str,
    max_batch: int,
    replicas: int,
    target: Target | None,
) -> str:
    """What makes a step that needs too much memory fit: the largest per-replica batch
    that fits (`largest` says it: "the largest per-replica batch ... is N"), then
    bfloat16, gradient accumulation and more replicas (of the `target`'s generation,
    when known)."""
    flag = BATCH_FLAGS[mode]
    found = [
        f"{largest}: {flag}={max_batch * replicas} ({replicas} replica{'s' if replicas > 1 else ''})"
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


def _nothing_fits(run: RunConfig, found: TargetMemory, step: StepMemory) -> str:
    """Not even a batch of 1 fits: what the step needs at 1 (the compiler's figure, or the
    estimate's, named), and the TPUs whose usable HBM per replica exceeds it."""
    at_one = step.smallest or step.estimate
    need: int | None
    if isinstance(at_one, RefusedStep):
        need = at_one.needed_bytes
        said = f"the TPU compiler refused even a per-replica batch of 1: {at_one.stated}"
        need_text = f"{format_bytes(need or 0)} " + (
            "it used" if at_one.program_bytes else f"its {at_one.what} need"
        )
    else:
        need = at_one.padded_total_bytes
        state = at_one.padded_bytes(WEIGHTS) + at_one.padded_bytes(OPTIMIZER)
        how = (
            cpu_estimate(found, step.mode)
            if isinstance(at_one, MemoryEstimate)
            else "the TPU compiler's total"
        )
        said = (
            f"not even a per-replica batch of 1 fits: it needs {format_bytes(need)}, the "
            f"weights and optimizer state alone {format_bytes(state)} ({how})"
        )
        need_text = f"{format_bytes(need)} it needs"
    fix = f"{said}; use a smaller model"
    if need is None:
        fix += " (the compiler gave no figure to hold against other TPUs)"
    else:
        if step.compiler == "tpu" and found.usable_hbm:
            usable = {name: _gib_text(hbm) for name, hbm in found.usable_hbm.items() if hbm > need}
            whose = "as its TPU compiler counts it"
            most = max(found.usable_hbm.items(), key=lambda item: item[1])
            most_text = f"{most[0]}'s {_gib_text(most[1])}"
        else:
            usable = {
                g.name: hbm_text(g.hbm_bytes_per_replica)
                for g in GENERATIONS
                if g.hbm_bytes_per_replica > need
            }
            whose = "as the Cloud TPU docs give it"
            most_row = max(GENERATIONS, key=lambda g: g.hbm_bytes_per_replica)
            most_text = f"{most_row.name}'s {hbm_text(most_row.hbm_bytes_per_replica)}"
        usable.pop(found.target.generation, None)
        if usable:
            named = ", ".join(f"{name} with {text}" for name, text in usable.items())
            fix += f", or a TPU whose HBM per replica ({whose}) exceeds the {need_text}: {named}"
        else:
            fix += (
                f"; no TPU's HBM per replica ({whose}) exceeds the {need_text}: the most is "
                f"{most_text}"
            )
    precision = _precision_lever(run)
    return fix + (f"; or {precision}" if precision else "")


def _gib_text(n: int) -> str:
    """HBM as the TPU compiler counts it: "16.9 GB (15.75 GiB)"."""
    return f"{format_bytes(n)} ({n / (1 << 30):.2f} GiB)"
