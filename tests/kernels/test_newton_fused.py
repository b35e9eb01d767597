"""Fused Newton kernels (seqkernels.newton.gru_kernels / lstm_kernels) against a float64 sequential loop.

Forward states and the gradients of ``u``, ``a`` (and ``p``); CPU runs use the Triton interpreter
at small shapes, outputs poisoned with NaN before every run.
"""

import copy

import pytest
import torch

pytest.importorskip("triton")

from seqkernels.newton import flashgru, flashlstm, gru_kernels, lstm_kernels, triton_ops  # noqa: E402
from seqkernels.newton.triton_ops import NewtonTiles  # noqa: E402
from seqkernels.scan._interpret import use_vectorized_interpreter_scan  # noqa: E402

use_vectorized_interpreter_scan()
DEV = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = [pytest.mark.triton, pytest.mark.usefixtures("poison")]


def gru_loop(u, a):
    """``h_t = f(h_{t-1}, u_t)`` by a loop (the ground truth), any dtype."""
    H, B, L, _, Ds = u.shape
    h = u.new_zeros(H, B, Ds)
    az, ar, ac = (a[:, g, None, :] for g in range(3))
    out = []
    for t in range(L):
        z = torch.sigmoid(az * h + u[:, :, t, 0])
        r = torch.sigmoid(ar * h + u[:, :, t, 1])
        c = torch.tanh(ac * (h * r) + u[:, :, t, 2])
        h = (1 - z) * h + z * c
        out.append(h)
    return torch.stack(out, 2)


def lstm_loop(u, a, p):
    H, B, L, _, Ds = u.shape
    c = u.new_zeros(H, B, Ds)
    h = u.new_zeros(H, B, Ds)
    af, az, ao = (a[:, g, None, :] for g in range(3))
    pf, po = (p[:, g, None, :] for g in range(2))
    out = []
    for t in range(L):
        f = torch.sigmoid(af * h + u[:, :, t, 0] + pf * c)
        z = torch.tanh(az * h + u[:, :, t, 1])
        c = f * c + (1 - f) * z
        o = torch.sigmoid(ao * h + u[:, :, t, 2] + po * c)
        h = o * torch.tanh(c)
        out.append(torch.cat([c, h], -1))
    return torch.stack(out, 2)


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    assert torch.isfinite(a).all(), "non-finite (unwritten?) elements"
    return float((a - b).norm() / b.norm()) if b.norm() > 0 else float(a.norm())


def make(H, B, L, Ds, seed, lstm):
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(H, B, L, 3, Ds, generator=gen)
    a = (torch.randn(H, 3, Ds, generator=gen) * 0.6).clamp(-0.9, 0.9)
    p = (torch.randn(H, 2, Ds, generator=gen) * 0.6).clamp(-0.9, 0.9)
    return u.to(DEV), a.to(DEV), p.to(DEV)


def run_and_compare(lstm, H, B, L, Ds, seed, iters=8, tol=None, tiles=None):
    u, a, p = make(H, B, L, Ds, seed, lstm)
    leaves = [t.clone().requires_grad_() for t in ((u, a, p) if lstm else (u, a))]
    if lstm:
        out, res = lstm_kernels.flashlstm_fused(*leaves, iters=iters, tol=tol, stats=True, tiles=tiles)
    else:
        out, res = gru_kernels.flashgru_fused(*leaves, iters=iters, tol=tol, stats=True, tiles=tiles)
    g = torch.randn_like(out)
    (out * g).sum().backward()
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = (lstm_loop if lstm else gru_loop)(*ref_leaves)
    (ref * g.double()).sum().backward()
    assert rel(out, ref) < 1e-5
    for got, want in zip(leaves, ref_leaves):
        assert rel(got.grad, want.grad) < 1e-4
    return res


@pytest.mark.parametrize("L", [1, 17, 129, 1000])
@pytest.mark.slow
def test_gru_matches_sequential(L):
    res = run_and_compare(False, 1, 2 if L < 1000 else 1, L, 5, seed=L)
    assert res[0] >= 0 and res[-1] < 1e-5  # recorded, and converged


@pytest.mark.parametrize("L", [1, 17, 129, 1000])
@pytest.mark.slow
def test_lstm_matches_sequential(L):
    res = run_and_compare(True, 1, 2 if L < 1000 else 1, L, 5, seed=50 + L, iters=5)
    assert res[0] >= 0 and res[-1] < 1e-5


