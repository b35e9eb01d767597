"""mLSTM references: the stabilized recurrent form and the fully parallel (quadratic) form.

Paper 002: mLSTMexp eq. 1-8 (recurrent) and App. B.1 (parallel); mLSTMsig eq. 22-24.
Both functions take the same arguments and compute the same function; gradients come from autograd.

Shapes: ``q, k (B, NH, S, DQK)``, ``v (B, NH, S, DV)``, gate pre-activations ``i_pre, f_pre
(B, NH, S)``. The result ``h (B, NH, S, DV)`` is the cell output *before* the output gate and the
norm layer (eq. 4 / eq. 23), with ``q`` scaled by ``1/sqrt(DQK)``.

States (see ``seqkernels/mlstm/__init__.py``): mLSTMexp carries ``(C (B, NH, DQK, DV), n (B, NH, DQK),
m (B, NH))`` in the stabilized form (the true memory is ``C * exp(m)``); ``initial_state=None``
means zeros (``m0 = 0``). mLSTMsig carries ``(C,)`` only.

The max state ``m`` is a stabilizer only: it is treated as a constant for differentiation (as in
every mLSTM kernel), so gradients never flow through it.

Normalizers (App. D.2; ``normalizer=``), applied to the normalizer dot product ``d_t = n_t^T q_t``:
  * ``"max_exp_m"``: ``max(|d_t|, exp(-m_t))`` (the mLSTMexp default, eq. 4; for mLSTMsig,
    whose max state is 0, this is ``max(|d_t|, 1)``: "bounded by 1", Fig. 7b),
  * ``"max_one"``: ``max(|d_t|, 1)`` on the stabilized quantities (no max-state correction),
  * ``"abs"``: ``|d_t|`` (no lower bound),
  * ``"none"``: 1 (no normalizer; the mLSTMsig default, eq. 23).
``h = numerator / (normalizer + eps)`` whenever a normalizer is used; ``eps`` is unused by ``"none"``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

INPUT_GATES = ("exp", "sig")
NORMALIZERS = ("max_exp_m", "max_one", "abs", "none")


def default_normalizer(input_gate: str) -> str:
    return "max_exp_m" if input_gate == "exp" else "none"


def check_args(q, k, v, i_pre, f_pre, input_gate, initial_state, normalizer=None):
    """Shape/dtype checks shared by every backend; returns ``(B, NH, S, DQK, DV)``."""
    if input_gate not in INPUT_GATES:
        raise ValueError(f"input_gate must be one of {INPUT_GATES}, got {input_gate!r}")
    if normalizer is not None and normalizer not in NORMALIZERS:
        raise ValueError(f"normalizer must be one of {NORMALIZERS} or None, got {normalizer!r}")
    for name, t in (("q", q), ("k", k), ("v", v), ("i_pre", i_pre), ("f_pre", f_pre)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be floating point, got {t.dtype}")
    if q.dim() != 4:
        raise ValueError(f"q must have shape (B, NH, S, DQK), got {tuple(q.shape)}")
    B, NH, S, DQK = q.shape
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {tuple(q.shape)}, got {tuple(k.shape)}")
    if v.dim() != 4 or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must have shape ({B}, {NH}, {S}, DV), got {tuple(v.shape)}")
    for name, t in (("i_pre", i_pre), ("f_pre", f_pre)):
        if t.shape != q.shape[:3]:
            raise ValueError(f"{name} must have shape {(B, NH, S)}, got {tuple(t.shape)}")
    if S == 0 or DQK == 0 or v.shape[3] == 0:
        raise ValueError(f"empty input: q {tuple(q.shape)}, v {tuple(v.shape)}")
    devices = {t.device for t in (q, k, v, i_pre, f_pre)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(map(str, devices))}")
    DV = v.shape[3]
    if initial_state is not None:
        want = [(B, NH, DQK, DV), (B, NH, DQK), (B, NH)] if input_gate == "exp" else [(B, NH, DQK, DV)]
        names = ("C0", "n0", "m0")
        if not isinstance(initial_state, (tuple, list)) or len(initial_state) != len(want):
            form = "(C0, n0, m0)" if input_gate == "exp" else "(C0,)"
            raise ValueError(f"initial_state for input_gate={input_gate!r} must be a tuple {form}")
        for name, t, shape in zip(names, initial_state, want):
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(f"initial state {name} must have shape {shape}, got {got}")
            if t.device != q.device:
                raise ValueError(f"initial state {name} is on {t.device}, inputs on {q.device}")
    return B, NH, S, DQK, DV


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def log_gates(i_pre, f_pre, input_gate):
    """Log input and forget gates: ``(i_pre or logsigmoid(i_pre), logsigmoid(f_pre))``."""
    log_i = i_pre if input_gate == "exp" else F.logsigmoid(i_pre)
    return log_i, F.logsigmoid(f_pre)


def _initial(initial_state, input_gate, B, NH, DQK, DV, dtype, device):
    if initial_state is None:
        zeros = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        return zeros(B, NH, DQK, DV), zeros(B, NH, DQK), zeros(B, NH)
    if input_gate == "exp":
        return tuple(t.to(dtype) for t in initial_state)
    C0 = initial_state[0].to(dtype)
    return C0, torch.zeros(B, NH, DQK, dtype=dtype, device=device), torch.zeros(B, NH, dtype=dtype, device=device)


def _normalize(num, dot, m, normalizer, eps):
    """``num / (normalizer(dot, m) + eps)``; ``dot`` and ``m`` have ``num``'s shape without the last dim."""
    if normalizer == "none":
        return num
    if normalizer == "max_exp_m":
        den = torch.maximum(dot.abs(), torch.exp(-m))
    elif normalizer == "max_one":
        den = torch.clamp(dot.abs(), min=1.0)
    else:  # "abs"
        den = dot.abs()
    return num / (den + eps)[..., None]


