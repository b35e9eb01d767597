"""mLSTM references: recurrent, parallel and chunkwise torch forms compute one function (forward and
every gradient), states chain, bad inputs fail with one-line errors."""

import math

import pytest
import torch

from seqkernels.mlstm import mlstm, mlstm_chunkwise, mlstm_parallel, mlstm_recurrent, resolve_backend

F64 = torch.float64


def make_inputs(B, NH, S, DQK, DV, gate, *, init=False, dtype=F64, seed=0, gate_scale=3.0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=F64).to(dtype)  # noqa: E731
    x = [r(B, NH, S, DQK), r(B, NH, S, DQK), r(B, NH, S, DV), gate_scale * r(B, NH, S), 2.0 + gate_scale * r(B, NH, S)]
    state = None
    if init:
        state = (r(B, NH, DQK, DV), r(B, NH, DQK), r(B, NH)) if gate == "exp" else (r(B, NH, DQK, DV),)
    return x, state


def run(fn, x, state, gate, *, chunk_size=4, seed=1, **kw):
    """Outputs and gradients of a random projection of (h, last state) w.r.t. every input."""
    x = [t.clone().requires_grad_(True) for t in x]
    st = None if state is None else tuple(t.clone().requires_grad_(True) for t in state)
    h, last = fn(*x, input_gate=gate, chunk_size=chunk_size, initial_state=st, return_last_state=True, **kw)
    g = torch.Generator().manual_seed(seed)
    outs = [h, *last[:2]]  # m (exp) is a stabilizer with no gradient
    loss = sum((o * torch.randn(o.shape, generator=g, dtype=F64).to(o.device, o.dtype)).sum() for o in outs)
    leaves = x + list(st or [])
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [h.detach(), *[s.detach() for s in last]], list(grads)


