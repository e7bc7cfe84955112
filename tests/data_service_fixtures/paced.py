"""A tiny model for the tf.data service's tests: its input counts and paces (paced_model.py)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="service_paced")
    config.model_module = "paced_model"
    config.examples = 64  # ids 0..63, one epoch
    # Milliseconds each training batch waits on the worker that makes it (0 = none): a run
    # that lasts without burning CPU.
    config.pace_ms = 0
    # Epochs input_fn(train) makes before it ends (0 = endless, as training wants).
    config.input_epochs = 0
    # Python inside the pipeline, which the service cannot run: "", "py_function",
    # "numpy_function" or "from_generator".
    config.python = ""
    config.train.batch_size = 8
    config.train.steps = 40
    config.train.iterations = 10
    config.eval.batch_size = 8
    config.predict.batch_size = 8
    config.data.train_examples = 64
    return config
