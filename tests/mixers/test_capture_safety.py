"""What a CUDA graph cannot capture, found on the CPU: every registered mixer's PyTorch path runs forward
and backward on the meta device under a dispatch mode that records host synchronisations (``.item()``,
``bool(tensor)``: ``aten._local_scalar_dense``) and host-to-device copies (a tensor made from a Python
scalar and copied in, as ``t[i] = 1.0`` does on CUDA; a copy from a CPU tensor). Such an op works in
eager CUDA code and fails only inside a capture, on a GPU; here it fails in a second on any machine."""

from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mixers.builtin  # noqa: F401  (registers the mixers)
from mixers.build import build_mixer
from mixers.protocol import declared
from mixers.registry import MIXERS

ROOT = Path(__file__).resolve().parents[2]
#: mixers whose capturable path exists only for CUDA tensors: the Newton cells decide per step on the
#: host outside a graph and switch to their in-graph policy on CUDA (tests/experiments/test_cuda_graph.py)
CUDA_ONLY_GRAPH_PATH = {"flashgru", "flashlstm"}


class HostTraffic(TorchDispatchMode):
    """Records the ops a CUDA graph cannot capture, each with the repository line that issued it."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._host_scalars: set[int] = set()

    def _where(self) -> str:
        for frame in reversed(traceback.extract_stack()):
            path = Path(frame.filename)
            if ROOT in path.parents and not {"tests", "site-packages"} & set(path.parts):
                return f"{path.relative_to(ROOT)}:{frame.lineno} {frame.line}"
        return "?"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.found.append(f"host sync (.item()/bool()) at {self._where()}")
        elif func is torch.ops.aten.scalar_tensor.default:
            self._host_scalars.add(id(out))  # on CUDA this scalar is made on the host
        elif func is torch.ops.aten.copy_.default:
            dst, src = args[0], args[1]
            if id(src) in self._host_scalars or (src.device.type == "cpu" and dst.device.type != "cpu"):
                self.found.append(f"host-to-device copy at {self._where()}")
        return out


def _mixers() -> list[str]:
    return [n for n in sorted(MIXERS) if n not in CUDA_ONLY_GRAPH_PATH and not declared(MIXERS[n], "requires_cuda")]


@pytest.mark.parametrize("name", _mixers())
def test_mixer_forward_backward_has_no_host_traffic(name):
    with torch.device("meta"):
        mixer = build_mixer(name, 32).train()
        x = torch.randn(2, 7, 32, requires_grad=True)
    traffic = HostTraffic()
    with traffic:
        y = mixer(x)
        (y[0] if isinstance(y, tuple) else y).float().sum().backward()
    assert not traffic.found, f"{name}: not capturable in a CUDA graph: " + "; ".join(dict.fromkeys(traffic.found))


def test_the_check_finds_a_scalar_assignment_and_an_item():
    """The dispatch mode itself: the two patterns that broke captures on a GPU are found."""
    traffic = HostTraffic()
    with traffic:
        t = torch.zeros(3, device="meta")
        t[0] = 1.0
    assert len(traffic.found) == 1 and traffic.found[0].startswith("host-to-device copy")
    traffic = HostTraffic()
    with traffic, pytest.raises(RuntimeError):  # meta tensors have no value: the sync is recorded first
        torch.ones(1, device="meta").sum().item()
