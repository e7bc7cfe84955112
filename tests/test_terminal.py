"""A clean terminal: TensorFlow's known start-up lines and its Python INFO lines hidden.

The unit tests feed tpurun.cli.terminal real lines of TensorFlow 2.21 (copied from
a CPU machine's terminal) mixed with lines that must stay; the slow ones run
`tpurun train` in a fresh interpreter, on a pipe. (The window hides the same lines
whatever fd 2 is, a pipe or a terminal: it makes fd 2 a pipe of its own. The live
progress line on a pseudo-terminal is test_train_monitors.py's
test_on_a_terminal_a_live_progress_line, in a forked process.)
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import types

import pytest
from absl import logging as absl_logging
from conftest import REPO, assert_ok, run_tpurun

from tpurun.cli import terminal

# What TensorFlow 2.21 prints at start-up on a CPU machine, copied from its output.
NOISE = [
    b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    b"I0000 00:00:1795452628.968456    5525 port.cc:153] oneDNN custom operations are on. You "
    b"may see slightly different numerical results due to floating-point round-off errors from "
    b"different computation orders. To turn them off, set the environment variable "
    b"`TF_ENABLE_ONEDNN_OPTS=0`.",
    b"I0000 00:00:1795452628.968763    5525 cudart_stub.cc:31] Could not find cuda drivers on "
    b"your machine, GPU will not be used.",
    b"E0000 00:00:1795452633.402365    5525 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    b"CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    # Not seen here (no driver on this machine): a driver but no GPU.
    b"E0000 00:00:1795452633.402365    5525 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    b"CUDA error: Failed call to cuInit: CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected",
    # With TF_CPP_MIN_LOG_LEVEL=0:
    b"I0000 00:00:1795452670.767101    6711 cpu_feature_guard.cc:227] This TensorFlow binary is "
    b"optimized to use available CPU instructions in performance-critical operations.",
    b"To enable the following instructions: AVX2 AVX512F AVX512_VNNI AVX512_BF16 FMA, in other "
    b"operations, rebuild TensorFlow with the appropriate compiler flags.",
]
# Lines that must come through: real errors, warnings and crash messages.
OTHERS = [
    b"E0000 00:00:1795452633.402365    5525 cuda_platform.cc:52] failed call to cuInit: INTERNAL: "
    b"CUDA error: Failed call to cuInit: CUDA_ERROR_SYSTEM_DRIVER_MISMATCH: system has "
    b"unsupported display driver / cuda driver combination",
    b"F0000 00:00:1795452633.402365    5525 cpu_feature_guard.cc:95] The TensorFlow library was "
    b"compiled to use AVX instructions, but these aren't available on your machine.",
    b"W0000 00:00:1795452633.402365    5525 port.cc:153] some other notice of port.cc",
    b"/home/me/model.py:3: UserWarning: a warning of the user's",
    b"tpurun train: error: a failure",
    b"Fatal Python error: Aborted",
]


def interleaved() -> tuple[bytes, bytes]:
    """(every noise line with another line after each, what the filter must leave)."""
    others = (OTHERS * 2)[: len(NOISE)]
    text = b"".join(
        noise + b"\n" + other + b"\n" for noise, other in zip(NOISE, others, strict=True)
    )
    kept = b"".join(other + b"\n" for other in others)
    return text + b"a last line without a newline", kept + b"a last line without a newline"


@pytest.mark.parametrize("chunk_size", [1, 7, 100, 1 << 20])
def test_filter_drops_known_lines_and_keeps_others_in_order(chunk_size):
    text, kept = interleaved()
    chunks = [text[i : i + chunk_size] for i in range(0, len(text), chunk_size)]
    assert b"".join(terminal.filter_lines(chunks)) == kept


@pytest.mark.parametrize("index", range(len(terminal.KNOWN_LINES)))
def test_every_known_pattern_matches_a_real_line(index):
    # The list holds only lines seen (or documented): each pattern has its example.
    assert any(re.match(terminal.KNOWN_LINES[index], line) for line in NOISE)


WINDOW_SCRIPT = """
import os, sys
from tpurun.cli import terminal
noise, kept, end = {noise!r}, {kept!r}, {end!r}
with terminal.known_lines_hidden():
    os.write(2, noise[0] + b"\\n" + b"C++ line 1\\n" + noise[1] + b"\\n")
    print("Python line 2", file=sys.stderr)
    os.write(2, noise[2] + b"\\n" + kept + b"\\n")
    if end == "abort":
        os.abort()
    if end == "os._exit":
        os._exit(3)
