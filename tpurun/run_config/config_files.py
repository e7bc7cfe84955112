"""Finding, listing and loading ml_collections config files (no TensorFlow here).

`--config` takes a registered name (`iris`, a file `configs/iris.py` installed
as `tpurun.configs.iris`) or a path to a `.py` file with `get_config()`. Either
may carry an argument for `get_config`: `--config=iris:small`.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.resources
import importlib.util
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections

from tpurun.errors import UsageError, excerpt, user_code

BUILTIN_PACKAGE = "tpurun.configs"


@dataclasses.dataclass(frozen=True)
class ConfigSource:
    """Where a config comes from: `name` also names the default model_dir."""

    name: str
    path: str
    arg: str | None = None

    @property
    def flag_value(self) -> str:
        """The value config_flags expects: the path, with `:arg` when there is one."""
        return self.path if self.arg is None else f"{self.path}:{self.arg}"


def builtin_dir() -> str:
    return str(importlib.resources.files(BUILTIN_PACKAGE))


def builtin_names() -> list[str]:
    names = []
    for entry in sorted(os.listdir(builtin_dir())):
        if entry.endswith(".py") and not entry.startswith("_"):
            names.append(entry[: -len(".py")])
    return names


def resolve(spec: str) -> ConfigSource:
    """Turns the value of --config into a file to load, or raises UsageError."""
    path, _, arg = spec.partition(":")
    arg_or_none = arg if arg else None
    if path.endswith(".py") or os.sep in path:
        if not os.path.isfile(path):
            raise UsageError(
                f"--config={spec}: no such config file {path!r}; pass an existing .py file "
                f"or a registered config ({', '.join(builtin_names())})"
            )
        name = os.path.splitext(os.path.basename(path))[0]
        return ConfigSource(name=name, path=os.path.abspath(path), arg=arg_or_none)
    if path in builtin_names():
        return ConfigSource(
            name=path, path=os.path.join(builtin_dir(), path + ".py"), arg=arg_or_none
        )
    raise UsageError(
        f"--config={spec}: unknown config {path!r}; use one of {', '.join(builtin_names())} "
        "(see `tpurun list`) or a path to a config .py file"
    )


def summary(path: str) -> str:
    """First line of a config file's docstring, read without importing it."""
    with open(path, encoding="utf-8") as f:
        return _summary(ast.parse(f.read(), filename=path))


def _summary(tree: ast.Module) -> str:
    doc = ast.get_docstring(tree) or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no docstring)"


# Directories `local_configs` never looks into: tools' and packages' own files.
_SKIPPED_DIRS = {"__pycache__", "site-packages", "dist-packages", "node_modules"}


def local_configs(root: str = ".") -> list[tuple[str, str]]:
    """Config files a user can pass as --config=<path>, found without importing them.

    The .py files in `root` and its subdirectories (one level, not hidden ones,
    virtualenvs or installed packages) that define a top-level get_config(),
    except tpurun's own configs; as (path relative to root, docstring summary).
    """
    builtin = os.path.realpath(builtin_dir())
    found = []
    for directory in [root, *_subdirectories(root)]:
        if os.path.realpath(directory) == builtin:
            continue
        for entry in _entries(directory):
            if entry.name.endswith(".py") and entry.is_file():
                tree = _config_tree(entry.path)
                if tree is not None:
                    found.append((os.path.relpath(entry.path, root), _summary(tree)))
    return found


def _subdirectories(root: str) -> list[str]:
    subdirectories = []
    for entry in _entries(root):
        if (
            entry.is_dir()
            and not entry.name.startswith(".")
            and entry.name not in _SKIPPED_DIRS
            and not os.path.exists(os.path.join(entry.path, "pyvenv.cfg"))  # a virtualenv
        ):
            subdirectories.append(entry.path)
    return subdirectories


def _entries(directory: str) -> list[os.DirEntry]:
    try:
        return sorted(os.scandir(directory), key=lambda entry: entry.name)
    except OSError:
        return []  # unreadable: nothing to list there


