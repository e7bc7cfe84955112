"""Where in the user's own code (a model, a config) an error was raised or an op was made.

The user's files are every Python file but tpurun's own (this package), the
standard library's and installed packages': a model module beside a config, or
one of tpurun's shipped models, which are the examples a user starts from. Not
AutoGraph's: a `train_step` traced into a tf.function runs as a converted copy,
a temporary `__autograph_generated_file*.py`; an error raised in it carries
AutoGraph's map back to the user's file and line (`ag_error_metadata`), which is
read first.
"""

from __future__ import annotations

import ast
import linecache
import os
import re
import traceback

# The tpurun package (this module is in tpurun/errors/).
_TPURUN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
# The temporary module AutoGraph writes a converted function to (its pyct/loader.py).
_AUTOGRAPH_FILE = "__autograph_generated_file"


def is_user_file(filename: str) -> bool:
    path = filename if filename.startswith(os.sep) else os.sep + filename
    if any(marker in path for marker in _LIBRARY_MARKERS) or path.startswith(os.sep + "<"):
        return False
    if path.startswith(_TPURUN_ROOT + os.sep) or "/lib/python3" in path:
        return False
    return not os.path.basename(path).startswith(_AUTOGRAPH_FILE)


def relative(path: str) -> str:
    """`path` relative to the working directory when it is below it, else as is."""
    try:
        shown = os.path.relpath(path)
    except ValueError:
        return path
    return shown if not shown.startswith("..") else path


def in_text(text: str) -> str | None:
    """file:line of the innermost user frame of a trace written into a message (autograph's
    "in user code:", XLA's "The op is created at:")."""
    for filename, line in reversed(_FRAME.findall(text)):
        if is_user_file(filename):
            return f"{relative(filename)}:{line}"
    return None


def raised_at(error: BaseException) -> str | None:
    """file:line in the user's code where `error` was raised: the innermost user frame of
    AutoGraph's map (an error raised while a tf.function traced the user's code), else of
    its traceback, else of the trace in its message. None when the user's code is not in
    it."""
    mapped = autograph_frame(error)
    if mapped is not None:
        return mapped
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return f"{relative(frame.filename)}:{frame.lineno}"
    return in_text(str(getattr(error, "message", None) or error))


def autograph_frame(error: BaseException) -> str | None:
    """file:line of the innermost user frame AutoGraph mapped `error` back to, if it did.

    AutoGraph attaches `ag_error_metadata` to an error raised in converted code: its
    `translated_stack` holds the frames of the user's source, innermost first (the
    traceback itself names the temporary files). Read defensively: it is not a public
    API, and without it the traceback and the message are read instead.
    """
    metadata = getattr(error, "ag_error_metadata", None)
    for frame in getattr(metadata, "translated_stack", None) or ():
        filename, line = getattr(frame, "filename", None), getattr(frame, "lineno", None)
        if isinstance(filename, str) and isinstance(line, int) and is_user_file(filename):
            return f"{relative(filename)}:{line}"
    return None


# "Kind: 'text'" where the text is a Python string's repr: AutoGraph formats the error it
# re-raises as f"{type}: {error}", and str() of a KeyError (or of an AttributeError
# holding one: ml_collections' "no such key, did you mean ...") is the repr of its
# message, escapes and all.
_QUOTED = re.compile(r"^(?P<kind>(?:\w+\.)*\w+: )?(?P<text>(?P<q>['\"]).*(?P=q))$")


def unescaped(line: str) -> str:
    """`line` with a quoted, escaped message turned back into its text, on one line:
    `AttributeError: '\\'noise_dims\\'\\nDid you mean ...'` -> `AttributeError: 'noise_dims'
    Did you mean ...`. Any other line is returned as it is."""
    match = _QUOTED.match(line)
    if match is None or "\\" not in match["text"]:
        return line  # a plain 'key' of a KeyError reads well quoted
    try:
        text = ast.literal_eval(match["text"])
    except (ValueError, SyntaxError):
        return line
    if not isinstance(text, str):
        return line
    return (match["kind"] or "") + " ".join(text.split())


def config_failure(path: str, error: BaseException) -> str:
    """The one line for a config file whose loading raised `error`: what, where (its line
    and code), and for the usual slip, a key set in a section the config does not have
    (`config.data.train_examples = N` without a `config.data`), how to add the section."""
    kind = type(error).__name__
    message = unescaped(" ".join(str(error).split())) or kind
    line = next(
        (
            f.lineno
            for f in reversed(traceback.extract_tb(error.__traceback__))
            if f.filename == path
        ),
        None,
    )
    if not line:
        return f"config file {path} failed to load: {kind}: {message}"
    code = linecache.getline(path, line).strip()
    at = f"at line {line}" + (f" (`{code}`)" if code else "")
    key = _missing_key(error)
    section = re.search(rf"([\w.]+)\.{re.escape(key)}\.\w", code) if key else None
    if section is None:
        return f"config file {path} failed to load {at}: {kind}: {message}"
    parent = section.group(1)
    return (
        f"config file {path} failed to load {at}: {parent} has no section {key!r}; add it "
        f"before setting its keys: `{parent}.{key} = ml_collections.ConfigDict()`"
    )


def _missing_key(error: BaseException) -> str | None:
    """The key an ml_collections ConfigDict did not have: it raises AttributeError(KeyError)."""
    cause = error.args[0] if isinstance(error, AttributeError) and error.args else None
    if not isinstance(cause, KeyError) or not cause.args or not isinstance(cause.args[0], str):
        return None
    first = cause.args[0].splitlines()[0] if cause.args[0] else ""
    return first.strip("'\"") or None
