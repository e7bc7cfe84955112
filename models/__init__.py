"""Registered models: `models/<name>.py` registers the model that `configs/<name>.py` selects."""
