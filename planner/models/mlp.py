"""A small residual MLP classifier: the simplest model with repeated blocks.

x (batch, dim) -> n_layer x [x + fc2(gelu(fc1(x)))] -> head -> cross-entropy against class targets.
Each block is Linear(dim, hidden) -> GELU -> Linear(hidden, dim) in an nn.ModuleList, so capture finds
`blocks.0`, `blocks.1`, ... as repeated blocks of one class.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

__all__ = ["MLP", "MLPBlock", "build_mlp", "MLP_DEFAULTS"]

# Defaults of the "mlp" example (every size divides by 8, so it runs on 8 ranks).
MLP_DEFAULTS = {"dim": 64, "hidden": 256, "n_layer": 2, "n_classes": 16, "batch_size": 32}


class MLPBlock(nn.Module):
    """dim -> hidden -> GELU -> dim."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class MLP(nn.Module):
    """forward(x, targets) -> mean cross-entropy loss; logits (batch, n_classes) when targets is None."""

    def __init__(self, dim: int, hidden: int, n_layer: int, n_classes: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([MLPBlock(dim, hidden) for _ in range(n_layer)])
        self.head = nn.Linear(dim, n_classes)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)  # (batch, dim)
        logits = self.head(x)  # (batch, n_classes)
        if targets is None:
            return logits
        return F.cross_entropy(logits, targets)


def build_mlp(*, device: str | torch.device = "cpu", seed: int = 0, dtype: torch.dtype = torch.float32,
              **overrides: int) -> tuple[MLP, tuple[torch.Tensor, torch.Tensor]]:
    """The "mlp" example: the model and `(x, targets)`; sizes from MLP_DEFAULTS unless overridden."""
    unknown = sorted(set(overrides) - set(MLP_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown MLP override(s) {unknown}; valid: {sorted(MLP_DEFAULTS)}")
    cfg = {**MLP_DEFAULTS, **overrides}
    device = torch.device(device)
    if device.type != "meta":
        torch.manual_seed(seed)
    with torch.device(device):
        model = MLP(cfg["dim"], cfg["hidden"], cfg["n_layer"], cfg["n_classes"]).to(dtype)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(cfg["batch_size"], cfg["dim"], generator=gen, dtype=dtype)
    targets = torch.randint(0, cfg["n_classes"], (cfg["batch_size"],), generator=gen)
    return model, (x.to(device), targets.to(device))
