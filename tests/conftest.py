"""Test-wide settings.

- One CPU thread: the models are tiny; threads only add overhead (and contention on CI's 2 cores).
- Without a GPU, Triton kernels run in the CPU interpreter: ``TRITON_INTERPRET=1`` must be set before
  any kernel module is imported (Triton reads it when a kernel is decorated), so it is set here, before
  collection imports anything. On a GPU machine it is left alone.
"""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _restore_torch_globals():
    """Every test leaves torch's process-wide settings as it found them: the float32 matmul precision
    (``torch.set_float32_matmul_precision``), the default dtype and grad mode."""
    precision, dtype, grad = torch.get_float32_matmul_precision(), torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_float32_matmul_precision(precision)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)


def pytest_collection_modifyitems(items):
    """tests/benchmarks tests the tools that measure the suite (``benchmarks/``): marked ``benchmarks``
    (``-m "not benchmarks"`` leaves them out); they run with the rest of the suite."""
    for item in items:
        if "tests/benchmarks/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.benchmarks)
