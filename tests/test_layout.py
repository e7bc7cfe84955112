"""A model_dir's names, and the time account's fields, are each spelled in one module (issue 54).

Every name tpurun gives a file in a model_dir (`ckpt-<step>` and its files, the
temporaries, `runs/`, `eval/`, `best/`, `train_config.json`, ...) is written only in
`tpurun/layout/names.py`, and every field of a run record's time account only in
`tpurun/layout/time_account.py`: the other modules take them from there. Read from
the code of every module under tpurun/ (its string literals, an f-string with `{}`
for each value it holds): docstrings and comments are prose, and so is a name
shown with a placeholder in a message (`ckpt-N`, `ckpt-<step>`, `results-<split>`).
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpurun.layout import served_input, time_account

REPO = Path(__file__).resolve().parent.parent
NAMES = "tpurun/layout/names.py"
SCHEMA = "tpurun/layout/time_account.py"
SERVED_SCHEMA = "tpurun/layout/served_input.py"  # the record's data_service field

# A name made or matched: the text after it is a value ({}), a pattern (\d, [, (, *, ?)
# or nothing (a name put together); not a placeholder of prose (ckpt-N, ckpt-<step>).
_MADE = r"(?=$|\{\}|[\\(\[*?+])"
# The model_dir's directories, where a literal puts them in a path: after a value ({}/runs)
# or at the start of a path (/runs, eval/, eval_{}); not in a sentence (results go to
# eval/<split>/; eval/predict/export: ...).
_DIRS = r"(?:runs|eval|best|export|damaged|plugins)"
_DIR_IN_A_PATH = (
    rf"\{{\}}/{_DIRS}(?:\b|_\{{\}})"
    rf"|^(?=\S*$)(?:/{_DIRS}(?:\b|_\{{\}})|{_DIRS}(?:/|\{{\}}|_\{{\}}))"
)
LAYOUT = {
    "a checkpoint's name (ckpt-<step>)": rf"(?<![\w-])ckpt-{_MADE}",
    "a checkpoint file's form (.index, .data-, _temp)": r"\.index\b|\.data-|_temp\b",
    "a temporary's name": r"tpurun-tmp",
    "a results file's name": rf"(?<![\w-])results-{_MADE}",
    "a run record's name": r"%Y%m%dT|Z-train|\\d\{8\}T",
    "a file of the model_dir": (
        r"train_config\.json|trainer\.lease|best\.json|\.best\.previous|events\.out\.tfevents"
        r"|write-probe|\.scratch\b"
    ),
    "a directory in a path": _DIR_IN_A_PATH,
    "a directory by itself": r"^(?:runs|damaged)$",
}
# Names that are words of other things too (the eval command, the --best flag, a record's
# "checkpoint" key): spelled as a path's part when a path function is handed them.
JOINED = {"runs", "eval", "best", "export", "damaged", "checkpoint", "plugins"}
PATH_CALLS = {
    "join",
    "make_dir",
    "move_into",
    "glob",
    "exists",
    "isdir",
    "listdir",
    "remove",
    "remove_file",
    "remove_tree",
    "makedirs",
    "rmtree",
}


# Field names that are keys of other records too (best.json's "step", `tpurun check
# --report`'s "steps" and "replicas", a TPU's "kind"): only their dotted names are looked for.
SHARED = {"step", "steps", "seconds", "kind", "replicas", "reason", "device"}


# ...and of the data_service field (config.data.service's key, --eval_every=epoch).
SERVED_SHARED = {"service", "epoch", "step"}


def account_fields(schema=time_account) -> set[str]:
    """Every field name of the time account (of each of its classes), and its record's key;
    or of another schema module's (`served_input`)."""
    classes = [c for c in vars(schema).values() if dataclasses.is_dataclass(c)]
    return {schema.KEY} | {f.name for c in classes for f in dataclasses.fields(c)}


@dataclasses.dataclass(frozen=True)
class Literal:
    text: str  # an f-string's values as {}
    line: int
    call: str | None  # the function it is handed to directly, if any


def literals(source: str) -> Iterator[Literal]:
    """The string literals of a module's code, docstrings left out."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    calls: dict[int, str] = {}
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skipped.add(id(first.value))
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(n) for n in ast.walk(node) if n is not node)
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                calls[id(argument)] = name
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield Literal(node.value, node.lineno, calls.get(id(node)))
        elif isinstance(node, ast.JoinedStr):
            text = "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
            yield Literal(text, node.lineno, calls.get(id(node)))


def layout_spellings(literal: Literal) -> list[str]:
    """What of a model_dir's layout `literal` spells."""
    found = [what for what, pattern in LAYOUT.items() if re.search(pattern, literal.text)]
    if literal.text in JOINED and literal.call in PATH_CALLS:
        found.append(f"a directory handed to {literal.call}()")
    return found


def field_spellings(
    literal: Literal, fields: set[str], key: str = time_account.KEY, shared: set[str] = SHARED
) -> list[str]:
    """The time account's field names `literal` spells (or another schema's, under `key`):
    as a key, or in a field's dotted name (goodput.saves[3].t; not a module's path,
    tpurun.data_service.rpc)."""
    found = [literal.text] if literal.text in fields - shared else []
    for path in re.findall(rf"(?<![\w.]){key}((?:\.\w+(?:\[[^\]]*\])?)+)", literal.text):
        found += re.findall(r"\.(\w+)", path)
    return found


