"""Shared by the Triton kernel tests.

- ``poison``: inside a test every kernel output buffer starts as NaN, so an element a kernel fails to
  write fails the test. Opt in per module with ``pytestmark = [..., pytest.mark.usefixtures("poison")]``.
- ``graph_grads(f, xs, do)``: ``torch.autograd.grad(f(*xs), xs, do)`` captured in one CUDA graph (after two
  warm-up calls on a side stream) and replayed once; returns the captured gradients.
- ``@pytest.mark.triton``: the test runs Triton kernels: on CUDA, or on the CPU in the interpreter
  (``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` when there is no GPU); skipped otherwise.
"""

import os

import pytest
import torch

from seqkernels._triton import poisoned, triton_importable


def triton_can_run() -> bool:
    return triton_importable() and (torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1")


def pytest_collection_modifyitems(config, items):
    if triton_can_run():
        return
    skip = pytest.mark.skip(reason="needs Triton on CUDA or TRITON_INTERPRET=1")
    for item in items:
        if item.get_closest_marker("triton"):
            item.add_marker(skip)


@pytest.fixture
def poison():
    with poisoned():
        yield


@pytest.fixture
def graph_grads():
    def grads(f, xs, do):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                torch.autograd.grad(f(*xs), xs, do)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = torch.autograd.grad(f(*xs), xs, do)
        graph.replay()
        torch.cuda.synchronize()
        return captured

    return grads
