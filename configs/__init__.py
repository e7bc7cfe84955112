"""Registered configs: `configs/<name>.py` with `get_config()`, selected by `--config=<name>`."""
