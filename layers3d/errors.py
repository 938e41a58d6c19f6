"""Named errors of the parallel runtime: user mistakes say what was wrong and how to fix it."""

from __future__ import annotations

from cost_models.errors import PlannerError

__all__ = ["ShardingError", "MeshSetupError", "LayerBuildError"]


class ShardingError(PlannerError, ValueError):
    """A tensor or parameter dim that the requested mesh axes do not divide, or a scheme/axes choice that
    does not fit the layer (names the dim, the axes and how to fix it)."""


class MeshSetupError(PlannerError, ValueError):
    """A DeviceMesh that does not match the initialised process group (world size, backend state)."""


class LayerBuildError(PlannerError, ValueError):
    """A planned op that the runtime cannot build a layer for as planned (an unsupported scheme or
    option); the message names the op and what to change."""
