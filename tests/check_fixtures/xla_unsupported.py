"""`tpurun check` fixture: the model in xla_unsupported_model.py (see its docstring)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="check_xla_unsupported")
    config.model_module = "xla_unsupported_model"
    config.train.batch_size = 64  # 8 per replica on 8 replicas
    config.eval.batch_size = 64
    config.predict.batch_size = 64
    return config
