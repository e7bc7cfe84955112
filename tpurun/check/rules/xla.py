"""The XLA rules: the replica step compiled by XLA for the CPU, as a TPU would compile it.

A real compile finds what the graph walk cannot: ops XLA rejects only in
context, and shapes it cannot infer (`xla-unsupported`, `xla-compile`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any

import tensorflow as tf
from absl import logging

from tpurun.check.rules.findings import ERROR, WARNING, Problem
from tpurun.check.rules.fixes import unsupported_problem
from tpurun.check.rules.graph_walk import SUMMARY_OPS
from tpurun.check.rules.introspection import LayerScopes
from tpurun.check.rules.origin import created_at_from_text
from tpurun.errors.tf_errors import first_line, user_code_line
from tpurun.model import Mode
from tpurun.tpu_vm import installed


@functools.cache
def cpu_compiler_missing() -> str | None:
    """Why this TensorFlow compiles nothing with XLA for the CPU; None when it does.

    A trivial function compiled once per process; it also makes XLA register its kernels,
    which it does on first use. tensorflow-tpu 2.20 has no XLA for the host ("could not
    find registered transfer manager for platform Host"): it compiles for the TPU only.
    """
    try:
        tf.function(
            lambda: tf.constant(1.0) + 1.0, jit_compile=True
        ).experimental_get_compiler_ir()(stage="hlo")
    except Exception as e:  # noqa: BLE001 - any failure: no step would compile either
        tensorflow = installed.tensorflow_tpu()
        if tensorflow:
            return f"tensorflow-tpu {tensorflow} compiles XLA for the TPU only, not the CPU"
        return f"TensorFlow {tf.__version__} compiles no XLA for the CPU ({user_code_line(e)})"
    return None


def populate_xla_registry() -> None:
    """XLA registers its kernels on first use; compile a trivial function so it has."""
    missing = cpu_compiler_missing()
    if missing:
        logging.info("The XLA rules are skipped: %s.", missing)


def compile_problems(mode: Mode, compiled: Any, spec: Any, scopes: LayerScopes) -> list[Problem]:
    """Compiles one replica's step with XLA from the spec of its batch; the problems found.

    `compiled`: the step as `step_builds.jit_flat` makes it. Where this TensorFlow has no XLA
    for the CPU, one warning says the step was not compiled.
    """
    missing = cpu_compiler_missing()
    if missing:
        return [
            Problem(
                "xla-compile",
                WARNING,
                "{steps}",
                f"the {{steps}} were traced but not compiled by XLA: {missing}",
                "run `tpurun check` where TensorFlow is the `tensorflow` wheel, which "
                "compiles for the CPU (docs/tpu.md, Which TensorFlow)",
                mode,
            )
        ]
    flat = tf.nest.flatten(spec)
    try:
        with scopes.recording():
            compiled.experimental_get_compiler_ir(*flat)(stage="hlo")
    except Exception as e:  # noqa: BLE001 - tf2xla raises ValueError/InvalidArgumentError
        return _xla_problems(mode, e, scopes)
    return []


_UNSUPPORTED = re.compile(
    r"No registered '([\w.>-]+)' OpKernel for (\w+) devices compatible with node "
    r"\{\{node ([^}]+)\}\}"
)


def _xla_problems(mode: Mode, error: BaseException, scopes: LayerScopes) -> list[Problem]:
    """Findings from a failed XLA compile: unsupported ops, else the compiler's message."""
    text = str(error)
    created = created_at_from_text(text)
    at = f" (created at {created})" if created else ""
    problems = []
    for op_type, _device, node in dict.fromkeys(_UNSUPPORTED.findall(text)):
        if op_type in SUMMARY_OPS:
            continue
        layer = scopes.layer_of(node)
        about = f"op '{node}' ({op_type}" + (f", layer {layer}" if layer else "") + ")"
        where = "{steps}: " + (f"layer {layer}, " if layer else "") + f"op {node}"
        problem = unsupported_problem(mode, about, at, where, op_type)
        problems.append(dataclasses.replace(problem, op_name=node))
    if problems:
        return problems
    message = text.replace("Failed getting HLO text:", "").strip().strip("'\"")
    first = first_line(message) if message else type(error).__name__
    node_match = re.search(r"node `([^`]+)`|\{\{node ([^}]+)\}\}", first)
    node = (node_match.group(1) or node_match.group(2)) if node_match else ""
    layer = scopes.layer_of(node) if node else None
    where = "{steps}" + (f": layer {layer}" if layer else "") + (f", op {node}" if node else "")
    return [
        Problem(
            "xla-compile",
            ERROR,
            where,
            f"XLA cannot compile the {{steps}}: {first.rstrip('.')}"
            + (f" (layer {layer})" if layer else "")
            + at,
            "make the step XLA-compilable: sizes, axes and shapes must be constants or "
            "come from tensor.shape, not from tensor values",
            mode,
            op_name=node,
        )
    ]
