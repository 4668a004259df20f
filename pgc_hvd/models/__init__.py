"""Small models for the simulator and the examples, each a :class:`Task`: a torch module plus
its loss and its evaluation metric.

    task = build_task(name, dataset, seed=0)    # name in MODELS
    task.model                                   # nn.Module (random init, seeded; no downloads)
    task.loss(outputs, y)                        # mean loss over the batch
    task.evaluate(X, y) -> {"loss", "accuracy"} (+ "auc" for binary tasks)

* ``softmax``:  softmax regression, Linear(d, K) on flattened inputs, cross-entropy;
* ``logistic``: logistic regression, Linear(d, 1), binary cross-entropy with logits
  (binary datasets only; the metric adds the ROC AUC);
* ``cnn``:      small CNN for 1x8x8 (digits) or any CxHxW input: two 3x3 conv + ReLU + 2x2
  max-pool blocks (16, 32 channels), then Linear(.., K);
* ``cnn1d``:    1-D CNN for (C, L) sequences (MNIST-1D: (1, 40)), as the MNIST-1D author's
  small CNN (~94% there): three Conv1d + ReLU layers of 32 channels (kernel 5, 3, 3, stride 2,
  'same' padding, so L -> ceil(L/8): 40 -> 5), then Linear(32 * 5, K); 8.1k parameters for
  MNIST-1D, cheap enough for the 2-core simulator;
* ``resnet18``: torchvision ResNet-18, ``weights=None`` (random init), K outputs; the first
  conv adapts to the input channels. Has batch norm, so the simulator evaluates its
  per-partition gradients one partition at a time (no vmap).
* ``zero_init=True`` starts linear models at beta_0 = 0 (the BCGC paper's setting).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np
import torch
from torch import nn
import torch.nn.functional as F


class SoftmaxRegression(nn.Module):
    def __init__(self, d: int, k: int):
        super().__init__()
        self.linear = nn.Linear(d, k)

    def forward(self, x):
        return self.linear(x.flatten(1))


class LogisticRegression(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.linear = nn.Linear(d, 1)

    def forward(self, x):
        return self.linear(x.flatten(1)).squeeze(-1)


class SmallCNN(nn.Module):
    def __init__(self, in_shape=(1, 8, 8), k: int = 10):
        super().__init__()
        c, h, w = in_shape
        self.conv1 = nn.Conv2d(c, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc = nn.Linear(32 * (h // 4) * (w // 4), k)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


class CNN1D(nn.Module):
    """x (N, C, L) -> logits (N, K): conv(k5, s2) -> conv(k3, s2) -> conv(k3, s2), 32 channels,
    ReLU after each, then a linear layer on the flattened (32, ceil(L/8)) features."""

    def __init__(self, in_shape=(1, 40), k: int = 10, width: int = 32):
        super().__init__()
        c, length = in_shape
        self.conv1 = nn.Conv1d(c, width, 5, stride=2, padding=2)
        self.conv2 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        self.conv3 = nn.Conv1d(width, width, 3, stride=2, padding=1)
        for _ in range(3):
            length = (length + 1) // 2
        self.fc = nn.Linear(width * length, k)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.fc(x.flatten(1))


def resnet18(k: int, in_channels: int = 3) -> nn.Module:
    import torchvision
    m = torchvision.models.resnet18(weights=None, num_classes=k)
    if in_channels != 3:
        m.conv1 = nn.Conv2d(in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    return m


@dataclasses.dataclass
class Task:
    name: str
    model: nn.Module
    binary: bool
    supports_vmap: bool = True

    def loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.binary:
            return F.binary_cross_entropy_with_logits(out, y.to(out.dtype))
        return F.cross_entropy(out, y)

    def per_sample_loss(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.binary:
            return F.binary_cross_entropy_with_logits(out, y.to(out.dtype), reduction="none")
        return F.cross_entropy(out, y, reduction="none")

    @torch.no_grad()
    def evaluate(self, X: torch.Tensor, y: torch.Tensor, batch: int = 4096) -> dict:
        was = self.model.training
        self.model.eval()
        outs = torch.cat([self.model(X[i:i + batch]) for i in range(0, len(X), batch)])
        self.model.train(was)
        res = {"loss": float(self.loss(outs, y))}
        if self.binary:
            res["accuracy"] = float(((outs > 0).long() == y).double().mean())
            yy = y.cpu().numpy()
            if 0 < yy.sum() < len(yy):
                from sklearn.metrics import roc_auc_score
                res["auc"] = float(roc_auc_score(yy, outs.double().cpu().numpy()))
        else:
            res["accuracy"] = float((outs.argmax(1) == y).double().mean())
        return res


MODELS = ("softmax", "logistic", "cnn", "cnn1d", "resnet18")


def build_task(name: str, dataset, seed: int = 0, zero_init: bool = False,
               dtype: torch.dtype = torch.float32) -> Task:
    """Model ``name`` sized for ``dataset`` (a :class:`pgc_hvd.data.Dataset`), seeded init."""
    torch.manual_seed(seed)
    k, shape = dataset.num_classes, dataset.feature_shape
    d = int(np.prod(shape))
    if name == "softmax":
        model, binary, vm = SoftmaxRegression(d, k), False, True
    elif name == "logistic":
        if k != 2:
            raise ValueError(f"logistic regression needs a binary dataset, {dataset.name} has {k} classes")
        model, binary, vm = LogisticRegression(d), True, True
    elif name == "cnn":
        if len(shape) != 3:
            raise ValueError(f"cnn needs image inputs (C, H, W), {dataset.name} has shape {shape}")
        model, binary, vm = SmallCNN(shape, k), False, True
    elif name == "cnn1d":
        if len(shape) != 2:
            raise ValueError(f"cnn1d needs sequence inputs (C, L), {dataset.name} has shape "
                             f"{shape}; e.g. dataset mnist1d (1, 40)")
        model, binary, vm = CNN1D(shape, k), False, True
    elif name == "resnet18":
        if len(shape) != 3:
            raise ValueError(f"resnet18 needs image inputs (C, H, W), got {shape}")
        model, binary, vm = resnet18(k, shape[0]), False, False
    else:
        raise KeyError(f"unknown model {name!r}; known: {MODELS}")
    if zero_init:
        with torch.no_grad():
            for p in model.parameters():
                p.zero_()
    return Task(name, model.to(dtype), binary, vm)


def default_model(dataset) -> str:
    return "logistic" if dataset.num_classes == 2 else "softmax"
