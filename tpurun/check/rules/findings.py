"""What `tpurun check` reports: findings, each saying where, what, and how to fix it.

A rule records a `Problem` in one step (train, eval or predict); `merge` joins
the same problem found in several steps into one `Finding`, whose text names them
("in the train, eval and predict steps").
"""

from __future__ import annotations

import dataclasses
import sys
from typing import TextIO

import tensorflow as tf

from tpurun.model import Mode

ERROR = "error"
WARNING = "warning"
STEP_NAMES = {Mode.TRAIN: "train", Mode.EVAL: "eval", Mode.PREDICT: "predict"}


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


@dataclasses.dataclass(frozen=True)
class Problem:
    """A finding in one step; `merge` joins equal problems of several steps.

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


def merge(problems: list[Problem]) -> list[Finding]:
    steps: dict[tuple[str, str, str, str, str], list[Mode]] = {}
    for p in problems:
        modes = steps.setdefault((p.rule, p.severity, p.where, p.message, p.fix), [])
        if p.step not in modes:
            modes.append(p.step)
    findings = []
    for (rule, severity, where, message, fix), modes in steps.items():
        names = [STEP_NAMES[m] for m in Mode if m in modes]
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


def report(findings: list[Finding], out: TextIO | None = None) -> int:
    """Prints the findings, errors first (to sys.stdout as it is now by default); returns the
    exit code (1 if any is an error)."""
    out = out or sys.stdout
    errors = [f for f in findings if f.severity == ERROR]
    for finding in errors + [f for f in findings if f.severity != ERROR]:
        print(finding, file=out)
    return 1 if errors else 0


def shape_text(shape: tf.TensorShape | None) -> str:
    if shape is None or shape.rank is None:
        return "<unknown rank>"
    dims = tuple(shape.as_list())
    return str(dims) if len(dims) != 1 else f"({dims[0]},)"
