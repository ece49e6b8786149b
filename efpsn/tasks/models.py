"""Models in float64: logistic regression and DLG's LeNet (the paper's), a linear regression
(ridge's), and a plain MLP."""

from __future__ import annotations

import itertools

import torch
from torch import nn

__all__ = ["MLP", "LeNet", "LinearRegression", "LogisticRegression", "count_parameters"]


class LogisticRegression(nn.Module):
    """One linear layer d -> C on the flattened input (784 -> 10 for MNIST, the paper's 7,850
    parameters); softmax lives in the loss.

    Flat parameter order (model.parameters()): weight (C, d) row-major, then bias (C,).
    """

    def __init__(self, features: int = 784, classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(features, classes, dtype=torch.float64)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(images.reshape(images.shape[0], -1))


class LinearRegression(nn.Module):
    """One linear layer d -> 1 on the flattened input: ridge's model (one number per sample).

    Flat parameter order: weight (1, d), then bias (1,).
    """

    def __init__(self, features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(features, 1, dtype=torch.float64)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.linear(images.reshape(images.shape[0], -1))


class LeNet(nn.Module):
    """LeNet of DLG (Zhu et al., 2019), for 1x28x28 inputs and 10 classes.

    Three 5x5 convolutions with 12 channels, padding 2, strides 2/2/1, each followed by a
    sigmoid (28 -> 14 -> 7 -> 7), then Linear(12*7*7 = 588, 10). Sigmoid rather than ReLU keeps
    the network twice differentiable, which gradient-matching attacks (DLG/iDLG) rely on.
    Parameters: 312 + 3,612 + 3,612 + 5,890 = 13,426; the last two are fc.weight, fc.bias.
    """

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 12, kernel_size=5, padding=2, stride=2, dtype=torch.float64),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=2, dtype=torch.float64),
            nn.Sigmoid(),
            nn.Conv2d(12, 12, kernel_size=5, padding=2, stride=1, dtype=torch.float64),
            nn.Sigmoid(),
        )
        self.fc = nn.Linear(588, classes, dtype=torch.float64)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.body(images)
        return self.fc(features.reshape(features.shape[0], -1))


class MLP(nn.Module):
    """Fully connected d -> H1 -> ... -> C on the flattened input, ReLU between layers."""

    def __init__(self, features: int, hidden: tuple[int, ...], classes: int) -> None:
        super().__init__()
        widths = (features, *hidden)
        layers: list[nn.Module] = []
        for fan_in, fan_out in itertools.pairwise(widths):
            layers += [nn.Linear(fan_in, fan_out, dtype=torch.float64), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], classes, dtype=torch.float64))
        self.layers = nn.Sequential(*layers)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images.reshape(images.shape[0], -1))


def count_parameters(model: nn.Module) -> int:
    """Total number of scalar parameters."""
    return sum(p.numel() for p in model.parameters())