def modules() -> dict[str, str]:
    return {
        str(path.relative_to(REPO)): path.read_text()
        for path in sorted((REPO / "tpurun").rglob("*.py"))
    }


def spelled(check) -> dict[str, list[str]]:
    """module -> `line: literal (what)` of each literal `check` finds something in."""
    found: dict[str, list[str]] = {}
    for module, source in modules().items():
        for literal in literals(source):
            what = check(literal)
            if what:
                found.setdefault(module, []).append(f"{literal.line}: {literal.text!r} {what}")
    return found


def test_a_model_dirs_names_are_spelled_in_the_layout_module_only():
    found = spelled(layout_spellings)
    others = {module: lines for module, lines in found.items() if module != NAMES}
    assert not others, f"spelled outside {NAMES} (use its names): {others}"
    # The checks find what they look for: the layout module spells each kind of name.
    kinds = {what for line in found[NAMES] for what in LAYOUT if what in line}
    assert kinds == set(LAYOUT), set(LAYOUT) - kinds


def test_the_time_accounts_fields_are_spelled_in_its_schema_only():
    fields = {f for f in account_fields()}
    found = spelled(lambda literal: field_spellings(literal, fields))
    others = {module: lines for module, lines in found.items() if module != SCHEMA}
    assert not others, f"spelled outside {SCHEMA} (use its classes): {others}"
    assert {"process_start", "blocking_s", "step_t"} <= fields


def test_the_data_service_fields_are_spelled_in_their_schema_only():
    """The run record's data_service field (a train fed by a tf.data service): its writer
    (tpurun.data_service.job) and its reader (tpurun.report) use served_input's classes."""
    fields = account_fields(served_input)
    found = spelled(
        lambda literal: field_spellings(literal, fields, served_input.KEY, SERVED_SHARED)
    )
    others = {module: lines for module, lines in found.items() if module != SERVED_SCHEMA}
    assert not others, f"spelled outside {SERVED_SCHEMA} (use its classes): {others}"
    assert {"job_name", "input_starts_at", "why_not_epoch"} <= fields
    assert found[SERVED_SCHEMA], "the check finds what it looks for: the schema spells them"


@pytest.mark.parametrize(
    "code",
    [
        'path = f"{model_dir}/ckpt-{step}"',
        'CHECKPOINT = re.compile(r"ckpt-(\\d+)$")',
        'found = tf.io.gfile.glob(model_dir + "/ckpt-*")',
        'index = path + ".index"',
        'temporary = f".{name}.tpurun-tmp-{host}"',
        'results = f"results-{step}.json"',
        'runs = storage.join(model_dir, "runs")',
        'path = os.path.join(model_dir, "eval", split)',
        'summaries = f"eval_{split}"',
        'where = f"{model_dir}/best/{name}"',
        'lease = "trainer.lease"',
        'line = f"resuming from ckpt-{newest}"',
    ],
)
def test_the_layout_check_finds_a_name_spelled_again(code):
    (literal, *_) = [x for x in literals(code) if layout_spellings(x)]
    assert literal


@pytest.mark.parametrize(
    "code",
    [
        'flag = "--checkpoint=ckpt-N or its step N (e.g. --checkpoint=ckpt-300)"',
        'help = "eval --best records its results in best/results-<split>.json."',
        'if run.command == "eval": pass',
        'Flag("best", "bool")',
        'record = {"checkpoint": name}',
        'prefix = f"tpurun-ckpt-{os.getpid()}-"',
        'def f():\n    """Removes ckpt-<step>_temp/ and runs/<time>-train.json."""',
    ],
)
def test_the_layout_check_leaves_prose_and_other_words_alone(code):
    assert not [x for x in literals(code) if layout_spellings(x)]


@pytest.mark.parametrize(
    ("code", "field"),
    [
        ('account["training_start"] = {"t": now}', "training_start"),
        ('g.get("blocking_s")', "blocking_s"),
        ('raise BadField("goodput.saves[0].reached_t", "is late")', "reached_t"),
    ],
)
def test_the_schema_check_finds_a_field_spelled_again(code, field):
    fields = account_fields()
    assert field in {f for x in literals(code) for f in field_spellings(x, fields)}


# --- rooms of a size one reads (issue 54) ------------------------------------------------

MAX_CLASS_LINES = 260
MAX_FUNCTION_LINES = 80
MAX_MODULES_PER_PACKAGE = 12  # a package's own .py files, its __init__ included


def _definitions() -> Iterator[tuple[str, ast.AST]]:
    for path in sorted((REPO / "tpurun").rglob("*.py")):
        where = path.relative_to(REPO).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                yield where, node


def test_no_class_or_function_outgrows_its_room():
    too_long = [
        f"{where}:{node.lineno} {node.name}: {size} lines"
        for where, node in _definitions()
        for size in [node.end_lineno - node.lineno + 1]  # type: ignore[attr-defined]
        if size > (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else MAX_FUNCTION_LINES)
    ]
    assert not too_long, f"split them (classes <= {MAX_CLASS_LINES}, functions <= 80): {too_long}"


def test_no_package_holds_more_than_twelve_modules():
    packages = {path.parent for path in (REPO / "tpurun").rglob("__init__.py")}
    crowded = {
        package.relative_to(REPO).as_posix(): count
        for package in packages
        for count in [len(list(package.glob("*.py")))]
        if count > MAX_MODULES_PER_PACKAGE
    }
    assert not crowded, f"group their modules in sub-packages by role: {crowded}"