def _config_tree(path: str) -> ast.Module | None:
    """The parsed file if it defines get_config() at the top level, else None."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        if "def get_config" not in text:  # most files: no need to parse them
            return None
        tree = ast.parse(text, filename=path)
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None  # not ours to judge here; `--config=<path>` reports it
    defines = any(
        isinstance(node, ast.FunctionDef) and node.name == "get_config" for node in tree.body
    )
    return tree if defines else None


def load(source: ConfigSource) -> ml_collections.ConfigDict:
    """Imports the config file and calls get_config(), turning failures into UsageError."""
    module_name = f"_tpurun_config_{source.name}"
    spec = importlib.util.spec_from_file_location(module_name, source.path)
    if spec is None or spec.loader is None:
        raise UsageError(f"--config: cannot load {source.path!r} as a Python file")
    module = importlib.util.module_from_spec(spec)
    # A user's config may import modules beside it (its own model, shared settings).
    config_dir = os.path.dirname(source.path)
    if config_dir not in sys.path:
        sys.path.insert(0, config_dir)
    try:
        spec.loader.exec_module(module)
        get_config = getattr(module, "get_config", None)
        if get_config is None:
            raise UsageError(f"config file {source.path} has no get_config() function; add one")
        config = get_config(source.arg) if source.arg is not None else get_config()
    except UsageError:
        raise
    except SystemExit as e:  # sys.exit() in a user's file: the config is wrong, not done
        raise UsageError(
            f"config file {source.path} exited while loading ({exit_text(e)}); a config "
            "file defines get_config() and returns a ConfigDict: remove the exit"
        ) from None
    except Exception as e:  # A user's file: any error is theirs to fix, shown in one line.
        raise UsageError(user_code.config_failure(source.path, e)) from None
    if not isinstance(config, ml_collections.ConfigDict):
        raise UsageError(
            f"get_config() in {source.path} returned {type(config).__name__}; "
            "return an ml_collections.ConfigDict"
        )
    return config


def exit_text(error: SystemExit) -> str:
    """`sys.exit(0)`, `SystemExit('message')`: what the file called, for the line."""
    code = error.code
    return "sys.exit()" if code is None else f"sys.exit({code!r})"


def check_override_keys(config: ml_collections.ConfigDict, argv: Sequence[str]) -> None:
    """Rejects `--config.a.b=v` when `a.b` is not in the config, naming the valid keys.

    config_flags would reject it too, but with a raw AttributeError traceback.
    """
    for arg in argv:
        if not arg.startswith("--config."):
            continue
        dotted = arg[len("--config.") :].split("=", 1)[0]
        node = config
        walked: list[str] = []
        flag = arg.split("=", 1)[0]
        for key in dotted.split("."):
            if not isinstance(node, ml_collections.ConfigDict):
                # Was "known keys there: (not a group)", which does not say what to do.
                where = ".".join(walked)
                raise UsageError(
                    f"{flag}: config key {where} is a value, not a group of keys; "
                    f"set it with --config.{where}=<value>"
                )
            if key not in node:
                where = ".".join(walked) or "the top level"
                raise UsageError(
                    f"{flag}: the config has no key {key!r} at {where}; "
                    f"known keys there: {', '.join(sorted(node.keys()))}"
                )
            node = node[key]
            walked.append(key)


_ELEMENT_KINDS = {bool: "true/false", int: "integers", float: "numbers", str: "texts"}


def check_override_types(defaults: ml_collections.ConfigDict, overrides: Mapping[str, Any]) -> None:
    """Refuses `--config.a.b=v` when `v` is a tuple whose items are not of the kinds of the
    default's items (`--config.hidden_units=abc` for (10, 10)), naming what the key takes.

    config_flags checks a scalar against its default's type, but takes any tuple: the
    model would then fail on the value, in the user's code, after the run started.
    """
    for key, value in overrides.items():
        default: Any = defaults
        for part in key.split("."):
            default = default[part]
        if not (isinstance(default, tuple) and default and isinstance(value, tuple)):
            continue
        kinds = {type(item) for item in default}
        if float in kinds:
            kinds.add(int)  # an integer is a number
        wrong = [item for item in value if type(item) not in kinds]
        if wrong:
            named = {_ELEMENT_KINDS.get(type(item), type(item).__name__) for item in default}
            takes = " or ".join(sorted(named))
            raise UsageError(
                f"--config.{key}: config.{key} holds {takes} (its default: {default!r}), and "
                f'{excerpt(repr(wrong[0]))} is not one; give e.g. --config.{key}="{default!r}"'
            )