print("after the window", file=sys.stderr)
"""


@pytest.mark.parametrize("end", ["normal", "os._exit", "abort"])
def test_window_on_fd_2_keeps_order_and_the_last_lines_of_a_dying_process(end):
    # The filter is a process of its own: what a process dying inside the window
    # wrote (TensorFlow's fatal line before abort()) still reaches the terminal.
    fatal = OTHERS[1]
    script = WINDOW_SCRIPT.format(noise=NOISE, kept=fatal, end=end)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, timeout=60
    )
    expected = [b"C++ line 1", b"Python line 2", fatal]
    if end == "normal":
        expected.append(b"after the window")
    assert result.stderr.splitlines() == expected, result.stderr
    assert result.returncode == {"normal": 0, "os._exit": 3, "abort": -6}[end]


TF_DIR = "/venv/site-packages/tensorflow/"
DEPRECATED = "From %s: %s (from %s) is deprecated and will be removed %s.\nInstructions:\n%s"


def record(level: int, path: str, msg: str = "a line", args: tuple = ()) -> logging.LogRecord:
    return logging.LogRecord("absl", level, path, 1, msg, args, None)


def deprecation(caller: str) -> logging.LogRecord:
    args = (f"{caller}:12", "old", "tensorflow.python.x", "in a future version", "use new")
    return record(logging.WARNING, TF_DIR + "python/util/deprecation.py", DEPRECATED, args)


@pytest.fixture
def fake_tensorflow(monkeypatch):
    """`tensorflow` as imported from TF_DIR (nothing is imported)."""
    module = types.SimpleNamespace(__file__=TF_DIR + "__init__.py")
    monkeypatch.setitem(sys.modules, "tensorflow", module)


@pytest.mark.parametrize(
    "line, shown",
    [
        (record(logging.INFO, TF_DIR + "python/checkpoint/functional_saver.py"), False),
        (record(logging.INFO, TF_DIR + "python/distribute/mirrored_strategy.py"), False),
        (record(logging.DEBUG, TF_DIR + "python/eager/context.py"), False),
        (record(logging.WARNING, TF_DIR + "python/eager/context.py"), True),
        (record(logging.ERROR, TF_DIR + "python/eager/context.py"), True),
        (deprecation(TF_DIR + "python/distribute/input_lib.py"), False),
        (deprecation("/home/me/models/my_model.py"), True),
        # The op dispatcher stands in for whoever called the op: maybe the user.
        (deprecation(TF_DIR + "python/util/dispatch.py"), True),
        (record(logging.INFO, str(REPO / "tpurun" / "train.py")), True),
        (record(logging.INFO, "/home/me/models/my_model.py"), True),
    ],
    ids=[
        "tf_info_via_absl",
        "tf_info_via_tf_logger",
        "tf_debug",
        "tf_warning",
        "tf_error",
        "deprecation_by_tf_itself",
        "deprecation_by_user",
        "deprecation_via_dispatch",
        "tpurun_info",
        "model_info",
    ],
)
def test_python_log_filter_hides_tensorflow_info_only(fake_tensorflow, line, shown):
    assert terminal._hide_tensorflow_logs.filter(line) is shown


def test_repeated_calls_switch_the_log_filter(fake_tensorflow):
    # As cli.main run several times in one process: TensorFlow is imported by then.
    handler = absl_logging.get_absl_handler()
    try:
        terminal.quiet_tensorflow(verbose=False)
        terminal.quiet_tensorflow(verbose=False)
        assert handler.filters.count(terminal._hide_tensorflow_logs) == 1
        terminal.quiet_tensorflow(verbose=True)
        assert terminal._hide_tensorflow_logs not in handler.filters
    finally:
        handler.removeFilter(terminal._hide_tensorflow_logs)


# What must not reach the terminal by default (and does with --verbosity=1).
TENSORFLOW_MARKERS = (
    "absl::InitializeLog()",
    "oneDNN custom operations",
    "Could not find cuda drivers",
    "failed call to cuInit",
    "cpu_feature_guard",
    "Sharding callback duration",
)
TRAIN = ("train", "--config=iris", "--use_tpu=false", "--iterations=10")


def tpurun_modules() -> set[str]:
    return {path.name for path in (REPO / "tpurun").rglob("*.py")}


@pytest.mark.slow
def test_train_shows_only_tpurun_lines(tmp_path):
    result = assert_ok(
        run_tpurun(*TRAIN, "--train_steps=20", f"--model_dir={tmp_path / 'model'}", fresh=True)
    )
    for line in result.stderr.splitlines():
        source = re.match(r"[IWEF]\d{4} [\d:.]+ +\d+ ([\w.]+):\d+\] ", line)
        assert line.startswith("tpurun train: ") or (
            source and source.group(1) in tpurun_modules()
        ), f"not a line of tpurun's: {line!r}\n{result.stderr}"
    expected = [
        "Running on 1 CPU replica",
        "Training from step 0 to 20",
        "step 10/20",
        "step 20/20",
        "Saved checkpoint",
    ]
    positions = [result.stderr.find(text) for text in expected]
    assert -1 not in positions and positions == sorted(positions), result.stderr


@pytest.mark.slow
def test_verbosity_1_shows_tensorflow_lines(tmp_path):
    model_dir = tmp_path / "model"
    result = assert_ok(
        run_tpurun(
            *TRAIN, "--train_steps=20", f"--model_dir={model_dir}", "--verbosity=1", fresh=True
        )
    )
    # Twice: libtensorflow_framework and the profiler plugin each link their own absl.
    assert result.stderr.count(TENSORFLOW_MARKERS[0]) == 2, result.stderr
    assert TENSORFLOW_MARKERS[-1] in result.stderr, result.stderr
