"""Test-wide settings: one CPU thread (the models are tiny; threads only add overhead)."""

import torch

torch.set_num_threads(1)
