"""The model zoo: tiny models this project did not write, built from configs (no downloads).

Every change to capture, cost models, the solver or apply is proven on these, not only on our own GPT.
Each family lives in its own module of this package and registers its factories with `@zoo_model`;
importing the package imports every module, so `ZOO` lists them all:

    from zoo import ZOO, build
    ex = build("hf-bert")            # planner.models.loading.Example: model + example inputs

A factory takes keyword overrides (e.g. `dropout=0.1`) and returns an `Example` built on CPU with fixed
seeds, so two builds are identical. `ZooModel.schemes` lists the uniform schemes its shapes allow on 8
ranks; `ZooModel.requires` names the packages it needs (tests skip when one is missing).
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cost_models.schemes import BASELINE_SCHEMES
from planner.models.loading import Example

__all__ = ["ZooModel", "ZOO", "zoo_model", "build", "available"]

ALL_SCHEMES = BASELINE_SCHEMES


@dataclass(frozen=True)
class ZooModel:
    name: str
    factory: Callable[..., Example]
    description: str
    schemes: tuple[str, ...] = ALL_SCHEMES
    requires: tuple[str, ...] = field(default_factory=tuple)

    def available(self) -> bool:
        return all(importlib.util.find_spec(r) is not None for r in self.requires)


ZOO: dict[str, ZooModel] = {}


def zoo_model(name: str, description: str, *, schemes: tuple[str, ...] = ALL_SCHEMES,
              requires: tuple[str, ...] = ()) -> Callable[[Callable[..., Example]], Callable[..., Example]]:
    """Decorator: register `factory` under `name`."""
    def deco(factory: Callable[..., Example]) -> Callable[..., Example]:
        if name in ZOO:
            raise ValueError(f"zoo model {name!r} registered twice")
        ZOO[name] = ZooModel(name, factory, description, schemes, requires)
        return factory
    return deco


def build(name: str, **overrides: Any) -> Example:
    """Build zoo model `name` (see `ZOO`)."""
    if name not in ZOO:
        raise KeyError(f"no zoo model {name!r}; the zoo has {', '.join(sorted(ZOO))}")
    return ZOO[name].factory(**overrides)


def available() -> list[str]:
    """Names of the zoo models whose required packages are installed."""
    return sorted(n for n, z in ZOO.items() if z.available())


for _m in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_m.name}")
