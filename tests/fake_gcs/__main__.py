"""The server process: fake-gcs-server and the proxy in front of it, until standard input closes.

    python -m fake_gcs --cert=host.pem --key=host-key.pem --log=fake-gcs-server.log

server.py starts it with tests/ and the repository on PYTHONPATH, reads the one
line it prints ('<proxy port> <emulator port>'), and stops it by closing its
standard input; if the test process dies, the input closes all the same. Either
way the emulator is stopped here, and dies with this process if it is killed.
"""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from fake_gcs import certs
from fake_gcs.emulator import Emulator
from fake_gcs.proxy import StorageProxy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert", type=Path, required=True, help="host certificate (PEM)")
    parser.add_argument("--key", type=Path, required=True, help="its private key (PEM)")
    parser.add_argument("--log", type=Path, required=True, help="the emulator's log")
    args = parser.parse_args()
    emulator = Emulator(log_path=args.log)
    emulator.start()  # before any thread starts: see emulator.py
    try:
        proxy = StorageProxy(
            ssl_context=certs.server_context(args.cert, args.key), emulator_port=emulator.port
        )
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        print(proxy.port, emulator.port, flush=True)
        sys.stdin.read()  # until server.py closes it, or its process dies
    finally:
        emulator.stop()


if __name__ == "__main__":
    main()
