"""Test-wide settings.

- One CPU thread: the models are tiny; threads only add overhead (and contention on CI's 2 cores).
- Without a GPU, Triton kernels run in the CPU interpreter: ``TRITON_INTERPRET=1`` must be set before
  any kernel module is imported (Triton reads it when a kernel is decorated), so it is set here, before
  collection imports anything. On a GPU machine it is left alone.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)
