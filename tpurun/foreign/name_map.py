r"""The name map: how a model's variables were named in a checkpoint tpurun did not write.

A TF1 program (TPUEstimator's model_fn, `tf.layers`, variable scopes) saved its variables
by name: `conv2d_3/kernel`, `batch_normalization_7/moving_mean`,
`bert/encoder/layer_0/attention/self/query/kernel`. A tpurun model names the same weights
by its Keras layers (`variable.path`: `group1_block1_conv2/kernel`). The name map says
which is which, in the spirit of TPUEstimator's `WarmStartSettings.var_name_to_prev_var_name`
but by rules, so that one line covers every layer of a stack.

Where it lives
--------------
`config.name_map`, a tuple of rules (strings), empty by default. A model's config ships
the map of the program its published checkpoints came from (`configs/resnet50.py`: the
map of tensorflow/tpu's resnet_main.py). A user's own config sets its own, and the
command line replaces it whole (ml_collections' tuple override; raw strings keep `\1`):

    --config.name_map="(r'(.*)/Adam(_1)? -> -', r'^old_head/(kernel|bias)$ -> logits/\1')"

It is read for every checkpoint of the names kind: a TF1 name-based checkpoint
(`model.ckpt-N`, `bert_model.ckpt`), a TPUEstimator model_dir (its `checkpoint` file
names the latest), a TF1 Estimator SavedModel (its `variables/` is name-based); by
`--warm_start_from` (train, check) and `--checkpoint=PATH` (eval, predict, export).
An object-based checkpoint (tpurun's own, any TF2 `tf.train.Checkpoint`, a TF2
SavedModel) is read through the model's structure instead, never through names: a map
given on the command line for one is refused.

A rule
------
    "SOURCE -> TARGET"            the source variables SOURCE matches fill TARGET
    "SOURCE -> TARGET reshape"    the same, the value reshaped to the model variable's
                                  shape (as many values: a [768, 768] TF1 kernel into a
                                  [768, 12, 64] EinsumDense kernel); never transposed
    "SOURCE -> -"                 the source variables SOURCE matches are left out

* SOURCE is a Python regular expression, matched against the WHOLE name of a source
  variable (`re.fullmatch`: `^` and `$` are allowed and change nothing), the name as
  `tf.train.list_variables(path)` prints it.
* TARGET is the model variable's path, as `tpurun check --warm_start_from=PATH` lists
  the model's variables (Keras' `variable.path`, e.g. `logits/kernel`), with SOURCE's
  groups put in by `re.Match.expand`: `\1`, `\g<1>`, `\g<name>`.
* The separator is the last `->` of the rule; spaces around it are ignored.
* Rules are tried in order; the first whose SOURCE matches a name decides it. A name no
  rule matches is left over: reported (optimizer slots by kind, `global_step`, the
  others), never an error.
* A TF1 optimizer's slots need no rule: a slot is `<variable>/<slot>` of another variable
  of the checkpoint (`conv2d/kernel/Momentum`, `.../adam_m`, `.../ExponentialMovingAverage`),
  and one that a broad rule sends to no variable of the model (`bert/(.*) -> \1` sends
  `bert/.../kernel/adam_m` to `.../kernel/adam_m`) is left over as a slot, not refused.
  A rule may still send a slot to a model variable: `(.*)/ExponentialMovingAverage -> \1`
  serves the moving averages (then leave the raw weights out with `SOURCE -> -` rules).

What is refused, each in one line and exit 2, before anything runs: a rule without `->`
or without a TARGET, a SOURCE that does not compile, a map of which no rule matches any
source variable, two source variables sent to one model variable, a TARGET that is not
a variable of the model, a value whose shape or dtype is not the model variable's, and a
model variable that nothing filled, unless `config.train.warm_start_vars` (a regex
searched in the model variable's path) leaves it out.

This module is the format alone, free of TensorFlow (a bad rule fails in milliseconds):
`parse` reads the rules, `NameMap.resolve` sends a checkpoint's names through them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Sequence

from tpurun.errors import UsageError

# The config key that carries the map (config.name_map).
CONFIG_KEY = "name_map"
ARROW = "->"
# A TARGET that leaves its source variables out.
LEAVE_OUT = "-"
# The option after a TARGET: the value is reshaped to the model variable's shape.
RESHAPE = "reshape"


@dataclasses.dataclass(frozen=True)
class Rule:
    """One rule of the map: `text` as the config wrote it, `source` compiled."""

    text: str
    source: re.Pattern[str]
    target: str | None  # None: the source variables it matches are left out
    reshape: bool = False

    def target_of(self, match: re.Match[str]) -> str:
        """The model variable a matched source name fills (the rule's groups put in)."""
        assert self.target is not None
        try:
            return match.expand(self.target)
        except (re.error, IndexError) as e:
            raise UsageError(
                f"config.{CONFIG_KEY} rule {self.text!r}: its target cannot take the groups "
                f"of {match.string!r} ({e}); use \\1 .. \\{self.source.groups} or \\g<name>"
            ) from None


@dataclasses.dataclass(frozen=True)
class Mapping:
    """A checkpoint's names sent through the map (names only: shapes are checked later).

    `taken`: source name -> (model variable path, the rule); `left_out`: source name ->
    the rule that left it out; `left_over`: the names no rule matched, in the source's
    order; `unused_rules`: the rules that matched no name.
    """

    taken: dict[str, tuple[str, Rule]]
    left_out: dict[str, Rule]
    left_over: list[str]
    unused_rules: list[Rule]


@dataclasses.dataclass(frozen=True)
class NameMap:
    """The parsed `config.name_map`: its rules, in order."""

    rules: tuple[Rule, ...]

    def __bool__(self) -> bool:
        return bool(self.rules)

    def resolve(self, source_names: Iterable[str]) -> Mapping:
        """Sends each source name through the first rule that matches it.

        Raises UsageError when no rule matches any name, or when two source names
        would fill one model variable.
        """
        names = list(source_names)
        taken: dict[str, tuple[str, Rule]] = {}
        left_out: dict[str, Rule] = {}
        left_over: list[str] = []
        used: set[int] = set()
        filled_by: dict[str, str] = {}
        for name in names:
            for index, rule in enumerate(self.rules):
                match = rule.source.fullmatch(name)
                if match is None:
                    continue
                used.add(index)
                if rule.target is None:
                    left_out[name] = rule
                    break
                target = rule.target_of(match)
                if target in filled_by:
                    raise UsageError(
                        f"config.{CONFIG_KEY} sends two source variables to {target}: "
                        f"{filled_by[target]} and {name} (rule {rule.text!r}); make the rules "
                        "tell them apart, or leave one out with a rule `SOURCE -> -` before it"
                    )
                filled_by[target] = name
                taken[name] = (target, rule)
                break
            else:
                left_over.append(name)
        if self.rules and not used:
            shown = ", ".join(names[:4]) + (" ..." if len(names) > 4 else "")
            raise UsageError(
                f"config.{CONFIG_KEY} matches none of the {len(names)} source variables "
                f"({shown}); a rule's SOURCE must match a whole name as "
                "tf.train.list_variables prints it"
            )
        unused = [rule for index, rule in enumerate(self.rules) if index not in used]
        return Mapping(taken, left_out, left_over, unused)


def parse(rules: Sequence[str] | str) -> NameMap:
    """Reads config.name_map's rules, or raises UsageError naming the first bad one."""
    if isinstance(rules, str):  # one rule given alone (--config.name_map='a->b')
        rules = (rules,)
    return NameMap(tuple(_rule(text) for text in rules))


# A group a TARGET puts in: \\1 or \\g<1> or \\g<name>.
_GROUP_REFERENCE = re.compile(r"\\(?:(\d+)|g<([^>]*)>)")


def _check_groups(text: str, source: re.Pattern[str], target: str) -> None:
    """Refuses a TARGET that puts in a group its SOURCE does not have (found at parse time,
    not at the first name it would have filled)."""
    for number, name in _GROUP_REFERENCE.findall(target):
        group = number or name
        known = int(group) <= source.groups if group.isdigit() else group in source.groupindex
        if not known:
            raise UsageError(
                f"config.{CONFIG_KEY} rule {text!r}: the target puts in group {group!r}, which "
                f"{source.pattern!r} does not have ({source.groups} groups)"
            )


def _rule(text: object) -> Rule:
    if not isinstance(text, str):
        raise UsageError(
            f"config.{CONFIG_KEY} holds {text!r}, not a rule: each rule is a string "
            "'SOURCE -> TARGET' (or 'SOURCE -> -' to leave SOURCE out)"
        )
    source_text, arrow, target_text = text.rpartition(ARROW)
    source_text, target_words = source_text.strip(), target_text.split()
    if not arrow or not source_text or not target_words:
        raise UsageError(
            f"config.{CONFIG_KEY} rule {text!r} is not 'SOURCE -> TARGET': write e.g. "
            r"'conv2d_(\d+)/kernel -> conv\1/kernel', or 'SOURCE -> -' to leave SOURCE out"
        )
    try:
        source = re.compile(source_text)
    except re.error as e:
        raise UsageError(
            f"config.{CONFIG_KEY} rule {text!r}: {source_text!r} is not a regular expression ({e})"
        ) from None
    target, options = target_words[0], target_words[1:]
    _check_groups(text, source, target)
    if options not in ([], [RESHAPE]) or (options and target == LEAVE_OUT):
        raise UsageError(
            f"config.{CONFIG_KEY} rule {text!r}: after the target only {RESHAPE!r} may "
            f"follow, and not after {LEAVE_OUT!r}; a target is one path without spaces"
        )
    return Rule(
        text=text,
        source=source,
        target=None if target == LEAVE_OUT else target,
        reshape=bool(options),
    )
