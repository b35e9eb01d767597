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


def pytest_addoption(parser):
    parser.addoption(
        "--benchmarks",
        action="store_true",
        help="also run tests/benchmarks (the measurement tooling's tests: benchmarks/)",
    )


def pytest_collection_modifyitems(config, items):
    """tests/benchmarks tests the tools that measure the suite (``benchmarks/``): marked ``benchmarks`` and
    skipped unless ``--benchmarks`` is given."""
    import pytest

    skip = pytest.mark.skip(reason="measurement tooling (benchmarks/): run with --benchmarks")
    for item in items:
        if "tests/benchmarks/" in item.nodeid.replace("\\", "/"):
            item.add_marker(pytest.mark.benchmarks)
            if not config.getoption("--benchmarks"):
                item.add_marker(skip)
