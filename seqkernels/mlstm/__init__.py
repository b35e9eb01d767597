"""mLSTM with exponential (mLSTMexp) or sigmoid (mLSTMsig) input gate (paper 002).

``mlstm(q, k, v, i_pre, f_pre, *, input_gate="exp", backend="auto", ...)`` returns the cell's hidden
states *before* the output gate and the norm layer:

* mLSTMexp (eq. 1-8): ``h_t = C_t^T q~_t / (max(|n_t^T q~_t|, exp(-m_t)) + eps)``,
* mLSTMsig (eq. 22-23): ``h_t = C_t^T q~_t``,

with ``q~ = q / sqrt(DQK)``. Shapes: ``q, k (B, NH, S, DQK)``, ``v (B, NH, S, DV)``, gate
pre-activations ``i_pre, f_pre (B, NH, S)``; ``h (B, NH, S, DV)`` in the inputs' dtype.

States: mLSTMexp ``(C (B, NH, DQK, DV), n (B, NH, DQK), m (B, NH))`` in the stabilized form (the
true memory is ``C * exp(m)``); mLSTMsig ``(C,)``. ``initial_state=None`` means zeros (``m0 = 0``).
``return_last_state=True`` returns ``(h, state)``; states are float32 (float64 for float64 inputs).
The max state ``m`` is a stabilizer: gradients never flow through it.

Backends (all compute the same function; vocabulary: ``seqkernels/README.md``): ``"reference"`` (the
stabilized recurrence, ``reference.py``), ``"parallel"`` (the quadratic form, ``reference.py``),
``"torch"`` (chunkwise PyTorch, chunks of ``chunk_size``, ``pytorch.py``), ``"triton"`` (TFLA
chunkwise kernels, forward and backward, ``triton_ops.py``), ``"auto"`` (``triton`` on CUDA
float32 / bfloat16 / float16, else ``torch``).
"""

from __future__ import annotations

import torch

from seqkernels._dispatch import resolve
from seqkernels._triton import triton_importable
from seqkernels.mlstm.pytorch import mlstm_chunkwise
from seqkernels.mlstm.reference import NORMALIZERS, mlstm_parallel, mlstm_recurrent

_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _mlstm_triton(*args, **kwargs):
    from seqkernels.mlstm.triton_ops import mlstm_triton

    return mlstm_triton(*args, **kwargs)


BACKEND_FNS = {"reference": mlstm_recurrent, "parallel": mlstm_parallel, "torch": mlstm_chunkwise}
if triton_importable():
    BACKEND_FNS["triton"] = _mlstm_triton
BACKENDS = ("auto", *BACKEND_FNS)


def resolve_backend(backend: str, q) -> str:
    """The concrete backend ``backend`` (``"auto"`` included) stands for on ``q``."""
    return resolve("mlstm", backend, BACKEND_FNS, q, q.dtype in _TRITON_DTYPES)


def mlstm(
    q,
    k,
    v,
    i_pre,
    f_pre,
    *,
    input_gate="exp",
    backend="auto",
    chunk_size=64,
    initial_state=None,
    return_last_state=False,
    eps=1e-6,
):
    """Run the mLSTM cell over a sequence; see the module docstring for shapes, states and backends."""
    return BACKEND_FNS[resolve_backend(backend, q)](
        q,
        k,
        v,
        i_pre,
        f_pre,
        input_gate=input_gate,
        chunk_size=chunk_size,
        initial_state=initial_state,
        return_last_state=return_last_state,
        eps=eps,
    )


__all__ = [
    "BACKENDS",
    "BACKEND_FNS",
    "NORMALIZERS",
    "mlstm",
    "mlstm_chunkwise",
    "mlstm_parallel",
    "mlstm_recurrent",
    "resolve_backend",
]
