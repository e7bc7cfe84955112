"""The environment every script's tpurun subprocess runs in: no traffic beyond 127.0.0.1.

Google libraries probe the metadata server and googleapis.com on their own; these
point them at a closed local port (as the Makefile and tests/conftest.py do).
"""

OFFLINE_ENV = {
    "NO_GCE_CHECK": "true",
    "GCE_METADATA_HOST": "127.0.0.1:1",
    "GCE_METADATA_IP": "127.0.0.1:1",
    "GCS_RETRY_CONFIG_MAX_RETRIES": "0",
    "TF_CPP_MIN_LOG_LEVEL": "2",
}
