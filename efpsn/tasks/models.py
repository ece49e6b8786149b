"""The paper's two models in float64: logistic regression (7,850 parameters) and DLG's LeNet (13,426)."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LeNet", "LogisticRegression", "count_parameters"]


class LogisticRegression(nn.Module):
    """One linear layer 784 -> 10 on the flattened image; softmax lives in the loss.

    Flat parameter order (model.parameters()): weight (10, 784) row-major, then bias (10,).
    """

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(784, 10, dtype=torch.float64)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(images.reshape(images.shape[0], -1))


class LeNet(nn.Module):
    """LeNet of DLG (Zhu et al., 2019), for 1x28x28 inputs and 10 classes.

    Three 5x5 convolutions with 12 channels, padding 2, strides 2/2/1, each followed by a
    sigmoid (28 -> 14 -> 7 -> 7), then Linear(12*7*7 = 588, 10). Sigmoid rather than ReLU keeps
    the network twice differentiable, which gradient-matching attacks (DLG/iDLG) rely on.
    Parameters: 312 + 3,612 + 3,612 + 5,890 = 13,426; the last two are fc.weight, fc.bias.
    """

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 12, kernel_size=5, padding=2, stride=2, dtype=torch.float64),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2, dtype=torch.float64),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1, dtype=torch.float64),
            nn.Sigmoid(),
        )
        self.fc = nn.Linear(588, 10, dtype=torch.float64)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.body(images)
        return self.fc(features.reshape(features.shape[0], -1))


def count_parameters(model: nn.Module) -> int:
    """Total number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())
