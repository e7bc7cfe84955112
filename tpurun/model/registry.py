"""Models by name: `register` makes a Model class a config's `model`, `create` builds the one a config names."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import ml_collections

from tpurun.errors import UsageError
from tpurun.model.interface import Model

_REGISTRY: dict[str, type[Model]] = {}
ModelClass = TypeVar("ModelClass", bound=type[Model])


def register(name: str) -> Callable[[ModelClass], ModelClass]:
    """Class decorator: makes the model available to configs as `config.model = name`."""

    def add(cls: ModelClass) -> ModelClass:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"model name {name!r} is registered twice")
        _REGISTRY[name] = cls
        return cls

    return add


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


def create(config: ml_collections.FrozenConfigDict) -> Model:
    """Imports the model's module if needed and instantiates the registered class."""
    import importlib

    name = config.model
    modules = [config.model_module] if config.get("model_module") else []
    modules.append(f"tpurun.models.{name}")
    for module in modules:
        if name in _REGISTRY:
            break
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is None or not module.startswith(e.name):
                raise  # the module exists but one of its own imports is missing
    if name not in _REGISTRY:
        import pkgutil

        import tpurun.models as shipped  # the models tpurun ships, registered once imported

        for found in pkgutil.iter_modules(shipped.__path__, "tpurun.models."):
            importlib.import_module(found.name)
        raise UsageError(
            f"config.model={name!r} is not a registered model (known: "
            f"{', '.join(registered_names())}); set config.model_module to the module that "
            "registers it"
        )
    return _REGISTRY[name](config)