def _finish(h, state, dtype, return_last_state, input_gate):
    h = h.to(dtype)
    if not return_last_state:
        return h
    C, n, m = state
    sdtype = compute_dtype(dtype)
    if input_gate == "exp":
        return h, (C.to(sdtype), n.to(sdtype), m.to(sdtype))
    return h, (C.to(sdtype),)


def _prepare(q, k, v, i_pre, f_pre, input_gate, initial_state, normalizer):
    """Checked shapes, the normalizer, the output and compute dtypes, and ``q, k, v, log i, log f`` in
    the compute dtype (shared by both references)."""
    shape = check_args(q, k, v, i_pre, f_pre, input_gate, initial_state, normalizer)
    normalizer = normalizer or default_normalizer(input_gate)
    if input_gate == "sig" and initial_state is not None and normalizer != "none":
        raise ValueError("an mLSTMsig initial state carries no normalizer state; use normalizer='none'")
    dt = compute_dtype(q.dtype)
    log_i, log_f = log_gates(i_pre.to(dt), f_pre.to(dt), input_gate)
    return shape, normalizer, q.dtype, dt, (q.to(dt), k.to(dt), v.to(dt), log_i, log_f)


def mlstm_recurrent(
    q,
    k,
    v,
    i_pre,
    f_pre,
    *,
    input_gate="exp",
    chunk_size=64,
    initial_state=None,
    return_last_state=False,
    eps=1e-6,
    normalizer=None,
):
    """Step-by-step mLSTM (paper 002 eq. 1-8, or 22-24 for ``input_gate="sig"``).

    ``chunk_size`` is accepted for a uniform signature and ignored.
    """
    (B, NH, S, DQK, DV), normalizer, out_dtype, dt, (q, k, v, log_i, log_f) = _prepare(
        q, k, v, i_pre, f_pre, input_gate, initial_state, normalizer
    )
    C, n, m = _initial(initial_state, input_gate, B, NH, DQK, DV, dt, q.device)
    scale = 1.0 / math.sqrt(DQK)
    hs = []
    for t in range(S):
        if input_gate == "exp":
            m_new = torch.maximum(log_f[..., t] + m, log_i[..., t]).detach()  # eq. 1
        else:
            m_new = torch.zeros_like(m)
        f_t = torch.exp(log_f[..., t] + m - m_new)  # eq. 6
        i_t = torch.exp(log_i[..., t] - m_new)  # eq. 7
        kt, vt, qt = k[:, :, t], v[:, :, t], q[:, :, t] * scale
        C = f_t[..., None, None] * C + i_t[..., None, None] * kt[..., :, None] * vt[..., None, :]  # eq. 2
        n = f_t[..., None] * n + i_t[..., None] * kt  # eq. 3
        m = m_new
        num = torch.einsum("bhkv,bhk->bhv", C, qt)
        dot = (n * qt).sum(-1)
        hs.append(_normalize(num, dot, m, normalizer, eps))  # eq. 4
    return _finish(torch.stack(hs, dim=2), (C, n, m), out_dtype, return_last_state, input_gate)


