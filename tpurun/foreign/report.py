"""A plan said in words: what is taken and what is left, before anything runs.

    Warm start from /m/model.ckpt-100 (name-based (TF1); the newest of a model_dir ...),
    through config.name_map (107 rules), global_step 100:
      filled 161 of the model's 161 weights from 161 of the checkpoint's 323 variables
      left in the checkpoint: 161 Momentum slots; global_step
      mismatch: logits/kernel [2048, 10] float32 here, dense/kernel [2048, 1000] float32 ...

Optimizer slots and the step are named as groups, never a line per slot; every model
variable that found nothing and every mismatch is a line of its own. `table` adds the
mapping itself, a line per pair (what `tpurun check --warm_start_from` prints).
"""

from __future__ import annotations

from tpurun.errors import UsageError
from tpurun.foreign.plan import Plan, spec

# Names shown of a group before "... and N more".
SHOWN = 6
_ORDER = ("step", "optimizer state", "left out by the map", "other")


def lines(plan: Plan, what: str, step: int | None, table: bool = False) -> list[str]:
    source = plan.source
    at = f", global_step {step}" if step is not None else ""
    out = [f"{what} from {source.described}, {plan.how}{at}:"]
    filled = (
        f"  filled {len(plan.taken)} of the model's {plan.model_variables} weights from "
        f"{len(plan.taken)} of the checkpoint's {len(source.variables)} variables"
    )
    if plan.kept:
        filled += (
            f"; {len(plan.kept)} kept as built (config.train.warm_start_vars leaves them out): "
            + _names(plan.kept)
        )
    out.append(filled)
    if plan.left:
        out.append(f"  left in the checkpoint: {_groups(plan.left)}")
    out += [f"  unfilled: {path}: nothing in the checkpoint fills it" for path in plan.unfilled]
    out += [f"  mismatch: {m.line()}" for m in plan.mismatches]
    out += [
        f"  not in the model: {name} -> {target}, a variable this model does not have"
        for name, target in plan.not_in_model
    ]
    if table:
        out += [
            f"  {t.source.name} {spec(t.source.shape, t.source.dtype)} -> {t.target.path}"
            + (" (reshaped)" if t.reshape else "")
            for t in plan.taken
        ]
    return out


def refusal(plan: Plan, flag: str, fix: str) -> UsageError:
    """The one line that ends a run whose plan has problems: the first, and how many."""
    if plan.mismatches:
        first = plan.mismatches[0].line()
    elif plan.unfilled:
        first = f"nothing fills {plan.unfilled[0]}"
    else:
        name, target = plan.not_in_model[0]
        first = f"config.name_map sends {name} to {target}, which the model does not have"
    counts = ", ".join(
        f"{n} {what}"
        for n, what in (
            (len(plan.mismatches), "mismatched"),
            (len(plan.unfilled), "unfilled"),
            (len(plan.not_in_model), "not in the model"),
        )
        if n
    )
    return UsageError(
        f"cannot take the weights of {flag}={plan.source.given}: {first} ({counts}; each listed "
        f"above); {fix}"
    )


def _groups(left: dict[str, list[str]]) -> str:
    slots = sorted((k for k in left if k not in _ORDER), key=lambda k: -len(left[k]))
    parts = [f"{len(left[k])} {k}" for k in slots]
    for group in _ORDER:
        names = left.get(group)
        if not names:
            continue
        if group == "step":
            parts.append(", ".join(names))
        elif group == "other":
            parts.append(f"{len(names)} other: {_names(names)}")
        else:
            parts.append(f"{len(names)} {group}")
    return "; ".join(parts)


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" ... and {len(names) - SHOWN} more" if len(names) > SHOWN else "")