@pytest.mark.parametrize("lstm, L", [(False, 1), (False, 23), (False, 130), (True, 1), (True, 23)])
def test_sequential_is_the_loop(lstm, L):
    """``flashgru_sequential`` / ``flashlstm_sequential`` (one-step chunks, one iteration) give the loop's
    states and gradients, at 3 heads of 6 channels (a partial lane tile), with large inputs and state
    weights where 3 Newton iterations of the usual chunks are far off. Past 128 steps for the GRU only:
    the time loop is ``common_kernels``'s, shared by both cells (the LSTM at 130 steps takes 50 s in the
    interpreter)."""
    u, a, p = make(3, 2, L, 6, 70 + L, lstm)
    u, a, p = u * 3, (a * 1.5).clamp(-1.2, 1.2), p
    leaves = [t.clone().requires_grad_() for t in ((u, a, p) if lstm else (u, a))]
    out = (lstm_kernels.flashlstm_sequential if lstm else gru_kernels.flashgru_sequential)(*leaves)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, leaves, g)
    ref_leaves = [t.detach().double().requires_grad_() for t in leaves]
    ref = (lstm_loop if lstm else gru_loop)(*ref_leaves)
    want = torch.autograd.grad(ref, ref_leaves, g.double())
    assert rel(out, ref) < 1e-6
    for got, w in zip(grads, want):
        assert rel(got, w) < 1e-5
    if L > 1:  # the check can fail: Newton with the default chunk is not the loop here
        newton = (lstm_kernels.flashlstm_fused if lstm else gru_kernels.flashgru_fused)(
            *(t.detach() for t in leaves), 3
        )[0]
        assert rel(newton, ref) > 1e-5  # ten times the bound the sequential kernel meets


@pytest.mark.slow
def test_heads_and_lane_tiles():
    """Two heads with their own parameters, 20 channels = two full lane tiles of 8 and a partial one;
    the default tiles (4 channels: few programs); explicit 16-step chunks of 4 channels on 2 warps
    (5 chunks, 5 lane tiles)."""
    run_and_compare(False, 2, 2, 70, 20, seed=3, tiles=NewtonTiles(128, 8, 4))
    run_and_compare(True, 2, 1, 20, 20, seed=4, tiles=NewtonTiles(64, 8, 4))
    run_and_compare(True, 2, 1, 20, 20, seed=6)
    run_and_compare(False, 1, 2, 70, 20, seed=5, tiles=NewtonTiles(16, 4, 2))


def test_default_tiles_keep_the_launch_wide():
    """8 channels per program from ``FEW_PROGRAMS`` programs on, 4 below (the chunk unchanged)."""
    from seqkernels._triton import FEW_PROGRAMS

    cell = lstm_kernels._CELL
    assert cell.default_tiles(4, 16, 16) == NewtonTiles(64, 4, 4)  # Table 6: 128 programs of 8
    assert cell.default_tiles(12, 16, 16) == NewtonTiles(64, 8, 4)  # 3 stacked trials: 384
    assert cell.default_tiles(1, 8, 256) == NewtonTiles(64, 8, 4)  # the benchmark's layer
    assert cell.default_tiles(1, FEW_PROGRAMS, 8).bd == 8
    assert cell.default_tiles(1, FEW_PROGRAMS - 1, 8).bd == 4
    assert cell.default_tiles(1, 1, 3).bd == 4  # fewer than 8 channels: the next power of two
    assert gru_kernels._CELL.default_tiles(4, 16, 16) == NewtonTiles(128, 4, 4)
    assert gru_kernels._CELL.default_tiles(4, 256, 16, chunk=1) == NewtonTiles(1, 8, 1)  # the sequential walk


@pytest.mark.parametrize("name", ["flashgru", "flashlstm"])
@pytest.mark.slow
def test_family_backends_agree(name):
    """``seqkernels.newton.flashgru`` / ``flashlstm``: reference (float64 loop), torch (Newton, float64)
    and triton (fused, float32) compute the same states and gradients at an awkward size."""
    lstm = name == "flashlstm"
    fn = flashlstm if lstm else flashgru
    u, a, p = make(2, 3, 37, 6, 21, lstm)
    params = (u, a, p) if lstm else (u, a)
    g = torch.randn(*u.shape[:3], (2 if lstm else 1) * u.shape[-1], device=DEV)
    outs = {}
    for backend, dtype in (("reference", torch.float64), ("torch", torch.float64), ("triton", torch.float32)):
        leaves = [t.to(dtype).requires_grad_() for t in params]
        y = fn(*leaves, iters=12, backend=backend)
        grads = torch.autograd.grad(y, leaves, g.to(dtype))
        outs[backend] = (y, *grads)
    for backend in ("torch", "triton"):
        for got, want in zip(outs[backend], outs["reference"]):
            assert rel(got, want) < 1e-4, backend
    with pytest.raises(ValueError, match="unknown flash"):
        fn(*params, backend="fused")


