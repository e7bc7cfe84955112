"""`tpurun check` fixture: the model in batch_split_model.py (see its docstring)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="check_batch_split")
    config.model_module = "batch_split_model"
    config.train.batch_size = 60  # 7.5 examples per replica on 8 replicas: an error
    config.eval.batch_size = 64
    config.predict.batch_size = 64
    return config
