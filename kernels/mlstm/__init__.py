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

Backends (all compute the same function): ``"recurrent"`` and ``"parallel"`` (references),
``"chunkwise"`` (PyTorch, chunks of ``chunk_size``), ``"triton"`` (TFLA chunkwise kernels, forward
and backward), ``"auto"`` (triton on CUDA, parallel on the CPU for ``S <= 128``, chunkwise above).
"""

from __future__ import annotations

from kernels._triton import triton_importable
from kernels.mlstm.chunkwise import mlstm_chunkwise
from kernels.mlstm.reference import NORMALIZERS, mlstm_parallel, mlstm_recurrent

BACKENDS = ("auto", "recurrent", "parallel", "chunkwise", "triton")

# On the CPU the quadratic form beats the chunk loop up to a few hundred steps (measured, README, "mLSTM").
CPU_PARALLEL_MAX_LEN = 128


def _triton_fn():
    from kernels.mlstm.triton_chunkwise import mlstm_triton

    return mlstm_triton


def resolve_backend(backend: str, q) -> str:
    """The concrete backend ``"auto"`` picks for ``q`` (or ``backend`` itself, validated)."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown mLSTM backend {backend!r}; choose one of {BACKENDS}")
    if backend != "auto":
        return backend
    if q.is_cuda and triton_importable():
        return "triton"
    return "parallel" if q.shape[-2] <= CPU_PARALLEL_MAX_LEN else "chunkwise"


def mlstm(q, k, v, i_pre, f_pre, *, input_gate="exp", backend="auto", chunk_size=64, initial_state=None,
          return_last_state=False, eps=1e-6):
    """Run the mLSTM cell over a sequence; see the module docstring for shapes, states and backends."""
    fn = {
        "recurrent": mlstm_recurrent,
        "parallel": mlstm_parallel,
        "chunkwise": mlstm_chunkwise,
    }.get(resolve_backend(backend, q)) or _triton_fn()
    return fn(q, k, v, i_pre, f_pre, input_gate=input_gate, chunk_size=chunk_size,
              initial_state=initial_state, return_last_state=return_last_state, eps=eps)


__all__ = ["BACKENDS", "NORMALIZERS", "mlstm", "mlstm_chunkwise", "mlstm_parallel", "mlstm_recurrent",
           "resolve_backend"]