@pytest.mark.parametrize("lstm", [False, True])
@pytest.mark.slow
def test_iteration_count_and_tolerance_are_honored(lstm):
    u, a, p = make(1, 2, 40, 5, 7, lstm)
    params = (a, p) if lstm else (a,)
    loop = lstm_loop if lstm else gru_loop

    def fn(**k):
        return (lstm_kernels.flashlstm_fused if lstm else gru_kernels.flashgru_fused)(u, *params, **k)

    exact = loop(u.double(), *(q.double() for q in params))
    H, B, L, _, Ds = u.shape
    # f(0, u_t) at every t: every position as its own length-1 sequence
    guess = loop(u.double().reshape(H, B * L, 1, 3, Ds), *(q.double() for q in params)).reshape(exact.shape)
    out0, res0 = fn(iters=0, stats=True)
    assert rel(out0, guess) < 1e-6  # iters=0: the initial guess
    assert res0.shape == (1,) and res0[0] > 0.1
    out1, _ = fn(iters=1, stats=True)
    out3, res3 = fn(iters=3, stats=True)
    assert res3.shape == (4,) and res3[3] < res3[2] < res3[1] < res3[0]
    assert rel(out3, exact) < rel(out1, exact) < rel(out0, exact)
    # a tolerance above the initial residual stops every chunk before the first iteration
    out_t, res_t = fn(iters=3, tol=10.0, stats=True)
    assert rel(out_t, guess) < 1e-6 and float(res_t[1]) == -1.0
    # a tiny tolerance changes nothing
    out_s, _ = fn(iters=3, tol=1e-12, stats=True)
    assert rel(out_s, out3) < 1e-7


@pytest.mark.slow
def test_opcheck():
    u, a, p = make(1, 2, 9, 3, 11, True)
    torch.library.opcheck(
        torch.ops.expressivity.flashgru_fused, (u.requires_grad_(), a.requires_grad_(), 3, None, False, None, 0)
    )
    h, _ = gru_kernels.flashgru_fused(u.detach(), a.detach())
    torch.library.opcheck(torch.ops.expressivity.flashgru_fused_bwd, (u.detach(), a.detach(), h, torch.randn_like(h)))
    p = p.requires_grad_()
    torch.library.opcheck(torch.ops.expressivity.flashlstm_fused, (u, a, p, 2, 1e-3, True, None, 0))
    torch.library.opcheck(
        torch.ops.expressivity.flashgru_fused, (u, a, 3, None, False, torch.tensor(True, device=u.device), 0)
    )
    torch.library.opcheck(torch.ops.expressivity.flashlstm_fused, (u, a, p, 1, None, False, None, 1))  # sequential
    s, _ = lstm_kernels.flashlstm_fused(u.detach(), a.detach(), p.detach())
    torch.library.opcheck(
        torch.ops.expressivity.flashlstm_fused_bwd, (u.detach(), a.detach(), p.detach(), s, torch.randn_like(s))
    )


def test_bad_inputs_give_clear_errors(monkeypatch):
    u, a, p = make(1, 2, 9, 4, 12, True)
    with pytest.raises(TypeError, match="float32"):
        gru_kernels.flashgru_fused(u.double(), a.double())
    with pytest.raises(ValueError, match=r"\(H, B, L, 3, Ds\)"):
        gru_kernels.flashgru_fused(u[..., :2, :], a)
    with pytest.raises(ValueError, match="a must be"):
        gru_kernels.flashgru_fused(u, a[:, :2])
    with pytest.raises(ValueError, match="p must be"):
        lstm_kernels.flashlstm_fused(u, a, p.double())
    with pytest.raises(ValueError, match="contiguous"):
        gru_kernels.flashgru_fused(u.transpose(1, 2), a)
    with pytest.raises(ValueError, match="iters"):
        gru_kernels.flashgru_fused(u, a, iters=-1)
    with pytest.raises(ValueError, match="tol"):
        lstm_kernels.flashlstm_fused(u, a, p, tol=-1.0)
    for bad in (3, -1, True):
        with pytest.raises(ValueError, match="chunk must be"):
            gru_kernels._CELL(u, a, chunk=bad)
    for bad in (torch.tensor(1), torch.tensor([True, False]), True):
        with pytest.raises(ValueError, match="skip must be"):
            gru_kernels.flashgru_fused(u, a, skip=bad)
    monkeypatch.setattr(triton_ops, "triton_available", lambda t: False)
    with pytest.raises(ValueError, match="CUDA"):
        gru_kernels.flashgru_fused(u, a)


