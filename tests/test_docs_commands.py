"""Every `tpurun ...` command the manual shows parses, with tpurun's own parser.

The commands are those of README.md and docs/*.md (tests/manual.py): the lines of
```sh blocks that start with `tpurun` (a `\\` continues a line, `#` starts a
comment) and inline code that starts with `tpurun `. Each goes through
`tpurun.cli.parse_command_line`, the parse `main` does before anything runs: absl's
flags, the config file, its `--config.<key>` overrides and the run config's checks,
in this process, without TensorFlow and without training. So a flag, a config key
or a config renamed in the code and not in the manual fails here, not for a user.

What a page writes for "some value" stands for a value of the flag's type: `...`
(the rest of a command), `[flags]`, `<path>` or an all-capitals word (`N`, `DATA`,
`START,END`) as a value, a flag of inline code named without its value
(`tpurun check --target`), `<command>` (every command). A config file the manual
only names (`--config=my_config.py`) is its own example project (the "Your own
model" page), written into the directory the commands are parsed in.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import manual
import pytest

from tpurun import cli
from tpurun.errors import TpurunError
from tpurun.run_config import flag_table

# Config files the manual names without shipping them, all of them the user's own
# config of its example project (a name not here, and not a real config, fails).
EXAMPLE_CONFIG = "my_project/my_config.py"
NAMED_CONFIGS = frozenset({"my_config.py", "path/to/my_config.py", "X", "<path>"})
# A value for a flag whose placeholder its type does not take.
STAND_INS = {
    "profile_steps": "1,2",
    "checkpoint": "1",
    "target": "v3-8",
    "eval_every": "1",
    "config": EXAMPLE_CONFIG,
}
TYPE_STAND_INS = {"int": "8", "float": "1", "bool": "true"}
_PLACEHOLDER = re.compile(r"^(<[^>]+>|[A-Z][A-Z0-9_]*(,[A-Z][A-Z0-9_]*)*)$")
_ELISIONS = {"...", "…"}


def command_lines(command: manual.ShownCommand) -> list[list[str]]:
    """The argv (without `tpurun`) each shown command stands for, placeholders filled in."""
    words = [w for w in shlex.split(command.text)[1:] if w not in _ELISIONS]
    words = [w for w in words if not re.fullmatch(r"\[[^\]]*\]", w)]  # `[flags]`: usage notation
    filled = [_filled(word, command.inline) for word in words]
    if filled and re.fullmatch(r"<[^>]+>", filled[0]):  # `tpurun <command> --help`
        return [[name, *filled[1:]] for name in cli.COMMAND_HELP]
    return [filled]


def _filled(word: str, inline: bool) -> str:
    if not word.startswith("--") or word.startswith("--config."):
        return word
    name, has_value, value = word[2:].partition("=")
    if name not in cli.FLAGS:
        return word  # the parser says it is unknown
    if name == "config" and value in NAMED_CONFIGS:
        return f"--config={EXAMPLE_CONFIG}"
    kind = cli.FLAGS[name].flag_type()
    if not has_value:
        # A flag named without its value, in prose (`tpurun check --target`'s answer).
        return f"--{name}={_stand_in(name, kind)}" if inline and kind != "bool" else word
    if _PLACEHOLDER.match(value) and kind != "string" or name in STAND_INS and value.isupper():
        return f"--{name}={_stand_in(name, kind)}"
    return word


def _stand_in(name: str, kind: str) -> str:
    if name in STAND_INS:
        return STAND_INS[name]
    if kind == "string enum":
        return cli.FLAGS[name].parser.enum_values[0]
    return TYPE_STAND_INS.get(kind, "x")


def parse_error(command: manual.ShownCommand) -> str | None:
    """Why the command does not parse, or None: through the CLI's real parse, nothing run."""
    for argv in command_lines(command):
        try:
            invocation = cli.parse_command_line(["tpurun", *argv])
        except TpurunError as e:
            return f"{command.where}: `{command.text}`: {e}"
        if invocation.action == "usage" and not argv:
            return (
                f"{command.where}: `{command.text}`: no command (tpurun prints its usage, exit 2)"
            )
    return None


def shown_commands(texts: dict[Path, str] | None = None) -> list[manual.ShownCommand]:
    pages = texts or {page: page.read_text() for page in manual.pages()}
    return [
        command for page, text in pages.items() for command in manual.shown_commands(page, text)
    ]


COMMANDS = shown_commands()


