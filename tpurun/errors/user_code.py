"""Where in the user's own code (a model, a config) an error was raised or an op was made.

The user's files are every Python file but tpurun's own (this package), the
standard library's and installed packages': a model module beside a config, or
one of tpurun's shipped models, which are the examples a user starts from.
"""

from __future__ import annotations

import os
import re
import traceback

# The tpurun package (this module is in tpurun/errors/).
_TPURUN_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LIBRARY_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def is_user_file(filename: str) -> bool:
    path = filename if filename.startswith(os.sep) else os.sep + filename
    if any(marker in path for marker in _LIBRARY_MARKERS) or path.startswith(os.sep + "<"):
        return False
    if path.startswith(_TPURUN_ROOT + os.sep) or "/lib/python3" in path:
        return False
    return True


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
    its traceback, else of the trace in its message (an error raised while TensorFlow
    traced the user's code). None when the user's code is not in it."""
    frames = traceback.extract_tb(error.__traceback__) if error.__traceback__ else []
    for frame in reversed(frames):
        if is_user_file(frame.filename):
            return f"{relative(frame.filename)}:{frame.lineno}"
    return in_text(str(getattr(error, "message", None) or error))