def assert_all_close(a, b, **tol):
    for i, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None:
            assert x is None and y is None or (x if y is None else y).abs().max() == 0, f"entry {i}"
            continue
        torch.testing.assert_close(x, y, msg=lambda m: f"entry {i}: {m}", **tol)


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize("S,chunk", [(1, 4), (7, 4), (17, 16), (13, 5)])
@pytest.mark.parametrize("init", [False, True])
def test_forms_agree_float64(gate, S, chunk, init):
    x, st = make_inputs(2, 3, S, 5, 6, gate, init=init, seed=S)
    out_p, grad_p = run(mlstm_parallel, x, st, gate)
    for fn in (mlstm_recurrent, mlstm_chunkwise):
        out, grad = run(fn, x, st, gate, chunk_size=chunk)
        assert_all_close(out, out_p, rtol=1e-10, atol=1e-11)
        assert_all_close(grad, grad_p, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_states_chain(gate):
    """Running [0, 9) then [9, 20) from the returned state equals running [0, 20) at once."""
    x, st = make_inputs(1, 2, 20, 4, 3, gate, init=True, seed=3)
    h, last = mlstm_parallel(*x, input_gate=gate, initial_state=st, return_last_state=True)
    first = [t[:, :, :9] for t in x]
    second = [t[:, :, 9:] for t in x]
    h1, mid = mlstm_chunkwise(*first, input_gate=gate, chunk_size=4, initial_state=st, return_last_state=True)
    h2, last2 = mlstm_recurrent(*second, input_gate=gate, initial_state=mid, return_last_state=True)
    torch.testing.assert_close(torch.cat([h1, h2], 2), h, rtol=1e-10, atol=1e-12)
    assert_all_close(last2, last, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("gate", ["exp", "sig"])
def test_zero_initial_state_is_none(gate):
    x, _ = make_inputs(1, 2, 6, 4, 3, gate, seed=4)
    B, NH, _, DQK = x[0].shape
    DV = x[2].shape[-1]
    zeros = (torch.zeros(B, NH, DQK, DV, dtype=F64), torch.zeros(B, NH, DQK, dtype=F64), torch.zeros(B, NH, dtype=F64))
    zeros = zeros if gate == "exp" else zeros[:1]
    torch.testing.assert_close(
        mlstm_parallel(*x, input_gate=gate, initial_state=zeros), mlstm_parallel(*x, input_gate=gate)
    )


def test_exp_matches_unstabilized_formula():
    """eq. 104-106: the stabilized mLSTMexp equals C q / max(|n q|, 1) with the raw exp gates (eps=0)."""
    x, _ = make_inputs(1, 1, 9, 3, 2, "exp", seed=5, gate_scale=1.0)
    q, k, v, i, f = x
    C = torch.zeros(3, 2, dtype=F64)
    n = torch.zeros(3, dtype=F64)
    want = []
    for t in range(9):
        C = torch.sigmoid(f[0, 0, t]) * C + torch.exp(i[0, 0, t]) * torch.outer(k[0, 0, t], v[0, 0, t])
        n = torch.sigmoid(f[0, 0, t]) * n + torch.exp(i[0, 0, t]) * k[0, 0, t]
        qt = q[0, 0, t] / math.sqrt(3)
        want.append(C.T @ qt / torch.clamp((n @ qt).abs(), min=1.0))
    got = mlstm_recurrent(*x, eps=0.0)[0, 0]
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-12, atol=1e-12)


def test_sig_matches_plain_recurrence():
    x, _ = make_inputs(1, 1, 8, 3, 2, "sig", seed=6)
    q, k, v, i, f = x
    C = torch.zeros(3, 2, dtype=F64)
    want = []
    for t in range(8):
        C = torch.sigmoid(f[0, 0, t]) * C + torch.sigmoid(i[0, 0, t]) * torch.outer(k[0, 0, t], v[0, 0, t])
        want.append(C.T @ q[0, 0, t] / math.sqrt(3))
    torch.testing.assert_close(mlstm_parallel(*x, input_gate="sig")[0, 0], torch.stack(want), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gate", ["exp", "sig"])
@pytest.mark.parametrize("normalizer", ["max_exp_m", "max_one", "abs", "none"])
def test_normalizer_variants_recurrent_equals_parallel(gate, normalizer):
    x, _ = make_inputs(1, 2, 11, 4, 3, gate, seed=7)
    a = mlstm_recurrent(*x, input_gate=gate, normalizer=normalizer)
    b = mlstm_parallel(*x, input_gate=gate, normalizer=normalizer)
    torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    if normalizer != "max_exp_m" and gate == "exp":
        assert not torch.allclose(a, mlstm_parallel(*x, input_gate=gate))  # the variant changes h


def test_large_gates_stay_finite_in_float32():
    """The max state keeps exp(i) from overflowing: i_pre = 60 would overflow exp in float32."""
    x, st = make_inputs(1, 2, 19, 4, 3, "exp", init=True, seed=8)
    x[3] = x[3] + 60.0
    want = mlstm_parallel(*x, initial_state=st)
    x32 = [t.float() for t in x]
    st32 = tuple(t.float() for t in st)
    for fn in (mlstm_parallel, mlstm_chunkwise, mlstm_recurrent):
        got = fn(*x32, initial_state=st32, chunk_size=8)
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-5)


def test_entry_point_dispatch_and_dtype():
    x, _ = make_inputs(1, 1, 5, 4, 4, "exp", dtype=torch.float32)
    assert mlstm(*x).dtype == torch.float32
    xb = [t.bfloat16() for t in x]
    assert mlstm(*xb, backend="torch").dtype == torch.bfloat16
    assert resolve_backend("auto", x[0]) == "torch"  # on the CPU: the chunkwise PyTorch form
    torch.testing.assert_close(mlstm(*x, backend="reference"), mlstm(*x, backend="parallel"))
    torch.testing.assert_close(mlstm(*x, backend="torch"), mlstm(*x, backend="parallel"))


@pytest.mark.parametrize(
    "mutate,err,match",
    [
        (lambda x: x.__setitem__(0, x[0][..., :-1]), ValueError, "k must have q's shape"),
        (lambda x: x.__setitem__(2, x[2][:, :, :-1]), ValueError, "v must have shape"),
        (lambda x: x.__setitem__(3, x[3][..., :-1]), ValueError, "i_pre must have shape"),
        (lambda x: x.__setitem__(4, x[4].long()), TypeError, "f_pre must be floating point"),
        (lambda x: x.__setitem__(0, x[0][0]), ValueError, "q must have shape"),
    ],
)
def test_bad_inputs(mutate, err, match):
    x, _ = make_inputs(1, 1, 5, 4, 4, "exp")
    mutate(x)
    with pytest.raises(err, match=match):
        mlstm(*x)


def test_bad_options():
    x, st = make_inputs(1, 1, 5, 4, 4, "exp", init=True)
    with pytest.raises(ValueError, match="input_gate"):
        mlstm(*x, input_gate="tanh")
    with pytest.raises(ValueError, match="unknown mlstm backend 'cuda'; valid: auto, reference, parallel, torch"):
        mlstm(*x, backend="cuda")
    with pytest.raises(ValueError, match=r"must be a tuple \(C0,\)"):
        mlstm(*x, input_gate="sig", initial_state=st)
    with pytest.raises(ValueError, match="n0 must have shape"):
        mlstm(*x, initial_state=(st[0], st[1][..., :-1], st[2]))
    with pytest.raises(ValueError, match="chunk_size"):
        mlstm(*x, backend="torch", chunk_size=0)
    with pytest.raises(ValueError, match="normalizer"):
        mlstm_parallel(*x, normalizer="l2")