@pytest.mark.parametrize("lstm", [False, True])
@pytest.mark.slow
def test_skip_runs_no_iteration_where_it_holds(lstm):
    """``skip`` read on the device: false changes nothing; true gives the initial guess (``iters=0``),
    with statistics of that guess, and a backward that is exactly zero for a zero output gradient
    (a skipped re-solve's result is unused: ``torch.where`` sends it zeros)."""
    u, a, p = make(2, 3, 37, 5, 31, lstm)
    params = (u, a, p) if lstm else (u, a)
    fn = lstm_kernels.flashlstm_fused if lstm else gru_kernels.flashgru_fused
    full, res = fn(*params, iters=4, stats=True)
    kept, res_kept = fn(*params, iters=4, stats=True, skip=torch.tensor(False, device=DEV))
    assert torch.equal(full, kept) and torch.equal(res, res_kept)
    guess, res0 = fn(*params, iters=0, stats=True)
    leaves = [t.clone().requires_grad_() for t in params]
    skipped, res_skipped = fn(*leaves, iters=4, stats=True, skip=torch.tensor([True], device=DEV))
    assert torch.equal(skipped, guess) and not torch.equal(skipped, full)
    assert float(res_skipped[0]) == float(res0[0]) >= 0 and (res_skipped[1:] == -1).all()
    grads = torch.autograd.grad(skipped, leaves, torch.zeros_like(skipped))
    assert all(torch.equal(g, torch.zeros_like(g)) for g in grads)


@pytest.mark.parametrize("name", ["flashgru", "flashlstm"])
@pytest.mark.slow
def test_mixer_fused_mode_matches_sequential(name):
    from mixers import build_mixer

    torch.manual_seed(0)
    m = build_mixer(name, 16, num_heads=2, mode="fused", iters=6).to(DEV)
    x = torch.randn(2, 45, 16, device=DEV, requires_grad=True)
    y = m(x)
    y.sum().backward()
    gx, gp = x.grad.clone(), [q.grad.clone() for q in m.parameters()]
    ref = copy.deepcopy(m).double()  # float64: the Python loop on any device
    ref.mode = "sequential"
    xr = x.detach().double().requires_grad_()
    ref(xr).sum().backward()
    assert rel(y, ref(xr)) < 1e-5
    assert rel(gx, xr.grad) < 1e-4
    for got, q in zip(gp, ref.parameters()):
        assert rel(got, q.grad) < 1e-4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["flashgru", "flashlstm"])
def test_gpu_mixer_sequential_mode_runs_the_kernel(name, monkeypatch):
    """``mode="sequential"`` on CUDA float32 runs the cell's ``fused_sequential`` (eager and compiled) and
    equals the float64 loop in outputs and gradients, with Newton-hard weights (3 heads, L = 77)."""
    from mixers import build_mixer

    torch.manual_seed(1)
    m = build_mixer(name, 18, num_heads=3, mode="sequential").to(DEV)
    with torch.no_grad():
        for q in m.parameters():
            q.mul_(3)
    cls = type(m.cells[0])
    calls = []
    seq = cls.fused_sequential
    monkeypatch.setattr(cls, "fused_sequential", classmethod(lambda c, *a: calls.append(1) or seq(*a)))
    ref = copy.deepcopy(m).double()
    x = torch.randn(4, 77, 18, device=DEV)
    xr = x.double().requires_grad_()
    y_ref = ref(xr)
    y_ref.sum().backward()
    for fn in (m, torch.compile(m, fullgraph=False)):
        m.zero_grad()
        xl = x.clone().requires_grad_()
        y = fn(xl)
        y.sum().backward()
        assert rel(y, y_ref) < 1e-5 and rel(xl.grad, xr.grad) < 1e-4
        for got, q in zip(m.parameters(), ref.parameters()):
            assert rel(got.grad, q.grad) < 1e-4
    assert calls, "the sequential mode did not run the kernel"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("lstm", [False, True])
def test_gpu_long(lstm):
    run_and_compare(lstm, 2, 2, 3001, 64, seed=13, iters=4)
