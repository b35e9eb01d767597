"""The backend vocabulary of every kernel family and the one rule that resolves ``backend="auto"``.

Roles (every family names its implementations by these):

- ``"reference"``: the sequential definition, a plain PyTorch loop (``<family>/reference.py``),
  any device and dtype, float64 included;
- ``"torch"``: the fast pure-PyTorch form (log-step, chunked or Newton), autograd backward;
- ``"triton"``: the Triton kernels, forward and backward, as ``torch.library`` custom ops.

A family may add clearly named extras (``mlstm``: ``"parallel"``, the quadratic form;
``fused_rnn``: ``"fused"`` and ``"alternating"``, the two Triton forms ``"triton"`` picks between).

``"auto"``: ``"triton"`` when the family has it and the inputs are CUDA tensors it takes (dtype,
shapes: the family's ``triton_ok``), else ``"torch"`` when the family has it, else ``"reference"``.
The Triton interpreter (``TRITON_INTERPRET=1``) is never picked by ``"auto"``: name ``"triton"``.
"""

from __future__ import annotations

from collections.abc import Collection

AUTO = "auto"


def resolve(family: str, backend: str, available: Collection[str], x, triton_ok: bool = True) -> str:
    """The backend ``backend`` stands for on inputs like ``x`` (a tensor); ``ValueError`` for an
    unknown name. ``available``: the family's backend names; ``triton_ok``: the family takes these
    inputs in its Triton path (dtype, shapes)."""
    if backend == AUTO:
        if "triton" in available and triton_ok and x.is_cuda:
            return "triton"
        return "torch" if "torch" in available else "reference"
    if backend not in available:
        raise ValueError(f"unknown {family} backend {backend!r}; valid: {', '.join([AUTO, *available])}")
    return backend
