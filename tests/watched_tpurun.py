"""Runs `tpurun ARGS...` and writes every network address it looks up or connects to.

    python tests/watched_tpurun.py LOG ARGS...

A Python audit hook, set before tpurun runs (and, in a new interpreter, before anything
is imported; forked from tests/forked, after the server's imports of TensorFlow, Keras
and tpurun), writes one line to LOG for each `socket.getaddrinfo` (the host) and
`socket.connect` (the address) of the process: Google's libraries, gcsfs, requests and TFDS all connect through Python
sockets. TensorFlow's own gs:// client (libcurl) does not: tests point it at the
GCS server's proxy, which logs every request it gets.
"""

import sys

_LOG = open(sys.argv[1], "w", buffering=1)  # noqa: SIM115 - open for the whole process


def _watch(event: str, args: tuple) -> None:
    if event == "socket.connect":
        _LOG.write(f"connect {args[1]!r}\n")
    elif event == "socket.getaddrinfo":
        _LOG.write(f"getaddrinfo {args[0]!r}\n")


sys.addaudithook(_watch)
_LOG.write("watching\n")
sys.argv = ["tpurun", *sys.argv[2:]]

from tpurun.cli import run  # noqa: E402 - after the hook: its imports are watched too (if new)

run()
