"""Zoo models built from torch's own layers: a small CNN, an LSTM language model, a TransformerEncoder
classifier. Each exercises layers the planner has no parallel layer for (Conv2d, BatchNorm2d, LSTM,
MultiheadAttention with its fused in-projection), which run whole on each rank ("opaque" ops)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from planner.models.loading import Example
from zoo import zoo_model

_WHOLE = ("replicate", "fsdp", "1d")  # the linears split; the layers run whole


class SmallCNN(nn.Module):
    """Two Conv2d(3x3) + BatchNorm2d + ReLU stages and a linear classifier (cross-entropy)."""

    def __init__(self, channels: int = 16, classes: int = 16, size: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, 2 * channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(2 * channels)
        self.fc = nn.Linear(2 * channels * size * size, classes)

    def forward(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(images)))      # (B, C, H, W)
        x = F.relu(self.bn2(self.conv2(x)))           # (B, 2C, H, W)
        return F.cross_entropy(self.fc(x.flatten(1)), labels)


class LSTMLanguageModel(nn.Module):
    """Embedding -> 2-layer LSTM (batch first) -> vocabulary head (cross-entropy)."""

    def __init__(self, vocab: int = 256, hidden: int = 64, layers: int = 2) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        out, (h, c) = self.lstm(self.emb(ids))        # out (B, T, H); h, c (layers, B, H)
        return F.cross_entropy(self.head(out).flatten(0, 1), targets.flatten())


class EncoderClassifier(nn.Module):
    """Embedding -> torch.nn.TransformerEncoder (post-LN, batch first) -> mean over tokens -> classifier."""

    def __init__(self, vocab: int = 128, d_model: int = 64, heads: int = 4, layers: int = 2, classes: int = 16,
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=2 * d_model, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, classes)

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.encoder(self.emb(ids))               # (B, T, D)
        return F.cross_entropy(self.head(h.mean(dim=1)), labels)


def _seeded(seed: int) -> torch.Generator:
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


@zoo_model("torch-cnn", "Conv2d + BatchNorm2d + Linear classifier on 8x8 images, batch 8", schemes=_WHOLE)
def torch_cnn(seed: int = 0, batch_size: int = 8, **kw: Any) -> Example:
    g = _seeded(seed)
    model = SmallCNN(**kw)
    size = model.fc.in_features // model.conv2.out_channels
    side = int(size ** 0.5)
    images = torch.randn(batch_size, 3, side, side, generator=g)
    labels = torch.randint(0, model.fc.out_features, (batch_size,), generator=g)
    return Example("torch-cnn", model, (images, labels), "small CNN (Conv2d, BatchNorm2d, Linear)")


@zoo_model("torch-lstm-lm", "Embedding + 2-layer nn.LSTM + head, vocab 256, batch 8, seq 16", schemes=_WHOLE)
def torch_lstm_lm(seed: int = 0, batch_size: int = 8, seq_len: int = 16, **kw: Any) -> Example:
    g = _seeded(seed)
    model = LSTMLanguageModel(**kw)
    ids = torch.randint(0, model.emb.num_embeddings, (batch_size, seq_len + 1), generator=g)
    return Example("torch-lstm-lm", model, (ids[:, :-1].contiguous(), ids[:, 1:].contiguous()), "LSTM language model")


@zoo_model("torch-transformer-encoder", "Embedding + nn.TransformerEncoder (2 layers, d 64, 4 heads) classifier",
           schemes=("replicate", "fsdp", "1d", "2d", "3d", "3d_allreduce"))
def torch_transformer_encoder(seed: int = 0, batch_size: int = 8, seq_len: int = 16, **kw: Any) -> Example:
    g = _seeded(seed)
    model = EncoderClassifier(**kw)
    ids = torch.randint(0, model.emb.num_embeddings, (batch_size, seq_len), generator=g)
    labels = torch.randint(0, model.head.out_features, (batch_size,), generator=g)
    return Example("torch-transformer-encoder", model, (ids, labels), "torch.nn.TransformerEncoder classifier")
