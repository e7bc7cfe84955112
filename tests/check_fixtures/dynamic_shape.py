"""`tpurun check` fixture: the model in dynamic_shape_model.py (see its docstring)."""

from tpurun import config_defaults


def get_config():
    config = config_defaults.base_config(model="check_dynamic_shape")
    config.model_module = "dynamic_shape_model"
    config.train.batch_size = 64  # 8 per replica on 8 replicas
    config.eval.batch_size = 64
    config.predict.batch_size = 64
    return config