@pytest.fixture
def in_example_project(tmp_path, monkeypatch) -> Path:
    """The manual's example projects in this test's directory, which is the working one."""
    manual.example_project(tmp_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_shown_command_parses(in_example_project, command):
    assert parse_error(command) is None


def test_the_manual_shows_commands_in_its_pages():
    """The check is no check if the reading finds nothing: it finds the front page's tour."""
    where = {c.where.split(":")[0] for c in COMMANDS}
    assert "README.md" in where
    assert len(COMMANDS) >= 20, [c.where for c in COMMANDS]
    texts = {c.text for c in COMMANDS}
    assert "tpurun train --config=iris --use_tpu=false --model_dir=/tmp/iris" in texts


@pytest.mark.parametrize("page", manual.pages(), ids=manual.relative)
def test_no_command_hides_from_the_check(page):
    """Every code block names its language, and commands stand in ```sh blocks."""
    assert manual.misplaced_commands(page) == []


def _with(texts: dict[Path, str], old: str, new: str) -> dict[Path, str]:
    changed = {page: text.replace(old, new) for page, text in texts.items()}
    assert changed != texts, f"the manual shows no {old}"
    return changed


@pytest.mark.parametrize(
    "old, new, error",
    [
        # A flag renamed: the parser knows --train_epochs, not the manual's --epochs.
        ("--train_epochs=", "--epochs=", "unknown flag --epochs (did you mean --train_epochs?)"),
        # A config key renamed: the config has optimizer.learning_rate, not optimizer.lr.
        ("--config.optimizer.learning_rate=", "--config.optimizer.lr=", "optimizer.lr"),
    ],
)
def test_a_renamed_flag_or_key_in_the_manual_fails(in_example_project, old, new, error):
    """The manual's commands against a parser whose name for a flag (or key) is another."""
    pages = {page: page.read_text() for page in manual.pages()}
    renamed = shown_commands(_with(pages, old, new))
    failures = [e for e in map(parse_error, renamed) if e is not None]
    showing = [c for c in renamed if new in c.text]
    assert showing and len(failures) == len(showing), failures
    assert all(error in failure for failure in failures), failures


def test_a_flag_taken_from_a_command_fails(in_example_project, monkeypatch):
    """The code side: `train` no longer takes --eval_every, and the commands showing it fail."""
    monkeypatch.setitem(
        flag_table.COMMAND_FLAGS,
        "train",
        tuple(n for n in flag_table.COMMAND_FLAGS["train"] if n != "eval_every"),
    )
    showing = [
        c for c in COMMANDS if c.text.startswith("tpurun train") and "--eval_every" in c.text
    ]
    assert showing
    for command in showing:
        assert "--eval_every does not apply to `tpurun train`" in (parse_error(command) or "")


PAGE = """\
Train with `tpurun train --config=iris
--batch_size=N ...` or check `tpurun check --target`'s answer.

```sh
tpurun eval --config=iris \\
  --model_dir=gs://BUCKET/iris   # a comment
pip install -e .
```

```console
$ tpurun predict --config=iris --input=DATA
tpurun predict: error: (what it prints)
```

```text
tpurun float32    3159
```
"""


def test_how_a_page_is_read():
    commands = manual.shown_commands(Path("page.md"), PAGE)
    assert [(c.where, c.text, c.inline) for c in commands] == [
        ("page.md:5", "tpurun eval --config=iris --model_dir=gs://BUCKET/iris", False),
        ("page.md:11", "tpurun predict --config=iris --input=DATA", False),
        ("page.md:1", "tpurun train --config=iris --batch_size=N ...", True),
        ("page.md:2", "tpurun check --target", True),
    ]
    assert [command_lines(c) for c in commands] == [
        [["eval", "--config=iris", "--model_dir=gs://BUCKET/iris"]],
        [["predict", "--config=iris", "--input=DATA"]],
        [["train", "--config=iris", "--batch_size=8"]],
        [["check", "--target=v3-8"]],
    ]
    assert manual.misplaced_commands(Path("page.md"), PAGE) == []
    assert manual.misplaced_commands(Path("page.md"), "```\ntpurun eval\n```\n") == [
        "page.md:1: a code block without a language: ```sh for commands, ```text for output, "
        "```python for code"
    ]
    assert manual.misplaced_commands(Path("page.md"), "```text\ntpurun eval --best\n```\n") == [
        "page.md:2: a tpurun command in a ```text block, where it is not checked: make it ```sh "
        "(or ```console, the command after a `$ ` prompt)"
    ]
