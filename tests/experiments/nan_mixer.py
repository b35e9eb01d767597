"""A mixer that makes the loss NaN (for the sweep's failure handling tests)."""

import torch
from torch import nn


class NaNMixer(nn.Module):
    def __init__(self, d_model: int, **_):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        return x * self.scale * float("nan")
