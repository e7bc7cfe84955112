"""tpurun.errors.user_code: finding the user's own file:line in a traceback or a traced message."""

from __future__ import annotations

import os
import sys

import pytest

from tpurun.errors import user_code

TPURUN = os.path.dirname(os.path.dirname(os.path.abspath(user_code.__file__)))  # the package


@pytest.mark.parametrize(
    "filename, mine",
    [
        ("/home/me/project/my_model.py", True),
        ("my_model.py", True),  # relative: a file beside the config
        (os.path.join(os.path.dirname(TPURUN), "models", "iris.py"), True),  # a shipped example
        (os.path.join(TPURUN, "train.py"), False),
        ("/venv/lib/python3.11/site-packages/keras/src/layers/layer.py", False),
        ("/usr/lib/python3/dist-packages/numpy/core.py", False),
        (os.path.join(sys.base_prefix, "lib", "python3.11", "json", "decoder.py"), False),
        ("<frozen runpy>", False),
    ],
    ids=["project", "relative", "shipped_model", "tpurun", "site_packages", "dist_packages",
         "stdlib", "frozen"],
)  # fmt: skip
def test_is_user_file(filename, mine):
    assert user_code.is_user_file(filename) is mine


def test_relative_below_the_working_directory_only(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert user_code.relative(str(tmp_path / "project" / "m.py")) == "project/m.py"
    assert user_code.relative("/elsewhere/m.py") == "/elsewhere/m.py"


def test_in_text_is_the_innermost_user_frame_of_a_trace():
    text = (
        "in user code:\n\n"
        '    File "/home/me/project/my_model.py", line 30, in call  *\n'
        '    File "/home/me/project/layers.py", line 12, in culprit  *\n'
        f'    File "{TPURUN}/train.py", line 99, in replica_step\n'
    )
    assert user_code.in_text(text) == "/home/me/project/layers.py:12"
    assert user_code.in_text(f'File "{TPURUN}/train.py", line 99') is None


def raise_here():
    raise ValueError("from the user's code")  # this test file is the user's code here


def test_raised_at_is_the_innermost_user_frame_of_the_traceback():
    with pytest.raises(ValueError) as raised:
        raise_here()
    line = raise_here.__code__.co_firstlineno + 1
    assert user_code.raised_at(raised.value) == f"{user_code.relative(__file__)}:{line}"


def test_raised_at_falls_back_to_the_trace_in_the_message():
    error = ValueError('in user code:\n\n    File "/home/me/m.py", line 7, in call  *\n')
    assert user_code.raised_at(error) == "/home/me/m.py:7"
    assert user_code.raised_at(ValueError("no trace")) is None


def _step_with_a_typo(config):
    """A user's step, as a tf.function traces it, reading a key its config does not have."""
    return config.noise_dims  # the line `raised_at` must name


def traced_error():
    """The error of a tf.function tracing `_step_with_a_typo`: AutoGraph re-raises it,
    its traceback naming AutoGraph's temporary copy of the function."""
    import ml_collections
    import tensorflow as tf

    config = ml_collections.ConfigDict({"noise_dim": 2})
    with pytest.raises(AttributeError) as raised:
        tf.function(lambda: _step_with_a_typo(config))()
    return raised.value


def test_raised_at_maps_autograph_back_to_the_users_file_and_line():
    error = traced_error()
    line = _step_with_a_typo.__code__.co_firstlineno + 2
    assert user_code.raised_at(error) == f"{user_code.relative(__file__)}:{line}"
    assert not user_code.is_user_file("/tmp/__autograph_generated_filea1b2c3.py")


def test_the_message_is_shown_unescaped_on_one_line():
    from tpurun.errors import tf_errors

    message, code = tf_errors.describe(traced_error())
    line = _step_with_a_typo.__code__.co_firstlineno + 2
    assert message == (
        f"AttributeError in your code at {user_code.relative(__file__)}:{line}: 'noise_dims' "
        'Did you mean "noise_dim" instead of "noise_dims"?'
    )
    assert code == 1


@pytest.mark.parametrize(
    "line, shown",
    [
        (
            "AttributeError: '\\'x\\'\\nDid you mean \"y\"?'",
            "AttributeError: 'x' Did you mean \"y\"?",
        ),
        ("'plain key'", "'plain key'"),  # a KeyError's repr without escapes reads well
        ("ValueError: shapes differ", "ValueError: shapes differ"),
    ],
    ids=["escaped", "quoted_key", "plain"],
)
def test_unescaped(line, shown):
    assert user_code.unescaped(line) == shown
