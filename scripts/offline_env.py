"""The environment every script's tpurun subprocess runs in: no traffic beyond 127.0.0.1.

Google libraries probe the metadata server and googleapis.com on their own; these
point them at a closed local port (as the Makefile and tests/conftest.py do).
Servers the scripts and tests start (worker clusters, fakes) take ports from
`free_local_ports`.
"""

import socket

OFFLINE_ENV = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:1",
    "GCE_METADATA_IP": "127.0.0.1:1",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}


def free_local_ports(count: int) -> list[int]:
    """`count` distinct ports on 127.0.0.1 that nothing listens on right now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()
