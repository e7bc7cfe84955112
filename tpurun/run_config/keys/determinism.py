"""config.train.deterministic: which kernels a run uses, and what a resume of it reproduces.

TensorFlow-free: the run config, `tpurun check` and `tpurun report` all say it, and only
`tpurun.cluster.determinism` turns it into TensorFlow's settings.

What makes two runs of one config differ in the last bits, measured on a 2-core x86 CPU
with the full ResNet-50 (docs/checkpoints.md): not the CPU kernels (its gradients, traced
in two processes, were equal to the bit), but Grappler's arithmetic optimizer, which
rewrote the optimizer's updates of a few late layers differently from one process to the
next; with it off, every run gave the same weights, with or without TensorFlow's op
determinism. Op determinism is what makes GPU kernels (cuDNN's convolution algorithms,
atomic reductions) and tf.data's parallel maps deterministic, and TensorFlow's own
advice for reproducible training: "deterministic" turns on both. On a TPU, XLA compiles
the training step into one program that runs the same way every time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tpurun.layout.time_account import Resume

AUTO = "auto"
TPU, GPU, CPU = "TPU", "GPU", "CPU"
# What "auto" chooses, by platform. CPU: on, its cost measured within the noise of mnist's
# and the full ResNet-50's steps here, 0.15 ms a step fed by tf.data (the input wait timed
# by the host's clock), 0.45x the speed of Iris through tf.data (scripts/bench_determinism.py,
# docs/benchmarks.md): bit-identical resumes, which tpurun promises, are worth it.
# GPU: off, not measured (no GPU here); cuDNN's deterministic algorithms may be much slower.
# TPU: off, not needed: XLA's TPU programs are deterministic.
AUTO_CHOICE = {CPU: True, GPU: False, TPU: False}
ENV_VARIABLE = "TF_DETERMINISTIC_OPS"
# What the start line, `tpurun check` and `tpurun report` say of a resume.
BIT_IDENTICAL = "are bit-identical"
MAY_DIFFER = "continue the same run but may differ in the last bits"


@dataclasses.dataclass(frozen=True)
class Determinism:
    """A train run's kernels, decided once its platform is known (`decide`)."""

    platform: str  # TPU, GPU or CPU: what the replicas run on
    # tpurun turns on TensorFlow's op determinism and turns off Grappler's arithmetic
    # rewrites for the run (`tpurun.cluster.determinism`).
    deterministic: bool
    # Op determinism was on before tpurun set anything (TF_DETERMINISTIC_OPS=1, or the
    # user's own code): it stays on, whatever the key says.
    op_determinism_already: bool = False
    choice: Any = AUTO  # config.train.deterministic as given: True, False or "auto"
    # Its training input is made by a tf.data service (config.data.service), which a
    # resumed run restarts at the start of its epoch (docs/data-service.md): whatever
    # the kernels, the resume sees other batches.
    served_input: bool = False

    @property
    def bit_identical(self) -> bool:
        """Whether a resumed run ends with the weights of an uninterrupted one, bit for bit."""
        return (self.platform == TPU or self.deterministic) and not self.served_input

    @property
    def op_determinism(self) -> bool:
        """Whether TensorFlow's op determinism is on for the run."""
        return self.deterministic or self.op_determinism_already

    def why(self) -> str:
        """What the verdict rests on, and on CPU and GPU how to have the other one."""
        if self.served_input:
            return (
                "its input comes from a tf.data service (config.data.service), which a "
                "resumed run restarts at the start of its epoch; drop config.data.service "
                "for an exact resume"
            )
        if self.platform == TPU:
            return "XLA compiles the training step into the same TPU program every run"
        key = f"config.train.deterministic={_shown(self.choice)}"
        if self.choice == AUTO:
            key += (
                f", which turns them {'on' if self.deterministic else 'off'} on a {self.platform}"
            )
        if self.deterministic:
            return (
                "deterministic kernels, TensorFlow's op determinism on and Grappler's "
                f"arithmetic rewrites off ({key})"
            )
        if self.op_determinism_already:
            why = f"TensorFlow's op determinism is on ({ENV_VARIABLE}), but Grappler's"
        else:
            why = f"the {self.platform}'s kernels and Grappler's"
        return (
            f"{why} arithmetic rewrites do not fix their summation order ({key}; "
            "--config.train.deterministic=true makes resumes bit-identical)"
        )

    def line(self, where: str = "") -> str:
        """The start line: 'Resumes are bit-identical: XLA compiles ...'; `where`: 'on a
        TPU' (`tpurun check` says it of two platforms)."""
        resumes = f"Resumes {where}" if where else "Resumes"
        return f"{resumes} {BIT_IDENTICAL if self.bit_identical else MAY_DIFFER}: {self.why()}."

    def as_record(self) -> Resume:
        """What the run record keeps of it (`resume` in its time account)."""
        return Resume(self.bit_identical, self.op_determinism, self.why())


def decide(
    choice: Any, platform: str, op_determinism_already: bool = False, served_input: bool = False
) -> Determinism:
    """The kernels of a train run on `platform` whose config.train.deterministic is `choice`
    (true, false or "auto"); `served_input`: a tf.data service makes its input."""
    deterministic = AUTO_CHOICE[platform] if choice == AUTO else bool(choice)
    return Determinism(platform, deterministic, op_determinism_already, choice, served_input)


def verdict(resume: Resume | None) -> str | None:
    """A run record's `resume` as one phrase, 'are bit-identical: why' or 'continue the same
    run but may differ in the last bits: why'; None when the record has none (written
    before records kept it)."""
    if resume is None:
        return None
    said = BIT_IDENTICAL if resume.bit_identical else MAY_DIFFER
    return f"{said}: {resume.reason}" if resume.reason else said


def _shown(choice: Any) -> str:
    return str(choice).lower() if isinstance(choice, bool) else repr(choice)
