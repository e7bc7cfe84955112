"""The manual (README.md, the front page, and the pages of docs/) as the tests read it.

* `example_project(directory)`: a user's own project as a page shows it (the
  "Your own model" page's `# my_project/<file>.py` code blocks), written to disk;
* `shown_commands(path)`: every `tpurun ...` command a page shows, for
  tests/test_docs_commands.py to parse.

Pages are Markdown: code blocks are fenced with ``` and name what they hold
(```sh: commands a user types, ```text: what a run prints, ```python: code).
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHELL_BLOCKS = frozenset({"sh", "bash", "shell", "console"})
# How a line that is a tpurun command starts (`$ ` as a prompt is allowed), told
# from the output of one (`tpurun train: error: ...`, a benchmark's `tpurun float32 ...`).
# Such a line outside a shell block would not be checked: an error.
COMMAND_START = re.compile(r"^\s*(\$\s+)?tpurun\s+(train|eval|predict|export|check|list)(\s|$)")
_FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([^`\s]*)")
# An inline code span: a run of backticks, the text (no blank line inside), the same run.
_CODE_SPAN = re.compile(r"(?<!`)(`+)(?!`)((?:(?!\n[ \t]*\n).)+?)(?<!`)\1(?!`)", re.DOTALL)


def pages() -> list[Path]:
    """README.md and every page of docs/, in a stable order."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def relative(path: Path) -> str:
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


@dataclasses.dataclass(frozen=True)
class CodeBlock:
    """A fenced code block: its language (the info string's first word, "" if none)."""

    language: str
    text: str
    line: int  # of its first line of code, 1-based


@dataclasses.dataclass(frozen=True)
class ShownCommand:
    """A `tpurun ...` command as a page shows it."""

    where: str  # "docs/checkpoints.md:42"
    text: str  # continuation lines joined, comments dropped
    inline: bool  # in inline code (`tpurun eval --best`), not in a ```sh block


def code_blocks(markdown: str) -> tuple[list[CodeBlock], str]:
    """The fenced code blocks, and the rest of the text with each block's lines blanked.

    The rest keeps its line count, so a match in it has the line number it has in
    the page.
    """
    blocks: list[CodeBlock] = []
    rest: list[str] = []
    lines = markdown.split("\n")
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            rest.append(lines[i])
            i += 1
            continue
        fence = opening.group(1)
        closing = re.compile(rf"^\s*{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        end = i + 1
        while end < len(lines) and not closing.match(lines[end]):
            end += 1
        blocks.append(CodeBlock(opening.group(2).lower(), "\n".join(lines[i + 1 : end]), i + 2))
        rest.extend([""] * (min(end, len(lines) - 1) - i + 1))
        i = end + 1
    return blocks, "\n".join(rest)


def shown_commands(path: Path, markdown: str | None = None) -> list[ShownCommand]:
    """Every `tpurun` command of a page: the ```sh blocks' lines and the inline code."""
    if markdown is None:
        markdown = path.read_text()
    name = relative(path)
    blocks, prose = code_blocks(markdown)
    commands = []
    for block in blocks:
        if block.language in SHELL_BLOCKS:
            for line, text in _shell_lines(block):
                if text.split(None, 1)[:1] == ["tpurun"]:
                    commands.append(ShownCommand(f"{name}:{line}", text, inline=False))
    for match in _CODE_SPAN.finditer(prose):
        text = " ".join(match.group(2).split())
        # A command, not what one prints (`tpurun train: error: ...`).
        if text.startswith("tpurun ") and not re.match(r"tpurun \S+:(\s|$)", text):
            line = prose.count("\n", 0, match.start()) + 1
            commands.append(ShownCommand(f"{name}:{line}", text, inline=True))
    return commands


def misplaced_commands(path: Path, markdown: str | None = None) -> list[str]:
    """What would hide a command from the check: a block without a language, or a
    command in a block that is not ```sh. One line each, with where."""
    if markdown is None:
        markdown = path.read_text()
    name = relative(path)
    problems = []
    for block in code_blocks(markdown)[0]:
        if not block.language:
            problems.append(
                f"{name}:{block.line - 1}: a code block without a language: ```sh for "
                "commands, ```text for output, ```python for code"
            )
        elif block.language not in SHELL_BLOCKS:
            for offset, line in enumerate(block.text.split("\n")):
                if block.language != "python" and COMMAND_START.match(line):
                    problems.append(
                        f"{name}:{block.line + offset}: a tpurun command in a "
                        f"```{block.language} block, where it is not checked: make it ```sh "
                        "(or ```console, the command after a `$ ` prompt)"
                    )
    return problems


def _shell_lines(block: CodeBlock) -> Iterator[tuple[int, str]]:
    """A shell block's commands: `\\` continues a line, `#` starts a comment.

    In a ```console block only the lines after a `$ ` prompt are commands (the
    others are what they print); in ```sh every line is.
    """
    lines = block.text.split("\n")
    i = 0
    while i < len(lines):
        first, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i]
        i += 1
        prompt = re.match(r"^\s*\$\s+", text)
        if block.language == "console" and not prompt:
            continue
        text = text[prompt.end() :] if prompt else text
        try:
            words = shlex.split(text, comments=True)
        except ValueError:  # unbalanced quotes: not a command line (a shell check would say so)
            words = text.split()
        if words:
            yield block.line + first, shlex.join(words)


def example_project(directory: Path, project: str | None = None) -> Path:
    """Writes the manual's `# <project>/<file>.py` code blocks below `directory`; returns it.

    The files of a user's own project that a page shows whole (`my_project/`: a
    model and its config), so the tests run the example as the manual shows it.
    Without `project`, every such project of the manual (each `my_*/` directory).
    """
    name_pattern = re.escape(project) if project else r"my_\w+"
    files = {}
    for page in pages():
        for block in code_blocks(page.read_text())[0]:
            match = re.match(rf"# ({name_pattern}/\w+\.py)\n", block.text)
            if block.language == "python" and match:
                files[match.group(1)] = block.text[match.end() :] + "\n"
    assert files, f"no `# {project or 'my_*'}/<file>.py` code block in the manual"
    for name, code in files.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(code)
    return directory
