"""`tpurun check` fixture: the model in static_batch_model.py (see its docstring)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="check_static_batch")
    config.model_module = "static_batch_model"
    config.train.batch_size = 64  # 8 per replica on 8 replicas
    config.eval.batch_size = 64
    config.predict.batch_size = 64
    return config