def mlstm_parallel(
    q,
    k,
    v,
    i_pre,
    f_pre,
    *,
    input_gate="exp",
    chunk_size=64,
    initial_state=None,
    return_last_state=False,
    eps=1e-6,
    normalizer=None,
):
    """All steps at once with the (S, S) gate matrix (paper 002 App. B.1, eq. 27-35).

    The initial state enters as an extra "time step 0" whose log weight at step ``t`` is
    ``sum_{s<=t} log f_s + m0``. ``chunk_size`` is accepted for a uniform signature and ignored.
    """
    (B, NH, S, DQK, DV), normalizer, out_dtype, dt, (q, k, v, log_i, log_f) = _prepare(
        q, k, v, i_pre, f_pre, input_gate, initial_state, normalizer
    )
    C0, n0, m0 = _initial(initial_state, input_gate, B, NH, DQK, DV, dt, q.device)
    cum_f = torch.cumsum(log_f, dim=-1)  # (B, NH, S): sum_{s<=t} log f_s
    causal = torch.ones(S, S, dtype=torch.bool, device=q.device).tril()
    # log D_tj = sum_{s=j+1..t} log f_s + log i_j for j <= t (eq. 27, 34, 35)
    log_D = cum_f[..., :, None] - cum_f[..., None, :] + log_i[..., None, :]
    log_D = log_D.masked_fill(~causal, -math.inf)
    log_init = cum_f + m0[..., None]  # weight of the initial state at each step
    if input_gate == "exp":
        m = torch.maximum(log_D.amax(-1), log_init).detach()  # eq. 28 (plus the initial state)
    else:
        m = torch.zeros_like(log_init)
    D = torch.exp(log_D - m[..., None])  # eq. 29
    w0 = torch.exp(log_init - m)
    qs = q / math.sqrt(DQK)
    Sm = (qs @ k.transpose(-1, -2)) * D  # eq. 30-31
    num = Sm @ v + w0[..., None] * (qs @ C0)  # eq. 33 (numerator)
    dot = Sm.sum(-1) + w0 * (qs @ n0[..., None])[..., 0]  # eq. 32 (before max/abs)
    h = _normalize(num, dot, m, normalizer, eps)
    state = None
    if return_last_state:
        # state after step S: log weights of every step j and of the initial state, at t = S
        a = cum_f[..., -1:] - cum_f + log_i  # (B, NH, S)
        g0 = cum_f[..., -1] + m0
        m_S = torch.maximum(a.amax(-1), g0).detach() if input_gate == "exp" else torch.zeros_like(g0)
        wa = torch.exp(a - m_S[..., None])
        wg = torch.exp(g0 - m_S)
        C_S = wg[..., None, None] * C0 + (k * wa[..., None]).transpose(-1, -2) @ v
        n_S = wg[..., None] * n0 + (k * wa[..., None]).sum(-2)
        state = (C_S, n_S, m_S)
    return _finish(h, state, out_dtype, return_last_state, input_gate)
